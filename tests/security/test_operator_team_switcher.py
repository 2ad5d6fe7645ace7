"""The console's team choice (the job and deployment forms' team select, the header's teams) lists the teams the
user belongs to, operators included. Operators see every team's name in `GET /api/v1/teams/` (to name them in a
cluster queue's `teams`), but what a team owns stays its members' (README, Tenancy): an operator who is not a member
cannot submit, list or read a team's work, so offering that team in the console would only lead to a refusal."""

from __future__ import annotations

from django.test import Client

from controlplane.tenancy.services import membership_set, team_create
from tests.conftest import JOB_BODY


def test_the_console_offers_an_operator_their_own_teams_and_the_api_agrees(world):
    ops, alpha = world["ops"], world["alpha"]
    membership_set(actor=alpha["admin"], team=alpha["team"], username=ops.username, role="member")
    team_create(actor=ops, name="gamma", admin=ops)  # two teams of their own: the forms show the team select
    browser = Client()
    browser.force_login(ops)
    for path in ("/jobs/new/", "/deployments/new/", "/team/"):
        response = browser.get(path)
        assert response.status_code == 200, path
        assert [team.name for team in response.context["teams"]] == ["alpha", "gamma"], path
    page = browser.get("/jobs/new/").content.decode()
    assert '<option value="alpha"' in page and '<option value="gamma"' in page and '<option value="beta"' not in page
    # the API: every team's name to the operator, but no work in a team they do not belong to
    assert {t["name"] for t in browser.get("/api/v1/teams/").json()["results"]} == {"alpha", "beta", "gamma"}
    refused = browser.post("/api/v1/training-jobs/", {**JOB_BODY, "team": "beta"}, content_type="application/json")
    assert refused.status_code == 400 and refused.json() == {"team": ["no team named 'beta' among your teams"]}
    assert all(job["team"] != "beta" for job in browser.get("/api/v1/training-jobs/").json()["results"])
