"""Reads about teams and access: which teams a caller sees, and with which role."""

from __future__ import annotations

from django.db.models import QuerySet

from controlplane.tenancy.models import ROLE_RANK, ApiToken, AuditEvent, Membership, Role, Team


def visible_team_ids(*, user, token: ApiToken | None = None) -> list[int]:
    """Teams the caller may see. A token narrows the caller to the token's own team."""
    if user is None or not user.is_authenticated:
        return []
    memberships = Membership.objects.filter(user=user)
    if token is not None:
        memberships = memberships.filter(team_id=token.team_id)
    return list(memberships.values_list("team_id", flat=True))


def role_in_team(*, user, team_id: int, token: ApiToken | None = None) -> Role | None:
    if token is not None and token.team_id != team_id:
        return None
    role = Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()
    return Role(role) if role else None


def has_role(*, user, team_id: int, minimum: Role, token: ApiToken | None = None) -> bool:
    role = role_in_team(user=user, team_id=team_id, token=token)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[minimum]


def team_list(*, team_ids: list[int]) -> QuerySet[Team]:
    return Team.objects.filter(id__in=team_ids)


def membership_list(*, team_ids: list[int]) -> QuerySet[Membership]:
    return Membership.objects.filter(team_id__in=team_ids).select_related("team", "user")


def api_token_list(*, team_ids: list[int]) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(team_id__in=team_ids).select_related("team", "user")


def audit_event_list(*, team_ids: list[int]) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(team_id__in=team_ids).select_related("team")
