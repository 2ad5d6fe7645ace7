"""The fault-injection benchmark's pure helpers (benchmarks/faults.py): plans, measurements from supervisor
events, targets, extrapolation and result files. The Ray part is exercised by running the benchmark."""

from __future__ import annotations

import csv
import json
import math

import pytest

from benchmarks import faults as bench
from controlplane.compute.topology import load_topology
from jobs.runtime.goodput import BAIGE_ETTR_TARGET, LLAMA3_FAILURES, extrapolate_ettr, young_daly_interval_s

T0 = 1000.0
STEPS = 120


def _metric(at, step, rank=0):
    return {"type": "metric", "at": at, "rank": rank, "step": step, "compute_time": 0.1}


def _record(fault="crash", *, events=None, final_state="succeeded", final_step=STEPS - 1, **extra):
    record = {"name": fault or "baseline", "fault": fault, "nodes": ["h100-pool-0", "h100-pool-1"],
              "launched_at": T0, "ended_at": T0 + 40.0, "final_state": final_state, "final_step": final_step,
              "events": events if events is not None else [], "placements": [], "injected_at": None,
              "inject_step": None}
    record.update(extra)
    return record


def _crash_events():
    """A run: first start at T0+2, checkpoint 39 at T0+10, fault injected at T0+12 (the caller says so),
    detected at T0+12.5, restarted at T0+14, first new step at T0+18, done at T0+40."""
    return [
        {"type": "state", "state": "starting", "at": T0 + 1.0},
        {"type": "state", "state": "running", "at": T0 + 2.0},
        _metric(T0 + 9.9, 39),
        {"type": "checkpoint", "at": T0 + 10.0, "step": 39, "save_s": 0.02},
        _metric(T0 + 11.9, 52),
        {"type": "fault", "kind": "worker_crash", "rank": 1, "at": T0 + 12.5, "occurred_at": T0 + 12.2,
         "detected_at": T0 + 12.5, "evidence": "worker process of rank 1 is dead", "step": 52},
        {"type": "state", "state": "recovering", "at": T0 + 12.5},
        {"type": "state", "state": "running", "at": T0 + 14.0},
        {"type": "log", "at": T0 + 17.0, "rank": 0, "line": "rank 0: resumed from checkpoint step 39"},
        _metric(T0 + 18.0, 40),
        {"type": "recovery", "kind": "worker_crash", "at": T0 + 18.4, "occurred_at": T0 + 12.2,
         "detected_at": T0 + 12.5, "resumed_at": T0 + 18.4, "recomputed_steps": 13, "recomputed_s": 1.3},
        {"type": "checkpoint", "at": T0 + 30.0, "step": 59, "save_s": 0.04},
        {"type": "state", "state": "succeeded", "at": T0 + 40.0},
    ]


def test_plan_runs_puts_the_baseline_first_and_node_loss_last_on_the_a100_pool():
    plans = bench.plan_runs(bench.FAULTS, 1)
    assert [p.name for p in plans] == ["baseline", "crash", "hang", "slow", "nan", "node_loss/group",
                                       "node_loss/tree"]
    assert {p.pool for p in plans if p.fault != "node_loss"} == {"h100-pool"}
    assert {(p.pool, p.accelerator_type) for p in plans if p.fault == "node_loss"} == {("a100-pool", "nvidia-a100")}
    twice = bench.plan_runs(["crash", "node_loss"], 2, kills=("tree",))
    assert [p.name for p in twice] == ["baseline", "crash-1", "crash-2", "node_loss/tree-1", "node_loss/tree-2"]


def test_benchmark_topology_keeps_h100_and_a100_and_adds_spares():
    topology = bench.benchmark_topology(load_topology(), spares=2)
    pools = {p.name: p.nodes for p in topology.pools}
    assert pools == {"h100-pool": 2, "a100-pool": 4}
    assert all(p.simulated for p in topology.pools)
    assert [n.name for n in topology.node_specs()][-1] == "a100-pool-3"


@pytest.mark.parametrize(("candidates", "expected"), [
    (["a100-pool-0", "a100-pool-2"], (["a100-pool-0", "a100-pool-2"], "spare")),
    (["a100-pool-0"], (["a100-pool-0"], "shrink")),
    (["a100-pool-0", "a100-pool-1", "a100-pool-2", "a100-pool-3"], (["a100-pool-0", "a100-pool-2"], "spare")),
])
def test_replacement_nodes_refills_with_spares_else_shrinks(candidates, expected):
    assert bench.replacement_nodes(["a100-pool-0", "a100-pool-1"], ["a100-pool-1"], candidates) == expected


