"""The serving benchmark's pure parts: percentiles, summaries, the comparison against the targets, arguments."""

from __future__ import annotations

import pytest

from benchmarks.serving import ROUTER_COLUMNS, RunResult, _pct, compare, parse_args, print_table


def result(name, *, cached, prompt, output, makespan, ttfts=(0.1, 0.2, 0.3)) -> dict:
    r = RunResult(name=name, router=name, engine={}, requests=3, prompt_tokens=prompt, cached_tokens=cached,
                  output_tokens=output, makespan_s=makespan, ttft_s=list(ttfts), tpot_s=[0.01, 0.02])
    return r.summary()


def test_percentiles_are_nearest_rank_and_empty_is_none():
    assert _pct([], 50) is None
    assert _pct([3.0, 1.0, 2.0], 50) == 2.0
    assert _pct([float(i) for i in range(101)], 90) == 90.0


def test_summary_reports_hit_rate_throughput_and_milliseconds():
    summary = result("prefix", cached=50, prompt=200, output=300, makespan=10.0)
    assert summary["cache_hit_rate"] == 0.25 and summary["output_tokens_per_s"] == 30.0
    assert summary["ttft_p50_ms"] == 200.0 and summary["tpot_p90_ms"] == 20.0


def test_a_table_without_runs_prints_and_does_not_crash(capsys):
    """`--skip-routers` leaves the routers' table empty; printing it crashed after the tier runs, losing them."""
    print_table("Routers", [], ROUTER_COLUMNS)
    assert "(no runs)" in capsys.readouterr().out
    print_table("Routers", [RunResult(name="pow2", router="pow2", engine={}, requests=1).summary()], ROUTER_COLUMNS)
    assert "pow2" in capsys.readouterr().out


def test_compare_gives_ratios_against_each_baseline_and_says_met_or_missed():
    runs = {"prefix": result("prefix", cached=80, prompt=200, output=300, makespan=10.0, ttfts=(0.1, 0.1, 0.1)),
            "pow2": result("pow2", cached=40, prompt=200, output=300, makespan=15.0),
            "round_robin": result("round_robin", cached=20, prompt=200, output=300, makespan=30.0)}
    rows = {row["baseline"]: row for row in compare(runs)}
    pow2 = rows["Ray Serve default (pow-2)"]
    assert pow2["hit_rate_ratio"] == pytest.approx(2.0) and pow2["throughput_ratio"] == pytest.approx(1.5)
    assert pow2["hit_target"].endswith("met") and pow2["throughput_target"].endswith("met")
    rr = rows["round robin"]
    assert rr["hit_rate_ratio"] == pytest.approx(4.0) and rr["throughput_ratio"] == pytest.approx(3.0)
    runs["pow2"] = result("pow2", cached=60, prompt=200, output=300, makespan=11.0)
    missed = {row["baseline"]: row for row in compare(runs)}["Ray Serve default (pow-2)"]
    assert missed["hit_target"].endswith("MISSED") and missed["throughput_target"].endswith("MISSED")
    assert compare({"prefix": runs["prefix"]}) == []


@pytest.mark.parametrize("argv", [["--routers", "prefix,magic"], ["--requests", "0"], ["--replicas", "5"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


# -- the offline router simulator (benchmarks/router_sim.py) ------------------------------------------------------

def _conversations(n_conv=23, turns=5, blocks_per_turn=3):
    """Multi-turn conversations: turn k's prompt is turn k-1's plus new blocks; one shared first block."""
    from benchmarks.mooncake import TraceRequest

    trace, next_id = [], 1
    histories = {c: [0] for c in range(n_conv)}
    for turn in range(turns):
        for c in range(n_conv):
            histories[c] = histories[c] + list(range(next_id, next_id + blocks_per_turn))
            next_id += blocks_per_turn
            ids = tuple(histories[c])
            trace.append(TraceRequest((turn * n_conv + c) * 250.0, 512 * len(ids), 160, ids))
    return trace


def test_router_sim_cache_evicts_least_recently_used_blocks():
    from benchmarks.router_sim import LRUBlockCache

    cache = LRUBlockCache(3)
    cache.insert([(1,), (1, 2)])
    cache.insert([(3,)])
    assert cache.match([(1,), (1, 2)]) == 2  # touches 1 and 1-2: now (3,) is the least recently used
    cache.insert([(4,)])
    assert cache.match([(3,)]) == 0 and cache.match([(1,), (1, 2)]) == 2 and cache.match([(4,)]) == 1
    assert len(cache.lru) == 3


def test_router_sim_is_deterministic_and_prefix_routing_beats_round_robin():
    from benchmarks.mooncake import ScaleSpec, build_requests
    from benchmarks.router_sim import POLICIES, SimConfig, ceiling, simulate

    requests = build_requests(_conversations(), ScaleSpec(block_tokens=16, time_scale=0.1))
    cfg = SimConfig(replicas=4, slots=2, cache_blocks=512, exact_queues=True)
    rids = [f"r{i}" for i in range(cfg.replicas)]
    runs = {name: simulate(requests, POLICIES[name](cfg, rids), cfg) for name in ("round_robin", "pow2", "filter_thr4")}
    assert simulate(requests, POLICIES["filter_thr4"](cfg, rids), cfg) == runs["filter_thr4"]
    top = ceiling(requests, cfg.block)
    assert max(runs["round_robin"]["hit_rate"], runs["pow2"]["hit_rate"]) < runs["filter_thr4"]["hit_rate"] <= top
    # Every conversation's later turns find its earlier ones: close to the unbounded-cache ceiling.
    assert runs["filter_thr4"]["hit_rate"] >= 0.9 * top
    assert sum(runs["filter_thr4"]["per_replica"].values()) == len(requests)
