"""Serializers for deployments: the submitted spec in, spec + status + revisions + timeline out."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import StrictInputSerializer
from controlplane.compute.base import ROUTERS
from inference.models import Deployment, DeploymentEvent, DeploymentRevision
from inference.states import DeploymentState
from jobs.selectors import event_data_shown_for_team, reason_shown_for_team

# The platform's limit on replicas (the service checks it again for every create, update and scale).
MAX_REPLICAS = settings.FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT


class SlaSerializer(StrictInputSerializer):
    ttft_p95_ms = serializers.IntegerField(min_value=1, max_value=3_600_000)
    tpot_p95_ms = serializers.IntegerField(min_value=1, max_value=600_000)
    min_throughput_tps = serializers.FloatField(min_value=0, required=False, allow_null=True, default=None)


class DeploymentCreateSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    name = serializers.SlugField(max_length=63)
    queue = serializers.SlugField(max_length=63)
    priority = serializers.SlugField(max_length=63, required=False, allow_blank=True, default="")
    model_uri = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")
    source_job = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    accelerator_types = serializers.ListField(child=serializers.SlugField(), min_length=1, max_length=16)
    devices_per_replica = serializers.FloatField(min_value=0.01, max_value=64, default=1.0)
    replicas_min = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, default=1)
    replicas_max = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False, allow_null=True,
                                            default=None)
    sla = SlaSerializer()
    engine = serializers.DictField(required=False, default=dict,
                                   help_text="LLM server settings: slots, block_size, device/host/disk_cache_blocks, "
                                             "max_prompt_tokens, max_waiting, torch_threads")
    router = serializers.ChoiceField(choices=list(ROUTERS), default="prefix")


class SlaUpdateSerializer(StrictInputSerializer):
    ttft_p95_ms = serializers.IntegerField(min_value=1, max_value=3_600_000, required=False)
    tpot_p95_ms = serializers.IntegerField(min_value=1, max_value=600_000, required=False)
    min_throughput_tps = serializers.FloatField(min_value=0, required=False, allow_null=True)


class DeploymentUpdateSerializer(StrictInputSerializer):
    """A partial change of the spec (PATCH): each field given becomes part of a new revision."""

    model_uri = serializers.CharField(max_length=1000, required=False, allow_blank=True)
    source_job = serializers.IntegerField(min_value=1, required=False, allow_null=True)
    accelerator_types = serializers.ListField(child=serializers.SlugField(), min_length=1, max_length=16,
                                              required=False)
    devices_per_replica = serializers.FloatField(min_value=0.01, max_value=64, required=False)
    replicas_min = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, required=False)
    replicas_max = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False)
    sla = SlaUpdateSerializer(required=False)
    engine = serializers.DictField(required=False)
    router = serializers.ChoiceField(choices=list(ROUTERS), required=False)


class DeploymentScaleSerializer(StrictInputSerializer):
    replicas_min = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS)
    replicas_max = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False, allow_null=True,
                                            default=None, help_text="defaults to replicas_min")

    def validate(self, attrs):
        """`{"replicas_min": 0}` alone meant 0-0 replicas, refused as "replicas_max: must be at least 1", a field the
        client did not send (found by QA; the CLI's scale says the same before it calls)."""
        if attrs["replicas_min"] == 0 and attrs.get("replicas_max") is None:
            raise serializers.ValidationError({"replicas_min": [
                "0 runs as 1 (scaling to zero is not built: one replica stays up while the deployment is): give "
                "replicas_max too (at least 1), the most it may scale out to"]})
        return attrs


class MetricsQuerySerializer(StrictInputSerializer):
    window = serializers.IntegerField(min_value=1, max_value=86_400, default=60,
                                      help_text="seconds of requests to measure, ending now")


class _Percentiles3(serializers.Serializer):
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)
    p99 = serializers.FloatField(allow_null=True)


class _Percentiles2(serializers.Serializer):
    p50 = serializers.FloatField(allow_null=True)
    p95 = serializers.FloatField(allow_null=True)


