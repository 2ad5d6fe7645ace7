"""The OpenAI-compatible gateway (/v1/...) against the in-memory backend's echo model.

The echo model answers with the prompt's bytes, cycling, honouring max_tokens and stop strings, so
the expected text of every request is known. Deployments are rows set to their serving state
directly (no deployment workflow), with a fake service deployed on the memory backend.
"""

from __future__ import annotations

import json
import math

import pytest
from django.core.signals import request_finished
from django.db import close_old_connections
from django.test import Client, RequestFactory
from django.utils import timezone

from controlplane.compute.base import ServiceSpec, ServiceUnavailable
from controlplane.tenancy.services import api_token_create
from inference.gateway.openai_schema import CHAT_COMPLETIONS, OutputText, parse_request, render_chat_prompt
from inference.models import Deployment, InferenceRequest

COMPLETIONS_URL = "/v1/completions"
CHAT_URL = "/v1/chat/completions"


# --------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def deploy(world, backend):
    """deploy(team, name, state=..., engine=..., service_engine=..., service=True) -> a Deployment row."""

    def make(team_name: str = "alpha", name: str = "echo", *, state: str = "SERVING", engine: dict | None = None,
             service_engine: dict | None = None, service: bool = True) -> Deployment:
        team = world[team_name]["team"]
        deployment = Deployment.objects.create(
            team=team, name=name, local_queue=world[team_name]["queue"], model_uri="file:///checkpoints/echo",
            accelerator_types=["cpu"], devices_per_replica=0, sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
            engine=engine or {})
        handle = f"gw-test-{team_name}-{name}-{deployment.pk}"
        if service:
            backend.deploy_service(ServiceSpec(
                handle=handle, deployment_id=deployment.pk, revision=1, model_dir="/nonexistent",
                accelerator_type="cpu", devices_per_replica=0, replicas_min=1, replicas_max=1,
                target_ongoing_requests=2, max_ongoing_requests=4, max_queued_requests=8,
                engine=service_engine or {}))
        Deployment.objects.filter(pk=deployment.pk).update(state=state, compute_handle=handle if service else "")
        deployment.refresh_from_db()
        return deployment

    return make


def token_client(world, team_name: str = "alpha", role: str = "member") -> Client:
    user = world[team_name][role]
    _, raw = api_token_create(actor=user, team=world[team_name]["team"], user=user, name="gateway")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


@pytest.fixture
def client(world):
    return token_client(world)


def post(client: Client, url: str, body) -> object:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json")


def sse_payloads(response) -> list[dict]:
    """The JSON payloads of an SSE body, checking the framing and that [DONE] comes last, once."""
    assert response["Content-Type"].startswith("text/event-stream")
    raw = b"".join(response.streaming_content).decode("utf-8")
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events), events
    payloads = [e[len("data: "):] for e in events]
    assert payloads[-1] == "[DONE]" and "[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def assert_openai_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    return error


# --------------------------------------------------------------------------------------------------- models


def test_models_lists_only_the_teams_live_deployments(world, deploy, client):
    deploy("alpha", "echo")
    deploy("alpha", "warming", state="DEPLOYING", service=False)
    deploy("alpha", "gone", state="DELETED")
    deploy("beta", "secret")
    response = client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    cards = {card["id"]: card for card in body["data"]}
    assert set(cards) == {"echo", "warming"}
    echo = cards["echo"]
    assert echo["object"] == "model" and echo["owned_by"] == "alpha" and isinstance(echo["created"], int)
    assert echo["fleetyard"]["state"] == "SERVING" and echo["fleetyard"]["ready"] is True
    assert echo["fleetyard"]["deployment_id"] == Deployment.objects.get(team__name="alpha", name="echo").pk
    assert cards["warming"]["fleetyard"] == {**cards["warming"]["fleetyard"], "state": "DEPLOYING", "ready": False}
    assert client.get("/v1/models/echo").json()["id"] == "echo"
    assert_openai_error(client.get("/v1/models/secret"), 404, "model")


def test_another_teams_deployment_is_unknown_and_nothing_is_written(world, deploy, client):
    deploy("beta", "secret")
    error = assert_openai_error(post(client, COMPLETIONS_URL, {"model": "secret", "prompt": "hi"}), 404, "model")
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
    assert not InferenceRequest.objects.exists()
    # beta's own token reaches it
    assert post(token_client(world, "beta"), COMPLETIONS_URL, {"model": "secret", "prompt": "hi"}).status_code == 200


