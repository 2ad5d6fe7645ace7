"""Inference services on a real local Ray cluster through RayComputeBackend: deploy, call, stream, rolling
update without dropped requests, scale, prefix-aware routing, overload and delete; through the platform, a
trained checkpoint deployed by the API, and an SLA breach that degrades a deployment and makes Serve scale it out.

Replicas run the built-in LM (random weights, a tiny shape) on the cpu pool; this file sorts before
test_training_on_ray.py, which kills a node.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from controlplane.compute.base import ServiceOverloaded, ServiceRequestInvalid, ServiceSpec, ServiceUnavailable

pytestmark = [pytest.mark.ray]

SHAPE = {"context": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
HANDLE = "fy-serve-itest"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from jobs.runtime.lm import write_random_model_dir

    return write_random_model_dir(tmp_path_factory.mktemp("model"), SHAPE, seed=5)


def spec(model_dir, **changes) -> ServiceSpec:
    values = dict(handle=HANDLE, deployment_id=1, revision=1, model_dir=str(model_dir), accelerator_type="cpu",
                  pool="cpu-pool", devices_per_replica=0.0, replicas_min=1, replicas_max=1,
                  target_ongoing_requests=2.0, max_ongoing_requests=6, max_queued_requests=64, cpus_per_replica=0.1,
                  engine={"slots": 2, "block_size": 8, "max_waiting": 4}, router="prefix")
    values.update(changes)
    return ServiceSpec(**values)


def wait_status(backend, predicate, timeout=90.0):
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        status = backend.observe_service(HANDLE)
        if predicate(status):
            return status
        time.sleep(0.5)
    raise AssertionError(f"timed out; last status {status}")


def complete(backend, prompt: bytes, max_tokens=6, **extra) -> list[dict]:
    return list(backend.stream_completion(HANDLE, {"prompt_tokens": list(prompt), "max_tokens": max_tokens, **extra},
                                          timeout_s=60))


@pytest.fixture(scope="module")
def service(ray_backend, model_dir):
    ray_backend.deploy_service(spec(model_dir))
    wait_status(ray_backend, lambda s: s.state == "running" and s.replicas_running == 1)
    yield ray_backend
    ray_backend.delete_service(HANDLE)
    wait_status(ray_backend, lambda s: s.state == "not_found", timeout=60)
    ray_backend.shutdown_serving()  # the Serve controller polls the GCS: stop it for the tests that follow


def test_deployed_service_runs_on_the_chosen_pool_and_streams_tokens(service):
    status = service.observe_service(HANDLE)
    assert status.revision == 1 and status.node_names == ("cpu-pool-0",)
    assert HANDLE in service.list_service_handles()
    events = complete(service, b"Once upon a time", max_tokens=5)
    assert [e["type"] for e in events] == ["token"] * 5 + ["done"]
    done = events[-1]
    assert done["finish_reason"] == "length" and done["metrics"]["output_tokens"] == 5
    assert done["metrics"]["ttft_s"] > 0 and done["metrics"]["revision"] == 1


def test_output_equals_the_reference_generator(service, model_dir):
    from jobs.runtime.lm import ByteTokenizer, generate, load_model_for_inference

    files = {name: (model_dir / name).read_bytes() for name in ("model.pt", "config.json")}
    model, tokenizer, _ = load_model_for_inference(files)
    prompt = "The little robot said"
    text = "".join(e["text"] for e in complete(service, prompt.encode(), max_tokens=12) if e["type"] == "token")
    assert text == generate(model, ByteTokenizer(), prompt, max_new_tokens=12)


def test_invalid_and_oversized_requests_are_refused_before_any_token(service):
    with pytest.raises(ServiceRequestInvalid, match="at most"):
        complete(service, b"x" * 500)
    with pytest.raises(ServiceUnavailable):
        list(service.stream_completion("fy-serve-nothing-here", {"prompt_tokens": [65], "max_tokens": 1},
                                       timeout_s=10))


def test_scale_out_then_prefix_aware_routing_keeps_a_conversation_on_one_replica(service, model_dir):
    service.deploy_service(spec(model_dir, replicas_min=2, replicas_max=2))
    status = wait_status(service, lambda s: s.state == "running" and s.replicas_running == 2)
    assert status.replicas_target == 2
    turns = [b"system: be brief. user: hello there, robot"]
    for _ in range(5):
        turns.append(turns[-1] + b" assistant: hi. user: and then?")
    replicas = {complete(service, t, max_tokens=2)[-1]["metrics"]["replica"] for t in turns}
    assert len(replicas) == 1, "every turn extends the last one: they should all go to the replica holding it"
    cached = complete(service, turns[-1] + b" more", max_tokens=2)[-1]["metrics"]["cached_tokens"]
    assert cached >= len(turns[-1]) // 8 * 8 - 8


def test_rolling_update_drops_no_request(service, model_dir):
    errors: list[str] = []
    revisions: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                revisions.append(complete(service, b"keep serving during the update", max_tokens=3)[-1]
                                 ["metrics"]["revision"])
            except Exception as exc:  # any failure is a dropped request
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        service.deploy_service(spec(model_dir, revision=2, replicas_min=2, replicas_max=2))
        wait_status(service, lambda s: s.state == "running" and s.revision == 2 and s.replicas_running == 2,
                    timeout=120)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert errors == []
    assert revisions[0] == 1 and revisions[-1] == 2 and len(revisions) > 10


def serve_autoscaling(handle: str) -> dict:
    from ray.serve.context import _get_global_client

    app = _get_global_client().get_serve_details()["applications"][handle]
    return app["deployments"]["llm"]["deployment_config"].get("autoscaling_config") or {}


def test_a_new_autoscaling_target_reaches_serve_without_restarting_replicas(service, model_dir):
    service.deploy_service(spec(model_dir, revision=2, replicas_min=2, replicas_max=3, target_ongoing_requests=2.0))
    wait_status(service, lambda s: s.state == "running" and s.revision == 2 and s.replicas_running == 2)
    assert serve_autoscaling(HANDLE)["target_ongoing_requests"] == 2.0
    before = {complete(service, bytes([65 + i]) * 20, max_tokens=1)[-1]["metrics"]["replica"] for i in range(8)}
    # the control plane lowers the target after an SLA breach: same revision, new Serve settings
    service.deploy_service(spec(model_dir, revision=2, replicas_min=2, replicas_max=3, target_ongoing_requests=1.0))
    deadline = time.monotonic() + 60
    while serve_autoscaling(HANDLE).get("target_ongoing_requests") != 1.0:
        assert time.monotonic() < deadline, serve_autoscaling(HANDLE)
        time.sleep(0.5)
    status = wait_status(service, lambda s: s.state == "running" and s.revision == 2)
    assert serve_autoscaling(HANDLE)["max_replicas"] == 3 and status.replicas_running >= 2
    after = {complete(service, bytes([65 + i]) * 20, max_tokens=1)[-1]["metrics"]["replica"] for i in range(8)}
    assert before <= after, "a settings-only change must keep the running replicas"


def test_a_lower_replica_limit_scales_serve_in_and_a_higher_one_lets_it_scale_again_keeping_replicas(
        service, model_dir):
    """The quota's replica limit (inference.workflows.replicas_allowed) reaches Serve as a settings-only change."""
    service.deploy_service(spec(model_dir, revision=2, replicas_min=2, replicas_max=2))
    wait_status(service, lambda s: s.state == "running" and s.revision == 2 and s.replicas_running == 2)
    before = {complete(service, bytes([70 + i]) * 20, max_tokens=1)[-1]["metrics"]["replica"] for i in range(8)}
    assert len(before) == 2
    # what the control plane sends for a 1-3 replica deployment running 2 once its quota takes only 1: max 1
    service.deploy_service(spec(model_dir, revision=2, replicas_min=1, replicas_max=1))
    status = wait_status(service, lambda s: s.state == "running" and s.replicas_running == 1)
    after = {complete(service, bytes([70 + i]) * 20, max_tokens=1)[-1]["metrics"]["replica"] for i in range(8)}
    assert len(after) == 1 and after <= before, "scaling in keeps a running replica, not a new one"
    # the quota takes all 3 again: Serve may scale out to 3 (it stays at 1 while idle)
    service.deploy_service(spec(model_dir, revision=2, replicas_min=1, replicas_max=3))
    deadline = time.monotonic() + 60
    while serve_autoscaling(HANDLE).get("max_replicas") != 3:
        assert time.monotonic() < deadline, serve_autoscaling(HANDLE)
        time.sleep(0.5)
    status = wait_status(service, lambda s: s.state == "running" and s.replicas_running >= 1)
    assert status.revision == 2
    again = {complete(service, bytes([70 + i]) * 20, max_tokens=1)[-1]["metrics"]["replica"] for i in range(8)}
    assert after <= again


