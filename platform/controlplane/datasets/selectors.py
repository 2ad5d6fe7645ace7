"""Reads about datasets."""

from __future__ import annotations

from django.db.models import Count, Max, QuerySet

from controlplane.datasets.models import Dataset, DatasetVersion


def dataset_list(*, team_ids: list[int]) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team_id__in=team_ids).select_related("team").annotate(
        version_count=Count("versions"), latest_version=Max("versions__version")
    ).order_by("team__name", "name")


def dataset_version_list(*, team_ids: list[int]) -> QuerySet[DatasetVersion]:
    return DatasetVersion.objects.filter(dataset__team_id__in=team_ids).select_related("dataset__team")
