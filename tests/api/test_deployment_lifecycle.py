"""The serving workflow of deployments against the in-memory backend: deploy, rolling update, scale,
delete, SLA-aware autoscaling and DEGRADED on a breach, placement waits, drift and orphan repair, the
metrics endpoint, and the 4xx paths. The real Ray Serve runtime is exercised by the integration tests."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from django.test import TestCase
from django.utils import timezone

from controlplane.cluster.models import Node
from controlplane.compute.base import ServiceSpec
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from inference import tasks, workflows
from inference.models import Deployment, InferenceRequest
from jobs.models import TrainingJob
from jobs.runtime.checkpoints import save_checkpoint
from jobs.workflows import checkpoint_dir
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    settings.DATA_DIR = tmp_path
    settings.FLEETYARD_SERVING_WINDOW_SECONDS = 60
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: fake)
    return fake


def create(client, model_dir=None, expect=201, **overrides) -> dict:
    body = {**DEPLOYMENT_BODY, **({"model_uri": f"file://{model_dir}"} if model_dir else {}), **overrides}
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == expect, response.json()
    return response.json()


def sync(deployment_id: int, backend) -> Deployment:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.deployment_sync(deployment_id=deployment_id, backend=backend)
    return Deployment.objects.get(pk=deployment_id)


def patch(client, deployment_id: int, body: dict, expect: int = 200) -> dict:
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.patch(f"/api/v1/deployments/{deployment_id}/", body, format="json")
    assert response.status_code == expect, response.json()
    return response.json()


def log_requests(deployment: Deployment, count: int, *, ttft_ms: float, tpot_ms: float = 10.0, status: int = 200,
                 age_s: float = 1.0, prompt_tokens: int = 100, cached_tokens: int = 0) -> None:
    at = timezone.now() - timedelta(seconds=age_s)
    InferenceRequest.objects.bulk_create([
        InferenceRequest(deployment=deployment, created_at=at, endpoint="completions", status_code=status,
                         prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                         output_tokens=20 if status == 200 else 0, queue_ms=5.0,
                         ttft_ms=ttft_ms if status == 200 else None, tpot_ms=tpot_ms if status == 200 else None)
        for _ in range(count)])


def states(client, deployment_id: int) -> list[str]:
    events = client.get(f"/api/v1/deployments/{deployment_id}/events/?page_size=500").json()["results"]
    return [e["to_state"] for e in events if e["from_state"] != e["to_state"]]


def test_deploy_update_scale_delete(api, backend, model_dir):
    client = api("alpha", "member")
    created = create(client, model_dir, engine={"slots": 4}, router="pow2")
    body = client.get(f"/api/v1/deployments/{created['id']}/").json()
    status = body["status"]
    handle = f"fy-serve-{created['id']}"
    assert status["state"] == "SERVING", status
    assert status["compute_handle"] == handle and status["applied_revision"] == 1
    assert status["accelerator_type"] == "nvidia-a100" and status["pool"] == "a100-pool"
    assert status["model_dir"] == str(model_dir) and status["replicas_ready"] == 1
    assert status["autoscaling"]["target_ongoing_requests"] == 4 and status["autoscaling"]["max_replicas"] == 3
    assert status["observed"]["requests"] == 0 and status["observed"]["service_state"] == "running"
    assert body["spec"]["engine"] == {"slots": 4} and body["spec"]["router"] == "pow2"
    spec = backend.services[handle]
    assert spec.revision == 1 and spec.router == "pow2" and spec.engine["slots"] == 4
    assert spec.target_ongoing_requests == 4 and spec.devices_per_replica == 0.5 and spec.pool == "a100-pool"
    assert spec.max_ongoing_requests == 4 + spec.engine["max_waiting"]
    assert states(client, created["id"]) == ["PENDING", "DEPLOYING", "SERVING"]

    updated = patch(client, created["id"], {"engine": {"slots": 8}, "sla": {"ttft_p95_ms": 800}})
    assert updated["status"]["state"] == "UPDATING" and updated["spec"]["revision"] == 2
    body = client.get(f"/api/v1/deployments/{created['id']}/").json()
    assert body["status"]["state"] == "SERVING" and body["status"]["applied_revision"] == 2
    assert body["spec"]["sla"]["ttft_p95_ms"] == 800
    assert backend.services[handle].revision == 2 and backend.services[handle].engine["slots"] == 8
    assert backend.services[handle].target_ongoing_requests == 8  # new slot count, new starting target
    revisions = client.get(f"/api/v1/deployments/{created['id']}/revisions/").json()["results"]
    assert [r["number"] for r in revisions] == [2, 1] and revisions[0]["spec"]["engine"] == {"slots": 8}
    assert "engine" in revisions[0]["reason"] and "sla_ttft_p95_ms" in revisions[0]["reason"]

    with TestCase.captureOnCommitCallbacks(execute=True):
        scaled = client.post(f"/api/v1/deployments/{created['id']}/scale/", {"replicas_min": 2, "replicas_max": 4},
                             format="json")
    assert scaled.status_code == 200, scaled.json()
    assert scaled.json()["spec"]["revision"] == 3 and scaled.json()["status"]["state"] == "UPDATING"
    status = client.get(f"/api/v1/deployments/{created['id']}/").json()["status"]
    assert status["state"] == "SERVING" and status["applied_revision"] == 3 and status["replicas_ready"] == 2
    assert (backend.services[handle].replicas_min, backend.services[handle].replicas_max) == (2, 4)
    assert states(client, created["id"]) == ["PENDING", "DEPLOYING", "SERVING", "UPDATING", "SERVING",
                                             "UPDATING", "SERVING"]

    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/deployments/{created['id']}/").status_code == 204
    assert backend.list_service_handles() == []
    assert client.get(f"/api/v1/deployments/{created['id']}/").json()["status"]["state"] == "DELETED"


def test_an_sla_breach_degrades_autoscales_and_recovers(api, backend, model_dir):
    client = api("alpha", "member")
    created = create(client, model_dir)
    deployment = Deployment.objects.get(pk=created["id"])
    handle = deployment.compute_handle
    log_requests(deployment, 40, ttft_ms=812.0)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED"
    assert deployment.state_reason == "SLA breach: TTFT p95 812 ms > SLA 500 ms over 40 requests in the last 60 s"
    assert deployment.observed["ttft_p95_ms"] == 812.0 and deployment.observed["requests"] == 40
    assert deployment.autoscaling["target_ongoing_requests"] == 2
    assert backend.services[handle].target_ongoing_requests == 2  # redeployed with the new target
    assert backend.services[handle].revision == 1  # the same revision
    reasons = [e["reason"] for e in client.get(f"/api/v1/deployments/{deployment.pk}/events/").json()["results"]]
    assert any(r.startswith("autoscaling: TTFT p95 812 ms") and "lowered from 4 to 2" in r for r in reasons)

    deployment = sync(deployment.pk, backend)  # within a window of the change: holds
    assert deployment.state == "DEGRADED" and deployment.autoscaling["target_ongoing_requests"] == 2

    InferenceRequest.objects.filter(deployment=deployment).update(created_at=timezone.now() - timedelta(minutes=5))
    log_requests(deployment, 30, ttft_ms=120.0)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "SERVING" and deployment.state_reason.startswith("healthy again")
    assert deployment.observed["breach"] is None and deployment.observed["ttft_p95_ms"] == 120.0
    assert states(client, deployment.pk)[-2:] == ["DEGRADED", "SERVING"]


def test_a_breach_while_the_quota_limits_the_replicas_says_so(api, backend, model_dir):
    client = api("alpha", "member")
    created = create(client, model_dir)
    Deployment.objects.filter(pk=created["id"]).update(replicas_limit=1)  # the scheduling cycle's limit
    deployment = Deployment.objects.get(pk=created["id"])
    log_requests(deployment, 40, ttft_ms=812.0)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED"
    assert deployment.state_reason == (
        f"SLA breach: TTFT p95 812 ms > SLA 500 ms over 40 requests in the last 60 s; its cluster queue's quota lets "
        f"it run 1 of its {deployment.replicas_max} replicas now")
    assert backend.services[deployment.compute_handle].replicas_max == 1


def test_missing_replicas_degrade_and_a_vanished_service_is_redeployed(api, backend, model_dir):
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    backend.set_service_status(deployment.compute_handle, replicas_running=0)
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED" and "only 0 of at least 1 replica" in deployment.state_reason
    backend.delete_service(deployment.compute_handle)
    sync(deployment.pk, backend)
    assert backend.list_service_handles() == [deployment.compute_handle]
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "SERVING" and deployment.replicas_ready == 1
    assert deployment.events.filter(reason__contains="not found; deploying revision 1 again").exists()


def test_no_capacity_stays_pending_with_the_reason_then_deploys(api, backend, model_dir):
    client = api("alpha", "member")
    Node.objects.filter(pool__name="cpu-pool").update(free_cpus=0.5)  # 2 CPU replicas fit
    created = create(client, model_dir, accelerator_types=["nvidia-h100", "cpu"], devices_per_replica=8,
                     replicas_min=3, replicas_max=3)
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "PENDING" and not deployment.compute_handle
    assert deployment.state_reason.startswith("waiting for capacity: 3 replica(s) of 8 device(s) each")
    # 3 x 8 H100s: the two 8-device H100 nodes can never hold them (nor the shared queue's 16 nominal)
    assert "nvidia-h100: nvidia-h100 nodes can never hold it: its 2 nodes" in deployment.state_reason
    assert "cpu: room for 2 replica(s)" in deployment.state_reason
    assert backend.list_service_handles() == []
    tasks.sync_deployments()  # the reconciler retries; the same reason is not recorded twice
    assert Deployment.objects.get(pk=deployment.pk).events.filter(reason__startswith="waiting for capacity").count() \
        == 1
    Node.objects.filter(pool__name="cpu-pool").update(free_cpus=8.0)
    tasks.sync_deployments()
    tasks.sync_deployments()
    deployment = Deployment.objects.get(pk=deployment.pk)
    assert deployment.state == "SERVING" and deployment.accelerator_type == "cpu"
    assert backend.services[deployment.compute_handle].devices_per_replica == 0.0


def test_replicas_no_node_or_quota_could_ever_hold_say_it_can_never_run(api, backend, model_dir, world):
    """Found by QA: replicas_min 256 on a type with 16 devices was PENDING "waiting for capacity" for good. As a
    training job's gang no node could ever hold (201, then QUEUED saying it can never be placed), the deployment is
    taken and its reason says it can never run as asked, as the dry run of its spec does (another accepted type that
    could hold it is still waited for: test_no_capacity_stays_pending_with_the_reason_then_deploys)."""
    from controlplane.quotas.services import cluster_queue_update

    client = api("alpha", "member")
    created = create(client, model_dir, accelerator_types=["nvidia-h100"], devices_per_replica=1,
                     replicas_min=256, replicas_max=256)
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "PENDING" and not deployment.compute_handle
    assert deployment.state_reason.startswith("it can never run as asked: 256 replica(s) of 1 device(s) each "
                                              "(nvidia-h100 nodes can never hold it: its 2 nodes (the largest with 8 "
                                              "devices) would hold at most 16 x 1"), deployment.state_reason
    spec = ("name: big\nqueue: default\nresources:\n  accelerators: H100:1\nservice:\n  model: "
            f"{model_dir}\n  replicas: 256\n  sla: {{ttft_p95: 500ms, tpot_p95: 50ms}}\n")
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec}, format="json").json()["plan"]
    assert plan["options"][0]["never"] and "can never hold it" in plan["options"][0]["why_not"], plan
    # within the nodes but past what the queue could ever take: said too, by the deploy and the dry run
    cluster_queue_update(actor=world["ops"], queue=world["cluster_queue"], quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8},
        {"accelerator_type": "nvidia-a100", "nominal_quota": 16}, {"accelerator_type": "cpu", "nominal_quota": 8}])
    twelve = create(client, model_dir, name="twelve", accelerator_types=["nvidia-h100"], devices_per_replica=1,
                    replicas_min=12, replicas_max=12)
    reason = Deployment.objects.get(pk=twelve["id"]).state_reason
    assert reason.startswith("it can never run as asked: 12 replica(s)") and \
        "shared can never take 12 nvidia-h100: its nominal quota and the most its cohort could lend add up to 8" \
        in reason, reason
    plan = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.replace("256", "12")}, format="json")
    assert "shared can never take 12 nvidia-h100" in plan.json()["plan"]["options"][0]["why_not"], plan.json()


def test_cordoned_nodes_do_not_count(api, backend, model_dir):
    Node.objects.filter(pool__name="a100-pool").update(cordoned=True)
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    assert deployment.state == "PENDING" and "nvidia-a100: no live, uncordoned nodes" in deployment.state_reason


def test_a_live_job_without_a_checkpoint_waits_then_its_checkpoint_is_served(api, backend):
    client = api("alpha", "member")
    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    waiting = Deployment.objects.get(pk=create(client, model_uri="", source_job=job["id"])["id"])
    assert waiting.state == "PENDING"
    assert waiting.state_reason.startswith(f"waiting for the first complete checkpoint of training job {job['id']}")
    tasks.sync_deployments()  # still nothing: the reason is not recorded twice
    assert waiting.events.filter(reason__startswith="waiting for the first complete checkpoint").count() == 1

    info = save_checkpoint(checkpoint_dir(waiting.source_job), step=50,
                           files={"config.json": b"{}", "model.pt": b"w" * 64})
    tasks.sync_deployments()
    tasks.sync_deployments()
    served = Deployment.objects.get(pk=waiting.pk)
    assert served.state == "SERVING" and served.model_dir == str(info.path)
    assert backend.services[served.compute_handle].model_dir == str(info.path)


def test_a_finished_job_without_a_checkpoint_is_refused_and_one_that_ends_without_fails(api, backend):
    """Found by QA: a finished job without a complete checkpoint was taken (201), and the deployment FAILED right
    away ("cannot serve: training job N has no complete checkpoint under ..."). It can never get one: refused with a
    400 naming source_job, through the API and a spec. A job still running may save one and is waited for; if it
    then ends without one, the deployment fails, saying why."""
    client = api("alpha", "member")
    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    waiting = Deployment.objects.get(pk=create(client, model_uri="", source_job=job["id"])["id"])
    assert waiting.state == "PENDING" and "waiting for the first complete checkpoint" in waiting.state_reason
    client.post(f"/api/v1/training-jobs/{job['id']}/cancel/", format="json")
    refused = create(client, expect=400, name="late", model_uri="", source_job=job["id"])
    assert set(refused) == {"source_job"} and "CANCELLED and has no complete checkpoint" in refused["source_job"][0]
    spec = (f"name: late\nqueue: default\nresources:\n  accelerators: A100:1\nservice:\n  checkpoint: job:{job['id']}"
            "\n  sla: {ttft_p95: 500ms, tpot_p95: 50ms}\n")
    applied = client.post("/api/v1/specs/apply/", {"spec": spec}, format="json")
    assert applied.status_code == 400 and "service.checkpoint" in applied.json()["spec"][0], applied.json()
    assert "no complete checkpoint" in applied.json()["spec"][0]
    assert not Deployment.objects.filter(name="late").exists()
    tasks.sync_deployments()
    failed = Deployment.objects.get(pk=waiting.pk)
    assert failed.state == "FAILED"
    assert failed.state_reason.startswith(f"cannot serve: training job {job['id']}")
    assert "no complete checkpoint" in failed.state_reason


def test_model_uri_and_source_job_together_are_refused(api, backend, model_dir):
    """Found by QA: both were taken (201) and the model_uri served, where the spec refuses "give model or checkpoint,
    not both". A PATCH that sets both is refused too."""
    client = api("alpha", "member")
    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    refused = create(client, model_dir, expect=400, source_job=job["id"])
    assert set(refused) == {"source_job"} and "not both" in refused["source_job"][0] \
        and "model_uri" in refused["source_job"][0], refused
    assert not Deployment.objects.exists()
    created = create(client, model_dir)
    other = model_dir.parent / "other"
    other.mkdir()
    for name in ("config.json", "model.pt"):
        (other / name).write_bytes((model_dir / name).read_bytes())
    both = patch(client, created["id"], {"model_uri": f"file://{other}", "source_job": job["id"]}, expect=400)
    assert "not both" in both["source_job"][0]
    assert Deployment.objects.get(pk=created["id"]).revision == 1


