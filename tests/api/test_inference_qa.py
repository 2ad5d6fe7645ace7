"""QA of deployments and the OpenAI-compatible gateway: inputs that answered 500 (or a vague error) and now answer a
4xx naming the field and why."""

from __future__ import annotations

import pytest
from django.test import Client

from inference.models import Deployment, InferenceRequest
from tests.api.test_openai_gateway import (  # noqa: F401 - deploy and client are fixtures
    CHAT_URL,
    COMPLETIONS_URL,
    assert_openai_error,
    client,
    deploy,
    post,
)
from tests.conftest import DEPLOYMENT_BODY

# --------------------------------------------------------------------------------------------------- model_uri

# Before: a NUL character (percent-encoded in a file:// URI, so the serializer's NUL check does not see it) or a name
# longer than the file system takes, in a model folder that exists, made the path checks raise (ValueError: embedded
# null byte; OSError: File name too long) and the create or update answered 500. `{root}` is an existing folder.
UNUSABLE_MODEL_URIS = [
    ("file://{root}/lm%00", "NUL"),
    ("file://{root}/%00/lm", "NUL"),
    ("{root}/" + "a" * 300, "300 bytes"),
    ("file://{root}/" + "b" * 256 + "/lm", "256 bytes"),
    ("{root}/" + "é" * 128, "256 bytes"),  # 128 characters, 256 bytes of UTF-8
]


@pytest.mark.parametrize("uri,why", UNUSABLE_MODEL_URIS)
@pytest.mark.parametrize("checked", [False, True], ids=["any-folder", "model-folders-checked"])
def test_a_model_uri_no_file_system_takes_is_a_400_at_create(api, request, settings, tmp_path, uri, why, checked):
    if checked:  # as outside tests: only FLEETYARD_MODEL_DIRS, and the folder must hold the model
        request.getfixturevalue("model_dirs_checked")
        settings.FLEETYARD_MODEL_DIRS = [str(tmp_path)]
    response = api("alpha", "member").post("/api/v1/deployments/", {**DEPLOYMENT_BODY,
                                                                    "model_uri": uri.format(root=tmp_path)},
                                           format="json")
    assert response.status_code == 400, response.content
    assert why in response.json()["model_uri"][0]
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("uri,why", UNUSABLE_MODEL_URIS)
def test_a_model_uri_no_file_system_takes_is_a_400_at_update(api, tmp_path, uri, why):
    member = api("alpha", "member")
    created = member.post("/api/v1/deployments/", DEPLOYMENT_BODY, format="json").json()
    response = member.patch(f"/api/v1/deployments/{created['id']}/", {"model_uri": uri.format(root=tmp_path)},
                            format="json")
    assert response.status_code == 400, response.content
    assert why in response.json()["model_uri"][0]
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.revision == 1 and deployment.model_uri == DEPLOYMENT_BODY["model_uri"]


# --------------------------------------------------------------------------------------------------- the gateway

# Before: JSON's \u escapes can spell a lone surrogate ("\ud800"), which json.loads accepts; the model name reached
# the database and the prompt became UTF-8 tokens, and both raised UnicodeEncodeError: a 500 with a traceback (a
# stop string reached the backend as it was).
LONE_SURROGATES = [
    (COMPLETIONS_URL, '{"model": "\\ud800", "prompt": "hi"}', "model"),
    (COMPLETIONS_URL, '{"model": "echo", "prompt": "caf\\u00e9 \\udfff"}', "prompt"),
    (COMPLETIONS_URL, '{"model": "echo", "prompt": ["\\ud83d"]}', "prompt[0]"),
    (COMPLETIONS_URL, '{"model": "echo", "prompt": "hi", "stop": ["x", "\\udc00"]}', "stop[1]"),
    (CHAT_URL, '{"model": "echo", "messages": [{"role": "user", "content": "ok"}, '
               '{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}]}', "messages[1].content[0].text"),
]


@pytest.mark.parametrize("url,raw,param", LONE_SURROGATES)
def test_a_lone_surrogate_in_a_gateway_request_is_a_400_naming_where(deploy, client, url, raw, param):  # noqa: F811
    deploy()
    response = post(client, url, raw)
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error" and "lone surrogate" in error["message"]
    assert not InferenceRequest.objects.exists()
    # a surrogate pair (an emoji, 4 bytes of UTF-8) is text like any other
    fine = post(client, COMPLETIONS_URL, '{"model": "echo", "prompt": "\\ud83d\\ude00", "max_tokens": 4}')
    assert fine.status_code == 200 and fine.json()["usage"]["prompt_tokens"] == 4


