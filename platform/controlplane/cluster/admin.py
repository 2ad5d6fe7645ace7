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


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "pool", "leaf_group", "health", "cordoned", "capacity_devices", "free_devices",
                    "simulated", "last_seen_at"]
    list_filter = ["pool", "health", "cordoned"]
    readonly_fields = ["ray_node_id", "address", "labels", "last_seen_at"]
