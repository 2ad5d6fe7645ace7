"""Reads for a spec's plan: which accepted accelerator type it would get and why, what it costs per hour,
and where it would wait. An estimate from the same facts the scheduler reads (prices, free capacity,
quota, the waiting jobs); the scheduling cycle makes the real choice at admission."""

from __future__ import annotations

import math

from django.db.models import Q

from controlplane.cluster.models import AcceleratorType, Node, NodeHealth
from controlplane.cluster.selectors import never_hold_reason
from controlplane.quotas.models import LocalQueue, PriorityClass, ResourceQuota
from controlplane.quotas.selectors import check_workload_request
from controlplane.scheduling.mixed_load import serving_quota_refusal
from controlplane.scheduling.quota import non_preemptible_refusal, reserved_capacity_refusal
from jobs.models import TrainingJob, placed_units
from jobs.selectors import quota_usage

JOB = "training_job"


def spec_plan(*, kind: str, name: str, local_queue: LocalQueue, priority_class: PriorityClass | None,
              accelerator_types: list[str], units_by_type: dict[str, float], members: int,
              workload_class: str = "builtin_lm") -> dict:
    """`units_by_type`: what one worker (or replica) takes of each type (CPU cores on `cpu`). A job's type is
    chosen as the scheduling cycle chooses it: the first type, cheapest per unit of work first, with room."""
    check_workload_request(local_queue=local_queue, accelerator_types=accelerator_types)
    types = {t.slug: t for t in AcceleratorType.objects.filter(slug__in=accelerator_types)}
    cluster_queue = local_queue.cluster_queue
    quotas = {q.accelerator_type.slug: q for q in
              ResourceQuota.objects.filter(cluster_queue=cluster_queue).select_related("accelerator_type")}
    training = quota_usage()
    used = training if kind == JOB else {}
    ledger = _quota_ledger(training)
    queue_name = cluster_queue.name
    giveable = quota_usage(preemptible_only=True)  # training that gives quota back (to serving, to non-preemptible)
    non_preemptible = kind == JOB and priority_class is not None and not priority_class.preemptible
    # what the cycle counts as its queue's non-preemptible usage: jobs of non-preemptible classes only (a preemptible
    # job STARTING is not giveable now, but it is not fixed either; counted so, it refused what the cycle admits)
    fixed_usage = quota_usage(non_preemptible_only=True) if non_preemptible else {}
    if non_preemptible:
        from jobs.admission import non_preemptible_caps_now

        caps = non_preemptible_caps_now()
    options = []
    held = _held_by_node()  # what every type's nodes hold, read once for the types below
    for slug in accelerator_types:
        units = units_by_type[slug]
        price = types[slug].price_per_hour_usd if slug in types else None
        need = units * members
        cost = None if price is None else round(float(price) * need, 4)
        free_by_node = _free_by_node(slug, held)
        placeable = _placeable_members(free_by_node, units)
        quota = quotas.get(slug)
        quota_left = None if quota is None else quota.nominal_quota - used.get((cluster_queue.name, slug), 0.0)
        quota_why = ""
        if kind != JOB and (slug == "cpu" or units <= 0):
            quota_left, fits_quota = None, True  # CPU replicas are not counted against quota (they take host CPUs)
        elif queue_name in ledger.queues:
            # as the scheduling cycle checks it: nominal, then what the cohort lends (before, only the nominal
            # quota counted: a job the cycle admits by borrowing was planned on another type, "quota left -8"; and
            # a deployment's plan counted nobody's usage)
            quota_left = _quota_room(ledger, queue_name, slug)
            if kind == JOB:
                check = ledger.check(queue_name, slug, need)
                fits_quota, quota_why = check.ok, check.reason
                if fits_quota and non_preemptible:  # the cycle's rule 3: no borrowing for non-preemptible work
                    fixed = fixed_usage.get((queue_name, slug), 0.0)
                    quota_why = non_preemptible_refusal(queue_name, slug, fixed, need,
                                                        ledger.quota(queue_name, slug).nominal)
                    if not quota_why and slug in caps:  # and kept off capacity deployments reserved
                        total = sum(amount for (_, kind), amount in fixed_usage.items() if kind == slug)
                        quota_why = reserved_capacity_refusal(slug, total, need, caps[slug])
                    fits_quota = not quota_why
            else:  # as the deploy check counts replicas (inference.selectors.serving_quota_refusal)
                quota_why = serving_quota_refusal(ledger, queue_name, slug, need,
                                                  giveable.get((queue_name, slug), 0.0))
                fits_quota = not quota_why
        else:
            fits_quota = quota_left is None or quota_left + 1e-9 >= need
        free_units = float(sum(free_by_node))
        fits_capacity = placeable >= members
        # (a deployment's CPU replica is sized in cores elsewhere: units here are not them; a review)
        never = "" if kind != JOB and slug == "cpu" else never_hold_reason(accelerator_type=slug, units=units,
                                                                            members=members)
        if kind == JOB:
            need = placed_units(slug, units) * members  # as the cycle counts it (a review)
        # (a deployment's replicas too, as its deploy says it: inference.selectors.serving_quota_never)
        if not never and (kind == JOB or (slug != "cpu" and units > 0)) and queue_name in ledger.queues:
            # (a non-preemptible job never borrows; what deployments reserve changes, so it is no "never")
            nominal = ledger.quota(queue_name, slug).nominal
            ceiling = nominal if non_preemptible else ledger.ceiling(queue_name, slug)
            if need > ceiling + 1e-9:
                never = (f"{queue_name} can never take {need:g} {slug} for non-preemptible work: its nominal quota is "
                         f"{nominal:g}" if non_preemptible else
                         f"{queue_name} can never take {need:g} {slug}: its nominal quota and the most its cohort "
                         f"could lend add up to {ceiling:g}")
        options.append({
            "accelerator_type": slug, "unit": "CPU cores" if slug == "cpu" else "devices", "units": need,
            "price_per_unit_hour_usd": None if price is None else float(price), "cost_per_hour_usd": cost,
            "free_units": free_units, "placeable_members": placeable, "quota_left": quota_left,
            "fits_now": fits_capacity and fits_quota and not never, "never": bool(never),
            "why_not": never or _why_not(slug, members, units, placeable, fits_capacity, fits_quota, quota_left,
                                         need, quota_why),
        })
    preference = []
    if kind == JOB:
        from jobs.admission import type_preference

        preference = type_preference(workload_class=workload_class, accepted=list(accelerator_types))
    chosen = _choose(kind, options, preference)
    plan = {"kind": kind, "name": name, "members": members, "options": options, "chosen": chosen, "notes": []}
    if kind == JOB:
        plan["queue"] = _queue_position(local_queue, priority_class, fits=bool(chosen and chosen["fits_now"]))
        plan["notes"].append("an estimate: the scheduling cycle chooses the type at admission, by cost per unit "
                             "of work (measured throughput where known)")
    else:
        plan["queue"] = {"local_queue": local_queue.name, "cluster_queue": cluster_queue.name, "position": None,
                         "waiting_ahead": None}
    return plan


