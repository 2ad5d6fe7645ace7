"""Node churn benchmark (issue 8, R1): Ray nodes removed and added every 5-10 s under running work.

On the local multi-node Ray cluster (`controlplane.compute.local_cluster`, the node_pools.yaml topology) it
keeps a few elastic training jobs (workers_min < workers_max, the built-in LM, data parallel) and one inference
deployment (Ray Serve, the cpu pool) running, and acts as the control plane the way beat does, in this process:
the node reconciler, the scheduling cycle, the training sync and the deployment sync on their beat periods
(Celery tasks run eagerly). Meanwhile it churns: every 5-10 s it SIGKILLs the whole process tree of a random
non-head node (`LocalCluster.kill_node`: raylet, agents and the Ray workers on it, what losing the machine does;
up to `--max-down` nodes are away at once, so the cadence holds although a node takes ~16 s to return)
and starts the node again 2-4 s later with the same name, labels and resources (`LocalCluster.restart_node`).
A job that finishes while the churn goes on is replaced by a new one, so work runs during the whole churn.

Then it stops churning (every node back), lets the jobs finish and checks:
- every job SUCCEEDED at its last step, none spent longer than `--stuck-bound` in a row in STARTING/RECOVERING;
- the deployment is SERVING with its replicas;
- every event recorded once, counted by unique keys: metric rows (job, attempt, worker, step, time),
  log lines (job, attempt, worker, line, time), fault rows (job, attempt, kind, node, worker, detection time),
  and one timeline event per fault; and every step 0..N-1 of a job has a metric row (no gaps);
- after the last job ended and the deployment was deleted: no placement group left, no supervisor or worker
  actor alive, no training run named, and `ray.available_resources()` equals `ray.cluster_resources()` for CPU
  and every `accel:*`, within 60 s (the time it took is reported).

    .venv/bin/python benchmarks/churn.py [--duration 180] [--jobs 2] [--steps 400] [--seed 8]
                                         [--stuck-bound 120] [--max-down 3] [--json PATH] [--no-write]

The short variant is tests/integration/test_node_churn.py (30 s, one job). Accelerators are SIMULATED
(logical Ray resources); the work runs on this host's CPUs. Exit status 1 when a check fails.
Run it under `flock /tmp/fleetyard-ray.lock` on a shared host.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import platform as std_platform
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, positive_float  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
FREED_WITHIN_S = 60.0
MODEL_SHAPE = {"context": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
# Beat periods of the control plane this benchmark plays (settings: FLEETYARD_*_SECONDS), in seconds.
PERIODS = {"nodes": 2.0, "training": 1.0, "scheduling": 3.0, "serving": 3.0}
WAITING_STATES = ("STARTING", "RECOVERING")
TRAINING_ACTOR_CLASSES = ("GangSupervisor", "TrainingWorker")


# ---------------------------------------------------------------------------------------------
# pure checks


def duplicate_count(rows: Iterable[Sequence[Any]]) -> int:
    """How many rows repeat a key already seen (0 when every key is unique)."""
    counts = Counter(tuple(row) for row in rows)
    return sum(n - 1 for n in counts.values())


def missing_steps(steps: Iterable[int], total: int) -> list[int]:
    """Steps of 0..total-1 with no row."""
    return sorted(set(range(total)) - set(steps))


def resource_shortfall(total: dict[str, float], available: dict[str, float]) -> dict[str, float]:
    """Schedulable resources (CPU, GPU, accel:*) some of which are still held: name -> amount held."""
    held = {}
    for key, amount in total.items():
        if key in ("CPU", "GPU") or key.startswith("accel:"):
            missing = float(amount) - float(available.get(key, 0.0))
            if missing > 1e-6:
                held[key] = round(missing, 4)
    return held


class LongestStretch:
    """The longest time each key spent in a row in one of `states`, from periodic observations."""

    def __init__(self, states: Sequence[str]) -> None:
        self.states = tuple(states)
        self.since: dict[Any, float] = {}
        self.longest: dict[Any, float] = {}

    def observe(self, key: Any, state: str, now: float) -> None:
        if state in self.states:
            start = self.since.setdefault(key, now)
            self.longest[key] = max(self.longest.get(key, 0.0), now - start)
        else:
            self.since.pop(key, None)
            self.longest.setdefault(key, 0.0)

    def worst(self) -> float:
        return max(self.longest.values(), default=0.0)


# ---------------------------------------------------------------------------------------------
# the churn


@dataclasses.dataclass
class ChurnRecord:
    node: str
    killed_at: float
    node_id: str = ""  # the Ray node id of the incarnation killed
    restarted_at: float | None = None
    back_at: float | None = None  # Ray reported the new incarnation alive


def _most_at_once(records: Sequence[ChurnRecord]) -> int:
    """The most nodes that were killed and not back yet at the same moment."""
    edges = sorted([(r.killed_at, 1) for r in records] + [(r.back_at, -1) for r in records if r.back_at is not None],
                   key=lambda edge: (edge[0], edge[1]))
    most = away = 0
    for _, change in edges:
        away += change
        most = max(most, away)
    return most


class Churner:
    """Kills a random node every `interval` seconds and restarts it `down` seconds later.

    Up to `max_down` nodes may be down or coming back at once, so kills keep their cadence although a node
    takes longer than the interval to return (about 16 s here); with `max_down=1` the next kill waits until
    the last node is back. Driven by `tick()` from the thread that owns the cluster (a restarted node shares
    the fate of the thread that started it); liveness comes from the caller (`alive`: node name -> Ray node id
    of its live incarnation): a node is back once Ray reports an incarnation other than the one killed."""

    def __init__(self, cluster, nodes: Sequence[str], *, rng: random.Random, interval=(5.0, 10.0),
                 down=(2.0, 4.0), max_down: int = 1, log: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.nodes = list(nodes)
        self.rng = rng
        self.interval = interval
        self.down = down
        self.max_down = max(1, min(max_down, len(self.nodes)))
        self.log = log
        self.records: list[ChurnRecord] = []
        self.next_kill = time.monotonic() + rng.uniform(*interval)
        self._restart_due: dict[int, float] = {}  # index in records -> when to restart that node
        self.errors: list[str] = []
        self.postponed = 0  # kills due while max_down nodes were already away

    @property
    def away(self) -> list[ChurnRecord]:
        """Nodes killed and not back yet."""
        return [r for r in self.records if r.back_at is None]

    @property
    def current(self) -> ChurnRecord | None:
        away = self.away
        return away[0] if away else None

    def tick(self, alive: dict[str, str], *, churning: bool) -> None:
        now = time.monotonic()
        for index, record in enumerate(self.records):
            if record.back_at is not None:
                continue
            if record.restarted_at is None and now >= self._restart_due.get(index, 0):
                self._restart(record)
            elif record.restarted_at is not None and alive.get(record.node) not in (None, record.node_id):
                record.back_at = now
                self.log(f"  {record.node} back after {now - record.killed_at:.1f} s")
            elif record.restarted_at is not None and now - record.restarted_at > 90:
                self.errors.append(f"{record.node} did not come back within 90 s of its restart")
                record.back_at = now
        if not churning or now < self.next_kill:
            return
        away = {r.node for r in self.away}
        candidates = [node for node in self.nodes if node not in away]
        if len(away) >= self.max_down or not candidates:
            self.postponed += 1
            self.next_kill = now + 0.5  # try again soon: the cadence slips only while max_down are away
            return
        node = self.rng.choice(candidates)
        self.cluster.kill_node(node)
        self.records.append(ChurnRecord(node=node, killed_at=now, node_id=alive.get(node, "")))
        self._restart_due[len(self.records) - 1] = now + self.rng.uniform(*self.down)
        self.next_kill = now + self.rng.uniform(*self.interval)
        self.log(f"  killed {node} (kill {len(self.records)}, {len(away) + 1} away)")

    def _restart(self, record: ChurnRecord) -> None:
        try:
            self.cluster.restart_node(record.node, wait=False)
        except Exception as exc:  # recorded; the caller's checks fail on it
            self.errors.append(f"restarting {record.node}: {type(exc).__name__}: {exc}")
            record.back_at = time.monotonic()
            return
        record.restarted_at = time.monotonic()

    def summary(self) -> dict:
        back = [r.back_at - r.killed_at for r in self.records if r.back_at is not None]
        kills = [r.killed_at for r in self.records]
        gaps = [b - a for a, b in zip(kills, kills[1:], strict=False)]
        return {"kills": len(self.records), "by_node": dict(Counter(r.node for r in self.records)),
                "max_down": self.max_down, "kill_gap_s_mean": round(sum(gaps) / len(gaps), 2) if gaps else None,
                "kill_gap_s_max": round(max(gaps), 2) if gaps else None,
                "most_away_at_once": _most_at_once(self.records),
                "node_back_s_max": round(max(back), 2) if back else None,
                "node_back_s_mean": round(sum(back) / len(back), 2) if back else None, "errors": list(self.errors)}


# ---------------------------------------------------------------------------------------------
# the control plane, played in this process


@contextlib.contextmanager
def control_plane_on(backend):
    """The lifecycle tasks of jobs, inference and cluster use `backend` (what get_compute_backend() gives a
    worker) until the block ends."""
    from controlplane.cluster import tasks as cluster_tasks
    from inference import tasks as inference_tasks
    from jobs import tasks as job_tasks

    modules = (cluster_tasks, inference_tasks, job_tasks)
    saved = [module.get_compute_backend for module in modules]
    for module in modules:
        module.get_compute_backend = lambda: backend
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            module.get_compute_backend = original


class ControlPlane:
    """Runs each beat task when its period is due (the Celery tasks, eager)."""

    def __init__(self, periods: dict[str, float] = PERIODS) -> None:
        self.periods = periods
        self.last = dict.fromkeys(periods, 0.0)
        self.failures: Counter = Counter()

    def tick(self) -> None:
        from controlplane.cluster.tasks import sync_nodes
        from inference.tasks import sync_deployments
        from jobs.tasks import run_scheduling_cycle, sync_training_jobs

        tasks = {"nodes": sync_nodes, "scheduling": run_scheduling_cycle, "training": sync_training_jobs,
                 "serving": sync_deployments}
        for name, task in tasks.items():
            now = time.monotonic()
            if now - self.last[name] < self.periods[name]:
                continue
            self.last[name] = now
            try:
                task()
            except Exception as exc:  # a beat task that fails runs again at its next period
                self.failures[f"{name}: {type(exc).__name__}"] += 1


# ---------------------------------------------------------------------------------------------
# the scenario (Django and Ray)


@dataclasses.dataclass(frozen=True)
class ChurnPlan:
    duration_s: float = 180.0
    churned_nodes: tuple[str, ...] = ()
    jobs: tuple[dict, ...] = ()  # job bodies kept running during the churn (each replaced when it ends)
    deployment: bool = True
    interval_s: tuple[float, float] = (5.0, 10.0)
    down_s: tuple[float, float] = (2.0, 4.0)
    max_down: int = 1  # nodes away at once; more keeps the kill cadence although a node takes ~16 s to return
    settle_timeout_s: float = 240.0
    stuck_bound_s: float = 120.0
    seed: int = 8


def elastic_job(name: str, accelerator_type: str, *, steps: int, step_sleep_s: float = 0.02) -> dict:
    return {"name": name, "accelerator_types": [accelerator_type], "workers_min": 1, "workers_max": 2,
            "devices_per_worker": 8, "checkpoint_interval_steps": 10, "checkpoint_keep_last": 2,
            "max_restarts": 1000, "hyperparameters": {"steps": steps, "step_sleep_s": step_sleep_s}}


def write_model_dir(directory: Path) -> Path:
    """A tiny built-in LM (random weights) to serve, in the layout a checkpoint has."""
    from jobs.runtime.lm import write_random_model_dir

    return write_random_model_dir(directory, MODEL_SHAPE, seed=5)


def event_counts(job_ids: Sequence[int]) -> dict:
    """Rows and duplicates per kind of event, by unique keys, and steps with no metric row."""
    from jobs.models import TrainingFault, TrainingJob, TrainingJobEvent, TrainingLogLine, TrainingMetric

    metrics = list(TrainingMetric.objects.filter(job_id__in=job_ids)
                   .values_list("job_id", "attempt", "worker", "step", "recorded_at"))
    lines = list(TrainingLogLine.objects.filter(job_id__in=job_ids)
                 .values_list("job_id", "attempt", "worker", "line", "recorded_at"))
    faults = list(TrainingFault.objects.filter(job_id__in=job_ids)
                  .values_list("job_id", "attempt", "kind", "node", "worker", "detected_at"))
    fault_events = [(e.subject_id, e.data["fault"]) for e in TrainingJobEvent.objects.filter(subject_id__in=job_ids)
                    if isinstance(e.data, dict) and "fault" in e.data]
    gaps = {}
    for job in TrainingJob.objects.filter(pk__in=job_ids):
        total = int((job.hyperparameters or {}).get("steps", 0))
        missing = missing_steps((m[3] for m in metrics if m[0] == job.pk), total)
        if missing:
            gaps[job.pk] = missing[:20]
    return {
        "metric_rows": len(metrics), "metric_duplicates": duplicate_count(metrics),
        "log_rows": len(lines), "log_duplicates": duplicate_count(lines),
        "fault_rows": len(faults), "fault_duplicates": duplicate_count(faults),
        "fault_timeline_events": len(fault_events), "fault_timeline_duplicates": duplicate_count(fault_events),
        "fault_rows_without_timeline_event": len(faults) - len(set(fault_events)),
        "jobs_with_step_gaps": gaps,
    }


def cluster_leftovers(backend) -> dict:
    """What Ray still holds: live placement groups, live training actors, named runs, resources in use."""
    ray = backend._ray()
    from ray._private import state as ray_state

    groups = [pg for pg in ray.util.placement_group_table().values() if pg.get("state") != "REMOVED"]
    actors = [a for a in ray_state.actors().values()
              if a.get("State") == "ALIVE" and a.get("ActorClassName") in TRAINING_ACTOR_CLASSES]
    return {"placement_groups": len(groups), "training_actors": len(actors),
            "training_runs": backend.list_training_handles(),
            "resources_held": resource_shortfall(ray.cluster_resources(), ray.available_resources())}


def is_clean(leftovers: dict) -> bool:
    return not (leftovers["placement_groups"] or leftovers["training_actors"] or leftovers["training_runs"]
                or leftovers["resources_held"])


def wait_until_freed(backend, *, timeout_s: float = FREED_WITHIN_S) -> tuple[float | None, dict]:
    """Seconds until Ray holds nothing (None if not within the timeout) and what it held last."""
    started = time.monotonic()
    while True:
        leftovers = cluster_leftovers(backend)
        if is_clean(leftovers):
            return round(time.monotonic() - started, 2), leftovers
        if time.monotonic() - started > timeout_s:
            return None, leftovers
        time.sleep(0.5)


def alive_nodes(backend) -> dict[str, str]:
    """Node name -> Ray node id of its live incarnation."""
    return {node.name: node.node_id for node in backend.list_nodes() if node.alive}


def run_churn(*, cluster, backend, actor, team, local_queue, plan: ChurnPlan, model_root: Path,
              log: Callable[[str], None] = print) -> dict:
    """Submit the work, churn for `plan.duration_s`, settle, and measure. Returns the result (see checks())."""
    from django.db import close_old_connections

    from inference.models import Deployment
    from inference.services import deployment_create, deployment_delete
    from jobs.models import TrainingJob
    from jobs.services import training_job_create

    rng = random.Random(plan.seed)
    churner = Churner(cluster, plan.churned_nodes, rng=rng, interval=plan.interval_s, down=plan.down_s,
                      max_down=plan.max_down, log=log)
    control = ControlPlane()
    stuck = LongestStretch(WAITING_STATES)
    deployment_stretch = LongestStretch(("PENDING", "DEPLOYING", "DEGRADED", "UPDATING"))
    result: dict[str, Any] = {"plan": dataclasses.asdict(plan)}
    submitted: dict[str, int] = {}  # job body name -> submissions so far

    def submit(body: dict) -> int:
        count = submitted[body["name"]] = submitted.get(body["name"], 0) + 1
        values = {k: v for k, v in body.items() if k != "name"}
        job = training_job_create(actor=actor, team=team, name=f"{body['name']}-{count}", local_queue=local_queue,
                                  **values)
        log(f"  submitted job {job.pk} ({job.name}: {body['accelerator_types'][0]}, workers 1-2, "
            f"{body['hyperparameters']['steps']} steps)")
        return job.pk

    with control_plane_on(backend):
        current = {body["name"]: submit(body) for body in plan.jobs}
        job_ids = list(current.values())
        deployment_id = None
        if plan.deployment:
            model_dir = write_model_dir(model_root / "churn-lm")
            deployment_id = deployment_create(
                actor=actor, team=team, name="churn-chat", local_queue=local_queue, accelerator_types=["cpu"],
                model_uri=f"file://{model_dir}", replicas_min=1, replicas_max=1, sla_ttft_p95_ms=60000,
                sla_tpot_p95_ms=60000, engine={"slots": 2, "block_size": 8}).pk
        # Churn only once the work runs: a kill before the first start measures nothing the issue asks about.
        deadline = time.monotonic() + 180
        while True:
            control.tick()
            states = dict(TrainingJob.objects.filter(pk__in=job_ids).values_list("pk", "state"))
            serving = deployment_id is None or Deployment.objects.get(pk=deployment_id).state == "SERVING"
            if all(s in ("RUNNING", "SUCCEEDED") for s in states.values()) and serving:
                break  # a job that already finished is replaced by the churn loop
            if time.monotonic() > deadline:
                raise RuntimeError(f"the work did not start within 180 s: jobs {states}, deployment serving: "
                                   f"{serving}")
            time.sleep(0.5)
        result["started_after_s"] = round(180 - (deadline - time.monotonic()), 1)
        log(f"work running after {result['started_after_s']} s; churning for {plan.duration_s:.0f} s")

        def observe() -> dict[int, str]:
            now = time.monotonic()
            states = dict(TrainingJob.objects.filter(pk__in=job_ids).values_list("pk", "state"))
            for pk, state in states.items():
                stuck.observe(pk, state, now)
            if deployment_id is not None:
                deployment_stretch.observe(deployment_id, Deployment.objects.get(pk=deployment_id).state, now)
            return states

        churn_started = time.monotonic()
        churn_end = churn_started + plan.duration_s
        while time.monotonic() < churn_end or churner.away:
            control.tick()
            churner.tick(alive_nodes(backend), churning=time.monotonic() < churn_end)
            states = observe()
            for body in plan.jobs:  # keep the work going: a finished job is replaced
                if time.monotonic() < churn_end and states.get(current[body["name"]]) in ("SUCCEEDED", "FAILED"):
                    current[body["name"]] = submit(body)
                    job_ids.append(current[body["name"]])
            time.sleep(0.3)
            close_old_connections()
        result["churn_s"] = round(time.monotonic() - churn_started, 1)
        log(f"churn over after {result['churn_s']} s ({len(churner.records)} kills); letting the work finish")

        settle_deadline = time.monotonic() + plan.settle_timeout_s
        settled_at = None
        while time.monotonic() < settle_deadline:
            control.tick()
            states = observe()
            deployment = Deployment.objects.get(pk=deployment_id) if deployment_id is not None else None
            if all(s in ("SUCCEEDED", "FAILED", "CANCELLED") for s in states.values()) and (
                    deployment is None or (deployment.state == "SERVING"
                                           and deployment.replicas_ready >= deployment.replicas_min)):
                settled_at = time.monotonic()
                break
            time.sleep(0.5)
        result["settled_after_churn_s"] = round(settled_at - churn_started - result["churn_s"], 1) \
            if settled_at else None
        result["jobs"] = [
            {"id": job.pk, "name": job.name, "state": job.state, "current_step": job.current_step,
             "steps": int(job.hyperparameters.get("steps", 0)), "restarts": job.restarts, "attempt": job.attempt,
             "faults": job.faults.count(), "longest_waiting_s": round(stuck.longest.get(job.pk, 0.0), 1),
             "fault_kinds": dict(Counter(job.faults.values_list("kind", flat=True))),
             "fault_evidence": [f"{f.kind} on {f.node} (worker {f.worker}): {f.evidence[:200]}"
                                for f in job.faults.order_by("id")][:12],
             "timeline_tail": [f"{e.from_state}->{e.to_state}: {e.reason[:200]}"
                               for e in job.events.order_by("-id")[:12]][::-1],
             "reason": job.state_reason[:300]}
            for job in TrainingJob.objects.filter(pk__in=job_ids).order_by("pk")]
        if deployment_id is not None:
            deployment = Deployment.objects.get(pk=deployment_id)
            result["deployment"] = {"id": deployment.pk, "state": deployment.state,
                                    "replicas_ready": deployment.replicas_ready,
                                    "replicas_min": deployment.replicas_min,
                                    "longest_unhealthy_s": round(deployment_stretch.worst(), 1),
                                    "events": deployment.events.count(), "reason": deployment.state_reason[:300]}
            deployment_delete(actor=actor, deployment=deployment)
            control.last["serving"] = 0.0
        result["events"] = event_counts(job_ids)
        # Everything ended: the reconcilers release what is left; Ray must hold nothing within 60 s.
        freed_started = time.monotonic()
        leftovers: dict = {}
        freed_s = None
        while time.monotonic() - freed_started <= FREED_WITHIN_S:
            control.tick()
            leftovers = cluster_leftovers(backend)
            if deployment_id is not None and backend.list_service_handles():
                leftovers["services"] = backend.list_service_handles()
            if is_clean(leftovers) and not leftovers.get("services"):
                freed_s = round(time.monotonic() - freed_started, 2)
                break
            time.sleep(0.5)
        result["freed_s"] = freed_s
        result["leftovers"] = leftovers
    result["churn"] = churner.summary()
    result["control_plane_task_failures"] = dict(control.failures)
    result["longest_waiting_s"] = round(stuck.worst(), 1)
    result["checks"] = checks(result, plan)
    return result


def checks(result: dict, plan: ChurnPlan) -> dict[str, bool]:
    """The issue's promises, each True or False."""
    jobs = result.get("jobs", [])
    events = result.get("events", {})
    deployment = result.get("deployment")
    return {
        "churned": result.get("churn", {}).get("kills", 0) > 0 and not result.get("churn", {}).get("errors"),
        "every job succeeded at its last step": bool(jobs) and all(
            j["state"] == "SUCCEEDED" and j["current_step"] == j["steps"] - 1 for j in jobs),
        f"no job waiting > {plan.stuck_bound_s:g} s in STARTING/RECOVERING":
            result.get("longest_waiting_s", 1e9) <= plan.stuck_bound_s,
        "deployment SERVING": deployment is None or (deployment["state"] == "SERVING"
                                                     and deployment["replicas_ready"] >= deployment["replicas_min"]),
        f"everything freed within {FREED_WITHIN_S:g} s": result.get("freed_s") is not None,
        "every event recorded once": bool(events) and events["metric_duplicates"] == 0
        and events["log_duplicates"] == 0 and events["fault_duplicates"] == 0
        and events["fault_timeline_duplicates"] == 0 and events["fault_rows_without_timeline_event"] == 0,
        "no step without a metric": bool(events) and not events["jobs_with_step_gaps"],
    }


