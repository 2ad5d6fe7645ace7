"""Fault-injection benchmark: a real local Ray cluster, real training gangs, faults injected at a fixed step.

Starts one local multi-node Ray cluster on this host (`controlplane.compute.local_cluster`), then runs the
built-in transformer LM as a 2-worker data-parallel gang (torch.distributed, gloo on CPU) once without a fault
(the baseline) and once per fault type, injecting the fault when the run passes `--inject-step`:

- crash      rank 1's process exits (os._exit, what a segfault or an OOM kill looks like from outside);
- hang       rank 1's loop blocks forever (rank 0 then waits in the gradient all-reduce);
- slow       rank 1's steps take `--slow-factor` x their healthy compute time (advisory: the run goes on);
- nan        rank 1's next loss is NaN;
- node_loss  the Ray node of rank 1 is SIGKILLed, twice (--kill): "group" = `LocalCluster.kill_node` (the node's
             process group, raylet and agents, and, since it also signals every descendant, the Ray workers the
             raylet starts in groups of their own); "tree" = this benchmark's own walk of /proc over the same
             processes (`kill_node_tree`). Both kill every process of the node at once, workers included (what
             losing the machine, or its container, does to them); two paths, two node-loss samples. (Before
             `kill_node` signalled descendants, "group" left the workers training for ~2.5 s.)

The benchmark acts as the control plane: when the supervisor asks for a placement after a node loss it places
the gang on the surviving node plus a spare node of the same accelerator type if one is alive and free (same
worker count), else on the survivor alone (shrink). The node-loss runs use the a100 pool, which this benchmark
gives one spare node per node-loss run, and run last, so a node they kill is never one a later run needs; the
other runs use the two h100 nodes (the p800 and CPU pools of the demo topology are left out: idle load on a
small host). Accelerators are SIMULATED (logical Ray resources); the work runs on this host's CPUs. The run
takes about 4-5 minutes on 2 cores; a run that cannot recover is stopped after 3 x the baseline's wall time.

Measured per run, from the supervisor's events (same host, same clock as ours):
- detection: detected_at - the moment we injected (our clock, just before the inject / kill call), and the
  supervisor's own figure detected_at - occurred_at (its estimate of when the fault began);
- resume: the first completed training step after the gang restarted - detected_at (and the supervisor's
  resumed_at - detected_at, taken at its next 0.5 s poll);
- recomputed steps, the checkpoint the workers resumed from (must be the last complete one before the fault),
  the final step index (must be steps - 1), wall time, and ETTR from a `GoodputLedger` fed with the recovery
  event (plus a wall-clock cross-check against the baseline's training time).

Then it extrapolates ETTR to Llama 3's published failure rate (419 unexpected interruptions in 54 days on 16,384
GPUs) for a 16,384-GPU job, with the checkpoint interval chosen by Young/Daly for a checkpoint save time (the one
measured here, and an ASSUMED large-model save time, --save-s), beside Baige's 99.5%.

    .venv/bin/python benchmarks/faults.py [--steps 100] [--inject-step 50] [--repeat 1] [--save-s 30]
                                          [--kill both|group|tree] [--json PATH] [--csv PATH] [--no-write]

Exit status 1 when a run did not reach its last step (the tables say which and why).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import json
import math
import os
import platform as std_platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET, non_negative_float, positive_float  # noqa: E402
from jobs.runtime.goodput import (  # noqa: E402
    BAIGE_ETTR_TARGET,
    LLAMA3_FAILURES,
    GoodputLedger,
    extrapolate_ettr,
    young_daly_interval_s,
)

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
FAULTS = ("crash", "node_loss", "hang", "slow", "nan")
# Faults after which the gang restarts from a checkpoint (slow is advisory: the run keeps going).
RESTARTING = ("crash", "node_loss", "hang", "nan")
# The supervisor's FaultKind for each injected fault.
EXPECTED_KIND = {"crash": "worker_crash", "node_loss": "node_lost", "hang": "hang", "slow": "slow_node",
                 "nan": "bad_loss"}
# DESIGN.md / issue 4 targets on the local cluster.
TARGETS = (
    ("node_loss", "detection_s", 5.0, "node loss detected within 5 s"),
    ("hang", "detection_s", 30.0, "hang detected within 30 s"),
    *((fault, "resume_s", 20.0, f"{fault}: training resumed within 20 s after detection") for fault in RESTARTING),
)
HOST_NOTE = "{cores} CPU cores, simulated accelerators, local Ray cluster"
FAULT_RANK = 1
BASELINE_TIMEOUT_S = 150.0
AUTO_TIMEOUT_FLOOR_S = 60.0
RESUMED_RE = re.compile(r"resumed from checkpoint step (\d+)")


# ---------------------------------------------------------------------------------------------
# plans


@dataclasses.dataclass(frozen=True)
class RunPlan:
    name: str
    fault: str | None  # None: the baseline
    pool: str  # the node pool whose nodes the gang uses (ranks on the pool's first two alive nodes)
    accelerator_type: str
    kill: str | None = None  # node loss: "group" (LocalCluster.kill_node) or "tree" (kill_node_tree: our /proc walk)


def plan_runs(faults: Sequence[str], repeat: int, kills: Sequence[str] = ("group", "tree")) -> list[RunPlan]:
    """Baseline first, then each fault `repeat` times; node-loss runs (one per kill mode) last, on the a100
    pool: they kill a node, and no later run needs it."""
    plans = [RunPlan("baseline", None, "h100-pool", "nvidia-h100")]
    for index in range(repeat):
        suffix = f"-{index + 1}" if repeat > 1 else ""
        for fault in faults:
            if fault != "node_loss":
                plans.append(RunPlan(f"{fault}{suffix}", fault, "h100-pool", "nvidia-h100"))
    if "node_loss" in faults:
        for index in range(repeat):
            suffix = f"-{index + 1}" if repeat > 1 else ""
            for kill in kills:
                plans.append(RunPlan(f"node_loss/{kill}{suffix}", "node_loss", "a100-pool", "nvidia-a100", kill))
    return plans


def benchmark_topology(topology, *, spare_pool: str = "a100-pool", spares: int = 1, keep=("h100-pool", "a100-pool")):
    """The demo topology's h100 and a100 pools (the others are idle load on a small host), the a100 pool with
    `spares` extra nodes, so that a node-loss run can be placed again at its full size."""
    pools = []
    for pool in topology.pools:
        if pool.name not in keep:
            continue
        if pool.name == spare_pool:
            pool = dataclasses.replace(pool, nodes=pool.nodes + spares)
        pools.append(pool)
    return dataclasses.replace(topology, cluster_name=topology.cluster_name + "-faults-bench", pools=tuple(pools))


def replacement_nodes(gang: Sequence[str], lost: Sequence[str], candidates: Sequence[str]) -> tuple[list[str], str]:
    """Nodes for a gang after it lost some: the survivors plus spares from `candidates` (alive, free nodes of
    the same type, in order) up to the gang's size; ("shrink" if too few spares, else "spare")."""
    survivors = [n for n in gang if n not in lost]
    spares = [n for n in candidates if n not in gang and n not in lost]
    nodes = survivors + spares[: len(gang) - len(survivors)]
    return nodes, ("spare" if len(nodes) == len(gang) else "shrink")


