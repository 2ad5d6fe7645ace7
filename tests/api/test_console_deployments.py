"""The console's deployments pages (list, create form, detail) and the playground endpoint, through Django's
test client: rendering, team isolation, roles, empty states, escaping, and the playground's SSE answer."""

from __future__ import annotations

import json

import pytest
from django.test import Client, TestCase

from controlplane.compute.base import ServiceSpec
from controlplane.tenancy.models import Role
from controlplane.tenancy.services import membership_set
from inference import workflows
from inference.models import Deployment, InferenceRequest
from inference.services import deployment_create, deployment_update
from jobs.models import TrainingJob
from jobs.services import training_job_create

pytestmark = pytest.mark.django_db


def session(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def make_deployment(team_world, name: str, **extra) -> Deployment:
    values = {"accelerator_types": ["nvidia-a100"], "sla_ttft_p95_ms": 450, "sla_tpot_p95_ms": 40,
              "model_uri": "file:///models/lm", **extra}
    return deployment_create(actor=team_world["admin"], team=team_world["team"], name=name,
                             local_queue=team_world["queue"], **values)


@pytest.fixture
def serving(world, backend):
    """serving(team, name, state=..., engine=...) -> a deployment row with an echo service on the memory backend."""

    def make(team_name: str = "alpha", name: str = "echo", *, state: str = "SERVING", engine: dict | None = None,
             service: bool = True) -> Deployment:
        deployment = make_deployment(world[team_name], name, accelerator_types=["cpu"], devices_per_replica=0.01,
                                     engine=engine or {})
        handle = f"console-test-{deployment.pk}"
        if service:
            backend.deploy_service(ServiceSpec(
                handle=handle, deployment_id=deployment.pk, revision=1, model_dir="/nonexistent",
                accelerator_type="cpu", devices_per_replica=0, replicas_min=1, replicas_max=1,
                target_ongoing_requests=2, max_ongoing_requests=4, max_queued_requests=8, engine=engine or {}))
        Deployment.objects.filter(pk=deployment.pk).update(state=state, compute_handle=handle if service else "",
                                                           replicas_ready=1, applied_revision=1)
        deployment.refresh_from_db()
        return deployment

    return make


def sse_payloads(response) -> list[dict]:
    """The JSON payloads of an SSE body; checks the framing and that [DONE] comes last, once."""
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    raw = b"".join(response.streaming_content).decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")[:-1]
    assert all(event.startswith("data: ") for event in events), events
    payloads = [event[len("data: "):] for event in events]
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return [json.loads(payload) for payload in payloads[:-1]]


def play(client: Client, deployment: Deployment, body: dict | str, **extra):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(f"/deployments/{deployment.pk}/playground/", data=data, content_type="application/json",
                       **extra)


# --------------------------------------------------------------------------------------------------- list


def test_list_shows_own_teams_with_counts_and_live_region(world):
    alpha, beta = world["alpha"], world["beta"]
    mine = make_deployment(alpha, "alpha-chat")
    make_deployment(beta, "beta-secret-chat")
    Deployment.objects.filter(pk=mine.pk).update(state="DEGRADED", state_reason="SLA breach: ttft p95 900 ms",
                                                 accelerator_type="nvidia-a100", pool="a100-pool")
    html = session(alpha["member"]).get("/deployments/").content.decode()
    assert "alpha-chat" in html and "beta-secret-chat" not in html
    assert 'id="deployments-live"' in html and 'hx-trigger="every 3s"' in html
    assert 'hx-select="#deployments-live"' in html
    assert 'data-state="DEGRADED">DEGRADED <span class="muted">1</span>' in html
    assert "SLA breach: ttft p95 900 ms" in html  # the reason is shown under the state
    assert "450 ms / 40 ms" in html and "file:///models/lm" in html and "nvidia-a100" in html
    assert 'href="/deployments/new/"' in html  # members may create


def test_list_state_filter(world):
    alpha = world["alpha"]
    make_deployment(alpha, "still-pending")
    gone = make_deployment(alpha, "gone-away")
    Deployment.objects.filter(pk=gone.pk).update(state="DELETED")
    client = session(alpha["member"])
    html = client.get("/deployments/?state=deleted").content.decode()
    assert "gone-away" in html and "still-pending" not in html
    html = client.get("/deployments/?state=FAILED").content.decode()
    assert "No FAILED deployments" in html
    html = client.get("/deployments/?state=<bogus>").content.decode()
    assert "gone-away" in html and "still-pending" in html and "<bogus>" not in html


def test_list_empty_state_says_what_to_do(world):
    html = session(world["alpha"]["member"]).get("/deployments/").content.decode()
    assert "No deployments yet" in html and "Create a deployment" in html
    viewer = session(world["alpha"]["viewer"]).get("/deployments/").content.decode()
    assert "No deployments yet" in viewer and "Create a deployment" not in viewer
    assert "member role" in viewer


def test_list_marks_simulated_placements(world, demo_cluster):
    alpha = world["alpha"]
    deployment = make_deployment(alpha, "on-sim")
    Deployment.objects.filter(pk=deployment.pk).update(accelerator_type="nvidia-a100", pool="a100-pool")
    html = session(alpha["member"]).get("/deployments/").content.decode()
    row = html.split('data-deployment="on-sim"')[1].split("</tr>")[0]
    assert "SIMULATED" in row


# --------------------------------------------------------------------------------------------------- create form


def test_new_form_offers_the_teams_queues_types_and_jobs(world, demo_cluster):
    alpha, beta = world["alpha"], world["beta"]
    with_checkpoint = training_job_create(actor=alpha["admin"], team=alpha["team"], name="trained-lm",
                                          local_queue=alpha["queue"], accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=with_checkpoint.pk).update(state="SUCCEEDED", last_checkpoint_step=500)
    never = training_job_create(actor=alpha["admin"], team=alpha["team"], name="never-saved",
                                local_queue=alpha["queue"], accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=never.pk).update(state="FAILED")
    training_job_create(actor=beta["admin"], team=beta["team"], name="beta-hidden-job",
                        local_queue=beta["queue"], accelerator_types=["nvidia-h100"])
    html = session(alpha["member"]).get("/deployments/new/").content.decode()
    assert 'data-api="/api/v1/deployments/"' in html and 'data-redirect="/deployments/{id}/"' in html
    for name in ("name", "queue", "source_job", "model_uri", "accelerator_types", "devices_per_replica",
                 "replicas_min", "replicas_max", "sla.ttft_p95_ms", "sla.tpot_p95_ms", "router", "engine.slots"):
        assert f'name="{name}"' in html, name
    assert "trained-lm" in html and "checkpoint at step 500" in html
    assert "never-saved" not in html  # finished without a checkpoint: nothing to serve
    assert "beta-hidden-job" not in html
    assert 'value="nvidia-h100"' in html and "SIMULATED" in html
    assert 'name="team"' not in html  # one team: the API uses it


def test_new_form_preselects_the_job_and_its_types(world, demo_cluster):
    alpha, beta = world["alpha"], world["beta"]
    job = training_job_create(actor=alpha["admin"], team=alpha["team"], name="trained-lm",
                              local_queue=alpha["queue"], accelerator_types=["nvidia-h100"])
    TrainingJob.objects.filter(pk=job.pk).update(state="SUCCEEDED", last_checkpoint_step=100)
    theirs = training_job_create(actor=beta["admin"], team=beta["team"], name="beta-hidden-job",
                                 local_queue=beta["queue"], accelerator_types=["nvidia-h100"])
    client = session(alpha["member"])
    html = client.get(f"/deployments/new/?job={job.pk}").content.decode()
    assert f'<option value="{job.pk}" data-team="alpha" data-accelerators="nvidia-h100" selected>' in html
    assert 'id="src-job" name="source" value="job" data-skip checked' in html
    assert 'value="nvidia-h100" checked' in html
    other = client.get(f"/deployments/new/?job={theirs.pk}").content.decode()
    assert "beta-hidden-job" not in other and f"Training job {theirs.pk} is not one of your teams" in other


def test_new_form_with_several_teams_asks_which(world):
    alpha, beta = world["alpha"], world["beta"]
    membership_set(actor=beta["admin"], team=beta["team"], username=alpha["member"].username, role=Role.MEMBER)
    html = session(alpha["member"]).get("/deployments/new/").content.decode()
    assert 'name="team"' in html and '<option value="alpha"' in html and '<option value="beta"' in html
    assert 'data-team="alpha"' in html and 'data-team="beta"' in html  # each team's queues, filtered by the page


def test_new_form_for_a_viewer_says_why_not(world):
    html = session(world["alpha"]["viewer"]).get("/deployments/new/").content.decode()
    assert "member role" in html and 'data-api="/api/v1/deployments/"' not in html


# --------------------------------------------------------------------------------------------------- detail


def test_detail_shows_state_sla_revisions_actions_and_live_regions(world, demo_cluster):
    alpha = world["alpha"]
    deployment = make_deployment(alpha, "chat")
    deployment_update(actor=alpha["member"], deployment=deployment, changes={"sla_ttft_p95_ms": 800})
    Deployment.objects.filter(pk=deployment.pk).update(
        state="DEGRADED", state_reason="SLA breach: TTFT p95 900 ms > 800 ms", accelerator_type="nvidia-a100",
        pool="a100-pool", replicas_ready=1, replicas_target=2, applied_revision=1)
    html = session(alpha["member"]).get(f"/deployments/{deployment.pk}/").content.decode()
    assert "<strong>Degraded:</strong> SLA breach: TTFT p95 900 ms &gt; 800 ms" in html
    assert 'id="deployment-live"' in html and 'hx-select-oob="#deployment-measured"' in html
    assert 'id="deployment-history"' in html
    assert "1 <span class=\"unit\">/ 2</span>" in html  # replicas running / desired
    assert "rolling out r2" in html and "a100-pool" in html and "a100-pool-0" in html and "SIMULATED" in html
    assert 'data-revision="2"' in html and "changed sla_ttft_p95_ms" in html and 'data-revision="1"' in html
    assert f'data-api="/api/v1/deployments/{deployment.pk}/scale/"' in html
    assert f'data-api="/api/v1/deployments/{deployment.pk}/" data-method="PATCH"' in html
    assert 'data-method="DELETE"' in html and 'data-redirect="/deployments/"' in html
    assert f'data-url="/deployments/{deployment.pk}/playground/"' in html
    assert 'id="deployment-metrics"' in html and "/static/frontend/vendor/echarts-6.1.0.min.js" in html
    assert "chat/completions" in html and '"model": "chat"' in html
    assert 'id="deployment-held"' not in html
    Deployment.objects.filter(pk=deployment.pk).update(capacity_held=[["a100-pool-1", 8.0], ["a100-pool-0", 0.5]])
    html = session(alpha["member"]).get(f"/deployments/{deployment.pk}/").content.decode()
    assert ("held by the scheduler for replicas it wants: <code>a100-pool-1</code> (8 devices), "
            "<code>a100-pool-0</code> (0.5 devices)") in html


def test_detail_chart_data_comes_from_the_request_log(world):
    alpha = world["alpha"]
    deployment = make_deployment(alpha, "measured")
    for ttft in (100.0, 300.0):
        InferenceRequest.objects.create(deployment=deployment, endpoint="/v1/completions", status_code=200,
                                        prompt_tokens=10, output_tokens=5, ttft_ms=ttft, tpot_ms=20.0)
    InferenceRequest.objects.create(deployment=deployment, endpoint="/v1/completions", status_code=503)
    response = session(alpha["member"]).get(f"/deployments/{deployment.pk}/")
    html = response.content.decode()
    data = json.loads(html.split('<script id="deployment-metrics" type="application/json">')[1].split("</script>")[0])
    assert data["sla"]["ttft_p95_ms"] == 450 and data["sla"]["tpot_p95_ms"] == 40
    assert data["metrics_url"] == f"/api/v1/deployments/{deployment.pk}/metrics/" and data["window_s"] == 900
    assert len(data["series"]) == 16  # every clock minute the 900 s window touches
    last = data["series"][-1]
    assert last["requests"] == 3 and last["errors"] == 1 and last["output_tokens"] == 10
    assert "1× 503" in html and "2 of 3 requests served" in html


def test_detail_for_a_viewer_has_no_actions_and_no_playground(world):
    alpha = world["alpha"]
    deployment = make_deployment(alpha, "chat")
    html = session(alpha["viewer"]).get(f"/deployments/{deployment.pk}/").content.decode()
    assert "viewer role" in html
    assert 'data-method="DELETE"' not in html and "/scale/" not in html
    assert 'id="playground-form"' not in html and "The playground needs the member role" in html


def test_detail_of_a_deleted_deployment_stops_polling_and_acting(world):
    alpha = world["alpha"]
    deployment = make_deployment(alpha, "old")
    Deployment.objects.filter(pk=deployment.pk).update(state="DELETED")
    html = session(alpha["member"]).get(f"/deployments/{deployment.pk}/").content.decode()
    assert "hx-trigger" not in html
    assert 'data-method="DELETE"' not in html and 'id="playground-form"' not in html
    assert "it takes no requests" in html


def test_other_teams_deployment_is_a_404(world):
    theirs = make_deployment(world["beta"], "beta-secret")
    client = session(world["alpha"]["member"])
    assert client.get(f"/deployments/{theirs.pk}/").status_code == 404
    assert client.get("/deployments/999999/").status_code == 404


def test_user_strings_are_escaped(world):
    alpha = world["alpha"]
    evil = '<script>alert("x")</script>'
    deployment = make_deployment(alpha, "escaper", model_uri=f"/models/{evil}", engine={"slots": 2})
    Deployment.objects.filter(pk=deployment.pk).update(state="FAILED", state_reason=f"cannot serve: {evil}")
    client = session(alpha["member"])
    for url in ("/deployments/", f"/deployments/{deployment.pk}/"):
        html = client.get(url).content.decode()
        assert "<script>alert" not in html, url
        assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html, url


@pytest.mark.parametrize("url", ["/deployments/new/", "/deployments/1/playground/"])
def test_anonymous_is_sent_to_login(client, url):
    response = client.get(url) if url.endswith("new/") else client.post(url, "{}", content_type="application/json")
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


# --------------------------------------------------------------------------------------------------- playground


def test_playground_streams_a_chat_answer_and_records_it(world, serving):
    deployment = serving()
    response = play(session(world["alpha"]["member"]), deployment,
                    {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
                     "stream_options": {"include_usage": True}, "model": "ignored", "stream": False})
    assert response.status_code == 200
    payloads = sse_payloads(response)
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(p["model"] == "echo" and p["object"] == "chat.completion.chunk" for p in payloads)
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads if p["choices"])
    assert text == "user: hello\n"  # the echo model repeats the rendered chat prompt
    final = [p for p in payloads if p["choices"] and p["choices"][0]["finish_reason"]][0]
    assert final["choices"][0]["finish_reason"] == "length" and final["fleetyard"]["deployment_id"] == deployment.pk
    assert final["fleetyard"]["ttft_ms"] is not None
    assert payloads[-1]["usage"]["completion_tokens"] == 12
    row = InferenceRequest.objects.get(deployment=deployment)
    assert row.status_code == 200 and row.stream and row.endpoint == "/v1/chat/completions" and row.output_tokens == 12