def test_a_model_folder_that_is_not_there_is_refused_at_create(api, backend, model_dir, model_dirs_checked, tmp_path):
    """Found by QA: a model_uri naming a local folder that does not exist was taken (201), and the deployment FAILED
    at once ("model directory ... does not exist"). The control plane checks it as the deploy does: a 400 naming
    model_uri, through the API, a spec and a PATCH."""
    client = api("alpha", "member")
    missing = create(client, expect=400, model_uri=str(tmp_path / "nope"))
    assert set(missing) == {"model_uri"} and "does not exist" in missing["model_uri"][0], missing
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    half = create(client, expect=400, model_uri=f"file://{tmp_path / 'half'}")
    assert "has no model.pt" in half["model_uri"][0], half
    spec = (f"name: svc\nqueue: default\nresources:\n  accelerators: A100:1\nservice:\n  model: {tmp_path / 'nope'}"
            "\n  sla: {ttft_p95: 500ms, tpot_p95: 50ms}\n")
    applied = client.post("/api/v1/specs/apply/", {"spec": spec}, format="json")
    assert applied.status_code == 400 and "service.model" in applied.json()["spec"][0], applied.json()
    assert not Deployment.objects.exists()
    created = create(client, model_dir)
    gone = patch(client, created["id"], {"model_uri": str(tmp_path / "gone")}, expect=400)
    assert "does not exist" in gone["model_uri"][0]


