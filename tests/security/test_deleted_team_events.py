"""A deleted team's audit events outlive it (team set to null, its name kept) and are then listed with the
cluster-wide events: to operators, and to nobody else. Operators are the platform's cluster-wide role (staff, signed in
with a session; README, Tenancy): they read every team's events in the Django admin already, so this is the rule, not
a leak. A staff user's team token is not an operator's (test_token_narrowing) and does not list them; former
members, another team's members and viewers do not either."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from controlplane.tenancy.models import AuditEvent, Team
from controlplane.tenancy.services import api_token_create, membership_set, team_create
from tests.conftest import client_for


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _gamma_events(client) -> list[dict]:
    response = client.get("/api/v1/audit-events/?page_size=500")
    assert response.status_code == 200
    return [e for e in response.json()["results"] if e["team"] == "gamma"]


def test_a_deleted_teams_events_are_listed_to_operators_only(world):
    ops, alpha = world["ops"], world["alpha"]
    former = get_user_model().objects.create_user("gamma-admin", password="pw-123456789")
    gamma = team_create(actor=ops, name="gamma", admin=former)
    api_token_create(actor=former, team=gamma, user=former, name="gamma-ci")
    assert len(_gamma_events(_session(former))) == 2  # while the team lives: its members'
    assert _gamma_events(_session(ops)) == []  # ... and not an operator's who is not a member
    Team.objects.filter(pk=gamma.pk).delete()
    assert AuditEvent.objects.filter(team__isnull=True, team_name="gamma").count() == 2  # kept, under no team

    listed = _gamma_events(_session(ops))
    assert {e["action"] for e in listed} == {"team.create", "api_token.create"}
    assert next(e for e in listed if e["action"] == "api_token.create")["data"]["name"] == "gamma-ci"
    assert _gamma_events(_session(former)) == []
    for role in ("admin", "member", "viewer"):
        assert _gamma_events(_session(alpha[role])) == []
        assert _gamma_events(client_for(alpha[role], alpha["team"])) == []
    membership_set(actor=alpha["admin"], team=alpha["team"], username=ops.username, role="viewer")
    assert _gamma_events(client_for(ops, alpha["team"])) == []  # a staff user's team token: that team's only
