"""The Gavel benchmark's trace reader and command on files other than the three shipped traces."""

from __future__ import annotations

import json

import pytest

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


def _matrix(directory, **extra):
    """A throughput file for the three chips with one job type, 1 step/s alone on every chip."""
    data = {chip: {"('ResNet-18 (batch size 32)', 1)": {"null": 1.0}} for chip in ("v100", "p100", "k80")}
    data.update(extra)
    (directory / "simulation_throughputs.json").write_text(json.dumps(data), encoding="utf-8")
    return directory


def test_a_trace_that_is_not_utf8_is_rejected_with_its_file_and_line(tmp_path):
    from benchmarks import gavel

    path = tmp_path / "latin1.trace"
    path.write_bytes(_line().encode() + "R\u00e9sNet\tc\t-step\t1\t10\t0\t1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.trace: line 2: not UTF-8 text"):
        gavel.load_trace(path)


@pytest.mark.parametrize("case", ["directory", "latin1", "missing"])
def test_the_command_answers_an_unreadable_trace_with_an_error_not_a_traceback(tmp_path, capsys, case):
    from benchmarks import gavel

    path = {"directory": tmp_path, "latin1": tmp_path / "latin1.trace", "missing": tmp_path / "none.trace"}[case]
    (tmp_path / "latin1.trace").write_bytes("R\u00e9sNet\tc\t-step\t1\t10\t0\t1\n".encode("latin-1"))
    with pytest.raises(SystemExit) as ended:
        gavel.main(["--trace", str(path), "--data-dir", str(_matrix(tmp_path)), "--no-write"])
    assert ended.value.code == 2
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize("content", ["{not json", json.dumps({"v100": {}, "p100": {}}),
                                     json.dumps({c: {"('A3C', 1)": {}} for c in ("v100", "p100", "k80")}),
                                     json.dumps({c: {"A3C": {"null": 1}} for c in ("v100", "p100", "k80")})])
def test_the_command_answers_a_bad_throughput_file_with_an_error_not_a_traceback(tmp_path, capsys, content):
    from benchmarks import gavel

    (tmp_path / "simulation_throughputs.json").write_text(content, encoding="utf-8")
    (tmp_path / "one.trace").write_text(_line(), encoding="utf-8")
    with pytest.raises(SystemExit) as ended:
        gavel.main(["--trace", str(tmp_path / "one.trace"), "--data-dir", str(tmp_path), "--no-write"])
    assert ended.value.code == 2
    assert "simulation_throughputs.json" in capsys.readouterr().err


def test_the_command_runs_a_trace_of_one_job_on_a_matrix_of_its_own(tmp_path, capsys):
    from benchmarks import gavel

    (tmp_path / "one.trace").write_text(_line(steps=7200), encoding="utf-8")
    assert gavel.main(["--trace", str(tmp_path / "one.trace"), "--data-dir", str(_matrix(tmp_path)),
                       "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "gavel.json").read_text())["results"][0]
    for row in result["policies"].values():  # 7200 steps at 1 step/s: 2 hours, on an empty cluster
        assert row["avg_jct_h"] == row["p99_jct_h"] == row["makespan_h"] == pytest.approx(2.0)
        assert row["utilization"] == pytest.approx(1 / 108)


def test_a_trace_with_no_job_to_simulate_is_left_out_of_the_target(tmp_path, capsys):
    """A trace whose every line is bad (or empty) was judged against the target with NaN JCTs: "MISSED (nanx)"."""
    from benchmarks import gavel

    (tmp_path / "bad.trace").write_text("not a trace line\n", encoding="utf-8")
    gavel.main(["--trace", str(tmp_path / "bad.trace"), "--data-dir", str(_matrix(tmp_path)), "--no-write"])
    out = capsys.readouterr().out
    assert "nanx" not in out and "MISSED" not in out, out
    assert "bad: no job was simulated: left out of the target" in out and "not judged" in out, out