def test_a_missing_model_directory_fails(api, backend, tmp_path):
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_uri=str(tmp_path / "nope"))["id"])
    assert deployment.state == "FAILED" and "does not exist" in deployment.state_reason
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    half = Deployment.objects.get(pk=create(api("alpha", "member"), name="half",
                                            model_uri=f"file://{tmp_path / 'half'}")["id"])
    assert half.state == "FAILED" and "has no model.pt" in half.state_reason


def test_a_checkpoint_whose_replicas_would_not_fit_their_kv_memory_is_refused_with_the_arithmetic(api, backend):
    """A 48-layer d=2048 model (4,096-token window) with 16 slots needs about 63 GiB of keys and values per replica.
    Its checkpoint written after the deployment was created: FAILED at deploy, with room or without (no room makes
    it servable). Written before: a 400 on engine at submit, and on an update of the engine."""
    import json

    from controlplane.cluster.models import Node

    client = api("alpha", "member")
    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    waiting = Deployment.objects.get(pk=create(client, model_uri="", source_job=job["id"],
                                               engine={"slots": 16})["id"])
    assert waiting.state == "PENDING" and "first complete checkpoint" in waiting.state_reason
    model = {"vocab_size": 258, "context": 4096, "d_model": 2048, "n_heads": 16, "n_layers": 48, "d_ff": 8192}
    save_checkpoint(checkpoint_dir(TrainingJob.objects.get(pk=job["id"])), step=10,
                    files={"config.json": json.dumps({"format": 1, "model": model, "step": 10}).encode(),
                           "model.pt": b"w" * 64})
    Node.objects.update(cordoned=True)  # no room anywhere
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.deployment_deploy(deployment_id=waiting.pk, backend=backend)
    failed = Deployment.objects.get(pk=waiting.pk)
    assert failed.state == "FAILED", failed.state_reason
    assert failed.state_reason.startswith("cannot serve: a replica would hold 63.0 GiB") and "16 slots" in \
        failed.state_reason
    Node.objects.update(cordoned=False)

    refused = client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "name": "again", "model_uri": "",
                                                   "source_job": job["id"], "engine": {"slots": 16}}, format="json")
    assert refused.status_code == 400 and "63.0 GiB" in refused.json()["engine"][0], refused.json()
    small = create(client, model_uri="", source_job=job["id"], name="small",
                   engine={"slots": 1, "host_cache_blocks": 0})
    patched = client.patch(f"/api/v1/deployments/{small['id']}/", {"engine": {"slots": 16}}, format="json")
    assert patched.status_code == 400 and "GiB" in patched.json()["engine"][0]
    assert Deployment.objects.get(pk=small["id"]).revision == 1  # nothing half-written


