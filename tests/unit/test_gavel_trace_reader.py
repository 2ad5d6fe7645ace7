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


def test_a_bad_number_is_reported_with_the_name_of_its_field():
    from benchmarks import gavel

    trace = gavel.parse_trace([_line(steps="abc"), _line(arrival="soon"), _line(scale="x"), _line()])
    assert [job.line for job in trace.jobs] == [4]
    assert [str(error) for error in trace.errors] == [
        "line 1: total_steps must be an integer, got 'abc'",
        "line 2: arrival_time must be a number, got 'soon'",
        "line 3: scale_factor must be an integer, got 'x'",
    ]


def test_a_step_count_too_large_for_a_float_is_a_bad_line_not_a_crash_of_the_simulation():
    from benchmarks import gavel

    trace = gavel.parse_trace([_line(steps="9" * 400), _line(steps=10**15)])
    assert [str(error) for error in trace.errors] == ["line 1: total_steps is too large, got a 400-digit number"]
    assert [job.total_steps for job in trace.jobs] == [10**15]  # huge but representable: kept
    policy = gavel.make_policy("fifo", lambda job, chip: 1.0, gavel.CHIPS, 0)
    result = gavel.simulate(trace.jobs, {"v100": 1, "p100": 0, "k80": 0}, policy)
    assert result.jobs == 1 and result.avg_jct_h == 10**15 / 3600.0
