"""Serializers for tenancy: output shapes and input field checks (no business logic)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import StrictInputSerializer
from controlplane.tenancy.models import ApiToken, AuditEvent, Membership, Role, Team
from controlplane.tenancy.selectors import audit_event_data_seen_by


class TeamSerializer(serializers.ModelSerializer):
    class Meta:
        model = Team
        fields = ["id", "name", "display_name", "created_at"]
        read_only_fields = ["id", "created_at"]


class TeamCreateSerializer(StrictInputSerializer):
    name = serializers.SlugField(max_length=63)
    display_name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class MembershipSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "team", "username", "role", "created_at"]


class MembershipWriteSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MembershipRoleSerializer(StrictInputSerializer):
    role = serializers.ChoiceField(choices=Role.choices)


class ApiTokenSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    username = serializers.CharField(source="user.username", read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "team", "username", "name", "prefix", "created_at", "expires_at", "revoked_at",
                  "last_used_at", "active"]

    def get_active(self, obj) -> bool:
        return obj.is_active()


class ApiTokenCreateSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    name = serializers.CharField(max_length=100)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="the secret: shown once, store it now")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class AuditEventSerializer(serializers.ModelSerializer):
    team = serializers.SerializerMethodField(help_text="the team's name (kept after the team is deleted); null for "
                                                       "cluster-wide events")

    data = serializers.SerializerMethodField(help_text="what was written; another member's token names and prefixes "
                                                       "are null unless you own the token or administer the team")

    def get_team(self, event: AuditEvent) -> str | None:
        return event.team_name or None

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_data(self, event: AuditEvent) -> dict:
        return audit_event_data_seen_by(event=event, viewer=self.context.get("audit_viewer"))

    class Meta:
        model = AuditEvent
        fields = ["id", "team", "actor_label", "action", "target_type", "target_id", "data", "created_at"]


class MeTeamSerializer(serializers.Serializer):
    name = serializers.CharField()
    role = serializers.CharField()


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    is_staff = serializers.BooleanField()
    teams = MeTeamSerializer(many=True)
    token_team = serializers.CharField(allow_null=True)