def _why_not(slug: str, members: int, units: float, placeable: int, fits_capacity: bool, fits_quota: bool,
             quota_left: float | None, need: float, quota_why: str) -> str:
    """Why the type does not fit now: no room, no quota, or both (before 2026-11-29 only the first)."""
    reasons = []
    if not fits_capacity:
        reasons.append(f"not enough free {slug}: {members} x {units:g} needed, {placeable} fit now")
    if not fits_quota:
        # (a rule rather than the amount: before, "quota left 56 < 8 (non-preemptible workloads would ...)")
        reasons.append(quota_why if quota_why and quota_left is not None and quota_left + 1e-9 >= need
                       else f"quota left {quota_left:g} < {need:g}" + (f" ({quota_why})" if quota_why else ""))
    return "; ".join(reasons)


def _quota_ledger(training: dict[tuple[str, str], float]):
    """The quotas and what training (`training`: quota_usage()) and serving use of them now, as the scheduling cycle's
    quota check reads them."""
    from controlplane.scheduling.quota import QuotaLedger
    from inference.selectors import serving_quota_usage
    from jobs.admission import cluster_queue_specs

    ledger = QuotaLedger(cluster_queue_specs())
    for usage in (training, serving_quota_usage()):
        for (queue, slug), amount in usage.items():
            if queue in ledger.queues:
                ledger.add(queue, slug, amount)
    return ledger


def _quota_room(ledger, queue: str, slug: str) -> float:
    """The most `queue` may take of `slug` now: its idle nominal quota alone, or with a cohort what the cohort lends
    (within its borrowing limit); never below 0."""
    quota = ledger.quota(queue, slug)
    used = ledger.usage[(queue, slug)]
    if not ledger.queues[queue].cohort:
        return max(0.0, quota.nominal - used)
    room = ledger.cohort_room(queue, slug)
    if quota.borrowing_limit is not None:
        room = min(room, quota.nominal + quota.borrowing_limit - used)
    return max(0.0, room)


