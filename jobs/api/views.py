"""REST endpoints for training jobs: submit, list, get, cancel, delete, and the event timeline."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.common import references
from controlplane.tenancy.api.scoping import TeamScopedMixin
from controlplane.tenancy.models import Role
from jobs import selectors, services
from jobs.api import serializers as s
from jobs.api.filters import TrainingJobFilter


class TrainingJobViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                         viewsets.GenericViewSet):
    serializer_class = s.TrainingJobSerializer
    filterset_class = TrainingJobFilter
    ordering_fields = ["created_at", "name", "state", "state_changed_at"]
    search_fields = ["name"]

    def get_queryset(self):
        return selectors.training_job_list(team_ids=self.team_ids).select_related("created_by")

    @extend_schema(request=s.TrainingJobCreateSerializer, responses={201: s.TrainingJobSerializer})
    def create(self, request):
        data = s.TrainingJobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        team = self.resolve_team(values.pop("team", None))
        checkpoint = values.pop("checkpoint") or {}
        job = services.training_job_create(
            actor=request.user, team=team,
            local_queue=references.resolve_local_queue(team=team, name=values.pop("queue")),
            priority_class=references.resolve_priority_class(name=values.pop("priority")),
            dataset_version=references.resolve_dataset_version(team=team, reference=values.pop("dataset")),
            checkpoint_interval_steps=checkpoint.get("interval_steps", 100),
            checkpoint_keep_last=checkpoint.get("keep_last", 3),
            **values,
        )
        return Response(s.TrainingJobSerializer(self.get_queryset().get(pk=job.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=s.CancelSerializer, responses=s.TrainingJobSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        job = self.get_object()
        self.require_role(job.team_id, Role.MEMBER)
        data = s.CancelSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.training_job_cancel(actor=request.user, job=job, reason=data.validated_data["reason"])
        return Response(s.TrainingJobSerializer(self.get_queryset().get(pk=job.pk)).data)

    def destroy(self, request, pk=None):
        job = self.get_object()
        self.require_role(job.team_id, Role.MEMBER)
        services.training_job_delete(actor=request.user, job=job)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.TrainingJobEventSerializer(many=True))
    @action(detail=True, methods=["get"])
    def events(self, request, pk=None):
        job = self.get_object()
        page = self.paginate_queryset(selectors.training_job_events(job=job))
        return self.get_paginated_response(s.TrainingJobEventSerializer(page, many=True).data)
