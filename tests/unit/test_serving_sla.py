"""The SLA sweep's pure part (goodput per SLA, ratios against the target) and its arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.mooncake import BenchRequest
from benchmarks.serving import REPO_ROOT, RunResult
from benchmarks.serving_sla import (
    SLA,
    add_ceilings,
    caching_gain_ceiling,
    parse_args,
    sla_goodput,
    unbounded_hit_rate,
)

TIGHT, LOOSE = SLA(1000, 150), SLA(4000, 150)


def run(router, rate, *, ttft95, tpot95=50.0, tps, errors=0) -> dict:
    return {"router": router, "rate_rps": rate, "errors": errors, "ttft_p95_ms": ttft95, "tpot_p95_ms": tpot95,
            "output_tokens_per_s": tps}


def rows(runs, slas=(TIGHT, LOOSE), routers=("pow2", "prefix")):
    return sla_goodput(list(runs), list(slas), list(routers))


def test_goodput_is_the_best_throughput_among_rates_that_met_the_sla():
    runs = [run("pow2", 6, ttft95=400, tps=100), run("pow2", 8, ttft95=900, tps=130),
            run("pow2", 10, ttft95=3000, tps=150), run("pow2", 12, ttft95=9000, tps=160),
            run("prefix", 6, ttft95=200, tps=101), run("prefix", 8, ttft95=300, tps=133),
            run("prefix", 10, ttft95=500, tps=166), run("prefix", 12, ttft95=1500, tps=200)]
    tight, loose = rows(runs)
    assert (tight["pow2_goodput"], tight["pow2_rate"]) == (130, 8)  # only the low rates meet 1 s
    assert (tight["prefix_goodput"], tight["prefix_rate"]) == (166, 10)
    assert tight["pow2_rates_met"] == [6, 8] and not tight["prefix_at_top_rate"]
    assert tight["ratio_vs_pow2"] == pytest.approx(166 / 130)
    assert tight["target_vs_pow2"] == ">= 1.4x: MISSED"
    assert (loose["pow2_goodput"], loose["pow2_rate"]) == (150, 10)
    assert (loose["prefix_goodput"], loose["prefix_rate"]) == (200, 12) and loose["prefix_at_top_rate"]
    assert loose["ratio_vs_pow2"] == pytest.approx(200 / 150) and "MISSED" in loose["target_vs_pow2"]
    assert "may sustain more" in loose["target_vs_pow2"]  # prefix's best is the top of the grid: a lower bound


def test_goodput_is_the_highest_throughput_not_the_highest_rate_that_met():
    runs = [run("pow2", 6, ttft95=100, tps=120), run("pow2", 8, ttft95=200, tps=110),
            run("prefix", 6, ttft95=100, tps=300), run("prefix", 8, ttft95=100, tps=90)]
    (tight,) = rows(runs, slas=[TIGHT])
    assert (tight["pow2_goodput"], tight["pow2_rate"]) == (120, 6)
    assert tight["ratio_vs_pow2"] == pytest.approx(2.5) and tight["target_vs_pow2"] == ">= 1.4x: met"


def test_runs_with_errors_never_count_even_when_fast():
    runs = [run("pow2", 6, ttft95=100, tps=100), run("pow2", 8, ttft95=100, tps=500, errors=1),
            run("prefix", 6, ttft95=100, tps=100), run("prefix", 8, ttft95=100, tps=150)]
    (tight,) = rows(runs, slas=[TIGHT])
    assert (tight["pow2_goodput"], tight["pow2_rate"]) == (100, 6) and tight["pow2_rates_met"] == [6]
    assert tight["ratio_vs_pow2"] == pytest.approx(1.5) and tight["target_vs_pow2"].endswith("met")


def test_tpot_bound_and_missing_percentiles_fail_the_sla():
    runs = [run("pow2", 6, ttft95=100, tpot95=151, tps=100), run("pow2", 8, ttft95=None, tps=100),
            run("prefix", 6, ttft95=100, tpot95=None, tps=100), run("prefix", 8, ttft95=1000, tpot95=150, tps=90)]
    (tight,) = rows(runs, slas=[TIGHT])
    assert tight["pow2_goodput"] is None and tight["pow2_rates_met"] == []
    assert (tight["prefix_goodput"], tight["prefix_rate"]) == (90, 8)  # bounds are inclusive


def test_none_met_gives_no_ratio_and_says_why():
    runs = [run("pow2", 6, ttft95=5000, tps=100), run("prefix", 6, ttft95=800, tps=120)]
    tight, loose = rows(runs, slas=[TIGHT, SLA(500, 150)])
    assert tight["pow2_goodput"] is None and tight["pow2_rate"] is None and tight["ratio_vs_pow2"] is None
    assert tight["target_vs_pow2"].startswith(">= 1.4x: undetermined (baseline met the SLA at no rate")
    assert loose["prefix_goodput"] is None and loose["ratio_vs_pow2"] is None
    assert "neither router met" in loose["target_vs_pow2"]
    runs = [run("pow2", 6, ttft95=100, tps=100), run("prefix", 6, ttft95=5000, tps=300)]
    (only_base,) = rows(runs, slas=[TIGHT])
    assert only_base["target_vs_pow2"] == ">= 1.4x: MISSED (prefix-aware met the SLA at no rate)"


def test_every_baseline_gets_a_ratio_and_no_candidate_means_no_ratio():
    runs = [run("round_robin", 6, ttft95=100, tps=50), run("pow2", 6, ttft95=100, tps=100),
            run("prefix", 6, ttft95=100, tps=140)]
    (row,) = rows(runs, slas=[TIGHT], routers=("round_robin", "pow2", "prefix"))
    assert row["ratio_vs_round_robin"] == pytest.approx(2.8) and row["ratio_vs_pow2"] == pytest.approx(1.4)
    assert row["target_vs_pow2"].startswith(">= 1.4x: met")  # exactly 1.4x reaches the target
    assert "baseline's best is the grid's top rate" in row["target_vs_pow2"]  # one rate: an upper bound
    (row,) = rows(runs, slas=[TIGHT], routers=("round_robin", "pow2"))
    assert not any(key.startswith("ratio_vs") for key in row)


def test_works_on_real_run_summaries():
    summary = RunResult(name="p", router="prefix", engine={}, requests=3, output_tokens=30, makespan_s=2.0,
                        ttft_s=[0.1, 0.2, 0.3], tpot_s=[0.01, 0.02, 0.2]).summary()
    assert summary["ttft_p95_ms"] == 300.0 and summary["tpot_p95_ms"] == 200.0  # nearest rank of 3 values
    (row,) = rows([{**summary, "rate_rps": 6}], slas=[SLA(1000, 250)], routers=("prefix",))
    assert row["prefix_goodput"] == 15.0 and row["prefix_rate"] == 6


def test_arguments_defaults_and_parsing():
    args = parse_args([])
    assert args.rate_grid == [6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40, 48]
    assert args.router_list == ["pow2", "prefix"]
    assert args.sla_list == [SLA(1000, 150), SLA(2000, 150), SLA(4000, 150)]
    assert args.requests == 1000 and args.replicas == 4
    args = parse_args(["--rates", "12, 6.5", "--slas", "500:100", "--routers", "round_robin,prefix"])
    assert args.rate_grid == [6.5, 12] and args.sla_list == [SLA(500, 100)]


@pytest.mark.parametrize("argv, message", [
    (["--rates", "6,fast"], "--rates: 'fast' is not a number"),
    (["--rates", "6,0"], "--rates: '0' is not a positive finite rate"),
    (["--rates", "-3"], "--rates: '-3' is not a positive finite rate"),
    (["--rates", ""], "--rates: '' is not a number"),
    (["--rates", "6,6"], "--rates: a rate is listed twice"),
    (["--slas", "1000"], "--slas: '1000' is not TTFT_MS:TPOT_MS"),
    (["--slas", "1000:150:3"], "is not TTFT_MS:TPOT_MS"),
    (["--slas", "1s:150"], "--slas: '1s:150': the bounds must be numbers (ms)"),
    (["--slas", "1000:-1"], "the bounds must be positive and finite"),
    (["--routers", "pow2,magic"], "--routers: unknown router 'magic'"),
    (["--requests", "0"], "argument --requests: must be >= 1"),
])
def test_bad_arguments_are_refused_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["--rates", "6,abc"], ["--slas", "1000;150"]])
def test_cli_refuses_bad_grids_with_exit_2_and_no_traceback(argv):
    done = subprocess.run([sys.executable, "-m", "benchmarks.serving_sla", *argv, "--no-write"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "error: --" in done.stderr and "Traceback" not in done.stderr
    assert "Ray cluster" not in done.stdout  # refused before anything started


def request(at, tokens) -> BenchRequest:
    return BenchRequest(arrival_s=at, prompt_tokens=list(tokens), max_tokens=4, hash_ids=())


def test_the_unbounded_hit_rate_counts_full_blocks_whose_whole_prefix_came_before():
    a, b, c = [1, 2], [3, 4], [5, 6]
    prompts = [request(0.0, a + b + [9]),  # nothing before it: 0 of 5
               request(2.0, c + b),  # b again, but after another prefix: 0 of 4
               request(1.0, a + b + c)]  # arrives second: a and b reused, 4 of 6
    assert unbounded_hit_rate(prompts, block_tokens=2) == 4 / 15
    assert unbounded_hit_rate(prompts, block_tokens=4) == 4 / 15  # [1,2,3,4] is one block and is reused
    assert unbounded_hit_rate([], block_tokens=2) == 0.0


def test_the_caching_ceiling_bounds_the_gain_from_the_baselines_hit_rate():
    assert caching_gain_ceiling(0.10, 0.25) == (0.90 / 0.75)
    assert caching_gain_ceiling(0.25, 0.25) == 1.0
    assert caching_gain_ceiling(None, 0.25) is None and caching_gain_ceiling(0.1, 1.0) is None


def test_each_sla_row_gets_the_ceiling_of_the_baselines_goodput_run():
    runs = [{**run("pow2", 8, ttft95=500, tps=100.0), "cache_hit_rate": 0.12},
            {**run("pow2", 12, ttft95=3000, tps=150.0), "cache_hit_rate": 0.08},
            {**run("prefix", 12, ttft95=900, tps=160.0), "cache_hit_rate": 0.2}]
    table = rows(runs)
    add_ceilings(table, runs, ["pow2", "prefix"], best_hit_rate=0.2)
    tight, loose = table
    assert tight["ceiling_vs_pow2"] == (1 - 0.12) / 0.8  # pow-2's tight-SLA goodput came from its 8/s run
    assert loose["ceiling_vs_pow2"] == (1 - 0.08) / 0.8
    table = rows([runs[2]])
    add_ceilings(table, [runs[2]], ["pow2", "prefix"], best_hit_rate=0.2)
    assert table[0]["ceiling_vs_pow2"] is None  # the baseline met no SLA: nothing to bound