# ---------------------------------------------------------------------------------------------
# measurements (pure: events and times in, numbers out)


def _first(events: Sequence[dict], pred: Callable[[dict], bool]) -> dict | None:
    return next((e for e in events if pred(e)), None)


def _mean(values: Sequence[float | None]) -> float | None:
    clean = [v for v in values if v is not None]
    return statistics.fmean(clean) if clean else None


def measure_run(record: dict, *, steps: int) -> dict:
    """The figures of one run from what `drive_run` recorded: its events (every event the supervisor
    reported, in order), our injection time, our placement calls, and the final report."""
    events = record["events"]
    fault = record.get("fault")
    out: dict[str, Any] = {"name": record["name"], "fault": fault, "kill": record.get("kill"),
                           "nodes": list(record["nodes"]),
                           "final_nodes": list(record.get("final_nodes") or record["nodes"]),
                           "state": record["final_state"], "reason": record.get("final_reason", "")}
    running = [e for e in events if e["type"] == "state" and e["state"] == "running"]
    first_running_at = running[0]["at"] if running else record["launched_at"]
    ended_at = record["ended_at"]
    out["wall_s"] = ended_at - record["launched_at"]
    out["train_s"] = ended_at - first_running_at
    out["startup_s"] = first_running_at - record["launched_at"]
    out["final_step"] = record["final_step"]
    out["final_step_ok"] = record["final_state"] == "succeeded" and record["final_step"] == steps - 1
    # What a checkpoint costs training: the time the loop is blocked (copying the state into memory;
    # the write itself runs in the background, see jobs.runtime.worker.AsyncCheckpointWriter).
    saves = [e.get("blocked_s", e["save_s"]) for e in events if e["type"] == "checkpoint" and "save_s" in e]
    writes = [e["save_s"] for e in events if e["type"] == "checkpoint" and "save_s" in e]
    out["checkpoint_save_s_median"] = statistics.median(saves) if saves else None
    out["checkpoint_write_s_median"] = statistics.median(writes) if writes else None
    out["checkpoints"] = len(saves)
    out["injected_at"] = record.get("injected_at")
    out["inject_step"] = record.get("inject_step")

    fault_event = None
    if fault is not None:
        advisory = fault == "slow"
        fault_event = _first(events, lambda e: e["type"] == "fault" and bool(e.get("advisory")) == advisory)
    recovery = _first(events, lambda e: e["type"] == "recovery")
    out["detected_kind"] = fault_event["kind"] if fault_event else None
    out["kind_ok"] = None if fault is None else bool(fault_event and fault_event["kind"] == EXPECTED_KIND[fault])
    out["evidence"] = fault_event["evidence"] if fault_event else ""
    out["fault_step"] = fault_event.get("step") if fault_event else None
    for key in ("detection_s", "detection_supervisor_s", "resume_s", "resume_supervisor_s", "placement_wait_s",
                "recomputed_steps", "recomputed_s", "checkpoint_before_fault", "resumed_from", "checkpoint_ok"):
        out[key] = None
    out["restarts"] = record.get("restarts", 0)
    out["placement"] = record.get("placement_mode")
    if fault_event is not None:
        detected_at = fault_event["detected_at"]
        if record.get("injected_at") is not None:
            out["detection_s"] = detected_at - record["injected_at"]
        out["detection_supervisor_s"] = detected_at - fault_event["occurred_at"]
        done = [e["step"] for e in events if e["type"] == "checkpoint" and e["at"] <= detected_at]
        out["checkpoint_before_fault"] = max(done) if done else -1
    if recovery is not None and fault_event is not None:
        detected_at = recovery["detected_at"]
        restarted = _first(running, lambda e: e["at"] > detected_at)
        after = restarted["at"] if restarted else detected_at
        first_step = min((e["at"] for e in events if e["type"] == "metric" and e["at"] > after), default=None)
        out["resume_s"] = None if first_step is None else first_step - detected_at
        out["resume_supervisor_s"] = recovery["resumed_at"] - detected_at
        out["recomputed_steps"] = recovery["recomputed_steps"]
        out["recomputed_s"] = recovery["recomputed_s"]
        placed = [p["at"] for p in record.get("placements", []) if p["at"] >= detected_at]
        waiting = _first(events, lambda e: e["type"] == "state" and e["state"] == "awaiting_placement"
                         and e["at"] >= detected_at)
        if placed and waiting:
            out["placement_wait_s"] = placed[0] - waiting["at"]
        resumed = [int(m.group(1)) for e in events if e["type"] == "log" and e["at"] > detected_at
                   and (m := RESUMED_RE.search(e.get("line", "")))]
        out["resumed_from"] = min(resumed) if resumed else -1
        out["checkpoint_ok"] = out["resumed_from"] == out["checkpoint_before_fault"]
    out["recovered"] = None if fault is None else bool(
        out["final_step_ok"] and out["kind_ok"] and (fault == "slow" or recovery is not None))
    # Faults the supervisor acted on: exactly one is expected from a restarting fault, none from the baseline
    # or a slow node (advisory). More means a false alarm or a failed restart.
    acted = [e for e in events if e["type"] == "fault" and not e.get("advisory")]
    out["faults_acted_on"] = len(acted)
    out["expected_faults"] = 1 if fault in RESTARTING else 0
    if fault is None and acted:
        out["detected_kind"] = acted[0]["kind"]
        out["evidence"] = acted[0]["evidence"]
    recoveries = [e for e in events if e["type"] == "recovery"]
    out.update(run_goodput(first_running_at=first_running_at, ended_at=ended_at, recoveries=recoveries))
    if out["recovered"] is False or not out["final_step_ok"]:
        out["ettr"] = None  # the run did not finish its work: its ETTR is not defined
    out["timed_out"] = bool(record.get("timed_out"))
    out["timeout_s"] = record.get("timeout_s")
    return out