def _job_with_a_63_gib_checkpoint(client) -> int:
    import json

    job = client.post("/api/v1/training-jobs/", JOB_BODY, format="json").json()
    model = {"vocab_size": 258, "context": 4096, "d_model": 2048, "n_heads": 16, "n_layers": 48, "d_ff": 8192}
    save_checkpoint(checkpoint_dir(TrainingJob.objects.get(pk=job["id"])), step=10,
                    files={"config.json": json.dumps({"format": 1, "model": model, "step": 10}).encode(),
                           "model.pt": b"w" * 64})
    return job["id"]


def test_an_update_is_checked_against_the_model_it_will_serve(api, backend, model_dir):
    """Found by review: the update check looked at the fields the request sent, the update at those that changed.
    A full-spec PATCH repeating the model_uri and naming a source job serves the job's checkpoint: that is what is
    checked (refused); a PATCH repeating the source job of a deployment that serves its model_uri is not."""
    client = api("alpha", "member")
    job_id = _job_with_a_63_gib_checkpoint(client)
    created = create(client, model_dir, engine={"slots": 16})
    switched = client.patch(f"/api/v1/deployments/{created['id']}/",
                            {"model_uri": f"file://{model_dir}", "source_job": job_id}, format="json")
    assert switched.status_code == 400 and "63.0 GiB" in switched.json()["engine"][0], switched.json()
    assert Deployment.objects.get(pk=created["id"]).revision == 1
    # (a deployment with both, which served its model_uri, can no longer be created: both are refused)


