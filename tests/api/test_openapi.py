"""The OpenAPI schema is a contract: it generates without warnings and documents every route."""

from __future__ import annotations

import yaml
from django.core.management import call_command


def test_schema_generates_cleanly(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    schema = yaml.safe_load(out.read_text())
    paths = schema["paths"]
    for route in ("/api/v1/training-jobs/", "/api/v1/training-jobs/{id}/cancel/", "/api/v1/deployments/",
                  "/api/v1/datasets/{id}/versions/", "/api/v1/cluster-queues/", "/api/v1/local-queues/",
                  "/api/v1/node-pools/", "/api/v1/nodes/", "/api/v1/api-tokens/", "/api/v1/audit-events/",
                  "/api/v1/accelerator-types/", "/api/v1/priority-classes/", "/api/v1/me/"):
        assert route in paths, route
    assert "teamToken" in schema["components"]["securitySchemes"]


def test_schema_and_docs_are_served(api):
    client = api("alpha", "viewer")
    assert client.get("/api/v1/schema/").status_code == 200
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    # The UI's assets come from this server, not a CDN (installs may have no internet).
    assert b"cdn.jsdelivr" not in docs.content and b"/static/drf_spectacular_sidecar/" in docs.content
