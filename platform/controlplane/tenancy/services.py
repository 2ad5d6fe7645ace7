"""Writes about teams and access. Every write appends an audit event in the same transaction."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.tenancy.models import ApiToken, AuditEvent, LoginThrottle, Membership, Role, Team
from controlplane.tenancy.selectors import LOGIN_LOCKOUT, LOGIN_WINDOW, login_keys

logger = logging.getLogger(__name__)
TOKEN_PREFIX = "fy_"  # noqa: S105 - a public prefix, not a secret  # nosec B105


def audit_record(*, actor, team: Team | int | None, action: str, target, data: dict | None = None,
                 system: str | None = None) -> AuditEvent:
    """Append one audit event. `actor` is a user, or None with `system` naming the component."""
    event = audit_event(actor=actor, team=team, action=action, target=target, data=data, system=system)
    event.save(force_insert=True)
    return event


def audit_event(*, actor, team: Team | int | None, action: str, target, data: dict | None = None,
                system: str | None = None, team_name: str | None = None) -> AuditEvent:
    """The audit event `audit_record` appends, not saved yet (lifecycle.transition_many inserts many at once, giving
    `team_name` for a team given by id; otherwise it is read)."""
    label = actor.get_username() if actor is not None else f"system:{system or 'fleetyard'}"
    if isinstance(team, Team):
        team_id, team_name = team.pk, team.name
    else:
        team_id = team
        if team_name is None:
            team_name = Team.objects.filter(pk=team).values_list("name", flat=True).first() if team else ""
    return AuditEvent(team_id=team_id, team_name=team_name or "", actor=actor, actor_label=label, action=action,
                      target_type=target._meta.label_lower, target_id=str(target.pk), data=data or {})


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def team_create(*, actor, name: str, display_name: str = "", admin=None) -> Team:
    if Team.objects.filter(name=name).exists():
        raise ValidationFailed(f"a team named {name!r} already exists", field="name")
    team = Team(name=name, display_name=display_name)
    team.full_clean()
    team.save()
    if admin is not None:
        Membership.objects.create(team=team, user=admin, role=Role.ADMIN)
    audit_record(actor=actor, team=team, action="team.create", target=team,
                 data={"name": name, "admin": admin.get_username() if admin else None})
    return team


@transaction.atomic
def membership_set(*, actor, team: Team, username: str, role: str) -> Membership:
    if role not in Role.values:
        raise ValidationFailed(f"{role!r} is not a role (choose {', '.join(Role.values)})", field="role")
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise ValidationFailed(f"no user named {username!r}", field="username")
    _lock_team_memberships(team)
    membership, created = Membership.objects.get_or_create(team=team, user=user, defaults={"role": role})
    if not created and membership.role != role:
        _ensure_an_admin_remains(team=team, leaving=membership, new_role=role)
        membership.role = role
        membership.save(update_fields=["role"])
    audit_record(actor=actor, team=team, action="membership.set", target=membership,
                 data={"username": username, "role": role, "created": created})
    return membership


@transaction.atomic
def membership_delete(*, actor, membership: Membership) -> None:
    """Remove a member, and revoke their active tokens of the team in the same transaction. (Found by QA: the
    tokens stayed listed as active, and worked again in full once the user was added back, at any later time.)"""
    _lock_team_memberships(membership.team)
    membership.refresh_from_db()
    _ensure_an_admin_remains(team=membership.team, leaving=membership, new_role=None)
    now = timezone.now()
    tokens = ApiToken.objects.select_for_update().filter(team=membership.team, user_id=membership.user_id,
                                                         revoked_at__isnull=True)
    revoked = [token.prefix for token in tokens]
    tokens.update(revoked_at=now)
    audit_record(actor=actor, team=membership.team, action="membership.delete", target=membership,
                 data={"username": membership.user.get_username(), "role": membership.role,
                       "tokens_revoked": revoked})
    membership.delete()


def _lock_team_memberships(team: Team) -> None:
    """Lock the team's membership rows in id order, so concurrent role changes serialise, deadlock-free."""
    list(Membership.objects.select_for_update().filter(team=team).order_by("id").values_list("id", flat=True))


