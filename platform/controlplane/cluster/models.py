"""Accelerator types (chip facts with sources), node pools, and nodes as observed from the cluster."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.cluster.link_defaults import LinkBandwidth, resolve_link_bandwidth
from controlplane.tenancy.models import SLUG_VALIDATOR

MAX_DEVICES_PER_NODE = 1024


def validate_positive(value) -> None:
    if value is not None and value <= 0:
        raise ValidationError(f"must be greater than 0, got {value}")


class AcceleratorType(models.Model):
    slug = models.SlugField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    vendor = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    bf16_dense_tflops = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    fp8_dense_tflops = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    memory_gb = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    memory_bandwidth_gbps = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    interconnect = models.CharField(max_length=200, blank=True)
    price_per_hour_usd = models.DecimalField(max_digits=10, decimal_places=4, null=True, blank=True,
                                             validators=[MinValueValidator(0)])
    sources = models.JSONField(default=dict, blank=True, help_text="figure name -> citation")
    notes = models.TextField(blank=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class NodePool(models.Model):
    name = models.SlugField(max_length=63, unique=True, validators=[SLUG_VALIDATOR])
    accelerator_type = models.ForeignKey(AcceleratorType, on_delete=models.PROTECT, related_name="node_pools")
    # At most what a plan takes for a node (cluster/api/serializers.PlanDevicesSerializer): before 2026-11-29 SQLite
    # stored 2**40 (201) where PostgreSQL refused it, and a pool of one 8-device node then planned 2**31 devices (QA).
    devices_per_node = models.PositiveIntegerField(default=8, validators=[MaxValueValidator(MAX_DEVICES_PER_NODE)])
    simulated = models.BooleanField(
        default=True,
        help_text="true when the chips are logical Ray resources on a host that does not have them",
    )
    description = models.TextField(blank=True)
    intra_node_gbps = models.FloatField(
        null=True, blank=True, validators=[validate_positive],
        help_text="GB/s per device per direction between devices of one node (NVLink, Infinity Fabric, PCIe). "
                  "Empty: the assumed default of the accelerator type (cluster/link_defaults.py).",
    )
    inter_node_gbps = models.FloatField(
        null=True, blank=True, validators=[validate_positive],
        help_text="GB/s per device per direction between nodes (the device's share of the node's network, "
                  "e.g. one 400 Gb/s port per GPU = 50). Empty: the assumed default of the accelerator type.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def link_bandwidth(self) -> LinkBandwidth:
        """The pool's own link figures where set, else its accelerator type's assumed defaults."""
        return resolve_link_bandwidth(self.accelerator_type.slug, self.intra_node_gbps, self.inter_node_gbps)


class NodeHealth(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    UNREACHABLE = "unreachable", "Unreachable"


class Node(models.Model):
    """A Ray node of a pool, as last observed by the node reconciler (never edited by hand)."""

    pool = models.ForeignKey(NodePool, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=200, unique=True)
    ray_node_id = models.CharField(max_length=64, blank=True, db_index=True)
    address = models.CharField(max_length=100, blank=True)
    leaf_group = models.CharField(max_length=100, blank=True, db_index=True)
    health = models.CharField(max_length=16, choices=NodeHealth.choices, default=NodeHealth.HEALTHY)
    cordoned = models.BooleanField(default=False)
    capacity_devices = models.FloatField(default=0)
    free_devices = models.FloatField(default=0)
    capacity_cpus = models.FloatField(default=0)
    free_cpus = models.FloatField(default=0)
    labels = models.JSONField(default=dict, blank=True)
    simulated = models.BooleanField(default=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pool__name", "name"]

    def __str__(self) -> str:
        return self.name