def _choose(kind: str, options: list[dict], preference: list) -> dict | None:
    """`preference`: for a job, the accepted types as the scheduling cycle ranks them (TypeChoice, best first)."""
    if not options:
        return None
    fitting = [o for o in options if o["fits_now"]]
    if kind != JOB:  # deployments are placed on the first accepted type with room, in the listed order
        pick = fitting[0] if fitting else options[0]
        reason = ("the first accepted type with room (deployments are placed in the order listed)" if fitting
                  else f"nothing has room now ({pick['why_not']}); it waits for the first type that does")
        return {"accelerator_type": pick["accelerator_type"], "cost_per_hour_usd": pick["cost_per_hour_usd"],
                "fits_now": pick["fits_now"], "reason": reason}
    by_type = {o["accelerator_type"]: o for o in options}
    ranked = [(choice, by_type[choice.accelerator_type]) for choice in preference if choice.accelerator_type in by_type]
    ranked += [(None, o) for o in options if o["accelerator_type"] not in {c.accelerator_type for c, _ in ranked}]
    best_choice, best = ranked[0]
    why_best = best_choice.reason if best_choice is not None else "no throughput or price known"
    room = [(choice, o) for choice, o in ranked if o["fits_now"]]
    if room and room[0][1] is best:
        pick, reason = best, f"{why_best}; it has room now"
    elif room:
        pick = room[0][1]
        reason = (f"{best['accelerator_type']} would be cheapest per unit of work but has no room now "
                  f"({best['why_not']}); {pick['accelerator_type']} is the next accepted type with room")
    elif all(o["never"] for o in options):
        pick = best
        reason = (f"it can never run as asked ({'; '.join(o['why_not'] for o in options)}): it would wait in the "
                  "queue for good; ask for fewer workers or devices, or an operator for more quota or nodes")
    else:
        possible = [(choice, o) for choice, o in ranked if not o["never"]]
        pick = possible[0][1]
        why = why_best if possible[0][1] is best else \
            (possible[0][0].reason if possible[0][0] is not None else "no throughput or price known")
        reason = (f"nothing fits now ({'; '.join(o['why_not'] for o in options)}); it waits in the queue for "
                  f"{pick['accelerator_type']} ({why})")
    return {"accelerator_type": pick["accelerator_type"], "cost_per_hour_usd": pick["cost_per_hour_usd"],
            "fits_now": pick["fits_now"], "reason": reason}


def _ready_nodes(slug: str):
    return Node.objects.filter(pool__accelerator_type__slug=slug, health=NodeHealth.HEALTHY, cordoned=False)


def _placeable_members(free_by_node: list[float], units: float) -> int:
    """How many workers of this shape fit on the free capacity now (a worker never spans nodes)."""
    if units <= 0:
        units = 1.0
    return sum(math.floor(free / units + 1e-9) for free in free_by_node)


def _held_by_node() -> tuple[dict[str, float], dict[str, float]]:
    """(units admitted training gangs hold per node, units the cycle holds for wanted replicas per node): the same for
    every type, so read once per plan."""
    from inference.selectors import held_for_wanted_replicas
    from jobs.selectors import training_held_by_node

    return training_held_by_node()[0], held_for_wanted_replicas(exclude=None)


def _free_by_node(slug: str, held_by_node: tuple[dict[str, float], dict[str, float]]) -> list[float]:
    """Units (devices; CPU cores on `cpu`) free on each ready node of the type: what the cluster last reported, but
    never more than the node's capacity less what the control plane knows is held there (admitted training gangs,
    running replicas, devices the cycle holds for wanted replicas), as inference.selectors.replica_capacity reads it.
    A gang admitted since the last report has reserved nothing in Ray yet: the plan counted its devices free and said
    "fits now" for a job the cycle then queued behind it."""
    from inference.selectors import serving_held_by_node

    training_units, wanted = held_by_node
    serving = serving_held_by_node(slug)
    free = []
    for name, free_devices, free_cpus, capacity_devices, capacity_cpus in _ready_nodes(slug).values_list(
            "name", "free_devices", "free_cpus", "capacity_devices", "capacity_cpus"):
        serving_devices, serving_cpus = serving.get(name, (0.0, 0.0))
        held = training_units.get(name, 0.0) + wanted.get(name, 0.0)
        if slug == "cpu":
            free.append(max(0.0, min(free_cpus, capacity_cpus - held - serving_cpus)))
        else:
            free.append(max(0.0, min(free_devices, capacity_devices - held - serving_devices)))
    return free


def _queue_position(local_queue: LocalQueue, priority_class: PriorityClass | None, *, fits: bool) -> dict:
    """Where a new job would wait: behind every waiting job of its cluster queue with the same or a higher
    priority (FIFO within a priority, as the scheduling cycle orders them)."""
    value = priority_class.value if priority_class else 0
    same_or_higher = Q(priority_class__value__gte=value)
    if value <= 0:  # a job without a priority class counts as 0
        same_or_higher |= Q(priority_class__isnull=True)
    ahead = TrainingJob.objects.filter(state="QUEUED", local_queue__cluster_queue=local_queue.cluster_queue).filter(
        same_or_higher).count()
    return {"local_queue": local_queue.name, "cluster_queue": local_queue.cluster_queue.name,
            "position": ahead + 1, "waiting_ahead": ahead,
            "admission": "at the next scheduling cycle" if fits and ahead == 0 else "after the jobs ahead, when room"}


def _money(value) -> str:
    return "price unknown" if value is None else f"${value:,.2f}"
