"""Serializers for cluster queues, local queues and priority classes."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.common.api import StrictInputMixin, StrictInputSerializer
from controlplane.quotas.models import (
    ClusterQueue,
    LocalQueue,
    PreemptionPolicy,
    PriorityClass,
    ReclaimPolicy,
    ResourceQuota,
)
from controlplane.tenancy.models import Team


class ResourceQuotaSerializer(serializers.ModelSerializer):
    accelerator_type = serializers.CharField(source="accelerator_type.slug")

    class Meta:
        model = ResourceQuota
        fields = ["accelerator_type", "nominal_quota", "borrowing_limit", "lending_limit"]


class ResourceQuotaInputSerializer(StrictInputSerializer):
    accelerator_type = serializers.CharField()
    nominal_quota = serializers.FloatField(min_value=0)
    borrowing_limit = serializers.FloatField(min_value=0, required=False, allow_null=True, default=None)
    lending_limit = serializers.FloatField(min_value=0, required=False, allow_null=True, default=None)


_TEAMS_HELP = "the teams whose local queues may use it (names); empty: every team"


class ClusterQueueSerializer(serializers.ModelSerializer):
    quotas = ResourceQuotaSerializer(many=True, read_only=True)
    teams = serializers.SerializerMethodField(help_text=_TEAMS_HELP + " (to operators; others see only their own "
                                                                      "teams among them)")

    class Meta:
        model = ClusterQueue
        fields = ["id", "name", "cohort", "preemption_within_queue", "reclaim_within_cohort", "teams",
                  "open_to_all_teams", "description", "quotas", "created_at"]
        read_only_fields = fields

    def get_teams(self, queue: ClusterQueue) -> list[str]:
        """Operators see every team it names; anyone else only their own teams among them (review, 2026-11-29). The
        view puts the names the caller may see in the context (`teams_seen`; None: all)."""
        names = sorted(team.name for team in queue.teams.all())
        seen = self.context.get("teams_seen", set())
        return names if seen is None else [name for name in names if name in seen]


class ClusterQueueUpdateResultSerializer(ClusterQueueSerializer):
    warnings = serializers.SerializerMethodField(
        help_text="what the change leaves over quota: admitted work that now uses more than the queue's quotas let "
                  "it hold, or (after a change of its quotas or cohort) more than another queue of its cohort may "
                  "now borrow (it keeps running until it ends or is preempted); empty when all is within")

    class Meta(ClusterQueueSerializer.Meta):
        fields = [*ClusterQueueSerializer.Meta.fields, "warnings"]
        read_only_fields = fields

    def get_warnings(self, queue: ClusterQueue) -> list[str]:
        return list(self.context.get("warnings", []))


_WITHIN_HELP = "may a workload preempt lower-priority ones of its own cluster queue (LowerPriority) or not (Never)"
_RECLAIM_HELP = ("may a workload preempt workloads of other cluster queues of its cohort that use more than their "
                 "nominal quota: of any priority while its queue reclaims within its nominal (Any), lower-priority "
                 "ones only (LowerPriority), or none (Never)")


class ClusterQueueWriteSerializer(StrictInputSerializer):
    name = serializers.SlugField(max_length=63)
    cohort = serializers.SlugField(max_length=63, required=False, allow_blank=True, default="")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    quotas = ResourceQuotaInputSerializer(many=True, required=False, default=list)
    preemption_within_queue = serializers.ChoiceField(choices=PreemptionPolicy.choices, required=False,
                                                      default=PreemptionPolicy.LOWER_PRIORITY, help_text=_WITHIN_HELP)
    reclaim_within_cohort = serializers.ChoiceField(choices=ReclaimPolicy.choices, required=False,
                                                    default=ReclaimPolicy.ANY, help_text=_RECLAIM_HELP)
    teams = serializers.SlugRelatedField(slug_field="name", many=True, queryset=Team.objects.all(), required=False,
                                         default=list, help_text=_TEAMS_HELP)


class ClusterQueueUpdateSerializer(StrictInputSerializer):
    cohort = serializers.SlugField(max_length=63, required=False, allow_blank=True)
    description = serializers.CharField(required=False, allow_blank=True)
    quotas = ResourceQuotaInputSerializer(many=True, required=False,
                                          help_text="replaces the queue's whole list of quotas (a type left out has "
                                                    "none afterwards)")
    preemption_within_queue = serializers.ChoiceField(choices=PreemptionPolicy.choices, required=False,
                                                      help_text=_WITHIN_HELP)
    reclaim_within_cohort = serializers.ChoiceField(choices=ReclaimPolicy.choices, required=False,
                                                    help_text=_RECLAIM_HELP)
    teams = serializers.SlugRelatedField(slug_field="name", many=True, queryset=Team.objects.all(), required=False,
                                         help_text=_TEAMS_HELP)


class LocalQueueSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    cluster_queue = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = LocalQueue
        fields = ["id", "team", "name", "cluster_queue", "created_at"]


class LocalQueueWriteSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    name = serializers.SlugField(max_length=63)
    cluster_queue = serializers.SlugRelatedField(slug_field="name", queryset=ClusterQueue.objects.all())


class PriorityClassSerializer(StrictInputMixin, serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = ["id", "name", "value", "description", "preemptible"]
        extra_kwargs = {"name": {"validators": []}}
