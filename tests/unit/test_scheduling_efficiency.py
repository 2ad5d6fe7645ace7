"""The efficiency matrix, cost-aware type ranking, and the Gavel trace simulator (benchmarks/gavel.py)."""

from __future__ import annotations

import json
import math
import time

import pytest

from benchmarks import gavel
from controlplane.scheduling.efficiency import (
    ChipFacts,
    EfficiencyMatrix,
    chip_facts_from_accelerator_facts,
    gavel_workload_class,
    load_gavel_matrix,
    rank_accelerator_types,
)

GAVEL_DATA = gavel.DATA_DIR
needs_gavel_data = pytest.mark.skipif(
    not (GAVEL_DATA / "simulation_throughputs.json").exists(),
    reason=f"public Gavel data not found at {GAVEL_DATA} (../shared/benchmarks/gavel-2020 from the repo root)",
)


# -- the matrix ----------------------------------------------------------------------------------------------

def test_unknown_class_gets_a_prior_from_relative_tflops():
    matrix = EfficiencyMatrix(chips=chip_facts_from_accelerator_facts())
    assert matrix.throughput("new-model", "nvidia-h100") == pytest.approx(1.0)
    assert matrix.throughput("new-model", "nvidia-a100") == pytest.approx(312.0 / 989.5)
    assert matrix.source("new-model", "nvidia-a100") == "prior"
    # No TFLOPS figure (kunlun-p800) and no chip facts at all: nothing is known.
    assert matrix.throughput("new-model", "kunlun-p800") == 0.0
    assert matrix.throughput("new-model", "no-such-chip") == 0.0
    assert matrix.source("new-model", "kunlun-p800") == "unknown"
    assert "prior" in (EfficiencyMatrix.prior.__doc__ or "")


def test_partially_known_class_scales_known_values_by_tflops():
    chips = chip_facts_from_accelerator_facts()
    matrix = EfficiencyMatrix({("llm-7b", "nvidia-a100"): 100.0}, chips)
    assert matrix.throughput("llm-7b", "nvidia-a100") == 100.0
    assert matrix.source("llm-7b", "nvidia-a100") == "published"
    assert matrix.throughput("llm-7b", "nvidia-h100") == pytest.approx(100.0 * 989.5 / 312.0)
    assert matrix.source("llm-7b", "nvidia-h100") == "prior"


def test_published_zero_means_cannot_run_not_unknown():
    chips = chip_facts_from_accelerator_facts()
    matrix = EfficiencyMatrix({("big", "nvidia-l40s"): 0.0}, chips)
    assert matrix.throughput("big", "nvidia-l40s") == 0.0
    assert matrix.source("big", "nvidia-l40s") == "published"
    with pytest.raises(ValueError):
        EfficiencyMatrix({("big", "nvidia-l40s"): -1.0}, chips)


def test_observe_replaces_then_averages_and_counts():
    matrix = EfficiencyMatrix({("resnet", "a"): 10.0}, alpha=0.5)
    assert matrix.observations("resnet", "a") == 0
    assert matrix.observe("resnet", "a", 20.0) == 20.0  # the first measurement replaces the published value
    assert matrix.source("resnet", "a") == "measured"
    assert matrix.observe("resnet", "a", 30.0) == pytest.approx(25.0)
    assert matrix.observations("resnet", "a") == 2
    # From step times: 0.5 s per step of 64 samples on 2 devices = 64 samples/s per device.
    matrix.observe_step_time("resnet", "b", 0.5, units_per_step=64, devices=2)
    assert matrix.throughput("resnet", "b") == pytest.approx(64.0)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            matrix.observe("resnet", "a", bad)
    assert matrix.observations("resnet", "a") == 2


# -- ranking -------------------------------------------------------------------------------------------------

def _hand_made() -> EfficiencyMatrix:
    chips = [
        ChipFacts("fast", 1000.0, 80.0, 4.0),
        ChipFacts("slow", 250.0, 24.0, 1.0),
        ChipFacts("mystery", None, None, None),
        ChipFacts("useless", 100.0, 16.0, 0.1),
    ]
    known = {("job", "fast"): 10.0, ("job", "slow"): 2.0, ("job", "mystery"): 50.0, ("job", "useless"): 0.0}
    return EfficiencyMatrix(known, chips)