# --------------------------------------------------------------------------------------------------- completions


def test_completion_answers_and_records_the_request(deploy, client):
    deployment = deploy()
    response = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hello world", "max_tokens": 5})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == "echo" and isinstance(body["created"], int)
    assert body["choices"] == [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16}
    extra = body["fleetyard"]
    assert extra["replica"] == "memory-0" and extra["cached_tokens"] == 0 and extra["queue_ms"] == 0.0
    assert extra["ttft_ms"] >= 0 and extra["tpot_ms"] >= 0 and extra["deployment_id"] == deployment.pk

    row = InferenceRequest.objects.get()
    assert row.deployment == deployment and row.endpoint == "/v1/completions" and row.status_code == 200
    assert not row.stream and row.finish_reason == "length" and row.error == ""
    assert (row.prompt_tokens, row.cached_tokens, row.output_tokens) == (11, 0, 5)
    assert row.queue_ms == 0.0 and row.ttft_ms is not None and row.tpot_ms is not None
    assert row.total_ms is not None and row.total_ms > 0 and row.replica == "memory-0"


def test_defaults_and_max_tokens(deploy, client):
    deploy()
    body = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "abc"}).json()
    assert body["choices"][0]["text"] == ("abc" * 6)[:16] and body["usage"]["completion_tokens"] == 16
    body = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": ["abc"], "max_tokens": 1}).json()
    assert body["choices"][0]["text"] == "a" and body["choices"][0]["finish_reason"] == "length"
    chat = post(client, CHAT_URL, {"model": "echo", "messages": [{"role": "user", "content": "x"}]}).json()
    assert chat["usage"]["completion_tokens"] == 128


def test_streamed_completion_matches_the_plain_one(deploy, client):
    deploy()
    request = {"model": "echo", "prompt": "stream me, please", "max_tokens": 12}
    plain = post(client, COMPLETIONS_URL, request).json()
    response = post(client, COMPLETIONS_URL, {**request, "stream": True})
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-cache" and response["X-Accel-Buffering"] == "no"
    chunks = sse_payloads(response)
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["id"].startswith("cmpl-") and all("usage" not in c for c in chunks)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == plain["choices"][0]["text"] == "stream me, p"
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["fleetyard"]["replica"] == "memory-0"

    rows = list(InferenceRequest.objects.order_by("id"))
    assert [(r.stream, r.status_code, r.output_tokens, r.finish_reason) for r in rows] == [
        (False, 200, 12, "length"), (True, 200, 12, "length")]
    assert rows[1].ttft_ms is not None and rows[1].total_ms > 0 and rows[1].prompt_tokens == len("stream me, please")