def test_an_update_to_a_missing_model_degrades_and_keeps_the_old_revision(api, backend, model_dir, tmp_path):
    client = api("alpha", "member")
    created = create(client, model_dir)
    patch(client, created["id"], {"model_uri": str(tmp_path / "gone")})
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "DEGRADED" and "revision 2 cannot be applied" in deployment.state_reason
    assert deployment.applied_revision == 1 and backend.services[deployment.compute_handle].revision == 1
    deployment = sync(deployment.pk, backend)
    assert deployment.state == "DEGRADED" and "cannot be applied" in deployment.state_reason
    patch(client, created["id"], {"model_uri": str(model_dir)})
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "SERVING" and deployment.applied_revision == 3


def test_orphan_services_are_deleted(api, backend, model_dir):
    live = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    orphan = ServiceSpec(handle="fy-serve-99999", deployment_id=99999, revision=1, model_dir=str(model_dir),
                         accelerator_type="cpu", devices_per_replica=0, replicas_min=1, replicas_max=1,
                         target_ongoing_requests=4, max_ongoing_requests=8, max_queued_requests=8)
    backend.deploy_service(orphan)
    backend.deploy_service(ServiceSpec(**{**orphan.__dict__, "handle": "someone-elses"}))
    result = tasks.sync_deployments()
    assert result["orphans_deleted"] == 1 and result["synced"] == 1
    assert backend.list_service_handles() == sorted([live.compute_handle, "someone-elses"])


