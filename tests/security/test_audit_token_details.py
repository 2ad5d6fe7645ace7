"""Audit events that name API tokens (a token's create, revoke and delete; a member's removal, which revokes their
tokens) show the token's name and prefix only where the token list would show the token: to its owner and the
team's admins (and operators). Members and viewers see that the event happened, with those fields null (README,
Tenancy)."""

from __future__ import annotations

from django.test import Client

from controlplane.tenancy.models import ApiToken
from controlplane.tenancy.services import api_token_create, api_token_delete, api_token_revoke, membership_delete
from tests.conftest import client_for

SECRET_NAME = "member-ci-token-x9"


def _token_events(client) -> list[dict]:
    events = client.get("/api/v1/audit-events/?page_size=500").json()["results"]
    return [e for e in events if e["action"] in ("api_token.create", "api_token.revoke", "api_token.delete",
                                                  "membership.delete")]


def _setup(world):
    alpha = world["alpha"]
    kept, kept_raw = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"],
                                      name=SECRET_NAME + "-revoked")
    api_token_revoke(actor=alpha["admin"], token=kept)
    gone, _ = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name=SECRET_NAME)
    prefix = gone.prefix
    api_token_delete(actor=alpha["admin"], token=gone)
    api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name=SECRET_NAME + "-removed")
    membership = alpha["team"].memberships.get(user=alpha["member"])
    revoked = list(ApiToken.objects.filter(user=alpha["member"], revoked_at__isnull=True).values_list("prefix",
                                                                                                   flat=True))
    membership_delete(actor=alpha["admin"], membership=membership)
    return prefix, revoked


def test_a_viewer_sees_token_events_but_not_another_members_token_names_or_prefixes(world):
    prefix, revoked = _setup(world)
    alpha = world["alpha"]
    for client in (client_for(alpha["viewer"], alpha["team"]), _session(alpha["viewer"])):
        response = client.get("/api/v1/audit-events/?page_size=500")
        assert response.status_code == 200
        body = response.content.decode()
        assert SECRET_NAME not in body and prefix not in body
        assert not any(p in body for p in revoked)
        events = _token_events(client)
        assert {e["action"] for e in events} == {"api_token.create", "api_token.revoke", "api_token.delete",
                                                 "membership.delete"}
        deleted = next(e for e in events if e["action"] == "api_token.delete")
        assert deleted["data"]["name"] is None and deleted["data"]["prefix"] is None
        assert deleted["data"]["owner"] == alpha["member"].username
        removal = next(e for e in events if e["action"] == "membership.delete")
        assert removal["data"]["tokens_revoked"] is None and removal["data"]["username"] == alpha["member"].username


def test_the_owner_and_the_teams_admins_and_operators_see_the_token_details(world):
    prefix, revoked = _setup(world)
    alpha = world["alpha"]
    # the admin (token and session)
    for client in (client_for(alpha["admin"], alpha["team"]), _session(alpha["admin"])):
        events = _token_events(client)
        deleted = next(e for e in events if e["action"] == "api_token.delete")
        assert deleted["data"]["name"] == SECRET_NAME and deleted["data"]["prefix"] == prefix
        removal = next(e for e in events if e["action"] == "membership.delete")
        assert removal["data"]["tokens_revoked"] == revoked and revoked
    # an operator who is a viewer of the team, signed in: as in the Django admin
    from controlplane.tenancy.services import membership_set

    membership_set(actor=alpha["admin"], team=alpha["team"], username=world["ops"].username, role="viewer")
    deleted = next(e for e in _token_events(_session(world["ops"])) if e["action"] == "api_token.delete")
    assert deleted["data"]["name"] == SECRET_NAME
    # with a team token the operator is that team's viewer (test_token_narrowing): no details
    deleted = next(e for e in _token_events(client_for(world["ops"], alpha["team"]))
                   if e["action"] == "api_token.delete")
    assert deleted["data"]["name"] is None


def test_the_owner_sees_their_own_tokens_details_and_a_member_not_another_members(world):
    alpha = world["alpha"]
    own, _ = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="mine-x1")
    api_token_delete(actor=alpha["admin"], token=own)
    other, _ = api_token_create(actor=alpha["viewer"], team=alpha["team"], user=alpha["viewer"], name="theirs-x2")
    api_token_delete(actor=alpha["viewer"], token=other)
    events = _token_events(client_for(alpha["member"], alpha["team"]))
    names = {e["data"]["name"] for e in events if e["action"] == "api_token.delete"}
    assert "mine-x1" in names and "theirs-x2" not in names
    assert "theirs-x2" not in client_for(alpha["member"], alpha["team"]).get("/api/v1/audit-events/").content.decode()


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client