def test_node_process_tree_takes_the_group_and_every_descendant():
    # pid -> (ppid, pgid): 10 is `ray start`, 11 its raylet, 12 a worker in its own group, 13 a child of it;
    # 20 is another node.
    table = {10: (1, 10), 11: (10, 10), 12: (11, 12), 13: (12, 12), 20: (1, 20), 21: (20, 20)}
    assert bench.node_process_tree(10, table) == {10, 11, 12, 13}
    assert bench.node_process_tree(20, table) == {20, 21}


def test_measure_run_reads_detection_resume_recompute_and_checkpoint_from_the_events():
    m = bench.measure_run(_record(events=_crash_events(), injected_at=T0 + 12.0, inject_step=50), steps=STEPS)
    assert m["detection_s"] == pytest.approx(0.5)  # detected_at - our injection
    assert m["detection_supervisor_s"] == pytest.approx(0.3)  # detected_at - occurred_at
    assert m["resume_s"] == pytest.approx(5.5)  # first step after the restart - detected_at
    assert m["resume_supervisor_s"] == pytest.approx(5.9)
    assert m["recomputed_steps"] == 13
    assert (m["checkpoint_before_fault"], m["resumed_from"], m["checkpoint_ok"]) == (39, 39, True)
    assert m["final_step_ok"] and m["kind_ok"] and m["recovered"]
    assert m["wall_s"] == pytest.approx(40.0) and m["train_s"] == pytest.approx(38.0)
    assert m["checkpoint_save_s_median"] == pytest.approx(0.03)
    # ETTR over [T0+2, T0+40]: detection 0.3 + restart 5.9 + recompute 1.3 lost of 38 s
    assert m["ettr"] == pytest.approx((38.0 - 0.3 - 5.9 - 1.3) / 38.0)
    assert m["lost_restart_s"] == pytest.approx(5.9)


def test_measure_run_flags_a_wrong_final_step_a_misdetection_and_a_lost_checkpoint():
    events = _crash_events()
    events[8] = {"type": "log", "at": T0 + 17.0, "rank": 0, "line": "rank 0: resumed from checkpoint step 19"}
    m = bench.measure_run(_record("node_loss", events=events, final_state="failed", final_step=39,
                                  injected_at=T0 + 12.0), steps=STEPS)
    assert m["kind_ok"] is False  # a node loss seen as a worker crash
    assert m["checkpoint_ok"] is False
    assert not m["final_step_ok"] and m["recovered"] is False


def test_measure_run_of_the_baseline_and_of_an_advisory_slow_node():
    base = bench.measure_run(_record(None, events=[{"type": "state", "state": "running", "at": T0 + 2.0}]),
                             steps=STEPS)
    assert base["ettr"] == 1.0 and base["recovered"] is None and base["detection_s"] is None
    slow_events = [{"type": "state", "state": "running", "at": T0 + 2.0},
                   {"type": "fault", "kind": "slow_node", "at": T0 + 20.0, "occurred_at": T0 + 20.0,
                    "detected_at": T0 + 20.0, "evidence": "slow", "advisory": True}]
    slow = bench.measure_run(_record("slow", events=slow_events, injected_at=T0 + 15.0), steps=STEPS)
    assert slow["detection_s"] == pytest.approx(5.0) and slow["resume_s"] is None
    assert slow["recovered"] and slow["ettr"] == 1.0


def test_a_false_alarm_in_the_baseline_is_reported_and_costs_its_ettr():
    events = [{**e, "kind": "worker_crash"} for e in _crash_events()]
    base = bench.measure_run(_record(None, events=events, restarts=1), steps=STEPS)
    assert base["faults_acted_on"] == 1 and base["expected_faults"] == 0
    assert base["detected_kind"] == "worker_crash" and base["ettr"] < 1.0
    crash = bench.measure_run(_record(events=_crash_events(), injected_at=T0 + 12.0), steps=STEPS)
    runs = [base, crash]
    bench.add_baseline_ratio(runs)
    assert crash["ettr_vs_baseline"] is None  # no clean baseline to compare with
    means = bench.fault_means(runs)
    report = bench.format_report(runs, means, bench.target_rows(means), [], {
        "steps": STEPS, "step_sleep_s": 0.1, "checkpoint_interval_steps": 20, "inject_step": 50,
        "node_kill": ["group"], "save_s": 30.0, "devices": 16384, "host": "test"})
    assert "FALSE ALARM" in report and "PROBLEMS: baseline" in report


