"""The node-pool topology file and the in-memory compute backend (the unit-test stand-in for Ray)."""

from __future__ import annotations

import re

import pytest

from controlplane.compute.base import ComputeBackend, GangRequest
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import TopologyError, load_topology


def test_demo_topology_matches_the_issue():
    topology = load_topology()
    pools = {pool.name: pool for pool in topology.pools}
    assert (pools["h100-pool"].nodes, pools["h100-pool"].devices_per_node) == (2, 8)
    assert (pools["a100-pool"].nodes, pools["a100-pool"].devices_per_node) == (2, 8)
    assert (pools["p800-pool"].accelerator_type, pools["p800-pool"].nodes) == ("kunlun-p800", 1)
    assert pools["cpu-pool"].simulated is False and pools["h100-pool"].simulated is True
    specs = {spec.name: spec for spec in topology.node_specs()}
    assert specs["h100-pool-1"].resources == {"accel:nvidia-h100": 8.0}
    assert specs["cpu-pool-0"].resources == {}
    assert specs["a100-pool-1"].labels["fleetyard.io/leaf-group"] == "lg-a100-b"
    assert all(float(spec.num_cpus).is_integer() for spec in specs.values())  # Ray wants whole CPUs


@pytest.mark.parametrize("text,message", [
    ("pools: []", "no pools"),
    ("pools: [{name: a}]", "pools[0] is invalid"),
    ("pools: [{name: a, accelerator_type: x, nodes: 0}]", "nodes >= 1"),
    ("pools: [{name: a, accelerator_type: x, nodes: 1}, {name: a, accelerator_type: y, nodes: 1}]", "repeat"),
    ("pools: [", "cannot read"),
])
def test_bad_topology_files_say_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    with pytest.raises(TopologyError, match=re.escape(message)):
        load_topology(path)


@pytest.fixture
def backend():
    return InMemoryComputeBackend.from_topology(load_topology())


def free(backend, name, resource):
    return {node.name: node for node in backend.list_nodes()}[name].free.get(resource, 0.0)


def test_memory_backend_satisfies_the_protocol(backend):
    assert isinstance(backend, ComputeBackend)


def test_gang_is_all_or_none(backend):
    too_big = backend.launch_gang(GangRequest("big", "nvidia-h100", workers=3, devices_per_worker=8))
    assert too_big.state == "pending"
    assert free(backend, "h100-pool-0", "accel:nvidia-h100") == 8.0  # nothing partially reserved
    fits = backend.launch_gang(GangRequest("fits", "nvidia-h100", workers=2, devices_per_worker=8))
    assert fits.state == "ready" and set(fits.node_names) == {"h100-pool-0", "h100-pool-1"}
    assert backend.launch_gang(GangRequest("fits", "nvidia-h100", workers=2, devices_per_worker=8)) == fits
    backend.stop_gang("fits")
    assert free(backend, "h100-pool-0", "accel:nvidia-h100") == 8.0
    assert backend.observe_gang("fits").state == "stopped"
    assert backend.observe_gang("never").state == "unknown"


def test_leaf_group_pin_and_dead_nodes(backend):
    pinned = backend.launch_gang(GangRequest("p", "nvidia-a100", workers=1, devices_per_worker=4,
                                             leaf_group="lg-a100-b"))
    assert pinned.node_names == ("a100-pool-1",)
    backend.set_alive("a100-pool-0", False)
    blocked = backend.launch_gang(GangRequest("q", "nvidia-a100", workers=1, devices_per_worker=8,
                                              leaf_group="lg-a100-a"))
    assert blocked.state == "pending"


def test_running_reason_names_each_node_once_with_its_worker_count():
    from controlplane.compute.memory import workers_on

    assert workers_on(["cpu-0", "cpu-0"]) == "2 worker(s) on cpu-0 (2)"
    assert workers_on(["a", "b", "a"]) == "3 worker(s) on a (2), b"
    assert workers_on(["h100-pool-1"]) == "1 worker(s) on h100-pool-1"
