"""Reads about queues and quotas."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass, ResourceQuota
from controlplane.tenancy.selectors import is_operator


def cluster_queue_list() -> QuerySet[ClusterQueue]:
    return ClusterQueue.objects.prefetch_related("quotas__accelerator_type", "teams")


def team_names_seen_by(*, user, token=None) -> set[str] | None:
    """The team names a ClusterQueue's `teams` may show `user`: None (all of them) for an operator, else the user's
    own teams (other teams' names are not theirs to see). A team API token narrows them to its team, as everywhere
    else (before, a token of team alpha showed the name of every other team of its user: QA); a staff user's too."""
    if is_operator(user=user, token=token):
        return None
    if user is None or not user.is_authenticated:
        return set()
    memberships = user.memberships.all()
    if token is not None:
        memberships = memberships.filter(team_id=token.team_id)
    return set(memberships.values_list("team__name", flat=True))


def local_queue_list(*, team_ids: list[int]) -> QuerySet[LocalQueue]:
    return LocalQueue.objects.filter(team_id__in=team_ids).select_related("team", "cluster_queue")


def priority_class_list() -> QuerySet[PriorityClass]:
    return PriorityClass.objects.all()


def cluster_queue_over_quota(*, queue: ClusterQueue) -> list[str]:
    """What admitted work (training jobs holding quota, live deployments) of `queue` uses beyond what its quotas now
    let it hold: its nominal quota, plus what it may borrow (its borrowing limit, at most what the other queues of
    its cohort lend; nothing in no cohort). One line per accelerator type over it; empty when all is within. A quota
    change does not stop running work: this is how an operator is told that some now runs over (QA, 2026-11-29)."""
    from inference.selectors import serving_quota_usage
    from jobs.selectors import quota_usage

    usage: dict[str, float] = {}
    for source in (quota_usage(), serving_quota_usage()):
        for (queue_name, slug), units in source.items():
            if queue_name == queue.name and units > 0:
                usage[slug] = usage.get(slug, 0.0) + units
    if not usage:
        return []
    own = {quota.accelerator_type.slug: quota for quota in queue.quotas.select_related("accelerator_type")}
    lent: dict[str, float] = {}
    if queue.cohort:
        others = ResourceQuota.objects.filter(cluster_queue__cohort=queue.cohort).exclude(
            cluster_queue=queue).select_related("accelerator_type")
        for quota in others:
            lends = quota.nominal_quota if quota.lending_limit is None else min(quota.lending_limit,
                                                                                  quota.nominal_quota)
            lent[quota.accelerator_type.slug] = lent.get(quota.accelerator_type.slug, 0.0) + lends
    lines = []
    for slug in sorted(usage):
        quota = own.get(slug)
        nominal = quota.nominal_quota if quota else 0.0
        borrow = 0.0
        if queue.cohort:
            borrow = lent.get(slug, 0.0)
            if quota is not None and quota.borrowing_limit is not None:
                borrow = min(borrow, quota.borrowing_limit)
        if usage[slug] > nominal + borrow + 1e-9:
            limit = f"its nominal quota of {nominal:g}" if quota else "no quota (none is set for this type)"
            if borrow:
                limit += f" plus the {borrow:g} it may borrow from cohort {queue.cohort}"
            lines.append(f"{slug}: admitted work of cluster queue {queue.name} uses {usage[slug]:g}, beyond {limit}; "
                         "it keeps running (nothing is stopped) until it ends or is preempted, and new "
                         f"{slug} work of the queue waits until its usage is back within quota")
    return lines


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