def test_node_loss_placement_wait_is_measured_from_awaiting_placement_to_our_call():
    events = _crash_events()
    events[5] = {**events[5], "kind": "node_lost"}
    events[6] = {"type": "state", "state": "awaiting_placement", "at": T0 + 12.5}
    m = bench.measure_run(_record("node_loss", events=events, injected_at=T0 + 12.0, placement_mode="spare",
                                  placements=[{"at": T0 + 12.7, "nodes": ["a", "c"], "mode": "spare"}]),
                          steps=STEPS)
    assert m["placement_wait_s"] == pytest.approx(0.2) and m["placement"] == "spare" and m["recovered"]


def test_means_and_targets_count_only_correctly_handled_runs_and_report_failures():
    ok = bench.measure_run(_record("hang", events=[{**e, "kind": "hang"} if e["type"] in ("fault", "recovery")
                                                   else e for e in _crash_events()], injected_at=T0 + 7.0),
                           steps=STEPS)
    assert ok["detection_s"] == pytest.approx(5.5)
    broken = bench.measure_run(_record("node_loss", events=_crash_events(), final_state="failed", final_step=39,
                                       injected_at=T0 + 12.0), steps=STEPS)
    means = bench.fault_means([ok, broken])
    assert means["hang"]["detection_s"] == pytest.approx(5.5) and means["hang"]["failed"] == 0
    assert means["node_loss"]["failed"] == 1 and means["node_loss"]["detection_s"] is None
    verdicts = {(t["fault"], t["metric"]): t["verdict"] for t in bench.target_rows(means)}
    assert verdicts[("hang", "detection_s")] == "PASS"
    assert verdicts[("hang", "resume_s")] == "PASS"
    assert verdicts[("node_loss", "detection_s")] == "MISS (1 of 1 runs failed)"
    assert verdicts[("crash", "resume_s")] == "n/a"
    slow_hang = bench.target_rows({"hang": {"runs": 1, "failed": 0, "detection_s": 31.0, "resume_s": 21.0}})
    assert [t["verdict"] for t in slow_hang if t["fault"] == "hang"] == ["MISS", "MISS"]


def test_baseline_ratio_is_capped_at_one_and_undefined_for_an_unfinished_run():
    runs = [{"fault": None, "state": "succeeded", "train_s": 30.0, "final_step_ok": True},
            {"fault": "crash", "state": "succeeded", "train_s": 40.0, "final_step_ok": True},
            {"fault": "nan", "state": "succeeded", "train_s": 25.0, "final_step_ok": True},
            {"fault": "node_loss", "state": "failed", "train_s": 90.0, "final_step_ok": False}]
    bench.add_baseline_ratio(runs)
    assert [r["ettr_vs_baseline"] for r in runs] == [1.0, 0.75, 1.0, None]


def test_a_failed_run_has_no_ettr():
    m = bench.measure_run(_record("node_loss", events=_crash_events(), final_state="failed", final_step=39,
                                  injected_at=T0 + 12.0, timed_out=True), steps=STEPS)
    assert m["ettr"] is None and m["timed_out"]


def test_run_timeout_is_three_baselines_after_the_baseline():
    assert bench.run_timeout_s(200.0, []) == 200.0
    assert bench.run_timeout_s(None, []) == bench.BASELINE_TIMEOUT_S
    base = _record(None)  # 40 s wall
    assert bench.run_timeout_s(None, [base]) == pytest.approx(120.0)
    assert bench.run_timeout_s(None, [{**base, "ended_at": T0 + 10.0}]) == bench.AUTO_TIMEOUT_FLOOR_S


def test_llama3_mtbf_for_the_whole_reference_job():
    # 419 interruptions in 54 days: one every 54 * 24 / 419 = 3.09 h on 16,384 GPUs.
    assert bench.llama3_mtbf_s(16384) / 3600 == pytest.approx(54 * 24 / 419)
    assert bench.llama3_mtbf_s(8192) == pytest.approx(2 * bench.llama3_mtbf_s(16384))


