"""RayComputeBackend.observe_service names the nodes of replicas Serve placed that do not run yet (starting), apart
from the running ones: the scheduling cycle holds a replica being deployed on its node until it runs, so a training
worker re-placed meanwhile does not go there (QA: a worker was moved onto the node a replica was being deployed to).
No Ray cluster: Serve's details are faked."""

from __future__ import annotations

import ray.serve.context as serve_context

from controlplane.compute.ray_backend import RayComputeBackend


class FakeClient:
    def get_serve_details(self):
        replicas = [{"state": "RUNNING", "node_id": "id-a"}, {"state": "STARTING", "node_id": "id-b"},
                    {"state": "STARTING", "node_id": None},  # not placed yet: no node to name
                    {"state": "STOPPING", "node_id": "id-a"}]
        return {"applications": {"fy-serve-2": {"status": "DEPLOYING", "deployments": {"llm": {
            "replicas": replicas, "target_num_replicas": 3, "deployment_config": {"user_config": {"revision": 1}}}}}}}


def test_starting_replicas_are_named_apart_from_running_ones(monkeypatch):
    backend = RayComputeBackend(address="auto")
    monkeypatch.setattr(backend, "_serve", lambda: None)
    monkeypatch.setattr(backend, "_node_names_by_id", lambda: {"id-a": "h100-pool-0", "id-b": "h100-pool-1"})
    monkeypatch.setattr(serve_context, "_get_global_client", lambda: FakeClient())
    status = backend.observe_service("fy-serve-2")
    assert status.state == "deploying" and status.replicas_running == 1
    assert status.node_names == ("h100-pool-0",) and status.starting_node_names == ("h100-pool-1",)
