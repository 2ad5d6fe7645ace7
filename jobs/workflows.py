"""The run workflow of a training job: launch, sync (apply what the run reports), re-place, stop.

Services called by the Celery tasks in jobs/tasks.py (and by tests directly). The job row is the
desired state (its `placement`, chosen by the scheduler) and the record of the observed state (the
run's state, step, nodes, metrics, logs, faults); the run itself lives in the compute backend
(a supervisor actor on Ray). Every function is idempotent and safe to run twice or after a crash:

- `training_job_launch`: ADMITTED -> STARTING, then start the run (named by job and attempt).
- `training_job_sync`: read the run's events after the job's cursor and apply them exactly once
  (metrics, logs, checkpoints, faults with evidence, recoveries into the ETTR ledger, state changes),
  then move the run toward the desired placement (re-place lost workers, shrink, grow), release a
  finished run, and relaunch a run that disappeared.
- `training_job_stop_run`: stop the run (with a checkpoint when preempting), then release it.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.cluster.models import Node
from controlplane.common.errors import ConflictError
from controlplane.common.lifecycle import record_event, transition
from controlplane.common.tasks import dispatch_on_commit
from controlplane.compute.base import TrainingLaunch, TrainingReport
from controlplane.compute.ray_backend import TRAINING_PREFIX
from controlplane.datasets.fetching import DatasetUnavailable, dataset_local_file
from controlplane.tenancy.services import audit_record
from jobs.models import FaultKind, TrainingFault, TrainingJob, TrainingJobEvent, TrainingLogLine, TrainingMetric
from jobs.runtime.goodput import RESIZE, GoodputLedger
from jobs.selectors import PAUSE_KEYS, RECOVERY_KEY, cores_on, goodput_ledger, record_open_recovery
from jobs.states import JobState

log = logging.getLogger(__name__)

# Job states whose run the sync follows.
SYNCED_STATES = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING, JobState.PREEMPTED)
# A node with this many faults (crash, hang, bad loss, slow) within the window is cordoned.
CORDON_AFTER_FAULTS = 2
CORDON_WINDOW = timedelta(minutes=30)
_RUN_TO_JOB_STATE = {
    "running": JobState.RUNNING,
    "recovering": JobState.RECOVERING,
    "awaiting_placement": JobState.RECOVERING,
    "succeeded": JobState.SUCCEEDED,
    "failed": JobState.FAILED,
}


LAUNCH_TRIES = 5  # failed starts of one attempt before the job fails and frees its quota
# A preempted run still going this long after its preemption is asked again to stop (its stop task retries for about
# half a minute).
STOP_GRACE = timedelta(seconds=60)


def run_handle(job: TrainingJob) -> str:
    return f"{TRAINING_PREFIX}{job.pk}-a{job.attempt}"


def checkpoint_dir(job: TrainingJob) -> Path:
    """One directory per job (not per attempt): a preempted or recovered job resumes from it."""
    return Path(settings.DATA_DIR) / "checkpoints" / f"job-{job.pk}"


def placement_nodes(job: TrainingJob) -> list[str]:
    """The desired nodes, one per worker, in the order of the scheduler's placement."""
    return [entry["node"] for entry in job.placement or []]


def build_launch(job: TrainingJob) -> TrainingLaunch:
    dataset_path = dataset_local_path(job)
    runtime = {
        "trainer": job.trainer, "hyperparameters": dict(job.hyperparameters or {}), "entrypoint": job.entrypoint,
        "working_dir": job.working_dir, "envs": {**(job.envs or {}), **(job.secret_envs or {})},
        "dataset_path": dataset_path,
        "attempt": job.attempt,  # recorded with the metrics a checkpoint carries (see worker.STEP_RECORD_FILE)
        "checkpoint_dir": str(checkpoint_dir(job)), "checkpoint_interval_steps": job.checkpoint_interval_steps,
        "checkpoint_keep_last": job.checkpoint_keep_last, "max_restarts": job.max_restarts,
        "detection": dict(settings.FLEETYARD_FAULT_DETECTION),
        "placement_timeout_s": 30.0,
        "devices_per_worker": job.devices_per_worker,  # the built-in trainer maps a plan's layout onto workers
    }
    accelerator_type = job.admitted_accelerator_type or job.accelerator_types[0]
    plan = (job.parallel_plan or {}).get("by_type", {}).get(accelerator_type)
    if plan:
        runtime["parallel_plan"] = plan
    return TrainingLaunch(handle=job.compute_handle, job_id=job.pk, nodes=tuple(placement_nodes(job)),
                          accelerator_type=accelerator_type,
                          devices_per_worker=0.0 if accelerator_type == "cpu" else float(job.devices_per_worker),
                          cpus_per_worker=cores_on(accelerator_type=accelerator_type,
                                                   devices_per_worker=job.devices_per_worker,
                                                   cpus_per_worker=job.cpus_per_worker), runtime=runtime)


