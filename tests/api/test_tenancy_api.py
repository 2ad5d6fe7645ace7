"""Teams, memberships, API tokens, the audit log and /me through the REST API."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.tenancy.models import ApiToken, AuditEvent, Membership
from controlplane.tenancy.services import hash_token


def test_anonymous_requests_are_rejected(world):
    response = APIClient().get("/api/v1/training-jobs/")
    assert response.status_code in (401, 403)


def test_me_lists_teams_and_roles(api):
    body = api("alpha", "viewer").get("/api/v1/me/").json()
    assert body["username"] == "alpha-viewer"
    assert body["teams"] == [{"name": "alpha", "role": "viewer"}]
    assert body["token_team"] == "alpha"


def test_token_is_stored_hashed_shown_once_and_works(api, world):
    client = api("alpha", "member")
    response = client.post("/api/v1/api-tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201
    raw = response.json()["token"]
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.token_hash == hash_token(raw) and raw not in token.token_hash
    assert "token" not in client.get(f"/api/v1/api-tokens/{token.pk}/").json()
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert fresh.get("/api/v1/me/").status_code == 200


def test_revoked_and_expired_tokens_are_refused(api, world):
    client = api("alpha", "member")
    raw = client.post("/api/v1/api-tokens/", {"name": "short"}, format="json").json()
    assert client.post(f"/api/v1/api-tokens/{raw['id']}/revoke/").json()["active"] is False
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {raw['token']}")
    assert fresh.get("/api/v1/me/").status_code == 401
    expiring = client.post("/api/v1/api-tokens/", {"name": "exp", "expires_at":
                           (timezone.now() + timedelta(hours=1)).isoformat()}, format="json").json()
    ApiToken.objects.filter(pk=expiring["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {expiring['token']}")
    assert fresh.get("/api/v1/me/").status_code == 401
    fresh.credentials(HTTP_AUTHORIZATION="Bearer fy_not-a-real-token")
    assert fresh.get("/api/v1/me/").status_code == 401


def test_token_expiry_in_the_past_is_a_field_error(api):
    response = api("alpha", "member").post("/api/v1/api-tokens/", {
        "name": "old", "expires_at": (timezone.now() - timedelta(days=1)).isoformat()}, format="json")
    assert response.status_code == 400 and "expires_at" in response.json()


def test_an_expiring_token_cannot_create_one_that_outlives_it(api, world):
    client = api("alpha", "member")
    tomorrow = timezone.now() + timedelta(days=1)
    short = client.post("/api/v1/api-tokens/", {"name": "short", "expires_at": tomorrow.isoformat()},
                        format="json").json()
    signed = APIClient()
    signed.credentials(HTTP_AUTHORIZATION=f"Bearer {short['token']}")
    before = ApiToken.objects.count()
    for body in ({"name": "forever"}, {"name": "later", "expires_at": (tomorrow + timedelta(days=30)).isoformat()}):
        response = signed.post("/api/v1/api-tokens/", body, format="json")
        assert response.status_code == 400, response.content
        assert "must expire by then" in " ".join(response.json()["expires_at"])
    assert ApiToken.objects.count() == before  # nothing created
    sooner = signed.post("/api/v1/api-tokens/", {"name": "sooner", "expires_at": (tomorrow - timedelta(hours=1))
                                                 .isoformat()}, format="json")
    assert sooner.status_code == 201
    # a token that never expires (the fixture's) still creates one that never expires
    assert client.post("/api/v1/api-tokens/", {"name": "forever"}, format="json").status_code == 201


def test_members_see_only_their_own_tokens_admins_see_all(api, world):
    api("alpha", "member").post("/api/v1/api-tokens/", {"name": "mine"}, format="json")
    viewer_names = {t["username"] for t in api("alpha", "viewer").get("/api/v1/api-tokens/").json()["results"]}
    assert viewer_names == {"alpha-viewer"}
    admin_names = {t["username"] for t in api("alpha", "admin").get("/api/v1/api-tokens/").json()["results"]}
    assert {"alpha-member", "alpha-viewer", "alpha-admin"} <= admin_names


def test_membership_management_needs_admin(api, world):
    body = {"username": "beta-member", "role": "viewer"}
    assert api("alpha", "member").post("/api/v1/memberships/", body, format="json").status_code == 403
    response = api("alpha", "admin").post("/api/v1/memberships/", body, format="json")
    assert response.status_code == 201 and response.json()["team"] == "alpha"
    assert Membership.objects.filter(team=world["alpha"]["team"], user__username="beta-member").exists()


def test_membership_bad_input_names_the_field(api):
    client = api("alpha", "admin")
    response = client.post("/api/v1/memberships/", {"username": "nobody", "role": "viewer"}, format="json")
    assert response.status_code == 400 and "username" in response.json()
    response = client.post("/api/v1/memberships/", {"username": "beta-member", "role": "king"}, format="json")
    assert response.status_code == 400 and "role" in response.json()


def test_last_admin_cannot_be_demoted_or_removed(api, world):
    client = api("alpha", "admin")
    admin_membership = Membership.objects.get(team=world["alpha"]["team"], role="admin")
    response = client.patch(f"/api/v1/memberships/{admin_membership.pk}/", {"role": "member"}, format="json")
    assert response.status_code == 409 and "role" in response.json()
    assert client.delete(f"/api/v1/memberships/{admin_membership.pk}/").status_code == 409
    admin_membership.refresh_from_db()
    assert admin_membership.role == "admin"


def test_team_creation_is_for_operators(api, world):
    assert api("alpha", "admin").post("/api/v1/teams/", {"name": "gamma"}, format="json").status_code == 403
    response = api("ops").post("/api/v1/teams/", {"name": "gamma"}, format="json")
    assert response.status_code == 201
    assert api("ops").post("/api/v1/teams/", {"name": "gamma"}, format="json").status_code == 400
    response = api("ops").post("/api/v1/teams/", {"name": "Not A Slug!"}, format="json")
    assert response.status_code == 400 and "name" in response.json()


def test_operators_list_every_team_and_others_only_their_own(api, world):
    """QA: an operator's `GET /api/v1/teams/` listed only the teams they belonged to (none, for an operator who
    created none), while they name any team in a cluster queue's `teams` and see every team there."""
    from controlplane.tenancy.models import Team
    from controlplane.tenancy.services import team_create

    team_create(actor=world["ops"], name="gamma")  # made in the admin, say: the operator is no member
    every = sorted(Team.objects.values_list("name", flat=True))
    assert every == ["alpha", "beta", "gamma"]
    ops = api("ops")
    assert [t["name"] for t in ops.get("/api/v1/teams/").json()["results"]] == every
    gamma = Team.objects.get(name="gamma")
    assert ops.get(f"/api/v1/teams/{gamma.pk}/").json()["name"] == "gamma"
    for role in ("admin", "member", "viewer"):
        client = api("alpha", role)
        assert [t["name"] for t in client.get("/api/v1/teams/").json()["results"]] == ["alpha"]
        assert client.get(f"/api/v1/teams/{gamma.pk}/").status_code == 404
    session = APIClient()
    session.force_login(world["beta"]["member"])
    assert [t["name"] for t in session.get("/api/v1/teams/").json()["results"]] == ["beta"]


