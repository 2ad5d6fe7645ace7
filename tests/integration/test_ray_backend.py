"""RayComputeBackend against a real local multi-node Ray cluster (deploy/node_pools.yaml).

Gangs are all-or-none placement groups pinned by node labels; the chips are logical resources.
The node-kill test runs last: it leaves one node dead for the rest of the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from controlplane.compute.base import ComputeBackend, GangRequest
from controlplane.compute.local_cluster import load_running_cluster, node_cpus, start_local_cluster

# Every test here may touch the database, so pytest-django keeps them in file order (it runs database
# tests before the others); the node-killing test must stay last.
pytestmark = [pytest.mark.ray, pytest.mark.django_db]

H100 = "accel:nvidia-h100"
A100 = "accel:nvidia-a100"


def wait_for(predicate, timeout=5.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def handle() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def free_of(backend, resource: str) -> dict[str, float]:
    return {n.name: n.free[resource] for n in backend.list_nodes() if resource in n.capacity and n.alive}


@pytest.fixture
def gangs(ray_backend):
    """Handles launched by a test; all stopped afterwards so tests start from a free cluster."""
    launched: list[str] = []
    yield launched
    for name in launched:
        ray_backend.stop_gang(name)
    # Removal is immediate in the GCS; the raylets report the freed resources a moment later.
    assert wait_for(lambda: all(n.free == n.capacity for n in ray_backend.list_nodes() if n.alive))


def test_backend_satisfies_protocol(ray_backend):
    assert isinstance(ray_backend, ComputeBackend)
    assert ray_backend.name == "ray"


def test_all_pool_nodes_observed_with_capacity_and_labels(ray_backend, topology):
    observed = {node.name: node for node in ray_backend.list_nodes()}
    specs = {spec.name: spec for spec in topology.node_specs()}
    assert set(observed) == set(specs)  # the head is not a pool node
    simulated = {pool.name: pool.simulated for pool in topology.pools}
    for name, spec in specs.items():
        node = observed[name]
        assert node.alive
        assert node.pool == spec.pool
        assert node.capacity == {"CPU": float(node_cpus(spec.num_cpus)), **spec.resources}
        assert node.free == node.capacity
        assert spec.labels.items() <= node.labels.items()
        assert node.simulated is simulated[spec.pool]
        assert node.leaf_group == spec.labels["fleetyard.io/leaf-group"]
        assert node.accelerator_type == spec.labels["fleetyard.io/accelerator"]


def test_gang_of_two_h100_workers_is_ready_on_both_h100_nodes(ray_backend, gangs):
    name = handle()
    gangs.append(name)
    status = ray_backend.launch_gang(GangRequest(handle=name, accelerator_type="nvidia-h100", workers=2,
                                                 devices_per_worker=8, cpus_per_worker=0.5))
    if status.state != "ready":
        status = wait_for(lambda: (s := ray_backend.observe_gang(name)).state == "ready" and s)
    assert status.state == "ready"
    assert sorted(status.node_names) == ["h100-pool-0", "h100-pool-1"]
    assert free_of(ray_backend, H100) == {"h100-pool-0": 0.0, "h100-pool-1": 0.0}


def test_gang_larger_than_the_pool_stays_pending_and_reserves_nothing(ray_backend, gangs):
    before = free_of(ray_backend, H100)
    name = handle()
    gangs.append(name)
    status = ray_backend.launch_gang(GangRequest(handle=name, accelerator_type="nvidia-h100", workers=3,
                                                 devices_per_worker=8))
    assert status.state == "pending"
    assert status.node_names == ()
    time.sleep(1.0)
    assert ray_backend.observe_gang(name).state == "pending"
    assert free_of(ray_backend, H100) == before == {"h100-pool-0": 8.0, "h100-pool-1": 8.0}


def test_stopping_a_gang_frees_its_capacity(ray_backend):
    name = handle()
    status = ray_backend.launch_gang(GangRequest(handle=name, accelerator_type="nvidia-h100", workers=1,
                                                 devices_per_worker=8))
    assert status.state == "ready"
    assert sum(free_of(ray_backend, H100).values()) == 8.0
    stopped = ray_backend.stop_gang(name)
    assert stopped.state == "stopped"
    assert wait_for(lambda: sum(free_of(ray_backend, H100).values()) == 16.0)
    assert ray_backend.observe_gang(name).state in ("stopped", "unknown")
    assert ray_backend.stop_gang(name).state == "stopped"  # idempotent


def test_launching_twice_is_idempotent(ray_backend, gangs):
    name = handle()
    gangs.append(name)
    request = GangRequest(handle=name, accelerator_type="nvidia-a100", workers=1, devices_per_worker=4)
    first = ray_backend.launch_gang(request)
    second = ray_backend.launch_gang(request)
    assert first.state == second.state == "ready"
    assert first.node_names == second.node_names
    assert sum(free_of(ray_backend, A100).values()) == 12.0  # reserved once, not twice


@pytest.mark.parametrize(("leaf_group", "node"), [("lg-a100-a", "a100-pool-0"), ("lg-a100-b", "a100-pool-1")])
def test_gang_pinned_to_a_leaf_group_lands_there(ray_backend, gangs, leaf_group, node):
    name = handle()
    gangs.append(name)
    status = ray_backend.launch_gang(GangRequest(handle=name, accelerator_type="nvidia-a100", workers=2,
                                                 devices_per_worker=2, pool="a100-pool",
                                                 leaf_group=leaf_group))
    assert status.state == "ready"
    assert status.node_names == (node,)


def test_cpu_gang_uses_the_cpu_pool_only(ray_backend, gangs):
    name = handle()
    gangs.append(name)
    status = ray_backend.launch_gang(GangRequest(handle=name, accelerator_type="cpu", workers=1,
                                                 devices_per_worker=0, cpus_per_worker=1))
    assert status.state == "ready"
    assert status.node_names == ("cpu-pool-0",)


CLIENT_SCRIPT = """
import ray
ray.init(logging_level="ERROR")  # address and auth token come from the environment