def test_overload_is_refused_with_429_semantics_not_a_hang(service, model_dir):
    service.deploy_service(spec(model_dir, revision=3, max_ongoing_requests=1, max_queued_requests=1,
                                engine={"slots": 1, "block_size": 8, "max_waiting": 0}))
    wait_status(service, lambda s: s.state == "running" and s.revision == 3, timeout=120)
    outcomes: list[str] = []

    def call() -> None:
        try:
            complete(service, b"a long answer please", max_tokens=60)
            outcomes.append("ok")
        except ServiceOverloaded as exc:
            assert exc.retry_after_s and exc.retry_after_s > 0
            outcomes.append("overloaded")

    started = time.monotonic()
    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert "overloaded" in outcomes and "ok" in outcomes and len(outcomes) == 8
    assert time.monotonic() - started < 60


# ---------------------------------------------------------------------------------------------------------------
# the whole platform: a job trains on Ray, its checkpoint is deployed through the REST API and called through the
# OpenAI-compatible gateway, updated without a dropped request, and deleted


@pytest.fixture
def platform(ray_backend, pools_from_ray, monkeypatch):
    from inference import tasks as inference_tasks
    from inference.gateway import services as gateway_services
    from jobs import tasks as job_tasks

    for module in (job_tasks, inference_tasks, gateway_services):
        monkeypatch.setattr(module, "get_compute_backend", lambda: ray_backend)
    yield ray_backend
    ray_backend.shutdown_serving()  # nothing may outlive a test (the training tests run next, timing faults)
    for handle in ray_backend.list_training_handles():
        ray_backend.stop_training(handle, checkpoint=False)
        ray_backend.release_training(handle)


