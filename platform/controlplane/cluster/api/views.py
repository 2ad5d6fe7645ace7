"""REST endpoints for the cluster inventory (readable by everyone signed in, written by operators) and
for planning a training run on it without submitting one."""

from __future__ import annotations

import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.cluster import plans, selectors, services
from controlplane.cluster.api import serializers as s
from controlplane.cluster.models import Node, NodePool
from controlplane.tenancy.api.scoping import IsStaffOrReadOnly


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(django_filters.TypedChoiceFilter):
    """`true` or `false`; anything else is a 400 naming the parameter. (A BooleanFilter took `cordoned=yes`
    for no filter at all and listed every node: found by schemathesis, S7.)"""

    def __init__(self, **kwargs):
        super().__init__(choices=[("true", "true"), ("false", "false")], coerce=lambda value: value == "true",
                         **kwargs)


class NodePoolFilter(django_filters.FilterSet):
    simulated = StrictBooleanFilter()

    class Meta:
        model = NodePool
        fields = ["simulated", "accelerator_type__slug"]


class NodeFilter(django_filters.FilterSet):
    cordoned = StrictBooleanFilter()
    simulated = StrictBooleanFilter()

    class Meta:
        model = Node
        fields = ["pool__name", "health", "cordoned", "leaf_group", "simulated"]


class AcceleratorTypeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.AcceleratorTypeSerializer
    lookup_field = "slug"
    filterset_fields = ["vendor"]
    ordering_fields = ["slug", "bf16_dense_tflops", "memory_gb", "price_per_hour_usd"]
    search_fields = ["slug", "vendor", "model"]

    def get_queryset(self):
        return selectors.accelerator_type_list()


class NodePoolViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.NodePoolSerializer
    permission_classes = [IsStaffOrReadOnly]
    lookup_field = "name"
    filterset_class = NodePoolFilter
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        return selectors.node_pool_list()

    def create(self, request):
        data = s.NodePoolSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        pool = services.node_pool_create(actor=request.user, **data.validated_data)
        return Response(s.NodePoolSerializer(self.get_queryset().get(pk=pool.pk)).data,
                        status=status.HTTP_201_CREATED)


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.NodeSerializer
    permission_classes = [IsStaffOrReadOnly]
    filterset_class = NodeFilter
    ordering_fields = ["name", "free_devices", "last_seen_at"]
    search_fields = ["name", "leaf_group"]

    def get_queryset(self):
        return selectors.node_list()

    @extend_schema(request=s.NodeCordonSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def cordon(self, request, pk=None):
        return self._set_cordoned(request, cordoned=True)

    @extend_schema(request=s.NodeCordonSerializer, responses=s.NodeSerializer)
    @action(detail=True, methods=["post"])
    def uncordon(self, request, pk=None):
        return self._set_cordoned(request, cordoned=False)

    def _set_cordoned(self, request, *, cordoned: bool):
        data = s.NodeCordonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = services.node_set_cordoned(actor=request.user, node=self.get_object(), cordoned=cordoned,
                                          reason=data.validated_data["reason"])
        return Response(s.NodeSerializer(selectors.node_list().get(pk=node.pk)).data)


class PlanView(APIView):
    """Plan a training run without submitting it: the best parallel layout on the named node pools and/or
    hypothetical devices, ranked alternatives, and their price; with ``compare``, each accelerator type
    alone beside the mix. Any signed-in user; nothing is written or reserved."""

    @extend_schema(request=s.PlanSerializer, responses={200: s.PlanResultSerializer},
                   summary="Plan a training run (parallel layout, speed and cost) without submitting it")
    def post(self, request):
        data = s.PlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        from jobs.calibration import planner_fractions  # measured runs refine each chip's fraction of peak

        answer = plans.plan_estimate(**data.validated_data, fractions=planner_fractions())
        return Response(s.PlanResultSerializer(answer).data)
