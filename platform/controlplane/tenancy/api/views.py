"""REST endpoints for teams, memberships, API tokens and the audit log. Thin: parse, authorize, call."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.common.api import no_fields_check
from controlplane.common.errors import PermissionDeniedError
from controlplane.tenancy import selectors, services
from controlplane.tenancy.api import serializers as s
from controlplane.tenancy.api.scoping import TeamScopedMixin
from controlplane.tenancy.models import ApiToken, Membership, Role


class MeView(TeamScopedMixin, APIView):
    @extend_schema(responses=s.MeSerializer)
    def get(self, request):
        memberships = Membership.objects.filter(user=request.user, team_id__in=self.team_ids).select_related("team")
        data = {
            "username": request.user.get_username(),
            "is_staff": request.user.is_staff,
            "teams": [{"name": m.team.name, "role": m.role} for m in memberships],
            "token_team": self.token.team.name if self.token else None,
        }
        return Response(s.MeSerializer(data).data)


class TeamViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.TeamSerializer
    filterset_fields = ["name"]
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "display_name"]

    def get_queryset(self):
        return selectors.teams_listed_to(user=self.request.user, team_ids=self.team_ids, token=self.token)

    @extend_schema(request=s.TeamCreateSerializer, responses={201: s.TeamSerializer})
    def create(self, request):
        if not self.operator:
            raise PermissionDeniedError("only operators create teams (signed in, not with a team API token)")
        data = s.TeamCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = services.team_create(actor=request.user, admin=request.user, **data.validated_data)
        return Response(s.TeamSerializer(team).data, status=status.HTTP_201_CREATED)


class MembershipViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet):
    serializer_class = s.MembershipSerializer
    filterset_fields = ["role", "team__name", "user__username"]
    ordering_fields = ["created_at", "role"]

    def get_queryset(self):
        return selectors.membership_list(team_ids=self.team_ids)

    @extend_schema(request=s.MembershipWriteSerializer, responses={201: s.MembershipSerializer})
    def create(self, request):
        data = s.MembershipWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = self.resolve_team(data.validated_data.get("team"), minimum=Role.ADMIN)
        membership = services.membership_set(actor=request.user, team=team,
                                             username=data.validated_data["username"],
                                             role=data.validated_data["role"])
        return Response(s.MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.MembershipRoleSerializer, responses=s.MembershipSerializer)
    def partial_update(self, request, pk=None):
        membership = self.get_object()
        self.require_role(membership.team_id, Role.ADMIN)
        data = s.MembershipRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_set(actor=request.user, team=membership.team,
                                             username=membership.user.username,
                                             role=data.validated_data["role"])
        return Response(s.MembershipSerializer(membership).data)

    def destroy(self, request, pk=None):
        membership = self.get_object()
        self.require_role(membership.team_id, Role.ADMIN)
        services.membership_delete(actor=request.user, membership=membership)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ApiTokenViewSet(TeamScopedMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Your tokens; team admins also see (and may revoke) every token of their teams."""

    serializer_class = s.ApiTokenSerializer
    filterset_fields = ["team__name"]
    ordering_fields = ["created_at", "expires_at", "name"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return ApiToken.objects.none()
        tokens = selectors.api_token_list(team_ids=self.team_ids)
        admin_teams = list(Membership.objects.filter(user=self.request.user, role=Role.ADMIN,
                                                     team_id__in=self.team_ids).values_list("team_id", flat=True))
        return tokens.filter(user=self.request.user) | tokens.filter(team_id__in=admin_teams)

    @extend_schema(request=s.ApiTokenCreateSerializer, responses={201: s.ApiTokenCreatedSerializer})
    def create(self, request):
        data = s.ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = self.resolve_team(data.validated_data.get("team"), minimum=Role.VIEWER)
        signed_with = request.auth if isinstance(request.auth, ApiToken) else None
        token, raw = services.api_token_create(actor=request.user, team=team, user=request.user,
                                               name=data.validated_data["name"],
                                               expires_at=data.validated_data.get("expires_at"),
                                               created_with=signed_with)
        body = s.ApiTokenCreatedSerializer(token).data
        body["token"] = raw
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        token = self.get_object()
        no_fields_check(request)
        token = services.api_token_revoke(actor=request.user, token=token)
        return Response(s.ApiTokenSerializer(token).data)

    def destroy(self, request, pk=None):
        services.api_token_delete(actor=request.user, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditEventViewSet(TeamScopedMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.AuditEventSerializer
    filterset_fields = ["action", "target_type", "target_id", "team__name", "actor_label"]
    ordering_fields = ["created_at"]

    def get_queryset(self):
        return selectors.audit_event_list(team_ids=self.team_ids, cluster_wide=self.operator)

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False):
            context["audit_viewer"] = selectors.audit_event_viewer(user=self.request.user, token=self.token,
                                                                   team_ids=self.team_ids)
        return context
