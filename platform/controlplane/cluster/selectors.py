"""Reads about the cluster inventory."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet, Sum

from controlplane.cluster.models import AcceleratorType, Node, NodeHealth, NodePool


def accelerator_type_list() -> QuerySet[AcceleratorType]:
    return AcceleratorType.objects.all()


def node_pool_list() -> QuerySet[NodePool]:
    healthy = Q(nodes__health=NodeHealth.HEALTHY)
    return NodePool.objects.select_related("accelerator_type").annotate(
        node_count=Count("nodes"),
        healthy_node_count=Count("nodes", filter=healthy),
        capacity_devices=Sum("nodes__capacity_devices", filter=healthy, default=0.0),
        free_devices=Sum("nodes__free_devices", filter=healthy, default=0.0),
    ).order_by("name")


def node_list() -> QuerySet[Node]:
    return Node.objects.select_related("pool", "pool__accelerator_type")


def node_pools_for_planning(*, names: list[str]) -> dict[str, NodePool]:
    """The named pools with ``ready_node_count``: healthy, uncordoned nodes, the ones a plan can use."""
    ready = Q(nodes__health=NodeHealth.HEALTHY, nodes__cordoned=False)
    pools = NodePool.objects.select_related("accelerator_type").filter(name__in=names).annotate(
        ready_node_count=Count("nodes", filter=ready))
    return {pool.name: pool for pool in pools}