# ---------------------------------------------------------------------------------------------
# report


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_report(result: dict) -> str:
    details = [f"job {j['id']} faults: {j['fault_kinds']}\n    " + "\n    ".join(j["fault_evidence"])
               for j in result.get("jobs", []) if j["state"] != "SUCCEEDED" or j["faults"] > 2 * j["restarts"]]
    parts = ["Jobs", format_table(
        ("id", "name", "state", "step", "restarts", "faults", "longest STARTING/RECOVERING s"),
        [(j["id"], j["name"], j["state"], f"{j['current_step'] + 1}/{j['steps']}", j["restarts"], j["faults"],
          j["longest_waiting_s"]) for j in result.get("jobs", [])]), *details]
    if result.get("deployment"):
        d = result["deployment"]
        parts += ["", f"Deployment: {d['state']}, {d['replicas_ready']}/{d['replicas_min']} replica(s) ready, "
                      f"longest unhealthy stretch {d['longest_unhealthy_s']} s, {d['events']} timeline events"]
    churn = result.get("churn", {})
    ev = result.get("events", {})
    parts += ["", f"Churn: {churn.get('kills')} kills in {result.get('churn_s')} s "
                  f"({', '.join(f'{k} x{v}' for k, v in sorted(churn.get('by_node', {}).items()))}); a node back "
                  f"(alive in Ray) {churn.get('node_back_s_mean')} s after its kill on average, "
                  f"{churn.get('node_back_s_max')} s at most; a kill every {churn.get('kill_gap_s_mean')} s on "
                  f"average ({churn.get('kill_gap_s_max')} s at most), up to {churn.get('most_away_at_once')} "
                  f"node(s) away at once",
              f"Events: {ev.get('metric_rows')} metric rows ({ev.get('metric_duplicates')} duplicates), "
              f"{ev.get('log_rows')} log lines ({ev.get('log_duplicates')} duplicates), {ev.get('fault_rows')} faults "
              f"({ev.get('fault_duplicates')} duplicates, {ev.get('fault_timeline_events')} timeline events), "
              f"step gaps: {ev.get('jobs_with_step_gaps') or 'none'}",
              f"Freed: {result.get('freed_s')} s after the end (limit {FREED_WITHIN_S:g} s); last seen "
              f"{result.get('leftovers')}",
              f"Settled {result.get('settled_after_churn_s')} s after the churn; control-plane task failures: "
              f"{result.get('control_plane_task_failures') or 'none'}", "",
              format_table(("check", "ok"), [(name, "yes" if ok else "NO") for name, ok in result["checks"].items()])]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# the command: its own database, data folder and Ray cluster