def run_goodput(*, first_running_at: float, ended_at: float, recoveries: Sequence[dict]) -> dict:
    """ETTR of one run from its first start to its end, with a GoodputLedger fed its recovery events."""
    ledger = GoodputLedger(first_started_at=first_running_at)
    for recovery in recoveries:
        ledger.record_interruption(kind=recovery["kind"], occurred_at=recovery["occurred_at"],
                                   detected_at=recovery["detected_at"], resumed_at=recovery["resumed_at"],
                                   recomputed_s=recovery["recomputed_s"],
                                   recomputed_steps=recovery["recomputed_steps"])
    summary = ledger.summary(now=ended_at)
    return {"ettr": summary.ettr, "lost_detection_s": summary.detection_s, "lost_restart_s": summary.restart_s,
            "lost_recompute_s": summary.recompute_s}


def add_baseline_ratio(measurements: list[dict]) -> None:
    """Wall-clock cross-check of ETTR: the baseline's training time / this run's training time."""
    base = _mean([m["train_s"] for m in measurements
                  if m["fault"] is None and m["state"] == "succeeded" and not m.get("faults_acted_on")])
    for m in measurements:
        done = m["final_step_ok"]
        m["ettr_vs_baseline"] = None if not base or not m["train_s"] or not done else min(1.0, base / m["train_s"])


def fault_means(measurements: Sequence[dict]) -> dict[str, dict]:
    """Mean detection / resume times per fault type over its runs that were handled as they should be
    (detected as the right kind, recovered, final step reached); `failed` counts the others."""
    means: dict[str, dict] = {}
    for fault in FAULTS:
        every = [m for m in measurements if m["fault"] == fault]
        if not every:
            continue
        runs = [m for m in every if m["recovered"]]
        means[fault] = {"runs": len(every), "failed": len(every) - len(runs),
                        "failed_runs": [m["name"] for m in every if not m["recovered"]],
                        "detection_s": _mean([m["detection_s"] for m in runs]),
                        "detection_supervisor_s": _mean([m["detection_supervisor_s"] for m in runs]),
                        "resume_s": _mean([m["resume_s"] for m in runs]),
                        "recomputed_steps": _mean([m["recomputed_steps"] for m in runs]),
                        "ettr": _mean([m["ettr"] for m in runs])}
    return means


