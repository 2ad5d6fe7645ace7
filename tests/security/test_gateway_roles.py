"""The gateway's completions need the member role in the token's team, as the console's playground does (a viewer
was refused there and ran the same completion through /v1/chat/completions with a token of their own). Viewers still
list the team's models; nothing is recorded for a refused call."""

from __future__ import annotations

import json

from inference.models import InferenceRequest
from inference.services import deployment_create
from tests.conftest import client_for

BODIES = {"/v1/chat/completions": {"model": "svc", "messages": [{"role": "user", "content": "hi"}]},
          "/v1/completions": {"model": "svc", "prompt": "hi"}}


def test_a_viewer_token_lists_models_but_cannot_run_a_completion(world):
    alpha = world["alpha"]
    deployment_create(actor=alpha["admin"], team=alpha["team"], name="svc", local_queue=alpha["queue"],
                      accelerator_types=["cpu"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50, model_uri="file:///m")
    viewer = client_for(alpha["viewer"], alpha["team"])
    assert [m["id"] for m in viewer.get("/v1/models").json()["data"]] == ["svc"]
    assert viewer.get("/v1/models/svc").status_code == 200
    for url, body in BODIES.items():
        response = viewer.post(url, json.dumps(body), content_type="application/json")
        assert response.status_code == 403, (url, response.content)
        error = response.json()["error"]
        assert error["code"] == "forbidden" and "member role" in error["message"], error
    assert not InferenceRequest.objects.exists()
    # a member reaches the deployment (not serving yet: 503, recorded)
    member = client_for(alpha["member"], alpha["team"])
    response = member.post("/v1/chat/completions", json.dumps(BODIES["/v1/chat/completions"]),
                           content_type="application/json")
    assert response.status_code == 503, response.content
    assert InferenceRequest.objects.count() == 1