# ------------------------------------------------------------------------------------------ launch

def training_job_launch(*, job_id: int, backend) -> TrainingJob | None:
    """ADMITTED -> STARTING and start the run. A job in any other state is left alone."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != JobState.ADMITTED or not job.placement:
            return job
        if job.waits_for:  # admitted onto devices preempted runs still hold: free once they have stopped
            from jobs.admission import held_reason, victims_still_stopping

            stopping = victims_still_stopping(job.waits_for)
            if stopping:
                # (before, "admitted; launches once job 12 checkpoints and stops" for a victim that shrinks and runs on;
                # the sweep of ADMITTED jobs retries the launch every pass, so the cycle's reason was overwritten; QA)
                reason = held_reason(job, stopping)
                if job.state_reason != reason:
                    TrainingJob.objects.filter(pk=job.pk).update(state_reason=reason)
                return job
            job.waits_for = []
        job.attempt += 1
        job.compute_handle = run_handle(job)
        job.events_cursor = 0
        job.runtime_state = "starting"
        job.observed_nodes = []
        job.recovery_exclude = []
        job.save(update_fields=["attempt", "compute_handle", "events_cursor", "runtime_state", "observed_nodes",
                                "recovery_exclude", "waits_for"])
        nodes = placement_nodes(job)
        job = transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.STARTING,
                         reason=f"launching {len(nodes)} worker(s) on {', '.join(nodes)} (attempt {job.attempt})",
                         system="launcher", data={"handle": job.compute_handle, "nodes": nodes})
    job = TrainingJob.objects.select_related("dataset_version").get(pk=job.pk)
    return _start_run(job, backend)  # idempotent by name; a failure is retried by the sync


def _start_run(job: TrainingJob, backend) -> TrainingJob:
    """Ask the backend to start (or restart) the job's run. A failure is recorded on the job's timeline and
    raised (the sync tries again); after LAUNCH_TRIES failures of one attempt, or a dataset that cannot be
    read, the job fails with the reason and gives its quota back instead of holding it forever."""
    try:
        launch = build_launch(job)
    except DatasetUnavailable as exc:
        return _fail_launch(job, f"{exc}")
    try:
        backend.launch_training(launch)
    except Exception as exc:
        reason = f"launching the run failed: {type(exc).__name__}: {exc}"
        record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state, reason=reason,
                     system="launcher", data={"attempt": job.attempt, "launch_failed": True})
        tries = job.events.filter(data__launch_failed=True, data__attempt=job.attempt).count()
        if tries >= LAUNCH_TRIES:
            return _fail_launch(job, f"{reason} ({tries} tries); the job's quota is released")
        raise
    return job


def _fail_launch(job: TrainingJob, reason: str) -> TrainingJob:
    """FAILED with the reason when its run cannot be started; the job no longer holds quota."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if job.state not in (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING):
            return job
        job = transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.FAILED,
                         reason=reason, system="launcher")
    _kick_scheduler()  # the quota it held is free for the next workload
    return job


# ------------------------------------------------------------------------------------------ sync

