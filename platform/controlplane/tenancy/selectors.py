"""Reads about teams and access: which teams a caller sees, and with which role."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, F, Max, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from controlplane.tenancy.models import ROLE_RANK, ApiToken, AuditEvent, LoginThrottle, Membership, Role, Team


def is_operator(*, user, token: ApiToken | None = None) -> bool:
    """Whether the caller acts as an operator (cluster-wide writes, every team's name, cluster-wide audit events): a
    staff user signed in with a session. A team API token narrows its user to that team's role everywhere, a staff
    user's too (before, a staff user's token of one team still created node pools, cluster queues and teams)."""
    return user is not None and user.is_authenticated and user.is_staff and token is None


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


def teams_listed_to(*, user, team_ids: list[int], token: ApiToken | None = None) -> QuerySet[Team]:
    """The teams `GET /api/v1/teams/` lists: every team to an operator, who names any team in a cluster queue's
    `teams` and sees them all there (quotas.selectors.team_names_seen_by); anyone else their own (`team_ids`). Only
    the teams: what a team owns stays scoped to its members (before, an operator saw only the teams they belonged
    to; QA). A staff user's team token is not an operator's (is_operator): its team only."""
    if is_operator(user=user, token=token):
        return Team.objects.all()
    return team_list(team_ids=team_ids)


def membership_list(*, team_ids: list[int]) -> QuerySet[Membership]:
    return Membership.objects.filter(team_id__in=team_ids).select_related("team", "user")


def api_token_list(*, team_ids: list[int]) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(team_id__in=team_ids).select_related("team", "user")


def audit_event_list(*, team_ids: list[int], cluster_wide: bool = False) -> QuerySet[AuditEvent]:
    """The events of the given teams, and with `cluster_wide` (operators) those of no team: cluster queues, node
    pools, cordons, priority classes (before 2026-11-29 those were only in the Django admin: QA)."""
    scope = Q(team_id__in=team_ids)
    if cluster_wide:
        scope |= Q(team__isnull=True)
    return AuditEvent.objects.filter(scope).select_related("team")


# Audit-event data that names API tokens: the name and prefix of a token's events, the prefixes a member's removal
# revoked, and what the Django admin recorded about a token. Shown where GET /api/v1/api-tokens/ would list the
# token: to its owner and the team's admins, and to operators (who see every token in the Django admin).
TOKEN_DETAIL_KEYS = ("name", "prefix", "object", "fields")
MEMBERSHIP_TOKEN_KEYS = ("tokens_revoked",)


def audit_event_viewer(*, user, token: ApiToken | None = None, team_ids: list[int]) -> dict:
    """Who reads audit events, as audit_event_data_seen_by needs it (computed once per request)."""
    admin_teams = set(Membership.objects.filter(user=user, role=Role.ADMIN, team_id__in=team_ids)
                      .values_list("team_id", flat=True)) if user is not None and user.is_authenticated else set()
    return {"operator": is_operator(user=user, token=token), "user_id": getattr(user, "pk", None),
            "username": user.get_username() if user is not None and user.is_authenticated else None,
            "admin_teams": admin_teams}


def audit_event_data_seen_by(*, event: AuditEvent, viewer: dict | None) -> dict:
    """The event's data as `viewer` (audit_event_viewer) may see it: another member's token names and prefixes are
    left out (null) for members and viewers, who still see that the event happened (before 2026-12, a viewer read the
    name and prefix of every token deleted in the team, and the prefixes revoked with a removed member). The token's
    owner (recorded as `owner`, or the member removed; the actor of an event recorded before `owner` was) and the
    team's admins and operators see them all. The stored event is unchanged. No viewer: left out."""
    data = event.data or {}
    viewer = viewer or {"operator": False, "user_id": None, "username": None, "admin_teams": set()}
    if viewer["operator"] or (event.team_id is not None and event.team_id in viewer["admin_teams"]):
        return data
    if event.target_type == ApiToken._meta.label_lower:
        keys, owner = TOKEN_DETAIL_KEYS, data.get("owner")
    elif event.action == "membership.delete":
        keys, owner = MEMBERSHIP_TOKEN_KEYS, data.get("username")
    else:
        return data
    if viewer["username"] is not None and owner == viewer["username"]:
        return data
    if owner is None and viewer["user_id"] is not None and event.actor_id == viewer["user_id"]:
        return data
    return {key: (None if key in keys else value) for key, value in data.items()}


def roles_by_team(*, user, team_ids: list[int]) -> dict[int, str]:
    """{team id: the user's role} for the given teams the user belongs to."""
    if user is None or not user.is_authenticated:
        return {}
    return dict(Membership.objects.filter(user=user, team_id__in=team_ids).values_list("team_id", "role"))


def api_tokens_visible(*, user, team_ids: list[int]) -> QuerySet[ApiToken]:
    """The tokens the API lists for this user: their own, plus every token of the teams they administer."""
    tokens = api_token_list(team_ids=team_ids)
    admin_teams = list(Membership.objects.filter(user=user, role=Role.ADMIN, team_id__in=team_ids)
                       .values_list("team_id", flat=True))
    return (tokens.filter(user=user) | tokens.filter(team_id__in=admin_teams)).order_by("-created_at")


def api_tokens_visible_latest(*, user, team_ids: list[int], limit: int) -> tuple[list[ApiToken], dict[int, int]]:
    """Of api_tokens_visible, the latest `limit` of each team (newest first), and how many each team has (the console's
    Team page: revoked tokens stay listed)."""
    tokens = api_tokens_visible(user=user, team_ids=team_ids)
    latest = tokens.annotate(newest=Window(RowNumber(), partition_by=[F("team_id")],
                                           order_by=[F("created_at").desc(), F("id").desc()]))
    counts = dict(tokens.order_by().values_list("team_id").annotate(n=Count("id")))
    return list(latest.filter(newest__lte=limit).order_by("-created_at", "-id")), counts


# Sign-in throttling (OWASP: lock out repeated failed logins). Per username, so one account cannot be
# guessed at, and per client address, so one client cannot spray many accounts. Usernames that do not
# exist are counted the same way, so the lockout says nothing about which accounts exist.
LOGIN_WINDOW = timedelta(minutes=15)
LOGIN_LOCKOUT = timedelta(minutes=15)
LOGIN_MAX_FAILURES_PER_USER = 5
LOGIN_MAX_FAILURES_PER_ADDRESS = 20


def login_keys(*, username: str, address: str) -> list[tuple[str, int]]:
    """(throttle key, failure limit) for a sign-in by this username from this address."""
    keys = [(f"user:{username.strip().lower()[:150]}", LOGIN_MAX_FAILURES_PER_USER)]
    if address:
        keys.append((f"ip:{address[:45]}", LOGIN_MAX_FAILURES_PER_ADDRESS))
    return keys


def login_locked_seconds(*, username: str, address: str, now=None) -> int:
    """Seconds until this username or address may try again (0: not locked)."""
    now = now or timezone.now()
    keys = [key for key, _ in login_keys(username=username, address=address)]
    until = LoginThrottle.objects.filter(key__in=keys, locked_until__gt=now).aggregate(m=Max("locked_until"))["m"]
    return 0 if until is None else max(1, int((until - now).total_seconds() + 0.999))
