"""Serializers for accelerator types, node pools and observed nodes."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.cluster.models import AcceleratorType, Node, NodePool


class AcceleratorTypeSerializer(serializers.ModelSerializer):
    class Meta:
        model = AcceleratorType
        fields = ["id", "slug", "vendor", "model", "bf16_dense_tflops", "fp8_dense_tflops", "memory_gb",
                  "memory_bandwidth_gbps", "interconnect", "price_per_hour_usd", "sources", "notes"]


class NodePoolSerializer(serializers.ModelSerializer):
    accelerator_type = serializers.SlugRelatedField(slug_field="slug", queryset=AcceleratorType.objects.all())
    node_count = serializers.IntegerField(read_only=True)
    healthy_node_count = serializers.IntegerField(read_only=True)
    capacity_devices = serializers.FloatField(read_only=True)
    free_devices = serializers.FloatField(read_only=True)

    class Meta:
        model = NodePool
        fields = ["id", "name", "accelerator_type", "devices_per_node", "simulated", "description",
                  "node_count", "healthy_node_count", "capacity_devices", "free_devices", "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is the service's check, so the error reads the same from every entry point.
        extra_kwargs = {"name": {"validators": []}}


class NodeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    accelerator_type = serializers.CharField(source="pool.accelerator_type.slug", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "pool", "accelerator_type", "ray_node_id", "address", "leaf_group", "health",
                  "cordoned", "capacity_devices", "free_devices", "capacity_cpus", "free_cpus", "labels",
                  "simulated", "last_seen_at"]
        read_only_fields = fields


class NodeCordonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