def training_job_sync(*, job_id: int, backend) -> TrainingJob | None:
    job = TrainingJob.objects.select_related("dataset_version").filter(pk=job_id).first()
    if job is None or not job.compute_handle or job.state not in SYNCED_STATES:
        return job
    report = backend.observe_training(job.compute_handle, since=job.events_cursor)
    if report.state == "unknown":
        return _run_missing(job, report, backend)
    job = _apply_report(job.pk, report)
    if report.terminal:
        backend.release_training(job.compute_handle)
        if job.state == JobState.PREEMPTED:
            return _requeue_after_preemption(job)  # kicks the scheduler itself
        _kick_scheduler()  # the run's devices are free
        return job
    if job.state == JobState.PREEMPTED:
        return _stop_preempted_again(job, report, backend)
    if _over_max_duration(job):
        return _stop_over_max_duration(job, backend)
    if job.state in (JobState.RUNNING, JobState.RECOVERING):
        _reconcile_placement(job, report, backend)
    return job


def _over_max_duration(job: TrainingJob) -> bool:
    if not job.max_duration_seconds or job.started_at is None or job.state not in (JobState.RUNNING,
                                                                                     JobState.RECOVERING):
        return False
    return (timezone.now() - job.started_at).total_seconds() > job.max_duration_seconds


def _stop_preempted_again(job: TrainingJob, report: TrainingReport, backend) -> TrainingJob:
    """A preempted run still going STOP_GRACE after its preemption: its stop was lost (the message, or its retries
    spent while the backend could not be reached) and nothing asked again, so it kept its devices and the job
    admitted onto them waited for good (QA). Ask again (a stop is idempotent); said once on the timeline."""
    if timezone.now() - job.state_changed_at < STOP_GRACE:
        return job
    reason = (f"run {job.compute_handle} still {report.state} {int(STOP_GRACE.total_seconds())} s after its "
              f"preemption; asking it again to checkpoint and stop")
    _note_once(job, reason, system="reconciler")
    backend.stop_training(job.compute_handle, checkpoint=True, reason="preempted")
    return job


def _note_once(job: TrainingJob, reason: str, *, system: str, data: dict | None = None) -> None:
    """A timeline event without a state change, unless the job's latest event already says it: what a sync repeats
    every pass while nothing changes is said once."""
    if job.events.order_by("-id").values_list("reason", flat=True).first() != reason:
        record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state, reason=reason,
                     system=system, data=data)


def _stop_over_max_duration(job: TrainingJob, backend) -> TrainingJob:
    """FAILED with the reason; the run checkpoints and stops, and the orphan pass releases it."""
    with transaction.atomic():
        job = transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=JobState.FAILED,
                         reason=f"exceeded max_duration_seconds ({job.max_duration_seconds} s) at step "
                                f"{job.current_step}; stopped after a final checkpoint", system="launcher")
    backend.stop_training(job.compute_handle, checkpoint=True, reason="max duration exceeded")
    _kick_scheduler()
    return job