def test_playground_needs_the_csrf_token(world, serving):
    deployment = serving()
    client = session(world["alpha"]["member"], enforce_csrf_checks=True)
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert play(client, deployment, body).status_code == 403
    assert not InferenceRequest.objects.exists()
    client.get(f"/deployments/{deployment.pk}/")  # sets the csrftoken cookie, as the page does
    token = client.cookies["csrftoken"].value
    response = play(client, deployment, body, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200
    assert sse_payloads(response)


def test_playground_of_another_team_is_a_404_and_a_viewer_gets_403(world, serving):
    theirs = serving("beta", "secret")
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert play(session(world["alpha"]["member"]), theirs, body).status_code == 404
    mine = serving("alpha", "echo")
    response = play(session(world["alpha"]["viewer"]), mine, body)
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden" and "member role" in response.json()["error"]["message"]
    assert session(world["alpha"]["member"]).get(f"/deployments/{mine.pk}/playground/").status_code == 405
    assert not InferenceRequest.objects.exists()


def test_playground_errors_are_openai_shaped(world, serving, backend):
    client = session(world["alpha"]["member"])
    warming = serving("alpha", "warming", state="DEPLOYING", service=False)
    response = play(client, warming, {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503 and response["Retry-After"] == "10"
    assert "not serving yet" in response.json()["error"]["message"]

    short = serving("alpha", "short", engine={"max_prompt_tokens": 8})
    response = play(client, short, {"messages": [{"role": "user", "content": "a prompt far too long"}]})
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"

    busy = serving("alpha", "busy")
    backend.overloaded_services.add(busy.compute_handle)
    response = play(client, busy, {"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 429 and response["Retry-After"]

    echo = serving("alpha", "echo")
    bad = play(client, echo, {"messages": [{"role": "user", "content": "hi"}], "top_p": 0.5})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"
    assert play(client, echo, "not json").status_code == 400
    # refusals that reached a deployment are in its request log, like the gateway's
    assert sorted(InferenceRequest.objects.values_list("status_code", flat=True)) == [400, 429, 503]

    Deployment.objects.filter(pk=echo.pk).update(state="DELETED")
    gone = play(client, echo, {"messages": [{"role": "user", "content": "hi"}]})
    assert gone.status_code == 409 and "DELETED" in gone.json()["error"]["message"]


def test_playground_answers_a_deployment_the_workflow_deployed(world, demo_cluster, backend, tmp_path):
    """Engine defaults (max_prompt_tokens 0: the model's window) must not refuse every prompt."""
    model_dir = tmp_path / "lm"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.pt").write_bytes(b"w")
    with TestCase.captureOnCommitCallbacks(execute=True):
        deployment = make_deployment(world["alpha"], "deployed", model_uri=f"file://{model_dir}")
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.deployment_sync(deployment_id=deployment.pk, backend=backend)
    deployment.refresh_from_db()
    assert deployment.state == "SERVING", deployment.state_reason
    response = play(session(world["alpha"]["member"]), deployment,
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert response.status_code == 200, response.content
    assert "".join(p["choices"][0]["delta"].get("content") or "" for p in sse_payloads(response)) == "user"
