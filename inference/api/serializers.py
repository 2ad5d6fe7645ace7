"""Serializers for deployments: the submitted spec in, spec + status + revisions + timeline out."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.common.api import StrictInputSerializer
from inference.models import Deployment, DeploymentEvent, DeploymentRevision
from inference.states import DeploymentState


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
    replicas_min = serializers.IntegerField(min_value=0, max_value=1024, default=1)
    replicas_max = serializers.IntegerField(min_value=1, max_value=1024, required=False, allow_null=True,
                                            default=None)
    sla = SlaSerializer()


class DeploymentSpecSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(source="local_queue.name")
    priority = serializers.CharField(source="priority_class.name", allow_null=True, default=None)
    sla = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = ["queue", "priority", "model_uri", "source_job", "accelerator_types", "devices_per_replica",
                  "replicas_min", "replicas_max", "sla"]

    def get_sla(self, obj) -> dict:
        return {"ttft_p95_ms": obj.sla_ttft_p95_ms, "tpot_p95_ms": obj.sla_tpot_p95_ms,
                "min_throughput_tps": obj.sla_min_throughput_tps}


class DeploymentStatusSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=[s.value for s in DeploymentState])
    reason = serializers.CharField(source="state_reason")
    changed_at = serializers.DateTimeField(source="state_changed_at")

    class Meta:
        model = Deployment
        fields = ["state", "reason", "changed_at", "replicas_ready", "compute_handle", "finished_at"]


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
    class Meta:
        model = DeploymentEvent
        fields = ["id", "from_state", "to_state", "reason", "actor_label", "data", "created_at"]