def _apply_report(job_id: int, report: TrainingReport) -> TrainingJob:
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(pk=job_id)
        events = sorted((_without_nul(e) for e in report.events if e["seq"] > job.events_cursor),
                        key=lambda e: e["seq"])
        metrics, lines = [], []
        advisory: set[str] = set()
        seen_steps = _recorded_steps(job, events)
        for event in events:
            kind = event["type"]
            at = _when(event.get("at"))
            if kind == "metric":
                key = (event["step"], event["rank"])
                if event.get("replayed") and key in seen_steps:
                    continue  # a metric the checkpoint carried that the worker had reported before it died
                seen_steps.add(key)
                if not event.get("replayed"):
                    _progressed(job)
                attempt = event.get("attempt") if event.get("replayed") and event.get("attempt") else job.attempt
                metrics.append(TrainingMetric(
                    job=job, attempt=attempt, step=event["step"], worker=event["rank"], loss=_finite(event["loss"]),
                    step_time_s=event.get("step_time"), compute_time_s=event.get("compute_time"),
                    tokens_per_s=event.get("tokens_per_s"), recorded_at=at))
            elif kind == "log":
                lines.append(TrainingLogLine(job=job, attempt=job.attempt, worker=event.get("rank"),
                                             line=str(event["line"])[:10000], recorded_at=at))
            elif kind == "checkpoint":
                job.last_checkpoint_step = max(job.last_checkpoint_step, event["step"])
                lines.append(TrainingLogLine(
                    job=job, attempt=job.attempt, worker=0, recorded_at=at,
                    line=f"checkpoint saved at step {event['step']} ({event.get('size_bytes', 0)} bytes"
                         f"{', requested' if event.get('requested') else ''})"))
            elif kind == "fault":
                job = _record_fault(job, event)
                if not event.get("advisory"):
                    _open_recovery(job, kind=event["kind"], occurred_at=event.get("occurred_at"),
                                   detected_at=event.get("detected_at"))
            elif kind == "recovery":
                _record_recovery(job, event)
            elif kind == "placement_needed" and event.get("advisory"):
                advisory.update(event.get("exclude") or [])
            elif kind == "placement_needed":
                job.recovery_exclude = sorted(set(job.recovery_exclude) | set(event.get("exclude") or []))
            elif kind == "state":
                job = _apply_state(job, event)
        TrainingMetric.objects.bulk_create(metrics)
        TrainingLogLine.objects.bulk_create(lines)
        if events:
            job.events_cursor = events[-1]["seq"]
        job.runtime_state = report.state
        job.current_step = max(job.current_step, report.step) if report.state != "recovering" else report.step
        job.observed_nodes = list(report.nodes)
        job.restarts = max(job.restarts, report.restarts)
        job.last_checkpoint_step = max(job.last_checkpoint_step, report.last_checkpoint_step)
        job.save(update_fields=["events_cursor", "runtime_state", "current_step", "observed_nodes", "restarts",
                                "last_checkpoint_step", "recovery_exclude", "goodput"])
        job.advisory_exclude = sorted(advisory)  # slow nodes: move off them only if a better node is free
        return job


def _recorded_steps(job: TrainingJob, events: list[dict]) -> set[tuple[int, int]]:
    """(step, worker) pairs that already have a metric row, over the steps of the replayed metrics in `events`
    (a resumed worker replays the metrics saved with its checkpoint; the control plane keeps only the missing)."""
    replayed = [e for e in events if e["type"] == "metric" and e.get("replayed")]
    if not replayed:
        return set()
    steps = [e["step"] for e in replayed]
    return set(TrainingMetric.objects.filter(job=job, step__gte=min(steps), step__lte=max(steps),
                                             worker__in={e["rank"] for e in replayed})
               .values_list("step", "worker"))


def _apply_state(job: TrainingJob, event: dict) -> TrainingJob:
    target = _RUN_TO_JOB_STATE.get(event["state"])
    if target is None or target == job.state or job.is_terminal or job.state == JobState.PREEMPTED:
        return job
    if not TrainingJob.machine.can(job.state, target):
        return job
    reason = event.get("reason") or event["state"]
    if target == JobState.FAILED:
        reason = f"training failed: {reason}"
    saved = {"recovery_exclude": job.recovery_exclude, "goodput": job.goodput,
             "last_checkpoint_step": job.last_checkpoint_step}
    job = transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to=target, reason=reason,
                     system="training-runtime", data={"step": event.get("step"), "nodes": event.get("nodes")})
    for key, value in saved.items():
        setattr(job, key, value)
    if target == JobState.RUNNING and job.started_at is None:
        job.started_at = _when(event.get("at"))
        job.goodput = GoodputLedger(first_started_at=job.started_at.timestamp()).to_dict()
        TrainingJob.objects.filter(pk=job.pk).update(started_at=job.started_at)
    elif target == JobState.RUNNING and job.goodput.get("paused_since"):
        ledger = goodput_ledger(job=job)
        ledger.record_pause(kind=job.goodput.get("pause_kind", "preempted"), start=job.goodput["paused_since"],
                            end=event.get("at") or timezone.now().timestamp())
        job.goodput = ledger.to_dict()
    elif target == JobState.RECOVERING:
        # A fault opened the recovery already; otherwise the run relaunches on new nodes (shrink, grow, move)
        _open_recovery(job, kind=RESIZE, occurred_at=event.get("at"), detected_at=event.get("at"))
    elif target == JobState.RUNNING and (job.goodput or {}).get(RECOVERY_KEY):
        # running again; the recovery ends at the first new step (the run's "recovery" event), counted until now
        job.goodput = {**job.goodput, RECOVERY_KEY: {**job.goodput[RECOVERY_KEY],
                                                     "until": _timestamp(event.get("at"))}}
    return job