def test_metrics_endpoint(api, backend, model_dir):
    client = api("alpha", "viewer")
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    log_requests(deployment, 19, ttft_ms=100.0, tpot_ms=10.0, prompt_tokens=100, cached_tokens=50)
    log_requests(deployment, 1, ttft_ms=1000.0, tpot_ms=30.0, prompt_tokens=100, cached_tokens=50)
    log_requests(deployment, 2, ttft_ms=0, status=429)
    log_requests(deployment, 3, ttft_ms=100.0, age_s=600)  # outside the window
    response = client.get(f"/api/v1/deployments/{deployment.pk}/metrics/?window=60")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["window_s"] == 60 and body["requests"] == 22 and body["succeeded"] == 20
    assert body["errors"] == {"429": 2}
    assert body["ttft_ms"]["p50"] == 100.0 and body["ttft_ms"]["p99"] > body["ttft_ms"]["p95"] > 100.0
    assert body["tpot_ms"]["p50"] == 10.0 and body["queue_ms"]["p95"] == 5.0
    assert body["cache_hit_rate"] == 0.5 and body["output_tokens"] == 400
    assert body["output_tokens_per_s"] == pytest.approx(400 / 60, abs=1e-3)
    assert body["replicas"]["ready"] == 1 and body["sla"]["ttft_p95_ms"] == 500
    # one point per clock minute the 60 s window touches: the requests (logged a second ago) are in one of them,
    # the previous minute's when the test runs in a minute's first second (the series used to drop them)
    assert len(body["series"]) == 2 and sum(point["requests"] for point in body["series"]) == 22
    wide = client.get(f"/api/v1/deployments/{deployment.pk}/metrics/?window=900").json()
    assert wide["requests"] == 25 and len(wide["series"]) == 16
    assert sum(point["requests"] for point in wide["series"]) == 25
    bad = client.get(f"/api/v1/deployments/{deployment.pk}/metrics/?window=0")
    assert bad.status_code == 400 and "window" in bad.json()


def test_metrics_take_format_and_refuse_a_repeated_window(api, backend, model_dir):
    """`?format=json`, which every other route takes, was a 400 "unknown field" on a deployment's metrics, and
    `?window=60&window=900` quietly read the last (QA)."""
    client = api("alpha", "viewer")
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    url = f"/api/v1/deployments/{deployment.pk}/metrics/"
    response = client.get(f"{url}?window=60&format=json")
    assert response.status_code == 200 and response.json()["window_s"] == 60, response.json()
    twice = client.get(f"{url}?window=60&window=900")
    assert twice.status_code == 400 and twice.json() == {"window": ["give this parameter once"]}, twice.json()