def test_extrapolation_uses_young_daly_and_matches_extrapolate_ettr():
    means = {"crash": {"detection_s": 0.5, "resume_s": 5.0}, "hang": {"detection_s": 5.5, "resume_s": 8.0},
             "slow": {"detection_s": 5.0, "resume_s": None}}
    rows = bench.extrapolation_rows(means, devices=16384, save_times=[("assumed", 30.0)])
    assert [r["case"] for r in rows] == ["crash", "hang", "mean of crash/hang", "zero detection + restart (floor)"]
    mtbf = bench.llama3_mtbf_s(16384)
    interval = young_daly_interval_s(checkpoint_save_s=30.0, mtbf_s=mtbf)
    assert interval == pytest.approx(math.sqrt(2 * 30 * mtbf))
    expected = extrapolate_ettr(devices=16384, interruptions=419, period_days=54, reference_devices=16384,
                                detection_s=3.0, restart_s=6.5, checkpoint_interval_s=interval, checkpoint_save_s=30.0)
    mean_row = rows[2]
    assert mean_row["checkpoint_interval_s"] == pytest.approx(interval)
    assert mean_row["ettr"] == pytest.approx(expected.ettr)
    assert mean_row["baige_target"] == BAIGE_ETTR_TARGET and mean_row["meets_baige"] is False
    # With a 30 s blocking save even a zero-cost recovery loses ~2 x sqrt(save / (2 MTBF)) = 7.3%.
    assert rows[-1]["ettr"] == pytest.approx(1 - 2 * math.sqrt(30.0 / (2 * mtbf)))
    assert LLAMA3_FAILURES["interruptions"] == 419


def test_max_blocking_save_reaches_the_target_exactly():
    mtbf = bench.llama3_mtbf_s(16384)
    budget = bench.max_blocking_save_s(mtbf_s=mtbf, detection_s=2.0, restart_s=5.0)
    assert 0.05 < budget < 0.2  # about a tenth of a second at Llama 3's failure rate
    interval = young_daly_interval_s(checkpoint_save_s=budget, mtbf_s=mtbf)
    result = extrapolate_ettr(devices=16384, interruptions=419, period_days=54, reference_devices=16384,
                              detection_s=2.0, restart_s=5.0, checkpoint_interval_s=interval, checkpoint_save_s=budget)
    assert result.ettr == pytest.approx(BAIGE_ETTR_TARGET, abs=1e-9)
    assert bench.max_blocking_save_s(mtbf_s=1000.0, detection_s=4.0, restart_s=2.0) == 0.0


def test_extrapolation_survives_a_free_save():
    rows = bench.extrapolation_rows({}, devices=1024, save_times=[("measured", 0.0)])
    assert [r["case"] for r in rows] == ["zero detection + restart (floor)"]
    assert rows[0]["ettr"] <= 1.0 and rows[0]["checkpoint_interval_s"] > 0


def test_format_table_aligns_columns():
    text = bench.format_table(["run", "s"], [["crash", "0.50"], ["node_loss/tree", "12.25"]])
    lines = text.splitlines()
    assert len({len(line) for line in lines}) == 1
    assert lines[1].startswith("-----")
    assert bench.short_nodes(["h100-pool-0", "a100-pool-2"]) == "h100-0+a100-2"


def test_report_and_result_files(tmp_path):
    crash = bench.measure_run(_record(events=_crash_events(), injected_at=T0 + 12.0, inject_step=50), steps=STEPS)
    base = bench.measure_run(_record(None, events=[{"type": "state", "state": "running", "at": T0 + 2.0}]),
                             steps=STEPS)
    runs = [base, crash]
    bench.add_baseline_ratio(runs)
    means = bench.fault_means(runs)
    targets = bench.target_rows(means)
    extrapolation = bench.extrapolation_rows(means, devices=16384, save_times=[("measured", 0.03), ("assumed", 30)])
    params = {"steps": STEPS, "step_sleep_s": 0.1, "checkpoint_interval_steps": 20, "inject_step": 50,
              "node_kill": ["group", "tree"], "save_s": 30.0, "devices": 16384, "host": "2 CPU cores, simulated"}
    report = bench.format_report(runs, means, targets, extrapolation, params,
                                 {"load_average_at_start": [1.0], "load_average_at_end": [2.0]})
    assert "SIMULATED" in report and "99.5%" in report and "PASS" in report and "PROBLEMS" not in report
    result = {"benchmark": "faults", "date": "2026-01-01T00:00:00+00:00", "host": params["host"],
              "parameters": params, "runs": runs}
    bench.write_results(result, tmp_path / "faults.json", tmp_path / "faults.csv")
    assert json.loads((tmp_path / "faults.json").read_text())["runs"][1]["recomputed_steps"] == 13
    rows = list(csv.reader((tmp_path / "faults.csv").open()))
    assert rows[0][0].startswith("# faults; 2026-01-01") and "simulated" in rows[0][0]
    assert rows[1] == list(bench.CSV_FIELDS)
    assert rows[3][rows[1].index("nodes")] == "h100-pool-0+h100-pool-1"