def _record_fault(job: TrainingJob, event: dict) -> TrainingJob:
    kind = event["kind"] if event["kind"] in FaultKind.values else FaultKind.WORKER_CRASH
    fault = TrainingFault.objects.create(
        job=job, attempt=job.attempt, kind=kind, node=event.get("node") or "", worker=event.get("rank"),
        step=event.get("step", -1), evidence=event.get("evidence", ""), data=event.get("data") or {},
        advisory=bool(event.get("advisory")), occurred_at=_when(event.get("occurred_at")),
        detected_at=_when(event.get("detected_at")))
    record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                 reason=f"{fault.get_kind_display().lower()} detected on {fault.node or '?'} (worker {fault.worker}): "
                        f"{fault.evidence}", system="fault-detector",
                 data={"fault": fault.pk, "kind": kind, "node": fault.node, "worker": fault.worker,
                       "detection_s": round(fault.detection_s, 3), "advisory": fault.advisory})
    _maybe_cordon(job, fault)
    return job


def _maybe_cordon(job: TrainingJob, fault: TrainingFault) -> None:
    """Cordon a node that failed repeatedly, so the scheduler stops placing work on it. Advisory faults (a slow node)
    neither cordon nor count: a slow node is left only where a free node can take its worker (before, two slow-node
    verdicts cordoned the node, and the gangs on it shrank or moved at once; found by QA)."""
    if not fault.node or fault.kind == FaultKind.NODE_LOST or fault.advisory:
        return  # a lost node is already unschedulable (the node sync marks it unreachable)
    recent = TrainingFault.objects.filter(node=fault.node, advisory=False,
                                          detected_at__gte=fault.detected_at - CORDON_WINDOW).count()
    if recent < CORDON_AFTER_FAULTS:
        return
    updated = Node.objects.filter(name=fault.node, cordoned=False).update(cordoned=True)
    if updated:
        record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                     reason=f"node {fault.node} cordoned after {recent} faults within "
                            f"{int(CORDON_WINDOW.total_seconds() // 60)} min", system="fault-detector",
                     data={"node": fault.node, "faults": recent})
        job.recovery_exclude = sorted(set(job.recovery_exclude) | {fault.node})


def _record_recovery(job: TrainingJob, event: dict) -> None:
    """The run trains again after a fault or a relaunch on new nodes (kind RESIZE): its interval goes into the
    ledger, and the recovery the job had open is closed."""
    fault = None
    if event["kind"] in FaultKind.values:
        fault = (TrainingFault.objects.filter(job=job, kind=event["kind"], resumed_at__isnull=True, advisory=False)
                 .order_by("-id").first())
    resumed = _when(event["resumed_at"])
    if fault is not None:
        fault.resumed_at = resumed
        fault.recomputed_steps = int(event.get("recomputed_steps") or 0)
        fault.recomputed_s = float(event.get("recomputed_s") or 0.0)
        fault.save(update_fields=["resumed_at", "recomputed_steps", "recomputed_s"])
    ledger = goodput_ledger(job=job) or GoodputLedger(first_started_at=resumed.timestamp())
    occurred = min(event["occurred_at"], event["detected_at"])
    recovering = (job.goodput or {}).get(RECOVERY_KEY)
    if recovering and min(recovering["occurred_at"], recovering["detected_at"]) < occurred - 1e-3:
        # an earlier interruption the run never resumed from (a second fault struck before its first new step):
        # lost until this one began
        record_open_recovery(ledger, recovering, occurred)
    ledger.record_interruption(kind=event["kind"], occurred_at=max(occurred, ledger.first_started_at),
                               detected_at=max(event["detected_at"], ledger.first_started_at),
                               resumed_at=max(event["resumed_at"], event["detected_at"], ledger.first_started_at),
                               recomputed_s=float(event.get("recomputed_s") or 0.0),
                               recomputed_steps=int(event.get("recomputed_steps") or 0))
    extra = {k: v for k, v in (job.goodput or {}).items() if k in PAUSE_KEYS}
    job.goodput = {**ledger.to_dict(), **extra}