def target_rows(means: dict[str, dict]) -> list[dict]:
    """PASS when the mean over the runs handled correctly is within the limit and no run of that fault
    type failed (misdetected, not recovered, wrong final step); MISS otherwise; n/a when not run."""
    rows = []
    for fault, key, limit, label in TARGETS:
        stats = means.get(fault, {})
        value = stats.get(key)
        failed = stats.get("failed", 0)
        if not stats:
            verdict = "n/a"
        elif failed:
            verdict = f"MISS ({failed} of {stats['runs']} runs failed)"
        elif value is None:
            verdict = "n/a"
        else:
            verdict = "PASS" if value <= limit else "MISS"
        rows.append({"target": label, "fault": fault, "metric": key, "limit_s": limit, "measured_s": value,
                     "runs": stats.get("runs", 0), "failed_runs": stats.get("failed_runs", []), "verdict": verdict})
    return rows


def llama3_mtbf_s(devices: int, failures: dict = LLAMA3_FAILURES) -> float:
    """Mean time between interruptions of a `devices`-device job at the reference per-device failure rate."""
    per_device_s = failures["interruptions"] / (failures["devices"] * failures["period_days"] * 86400.0)
    return 1.0 / (per_device_s * devices)


def extrapolation_rows(means: dict[str, dict], *, devices: int, save_times: Sequence[tuple[str, float]],
                       failures: dict = LLAMA3_FAILURES) -> list[dict]:
    """ETTR of a `devices`-device job at Llama 3's interruption rate, per fault type (every interruption
    assumed to be of that type) and for the mean over the restarting types, for each checkpoint save time,
    with the Young/Daly checkpoint interval for that save time. Plus a 'zero detection and restart' floor."""
    mtbf_s = llama3_mtbf_s(devices, failures)
    cases: list[tuple[str, float, float]] = []
    measured = [f for f in RESTARTING if f in means and means[f]["detection_s"] is not None
                and means[f]["resume_s"] is not None]
    for fault in measured:
        cases.append((fault, means[fault]["detection_s"], means[fault]["resume_s"]))
    if measured:
        cases.append(("mean of " + "/".join(measured), statistics.fmean(means[f]["detection_s"] for f in measured),
                      statistics.fmean(means[f]["resume_s"] for f in measured)))
    cases.append(("zero detection + restart (floor)", 0.0, 0.0))
    rows = []
    for save_label, save_s in save_times:
        interval = young_daly_interval_s(checkpoint_save_s=save_s, mtbf_s=mtbf_s)
        interval = max(interval, 1e-3)  # a free save would give 0: checkpoint (almost) every step
        for label, detection_s, restart_s in cases:
            result = extrapolate_ettr(devices=devices, interruptions=failures["interruptions"],
                                      period_days=failures["period_days"], reference_devices=failures["devices"],
                                      detection_s=detection_s, restart_s=restart_s, checkpoint_interval_s=interval,
                                      checkpoint_save_s=save_s)
            rows.append({"case": label, "save": save_label, "checkpoint_save_s": save_s, "devices": devices,
                         "mtbf_h": mtbf_s / 3600.0, "checkpoint_interval_s": interval, "detection_s": detection_s,
                         "restart_s": restart_s, "ettr": result.ettr, "lost_fraction": result.lost_fraction,
                         "detection_fraction": result.detection_fraction, "restart_fraction": result.restart_fraction,
                         "recompute_fraction": result.recompute_fraction,
                         "checkpoint_fraction": result.checkpoint_fraction,
                         "baige_target": BAIGE_ETTR_TARGET, "meets_baige": result.meets_baige_target})
    return rows


def max_blocking_save_s(*, mtbf_s: float, detection_s: float, restart_s: float,
                        target: float = BAIGE_ETTR_TARGET) -> float:
    """The longest blocking checkpoint save that still reaches `target` ETTR with the Young/Daly interval.

    With interval t = sqrt(2 s M) the lost fraction is (d + R) / M + t / (2 M) + s / t = (d + R) / M + sqrt(2 s / M),
    so ETTR >= target needs s <= M / 2 x (1 - target - (d + R) / M)^2 (0 when detection + restart alone miss it)."""
    slack = 1.0 - target - (detection_s + restart_s) / mtbf_s
    return 0.0 if slack <= 0 else mtbf_s / 2.0 * slack * slack


# ---------------------------------------------------------------------------------------------
# tables


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.{digits}f}"
    return str(value)


