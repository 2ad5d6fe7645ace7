"""Fixtures shared by the API tests."""

from __future__ import annotations

import pytest

from controlplane.cluster.services import node_pool_create, nodes_sync
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology


@pytest.fixture
def demo_cluster(world, accel):
    """The demo topology's pools and nodes (2x8 h100, 2x8 a100, 1x8 p800, a CPU node), all healthy."""
    topology = load_topology()
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    nodes_sync(observed=InMemoryComputeBackend.from_topology(topology).list_nodes())
    return topology