def test_a_lone_surrogate_in_the_playground_is_a_400(world, deploy):  # noqa: F811
    deployment = deploy()
    session = Client()
    session.force_login(world["alpha"]["member"])
    response = session.post(f"/deployments/{deployment.pk}/playground/", content_type="application/json",
                            data='{"messages": [{"role": "user", "content": "\\udead"}]}')
    assert_openai_error(response, 400, "messages[0].content")


@pytest.mark.parametrize("method,url", [
    ("post", "/v1/completions/"),  # a trailing slash
    ("post", "/v1/chat/completions/"),
    ("get", "/v1/models/"),
    ("get", "/v1/models/echo/"),
    ("post", "/v1/embeddings"),
    ("get", "/v1/"),
    ("delete", "/v1/files/abc"),
])
def test_an_unknown_gateway_url_is_an_openai_shaped_404(deploy, client, method, url):  # noqa: F811
    """Before: Django's HTML 404 page, which OpenAI clients cannot read (/api/ answers JSON since S7; /v1/ did not)."""
    deploy()
    body = {} if method == "get" else {"data": "{}", "content_type": "application/json"}
    response = getattr(client, method)(url, **body)
    error = assert_openai_error(response, 404, None)
    assert error["code"] == "unknown_url" and url in error["message"] and "POST /v1/completions" in error["message"]
    assert response["Content-Type"] == "application/json"
    assert not InferenceRequest.objects.exists()


# --------------------------------------------------------------------------------------------------- scale


def test_scaling_to_zero_without_a_maximum_names_replicas_min_and_says_what_to_send(api):
    """Before: 400 {"replicas_max": ["must be at least 1"]}, a field the request did not hold (replicas_max defaults
    to replicas_min, 0)."""
    member = api("alpha", "member")
    created = member.post("/api/v1/deployments/", DEPLOYMENT_BODY, format="json").json()
    response = member.post(f"/api/v1/deployments/{created['id']}/scale/", {"replicas_min": 0}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert list(body) == ["replicas_min"] and "give replicas_max too" in body["replicas_min"][0]
    # (it said "0 scales to zero when idle", which nothing does: a minimum of 0 runs one replica; QA)
    assert "runs as 1" in body["replicas_min"][0] and "scales to zero" not in body["replicas_min"][0]
    assert Deployment.objects.get(pk=created["id"]).revision == 1
    # with a maximum, scaling down to zero is a revision like any other
    response = member.post(f"/api/v1/deployments/{created['id']}/scale/", {"replicas_min": 0, "replicas_max": 2},
                           format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["spec"]["replicas_min"] == 0 and response.json()["spec"]["replicas_max"] == 2


@pytest.mark.parametrize("user", [5, True, {"id": 1}, ["a"]])
def test_user_must_be_a_string(deploy, client, user):  # noqa: F811
    """`user` is documented as "a string, ignored"; before, any JSON value was accepted and ignored (every other field
    of the wrong type is a 400 naming it)."""
    deploy()
    error = assert_openai_error(post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi", "user": user}), 400,
                                "user")
    assert "must be a string" in error["message"]
    assert post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi", "user": "bench-1"}).status_code == 200
    assert post(client, COMPLETIONS_URL, {"model": "echo", "prompt": "hi", "user": None}).status_code == 200


@pytest.mark.parametrize("method,url,raw", [
    ("get", "/v1/models/echo%00", None),
    ("post", COMPLETIONS_URL, '{"model": "echo\\u0000", "prompt": "hi"}'),
    ("post", CHAT_URL, '{"model": "\\u0000", "messages": [{"role": "user", "content": "hi"}]}'),
])
def test_a_nul_in_the_model_name_is_an_unknown_model(deploy, client, method, url, raw):  # noqa: F811
    """QA (2026-11-29): on PostgreSQL a NUL in the name reached the query and Django raised ValueError, a 500."""
    deploy()
    response = client.get(url) if method == "get" else post(client, url, raw)
    error = assert_openai_error(response, 404, "model")
    assert error["code"] == "model_not_found"
    assert not InferenceRequest.objects.exists()