def _open_recovery(job: TrainingJob, *, kind: str, occurred_at, detected_at) -> None:
    """The run stopped training (a fault, or a relaunch on new nodes): the time until it trains again is lost, and
    counts as such while it lasts (before, a job waiting minutes for nodes showed an ETTR of 1.0; QA on Ray). An
    open recovery stays open (a second fault during it, or a re-placement of a gang that lost a node, is part of
    it); one the run reported running again but not yet training is reopened."""
    if job.started_at is None or job.state not in (JobState.RUNNING, JobState.RECOVERING):
        return
    goodput = job.goodput or {}
    current = goodput.get(RECOVERY_KEY)
    if current:
        job.goodput = {**goodput, RECOVERY_KEY: {k: v for k, v in current.items() if k != "until"}}
        return
    occurred = _timestamp(occurred_at)
    detected = max(_timestamp(detected_at), occurred)
    job.goodput = {**goodput, RECOVERY_KEY: {"kind": kind, "occurred_at": occurred, "detected_at": detected}}


def _progressed(job: TrainingJob) -> None:
    """A new step while a recovery is still open after the run reported running: no "recovery" event will close it
    (the run was launched again after its supervisor disappeared); it lasted until the run was running again."""
    recovering = (job.goodput or {}).get(RECOVERY_KEY)
    if not recovering or "until" not in recovering:
        return
    ledger = goodput_ledger(job=job)
    if ledger is None:
        return
    record_open_recovery(ledger, recovering, recovering["until"])
    job.goodput = {**ledger.to_dict(), **{k: v for k, v in job.goodput.items() if k in PAUSE_KEYS}}


# ------------------------------------------------------------------------------------------ placement

def _reconcile_placement(job: TrainingJob, report: TrainingReport, backend) -> None:
    """Move the run toward the job's placement: re-place lost workers first, then follow resizes."""
    from jobs.admission import replace_workers

    cordoned = sorted(set(Node.objects.filter(name__in=placement_nodes(job), cordoned=True)
                          .values_list("name", flat=True)))
    if cordoned and not job.recovery_exclude and report.state == "running":
        # An operator cordoned a node under the gang: checkpoint and move off it where another node
        # (or a smaller gang) allows; otherwise it keeps running there and no new work comes.
        job = replace_workers(job_id=job.pk, exclude=cordoned) or job
    elif job.recovery_exclude:
        job = replace_workers(job_id=job.pk, exclude=list(job.recovery_exclude)) or job
    elif getattr(job, "advisory_exclude", None):
        job = replace_workers(job_id=job.pk, exclude=job.advisory_exclude, require_all=True) or job
    elif report.state == "awaiting_placement" and Counter(placement_nodes(job)) == Counter(report.nodes):
        # The run was given these nodes and could not reserve them: place it again rather than send them again
        # (before, the same nodes were sent every pass for good, QA: a replica being deployed had taken one).
        moved = _place_again(job, report)
        if moved is None:
            return  # it waits, saying for what; the next pass tries again
        job = moved
    desired = placement_nodes(job)
    if not desired or report.state not in ("running", "awaiting_placement"):
        return
    if job.recovery_exclude and report.state == "awaiting_placement":
        return  # still waiting for capacity; the next pass tries again
    if Counter(desired) != Counter(report.nodes):
        reason = _resize_reason(len(report.nodes), len(desired))
        backend.place_training(job.compute_handle, desired, reason)
        record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                     reason=f"{reason}: {', '.join(desired)}", system="launcher",
                     data={"from": list(report.nodes), "to": desired})
    elif report.state == "awaiting_placement":  # nothing else is free and nothing known holds them: try them again
        reason = (f"trying {', '.join(desired)} again: the run could not reserve them"
                  f"{f' ({report.reason})' if report.reason else ''}, and no other node is free")
        backend.place_training(job.compute_handle, desired, reason)
        _note_once(job, reason, system="launcher", data={"from": list(report.nodes), "to": desired})


