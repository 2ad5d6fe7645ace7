"""Reads about datasets."""

from __future__ import annotations

from django.db.models import Count, F, Max, QuerySet, Window
from django.db.models.functions import RowNumber

from controlplane.datasets.models import Dataset, DatasetVersion


def dataset_list(*, team_ids: list[int]) -> QuerySet[Dataset]:
    return Dataset.objects.filter(team_id__in=team_ids).select_related("team").annotate(
        version_count=Count("versions"), latest_version=Max("versions__version")
    ).order_by("team__name", "name")


def dataset_version_list(*, team_ids: list[int]) -> QuerySet[DatasetVersion]:
    return DatasetVersion.objects.filter(dataset__team_id__in=team_ids).select_related("dataset__team")


def dataset_versions_latest(*, team_ids: list[int], dataset_ids: list[int], limit: int) -> QuerySet[DatasetVersion]:
    """The latest `limit` versions of each of `dataset_ids` (of the given teams), by dataset and newest first: one
    query, however many versions a dataset holds (the console's Datasets page)."""
    return dataset_version_list(team_ids=team_ids).filter(dataset_id__in=dataset_ids).annotate(
        newest=Window(RowNumber(), partition_by=[F("dataset_id")], order_by=F("version").desc()),
    ).filter(newest__lte=limit).order_by("dataset_id", "-version")
