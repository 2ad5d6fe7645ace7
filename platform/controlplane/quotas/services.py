"""Writes about queues and quotas."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction

from controlplane.cluster.models import AcceleratorType
from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.quotas import selectors
from controlplane.quotas.models import (
    ClusterQueue,
    LocalQueue,
    PreemptionPolicy,
    PriorityClass,
    ReclaimPolicy,
    ResourceQuota,
)
from controlplane.tenancy.models import Team
from controlplane.tenancy.services import audit_record


def lock_cluster_queues() -> None:
    """Lock every ClusterQueue row, in id order, until the transaction ends: what decides against quotas (the
    scheduling cycle, re-placing a gang, placing a deployment) takes this first, so two such decisions never read
    the same free quota. Always before any job or deployment row (one order: no deadlock)."""
    list(ClusterQueue.objects.select_for_update().order_by("id").values_list("id", flat=True))


@transaction.atomic
def cluster_queue_create(*, actor, name: str, cohort: str = "", description: str = "",
                         quotas: list[dict] = (), preemption_within_queue: str = PreemptionPolicy.LOWER_PRIORITY,
                         reclaim_within_cohort: str = ReclaimPolicy.ANY, teams=()) -> ClusterQueue:
    """`quotas`: [{"accelerator_type": slug, "nominal_quota": n, "borrowing_limit": n|None, ...}]; `teams`: the
    teams whose local queues may use it (none: every team)."""
    if ClusterQueue.objects.filter(name=name).exists():
        raise ValidationFailed(f"a cluster queue named {name!r} already exists", field="name")
    queue = ClusterQueue(name=name, cohort=cohort, description=description,
                         preemption_within_queue=preemption_within_queue, reclaim_within_cohort=reclaim_within_cohort,
                         open_to_all_teams=not teams)
    queue.full_clean()
    queue.save()
    _quotas_replace(queue=queue, quotas=quotas)
    queue.teams.set(teams)
    audit_record(actor=actor, team=None, action="cluster_queue.create", target=queue,
                 data={"name": name, "cohort": cohort, "quotas": list(quotas),
                       "preemption_within_queue": preemption_within_queue,
                       "reclaim_within_cohort": reclaim_within_cohort,
                       "teams": sorted(team.name for team in teams)})
    return queue


@transaction.atomic
def cluster_queue_update(*, actor, queue: ClusterQueue, cohort: str | None = None,
                         description: str | None = None, quotas: list[dict] | None = None,
                         preemption_within_queue: str | None = None,
                         reclaim_within_cohort: str | None = None, teams=None) -> tuple[ClusterQueue, list[str]]:
    """Change what is given; `quotas` replaces the whole list (a type left out has no quota afterwards), `teams`
    the teams whose local queues may use it (empty: every team). Teams that still have local queues on it cannot be
    left out: 409 naming those queues, nothing changed. Returns the queue and what admitted work of it now runs over
    its quotas (selectors.cluster_queue_over_quota, read once: the PATCH answer's `warnings`), and, when its quotas or
    cohort change, what work of the other queues of its cohort (before and after) now runs over what they may
    borrow."""
    queue = ClusterQueue.objects.select_for_update().get(pk=queue.pk)
    cohort_before = queue.cohort
    changes = {}
    if teams:
        cluster_queue_teams_check(queue=queue, teams=teams)
    if cohort is not None:
        queue.cohort = changes["cohort"] = cohort
        if quotas is None:  # (quotas sent are checked as they replace these: _quotas_replace)
            limited = sorted(q.accelerator_type.slug for q in queue.quotas_needing_cohort())
            if limited:
                raise ValidationFailed(f"cluster queue {queue.name}'s quotas for {', '.join(limited)} set a borrowing "
                                       "or lending limit, which needs a cohort: send quotas without them in the same "
                                       "request", field="cohort")
    if description is not None:
        queue.description = changes["description"] = description
    if preemption_within_queue is not None:
        queue.preemption_within_queue = changes["preemption_within_queue"] = preemption_within_queue
    if reclaim_within_cohort is not None:
        queue.reclaim_within_cohort = changes["reclaim_within_cohort"] = reclaim_within_cohort
    if teams is not None:
        queue.open_to_all_teams = not teams
    # A cohort is checked when it is set: one stored before it had to be a lowercase name (quotas 0005) must not make
    # every other change of the queue a 400 on cohort (review, 2026-11-29).
    queue.full_clean(exclude=None if cohort is not None else ["cohort"])
    queue.save()
    if quotas is not None:
        changes["quotas_before"] = [
            {"accelerator_type": quota.accelerator_type.slug, "nominal_quota": quota.nominal_quota,
             "borrowing_limit": quota.borrowing_limit, "lending_limit": quota.lending_limit}
            for quota in queue.quotas.select_related("accelerator_type")]
        _quotas_replace(queue=queue, quotas=quotas)
        changes["quotas"] = list(quotas)
    if teams is not None:
        queue.teams.set(teams)
        changes["teams"] = sorted(team.name for team in teams)
    # Running work is not stopped by a smaller quota; the change is kept, and the record says what now runs over it
    # (before 2026-11-29 nothing said so; the PATCH answer's `warnings` say the same, from this one read: the view
    # read it again).
    over = selectors.cluster_queue_over_quota(queue=queue)
    if quotas is not None or cohort is not None:
        # What this queue lends its cohort is what the others may borrow: a lender's cut, or a lender leaving the
        # cohort, leaves a borrower over quota, and that is said too (QA, 2026-12-07: the answer was silent).
        cohorts = {name for name in (cohort_before, queue.cohort) if name}
        if cohorts:
            for peer in ClusterQueue.objects.filter(cohort__in=cohorts).exclude(pk=queue.pk).order_by("name"):
                over += selectors.cluster_queue_over_quota(queue=peer)
        if over:
            changes["over_quota"] = over
    audit_record(actor=actor, team=None, action="cluster_queue.update", target=queue, data=changes)
    return queue, over


def cluster_queue_teams_check(*, queue: ClusterQueue, teams) -> None:
    """ConflictError unless `teams` (some: the queue closes to the others) keep every team whose local queues use
    `queue` (the API's PATCH and the Django admin)."""
    kept = {team.pk for team in teams}
    stranded = sorted(f"{q.team.name}/{q.name}" for q in queue.local_queues.select_related("team")
                      if q.team_id not in kept)
    if stranded:
        raise ConflictError(f"local queues of other teams use cluster queue {queue.name}: {', '.join(stranded)}; "
                            "point them at another cluster queue, or delete them, first")


def _quotas_replace(*, queue: ClusterQueue, quotas) -> None:
    types = {accel.slug: accel for accel in AcceleratorType.objects.all()}
    seen = set()
    rows = []
    for index, item in enumerate(quotas):
        slug = item.get("accelerator_type")
        if slug not in types:
            raise ValidationFailed(f"quotas[{index}]: unknown accelerator type {slug!r}", field="quotas")
        if slug in seen:
            raise ValidationFailed(f"quotas[{index}]: {slug} is listed twice", field="quotas")
        seen.add(slug)
        quota = ResourceQuota(cluster_queue=queue, accelerator_type=types[slug],
                              nominal_quota=item.get("nominal_quota"),
                              borrowing_limit=item.get("borrowing_limit"),
                              lending_limit=item.get("lending_limit"))
        try:  # (its clean() refuses a borrowing or lending limit in no cohort: ClusterQueue.quotas_needing_cohort)
            quota.full_clean(exclude=["cluster_queue"])
        except DjangoValidationError as exc:
            raise ValidationFailed(f"quotas[{index}]: {_quota_message(exc, slug)}", field="quotas") from exc
        rows.append(quota)
    queue.quotas.all().delete()
    ResourceQuota.objects.bulk_create(rows)


def _quota_message(exc: DjangoValidationError, slug: str) -> str:
    """A quota's model errors in one line: each under its field, a limit that needs a cohort under its type."""
    if not hasattr(exc, "error_dict"):
        return " ".join(exc.messages)
    return "; ".join(f"{slug if error.code == 'needs_cohort' else key}: {' '.join(error.messages)}"
                     for key, errors in exc.error_dict.items() for error in errors)


def local_queue_target_check(*, team: Team, cluster_queue: ClusterQueue) -> None:
    """ValidationFailed unless `cluster_queue` takes local queues of `team` (the API's create and the Django admin)."""
    if not cluster_queue.open_to_all_teams \
            and not cluster_queue.teams.filter(pk=team.pk).exists():
        raise ValidationFailed(f"cluster queue {cluster_queue.name} is not open to team {team.name} (an operator sets "
                               "the teams it takes)", field="cluster_queue")


@transaction.atomic
def local_queue_create(*, actor, team: Team, name: str, cluster_queue: ClusterQueue) -> LocalQueue:
    """A team's queue into `cluster_queue`, if the cluster queue takes that team's (found by QA: any team admin could
    point a queue at any cluster queue and so use its quota, `production` included)."""
    if LocalQueue.objects.filter(team=team, name=name).exists():
        raise ValidationFailed(f"team {team.name} already has a queue named {name!r}", field="name")
    # Locked as cluster_queue_update locks it, so a change of its teams cannot pass between this check and the
    # insert (review: a create beside a PATCH could pass both checks).
    cluster_queue = ClusterQueue.objects.select_for_update().get(pk=cluster_queue.pk)
    local_queue_target_check(team=team, cluster_queue=cluster_queue)
    queue = LocalQueue(team=team, name=name, cluster_queue=cluster_queue)
    queue.full_clean()
    queue.save()
    audit_record(actor=actor, team=team, action="local_queue.create", target=queue,
                 data={"name": name, "cluster_queue": cluster_queue.name})
    return queue


@transaction.atomic
def priority_class_create(*, actor, name: str, value: int, description: str = "",
                          preemptible: bool = True) -> PriorityClass:
    if PriorityClass.objects.filter(name=name).exists():
        raise ValidationFailed(f"a priority class named {name!r} already exists", field="name")
    priority = PriorityClass(name=name, value=value, description=description, preemptible=preemptible)
    priority.full_clean()
    priority.save()
    audit_record(actor=actor, team=None, action="priority_class.create", target=priority,
                 data={"name": name, "value": value})
    return priority