def setup_django(work: Path) -> None:
    os.environ["FLEETYARD_DATA_DIR"] = str(work / "data")
    os.environ["FLEETYARD_MODEL_DIRS"] = str(work / "models")
    os.environ.pop("FLEETYARD_DATABASE_URL", None)  # the embedded SQLite in the data folder
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from controlplane import celery_app

    celery_app.conf.task_always_eager = True  # the tasks run here, as in the integration tests
    call_command("migrate", interactive=False, verbosity=0)


def build_world(topology):
    """An operator, a cluster queue with quota for every pool, a team and its local queue; the node pools."""
    from django.contrib.auth import get_user_model

    from controlplane.cluster.services import accelerator_types_seed, node_pool_create
    from controlplane.quotas.services import cluster_queue_create, local_queue_create
    from controlplane.tenancy.services import team_create

    accel = {a.slug: a for a in accelerator_types_seed()}
    users = get_user_model().objects
    ops = users.create_user("ops", password=os.urandom(12).hex(), is_staff=True)
    totals: dict[str, float] = {}
    for pool in topology.pools:
        node_pool_create(actor=ops, name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node or int(pool.cpus_per_node), simulated=pool.simulated)
        amount = pool.nodes * (pool.devices_per_node if pool.accelerator_type != "cpu" else pool.cpus_per_node)
        totals[pool.accelerator_type] = totals.get(pool.accelerator_type, 0) + amount
    queue = cluster_queue_create(actor=ops, name="churn", cohort="all", quotas=[
        {"accelerator_type": slug, "nominal_quota": total} for slug, total in totals.items()])
    member = users.create_user("churner", password=os.urandom(12).hex())
    team = team_create(actor=ops, name="churn", admin=member)
    local = local_queue_create(actor=member, team=team, name="default", cluster_queue=queue)
    return member, team, local


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=positive_float, default=180.0, help="seconds of churn (default 180)")
    parser.add_argument("--jobs", type=COUNT, default=2, help="elastic jobs kept running: h100, a100, ... (max 3)")
    parser.add_argument("--steps", type=COUNT, default=400, help="steps per job")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--max-down", type=COUNT, default=3,
                        help="nodes away at once (default 3: kills every 5-10 s while each takes ~16 s to return)")
    parser.add_argument("--stuck-bound", type=positive_float, default=120.0)
    parser.add_argument("--no-deployment", action="store_true")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "churn.json")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    work = Path(tempfile.mkdtemp(prefix="fy-churn-"))
    setup_django(work)
    from controlplane.cluster.services import nodes_sync
    from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
    from controlplane.compute.topology import load_topology

    topology = load_topology()
    actor, team, local_queue = build_world(topology)
    types = ["nvidia-h100", "nvidia-a100", "kunlun-p800"][:max(1, min(3, args.jobs))]
    bodies = tuple(elastic_job(f"elastic-{t.split('-')[-1]}", t, steps=args.steps) for t in types)
    churned = tuple(spec.name for spec in topology.node_specs())
    plan = ChurnPlan(duration_s=args.duration, churned_nodes=churned, jobs=bodies,
                     deployment=not args.no_deployment, stuck_bound_s=args.stuck_bound, seed=args.seed,
                     max_down=args.max_down)
    state_dir = work / "cluster"
    started = time.time()
    cluster = start_local_cluster(topology=topology, state_dir=state_dir, fate_share=True)
    log(f"cluster up in {time.time() - started:.1f} s: head + {', '.join(cluster.node_names)}")
    try:
        from controlplane.compute.ray_backend import RayComputeBackend

        backend = RayComputeBackend(address=cluster.address, env=cluster.client_env())
        nodes_sync(observed=backend.list_nodes())
        result = run_churn(cluster=cluster, backend=backend, actor=actor, team=team, local_queue=local_queue,
                           plan=plan, model_root=work / "models", log=log)
    finally:
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        stop_local_cluster(state_dir=state_dir)
        shutil.rmtree(work, ignore_errors=True)  # its database, data folder and logs
    result.update({
        "benchmark": "node churn under running training jobs and a deployment (issue 8, R1)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": f"{os.cpu_count()} CPU cores, {std_platform.machine()}, simulated accelerators, local Ray cluster",
        "command": "benchmarks/churn.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    })
    log("")
    log(format_report(result))
    if not args.no_write:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
        log(f"\nwrote {args.json}")
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