def drive(fetch, until, tick, timeout=120.0):
    deadline = time.monotonic() + timeout
    while True:
        tick()
        obj = fetch()
        if until(obj):
            return obj
        assert time.monotonic() < deadline, f"timed out in {obj.state}: {obj.state_reason}"
        time.sleep(0.5)


def gateway_traffic(client, model: str, prompt: str, max_tokens: int, stop: threading.Event,
                    errors: list[str]) -> None:
    """Completions through the gateway, one after the other, until `stop`; every non-200 answer is noted."""
    from django.db import connection

    try:
        while not stop.is_set():
            r = client.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens},
                            format="json")
            if r.status_code != 200:
                errors.append(f"{r.status_code}: {r.content[:200]!r}")
    finally:
        connection.close()


def sse_texts(response) -> tuple[str, list[str]]:
    raw = b"".join(response.streaming_content).decode()
    chunks = [line[len("data: "):] for line in raw.split("\n\n") if line.startswith("data: ")]
    text = "".join(json.loads(c)["choices"][0].get("text") or "" for c in chunks if c != "[DONE]")
    return text, chunks


@pytest.mark.django_db(transaction=True)
def test_a_trained_checkpoint_is_deployed_called_updated_and_deleted_through_the_api(api, platform, world):
    from inference import tasks as inference_tasks
    from inference.models import Deployment, InferenceRequest
    from jobs import tasks as job_tasks
    from jobs.models import TrainingJob

    client = api("alpha", "member")
    job_body = {"name": "lm", "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 1,
                "workers_max": 1, "devices_per_worker": 8, "checkpoint": {"interval_steps": 10, "keep_last": 2},
                "hyperparameters": {"steps": 20, "step_sleep_s": 0.0}}
    created = client.post("/api/v1/training-jobs/", job_body, format="json")
    assert created.status_code == 201, created.json()
    job = drive(lambda: TrainingJob.objects.get(pk=created.json()["id"]), lambda j: j.is_terminal,
                job_tasks.sync_training_jobs)
    assert job.state == "SUCCEEDED", job.state_reason

    body = {"name": "tales", "queue": "default", "source_job": job.pk, "accelerator_types": ["cpu"],
            "devices_per_replica": 1, "replicas_min": 1, "replicas_max": 1,
            "sla": {"ttft_p95_ms": 5000, "tpot_p95_ms": 1000}, "engine": {"slots": 2, "block_size": 8}}
    response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    deployment = drive(lambda: Deployment.objects.get(pk=pk), lambda d: d.state == "SERVING",
                       inference_tasks.sync_deployments)
    assert deployment.pool == "cpu-pool" and deployment.applied_revision == 1
    assert "step-" in deployment.model_dir

    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tales"]
    plain = client.post("/v1/completions", {"model": "tales", "prompt": "Once upon a time", "max_tokens": 12,
                                            "temperature": 0}, format="json")
    assert plain.status_code == 200, plain.content
    text = plain.json()["choices"][0]["text"]
    assert len(text.encode()) <= 12 * 4 and plain.json()["usage"]["completion_tokens"] == 12
    streamed = client.post("/v1/completions", {"model": "tales", "prompt": "Once upon a time", "max_tokens": 12,
                                               "temperature": 0, "stream": True}, format="json")
    assert streamed["Content-Type"].startswith("text/event-stream")
    streamed_text, chunks = sse_texts(streamed)
    assert streamed_text == text and chunks[-1] == "[DONE]"  # greedy: the same answer both ways
    too_long = client.post("/v1/completions", {"model": "tales", "prompt": "x" * 5000, "max_tokens": 1},
                           format="json")
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"

    errors: list[str] = []
    stop = threading.Event()
    caller = threading.Thread(target=gateway_traffic, args=(client, "tales", "The robot", 4, stop, errors))
    caller.start()
    try:
        patched = client.patch(f"/api/v1/deployments/{pk}/", {"replicas_min": 2, "replicas_max": 2}, format="json")
        assert patched.status_code == 200, patched.json()
        deployment = drive(lambda: Deployment.objects.get(pk=pk),
                           lambda d: d.state == "SERVING" and d.applied_revision == 2 and d.replicas_ready == 2,
                           inference_tasks.sync_deployments)
    finally:
        stop.set()
        caller.join(timeout=60)
    assert errors == []
    metrics = client.get(f"/api/v1/deployments/{pk}/metrics/?window=600").json()
    assert metrics["requests"] >= 3 and metrics["ttft_ms"]["p50"] > 0
    assert InferenceRequest.objects.filter(deployment_id=pk, status_code=200).count() >= 2

    assert client.delete(f"/api/v1/deployments/{pk}/").status_code == 204
    handle = deployment.compute_handle
    deadline = time.monotonic() + 60
    while platform.observe_service(handle).state != "not_found":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    gone = client.post("/v1/completions", {"model": "tales", "prompt": "hi", "max_tokens": 1}, format="json")
    assert gone.status_code == 404