def _ensure_an_admin_remains(*, team: Team, leaving: Membership, new_role: str | None) -> None:
    """Caller holds the team's membership locks (see _lock_team_memberships)."""
    if leaving.role != Role.ADMIN or new_role == Role.ADMIN:
        return
    admins = list(Membership.objects.filter(team=team, role=Role.ADMIN).values_list("id", flat=True))
    if admins == [leaving.id]:
        raise ConflictError(f"team {team.name} must keep at least one admin", field="role")


@transaction.atomic
def api_token_create(*, actor, team: Team, user, name: str, expires_at: datetime | None = None,
                     created_with: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Create a token and return it with its secret, which is never stored and never shown again. A request signed
    with an expiring token (`created_with`) cannot create one that outlives it (found by QA: a token that expired
    tomorrow made one that never expired)."""
    if not name.strip():
        raise ValidationFailed("give the token a name", field="name")
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expiry must be in the future", field="expires_at")
    limit = created_with.expires_at if created_with is not None else None
    if limit is not None and (expires_at is None or expires_at > limit):
        raise ValidationFailed(f"this request is signed with a token that expires at {limit.isoformat()}: a token it "
                               "creates must expire by then (give expires_at no later, or sign in to the console)",
                               field="expires_at")
    # The membership row stays locked until the token is written: a removal running beside this (membership_delete
    # revokes the member's tokens) cannot miss a token committed after it (review, 2026-11-29).
    if not Membership.objects.select_for_update().filter(team=team, user=user).exists():
        raise ValidationFailed(f"{user.get_username()} is not a member of {team.name}", field="team")
    for _ in range(3):
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(
                    team=team, user=user, name=name.strip(), prefix=raw[:10],
                    token_hash=hash_token(raw), expires_at=expires_at,
                )
            break
        except IntegrityError:  # pragma: no cover - a SHA-256 collision of 256 random bits
            continue
    else:  # pragma: no cover
        raise ConflictError("could not generate a unique token; try again")
    audit_record(actor=actor, team=team, action="api_token.create", target=token,
                 data={"name": token.name, "owner": user.get_username(),
                       "expires_at": expires_at.isoformat() if expires_at else None})
    return token, raw


@transaction.atomic
def api_token_revoke(*, actor, token: ApiToken) -> ApiToken:
    token = ApiToken.objects.select_for_update().get(pk=token.pk)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, team=token.team_id, action="api_token.revoke", target=token,
                     data={"name": token.name, "owner": token.user.get_username()})
    return token


@transaction.atomic
def api_token_delete(*, actor, token: ApiToken) -> None:
    """Remove a token (DELETE): it stops authenticating and is gone from the list, with an audit event naming
    it. (DELETE used to revoke, answer 204 and leave the token readable: found by schemathesis, S7.) Revoke
    instead to keep the token's row on record."""
    audit_record(actor=actor, team=token.team_id, action="api_token.delete", target=token,
                 data={"name": token.name, "prefix": token.prefix, "owner": token.user.get_username()})
    token.delete()


def api_token_authenticate(*, raw: str) -> ApiToken | None:
    """The active token for a raw secret, or None. Records when it was last used (coarsely)."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("user", "team").filter(token_hash=hash_token(raw)).first()
    if token is None or not token.is_active() or not token.user.is_active:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


@transaction.atomic
def login_failure_record(*, username: str, address: str, now=None) -> None:
    """Count one failed sign-in against the username and the address; lock a key that reached its limit."""
    now = now or timezone.now()
    for key, limit in login_keys(username=username, address=address):
        LoginThrottle.objects.get_or_create(key=key, defaults={"window_started_at": now})
        row = LoginThrottle.objects.select_for_update().get(key=key)
        if now - row.window_started_at > LOGIN_WINDOW:
            row.failures, row.window_started_at = 0, now
        row.failures += 1
        if row.failures >= limit:
            row.locked_until = now + LOGIN_LOCKOUT
            row.failures, row.window_started_at = 0, now
            logger.warning("sign-in locked for %s until %s after %d failures", key, row.locked_until, limit)
        row.save(update_fields=["failures", "window_started_at", "locked_until"])


def login_success_record(*, username: str) -> None:
    """A right password clears the username's count (not the address's: a sprayer may own one account)."""
    LoginThrottle.objects.filter(key=login_keys(username=username, address="")[0][0]).delete()
