"""Integration fixtures: a real multi-node Ray cluster (the node_pools.yaml topology) on this host.

Started once per session into a tmp dir and stopped by pid at the end; the teardown checks with
`ps` that none of its processes is left.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from controlplane.compute.local_cluster import LocalCluster, start_local_cluster, stop_local_cluster
from controlplane.compute.topology import load_topology


def _leftover_processes(cluster: LocalCluster) -> list[str]:
    """Live processes (per `ps`) in the cluster's process groups or naming its temp dir."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True,
                         check=True).stdout
    groups = {str(pid) for pid in cluster.pids.values()}
    left = []
    for line in out.splitlines():
        pid, pgid, stat, args = (line.split(None, 3) + [""])[:4]
        if stat.startswith("Z") or int(pid) == os.getpid():
            continue
        if pgid in groups or str(cluster.temp_dir) in args:
            left.append(line.strip())
    return left


@pytest.fixture(scope="session")
def topology():
    return load_topology()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory, topology):
    pytest.importorskip("ray")
    state_dir = tmp_path_factory.mktemp("ray-cluster")
    cluster = start_local_cluster(topology=topology, state_dir=state_dir, fate_share=True)
    saved_env = {key: os.environ.get(key) for key in cluster.client_env()}
    try:
        yield cluster
    finally:
        import ray

        ray.shutdown()  # disconnect this process's driver before its cluster goes away
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        stop_local_cluster(state_dir=state_dir)
        deadline = time.monotonic() + 5
        while _leftover_processes(cluster) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _leftover_processes(cluster) == []


@pytest.fixture(scope="session")
def ray_backend(ray_cluster):
    from controlplane.compute.ray_backend import RayComputeBackend

    return RayComputeBackend(address=ray_cluster.address, env=ray_cluster.client_env())


@pytest.fixture
def pools_from_ray(ray_backend, topology, world, accel, settings, tmp_path):
    """The demo pools in the database with their nodes as Ray reports them, and a fresh data folder."""
    from controlplane.cluster.services import node_pool_create, nodes_sync

    settings.DATA_DIR = tmp_path
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    nodes_sync(observed=ray_backend.list_nodes())
    return ray_backend

