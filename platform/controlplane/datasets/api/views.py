"""REST endpoints for datasets and their versions (register a URI or upload a file)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser
from rest_framework.response import Response

from controlplane.common.parsers import BoundedJSONParser, StrictMultiPartParser
from controlplane.datasets import selectors, services
from controlplane.datasets.api import serializers as s
from controlplane.tenancy.api.scoping import TeamScopedMixin
from controlplane.tenancy.models import Role


class DatasetViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                     mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = s.DatasetSerializer
    parser_classes = [BoundedJSONParser, StrictMultiPartParser, FormParser]
    filterset_fields = ["team__name", "name"]
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "description"]

    def get_queryset(self):
        return selectors.dataset_list(team_ids=self.team_ids)

    @extend_schema(request=s.DatasetCreateSerializer, responses={201: s.DatasetSerializer})
    def create(self, request):
        data = s.DatasetCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = self.resolve_team(data.validated_data.get("team"))
        dataset = services.dataset_create(actor=request.user, team=team, name=data.validated_data["name"],
                                          description=data.validated_data["description"])
        return Response(s.DatasetSerializer(self.get_queryset().get(pk=dataset.pk)).data,
                        status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        dataset = self.get_object()
        self.require_role(dataset.team_id, Role.MEMBER)
        services.dataset_delete(actor=request.user, dataset=dataset)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["GET"], request=None, responses=s.DatasetVersionSerializer(many=True))
    @extend_schema(methods=["POST"], request={"application/json": s.DatasetVersionRegisterSerializer,
                                              "multipart/form-data": s.DatasetVersionRegisterSerializer},
                   responses={201: s.DatasetVersionSerializer})
    @action(detail=True, methods=["get", "post"], filter_backends=[])
    def versions(self, request, pk=None):
        dataset = self.get_object()
        if request.method == "GET":
            versions = selectors.dataset_version_list(team_ids=self.team_ids).filter(dataset=dataset)
            page = self.paginate_queryset(versions)
            return self.get_paginated_response(s.DatasetVersionSerializer(page, many=True).data)
        self.require_role(dataset.team_id, Role.MEMBER)
        data = s.DatasetVersionRegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if values["file"] is not None:
            version = services.dataset_version_upload(actor=request.user, dataset=dataset, upload=values["file"],
                                                      fmt=values["format"], description=values["description"],
                                                      size_bytes=values["size_bytes"],
                                                      checksum_sha256=values["checksum_sha256"])
        else:
            version = services.dataset_version_register(
                actor=request.user, dataset=dataset, uri=values["uri"], fmt=values["format"],
                size_bytes=values["size_bytes"], checksum_sha256=values["checksum_sha256"],
                description=values["description"],
            )
        return Response(s.DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)
