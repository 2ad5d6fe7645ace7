"""Reads about training jobs."""

from __future__ import annotations

from django.db.models import QuerySet

from jobs.models import TrainingJob, TrainingJobEvent


def training_job_list(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.filter(team_id__in=team_ids).select_related(
        "team", "local_queue", "priority_class", "dataset_version__dataset"
    )


def training_job_events(*, job: TrainingJob) -> QuerySet[TrainingJobEvent]:
    return job.events.all()


HOLDING_STATES = ("ADMITTED", "STARTING", "RUNNING", "RECOVERING")


def quota_usage() -> dict[tuple[str, str], float]:
    """Devices (CPU cores for `cpu`) held by admitted jobs, per (cluster queue, accelerator type)."""
    usage: dict[tuple[str, str], float] = {}
    jobs = TrainingJob.objects.filter(state__in=HOLDING_STATES).exclude(admitted_accelerator_type="").values_list(
        "local_queue__cluster_queue__name", "admitted_accelerator_type", "placement", "devices_per_worker",
        "cpus_per_worker")
    for queue, accelerator_type, placement, devices, cpus in jobs:
        per_worker = cpus if accelerator_type == "cpu" else devices
        key = (queue, accelerator_type)
        usage[key] = usage.get(key, 0.0) + len(placement) * per_worker
    return usage


def waiting_jobs(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    return training_job_list(team_ids=team_ids).filter(state="QUEUED").order_by(
        "local_queue__cluster_queue__name", "queue_position", "created_at")
