"""Celery tasks of the training job lifecycle: thin, idempotent, ids in, state in the database row."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.common.tasks import LIFECYCLE_TASK
from controlplane.compute.registry import get_compute_backend
from jobs import services
from jobs.models import TrainingJob

log = logging.getLogger(__name__)



@shared_task(name="jobs.enqueue_training_job", **LIFECYCLE_TASK)
def enqueue_training_job(job_id: int) -> str | None:
    job = services.training_job_enqueue(job_id=job_id)
    run_scheduling_cycle.delay()  # a new job may start at once
    return job.state if job else None


@shared_task(name="jobs.stop_training_job", bind=True, **LIFECYCLE_TASK)
def stop_training_job(self, job_id: int) -> str | None:
    job = TrainingJob.objects.filter(pk=job_id).only("compute_handle").first()
    if job is None or not job.compute_handle:
        return None
    try:
        return get_compute_backend().stop_gang(job.compute_handle).state
    except Exception as exc:  # the backend may be briefly unreachable; the next try repairs it
        log.warning("stopping gang %s of job %s failed: %s", job.compute_handle, job_id, exc)
        raise self.retry(exc=exc) from exc


@shared_task(name="jobs.run_scheduling_cycle", **LIFECYCLE_TASK)
def run_scheduling_cycle() -> dict:
    from jobs.admission import run_cycle

    result = run_cycle()
    return {"admitted": len(result.admitted), "preempted": len(result.preempted), "waiting": len(result.waiting)}