def short_nodes(nodes: Sequence[str]) -> str:
    """["h100-pool-0", "h100-pool-1"] -> "h100-0+h100-1"."""
    return "+".join(n.replace("-pool-", "-") for n in nodes)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def format_report(measurements: Sequence[dict], means: dict, targets: Sequence[dict], extrapolation: Sequence[dict],
                  params: dict, info: dict | None = None) -> str:
    steps = params["steps"]
    load = [(info or {}).get(f"load_average_at_{when}", [math.nan])[0] for when in ("start", "end")]
    parts = [
        f"Fault-injection benchmark - {params['host']}; accelerators are SIMULATED (the work runs on CPU)",
        f"2-worker built-in LM gang, {steps} steps (last index {steps - 1}), step_sleep_s {params['step_sleep_s']}, "
        f"checkpoint every {params['checkpoint_interval_steps']} steps, fault on rank {FAULT_RANK} once step "
        f">= {params['inject_step']} is seen; node loss by SIGKILL of the node's process "
        f"{' / '.join(params['node_kill'])}",
        f"host load average (1 min) {load[0]:.1f} at start, {load[1]:.1f} at end "
        "(other work on this host slows restarts)",
        "",
        "Per run (detect = detected_at - our injection time; sup = the supervisor's detected_at - occurred_at;",
        "resume = first completed step after the restart - detected_at; ETTR = GoodputLedger from the recovery",
        "event; vs base = the baseline's training wall time / this run's)",
        format_table(
            ["run", "nodes", "inj step", "det step", "detected as", "rst", "detect s", "sup s", "resume s",
             "sup resume s", "place", "recomp steps", "ckpt->resumed", "final step", "wall s", "ETTR", "vs base"],
            [[m["name"], short_nodes(m["final_nodes"]), _fmt(m["inject_step"]),
              _fmt(m["fault_step"]), (m["detected_kind"] or "-") + ("" if m["kind_ok"] is not False else " (WRONG)")
              + (" (FALSE ALARM)" if m["fault"] is None and m["faults_acted_on"] else ""), _fmt(m["restarts"]),
              _fmt(m["detection_s"]),
              _fmt(m["detection_supervisor_s"]),
              _fmt(m["resume_s"]), _fmt(m["resume_supervisor_s"]),
              "-" if not m["placement"] else f"{m['placement']} {_fmt(m['placement_wait_s'])}s",
              _fmt(m["recomputed_steps"]),
              "-" if m["resumed_from"] is None else
              f"{m['checkpoint_before_fault']}->{m['resumed_from']} {'ok' if m['checkpoint_ok'] else 'LOST'}",
              f"{m['final_step']} {'ok' if m['final_step_ok'] else 'WRONG'}", _fmt(m["wall_s"], 1),
              _pct(m["ettr"]), _pct(m.get("ettr_vs_baseline"))] for m in measurements]),
        "",
        "Targets (local cluster; means over the runs of each fault type)",
        format_table(["target", "limit s", "measured s", "verdict"],
                     [[t["target"], _fmt(t["limit_s"], 0), _fmt(t["measured_s"]), t["verdict"]] for t in targets]),
        "",
        f"Extrapolation to Llama 3's interruption rate ({LLAMA3_FAILURES['interruptions']} in "
        f"{LLAMA3_FAILURES['period_days']} days on {LLAMA3_FAILURES['devices']:,} GPUs) for a "
        f"{params['devices']:,}-GPU job; MTBF {extrapolation[0]['mtbf_h']:.2f} h; Young/Daly checkpoint interval;"
        if extrapolation else "No extrapolation (nothing measured).",
        "the local detection/restart times are assumed to hold at that scale (optimistic: a 16k-GPU restart is",
        f"slower). Save times: 'measured' = median of this run's toy-model checkpoints; 'assumed' = --save-s "
        f"{params['save_s']} s (an ASSUMPTION for a large model, blocking save). Baige target "
        f"{100 * BAIGE_ETTR_TARGET:.1f}%.",
        format_table(
            ["case", "save", "save s", "ckpt every s", "detect s", "restart s", "lost detect", "lost restart",
             "lost recompute", "lost ckpt", "ETTR", "vs Baige 99.5%"],
            [[r["case"], r["save"], _fmt(r["checkpoint_save_s"], 3), _fmt(r["checkpoint_interval_s"], 0),
              _fmt(r["detection_s"]), _fmt(r["restart_s"]), _pct(r["detection_fraction"]),
              _pct(r["restart_fraction"]), _pct(r["recompute_fraction"]), _pct(r["checkpoint_fraction"]),
              _pct(r["ettr"]), "meets" if r["meets_baige"] else "below"] for r in extrapolation]),
    ]
    mean_row = next((r for r in extrapolation if r["case"].startswith("mean of")), None)
    if mean_row is not None:
        budget = max_blocking_save_s(mtbf_s=mean_row["mtbf_h"] * 3600.0, detection_s=mean_row["detection_s"],
                                     restart_s=mean_row["restart_s"])
        parts.append(f"To reach Baige's {100 * BAIGE_ETTR_TARGET:.1f}% at this failure rate with the measured mean "
                     f"detection + restart ({mean_row['detection_s'] + mean_row['restart_s']:.1f} s), a checkpoint may "
                     f"block training for at most {budget:.2f} s (Young/Daly interval "
                     f"{math.sqrt(2 * budget * mean_row['mtbf_h'] * 3600.0):.0f} s): large models need asynchronous "
                     "checkpointing (snapshot, then persist in the background).")
    problems = [m for m in measurements if not m["final_step_ok"] or m["kind_ok"] is False
                or m["faults_acted_on"] != m["expected_faults"]
                or m["checkpoint_ok"] is False]
    if problems:
        parts += ["", "PROBLEMS: " + "; ".join(
            f"{m['name']}: state {m['state']}, final step {m['final_step']}, {m['faults_acted_on']} fault(s) acted "
            f"on (expected {m['expected_faults']}), first: {m['detected_kind']} ({m['evidence'][:160]}); last reason: "
            f"{m['reason'][:160]}" for m in problems)]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# results files


