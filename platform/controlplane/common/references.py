"""Resolves the names a request body uses (queue, priority class, dataset reference) within one team."""

from __future__ import annotations

import re

from controlplane.common.errors import ValidationFailed
from controlplane.datasets.models import DatasetVersion
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.tenancy.models import Team

DATASET_REF = re.compile(r"^(?:dataset://)?(?P<name>[a-z0-9][a-z0-9-]*)(?:@(?P<version>\d+|latest))?$")


def resolve_local_queue(*, team: Team, name: str) -> LocalQueue:
    queue = LocalQueue.objects.select_related("cluster_queue").filter(team=team, name=name).first()
    if queue is None:
        names = ", ".join(LocalQueue.objects.filter(team=team).values_list("name", flat=True)) or "none"
        raise ValidationFailed(f"team {team.name} has no queue named {name!r} (queues: {names})", field="queue")
    return queue


def resolve_priority_class(*, name: str | None) -> PriorityClass | None:
    if not name:
        return None
    priority = PriorityClass.objects.filter(name=name).first()
    if priority is None:
        names = ", ".join(PriorityClass.objects.values_list("name", flat=True)) or "none"
        raise ValidationFailed(f"no priority class named {name!r} (classes: {names})", field="priority")
    return priority


def resolve_dataset_version(*, team: Team, reference: str | None) -> DatasetVersion | None:
    """`dataset://name@3`, `name@3`, `name@latest` or `name` (the latest version)."""
    if not reference:
        return None
    match = DATASET_REF.match(reference.strip())
    if match is None:
        raise ValidationFailed(f"{reference!r} is not a dataset reference (use dataset://name@version)",
                               field="dataset")
    versions = DatasetVersion.objects.select_related("dataset").filter(
        dataset__team=team, dataset__name=match["name"]
    )
    wanted = match["version"]
    version = (versions.filter(version=int(wanted)) if wanted and wanted != "latest" else versions) \
        .order_by("-version").first()
    if version is None:
        raise ValidationFailed(f"dataset {reference!r} not found in team {team.name}", field="dataset")
    return version
