"""Reads about training jobs."""

from __future__ import annotations

from django.db.models import QuerySet

from jobs.models import TrainingJob, TrainingJobEvent
from jobs.states import HOLDING_STATES


def training_job_list(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.filter(team_id__in=team_ids).select_related(
        "team", "local_queue", "priority_class", "dataset_version__dataset"
    )


def training_job_events(*, job: TrainingJob) -> QuerySet[TrainingJobEvent]:
    return job.events.all()


def quota_usage() -> dict[tuple[str, str], float]:
    """Devices (CPU cores for `cpu`) held by admitted jobs, per (cluster queue, accelerator type)."""
    usage: dict[tuple[str, str], float] = {}
    jobs = TrainingJob.objects.filter(state__in=HOLDING_STATES).exclude(admitted_accelerator_type="").only(
        "local_queue__cluster_queue__name", "admitted_accelerator_type", "placement", "devices_per_worker",
        "cpus_per_worker").select_related("local_queue__cluster_queue")
    for job in jobs:
        key = (job.local_queue.cluster_queue.name, job.admitted_accelerator_type)
        usage[key] = usage.get(key, 0.0) + len(job.placement) * job.units_per_worker(job.admitted_accelerator_type)
    return usage


def waiting_jobs(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return training_job_list(team_ids=team_ids).filter(state="QUEUED").order_by(
        "local_queue__cluster_queue__name", "queue_position", "created_at")