def test_stream_with_usage(deploy, client):
    deploy()
    chunks = sse_payloads(post(client, COMPLETIONS_URL, {
        "model": "echo", "prompt": "usage", "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}}))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_prompt_tokens_are_utf8_bytes(deploy, client):
    deploy()
    prompt = "héllo wörld ✓"
    request = {"model": "echo", "prompt": prompt, "max_tokens": 4}
    plain = post(client, COMPLETIONS_URL, request).json()
    assert plain["usage"]["prompt_tokens"] == len(prompt.encode()) == 17
    assert plain["choices"][0]["text"].startswith("h")
    chunks = sse_payloads(post(client, COMPLETIONS_URL, {**request, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["choices"][0]["text"]


# --------------------------------------------------------------------------------------------------- chat


def test_chat_completion_plain_and_streamed(deploy, client):
    deploy()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    rendered = "system: be brief\nuser: hi\nassistant: "
    body = post(client, CHAT_URL, {"model": "echo", "messages": messages, "max_tokens": 20}).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": rendered[:20]}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["prompt_tokens"] == len(rendered)

    chunks = sse_payloads(post(client, CHAT_URL, {"model": "echo", "messages": messages, "max_tokens": 20,
                                                  "stream": True}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == rendered[:20]
    assert chunks[-1]["choices"][0]["delta"] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert [r.endpoint for r in InferenceRequest.objects.order_by("id")] == ["/v1/chat/completions"] * 2


def test_chat_accepts_text_parts_and_max_completion_tokens(deploy, client):
    deploy()
    body = post(client, CHAT_URL, {"model": "echo", "max_completion_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}]}]}).json()
    assert body["choices"][0]["message"]["content"] == "user"
    assert render_chat_prompt(parse_request({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "ab"}]}]}, endpoint=CHAT_COMPLETIONS).messages) == (
        "user: ab\nassistant: ")


# --------------------------------------------------------------------------------------------------- stop strings


@pytest.mark.parametrize("stop,expected,finish", [
    ("o", "hell", "stop"),
    (["xyz", "d"], "hello worl", "stop"),
    ([" ", "w"], "hello", "stop"),
    (["zzz"], "hello worldhello", "length"),
])
def test_stop_strings_plain_and_streamed(deploy, client, stop, expected, finish):
    deploy()
    request = {"model": "echo", "prompt": "hello world", "max_tokens": 16, "stop": stop}
    plain = post(client, COMPLETIONS_URL, request).json()["choices"][0]
    assert (plain["text"], plain["finish_reason"]) == (expected, finish)
    chunks = sse_payloads(post(client, COMPLETIONS_URL, {**request, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected
    assert chunks[-1]["choices"][0]["finish_reason"] == finish
    assert InferenceRequest.objects.filter(finish_reason=finish).count() == 2


class StopEmittingBackend:
    """A backend that ignores stop strings and emits text in multi-character pieces."""

    def stream_completion(self, handle, request, *, timeout_s=60.0):
        def events():
            for piece in ("he", "llo <", "/s>", " never"):
                yield {"type": "token", "token_id": 0, "text": piece}
            yield {"type": "done", "finish_reason": "length", "metrics": {"output_tokens": 4}}
        return events()


def test_a_stop_string_emitted_by_the_backend_is_cut(deploy, client, monkeypatch):
    deploy()
    monkeypatch.setattr("inference.gateway.services.get_compute_backend", lambda: StopEmittingBackend())
    request = {"model": "echo", "prompt": "x", "stop": ["</s>"]}
    plain = post(client, COMPLETIONS_URL, request).json()["choices"][0]
    assert (plain["text"], plain["finish_reason"]) == ("hello <", "stop")  # "<" was sent before "/s>" came
    chunks = sse_payloads(post(client, COMPLETIONS_URL, {**request, "stream": True}))
    assert [c["choices"][0]["text"] for c in chunks] == ["he", "llo <", ""]
    out = OutputText(("lo",))
    assert [out.feed(p) for p in ("hel", "lo w", "orld")] == ["hel", "", ""]
    assert out.finish("length") == "stop" and out.text == "hel"


# --------------------------------------------------------------------------------------------------- validation


BAD_COMPLETIONS = [
    ({"prompt": None}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 3]}, "prompt"),
    ({"model": None}, "model"),
    ({"model": 7}, "model"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 4097}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.9}, "top_p"),
    ({"n": 2}, "n"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"stream": "yes"}, "stream"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"extra": 1}}, "stream_options.extra"),
    ({"temprature": 0.5}, "temprature"),
    ({"messages": []}, "messages"),
    ({"logprobs": 5}, "logprobs"),
    ({"echo": True}, "echo"),
    ({"best_of": 2}, "best_of"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
]


@pytest.mark.parametrize("change,param", BAD_COMPLETIONS)
def test_bad_completion_fields_are_named(deploy, client, change, param):
    deploy()
    body = {"model": "echo", "prompt": "hi", **change}
    body = {k: v for k, v in body.items() if not (k in ("model", "prompt") and v is None)}
    error = assert_openai_error(post(client, COMPLETIONS_URL, body), 400, param)
    assert error["type"] == "invalid_request_error"
    assert not InferenceRequest.objects.exists()


BAD_CHATS = [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]},
     "messages[0].content[0]"),
    ({"prompt": "hi"}, "prompt"),
    ({"max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"max_completion_tokens": 5, "max_tokens": 6}, "max_completion_tokens"),
    ({"top_p": 0.5}, "top_p"),
    ({"logprobs": True}, "logprobs"),
]


@pytest.mark.parametrize("change,param", BAD_CHATS)
def test_bad_chat_fields_are_named(deploy, client, change, param):
    deploy()
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert_openai_error(post(client, CHAT_URL, body), 400, param)
    assert not InferenceRequest.objects.exists()


def test_neutral_values_and_nulls_are_accepted(deploy, client):
    deploy()
    response = post(client, COMPLETIONS_URL, {
        "model": "echo", "prompt": "ok", "max_tokens": 2, "temperature": 0, "top_p": 1, "n": 1, "seed": 7,
        "stop": None, "ignore_eos": True, "user": "bench", "logprobs": None, "echo": False, "best_of": 1,
        "frequency_penalty": 0, "presence_penalty": 0.0, "repetition_penalty": 1.0})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "ok"


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_a_400(deploy, client, raw):
    deploy()
    assert_openai_error(client.post(COMPLETIONS_URL, data=raw, content_type="application/json"), 400, None)


def test_a_prompt_longer_than_the_deployment_takes_is_a_400_and_recorded(deploy, client):
    deploy(engine={"max_prompt_tokens": 32})
    fits = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "x" * 32, "max_tokens": 1})
    assert fits.status_code == 200
    error = assert_openai_error(post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "é" * 17}), 400, "prompt")
    assert error["code"] == "context_length_exceeded" and "34 tokens" in error["message"]
    chat = post(client, CHAT_URL, {"model": "echo", "messages": [{"role": "user", "content": "y" * 30}]})
    assert_openai_error(chat, 400, "messages")
    rows = list(InferenceRequest.objects.order_by("id"))
    assert [r.status_code for r in rows] == [200, 400, 400]
    assert rows[1].prompt_tokens == 34 and "at most 32" in rows[1].error


