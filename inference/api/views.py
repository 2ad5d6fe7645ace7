"""REST endpoints for deployments: create, list, get, delete, revisions and the event timeline."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.common import references
from controlplane.common.errors import ValidationFailed
from controlplane.tenancy.api.scoping import TeamScopedMixin
from controlplane.tenancy.models import Role
from inference import selectors, services
from inference.api import serializers as s
from inference.models import Deployment
from inference.states import DeploymentState
from jobs.models import TrainingJob


class DeploymentFilter(django_filters.FilterSet):
    team = django_filters.CharFilter(field_name="team__name")
    queue = django_filters.CharFilter(field_name="local_queue__name")
    state = django_filters.MultipleChoiceFilter(choices=[(st.value, st.value) for st in DeploymentState])
    name = django_filters.CharFilter(lookup_expr="icontains")

    class Meta:
        model = Deployment
        fields = ["team", "queue", "state", "name"]


class DeploymentViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    serializer_class = s.DeploymentSerializer
    filterset_class = DeploymentFilter
    ordering_fields = ["created_at", "name", "state"]
    search_fields = ["name"]

    def get_queryset(self):
        return selectors.deployment_list(team_ids=self.team_ids).select_related("created_by")

    @extend_schema(request=s.DeploymentCreateSerializer, responses={201: s.DeploymentSerializer})
    def create(self, request):
        data = s.DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        team = self.resolve_team(values.pop("team", None))
        sla = values.pop("sla")
        source_job = None
        if values.get("source_job"):
            source_job = TrainingJob.objects.filter(pk=values["source_job"], team=team).first()
            if source_job is None:
                raise ValidationFailed(f"training job {values['source_job']} not found in team {team.name}",
                                       field="source_job")
        values.pop("source_job", None)
        deployment = services.deployment_create(
            actor=request.user, team=team, source_job=source_job,
            local_queue=references.resolve_local_queue(team=team, name=values.pop("queue")),
            priority_class=references.resolve_priority_class(name=values.pop("priority")),
            sla_ttft_p95_ms=sla["ttft_p95_ms"], sla_tpot_p95_ms=sla["tpot_p95_ms"],
            sla_min_throughput_tps=sla.get("min_throughput_tps"), **values,
        )
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
                        status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        deployment = self.get_object()
        self.require_role(deployment.team_id, Role.MEMBER)
        services.deployment_delete(actor=request.user, deployment=deployment)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.DeploymentRevisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def revisions(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().revisions.all())
        return self.get_paginated_response(s.DeploymentRevisionSerializer(page, many=True).data)

    @extend_schema(responses=s.DeploymentEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().events.all())
        return self.get_paginated_response(s.DeploymentEventSerializer(page, many=True).data)
