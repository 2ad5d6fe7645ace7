"""QA of deployments and the OpenAI-compatible gateway: inputs that answered 500 (or a vague error) and now answer a
4xx naming the field and why."""

from __future__ import annotations

import pytest

from inference.models import Deployment
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
    client = api("alpha", "member")
    created = client.post("/api/v1/deployments/", DEPLOYMENT_BODY, format="json").json()
    response = client.patch(f"/api/v1/deployments/{created['id']}/", {"model_uri": uri.format(root=tmp_path)},
                            format="json")
    assert response.status_code == 400, response.content
    assert why in response.json()["model_uri"][0]
    deployment = Deployment.objects.get(pk=created["id"])
    assert deployment.revision == 1 and deployment.model_uri == DEPLOYMENT_BODY["model_uri"]
