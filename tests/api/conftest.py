"""Fixtures shared by the API tests."""

from __future__ import annotations

import pytest

from controlplane.cluster.services import node_pool_create, nodes_sync
from controlplane.compute.base import ObservedNode
from controlplane.compute.registry import get_compute_backend
from tests.conftest import write_model_folder


def small_cluster(world, accel, *, h100_free_on_first: int) -> None:
    """A simulated H100 pool with two nodes (16 devices; the first has h100_free_on_first free, the second all
    8) and a real CPU pool with one node (3 of 4 CPUs free): the console tests' cluster."""
    ops = world["ops"]
    node_pool_create(actor=ops, name="h100-pool", accelerator_type=accel["nvidia-h100"], devices_per_node=8,
                     simulated=True)
    node_pool_create(actor=ops, name="cpu-pool", accelerator_type=accel["cpu"], devices_per_node=0,
                     simulated=False)
    nodes_sync(observed=[
        ObservedNode(node_id="n1", name="h100-pool-0", pool="h100-pool", accelerator_type="nvidia-h100",
                     leaf_group="lg-h100-a", alive=True, simulated=True,
                     capacity={"accel:nvidia-h100": 8, "CPU": 1},
                     free={"accel:nvidia-h100": h100_free_on_first, "CPU": 1}, labels={"fleetyard/pool": "h100-pool"}),
        ObservedNode(node_id="n2", name="h100-pool-1", pool="h100-pool", accelerator_type="nvidia-h100",
                     leaf_group="lg-h100-a", alive=True, simulated=True,
                     capacity={"accel:nvidia-h100": 8}, free={"accel:nvidia-h100": 8}),
        ObservedNode(node_id="n3", name="cpu-pool-0", pool="cpu-pool", accelerator_type="cpu",
                     leaf_group="lg-cpu-a", alive=True, simulated=False, capacity={"CPU": 4}, free={"CPU": 3}),
    ])


@pytest.fixture
def backend():
    """The process's in-memory backend; services and overload marks a test made are removed after it.
    (Modules that need their own backend, such as test_training_runs.py, define their own `backend`.)"""
    backend = get_compute_backend()
    before = set(backend.list_service_handles())
    yield backend
    for handle in set(backend.list_service_handles()) - before:
        backend.delete_service(handle)
        backend.overloaded_services.discard(handle)


@pytest.fixture
def model_dir(tmp_path):
    return write_model_folder(tmp_path)
