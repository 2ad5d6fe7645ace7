"""Reads about deployments: lists, free serving capacity, the measured window and the metrics view."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import timedelta

from django.db.models import Prefetch, Q, QuerySet
from django.utils import timezone

from controlplane.cluster.models import Node, NodeHealth, NodePool
from controlplane.scheduling.mixed_load import replica_devices, replicas_fit
from inference.autoscaling import ObservedWindow, percentile
from inference.models import Deployment, DeploymentState, InferenceRequest
from jobs.models import TrainingJob
from jobs.states import JOB_MACHINE

# Longest window the metrics endpoint reads (and the longest per-minute series it draws).
MAX_WINDOW_S = 24 * 3600
# Words of the gateway's 503s for a deployment that takes no requests yet (gateway.services._check_serving): not
# counted as errors of the replicas by the autoscaling policy.
NOT_SERVING_YET = ("not serving yet", "has no running service yet")
SERIES_MAX_MINUTES = 61  # an hour's window touches 61 clock minutes (its oldest one partly)


def deployment_list(*, team_ids: list[int]) -> QuerySet[Deployment]:
    return Deployment.objects.filter(team_id__in=team_ids).select_related(
        "team", "local_queue", "priority_class", "source_job"
    )


def deployable_jobs(*, team_ids: list[int]) -> QuerySet[TrainingJob]:
    """The teams' training jobs a deployment can serve: those that wrote a checkpoint, and live ones (served
    once their first complete checkpoint is written). Finished jobs without a checkpoint are left out."""
    return TrainingJob.objects.filter(team_id__in=team_ids).filter(
        Q(last_checkpoint_step__gte=0) | ~Q(state__in=JOB_MACHINE.terminal_states())
    ).select_related("team").order_by("-created_at", "-id")


def deployment_pools(*, deployment: Deployment) -> list[NodePool]:
    """The node pools the deployment was placed on (its pinned pool, or every pool of its accelerator type),
    each with `node_rows`: its nodes by name. Empty before placement."""
    if not deployment.accelerator_type:
        return []
    pools = NodePool.objects.filter(accelerator_type__slug=deployment.accelerator_type)
    if deployment.pool:
        pools = pools.filter(name=deployment.pool)
    pools = list(pools.prefetch_related(Prefetch("nodes", queryset=Node.objects.order_by("name"),
                                                 to_attr="node_rows")).order_by("name"))
    return pools


# ------------------------------------------------------------------------------------------ capacity

def replica_capacity(*, accelerator_type: str, devices_per_replica: float, cpus_per_replica: float,
                     for_deployment: int | None = None) -> dict[str, int]:
    """How many replicas fit now on the live, uncordoned nodes of each pool of the type: {pool: replicas}.

    A replica sits on one node; a CPU replica needs only CPUs, an accelerator replica its devices (and a
    little CPU for the server process). Free is what the cluster last reported, but never more than the node's
    capacity less what the control plane knows is held there: admitted training gangs (their devices, or cores on
    the CPU pool, and the cores of their workers) and running replicas. A gang the scheduler placed has not
    reserved anything in Ray until its run starts, and a replica must not take it meanwhile. Nor does it take the
    devices the scheduling cycle holds for other deployments' wanted replicas (`capacity_held`; `for_deployment`: the
    one being placed, whose own hold is what it may use)."""
    from jobs.selectors import training_held_by_node

    fits: dict[str, int] = defaultdict(int)
    nodes = Node.objects.filter(pool__accelerator_type__slug=accelerator_type, health=NodeHealth.HEALTHY,
                                cordoned=False).select_related("pool").order_by("pool__name", "name")
    training_units, training_cpus = training_held_by_node()  # devices (cores on the CPU pool); workers' cores
    serving = serving_held_by_node(accelerator_type)
    held_for_others = held_for_wanted_replicas(exclude=for_deployment)
    for node in nodes:
        serving_devices, serving_cpus = serving.get(node.name, (0.0, 0.0))
        serving_devices += held_for_others.get(node.name, 0.0)
        if accelerator_type == "cpu":  # (what the cycle holds on a CPU node is cores)
            held_cpus = training_units.get(node.name, 0.0) + serving_cpus + held_for_others.get(node.name, 0.0)
        else:
            held_cpus = training_cpus.get(node.name, 0.0) + serving_cpus
        free_cpus = min(node.free_cpus, node.capacity_cpus - held_cpus)
        by_cpu = math.floor(free_cpus / cpus_per_replica + 1e-9) if cpus_per_replica > 0 else 10**6
        if accelerator_type == "cpu" or devices_per_replica <= 0:
            count = by_cpu
        else:
            held_devices = training_units.get(node.name, 0.0) + serving_devices
            free_devices = min(node.free_devices, node.capacity_devices - held_devices)
            # as the scheduling cycle places replicas: whole devices each, or shares packed per device (before,
            # 26 replicas of 0.6 "fit" 16 A100s, where the cycle holds 16; found by a review)
            count = min(by_cpu, replicas_fit(max(0.0, free_devices), devices_per_replica))
        fits[node.pool.name] += max(0, count)
    return dict(fits)


def held_for_wanted_replicas(*, exclude: int | None) -> dict[str, float]:
    """Devices (cores on CPU nodes) the last scheduling cycle held for wanted replicas that do not run yet, per node,
    of every deployment still waiting for them (live or PENDING) but `exclude`."""
    from inference.workflows import LIVE_STATES

    held: dict[str, float] = defaultdict(float)
    rows = Deployment.objects.filter(state__in=[*LIVE_STATES, DeploymentState.PENDING]).exclude(capacity_held=[])
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    for node, devices in (pair for pairs in rows.values_list("capacity_held", flat=True) for pair in pairs or []):
        held[str(node)] += float(devices)
    return held


def serving_held_by_node(accelerator_type: str) -> dict[str, tuple[float, float]]:
    """(devices of `accelerator_type`, CPU cores) the running replicas of live deployments hold on each node, from
    where the deployment sync last saw them (`observed["node_names"]`, as mixed load reads it). Cores count for
    replicas of every type: a CPU deployment spread over pools has no node selector, and Ray may run its replicas
    on accelerator nodes."""
    from inference.workflows import LIVE_STATES, replica_cpus

    held: dict[str, tuple[float, float]] = {}
    for deployment in Deployment.objects.filter(state__in=list(LIVE_STATES)):
        same_type = deployment.accelerator_type == accelerator_type and accelerator_type != "cpu"
        cores_each = replica_cpus(accelerator_type=deployment.accelerator_type or "cpu",
                                  devices_per_replica=float(deployment.devices_per_replica))
        names = [str(n) for n in (deployment.observed or {}).get("node_names") or ()][:deployment.replicas_ready]
        for name, count in Counter(names).items():
            # the devices its replicas there take as the cycle places them: fractions packed per whole device
            devices = replica_devices(count, float(deployment.devices_per_replica)) if same_type else 0.0
            before_devices, before_cpus = held.get(name, (0.0, 0.0))
            held[name] = (before_devices + devices, before_cpus + cores_each * count)
    return held


def serving_quota_usage(*, exclude_id: int | None = None) -> dict[tuple[str, str], float]:
    """Devices live deployments on accelerators hold per (cluster queue, type): their running replicas, and at least
    replicas_min each (what the training cycle's mixed load holds for them, as it counts them against quotas)."""
    from inference.workflows import LIVE_STATES

    usage: dict[tuple[str, str], float] = defaultdict(float)
    rows = Deployment.objects.filter(state__in=list(LIVE_STATES), devices_per_replica__gt=0).exclude(
        accelerator_type__in=["", "cpu"]).select_related("local_queue__cluster_queue")
    for deployment in rows:
        if deployment.pk == exclude_id:
            continue
        replicas = max(deployment.replicas_ready, deployment.replicas_min)
        usage[(deployment.local_queue.cluster_queue.name, deployment.accelerator_type)] += \
            replicas * float(deployment.devices_per_replica)
    return dict(usage)


def serving_quota_refusal(*, deployment: Deployment, accelerator_type: str, replicas: int) -> str:
    """Why `replicas` replicas of the deployment on `accelerator_type` exceed its ClusterQueue's quota (training jobs
    and other deployments counted, cohort borrowing as the scheduler allows it), or "" when they fit. The queue's own
    preemptible training does not hold them off: it gives the quota back, as it does to a replica a live deployment
    scales out to (mixed load)."""
    return _serving_quota_refusals(deployment, accelerator_type)(replicas)


def serving_quota_never(*, deployment: Deployment, accelerator_type: str, replicas: int) -> str:
    """Why `replicas` replicas of the deployment on `accelerator_type` exceed the most its ClusterQueue could ever
    take (its nominal quota and what its cohort could lend, with nothing else running), or ""."""
    from controlplane.scheduling.quota import QuotaLedger
    from jobs.admission import cluster_queue_specs

    ledger = QuotaLedger(cluster_queue_specs())
    queue = deployment.local_queue.cluster_queue.name
    need = replicas * float(deployment.devices_per_replica)
    if queue not in ledger.queues or accelerator_type == "cpu" or need <= 0:
        return ""
    ceiling = ledger.ceiling(queue, accelerator_type)
    if need <= ceiling + 1e-9:
        return ""
    return (f"{queue} can never take {need:g} {accelerator_type}: its nominal quota and the most its cohort could "
            f"lend add up to {ceiling:g}")


def serving_quota_replicas(*, deployment: Deployment, accelerator_type: str) -> int:
    """The most replicas of the deployment, up to replicas_max, that its ClusterQueue's quota takes on
    `accelerator_type` now (as `serving_quota_refusal` counts; 0 when not even one fits)."""
    refusal = _serving_quota_refusals(deployment, accelerator_type)
    low, high = 0, deployment.replicas_max  # refusal("") for `low` replicas; more replicas never fit better
    while low < high:
        middle = (low + high + 1) // 2
        if refusal(middle):
            high = middle - 1
        else:
            low = middle
    return low


def _serving_quota_refusals(deployment: Deployment, accelerator_type: str):
    """replicas -> serving_quota_refusal's answer, on one read of the quotas and their usage."""
    from controlplane.scheduling.mixed_load import serving_quota_refusal as refusal
    from controlplane.scheduling.quota import QuotaLedger
    from jobs.admission import cluster_queue_specs
    from jobs.selectors import quota_usage

    ledger = QuotaLedger(cluster_queue_specs())
    for usage in (quota_usage(), serving_quota_usage(exclude_id=deployment.pk)):
        for (queue, slug), amount in usage.items():
            if queue in ledger.queues:
                ledger.add(queue, slug, amount)
    queue = deployment.local_queue.cluster_queue.name
    giveable = quota_usage(preemptible_only=True).get((queue, accelerator_type), 0.0)
    per_replica = float(deployment.devices_per_replica)

    def refusal_for(replicas: int) -> str:
        return refusal(ledger, queue, accelerator_type, replicas * per_replica, giveable)

    return refusal_for


# ------------------------------------------------------------------------------------------ measurements

def _window_rows(deployment: Deployment, window_s: float, now):
    since = now - timedelta(seconds=window_s)
    return InferenceRequest.objects.filter(deployment=deployment, created_at__gte=since, created_at__lte=now)


def observed_window(*, deployment: Deployment, window_s: float, replicas_running: int = 0,
                    now=None) -> ObservedWindow:
    """The requests of the last `window_s` seconds, as the autoscaling core reads them."""
    now = now or timezone.now()
    rows = list(_window_rows(deployment, window_s, now).values_list("status_code", "ttft_ms", "tpot_ms",
                                                                    "output_tokens", "prompt_tokens",
                                                                    "cached_tokens"))
    ok = [row for row in rows if 200 <= row[0] < 300]
    prompt = sum(r[4] for r in ok)
    # 5xx and timeouts wanted service and got none: the policy counts them as SLA misses (QA: a deployment whose
    # replicas timed out looked idle to it). Not the gateway's "not serving yet" 503s: the state already says so.
    not_ready = _window_rows(deployment, window_s, now).filter(status_code=503).filter(
        Q(error__contains=NOT_SERVING_YET[0]) | Q(error__contains=NOT_SERVING_YET[1])).count() \
        if any(r[0] == 503 for r in rows) else 0
    return ObservedWindow(
        at=now.timestamp(), window_s=float(window_s), requests=len(rows),
        ttft_p95_ms=_round(percentile([r[1] for r in ok if r[1] is not None], 95)),
        tpot_p95_ms=_round(percentile([r[2] for r in ok if r[2] is not None], 95)),
        errors=sum(1 for r in rows if r[0] >= 500) - not_ready, overloaded=sum(1 for r in rows if r[0] == 429),
        timeouts=sum(1 for r in rows if r[0] == 504),
        replicas_running=replicas_running, measured=len(ok),
        output_tokens_per_s=round(sum(r[3] for r in ok) / window_s, 3) if window_s else None,
        cache_hit_rate=round(sum(r[5] for r in ok) / prompt, 4) if prompt else None,
    )


def deployment_metrics(*, deployment: Deployment, window_s: int, now=None) -> dict:
    """What the requests of the last `window_s` seconds measured, and a per-minute series for the console."""
    now = now or timezone.now()
    window_s = max(1, min(int(window_s), MAX_WINDOW_S))
    rows = list(_window_rows(deployment, window_s, now).values_list(
        "created_at", "status_code", "ttft_ms", "tpot_ms", "queue_ms", "prompt_tokens", "cached_tokens",
        "output_tokens"))
    ok = [row for row in rows if 200 <= row[1] < 300]
    statuses = Counter(str(row[1]) for row in rows)
    prompt = sum(row[5] for row in ok)
    cached = sum(row[6] for row in ok)
    output = sum(row[7] for row in ok)
    return {
        "window_s": window_s,
        "at": now,
        "requests": len(rows),
        "succeeded": len(ok),
        "errors": {code: count for code, count in sorted(statuses.items()) if not code.startswith("2")},
        "ttft_ms": {"p50": _pct(ok, 2, 50), "p95": _pct(ok, 2, 95), "p99": _pct(ok, 2, 99)},
        "tpot_ms": {"p50": _pct(ok, 3, 50), "p95": _pct(ok, 3, 95)},
        "queue_ms": {"p95": _pct(ok, 4, 95)},
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": output,
        "output_tokens_per_s": round(output / window_s, 3),
        "cache_hit_rate": round(cached / prompt, 4) if prompt else None,
        "replicas": {"ready": deployment.replicas_ready, "target": deployment.replicas_target,
                     "min": deployment.replicas_min, "max": deployment.replicas_max},
        "sla": {"ttft_p95_ms": deployment.sla_ttft_p95_ms, "tpot_p95_ms": deployment.sla_tpot_p95_ms,
                "min_throughput_tps": deployment.sla_min_throughput_tps},
        "series": _per_minute(rows, now, window_s),
    }


def _per_minute(rows, now, window_s: int) -> list[dict]:
    """One point per clock minute the window touches (the oldest and the current minute are partial), the last
    `SERIES_MAX_MINUTES` at most. Before, the series had ceil(window / 60) points ending at the current minute, so
    requests in the window's oldest partial minute were in the totals but in no point."""
    current = now.replace(second=0, microsecond=0)
    first = (now - timedelta(seconds=window_s)).replace(second=0, microsecond=0)
    minutes = min(SERIES_MAX_MINUTES, max(1, int((current - first).total_seconds() // 60) + 1))
    start = current - timedelta(minutes=minutes - 1)
    buckets: dict[int, list] = defaultdict(list)
    for row in rows:
        index = int((row[0] - start).total_seconds() // 60)
        if 0 <= index < minutes:
            buckets[index].append(row)
    series = []
    for index in range(minutes):
        bucket = buckets.get(index, [])
        ok = [row for row in bucket if 200 <= row[1] < 300]
        series.append({"minute": start + timedelta(minutes=index), "requests": len(bucket),
                       "errors": len(bucket) - len(ok), "ttft_p95_ms": _pct(ok, 2, 95),
                       "tpot_p95_ms": _pct(ok, 3, 95), "output_tokens": sum(row[7] for row in ok)})
    return series


def _pct(rows, column: int, q: float) -> float | None:
    return _round(percentile([row[column] for row in rows if row[column] is not None], q))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
