"""The Gavel benchmark's trace reader and command on files other than the three shipped traces."""

from __future__ import annotations

LINE = "ResNet-18 (batch size 32)\tcd x && python3 train.py\t-step\t1\t{steps}\t{arrival}\t{scale}\n"


def _line(steps=1000, arrival="0.000000", scale=1):
    return LINE.format(steps=steps, arrival=arrival, scale=scale)


def test_a_byte_order_mark_is_not_part_of_the_first_job_type(tmp_path):
    from benchmarks import gavel

    path = tmp_path / "bom.trace"
    path.write_text(_line(scale=4) + _line(), encoding="utf-8-sig")
    trace = gavel.load_trace(path)
    assert [job.job_type for job in trace.jobs] == ["ResNet-18 (batch size 32)"] * 2
    assert trace.jobs[0].gpus == 4  # the family is recognised, so Gavel's scale conversion applies
