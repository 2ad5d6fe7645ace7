"""Reads about queues and quotas."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass


def cluster_queue_list() -> QuerySet[ClusterQueue]:
    return ClusterQueue.objects.prefetch_related("quotas__accelerator_type", "teams")


def team_names_seen_by(*, user) -> set[str] | None:
    """The team names a ClusterQueue's `teams` may show `user`: None (all of them) for an operator, else the user's
    own teams (other teams' names are not theirs to see)."""
    if user is not None and user.is_staff:
        return None
    if user is None or not user.is_authenticated:
        return set()
    return set(user.memberships.values_list("team__name", flat=True))


def local_queue_list(*, team_ids: list[int]) -> QuerySet[LocalQueue]:
    return LocalQueue.objects.filter(team_id__in=team_ids).select_related("team", "cluster_queue")


def priority_class_list() -> QuerySet[PriorityClass]:
    return PriorityClass.objects.all()


def quota_types_for_local_queue(*, local_queue: LocalQueue) -> set[str]:
    """Accelerator types the queue's ClusterQueue has quota for (nominal > 0, or borrowable in a cohort)."""
    quotas = local_queue.cluster_queue.quotas.select_related("accelerator_type")
    cohort = local_queue.cluster_queue.cohort
    return {
        quota.accelerator_type.slug
        for quota in quotas
        if quota.nominal_quota > 0 or (cohort and (quota.borrowing_limit is None or quota.borrowing_limit > 0))
    }


def check_workload_request(*, local_queue: LocalQueue, accelerator_types: list[str]) -> None:
    """Reject a workload whose accepted accelerator types its queue can never admit."""
    from controlplane.cluster.models import AcceleratorType
    from controlplane.common.errors import ValidationFailed

    if not accelerator_types:
        raise ValidationFailed("list at least one accepted accelerator type", field="accelerator_types")
    if len(set(accelerator_types)) != len(accelerator_types):
        raise ValidationFailed("accelerator types repeat", field="accelerator_types")
    known = set(AcceleratorType.objects.filter(slug__in=accelerator_types).values_list("slug", flat=True))
    unknown = [slug for slug in accelerator_types if slug not in known]
    if unknown:
        raise ValidationFailed(f"unknown accelerator type(s): {', '.join(unknown)}", field="accelerator_types")
    covered = quota_types_for_local_queue(local_queue=local_queue)
    missing = [slug for slug in accelerator_types if slug not in covered]
    if missing:
        has = ", ".join(sorted(covered)) or "none"
        raise ValidationFailed(
            f"queue {local_queue.name} (cluster queue {local_queue.cluster_queue.name}) has no quota for "
            f"{', '.join(missing)}; it has quota for: {has}",
            field="accelerator_types",
        )
