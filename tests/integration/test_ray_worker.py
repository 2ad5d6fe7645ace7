"""The node reconciler as it runs in production: beat's task in a real Celery worker process that
connects to the real multi-node Ray cluster and records the nodes it observes.

Caught a real bug: Celery's stdout proxy has no file descriptor, and ray.init failed in tasks.
"""

from __future__ import annotations

import time

import pytest

from controlplane.cluster.models import Node
from controlplane.cluster.tasks import sync_nodes
from controlplane.demo import load_demo
from tests.integration.celery_workers import running_worker

pytestmark = [pytest.mark.ray, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_sync_nodes_task_in_a_worker_records_the_ray_nodes(ray_cluster, ray_backend, topology, tmp_path,
                                                           settings):
    settings.DATA_DIR = tmp_path
    load_demo(topology=topology)
    env = {"FLEETYARD_COMPUTE_BACKEND": "ray", **ray_cluster.client_env()}
    with running_worker(tmp_path, "filesystem", extra_env=env, pool="prefork") as worker:
        sync_nodes.delay()
        deadline = time.monotonic() + 60
        while Node.objects.count() < len(topology.node_specs()):
            assert time.monotonic() < deadline, worker["log"].read_text()[-4000:]
            assert worker["process"].poll() is None, worker["log"].read_text()[-4000:]
            time.sleep(0.5)
        log = worker["log"].read_text()
    assert "cannot observe nodes" not in log
    alive = {node.name: node.alive for node in ray_backend.list_nodes()}
    recorded = {node.name: node.health for node in Node.objects.all()}
    assert recorded == {name: "healthy" if up else "unreachable" for name, up in alive.items()}
    assert Node.objects.get(name="h100-pool-0").capacity_devices == 8.0