def test_faster_pricier_chip_can_win_on_cost_per_unit():
    ranked = rank_accelerator_types(workload_class="job", accepted=["slow", "fast", "mystery", "useless"],
                                    matrix=_hand_made())
    assert [c.accelerator_type for c in ranked] == ["fast", "slow", "mystery", "useless"]
    fast, slow, mystery, useless = ranked
    assert fast.cost_per_unit == pytest.approx(4.0 / (3600 * 10.0))  # cheaper per step than slow's 1/(3600*2)
    assert slow.cost_per_unit == pytest.approx(1.0 / (3600 * 2.0))
    assert fast.reason.startswith("lowest cost per unit of work: $")
    assert "per 1k steps" in fast.reason and "5x the throughput of slow" in fast.reason
    # Unknown price: after the priced types even though it is the fastest, with no cost per unit.
    assert mystery.price_per_hour is None and mystery.cost_per_unit is None and "price unknown" in mystery.reason
    assert useless.throughput == 0.0 and "cannot run" in useless.reason


def test_cheaper_chip_wins_when_speedup_is_below_price_ratio():
    chips = [ChipFacts("fast", 1000.0, 80.0, 4.0), ChipFacts("slow", 250.0, 24.0, 1.0)]
    matrix = EfficiencyMatrix({("memory-bound", "fast"): 3.0, ("memory-bound", "slow"): 2.0}, chips)
    ranked = rank_accelerator_types(workload_class="memory-bound", accepted=["fast", "slow"], matrix=matrix,
                                    devices=4)
    assert [c.accelerator_type for c in ranked] == ["slow", "fast"]
    assert ranked[0].throughput == pytest.approx(8.0) and ranked[0].price_per_hour == pytest.approx(4.0)
    assert ranked[0].cost_per_unit == pytest.approx(1.0 / (3600 * 2.0))  # per unit: independent of devices


def test_unknown_prices_rank_by_throughput_and_priors_are_flagged():
    chips = chip_facts_from_accelerator_facts()
    ranked = rank_accelerator_types(workload_class="new-model", matrix=EfficiencyMatrix(chips=chips),
                                    accepted=["ascend-910b", "nvidia-a100", "nvidia-h100", "nvidia-a100"])
    names = [c.accelerator_type for c in ranked]
    assert names == ["nvidia-h100", "nvidia-a100", "ascend-910b"]  # duplicates dropped; 910b: no facts at all
    assert all("prior from chip TFLOPS" in c.reason for c in ranked[:2])
    assert "no known throughput" in ranked[-1].reason


def test_load_gavel_matrix_from_a_small_file(tmp_path):
    path = tmp_path / "throughputs.json"
    path.write_text(json.dumps({
        chip: {"('ResNet-18 (batch size 32)', 1)": {"null": rate, "('A3C', 1)": [1.0, 1.0]},
               "('ResNet-18 (batch size 32)', 4)": {"null": 4 * rate}}
        for chip, rate in (("k80", 2.0), ("p100", 5.0), ("v100", 8.0))
    }))
    matrix = load_gavel_matrix(path)
    assert matrix.throughput(gavel_workload_class("ResNet-18 (batch size 32)", 1), "v100") == 8.0
    assert matrix.throughput(gavel_workload_class("ResNet-18 (batch size 32)", 4), "k80") == 2.0  # per device
    assert matrix.throughput("A3C x1", "v100") == 0.0 and matrix.source("A3C x1", "v100") == "unknown"


@needs_gavel_data
def test_load_the_real_gavel_matrix():
    matrix = load_gavel_matrix(GAVEL_DATA / "simulation_throughputs.json")
    resnet = gavel_workload_class("ResNet-18 (batch size 32)", 8)
    assert matrix.throughput(resnet, "v100") * 8 == pytest.approx(340.04, abs=0.01)
    cyclegan = gavel_workload_class("CycleGAN", 1)
    assert matrix.throughput(cyclegan, "v100") / matrix.throughput(cyclegan, "k80") > 8


# -- the trace parser ----------------------------------------------------------------------------------------

def _line(job_type="A3C", steps="1000", arrival="0.0", scale="1", needs_data_dir="1") -> str:
    return "\t".join([job_type, "cd %s && python3 main.py", "--num_steps", needs_data_dir, steps, arrival, scale])