def test_the_series_counts_requests_in_the_windows_oldest_partial_minute(api, backend, model_dir):
    """A request 0.7 s before a minute's first half second is in a 60 s window; it must be in a point too (the
    series used to start at the current minute and drop it: found by CI at 13:29:00)."""
    from datetime import datetime

    from inference.selectors import deployment_metrics

    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir)["id"])
    now = datetime(2026, 11, 25, 13, 29, 0, 500000, tzinfo=UTC)
    InferenceRequest.objects.create(deployment=deployment, created_at=now - timedelta(seconds=0.7),
                                    endpoint="completions", status_code=200, prompt_tokens=10, output_tokens=2,
                                    ttft_ms=50.0, tpot_ms=5.0)
    metrics = deployment_metrics(deployment=deployment, window_s=60, now=now)
    assert metrics["requests"] == 1
    assert [(p["minute"].minute, p["requests"]) for p in metrics["series"]] == [(28, 1), (29, 0)]


@pytest.mark.parametrize("overrides,field", [
    ({"engine": {"slots": 0}}, "engine.slots"),
    ({"engine": {"bogus": 1}}, "engine.bogus"),
    ({"router": "random"}, "router"),
    ({"model_uri": "s3://bucket/model"}, "model_uri"),
    ({"model_uri": "relative/dir"}, "model_uri"),
])
def test_create_rejects_bad_serving_settings(api, backend, overrides, field):
    response = api("alpha", "member").post("/api/v1/deployments/", {**DEPLOYMENT_BODY, **overrides}, format="json")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("body,field", [
    ({"replicas_min": 5}, "replicas_min"),  # the field sent (QA: it named replicas_max)
    ({"engine": {"block_size": 0}}, "engine.block_size"),
    ({"router": "nope"}, "router"),
    ({"model_uri": "http://x/y"}, "model_uri"),
    ({"accelerator_types": ["kunlun-p800"]}, "accelerator_types"),
    ({"sla": {"ttft_p95_ms": 0}}, "sla"),
    ({"source_job": 999999}, "source_job"),
    ({"replicas_max": 3}, "replicas_max"),  # no change: a 400 naming the field
    ({"name": "renamed"}, "name"),
])
def test_update_rejects_bad_changes_naming_the_field(api, backend, model_dir, body, field):
    client = api("alpha", "member")
    created = create(client, model_dir)
    response = patch(client, created["id"], body, expect=400)
    assert field in response, response
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.revision == 1 and deployment.revisions.count() == 1


def test_update_and_scale_permissions_and_states(api, backend, model_dir):
    member = api("alpha", "member")
    created = create(member, model_dir)
    assert api("alpha", "viewer").patch(f"/api/v1/deployments/{created['id']}/", {"replicas_max": 2},
                                        format="json").status_code == 403
    assert api("alpha", "viewer").post(f"/api/v1/deployments/{created['id']}/scale/", {"replicas_min": 2},
                                       format="json").status_code == 403
    assert api("beta", "member").patch(f"/api/v1/deployments/{created['id']}/", {"replicas_max": 2},
                                       format="json").status_code == 404
    assert patch(member, created["id"], {}, expect=400)
    bad_scale = member.post(f"/api/v1/deployments/{created['id']}/scale/", {"replicas_min": 3, "replicas_max": 2},
                            format="json")
    assert bad_scale.status_code == 400 and "replicas_max" in bad_scale.json()
    with TestCase.captureOnCommitCallbacks(execute=True):
        member.delete(f"/api/v1/deployments/{created['id']}/")
    gone = member.patch(f"/api/v1/deployments/{created['id']}/", {"replicas_max": 2}, format="json")
    assert gone.status_code == 409 and "state" in gone.json()


def test_updating_a_pending_deployment_deploys_the_new_spec(api, backend, model_dir):
    Node.objects.filter(pool__name="a100-pool").update(cordoned=True)
    client = api("alpha", "member")
    created = create(client, model_dir)
    assert Deployment.objects.get(pk=created["id"]).state == "PENDING"
    Node.objects.filter(pool__name="a100-pool").update(cordoned=False)
    patch(client, created["id"], {"router": "round_robin"})
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "SERVING" and deployment.revision == 2 and deployment.applied_revision == 2
    assert backend.services[deployment.compute_handle].router == "round_robin"


def test_a_lost_apply_is_repeated_by_the_sync_after_a_grace(api, backend, model_dir):
    client = api("alpha", "member")
    created = create(client, model_dir)
    response = client.patch(f"/api/v1/deployments/{created['id']}/", {"router": "round_robin"}, format="json")
    assert response.status_code == 200 and response.json()["status"]["state"] == "UPDATING"  # the task never ran
    deployment = sync(created["id"], backend)
    assert deployment.state == "UPDATING" and backend.services[deployment.compute_handle].revision == 1
    later = timezone.now() + timedelta(minutes=2)
    workflows.deployment_sync(deployment_id=deployment.pk, backend=backend, now=later)
    assert backend.services[deployment.compute_handle].revision == 2
    workflows.deployment_sync(deployment_id=deployment.pk, backend=backend, now=later)
    deployment = Deployment.objects.get(pk=deployment.pk)
    assert deployment.state == "SERVING" and deployment.applied_revision == 2


