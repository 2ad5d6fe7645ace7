"""Deployments (desired spec + observed status), their revisions and state timeline."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from controlplane.common.lifecycle import LifecycleEvent
from controlplane.quotas.models import LocalQueue, PriorityClass
from controlplane.tenancy.models import SLUG_VALIDATOR, Team
from inference.states import DEPLOYMENT_MACHINE, DeploymentState
from jobs.models import TrainingJob


def _counted(amount: float, unit: str) -> str:
    """"0.25 CPU core", "1 device", "8 devices": an amount as the console writes it (as the API has it, no rounding)."""
    return f"{amount:g} {unit}{'' if amount == 1 else 's'}"


class Deployment(models.Model):
    # --- spec (desired) ---
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="deployments")
    name = models.SlugField(max_length=63, validators=[SLUG_VALIDATOR],
                            help_text="also the model name clients ask for")
    local_queue = models.ForeignKey(LocalQueue, on_delete=models.PROTECT, related_name="deployments")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, null=True, blank=True,
                                       related_name="deployments")
    source_job = models.ForeignKey(TrainingJob, on_delete=models.SET_NULL, null=True, blank=True,
                                   related_name="deployments", help_text="training job whose checkpoint is served")
    model_uri = models.CharField(max_length=1000, blank=True, help_text="checkpoint or uploaded artifact")
    accelerator_types = models.JSONField(help_text="accepted accelerator type slugs, in preference order")
    devices_per_replica = models.FloatField(default=1.0, validators=[MinValueValidator(0)])
    replicas_min = models.PositiveIntegerField(default=1)
    replicas_max = models.PositiveIntegerField(default=1)
    sla_ttft_p95_ms = models.PositiveIntegerField(help_text="p95 time to first token, milliseconds")
    sla_tpot_p95_ms = models.PositiveIntegerField(help_text="p95 time per output token, milliseconds")
    sla_min_throughput_tps = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0)])
    engine = models.JSONField(default=dict, blank=True,
                              help_text="LLM server settings: slots, block_size, cache tiers, max_prompt_tokens")
    router = models.CharField(max_length=16, default="prefix",
                              help_text="request routing across replicas: prefix, pow2 or round_robin")
    revision = models.PositiveIntegerField(default=1, help_text="the revision the spec describes")
    spec_yaml = models.TextField(blank=True, help_text="the YAML spec it was created with (fleetyard CLI/SDK)")
    # --- status (observed) ---
    state = models.CharField(max_length=16, choices=[(s.value, s.value) for s in DeploymentState],
                             default=DeploymentState.PENDING, db_index=True)
    state_reason = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    compute_handle = models.CharField(max_length=128, blank=True)
    replicas_ready = models.PositiveIntegerField(default=0)
    replicas_target = models.PositiveIntegerField(default=0)
    replicas_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="the most replicas its ClusterQueue's quota lets it run now, set by the "
                                         "scheduling cycle (Serve's autoscaler is capped there); empty: replicas_max")
    capacity_held = models.JSONField(
        default=list, blank=True, help_text="[node, devices] pairs the scheduling cycle holds for its wanted replicas "
                                            "that do not run yet; placing another deployment leaves them out")
    applied_revision = models.PositiveIntegerField(default=0, help_text="the revision the backend runs")
    accelerator_type = models.CharField(max_length=63, blank=True, help_text="the accepted type it was placed on")
    pool = models.CharField(max_length=63, blank=True)
    model_dir = models.CharField(max_length=1000, blank=True, help_text="the checkpoint directory served")
    autoscaling = models.JSONField(default=dict, blank=True,
                                   help_text="the Serve autoscaling settings derived from the SLA, and why")
    observed = models.JSONField(default=dict, blank=True,
                                help_text="the last measured window: TTFT/TPOT p95, throughput, cache hit rate")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    machine = DEPLOYMENT_MACHINE

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=models.Q(replicas_max__gte=models.F("replicas_min")),
                                   name="deployment_replicas_max_gte_min"),
            models.UniqueConstraint(fields=["team", "name"],
                                    condition=~models.Q(state__in=["DELETED", "FAILED"]),
                                    name="deployment_live_name_unique_per_team"),
        ]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"

    @property
    def replica_size(self) -> str:
        """What one replica takes, for people: devices, or on the CPU pool the cores its server reserves (before,
        the console said "1 device" for a CPU replica; found by QA)."""
        from inference.workflows import replica_cpus

        if self.accelerator_type == "cpu":
            return f"{replica_cpus(accelerator_type='cpu', devices_per_replica=0.0):g} CPU core"
        return _counted(float(self.devices_per_replica), "device")

    @property
    def capacity_held_shown(self) -> list[tuple[str, str]]:
        """`capacity_held` for people: (node, "0.25 CPU core" or "0.125 device"), cores on CPU nodes (before, the
        console rounded to one decimal and called a CPU hold devices; found by QA)."""
        from controlplane.cluster.models import Node

        held = [(str(node), float(amount)) for node, amount in self.capacity_held or []]
        kinds = dict(Node.objects.filter(name__in=[node for node, _ in held])
                     .values_list("name", "pool__accelerator_type__slug"))
        return [(node, _counted(amount, "CPU core" if kinds.get(node) == "cpu" else "device")) for node, amount in held]

    @property
    def is_terminal(self) -> bool:
        return DEPLOYMENT_MACHINE.is_terminal(self.state)


class DeploymentRevision(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    spec = models.JSONField()
    reason = models.CharField(max_length=200)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["deployment", "-number"]
        constraints = [models.UniqueConstraint(fields=["deployment", "number"], name="revision_unique")]

    def __str__(self) -> str:
        return f"{self.deployment} r{self.number}"


class DeploymentEvent(LifecycleEvent):
    subject = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")

    class Meta(LifecycleEvent.Meta):
        pass


class InferenceRequest(models.Model):
    """One request served (or refused) through the gateway, with what the replica measured."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="requests")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    endpoint = models.CharField(max_length=32)
    status_code = models.PositiveSmallIntegerField()
    stream = models.BooleanField(default=False)
    finish_reason = models.CharField(max_length=16, blank=True)
    error = models.CharField(max_length=500, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    queue_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    tpot_ms = models.FloatField(null=True, blank=True)
    total_ms = models.FloatField(null=True, blank=True)
    replica = models.CharField(max_length=128, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["deployment", "created_at"], name="inference_req_dep_time")]

    def __str__(self) -> str:
        return f"{self.deployment} {self.endpoint} {self.status_code}"