def test_parse_trace_reports_bad_lines_with_numbers():
    lines = [
        _line(),
        "only\tthree\tfields",
        _line(steps="many"),
        _line(arrival="-5"),
        "",
        _line(needs_data_dir="yes"),
        _line(scale="0"),
        _line(job_type="LM (batch size 20)", scale="3", arrival="12.5"),
        _line(steps="0"),
    ]
    trace = gavel.parse_trace(lines, name="t")
    assert [j.line for j in trace.jobs] == [1, 8]
    assert [e.line for e in trace.errors] == [2, 3, 4, 6, 9]
    assert "expected 7 tab-separated fields" in str(trace.errors[0])
    assert str(trace.errors[0]).startswith("line 2:")
    assert trace.dropped == [7]
    lm = trace.jobs[1]
    assert (lm.job_type, lm.total_steps, lm.arrival, lm.scale_factor, lm.gpus) == ("LM (batch size 20)", 1000,
                                                                                  12.5, 3, 2)


@pytest.mark.parametrize("job_type,scale,gpus", [
    ("ResNet-18 (batch size 32)", 1, 1),
    ("ResNet-18 (batch size 32)", 3, 2),
    ("ResNet-50 (batch size 64)", 4, 4),
    ("Transformer (batch size 128)", 12, 8),
    ("LM (batch size 5)", 32, 8),
    ("LM (batch size 5)", 7, 4),
    ("A3C", 4, 1),
    ("CycleGAN", 8, 1),
    ("Recommendation (batch size 8192)", 16, 1),
    ("ResNet-18 (batch size 32)", 0, None),
    ("A3C", 0, None),
])
def test_gavel_conversion(job_type, scale, gpus):
    assert gavel.convert_scale(job_type, scale) == gpus


# -- the simulator -------------------------------------------------------------------------------------------

def _rate(throughputs: dict[tuple[str, str], float]) -> gavel.RateFn:
    """Whole-job steps/s on each chip, the same for any GPU count (per device: value / gpus)."""
    known = {(gavel_workload_class(job_type, gpus), chip): value / gpus
             for (job_type, chip), value in throughputs.items() for gpus in (1, 2, 4, 8)}
    return gavel.matrix_rate(EfficiencyMatrix(known))


def _job(job_id, job_type, steps, arrival=0.0, gpus=1) -> gavel.TraceJob:
    return gavel.TraceJob(job_id, job_id + 1, job_type, steps, arrival, gpus, gpus)


def test_heterogeneity_aware_policy_beats_fifo_on_a_constructed_workload():
    # "flat" barely gains from the v100; "steep" runs 10x faster there. One GPU of each kind.
    rate = _rate({("flat", "v100"): 1.05, ("flat", "k80"): 1.0, ("steep", "v100"): 10.0, ("steep", "k80"): 1.0})
    jobs = [_job(0, "flat", 100), _job(1, "steep", 100)]
    capacity = {"v100": 1, "p100": 0, "k80": 1}
    fifo = gavel.simulate(jobs, capacity, gavel.FifoPolicy(rate, gavel.CHIPS))
    ours = gavel.simulate(jobs, capacity, gavel.FleetyardPolicy(rate, gavel.CHIPS))
    assert fifo.avg_jct_h * 3600 == pytest.approx((100 / 1.05 + 100) / 2)  # flat got the v100
    assert ours.avg_jct_h * 3600 == pytest.approx((100 + 10) / 2)  # flat left it to steep
    assert ours.chip_jobs == {"v100": 1, "p100": 0, "k80": 1}


def test_fleetyard_waits_for_a_much_faster_chip_and_backfills():
    rate = _rate({("steep", "v100"): 10.0, ("steep", "k80"): 0.1, ("flat", "v100"): 1.0, ("flat", "k80"): 1.0})
    jobs = [_job(0, "steep", 100), _job(1, "steep", 100, arrival=1.0), _job(2, "flat", 5, arrival=1.0)]
    capacity = {"v100": 1, "p100": 0, "k80": 1}
    result = gavel.simulate(jobs, capacity, gavel.FleetyardPolicy(rate, gavel.CHIPS))
    # Job 1 waits 9 s for the v100 (10 s there) instead of 1000 s on the k80; job 2 backfills the k80.
    assert result.avg_jct_h * 3600 == pytest.approx((10 + 19 + 5) / 3)
    assert result.chip_jobs == {"v100": 2, "p100": 0, "k80": 1}