def test_accelerator_replicas_count_against_the_queue_quota_with_training(api, backend, model_dir, world):
    """Deployments are admitted within their ClusterQueue's quota, counted with the training jobs there that cannot
    be preempted (preemptible training of the queue gives its quota back: tests/api/test_mixed_load.py)."""
    from controlplane.quotas.models import PriorityClass
    from jobs.selectors import quota_usage

    client = api("alpha", "member")
    job = TrainingJob.objects.get(pk=client.post("/api/v1/training-jobs/", {
        **JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 1, "workers_max": 1,
        "devices_per_worker": 8}, format="json").json()["id"])
    TrainingJob.objects.filter(pk=job.pk).update(state="RUNNING", admitted_accelerator_type="nvidia-h100",
                                                 placement=[{"node": "h100-pool-0", "taken": [[i, 1.0] for i in
                                                                                              range(8)]}])
    assert quota_usage(preemptible_only=True) == {("shared", "nvidia-h100"): 8.0}
    never = PriorityClass.objects.create(name="never-preempted", value=1000, preemptible=False)
    TrainingJob.objects.filter(pk=job.pk).update(priority_class=never)
    assert quota_usage(preemptible_only=True) == {}
    created = create(client, model_dir, name="big", accelerator_types=["nvidia-h100"], devices_per_replica=8,
                     replicas_min=2, replicas_max=2)
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.state == "PENDING"
    assert deployment.state_reason.startswith("waiting for quota: 2 replica(s) of 8 device(s) each")
    assert "shared needs to borrow 8 nvidia-h100" in deployment.state_reason
    fits = create(client, model_dir, name="small", accelerator_types=["nvidia-h100"], devices_per_replica=8,
                  replicas_min=1, replicas_max=1)  # 8 (training) + 8 = the queue's 16
    assert Deployment.objects.get(pk=fits["id"]).state in ("DEPLOYING", "SERVING")


def test_under_no_ray_a_deployment_says_model_calls_cannot_reach_it(api, backend, model_dir, world):
    """Found by QA: under scripts/up --no-ray a deployment showed SERVING, and every model call (and the console
    playground) answered 503 "service fy-serve-N is not running": the Celery worker deployed into its own in-memory
    backend, and the web server's never had the service. As here, where the workflow's backend is not the gateway's.
    The state is now honest about it: the SERVING reason and the 503 say why and what to do, and GET /v1/models does
    not call the model ready."""
    from controlplane import celery_app
    from controlplane.compute import registry
    from controlplane.compute.memory import PROCESS_LOCAL
    from tests.conftest import client_for

    registry.get_compute_backend.cache_clear()
    celery_app.conf.task_always_eager = False  # as under scripts/up: a Celery worker deploys
    try:
        assert registry.get_compute_backend().process_note == PROCESS_LOCAL
    finally:
        celery_app.conf.task_always_eager = True
        registry.get_compute_backend.cache_clear()
    assert registry.get_compute_backend().process_note == ""  # tasks run here (tests): calls reach the services
    backend.process_note = PROCESS_LOCAL  # the worker's backend, as the registry makes it there
    deployment = Deployment.objects.get(pk=create(api("alpha", "member"), model_dir, name="echo")["id"])
    assert deployment.state == "SERVING" and "run scripts/up without --no-ray" in deployment.state_reason, \
        deployment.state_reason
    gateway = client_for(world["alpha"]["member"], world["alpha"]["team"])
    (card,) = gateway.get("/v1/models").json()["data"]
    assert card["fleetyard"]["state"] == "SERVING" and card["fleetyard"]["ready"] is False, card
    answer = gateway.post("/v1/completions", {"model": "echo", "prompt": "hi", "max_tokens": 2}, format="json")
    assert answer.status_code == 503, answer.content
    message = answer.json()["error"]["message"]
    assert "not running in this process" in message and "without --no-ray" in message, message
    backend.delete_service(deployment.compute_handle)  # one deleted here is simply not running
    with pytest.raises(Exception, match=r"is not running$"):
        backend.stream_completion(deployment.compute_handle, {"prompt_tokens": [104], "max_tokens": 1})
