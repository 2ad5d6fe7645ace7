"""Cross-team isolation on every team-owned object endpoint: another team's object is a 404 and never listed."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.datasets.services import dataset_create, dataset_version_upload
from controlplane.tenancy.models import AuditEvent, Membership
from controlplane.tenancy.services import api_token_create
from inference.services import deployment_create
from jobs.services import training_job_create


@pytest.fixture
def beta_objects(world):
    """One of every team-owned object, all in team beta."""
    beta = world["beta"]
    team, admin = beta["team"], beta["admin"]
    dataset = dataset_create(actor=admin, team=team, name="corpus")
    dataset_version_upload(actor=admin, dataset=dataset, upload=SimpleUploadedFile("a.txt", b"hello"))
    job = training_job_create(actor=admin, team=team, name="secret-job", local_queue=beta["queue"],
                              accelerator_types=["nvidia-h100"])
    deployment = deployment_create(actor=admin, team=team, name="secret-svc", local_queue=beta["queue"],
                                   accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                                   model_uri="file:///m")
    token, _ = api_token_create(actor=admin, team=team, user=admin, name="beta-token")
    return {
        "teams": team.pk,
        "memberships": Membership.objects.filter(team=team).first().pk,
        "api-tokens": token.pk,
        "audit-events": AuditEvent.objects.filter(team=team).first().pk,
        "local-queues": beta["queue"].pk,
        "datasets": dataset.pk,
        "training-jobs": job.pk,
        "deployments": deployment.pk,
    }


TEAM_OWNED = ["teams", "memberships", "api-tokens", "audit-events", "local-queues", "datasets",
              "training-jobs", "deployments"]
DETAIL_ACTIONS = {
    "api-tokens": [("post", "revoke")],
    "datasets": [("get", "versions"), ("post", "versions")],
    "training-jobs": [("post", "cancel"), ("get", "events")],
    "deployments": [("get", "revisions"), ("get", "events")],
}
DELETABLE = ["memberships", "api-tokens", "datasets", "training-jobs", "deployments"]


@pytest.mark.parametrize("endpoint", TEAM_OWNED)
@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_other_teams_objects_are_not_listed(api, beta_objects, endpoint, role):
    response = api("alpha", role).get(f"/api/v1/{endpoint}/?page_size=500")
    assert response.status_code == 200
    ids = [item["id"] for item in response.json()["results"]]
    assert beta_objects[endpoint] not in ids


@pytest.mark.parametrize("endpoint", TEAM_OWNED)
def test_other_teams_object_is_404(api, beta_objects, endpoint):
    client = api("alpha", "admin")
    url = f"/api/v1/{endpoint}/{beta_objects[endpoint]}/"
    assert client.get(url).status_code == 404
    assert client.patch(url, {"role": "viewer"}, format="json").status_code in (404, 405)
    for method, name in DETAIL_ACTIONS.get(endpoint, []):
        assert getattr(client, method)(f"{url}{name}/", {}, format="json").status_code == 404, name


@pytest.mark.parametrize("endpoint", DELETABLE)
def test_other_teams_object_cannot_be_deleted(api, beta_objects, endpoint):
    from django.apps import apps

    response = api("alpha", "admin").delete(f"/api/v1/{endpoint}/{beta_objects[endpoint]}/")
    assert response.status_code == 404
    model = {"memberships": "tenancy.Membership", "api-tokens": "tenancy.ApiToken",
             "datasets": "datasets.Dataset", "training-jobs": "jobs.TrainingJob",
             "deployments": "inference.Deployment"}[endpoint]
    assert apps.get_model(model).objects.filter(pk=beta_objects[endpoint]).exists()


@pytest.mark.parametrize("endpoint", TEAM_OWNED)
def test_own_team_object_is_visible(api, beta_objects, endpoint):
    client = api("beta", "admin")
    assert client.get(f"/api/v1/{endpoint}/{beta_objects[endpoint]}/").status_code == 200


def test_cannot_create_in_another_team(api, world):
    client = api("alpha", "admin")
    for endpoint, body in [("datasets", {"name": "x"}),
                           ("training-jobs", {"name": "x", "queue": "default", "accelerator_types": ["cpu"]}),
                           ("local-queues", {"name": "x", "cluster_queue": "shared"}),
                           ("memberships", {"username": "alpha-member", "role": "admin"})]:
        response = client.post(f"/api/v1/{endpoint}/", {**body, "team": "beta"}, format="json")
        assert response.status_code == 400, endpoint
        assert "team" in response.json(), endpoint


def test_token_narrows_a_multi_team_user_to_its_team(world, api):
    from controlplane.tenancy.models import Role
    from controlplane.tenancy.services import membership_set
    from tests.conftest import client_for

    alpha_admin = world["alpha"]["admin"]
    membership_set(actor=world["beta"]["admin"], team=world["beta"]["team"], username=alpha_admin.username,
                   role=Role.MEMBER)
    training_job_create(actor=world["beta"]["admin"], team=world["beta"]["team"], name="b-job",
                        local_queue=world["beta"]["queue"], accelerator_types=["cpu"], devices_per_worker=0)
    alpha_token_client = client_for(alpha_admin, world["alpha"]["team"])
    names = [job["name"] for job in alpha_token_client.get("/api/v1/training-jobs/").json()["results"]]
    assert "b-job" not in names
    session_names = [job["name"] for job in client_for(alpha_admin).get("/api/v1/training-jobs/").json()["results"]]
    assert "b-job" in session_names