def test_gangs_need_one_chip_type_and_infeasible_jobs_are_listed():
    rate = _rate({("steep", "v100"): 10.0, ("steep", "k80"): 1.0})
    jobs = [_job(0, "steep", 100, gpus=2), _job(1, "steep", 100, gpus=4)]
    capacity = {"v100": 2, "p100": 0, "k80": 3}
    for policy in (gavel.FifoPolicy, gavel.AgnosticPolicy, gavel.FleetyardPolicy):
        result = gavel.simulate(jobs, capacity, policy(rate, gavel.CHIPS))
        assert result.jobs == 1 and result.unschedulable == [2]


def test_agnostic_policy_is_seeded():
    rate = _rate({("flat", "v100"): 1.0, ("flat", "p100"): 1.0, ("flat", "k80"): 1.0})
    jobs = [_job(i, "flat", 100 + i, arrival=float(i)) for i in range(30)]
    capacity = {"v100": 2, "p100": 2, "k80": 2}
    runs = [gavel.simulate(jobs, capacity, gavel.AgnosticPolicy(rate, gavel.CHIPS, seed)).chip_jobs
            for seed in (1, 1, 2)]
    assert runs[0] == runs[1]


def test_command_reads_any_trace_file_and_writes_results(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "simulation_throughputs.json").write_text(json.dumps({
        chip: {"('A3C', 1)": {"null": rate}, "('CycleGAN', 1)": {"null": rate * speedup}}
        for chip, rate, speedup in (("k80", 1.0, 1.0), ("p100", 2.0, 2.0), ("v100", 2.5, 4.0))
    }))
    trace = tmp_path / "mine.trace"
    trace.write_text("\n".join([_line(), _line(job_type="CycleGAN", arrival="3"), "broken line",
                                _line(scale="0")]) + "\n")
    out = tmp_path / "results"
    assert gavel.main(["--trace", str(trace), "--data-dir", str(data), "--cluster", "1:1:1", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "line 3: expected 7 tab-separated fields" in printed.err
    assert "GAVEL'S OWN SIMULATOR" not in printed.out  # no published numbers for this trace
    payload = json.loads((out / "gavel.json").read_text())
    assert payload["parameters"]["cluster"] == "1:1:1" and payload["date"]
    result = payload["results"][0]
    assert result["jobs_simulated"] == 2 and result["dropped_scale_0_lines"] == [4]
    assert set(result["policies"]) == {"fifo", "agnostic", "fleetyard", "fleetyard-arrival"}
    assert (out / "gavel.csv").read_text().count("\n") == 5


@needs_gavel_data
def test_smoke_first_50_jobs_of_a_real_trace():
    started = time.perf_counter()
    trace = gavel.load_trace(GAVEL_DATA / "philly-vc" / "2869ce.trace")
    assert not trace.errors and len(trace.jobs) == 533
    trace.jobs = trace.jobs[:50]
    matrix = load_gavel_matrix(GAVEL_DATA / "simulation_throughputs.json")
    results = gavel.run_benchmark([trace], matrix, gavel.parse_cluster("36:36:36"),
                                  ["fifo", "agnostic", "fleetyard"], seed=0)
    policies = results[0]["policies"]
    for row in policies.values():
        assert row["jobs"] == 50
        assert 0 < row["avg_jct_h"] <= row["p99_jct_h"] and 0 < row["utilization"] <= 1
    assert results[0]["no_wait_bound_avg_jct_h"] <= policies["fleetyard"]["avg_jct_h"] + 1e-9
    assert "GAVEL'S OWN SIMULATOR" in gavel.format_report(results, gavel.parse_cluster("36:36:36"), 0)
    assert time.perf_counter() - started < 10


def test_the_accelerator_notes_shown_to_people_use_no_python_words():
    """QA (2026-11-29): the console's cluster page read "every numeric figure is left None"."""
    import re

    from controlplane.cluster.accelerator_facts import ACCELERATOR_FACTS

    for fact in ACCELERATOR_FACTS:
        assert not re.search(r"\bNone\b", fact.get("notes", "")), fact["slug"]
