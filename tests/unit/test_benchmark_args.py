"""Benchmark commands refuse counts, offsets and durations that cannot mean anything with argparse's message and exit
status 2, before any work starts (a negative --limit sliced all but the last jobs off a Gavel trace and ran on them;
a negative --cycles or a bad --sizes entry crashed with a traceback)."""

import argparse
import importlib

import pytest

from benchmarks._args import COUNT, OFFSET, count_list, non_negative_float, positive_float

REFUSED = [
    ("gavel", "--limit", "-3"), ("gavel", "--limit", "0"),
    ("scale", "--cycles", "-1"), ("scale", "--pending", "-5"), ("scale", "--sizes", "1000,-8"),
    ("scale", "--sizes", "1000,x"), ("scale", "--target-ms", "nan"),
    ("platform_cycle", "--sizes", ","), ("platform_cycle", "--cycles", "0"),
    ("planner", "--repeat", "0"), ("openb", "--jobs", "0"),
    ("routing_bound", "--limit", "-1"), ("routing_bound", "--start", "-2"),
    ("router_sim", "--rate", "0"), ("router_sim", "--prefill-s", "-0.1"),
    ("cache_ceiling", "--requests", "-10"), ("serving", "--slots", "0"), ("long_prompt", "--reps", "-1"),
    ("celery_kill", "--tasks", "0"), ("churn", "--duration", "-5"), ("faults", "--checkpoint-interval", "0"),
    ("faults", "--step-sleep", "-1"), ("serving_faults", "--overload-s", "inf"),
]


@pytest.mark.parametrize("module, option, value", REFUSED)
def test_a_benchmark_refuses_a_meaningless_number_before_it_starts(module, option, value, capsys):
    command = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit) as ended:
        command.main([f"{option}={value}"])
    assert ended.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {option}" in error and "must be" in error, error
    assert "Traceback" not in error


def test_the_argument_types():
    assert COUNT("3") == 3 and OFFSET("0") == 0 and count_list("1000, 10000") == [1000, 10000]
    assert positive_float("0.5") == 0.5 and non_negative_float("0") == 0.0
    for parse, text in ((COUNT, "0"), (COUNT, "1.5"), (OFFSET, "-1"), (count_list, ""), (positive_float, "0"),
                        (positive_float, "inf"), (non_negative_float, "-1e-9"), (non_negative_float, "x")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)
