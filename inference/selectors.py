"""Reads about deployments."""

from __future__ import annotations

from django.db.models import QuerySet

from inference.models import Deployment


def deployment_list(*, team_ids: list[int]) -> QuerySet[Deployment]:
    return Deployment.objects.filter(team_id__in=team_ids).select_related(
        "team", "local_queue", "priority_class", "source_job"
    )