def test_the_replica_refusing_a_prompt_is_a_400(deploy, client):
    deploy(service_engine={"max_prompt_tokens": 8})  # the row says nothing; the service refuses
    response = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "nine byte"})
    error = assert_openai_error(response, 400, "prompt")  # the replica's message names the field first
    assert "at most 8" in error["message"]
    assert InferenceRequest.objects.get().status_code == 400


# --------------------------------------------------------------------------------------------------- auth, 404, 405


@pytest.mark.parametrize("header", [None, "Bearer fy_not-a-real-token", "Bearer nope", "Basic dXNlcjpwdw==",
                                    "Bearer"])
def test_no_or_bad_token_is_a_401_and_writes_nothing(deploy, header):
    deploy()
    client = Client(HTTP_AUTHORIZATION=header) if header else Client()
    response = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi"})
    error = assert_openai_error(response, 401, None)
    assert error["code"] == "invalid_api_key" and response["WWW-Authenticate"].startswith("Bearer")
    assert_openai_error(client.get("/v1/models"), 401, None)
    assert not InferenceRequest.objects.exists()


def test_a_revoked_token_or_a_former_member_is_a_401(world, deploy):
    from controlplane.tenancy.models import ApiToken, Membership

    deploy()
    user = world["alpha"]["member"]
    token, raw = api_token_create(actor=user, team=world["alpha"]["team"], user=user, name="gw")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi"}).status_code == 200
    Membership.objects.filter(user=user).delete()
    assert_openai_error(post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi"}), 401, None)
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    assert_openai_error(post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi"}), 401, None)
    assert InferenceRequest.objects.count() == 1


def test_unknown_model_is_a_404_and_writes_nothing(deploy, client):
    deploy()
    deploy(name="old", state="FAILED")
    for model in ("nope", "old"):
        assert_openai_error(post(client, COMPLETIONS_URL, {"model": model, "prompt": "hi"}), 404, "model")
        assert_openai_error(post(client, CHAT_URL, {"model": model, "messages": [{"role": "user", "content": "x"}]}),
                            404, "model")
    assert not InferenceRequest.objects.exists()


def test_wrong_method_is_a_405(client):
    response = client.get(COMPLETIONS_URL)
    error = assert_openai_error(response, 405, None)
    assert error["code"] == "method_not_allowed" and "POST" in response["Allow"]
    assert_openai_error(client.delete(CHAT_URL), 405, None)
    assert_openai_error(client.post("/v1/models"), 405, None)


# ------------------------------------------------------------------------------------------- overload, unavailable


@pytest.mark.parametrize("state", ["PENDING", "DEPLOYING"])
def test_a_deployment_not_serving_yet_is_a_503_with_retry_after(deploy, client, state):
    deploy(state=state, service=False)
    response = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi"})
    error = assert_openai_error(response, 503, None)
    assert error["code"] == "model_not_ready" and state in error["message"]
    assert int(response["Retry-After"]) >= 1
    row = InferenceRequest.objects.get()
    assert row.status_code == 503 and state in row.error and row.output_tokens == 0


@pytest.mark.parametrize("state", ["SERVING", "UPDATING", "DEGRADED"])
def test_serving_states_take_requests(deploy, client, state):
    deploy(state=state)
    assert post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi", "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_an_overloaded_deployment_is_a_429_with_retry_after(deploy, backend, client, stream):
    deployment = deploy()
    backend.overloaded_services.add(deployment.compute_handle)
    response = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi", "stream": stream})
    error = assert_openai_error(response, 429, None)
    assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
    assert response["Retry-After"] == "1"
    row = InferenceRequest.objects.get()
    assert row.status_code == 429 and row.stream is stream and "queue is full" in row.error and row.prompt_tokens == 2


def test_a_service_the_backend_does_not_run_is_a_503_with_retry_after(deploy, backend, client):
    deployment = deploy()
    backend.delete_service(deployment.compute_handle)
    response = post(client, CHAT_URL, {"model": "echo", "messages": [{"role": "user", "content": "x"}]})
    assert_openai_error(response, 503, None)
    assert response["Retry-After"] == "5"
    assert InferenceRequest.objects.get().status_code == 503


class SpyBackend:
    """Wraps the memory backend: records each call, optionally fails after `fail_after` tokens."""

    def __init__(self, inner, fail_after: int | None = None, retry_after_s: float | None = 0.2):
        self.inner = inner
        self.calls: list[tuple[str, dict, float]] = []
        self.fail_after = fail_after
        self.retry_after_s = retry_after_s

    def stream_completion(self, handle, request, *, timeout_s=60.0):
        self.calls.append((handle, request, timeout_s))
        events = self.inner.stream_completion(handle, request, timeout_s=timeout_s)
        if self.fail_after is None:
            return events
        return self._failing(events)

    def _failing(self, events):
        for i, event in enumerate(events):
            if i == self.fail_after:
                raise ServiceUnavailable("replica lost", retry_after_s=self.retry_after_s)
            yield event


def test_the_backend_gets_the_request_and_a_timeout(deploy, backend, client, monkeypatch):
    deployment = deploy()
    spy = SpyBackend(backend)
    monkeypatch.setattr("inference.gateway.services.get_compute_backend", lambda: spy)
    post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "ab", "max_tokens": 3, "temperature": 0.5,
                                   "seed": 42, "stop": "zz", "ignore_eos": True})
    post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "ab"})
    (handle, request, timeout_s), (_, second, _) = spy.calls
    assert handle == deployment.compute_handle and 0 < timeout_s < math.inf
    assert request == {"prompt_tokens": [97, 98], "max_tokens": 3, "temperature": 0.5, "seed": 42, "stop": ["zz"],
                       "ignore_eos": True}
    assert isinstance(second["seed"], int) and second["temperature"] == 1.0 and second["ignore_eos"] is False


