"""Training jobs through the REST API: submit, validation, list/filter, cancel, delete, timeline."""

from __future__ import annotations

import pytest
from django.test import TestCase

from jobs.models import TrainingJob
from tests.conftest import JOB_BODY


def submit(client, **overrides):
    # Run the on-commit callbacks (the enqueue task, eager in tests) as a committed request would.
    with TestCase.captureOnCommitCallbacks(execute=True):
        return client.post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")


def test_submit_records_spec_status_and_queues_the_job(api):
    response = submit(api("alpha", "member"), priority="standard", checkpoint={"interval_steps": 50})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["team"] == "alpha" and body["spec"]["queue"] == "default"
    assert body["spec"]["workers_min"] == 2 and body["spec"]["workers_max"] == 4
    assert body["spec"]["checkpoint"] == {"interval_steps": 50, "keep_last": 3}
    assert body["spec"]["priority"] == "standard"
    # The enqueue task ran after commit (eager in tests): PENDING -> QUEUED with a reason.
    job = TrainingJob.objects.get(pk=body["id"])
    assert job.state == "QUEUED" and job.queue_position == 1
    # The scheduling cycle ran too: no nodes are registered here, and the reason says so.
    assert "position 1 in cluster queue shared: no schedulable nvidia-h100 nodes" in job.state_reason
    assert body["status"]["queue_position"] is None  # the response was made before the cycle ran
    events = api("alpha", "viewer").get(f"/api/v1/training-jobs/{job.pk}/events/").json()["results"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [("", "PENDING"), ("PENDING", "QUEUED")]
    assert events[0]["actor_label"] == "alpha-member" and events[1]["actor_label"] == "system:queue"


@pytest.mark.parametrize("overrides,field", [
    ({"queue": "nope"}, "queue"),
    ({"accelerator_types": ["kunlun-p800"]}, "accelerator_types"),
    ({"accelerator_types": ["tpu-v9"]}, "accelerator_types"),
    ({"accelerator_types": []}, "accelerator_types"),
    ({"accelerator_types": ["nvidia-h100", "nvidia-h100"]}, "accelerator_types"),
    ({"workers_min": 4, "workers_max": 2}, "workers_max"),
    ({"workers_min": 0}, "workers_min"),
    ({"priority": "ultra"}, "priority"),
    ({"dataset": "dataset://missing@1"}, "dataset"),
    ({"dataset": "not a ref!"}, "dataset"),
    ({"trainer": "entrypoint"}, "entrypoint"),
    ({"trainer": "magic"}, "trainer"),
    ({"name": "Bad Name"}, "name"),
    ({"devices_per_worker": 0}, "devices_per_worker"),
    ({"envs": {"A": {"nested": 1}}}, "envs"),
    ({"checkpoint": {"interval_steps": 0}}, "checkpoint"),
    ({"team": "beta"}, "team"),
])
def test_bad_submissions_name_the_field_and_write_nothing(api, overrides, field):
    response = submit(api("alpha", "member"), **overrides)
    assert response.status_code == 400, response.json()
    assert field in response.json(), response.json()
    assert not TrainingJob.objects.exists()


def test_quota_error_says_what_the_queue_has(api):
    body = submit(api("alpha", "member"), accelerator_types=["kunlun-p800"]).json()
    assert "has no quota for kunlun-p800" in body["accelerator_types"][0]
    assert "nvidia-h100" in body["accelerator_types"][0]


def test_viewer_cannot_submit_or_cancel(api):
    assert submit(api("alpha", "viewer")).status_code == 403
    job = submit(api("alpha", "member")).json()
    assert api("alpha", "viewer").post(f"/api/v1/training-jobs/{job['id']}/cancel/").status_code == 403


def test_list_filters_and_ordering(api):
    client = api("alpha", "member")
    first = submit(client, name="first").json()
    submit(client, name="second")
    client.post(f"/api/v1/training-jobs/{first['id']}/cancel/")
    names = lambda url: [j["name"] for j in client.get(url).json()["results"]]  # noqa: E731
    assert names("/api/v1/training-jobs/?state=CANCELLED") == ["first"]
    assert names("/api/v1/training-jobs/?state=QUEUED") == ["second"]
    assert names("/api/v1/training-jobs/?ordering=name") == ["first", "second"]
    assert names("/api/v1/training-jobs/?ordering=-name") == ["second", "first"]
    assert names("/api/v1/training-jobs/?search=sec") == ["second"]
    page = client.get("/api/v1/training-jobs/?page_size=1").json()
    assert page["count"] == 2 and len(page["results"]) == 1 and page["next"]
    assert client.get("/api/v1/training-jobs/?state=BOGUS").status_code == 400


def test_cancel_then_delete(api):
    client = api("alpha", "member")
    job = submit(client).json()
    assert client.delete(f"/api/v1/training-jobs/{job['id']}/").status_code == 409
    response = client.post(f"/api/v1/training-jobs/{job['id']}/cancel/", {"reason": "wrong data"}, format="json")
    assert response.status_code == 200 and response.json()["status"]["state"] == "CANCELLED"
    assert response.json()["status"]["reason"] == "wrong data"
    assert response.json()["status"]["finished_at"]
    again = client.post(f"/api/v1/training-jobs/{job['id']}/cancel/")
    assert again.status_code == 409 and "state" in again.json()
    assert client.delete(f"/api/v1/training-jobs/{job['id']}/").status_code == 204
    assert not TrainingJob.objects.exists()


def test_a_job_whose_checkpoint_a_deployment_serves_is_not_deleted_before_it(api, world):
    """Deleting it left the deployment serving with no source: scaling or updating it was then refused ("give a
    model_uri or a source_job whose checkpoint to serve"), and it could not be pointed anywhere else (QA)."""
    from inference.models import Deployment

    client = api("alpha", "member")
    job = submit(client).json()
    client.post(f"/api/v1/training-jobs/{job['id']}/cancel/")
    alpha = world["alpha"]
    serving = Deployment.objects.create(team=alpha["team"], name="chat", local_queue=alpha["queue"],
                                        source_job_id=job["id"], accelerator_types=["nvidia-a100"],
                                        sla_ttft_p95_ms=500, sla_tpot_p95_ms=50, state="SERVING")
    refused = client.delete(f"/api/v1/training-jobs/{job['id']}/")
    assert refused.status_code == 409 and "chat" in str(refused.json()["deployments"]), refused.json()
    assert TrainingJob.objects.filter(pk=job["id"]).exists()
    Deployment.objects.filter(pk=serving.pk).update(state="DELETED")  # once it is deleted, the job may go
    assert client.delete(f"/api/v1/training-jobs/{job['id']}/").status_code == 204


def test_cancel_of_a_running_job_stops_and_releases_its_run(api, monkeypatch):
    from controlplane.compute.registry import get_compute_backend
    from jobs import workflows

    client = api("alpha", "member")
    job = submit(client, workers_min=1, workers_max=1).json()
    backend = get_compute_backend()
    placed = TrainingJob.objects.get(pk=job["id"])
    TrainingJob.objects.filter(pk=placed.pk).update(
        state="ADMITTED", admitted_accelerator_type="nvidia-h100",
        placement=[{"node": "h100-pool-0", "taken": [[i, 1.0] for i in range(8)]}])
    workflows.training_job_launch(job_id=placed.pk, backend=backend)
    handle = TrainingJob.objects.get(pk=placed.pk).compute_handle
    assert handle in backend.list_training_handles()
    with TestCase.captureOnCommitCallbacks(execute=True):
        client.post(f"/api/v1/training-jobs/{job['id']}/cancel/")
    assert handle not in backend.list_training_handles()


def test_unknown_fields_are_rejected_by_name(api):
    response = submit(api("alpha", "member"), worker_max=4)
    assert response.status_code == 400
    body = response.json()
    assert "worker_max" in body and "unknown field" in body["worker_max"][0]
    nested = submit(api("alpha", "member"), checkpoint={"every": 10})
    assert nested.status_code == 400 and "every" in nested.json()["checkpoint"]
    assert not TrainingJob.objects.exists()


def test_non_object_and_malformed_bodies_are_4xx(api):
    client = api("alpha", "member")
    assert client.post("/api/v1/training-jobs/", [1, 2], format="json").status_code == 400
    response = client.post("/api/v1/training-jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400 and "detail" in response.json()
