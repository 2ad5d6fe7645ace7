"""Celery tasks of the training job lifecycle: thin, idempotent, ids in, state in the database row.

admit (run_scheduling_cycle) -> launch (launch_training_job) -> watch and recover
(sync_training_jobs, beat every FLEETYARD_TRAINING_SYNC_SECONDS) -> finish / stop (stop_training_run).
The sync is also the reconciler: it relaunches a run that vanished, launches an admitted job whose
launch was lost, and stops runs that no live job owns.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from controlplane.common.tasks import LIFECYCLE_TASK
from controlplane.compute.registry import get_compute_backend
from jobs import services, workflows
from jobs.models import TrainingJob
from jobs.states import JobState

log = logging.getLogger(__name__)

# A PENDING job not queued, or an ADMITTED job not launched, after this long is picked up by the reconciler.
LAUNCH_GRACE = timedelta(seconds=30)


@shared_task(name="jobs.enqueue_training_job", **LIFECYCLE_TASK)
def enqueue_training_job(job_id: int) -> str | None:
    job = services.training_job_enqueue(job_id=job_id)
    run_scheduling_cycle.delay()  # a new job may start at once
    return job.state if job else None


@shared_task(name="jobs.launch_training_job", bind=True, **LIFECYCLE_TASK)
def launch_training_job(self, job_id: int) -> str | None:
    try:
        job = workflows.training_job_launch(job_id=job_id, backend=get_compute_backend())
    except Exception as exc:  # the backend may be briefly unreachable; the sync relaunches as well
        log.warning("launching job %s failed: %s", job_id, exc)
        raise self.retry(exc=exc) from exc
    return job.state if job else None


@shared_task(name="jobs.stop_training_run", bind=True, **LIFECYCLE_TASK)
def stop_training_run(self, job_id: int, checkpoint: bool = False, reason: str = "") -> None:
    try:
        workflows.training_job_stop_run(job_id=job_id, backend=get_compute_backend(), checkpoint=checkpoint,
                                        reason=reason or "stopped")
    except Exception as exc:
        log.warning("stopping the run of job %s failed: %s", job_id, exc)
        raise self.retry(exc=exc) from exc


@shared_task(name="jobs.sync_training_jobs", **LIFECYCLE_TASK)
def sync_training_jobs() -> dict:
    """Apply every live run's progress; repair drift both ways."""
    backend = get_compute_backend()
    synced, failed = 0, 0
    for job_id in TrainingJob.objects.filter(state__in=workflows.SYNCED_STATES).exclude(compute_handle="") \
            .values_list("pk", flat=True):
        try:
            workflows.training_job_sync(job_id=job_id, backend=backend)
            synced += 1
        except Exception:  # one job's trouble must not stop the others; the next pass retries
            log.exception("syncing training job %s failed", job_id)
            failed += 1
    stale = timezone.now() - LAUNCH_GRACE
    # A job whose enqueue message never reached a worker (the broker was down when it was submitted) is
    # queued here, without the broker.
    # Each sweep below on its own: one that fails (a job's enqueue, the cycle, the broker for a launch) is logged and
    # the next pass retries it, and the sweeps after it still run (before, one failure skipped the launches and the
    # orphan runs for that pass; QA).
    swept = 0
    for job_id in TrainingJob.objects.filter(state=JobState.PENDING, state_changed_at__lt=stale) \
            .values_list("pk", flat=True):
        try:
            job = services.training_job_enqueue(job_id=job_id)
        except Exception:
            log.exception("queueing pending training job %s failed", job_id)
            failed += 1
            continue
        if job is not None and job.state == JobState.QUEUED:
            swept += 1
    if swept:
        try:
            run_scheduling_cycle()
        except Exception:
            log.exception("the scheduling cycle after queueing %s pending job(s) failed", swept)
            failed += 1
    for job_id in TrainingJob.objects.filter(state=JobState.ADMITTED, state_changed_at__lt=stale) \
            .values_list("pk", flat=True):
        try:
            launch_training_job.delay(job_id)
        except Exception:
            log.exception("sending the launch of training job %s failed", job_id)
            failed += 1
    orphans = workflows.reconcile_orphan_runs(backend=backend)
    return {"synced": synced, "failed": failed, "orphans_stopped": len(orphans), "pending_queued": swept}


@shared_task(name="jobs.run_scheduling_cycle", **LIFECYCLE_TASK)
def run_scheduling_cycle() -> dict:
    from jobs.admission import run_cycle

    result = run_cycle()
    held = sum(1 for wait in result.waiting if wait.held is not None)  # preemptors, admitted while victims stop
    return {"admitted": len(result.admitted) + held, "preempted": len(result.preempted),
            "waiting": len(result.waiting) - held}
