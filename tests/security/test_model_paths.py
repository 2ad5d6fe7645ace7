"""A deployment's model_uri may name only the platform's model folders (FLEETYARD_MODEL_DIRS): never another
team's training checkpoints, the platform's own data, or any other file on its hosts. Checked at the API and
again when the deployment is deployed (a row changed behind the API's back is refused too)."""

from __future__ import annotations

import json

import pytest

from controlplane.compute.registry import get_compute_backend
from inference import workflows
from inference.models import Deployment
from jobs.runtime.checkpoints import save_checkpoint
from jobs.services import training_job_create
from jobs.workflows import checkpoint_dir
from tests.conftest import client_for


@pytest.fixture
def model_root(settings, tmp_path):
    root = tmp_path / "models"
    (root / "lm").mkdir(parents=True)
    (root / "lm" / "config.json").write_text(json.dumps({"vocab_size": 256}))
    (root / "lm" / "model.pt").write_bytes(b"weights")
    settings.DATA_DIR = tmp_path
    settings.FLEETYARD_MODEL_DIRS = [str(root)]
    return root


def _body(uri: str, name: str = "svc") -> dict:
    return {"name": name, "queue": "default", "accelerator_types": ["cpu"], "model_uri": uri,
            "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}}


def test_the_api_refuses_model_paths_outside_the_model_folders(world, model_root, tmp_path):
    beta = world["beta"]
    theirs = training_job_create(actor=beta["admin"], team=beta["team"], name="beta-lm", local_queue=beta["queue"],
                                 accelerator_types=["cpu"])
    info = save_checkpoint(checkpoint_dir(theirs), step=10, files={"config.json": b"{}", "model.pt": b"w"})
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    for uri in (info.path.as_uri(), str(info.path), "file:///etc", "/", f"file://{model_root}/../",
                f"{model_root}/lm/../../checkpoints", str(tmp_path)):
        response = client.post("/api/v1/deployments/", _body(uri), format="json")
        assert response.status_code == 400, (uri, response.content)
        assert "outside the model folders" in response.json()["model_uri"][0], uri
    assert not Deployment.objects.exists()
    ok = client.post("/api/v1/deployments/", _body(f"file://{model_root}/lm"), format="json")
    assert ok.status_code == 201, ok.content


def test_a_symlink_out_of_the_model_folders_is_refused(world, model_root, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (model_root / "escape").symlink_to(outside)
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    response = client.post("/api/v1/deployments/", _body(str(model_root / "escape")), format="json")
    assert response.status_code == 400 and "outside the model folders" in response.json()["model_uri"][0]


def test_the_deploy_refuses_a_row_changed_behind_the_apis_back(world, accel, model_root):
    from controlplane.cluster.services import node_pool_create, nodes_sync
    from controlplane.compute.base import ObservedNode

    node_pool_create(actor=world["ops"], name="cpu-pool", accelerator_type=accel["cpu"], devices_per_node=0,
                     simulated=False)
    nodes_sync(observed=[ObservedNode(node_id="n1", name="cpu-pool-0", pool="cpu-pool", accelerator_type="cpu",
                                      leaf_group="lg", alive=True, simulated=False, capacity={"CPU": 4},
                                      free={"CPU": 4})])
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    created = client.post("/api/v1/deployments/", _body(f"file://{model_root}/lm"), format="json").json()
    Deployment.objects.filter(pk=created["id"]).update(model_uri="file:///etc", state="PENDING")
    deployment = workflows.deployment_deploy(deployment_id=created["id"], backend=get_compute_backend())
    assert deployment.state == "FAILED" and "outside the model folders" in deployment.state_reason
