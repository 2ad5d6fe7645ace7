"""REST endpoints for deployments: create, list, get, update (PATCH), scale, delete, metrics, revisions and
the event timeline."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.common.api import validated_query
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
    submission_actions = ("create",)  # may answer 429 (controlplane.common.openapi)
    ordering_fields = ["id", "created_at", "name", "state"]
    search_fields = ["name"]

    def get_queryset(self):
        return selectors.deployment_list(team_ids=self.team_ids).select_related("created_by")

    @extend_schema(request=s.DeploymentCreateSerializer, responses={201: s.DeploymentSerializer})
    def create(self, request):
        data = s.DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        team = self.resolve_team(values.pop("team", None))
        deployment = services.deployment_create_from_body(actor=request.user, team=team, values=values)
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=s.DeploymentUpdateSerializer, responses=s.DeploymentSerializer)
    def partial_update(self, request, pk=None):
        """Change the spec: a new revision, rolled out without downtime (SERVING -> UPDATING -> SERVING)."""
        deployment = self.get_object()
        self.require_role(deployment.team_id, Role.MEMBER)
        data = s.DeploymentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        for key, value in (changes.pop("sla", None) or {}).items():
            changes[f"sla_{key}"] = value
        if changes.get("source_job"):
            job = TrainingJob.objects.filter(pk=changes["source_job"], team_id=deployment.team_id).first()
            if job is None:
                raise ValidationFailed(f"training job {changes['source_job']} not found in team "
                                       f"{deployment.team.name}", field="source_job")
            changes["source_job"] = job
        if not changes:
            raise ValidationFailed("give at least one field to change")
        services.deployment_update(actor=request.user, deployment=deployment, changes=changes)
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data)

    @extend_schema(request=s.DeploymentScaleSerializer, responses=s.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def scale(self, request, pk=None):
        """New replica bounds (a revision); Serve autoscales between them to hold the SLA."""
        deployment = self.get_object()
        self.require_role(deployment.team_id, Role.MEMBER)
        data = s.DeploymentScaleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        replicas_min = data.validated_data["replicas_min"]
        replicas_max = data.validated_data.get("replicas_max")
        services.deployment_scale(actor=request.user, deployment=deployment, replicas_min=replicas_min,
                                  replicas_max=replicas_min if replicas_max is None else replicas_max)
        return Response(s.DeploymentSerializer(self.get_queryset().get(pk=deployment.pk)).data)

    @extend_schema(parameters=[OpenApiParameter("window", type=int, required=False,
                                                description="seconds of requests to measure (default 60)")],
                   responses=s.DeploymentMetricsSerializer)
    @action(detail=True, methods=["get"])
    def metrics(self, request, pk=None):
        """TTFT/TPOT/queue percentiles, errors by status, throughput and cache hit rate over the window."""
        deployment = self.get_object()
        query = validated_query(request, s.MetricsQuerySerializer)
        metrics = selectors.deployment_metrics(deployment=deployment, window_s=query["window"])
        return Response(s.DeploymentMetricsSerializer(metrics).data)

    def destroy(self, request, pk=None):
        deployment = self.get_object()
        self.require_role(deployment.team_id, Role.MEMBER)
        services.deployment_delete(actor=request.user, deployment=deployment)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.DeploymentRevisionSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def revisions(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().revisions.all())
        return self.get_paginated_response(s.DeploymentRevisionSerializer(page, many=True).data)

    @extend_schema(responses=s.DeploymentEventSerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def events(self, request, pk=None):
        page = self.paginate_queryset(self.get_object().events.all())
        return self.get_paginated_response(s.DeploymentEventSerializer(page, many=True).data)