CSV_FIELDS = ("name", "fault", "kill", "detected_kind", "faults_acted_on", "restarts", "nodes", "final_nodes",
              "inject_step", "fault_step", "detection_s",
              "detection_supervisor_s", "resume_s", "resume_supervisor_s", "placement", "placement_wait_s",
              "recomputed_steps", "recomputed_s", "checkpoint_before_fault", "resumed_from", "checkpoint_ok",
              "final_step", "final_step_ok", "state", "wall_s", "train_s", "ettr", "ettr_vs_baseline",
              "checkpoint_save_s_median", "timed_out")


def write_results(result: dict, json_path: Path, csv_path: Path) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    with open(csv_path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["# " + f"{result['benchmark']}; {result['date']}; {result['host']}; "
                         + "parameters " + json.dumps(result["parameters"], sort_keys=True)])
        writer.writerow(CSV_FIELDS)
        for m in result["runs"]:
            writer.writerow(["+".join(v) if isinstance(v := m.get(f), list) else ("" if v is None else v)
                             for f in CSV_FIELDS])


# ---------------------------------------------------------------------------------------------
# driving the cluster (the part that needs Ray)


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, pgid) of every process, from /proc (Linux)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2:].split()
        table[int(name)] = (int(fields[1]), int(fields[2]))
    return table