def _place_again(job: TrainingJob, report: TrainingReport) -> TrainingJob | None:
    """A run awaiting placement on the nodes of its placement (it could not reserve them): the job with a placement
    to send (a new one, or the same when nothing else is free and the control plane sees nothing holding them), or
    None while it waits for capacity (its reason says for what).

    Nodes others hold as the cycle counts them (a replica running or being deployed there, another job, a run still
    stopping; or a node cordoned meanwhile) are left for free ones, or the gang shrinks as far as its minimum allows,
    or it waits. When the control plane sees them free (held outside its knowledge), the gang moves whole to other
    free nodes if there are any, else the same nodes are tried again."""
    from jobs.admission import placement_taken, replace_workers

    taken = placement_taken(job_id=job.pk)
    if taken:
        because = "; ".join(f"{node}: {why}" for node, why in taken.items())
        return replace_workers(job_id=job.pk, exclude=sorted(taken), because=because)
    nodes = sorted(set(report.nodes))
    because = f"could not be reserved: {report.reason}" if report.reason else "could not be reserved"
    return replace_workers(job_id=job.pk, exclude=nodes, require_all=True, because=because) or job


def _resize_reason(before: int, after: int) -> str:
    if after < before:
        return f"shrinking from {before} to {after} worker(s)"
    if after > before:
        return f"growing from {before} to {after} worker(s)"
    return f"moving {after} worker(s) to new nodes"


# ------------------------------------------------------------------------------------------ drift

def _run_missing(job: TrainingJob, report: TrainingReport, backend) -> TrainingJob:
    """The job says a run exists and Ray has none (the supervisor died, or the launch never happened)."""
    if job.state == JobState.PREEMPTED:
        return _requeue_after_preemption(job)
    record_event(obj=job, event_model=TrainingJobEvent, from_state=job.state, to_state=job.state,
                 reason=f"run {job.compute_handle} not found ({report.reason}); launching it again from the "
                        f"latest checkpoint", system="reconciler")
    with transaction.atomic():
        TrainingJob.objects.filter(pk=job.pk).update(events_cursor=0)
    job.events_cursor = 0
    return _start_run(job, backend)


def reconcile_orphan_runs(*, backend) -> list[str]:
    """Stop runs whose job is gone or over (a Ray run with no live job row)."""
    live = set(TrainingJob.objects.filter(state__in=SYNCED_STATES).exclude(compute_handle="")
               .values_list("compute_handle", flat=True))
    orphans = [handle for handle in backend.list_training_handles() if handle not in live]
    for handle in orphans:
        try:
            report = backend.observe_training(handle, since=10**12)  # state only
            if report.terminal or report.state == "unknown":
                backend.release_training(handle)
                _mark_run_released(handle)  # (a cancelled job's stop that never got through)
            else:  # stop first (it may be writing a final checkpoint); released on a later pass once stopped
                log.warning("stopping orphan training run %s (%s)", handle, report.state)
                backend.stop_training(handle, checkpoint=True, reason="no live job owns this run")
        except Exception:  # one run's trouble must not keep the others running (QA); the next pass retries it
            log.exception("stopping orphan training run %s failed", handle)
    return orphans


# ------------------------------------------------------------------------------------------ on demand

def training_job_request_checkpoint(*, actor, job: TrainingJob, backend) -> int:
    """Ask a running job for a checkpoint now; returns the step it was at. 409 unless RUNNING."""
    if job.state != JobState.RUNNING or not job.compute_handle:
        raise ConflictError(f"job {job.pk} is {job.state}; only a running job can checkpoint", field="state")
    try:
        backend.checkpoint_training(job.compute_handle)
    except LookupError:  # the run vanished and the sync has not seen it yet (it was a 500; QA)
        raise ConflictError(f"job {job.pk}'s run is not there now (the sync launches a vanished run again from its "
                            "latest checkpoint); ask again once it runs", field="state") from None
    audit_record(actor=actor, team=job.team_id, action="training_job.checkpoint", target=job,
                 data={"step": job.current_step})
    return job.current_step


# ------------------------------------------------------------------------------------------ stop

