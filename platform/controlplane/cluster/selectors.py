"""Reads about the cluster inventory."""

from __future__ import annotations

import math

from django.db.models import Count, Q, QuerySet, Sum

from controlplane.cluster.models import AcceleratorType, Node, NodeHealth, NodePool


def accelerator_type_list() -> QuerySet[AcceleratorType]:
    return AcceleratorType.objects.all()


def node_pool_list() -> QuerySet[NodePool]:
    """Pools with their node counts and devices: capacity on healthy nodes; free devices on healthy nodes that are
    not cordoned, where work can start (a cordoned node's free devices counted too before 2026-11-29, while the
    dry-run plan and the scheduler left them out: QA)."""
    healthy = Q(nodes__health=NodeHealth.HEALTHY)
    return NodePool.objects.select_related("accelerator_type").annotate(
        node_count=Count("nodes"),
        healthy_node_count=Count("nodes", filter=healthy),
        capacity_devices=Sum("nodes__capacity_devices", filter=healthy, default=0.0),
        free_devices=Sum("nodes__free_devices", filter=healthy & Q(nodes__cordoned=False), default=0.0),
    ).order_by("name")


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool", "pool__accelerator_type")


def cpus_per_device(*, accelerator_type: str) -> float | None:
    """The fewest CPU cores per device on any known node of an accelerator type (None when none is known), cordoned or
    unreachable ones too: it is the hardware's, and what was reserved at launch is counted by it later, so it must
    not move when a node is cordoned or comes back. A worker asking at most that many cores per device fits any
    node its devices fit, whatever else runs there, so placing workers by devices never over-commits cores (the
    scheduling core counts devices only)."""
    ratios = [cpus / devices for cpus, devices in Node.objects.filter(
        pool__accelerator_type__slug=accelerator_type, capacity_devices__gt=0).values_list(
        "capacity_cpus", "capacity_devices")]
    return min(ratios) if ratios else None


def cores_share(ratio: float, devices: float) -> float:
    """`ratio` cores per device times `devices`, rounded down to Ray's resource precision (1e-4): several shares on
    one node never add up to more than it has."""
    return math.floor(ratio * devices * 10_000 + 1e-6) / 10_000


def capped_cores(asked: float, ratio: float | None, devices: float) -> float:
    """`asked` cores, but at most the share `devices` come with at `ratio` cores per device (`asked` when the ratio
    is unknown): what a training worker or a replica reserves on an accelerator node."""
    return asked if ratio is None else min(asked, cores_share(ratio, devices))


def node_pools_for_planning(*, names: list[str] | None = None) -> dict[str, NodePool]:
    """The named pools (every pool when `names` is None), by name, with ``ready_node_count``: healthy, uncordoned
    nodes, the ones a plan can use."""
    ready = Q(nodes__health=NodeHealth.HEALTHY, nodes__cordoned=False)
    pools = NodePool.objects.select_related("accelerator_type")
    if names is not None:
        pools = pools.filter(name__in=names)
    pools = pools.annotate(ready_node_count=Count("nodes", filter=ready)).order_by("name")
    return {pool.name: pool for pool in pools}


def simulated_pool_flags() -> tuple[dict[str, bool], dict[str, bool]]:
    """({pool name: simulated}, {accelerator type slug: every pool of the type simulated}) for labelling."""
    by_pool: dict[str, bool] = {}
    by_type: dict[str, bool] = {}
    for name, slug, simulated in NodePool.objects.values_list("name", "accelerator_type__slug", "simulated"):
        by_pool[name] = simulated
        by_type[slug] = by_type.get(slug, True) and simulated
    return by_pool, by_type


def _unit(slug: str) -> str:
    """What a pool of this accelerator type counts: CPU cores for `cpu`, devices otherwise."""
    return "CPUs" if slug == "cpu" else "devices"


def node_utilization(*, held: dict[str, float] | None = None) -> list[dict]:
    """Every node with what it has in use (CPUs on `cpu` pools).

    In use = the larger of what the node reports taken (capacity - free, as last observed: serving
    replicas and, on Ray, the actors of training gangs) and `held`, the units admitted training gangs are
    placed on it ({node name: units}, from the scheduler's placements: counted from admission on, before
    their actors start). The larger, not the sum, so a gang seen both ways is counted once.
    `fraction` is None for a node with no capacity."""
    held = held or {}
    rows = []
    for node in node_list():
        slug = node.pool.accelerator_type.slug
        capacity, free = ((node.capacity_cpus, node.free_cpus) if slug == "cpu"
                          else (node.capacity_devices, node.free_devices))
        used = min(capacity, max(0.0, capacity - free, held.get(node.name, 0.0)))
        rows.append({"id": node.pk, "name": node.name, "pool": node.pool.name, "pool_id": node.pool_id,
                     "accelerator_type": slug, "unit": _unit(slug), "capacity": capacity, "used": used,
                     "fraction": used / capacity if capacity else None, "health": node.health,
                     "cordoned": node.cordoned, "simulated": node.simulated})
    return rows


