"""Deployments through the REST API: create with an SLA, validation, revisions, delete."""

from __future__ import annotations

import pytest

from inference.models import Deployment
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY


def create(client, **overrides):
    return client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, **overrides}, format="json")


def test_create_records_spec_revision_and_timeline(api):
    client = api("alpha", "member")
    response = create(client)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["spec"]["sla"] == {"ttft_p95_ms": 500, "tpot_p95_ms": 50, "min_throughput_tps": None}
    assert body["spec"]["devices_per_replica"] == 0.5
    assert body["status"]["state"] == "PENDING"  # the deploy task runs after the commit
    assert body["status"]["reason"] == "waiting to be placed and deployed"
    assert body["spec"]["revision"] == 1 and body["spec"]["router"] == "prefix" and body["spec"]["engine"] == {}
    revisions = client.get(f"/api/v1/deployments/{body['id']}/revisions/").json()["results"]
    assert [r["number"] for r in revisions] == [1] and revisions[0]["spec"]["replicas_max"] == 3
    events = client.get(f"/api/v1/deployments/{body['id']}/events/").json()["results"]
    assert [e["to_state"] for e in events] == ["PENDING"]


def test_create_from_a_training_job(api):
    client = api("alpha", "member")
    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    response = create(client, model_uri="", source_job=job["id"])
    assert response.status_code == 201 and response.json()["spec"]["source_job"] == job["id"]


@pytest.mark.parametrize("overrides,field", [
    ({"sla": {"ttft_p95_ms": 0, "tpot_p95_ms": 50}}, "sla"),
    ({"sla": {"tpot_p95_ms": 50}}, "sla"),
    ({"replicas_min": 3, "replicas_max": 1}, "replicas_max"),
    ({"model_uri": ""}, "model_uri"),
    ({"model_uri": "", "source_job": 999999}, "source_job"),
    ({"accelerator_types": ["ascend-910b"]}, "accelerator_types"),
    ({"devices_per_replica": 0}, "devices_per_replica"),
    ({"queue": "missing"}, "queue"),
])
def test_bad_input_names_the_field(api, overrides, field):
    response = create(api("alpha", "member"), **overrides)
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not Deployment.objects.exists()


def test_live_names_are_unique_per_team_but_reusable_after_delete(api):
    client = api("alpha", "member")
    first = create(client).json()
    duplicate = create(client)
    assert duplicate.status_code == 400 and "name" in duplicate.json()
    assert create(api("beta", "member")).status_code == 201  # another team may use the name
    assert client.delete(f"/api/v1/deployments/{first['id']}/").status_code == 204
    assert client.get(f"/api/v1/deployments/{first['id']}/").json()["status"]["state"] == "DELETED"
    assert client.delete(f"/api/v1/deployments/{first['id']}/").status_code == 409
    assert create(client).status_code == 201


def test_viewer_cannot_create_or_delete(api):
    assert create(api("alpha", "viewer")).status_code == 403
    created = create(api("alpha", "member")).json()
    assert api("alpha", "viewer").delete(f"/api/v1/deployments/{created['id']}/").status_code == 403


def _lm_folder(tmp_path, **shape):
    """A model folder whose config.json is a built-in LM's (format 1) of the given shape."""
    import json

    model = {"vocab_size": 258, "context": 256, "d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, **shape}
    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"format": 1, "model": model, "step": 1}))
    (folder / "model.pt").write_bytes(b"weights")
    return f"file://{folder}"


def test_a_model_whose_replicas_would_not_fit_their_kv_memory_is_refused_with_the_arithmetic(api, tmp_path):
    """32K window x 256 slots of a 4-layer d=192 model: about 48 GiB of keys and values per replica, which would
    fail at replica start (out of memory); refused at submit instead, naming the engine settings."""
    client = api("alpha", "member")
    uri = _lm_folder(tmp_path, context=32768, d_model=192, n_layers=4)
    response = create(client, model_uri=uri, engine={"slots": 256})
    assert response.status_code == 400, response.json()
    why = response.json()["engine"][0]
    assert "48.1 GiB" in why and "over the 8.0 GiB a replica may hold" in why and "lower engine.slots" in why
    assert not Deployment.objects.exists()
    ok = create(client, model_uri=uri, engine={"slots": 2})  # about 0.4 GiB
    assert ok.status_code == 201, ok.json()
    bigger = client.patch(f"/api/v1/deployments/{ok.json()['id']}/", {"engine": {"slots": 200}}, format="json")
    assert bigger.status_code == 400 and "GiB" in bigger.json()["engine"][0]
    assert Deployment.objects.get().engine == {"slots": 2}  # nothing half-written


def test_a_model_shape_out_of_bounds_is_refused_naming_the_model_uri(api, tmp_path):
    response = create(api("alpha", "member"), model_uri=_lm_folder(tmp_path, context=10**6))
    assert response.status_code == 400 and "context" in response.json()["model_uri"][0], response.json()