@ray.remote(num_cpus=1, label_selector={"fleetyard.io/pool": "cpu-pool"})
def where():
    return ray.get_runtime_context().get_node_labels()["fleetyard.io/node"]

print(ray.get(where.remote(), timeout=60))
"""


def test_another_process_connects_with_client_env_and_runs_a_pinned_task(ray_cluster):
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(ray_cluster.client_env())
    result = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT], env=env, capture_output=True, text=True,
                            timeout=90, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "cpu-pool-0"


def test_second_start_reuses_the_running_cluster(ray_cluster, topology):
    found = load_running_cluster(state_dir=ray_cluster.state_dir)
    assert found is not None
    assert (found.address, found.pids) == (ray_cluster.address, ray_cluster.pids)
    started = time.monotonic()
    again = start_local_cluster(topology=topology, state_dir=ray_cluster.state_dir)
    assert again.pids == ray_cluster.pids
    assert time.monotonic() - started < 2.0


def test_node_reconciler_records_every_ray_node(ray_backend, topology):
    """The beat task's service turns what Ray reports into Node rows, marked simulated."""
    from controlplane.cluster.models import Node
    from controlplane.cluster.services import nodes_sync
    from controlplane.demo import load_demo

    load_demo(topology=topology)
    result = nodes_sync(observed=ray_backend.list_nodes())
    assert result["observed"] == len(topology.node_specs()) and result["unknown_pool"] == 0
    nodes = {node.name: node for node in Node.objects.select_related("pool")}
    assert set(nodes) == {spec.name for spec in topology.node_specs()}
    h100 = nodes["h100-pool-0"]
    assert (h100.pool.name, h100.capacity_devices, h100.simulated, h100.health) == ("h100-pool", 8.0, True, "healthy")
    assert nodes["cpu-pool-0"].simulated is False and nodes["cpu-pool-0"].capacity_cpus == 2.0
    assert nodes["a100-pool-1"].leaf_group == "lg-a100-b" and nodes["a100-pool-1"].ray_node_id


def test_zz_killed_node_is_seen_dead_within_seconds(ray_backend, ray_cluster, topology):
    from controlplane.cluster.models import Node
    from controlplane.cluster.services import nodes_sync
    from controlplane.demo import load_demo

    victim = "p800-pool-0"
    assert {n.name: n.alive for n in ray_backend.list_nodes()}[victim]
    load_demo(topology=topology)
    nodes_sync(observed=ray_backend.list_nodes())  # the reconciler saw it alive once
    killed_at = time.monotonic()
    ray_cluster.kill_node(victim)
    dead = wait_for(lambda: not {n.name: n.alive for n in ray_backend.list_nodes()}[victim],
                    timeout=10.0, interval=0.25)
    assert dead, "a killed node should be reported dead within 10 s"
    print(f"node death noticed after {time.monotonic() - killed_at:.1f} s")
    dead_node = {n.name: n for n in ray_backend.list_nodes()}[victim]
    assert not any(dead_node.free.values())  # a dead node offers nothing (Ray reports no resources)
    assert load_running_cluster(state_dir=ray_cluster.state_dir) is None  # half dead: not reusable
    # The node reconciler records it as unreachable, keeping its last known capacity.
    nodes_sync(observed=ray_backend.list_nodes())
    node = Node.objects.get(name=victim)
    assert (node.health, node.free_devices, node.capacity_devices) == ("unreachable", 0.0, 8.0)
    assert Node.objects.exclude(name=victim).filter(health="healthy").count() == len(topology.node_specs()) - 1
