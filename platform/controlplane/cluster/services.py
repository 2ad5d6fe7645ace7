"""Writes about the cluster inventory: seeding chip facts, pools, and syncing nodes from the backend."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from controlplane.cluster.accelerator_facts import ACCELERATOR_FACTS
from controlplane.cluster.models import AcceleratorType, Node, NodeHealth, NodePool
from controlplane.common.errors import ValidationFailed
from controlplane.compute.base import ObservedNode
from controlplane.compute.topology import ACCEL_RESOURCE_PREFIX
from controlplane.tenancy.services import audit_record

FACT_FIELDS = ("vendor", "model", "bf16_dense_tflops", "fp8_dense_tflops", "memory_gb",
               "memory_bandwidth_gbps", "interconnect", "price_per_hour_usd", "sources", "notes")


@transaction.atomic
def accelerator_types_seed(*, actor=None) -> list[AcceleratorType]:
    """Create or refresh the built-in accelerator types from their published facts. Idempotent."""
    result = []
    for facts in ACCELERATOR_FACTS:
        values = {name: facts[name] for name in FACT_FIELDS}
        values = {key: ("" if value is None and key in {"interconnect", "notes"} else value)
                  for key, value in values.items()}
        if values["price_per_hour_usd"] is not None:
            values["price_per_hour_usd"] = Decimal(str(values["price_per_hour_usd"]))
        accel, created = AcceleratorType.objects.update_or_create(slug=facts["slug"], defaults=values)
        if created:
            audit_record(actor=actor, team=None, action="accelerator_type.create", target=accel,
                         data={"slug": accel.slug}, system="seed")
        result.append(accel)
    return result


@transaction.atomic
def node_pool_create(*, actor, name: str, accelerator_type: AcceleratorType, devices_per_node: int,
                     simulated: bool, description: str = "", intra_node_gbps: float | None = None,
                     inter_node_gbps: float | None = None) -> NodePool:
    """``intra_node_gbps`` / ``inter_node_gbps`` left None mean the accelerator type's assumed defaults."""
    if NodePool.objects.filter(name=name).exists():
        raise ValidationFailed(f"a node pool named {name!r} already exists", field="name")
    if accelerator_type.slug != "cpu" and devices_per_node < 1:  # (accepted before 2026-11-29: QA)
        raise ValidationFailed(f"a pool of {accelerator_type.slug} needs at least 1 device per node",
                               field="devices_per_node")
    pool = NodePool(name=name, accelerator_type=accelerator_type, devices_per_node=devices_per_node,
                    simulated=simulated, description=description, intra_node_gbps=intra_node_gbps,
                    inter_node_gbps=inter_node_gbps)
    pool.full_clean()
    pool.save()
    audit_record(actor=actor, team=None, action="node_pool.create", target=pool,
                 data={"name": name, "accelerator_type": accelerator_type.slug, "simulated": simulated,
                       "intra_node_gbps": intra_node_gbps, "inter_node_gbps": inter_node_gbps})
    return pool


@transaction.atomic
def node_set_cordoned(*, actor, node: Node, cordoned: bool, reason: str = "") -> Node:
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.cordoned != cordoned:
        node.cordoned = cordoned
        node.save(update_fields=["cordoned"])
        audit_record(actor=actor, team=None, action="node.cordon" if cordoned else "node.uncordon",
                     target=node, data={"reason": reason})
    return node


@transaction.atomic
def nodes_sync(*, observed: list[ObservedNode]) -> dict[str, int]:
    """Make the Node table match what the compute backend observes. Idempotent; safe to run twice.

    Nodes of pools that are not registered are ignored (and counted); nodes no longer reported are
    marked unreachable rather than deleted, so their history and cordon flag survive a blip.
    """
    pools = {pool.name: pool for pool in NodePool.objects.select_related("accelerator_type")}
    now = timezone.now()
    seen, unknown_pool, changed = set(), 0, 0
    existing = {node.name: node for node in Node.objects.select_for_update()}
    for item in observed:
        pool = pools.get(item.pool)
        if pool is None:
            unknown_pool += 1
            continue
        resource = ACCEL_RESOURCE_PREFIX + pool.accelerator_type.slug
        values = {
            "pool": pool,
            "ray_node_id": item.node_id,
            "address": item.address,
            "leaf_group": item.leaf_group,
            "health": NodeHealth.HEALTHY if item.alive else NodeHealth.UNREACHABLE,
            "capacity_devices": item.capacity.get(resource, 0.0),
            "free_devices": item.free.get(resource, 0.0) if item.alive else 0.0,
            "capacity_cpus": item.capacity.get("CPU", 0.0),
            "free_cpus": item.free.get("CPU", 0.0) if item.alive else 0.0,
            "labels": item.labels,
            "simulated": item.simulated,
        }
        if item.alive:
            values["last_seen_at"] = now
        else:  # a dead node reports no resources: keep the last known capacity for the record
            for key in ("capacity_devices", "capacity_cpus"):
                values.pop(key)
        node = existing.get(item.name)
        if node is None:
            node = Node.objects.create(name=item.name, **values)
            audit_record(actor=None, team=None, action="node.discover", target=node, system="reconciler",
                         data={"pool": pool.name, "alive": item.alive, "ray_node_id": item.node_id})
            changed += 1
        elif any(getattr(node, key) != value for key, value in values.items() if key != "last_seen_at") \
                or item.alive:
            if node.health != values["health"]:
                audit_record(actor=None, team=None, action=f"node.{values['health']}", target=node,
                             system="reconciler", data={"was": node.health})
            for key, value in values.items():
                setattr(node, key, value)
            node.save()
            changed += 1
        seen.add(item.name)
    gone = [node for name, node in existing.items() if name not in seen and node.health != NodeHealth.UNREACHABLE]
    for node in gone:
        audit_record(actor=None, team=None, action="node.unreachable", target=node, system="reconciler",
                     data={"was": node.health, "why": "no longer reported by the cluster"})
    gone = [node.pk for node in gone]
    Node.objects.filter(pk__in=gone).update(health=NodeHealth.UNREACHABLE, free_devices=0, free_cpus=0)
    return {"observed": len(observed), "updated": changed, "lost": len(gone), "unknown_pool": unknown_pool}