class _P95(serializers.Serializer):
    p95 = serializers.FloatField(allow_null=True)


class _Replicas(serializers.Serializer):
    ready = serializers.IntegerField()
    target = serializers.IntegerField()
    min = serializers.IntegerField()
    max = serializers.IntegerField()


class _MetricsSla(serializers.Serializer):
    ttft_p95_ms = serializers.IntegerField()
    tpot_p95_ms = serializers.IntegerField()
    min_throughput_tps = serializers.FloatField(allow_null=True)


class _MinutePoint(serializers.Serializer):
    minute = serializers.DateTimeField()
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()
    ttft_p95_ms = serializers.FloatField(allow_null=True)
    tpot_p95_ms = serializers.FloatField(allow_null=True)
    output_tokens = serializers.IntegerField()


class DeploymentMetricsSerializer(serializers.Serializer):
    """What the gateway's request log measured over the window (milliseconds, tokens)."""

    window_s = serializers.IntegerField()
    at = serializers.DateTimeField()
    requests = serializers.IntegerField()
    succeeded = serializers.IntegerField()
    errors = serializers.DictField(child=serializers.IntegerField(), help_text="HTTP status -> count (non-2xx)")
    ttft_ms = _Percentiles3()
    tpot_ms = _Percentiles2()
    queue_ms = _P95()
    prompt_tokens = serializers.IntegerField()
    cached_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    output_tokens_per_s = serializers.FloatField()
    cache_hit_rate = serializers.FloatField(allow_null=True, help_text="cached_tokens / prompt_tokens")
    replicas = _Replicas()
    sla = _MetricsSla()
    series = _MinutePoint(many=True, help_text="per minute, oldest first")


class DeploymentSpecSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(source="local_queue.name")
    priority = serializers.CharField(source="priority_class.name", allow_null=True, default=None)
    sla = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = ["revision", "queue", "priority", "model_uri", "source_job", "accelerator_types",
                  "devices_per_replica", "replicas_min", "replicas_max", "sla", "engine", "router"]

    def get_sla(self, obj) -> dict:
        return {"ttft_p95_ms": obj.sla_ttft_p95_ms, "tpot_p95_ms": obj.sla_tpot_p95_ms,
                "min_throughput_tps": obj.sla_min_throughput_tps}


class DeploymentStatusSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=[s.value for s in DeploymentState])
    reason = serializers.SerializerMethodField(help_text="why it is in its state; another team's workloads are not "
                                                         "named by id (\"another team's job\")")
    changed_at = serializers.DateTimeField(source="state_changed_at")

    def get_reason(self, obj) -> str:
        return reason_shown_for_team(text=obj.state_reason, team_id=obj.team_id)

    class Meta:
        model = Deployment
        fields = ["state", "reason", "changed_at", "replicas_ready", "replicas_target", "replicas_limit",
                  "capacity_held", "applied_revision",
                  "accelerator_type", "pool", "model_dir", "compute_handle", "autoscaling", "observed",
                  "finished_at"]


class DeploymentSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name")
    spec = DeploymentSpecSerializer(source="*")
    status = DeploymentStatusSerializer(source="*")
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = Deployment
        fields = ["id", "team", "name", "spec", "status", "created_by", "created_at"]


class DeploymentRevisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeploymentRevision
        fields = ["number", "spec", "reason", "created_at"]


class DeploymentEventSerializer(serializers.ModelSerializer):
    reason = serializers.SerializerMethodField(help_text="another team's workloads are not named by id")
    data = serializers.SerializerMethodField()

    class Meta:
        model = DeploymentEvent
        fields = ["id", "from_state", "to_state", "reason", "actor_label", "data", "created_at"]

    def get_reason(self, event) -> str:
        return reason_shown_for_team(text=event.reason, team_id=event.subject.team_id)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_data(self, event) -> dict:
        return event_data_shown_for_team(data=event.data, team_id=event.subject.team_id)