def training_job_stop_run(*, job_id: int, backend, checkpoint: bool, reason: str) -> None:
    """Stop the run of a job that was preempted or ended. A stop that arrives after the job went on (a message
    delivered twice, or late, after the job was requeued and launched again) does nothing: it named the job, not
    the run, and stopped the job's new attempt (QA)."""
    job = TrainingJob.objects.filter(pk=job_id).first()
    if job is None or not job.compute_handle or not (job.is_terminal or job.state == JobState.PREEMPTED):
        return
    backend.stop_training(job.compute_handle, checkpoint=checkpoint, reason=reason)
    if job.is_terminal:
        backend.release_training(job.compute_handle)
        _mark_run_released(job.compute_handle)
    if job.state == JobState.PREEMPTED:
        with transaction.atomic():
            locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
            if (locked.goodput or {}).get("paused_since"):
                return  # an earlier delivery of this stop paused it: the pause began then
            now = timezone.now().timestamp()
            goodput = dict(locked.goodput or {})
            recovering = goodput.pop(RECOVERY_KEY, None)
            ledger = goodput_ledger(job=locked) if recovering else None
            if ledger is not None:  # a recovery still open ends where the pause begins (the queue wait is paused)
                record_open_recovery(ledger, recovering, now)
                goodput = {**ledger.to_dict(), **{k: v for k, v in goodput.items() if k in PAUSE_KEYS}}
            locked.goodput = {**goodput, "paused_since": now, "pause_kind": "preempted"}
            locked.save(update_fields=["goodput"])


def _mark_run_released(handle: str) -> None:
    """A cancelled job's run (`handle`) was stopped and released: its devices are free for what the scheduler gave them
    to (jobs.admission counts them in use until then), so a cycle runs and the admissions held for them launch."""
    from jobs.admission import RUN_RELEASED

    if TrainingJob.objects.filter(compute_handle=handle, state=JobState.CANCELLED).exclude(
            runtime_state=RUN_RELEASED).update(runtime_state=RUN_RELEASED):
        _kick_scheduler()


def _requeue_after_preemption(job: TrainingJob) -> TrainingJob:
    with transaction.atomic():
        locked = TrainingJob.objects.select_for_update().get(pk=job.pk)
        if locked.state != JobState.PREEMPTED:
            return locked
        locked.compute_handle = ""
        locked.runtime_state = "stopped"
        locked.observed_nodes = []
        locked.placement = []  # kept while the run stopped, so nothing launched onto its devices meanwhile
        locked.save(update_fields=["compute_handle", "runtime_state", "observed_nodes", "placement"])
        locked = transition(obj=locked, machine=TrainingJob.machine, event_model=TrainingJobEvent,
                            to=JobState.QUEUED, reason=f"checkpointed at step {locked.last_checkpoint_step} and "
                                                       f"stopped; waiting to be admitted again", system="launcher")
    _kick_scheduler()
    return locked


def _kick_scheduler() -> None:
    from jobs.tasks import run_scheduling_cycle

    dispatch_on_commit(run_scheduling_cycle)


def _without_nul(value):
    """A run's event with each NUL character in its text (keys and strings, at any depth) replaced by U+FFFD. A user's
    entrypoint may print one (`printf 'a\\0b'`): PostgreSQL refuses NUL in text and jsonb, so the report failed to
    apply on every sync, and the job's cursor, logs, metrics and state stopped there for good (QA)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(item) for item in value]
    return value


def _when(value) -> datetime:
    if value is None:
        return timezone.now()
    return datetime.fromtimestamp(float(value), tz=UTC)


def _timestamp(value) -> float:
    """A run's event time (seconds since the epoch) as it was sent; now when it has none."""
    return timezone.now().timestamp() if value is None else float(value)


def _finite(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def dataset_local_path(job: TrainingJob) -> str:
    """A file the workers can read ("" without a dataset): an uploaded file, or an https one fetched through
    the SSRF guard. DatasetUnavailable says why a version cannot be read (datasets/fetching.py)."""
    version = job.dataset_version
    if version is None:
        return ""
    return str(dataset_local_file(version))
