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