def test_every_write_is_audited(api, world):
    before = AuditEvent.objects.count()
    api("alpha", "member").post("/api/v1/datasets/", {"name": "d1"}, format="json")
    event = AuditEvent.objects.order_by("-id").first()
    assert AuditEvent.objects.count() > before
    assert event.action == "dataset.create" and event.actor_label == "alpha-member"
    listed = api("alpha", "viewer").get("/api/v1/audit-events/?action=dataset.create").json()["results"]
    assert listed and listed[0]["data"]["name"] == "d1"


def test_operators_see_cluster_wide_events_and_teams_do_not(api, world):
    """QA (2026-11-29): events of no team (cluster queues, node pools, cordons) were only in the Django admin."""
    created = api("ops").post("/api/v1/priority-classes/", {"name": "urgent", "value": 900}, format="json")
    assert created.status_code == 201
    assert AuditEvent.objects.filter(action="priority_class.create", team__isnull=True).exists()
    seen = api("ops").get("/api/v1/audit-events/?action=priority_class.create").json()["results"]
    assert "urgent" in [e["data"]["name"] for e in seen]
    assert api("alpha", "admin").get("/api/v1/audit-events/?action=priority_class.create").json()["results"] == []


def test_session_auth_works_for_the_console(world):
    client = APIClient()
    assert client.login(username="alpha-admin", password="pw-123456789")
    assert client.get("/api/v1/me/").json()["token_team"] is None


def test_removing_a_member_revokes_their_tokens_of_that_team(api, world):
    """Found by QA: a removed member's tokens stayed listed as active and worked again in full once the user was
    added back. Now removal revokes them (other teams' tokens of the user are untouched)."""
    member = world["alpha"]["member"]
    client = api("alpha", "member")
    raw = client.post("/api/v1/api-tokens/", {"name": "laptop"}, format="json").json()["token"]
    other = ApiToken.objects.create(team=world["beta"]["team"], user=member, name="beta", prefix="fy_other",
                                    token_hash=hash_token("fy_other"))
    Membership.objects.create(team=world["beta"]["team"], user=member, role="member")
    admin = api("alpha", "admin")
    membership = Membership.objects.get(team=world["alpha"]["team"], user=member)
    assert admin.delete(f"/api/v1/memberships/{membership.pk}/").status_code == 204
    listed = {t["name"]: t["active"] for t in admin.get("/api/v1/api-tokens/?team__name=alpha").json()["results"]
              if t["username"] == member.username}
    assert listed and not any(listed.values()), listed
    assert admin.post("/api/v1/memberships/", {"username": member.username, "role": "member"},
                      format="json").status_code == 201
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert fresh.get("/api/v1/me/").status_code == 401
    other.refresh_from_db()
    assert other.is_active()
    event = AuditEvent.objects.filter(action="membership.delete").latest("id")
    assert len(event.data["tokens_revoked"]) == len(listed)


def test_a_deleted_teams_audit_trail_is_kept_under_its_name(api, world):
    """QA (2026-11-29): AuditEvent.team cascaded, so deleting a team (the Django admin can) deleted every audit event
    of it: who created its jobs, changed its members, used its tokens."""
    from django.contrib.auth import get_user_model

    from controlplane.tenancy.models import AuditEvent, Team
    from controlplane.tenancy.services import team_create

    admin = get_user_model().objects.create_user("gamma-admin", password="pw-123456789")
    gamma = team_create(actor=world["ops"], name="gamma", admin=admin)
    kept = set(AuditEvent.objects.filter(team=gamma).values_list("pk", flat=True))
    assert kept and set(AuditEvent.objects.filter(pk__in=kept).values_list("team_name", flat=True)) == {"gamma"}
    Team.objects.filter(pk=gamma.pk).delete()
    assert set(AuditEvent.objects.filter(pk__in=kept).values_list("team_name", flat=True)) == {"gamma"}
    listed = api("ops").get("/api/v1/audit-events/", {"page_size": 200}).json()["results"]
    assert {event["team"] for event in listed if event["id"] in kept} == {"gamma"}
    mine = api("alpha", "admin").get("/api/v1/audit-events/", {"page_size": 200}).json()["results"]
    assert not kept & {event["id"] for event in mine}  # not another team's to read