def test_a_failure_mid_stream_is_an_error_event_and_recorded(deploy, backend, client, monkeypatch):
    deploy()
    spy = SpyBackend(backend, fail_after=3)
    monkeypatch.setattr("inference.gateway.services.get_compute_backend", lambda: spy)
    chunks = sse_payloads(post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "abcdef", "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "abc"
    assert chunks[-1]["error"]["code"] == "model_unavailable"
    plain = post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "abcdef"})
    assert_openai_error(plain, 503, None)
    assert plain["Retry-After"] == "1"  # 0.2 s rounds up to the 1 s minimum
    rows = list(InferenceRequest.objects.order_by("id"))
    assert [(r.stream, r.status_code, r.output_tokens) for r in rows] == [(True, 503, 3), (False, 503, 3)]
    assert all("replica lost" in r.error for r in rows)


def test_a_client_leaving_mid_stream_is_recorded(world, deploy):
    from inference.gateway.views import CompletionsView

    deploy()
    user = world["alpha"]["member"]
    _, raw = api_token_create(actor=user, team=world["alpha"]["team"], user=user, name="gw")
    request = RequestFactory().post(COMPLETIONS_URL, data=json.dumps({
        "model": "echo", "prompt": "abcdef", "max_tokens": 50, "stream": True}),
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = CompletionsView.as_view()(request)
    assert next(iter(response.streaming_content)).startswith(b"data: ")
    assert not InferenceRequest.objects.exists()  # written when the stream ends, not before
    # What the WSGI server does when the client goes away (request_finished would close the test's
    # database connection).
    request_finished.disconnect(close_old_connections)
    try:
        response.close()
    finally:
        request_finished.connect(close_old_connections)
    row = InferenceRequest.objects.get()
    assert row.status_code == 499 and row.stream and row.output_tokens == 1 and "closed" in row.error