def cluster_utilization(*, held: dict[str, float] | None = None) -> dict:
    """Use of the cluster per node pool and per accelerator type, with what it costs per hour.

    Summed over healthy nodes from `node_utilization` (see there for what counts as in use). Cost per
    hour = units in use x the accelerator type's price per device-hour (per vCPU-hour for `cpu`); a
    simulated pool's logical chips are priced as the real chip type they stand for. A type with no known
    price adds no cost and is listed in `unpriced` when some of it is in use.
    """
    per_pool: dict[int, dict[str, float]] = {}
    for node in node_utilization(held=held):
        if node["health"] != NodeHealth.HEALTHY:
            continue
        totals = per_pool.setdefault(node["pool_id"], {"capacity": 0.0, "used": 0.0})
        totals["capacity"] += node["capacity"]
        totals["used"] += node["used"]
    pools = []
    by_type: dict[str, dict] = {}
    for pool in node_pool_list():
        accel = pool.accelerator_type
        unit = _unit(accel.slug)
        totals = per_pool.get(pool.pk, {"capacity": 0.0, "used": 0.0})
        capacity, used = totals["capacity"], totals["used"]
        price = float(accel.price_per_hour_usd) if accel.price_per_hour_usd is not None else None
        row = {"name": pool.name, "accelerator_type": accel.slug, "unit": unit, "simulated": pool.simulated,
               "nodes": pool.node_count, "healthy_nodes": pool.healthy_node_count, "capacity": capacity,
               "used": used, "fraction": used / capacity if capacity else None, "price_per_hour": price,
               "cost_per_hour": used * price if price is not None else None}
        pools.append(row)
        kind = by_type.setdefault(accel.slug, {
            "accelerator_type": accel.slug, "label": f"{accel.vendor} {accel.model}".strip(), "unit": unit,
            "capacity": 0.0, "used": 0.0, "price_per_hour": price, "pools": [], "simulated": False,
        })
        kind["capacity"] += capacity
        kind["used"] += used
        kind["pools"].append(pool.name)
        kind["simulated"] = kind["simulated"] or pool.simulated
    types = sorted(by_type.values(), key=lambda kind: kind["accelerator_type"])
    for kind in types:
        kind["fraction"] = kind["used"] / kind["capacity"] if kind["capacity"] else None
        kind["cost_per_hour"] = kind["used"] * kind["price_per_hour"] if kind["price_per_hour"] is not None else None
    devices = [kind for kind in types if kind["unit"] == "devices"]
    return {
        "pools": pools,
        "types": types,
        "devices_capacity": sum(kind["capacity"] for kind in devices),
        "devices_used": sum(kind["used"] for kind in devices),
        "devices_fraction": (sum(kind["used"] for kind in devices) / sum(kind["capacity"] for kind in devices)
                             if sum(kind["capacity"] for kind in devices) else None),
        "cost_per_hour": sum(kind["cost_per_hour"] or 0.0 for kind in types),
        "unpriced": [kind["accelerator_type"] for kind in types if kind["price_per_hour"] is None and kind["used"]],
    }


def never_hold_reason(*, accelerator_type: str, units: float, members: int) -> str:
    """Why the type's nodes, every one of them back in service (cordoned or unhealthy ones too: they may come back; a
    review), could never hold `members` workers (replicas) of `units` even with nothing running (before, the plan of
    such a gang said it "waits in the queue", and the job then waited for good; found by QA), or "". The dry run of a
    spec says it, and so does a deployment that waits for room (inference.workflows.choose_placement)."""
    slug = accelerator_type
    capacities = [cpus if slug == "cpu" else devices for devices, cpus in
                  Node.objects.filter(pool__accelerator_type__slug=slug).values_list("capacity_devices",
                                                                                    "capacity_cpus")]
    if units <= 0 or not capacities:
        return ""
    if units >= 1 - 1e-9:
        most = sum(int(capacity) // math.ceil(units - 1e-9) for capacity in capacities)
    else:
        most = sum(int(capacity) * int((1 + 1e-9) // units) for capacity in capacities)
    if most >= members:
        return ""
    return (f"{slug} nodes can never hold it: its {len(capacities)} nodes (the largest with "
            f"{int(max(capacities))} {'CPU cores' if slug == 'cpu' else 'devices'}) would hold at most {most} x "
            f"{units:g} even all in service with nothing running, it needs {members}")