def _state(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return raw[raw.rfind(")") + 2:].split()[0]


def node_process_tree(leader: int, table: dict[int, tuple[int, int]]) -> set[int]:
    """The processes of one local Ray node: its `ray start` process group plus every descendant of it
    (the raylet starts its workers in process groups of their own)."""
    found = {pid for pid, (_, pgid) in table.items() if pgid == leader or pid == leader}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in table.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return found


def kill_node_tree(cluster, name: str) -> int:
    """Node loss as it happens to a machine: SIGKILL the node's whole process tree at once, its Ray
    workers included, found by this benchmark's own walk of /proc (`LocalCluster.kill_node` now does the
    same: its process group and every descendant). Returns how many processes were signalled."""
    pids = node_process_tree(cluster.pids[name], _proc_table())
    for pid in sorted(pids, reverse=True):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    return len(pids)


def drive_run(backend, cluster, plan: RunPlan, *, args, ckpt_root: Path, job_id: int, timeout_s: float,
              log=print) -> dict:
    """Launch one run, inject its fault, place it when asked, wait for the end; returns what happened."""
    from controlplane.compute.base import TrainingLaunch

    alive = {n.name for n in backend.list_nodes() if n.alive}
    pool_nodes = sorted(n for n in alive if n.startswith(plan.pool + "-"))
    nodes = pool_nodes[:2]
    if len(nodes) < 2:
        raise RuntimeError(f"{plan.name}: need 2 alive nodes in {plan.pool}, have {pool_nodes}")
    slug = re.sub(r"[^a-z0-9-]", "-", plan.name)
    handle = f"fy-train-bench-{job_id}-{slug}"
    ckpt = ckpt_root / slug
    shutil.rmtree(ckpt, ignore_errors=True)
    runtime = {"trainer": "builtin-transformer-lm",
               "hyperparameters": {"steps": args.steps, "step_sleep_s": args.step_sleep},
               "checkpoint_dir": str(ckpt), "checkpoint_interval_steps": args.checkpoint_interval,
               "checkpoint_keep_last": 3, "max_restarts": 3}
    launch = TrainingLaunch(handle=handle, job_id=job_id, nodes=tuple(nodes), accelerator_type=plan.accelerator_type,
                            devices_per_worker=8, cpus_per_worker=1, runtime=runtime)
    record: dict[str, Any] = {"name": plan.name, "fault": plan.fault, "kill": plan.kill, "nodes": nodes, "events": [],
                              "placements": [], "injected_at": None, "inject_step": None, "placement_mode": None}
    record["launched_at"] = time.time()
    backend.launch_training(launch)
    cursor, step, placed_for = 0, -1, 0
    gang = list(nodes)
    lost: list[str] = []
    deadline = time.monotonic() + timeout_s
    record["timeout_s"] = timeout_s
    report = None
    try:
        while True:
            report = backend.observe_training(handle, cursor)
            for event in report.events:
                record["events"].append(event)
                if event["type"] == "metric":
                    step = max(step, event["step"])
                elif event["type"] == "log" and event.get("line", "").startswith("worker failed"):
                    log(f"  [{plan.name}] +{event['at'] - record['launched_at']:.1f}s rank {event.get('rank')}: "
                        f"{event['line'].splitlines()[0][:300]}")
                elif event["type"] not in ("log", "checkpoint"):
                    brief = {k: v for k, v in event.items() if k in ("state", "kind", "evidence", "reason")}
                    log(f"  [{plan.name}] +{event['at'] - record['launched_at']:.1f}s {event['type']} {brief}")
            if report.events:
                cursor = report.events[-1]["seq"]
            if plan.fault and record["injected_at"] is None and step >= args.inject_step:
                record["inject_step"] = step
                if plan.fault == "node_loss":
                    victim = gang[FAULT_RANK]
                    record["injected_at"] = time.time()
                    killed = kill_node_tree(cluster, victim) if plan.kill == "tree" else cluster.kill_node(victim)
                    lost.append(victim)
                    log(f"  [{plan.name}] killed node {victim} ({plan.kill}"
                        f"{f', {killed} processes' if killed else ''}) after step {step}")
                else:
                    record["injected_at"] = time.time()
                    backend.inject_training_fault(handle, rank=FAULT_RANK, fault=plan.fault, factor=args.slow_factor)
                    log(f"  [{plan.name}] injected {plan.fault} on rank {FAULT_RANK} after step {step}")
            asks = [e for e in record["events"] if e["type"] == "placement_needed" and not e.get("advisory")]
            if report.state == "awaiting_placement" and len(asks) > placed_for:
                candidates = sorted(n.name for n in backend.list_nodes()
                                    if n.alive and n.accelerator_type == plan.accelerator_type
                                    and n.free.get("accel:" + plan.accelerator_type, 0) >= 8)
                new_nodes, mode = replacement_nodes(gang, lost, candidates)
                placed_at = time.time()
                backend.place_training(handle, new_nodes, f"benchmark control plane: {mode} after node loss")
                record["placements"].append({"at": placed_at, "nodes": new_nodes, "mode": mode})
                record["placement_mode"] = mode
                log(f"  [{plan.name}] placed on {new_nodes} ({mode})")
                gang = new_nodes
                placed_for = len(asks)
            if report.terminal:
                break
            if time.monotonic() > deadline:
                log(f"  [{plan.name}] timed out after {timeout_s:.0f} s; stopping it")
                record["timed_out"] = True
                backend.stop_training(handle, checkpoint=False, reason="benchmark timeout")
                report = backend.observe_training(handle, cursor)
                record["events"].extend(report.events)
                break
            time.sleep(args.poll_s)
    finally:
        backend.release_training(handle)
    terminal = _first(list(reversed(record["events"])), lambda e: e["type"] == "state")
    record["ended_at"] = terminal["at"] if terminal and report is not None and report.terminal else time.time()
    record.update(final_state=report.state if report else "unknown", final_reason=report.reason if report else "",
                  final_step=report.step if report else -1, restarts=report.restarts if report else 0,
                  final_nodes=gang)
    return record


def run_timeout_s(requested: float | None, records: Sequence[dict]) -> float:
    """The time a run gets: as asked; else (auto) 150 s for the baseline and then max(60 s, 3 x the baseline's
    wall time): a fault-free run, a recovery and a 3x-slowed tail fit, and a run that cannot recover does not
    hold the benchmark for minutes."""
    if requested:
        return requested
    base = [r["ended_at"] - r["launched_at"] for r in records if r["fault"] is None and r["final_state"] == "succeeded"]
    return max(AUTO_TIMEOUT_FLOOR_S, 3.0 * base[0]) if base else BASELINE_TIMEOUT_S


def run_benchmark(args, log=print) -> tuple[list[dict], dict]:
    from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
    from controlplane.compute.topology import load_topology

    os.chdir(REPO_ROOT)  # Ray workers import jobs.runtime from the driver's working directory
    topology = benchmark_topology(load_topology(), spares=args.spares)
    work = Path(tempfile.mkdtemp(prefix="fy-faults-"))
    state_dir = work / "cluster"
    info: dict[str, Any] = {"topology": [{"pool": p.name, "accelerator_type": p.accelerator_type, "nodes": p.nodes,
                                          "devices_per_node": p.devices_per_node, "cpus_per_node": p.cpus_per_node,
                                          "simulated": p.simulated} for p in topology.pools]}
    records = []
    started = time.time()
    info["load_average_at_start"] = list(os.getloadavg())
    cluster = None
    try:
        cluster = start_local_cluster(topology=topology, state_dir=state_dir, fate_share=True)
        info["cluster_start_s"] = time.time() - started
        log(f"cluster up in {info['cluster_start_s']:.1f} s: {', '.join(cluster.node_names)}")
        from controlplane.compute.ray_backend import RayComputeBackend

        backend = RayComputeBackend(address=cluster.address, env=cluster.client_env())
        for job_id, plan in enumerate(plan_runs(args.faults, args.repeat, args.kills), start=1):
            log(f"run {plan.name} on {plan.pool}")
            timeout_s = run_timeout_s(args.run_timeout, records)
            records.append(drive_run(backend, cluster, plan, args=args, ckpt_root=work / "checkpoints",
                                     job_id=job_id, timeout_s=timeout_s, log=log))
            last = records[-1]
            log(f"  [{plan.name}] {last['final_state']} at step {last['final_step']} "
                f"in {last['ended_at'] - last['launched_at']:.1f} s")
    finally:
        try:
            import ray

            ray.shutdown()
        finally:
            tracked = set()
            if cluster is not None:
                table = _proc_table()
                tracked = set().union(*(node_process_tree(pid, table) for pid in cluster.pids.values()))
            stop_local_cluster(state_dir=state_dir)
            shutil.rmtree(work, ignore_errors=True)
    info["load_average_at_end"] = list(os.getloadavg())
    info["total_s"] = time.time() - started
    if cluster is not None:
        time.sleep(1.0)
        table = _proc_table()
        left = {p for p in tracked if p in table and _state(p) not in ("Z", "X", "")} | cluster.processes()
        info["leftover_processes"] = sorted(left)
        log(f"cluster stopped; processes of it left: {len(info['leftover_processes'])}")
    return records, info


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/faults.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=COUNT, default=100, help="training steps per run (default 100)")
    parser.add_argument("--inject-step", type=OFFSET, default=50,
                        help="inject the fault once the run reports this step (default 50)")
    parser.add_argument("--checkpoint-interval", type=COUNT, default=20, help="checkpoint every N steps (default 20)")
    parser.add_argument("--step-sleep", type=non_negative_float, default=0.1,
                        help="per-step sleep of the built-in LM, seconds (default 0.1, ~6 steps/s)")
    parser.add_argument("--slow-factor", type=positive_float, default=3.0,
                        help="slow fault: step time factor (default 3)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from {', '.join(FAULTS)}")
    parser.add_argument("--repeat", type=COUNT, default=1, help="runs per fault type (default 1)")
    parser.add_argument("--spares", type=OFFSET, default=None,
                        help="spare a100 nodes for node-loss placement (default: one per node-loss run)")
    parser.add_argument("--save-s", type=non_negative_float, default=30.0,
                        help="ASSUMED checkpoint save time of a large model for the extrapolation (default 30 s)")
    parser.add_argument("--devices", type=COUNT, default=LLAMA3_FAILURES["devices"],
                        help="GPUs of the extrapolated job (default 16384)")
    parser.add_argument("--kill", choices=("both", "group", "tree"), default="both",
                        help="node loss runs: 'group' = LocalCluster.kill_node (SIGKILL of the node's process "
                             "group and every descendant, its Ray workers included), 'tree' = SIGKILL of every "
                             "process of the node found by this benchmark's own /proc walk; both kill the whole "
                             "node at once; 'both' (default): one run of each")
    parser.add_argument("--run-timeout", type=positive_float, default=None,
                        help="stop a run after this many seconds (default: 3 x the baseline's wall time, >= 60 s)")
    parser.add_argument("--poll-s", type=positive_float, default=0.1,
                        help="control-plane poll interval (default 0.1 s)")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "faults.json")
    parser.add_argument("--csv", type=Path, default=RESULTS_DIR / "faults.csv")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    for fault in args.faults:
        if fault not in FAULTS:
            parser.error(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    if not 0 <= args.inject_step < args.steps - 1:
        parser.error("--inject-step must be within the run")
    args.kills = ("group", "tree") if args.kill == "both" else (args.kill,)
    if args.spares is None:
        args.spares = args.repeat * len(args.kills) if "node_loss" in args.faults else 0

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    records, info = run_benchmark(args, log=log)
    measurements = [measure_run(r, steps=args.steps) for r in records]
    add_baseline_ratio(measurements)
    means = fault_means(measurements)
    targets = target_rows(means)
    saves = [m["checkpoint_save_s_median"] for m in measurements if m["checkpoint_save_s_median"] is not None]
    save_times = []
    if saves:
        save_times.append(("measured", statistics.median(saves)))
    save_times.append(("assumed", args.save_s))
    extrapolation = extrapolation_rows(means, devices=args.devices, save_times=save_times)
    host = HOST_NOTE.format(cores=os.cpu_count())
    params = {"steps": args.steps, "inject_step": args.inject_step,
              "checkpoint_interval_steps": args.checkpoint_interval, "step_sleep_s": args.step_sleep,
              "slow_factor": args.slow_factor, "faults": args.faults,
              "repeat": args.repeat, "spares": args.spares, "save_s": args.save_s, "devices": args.devices,
              "workers": 2, "fault_rank": FAULT_RANK, "devices_per_worker": 8, "cpus_per_worker": 1,
              "max_restarts": 3, "node_kill": list(args.kills), "poll_s": args.poll_s,
              "run_timeout_s": args.run_timeout or f"auto: max({AUTO_TIMEOUT_FLOOR_S:.0f}, 3 x baseline wall)",
              "host": host}
    report = format_report(measurements, means, targets, extrapolation, params, info)
    print(report)
    result = {
        "benchmark": "fault injection on a local Ray cluster (issue 4)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": host,
        "machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                    "system": f"{std_platform.system()} {std_platform.release()}"},
        "simulated_accelerators": True,
        "parameters": params,
        "cluster": info,
        "reference": {"llama3_failures": LLAMA3_FAILURES, "baige_ettr_target": BAIGE_ETTR_TARGET},
        "runs": measurements,
        "fault_means": means,
        "targets": targets,
        "extrapolation": extrapolation,
        "max_blocking_save_s_for_baige": {
            r["case"]: max_blocking_save_s(mtbf_s=r["mtbf_h"] * 3600.0, detection_s=r["detection_s"],
                                           restart_s=r["restart_s"])
            for r in extrapolation if r["save"] == save_times[-1][0]},
        "events": {r["name"]: [e for e in r["events"] if e["type"] not in ("metric", "log")
                               or e.get("line", "").startswith("worker failed")] for r in records},
        "report": report,
    }
    if not args.no_write:
        write_results(result, args.json, args.csv)
        print(f"\nwrote {args.json} and {args.csv}")
    bad = [m for m in measurements if not m["final_step_ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