@pytest.mark.django_db(transaction=True)
def test_an_sla_breach_degrades_the_deployment_and_serve_scales_it_out(api, platform, world, settings, tmp_path):
    """The SLA control loop end to end: measured requests breach the SLA, the sync marks the deployment DEGRADED
    with the reason and lowers Serve's target, and Serve adds the replica the SLA asks for."""
    from inference import tasks as inference_tasks
    from inference.models import Deployment, DeploymentEvent
    from jobs.runtime.lm import write_random_model_dir

    settings.FLEETYARD_SERVING_WINDOW_SECONDS = 20
    model = write_random_model_dir(tmp_path / "model", SHAPE, seed=9)
    client = api("alpha", "member")
    body = {"name": "strict", "queue": "default", "model_uri": str(model), "accelerator_types": ["cpu"],
            "devices_per_replica": 1, "replicas_min": 1, "replicas_max": 2,
            "sla": {"ttft_p95_ms": 1, "tpot_p95_ms": 1},  # no replica meets this: every window breaches
            "engine": {"slots": 2, "block_size": 8}}
    response = client.post("/api/v1/deployments/", body, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    deployment = drive(lambda: Deployment.objects.get(pk=pk), lambda d: d.state == "SERVING",
                       inference_tasks.sync_deployments)
    assert deployment.autoscaling["target_ongoing_requests"] == 2 and deployment.replicas_ready == 1

    errors: list[str] = []
    stop = threading.Event()
    callers = [threading.Thread(target=gateway_traffic, args=(client, "strict", "Once upon a time", 8, stop, errors))
               for _ in range(4)]
    for caller in callers:
        caller.start()
    try:
        degraded = drive(lambda: Deployment.objects.get(pk=pk), lambda d: d.state == "DEGRADED",
                         inference_tasks.sync_deployments, timeout=90)
        scaled = drive(lambda: Deployment.objects.get(pk=pk), lambda d: d.replicas_ready == 2,
                       inference_tasks.sync_deployments, timeout=120)
    finally:
        stop.set()
        for caller in callers:
            caller.join(timeout=60)
    assert errors == []
    assert degraded.state_reason.startswith("SLA breach: TTFT p95") and "> SLA 1 ms" in degraded.state_reason
    assert scaled.autoscaling["target_ongoing_requests"] == 1 and scaled.state == "DEGRADED"
    lowered = DeploymentEvent.objects.filter(subject_id=pk, reason__contains="target lowered from 2 to 1")
    assert lowered.count() == 1, list(DeploymentEvent.objects.filter(subject_id=pk).values_list("reason", flat=True))

    assert client.delete(f"/api/v1/deployments/{pk}/").status_code == 204
    deadline = time.monotonic() + 60
    while platform.observe_service(scaled.compute_handle).state != "not_found":
        assert time.monotonic() < deadline
        time.sleep(0.5)
