"""Django admin for accelerator types, node pools and observed nodes."""

from django.contrib import admin

from controlplane.cluster.models import AcceleratorType, Node, NodePool
from controlplane.tenancy.admin import AuditedAdmin


@admin.register(AcceleratorType)
class AcceleratorTypeAdmin(AuditedAdmin):
    list_display = ["slug", "vendor", "model", "bf16_dense_tflops", "memory_gb", "price_per_hour_usd"]
    search_fields = ["slug", "vendor", "model"]


@admin.register(NodePool)
class NodePoolAdmin(AuditedAdmin):
    list_display = ["name", "accelerator_type", "devices_per_node", "intra_node_gbps", "inter_node_gbps", "simulated"]
    list_filter = ["simulated", "accelerator_type"]

    def has_delete_permission(self, request, obj=None):
        """Not while it has nodes: deleting it deleted them with it, jobs placed on them included (QA). Its nodes
        leave when Ray no longer reports them."""
        if obj is not None and obj.nodes.exists():
            return False
        return super().has_delete_permission(request, obj)


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "pool", "leaf_group", "health", "cordoned", "capacity_devices", "free_devices",
                    "simulated", "last_seen_at"]
    list_filter = ["pool", "health", "cordoned"]
    # Observed from Ray by the reconciler, which overwrites them: only `cordoned` is the operator's (an edited free
    # count or health misled the scheduler until the next pass; QA).
    readonly_fields = ["pool", "name", "ray_node_id", "address", "leaf_group", "health", "capacity_devices",
                       "free_devices", "capacity_cpus", "free_cpus", "labels", "simulated", "last_seen_at"]

    def has_add_permission(self, request):
        return False  # nodes are observed, not declared
