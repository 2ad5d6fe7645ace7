"""REST endpoints for queues and quotas."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from controlplane.quotas import selectors, services
from controlplane.quotas.api import serializers as s
from controlplane.tenancy.api.scoping import IsStaffOrReadOnly, TeamScopedMixin
from controlplane.tenancy.models import ApiToken, Role


def _token_of(request) -> ApiToken | None:
    """The team API token the request is signed with (None for a session, or schema generation without a request)."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, ApiToken) else None


class ClusterQueueViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.ClusterQueueSerializer
    permission_classes = [IsStaffOrReadOnly]
    lookup_field = "name"
    filterset_fields = ["cohort"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        return selectors.cluster_queue_list()

    def get_serializer_context(self):
        return {**super().get_serializer_context(),
                "teams_seen": selectors.team_names_seen_by(user=getattr(self.request, "user", None),
                                                           token=_token_of(self.request))}

    @extend_schema(request=s.ClusterQueueWriteSerializer, responses={201: s.ClusterQueueSerializer})
    def create(self, request):
        data = s.ClusterQueueWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        queue = services.cluster_queue_create(actor=request.user, **data.validated_data)
        return Response(s.ClusterQueueSerializer(self.get_queryset().get(pk=queue.pk),
                                                 context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ClusterQueueUpdateSerializer, responses=s.ClusterQueueUpdateResultSerializer)
    def partial_update(self, request, name=None):
        queue = self.get_object()
        data = s.ClusterQueueUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        queue, warnings = services.cluster_queue_update(actor=request.user, queue=queue, **data.validated_data)
        queue = self.get_queryset().get(pk=queue.pk)
        return Response(s.ClusterQueueUpdateResultSerializer(
            queue, context={**self.get_serializer_context(), "warnings": warnings}).data)


class LocalQueueViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    serializer_class = s.LocalQueueSerializer
    filterset_fields = ["team__name", "name", "cluster_queue__name"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        return selectors.local_queue_list(team_ids=self.team_ids)

    @extend_schema(request=s.LocalQueueWriteSerializer, responses={201: s.LocalQueueSerializer})
    def create(self, request):
        data = s.LocalQueueWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = self.resolve_team(data.validated_data.get("team"), minimum=Role.ADMIN)
        queue = services.local_queue_create(actor=request.user, team=team, name=data.validated_data["name"],
                                            cluster_queue=data.validated_data["cluster_queue"])
        return Response(s.LocalQueueSerializer(queue).data, status=status.HTTP_201_CREATED)


class PriorityClassViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.PriorityClassSerializer
    permission_classes = [IsStaffOrReadOnly]
    lookup_field = "name"
    ordering_fields = ["value", "name"]

    def get_queryset(self):
        return selectors.priority_class_list()

    def create(self, request):
        data = s.PriorityClassSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        priority = services.priority_class_create(actor=request.user, **data.validated_data)
        return Response(s.PriorityClassSerializer(priority).data, status=status.HTTP_201_CREATED)
