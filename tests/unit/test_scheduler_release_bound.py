"""release_of (the preemption bounds' count of what a victim frees) counts only devices that exist: a running
worker's device index at or beyond its node's current device count (the node shrank since) frees nothing, as the
cycle's _State ignores such indexes when it marks devices taken. Before, they were counted (a looser bound only)."""

from __future__ import annotations

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import _State

H100 = "nvidia-h100"


def test_release_of_counts_no_device_beyond_a_shrunk_node():
    # h0 had 8 devices and now has 4: the victim's workers still name devices 2..7 of it
    nodes = (NodeSpec("h0", "h100-pool", H100, "lg0", 4),)
    victim = Running(Workload("v", "a", (H100,), 2.0, workers_min=3, workers_max=3), H100,
                     (WorkerPlacement("h0", ((2, 1.0), (3, 1.0))), WorkerPlacement("h0", ((4, 1.0), (5, 1.0))),
                      WorkerPlacement("h0", ((6, 1.0), (7, 0.5)))))
    half = Running(Workload("f", "a", (H100,), 0.5), H100, (WorkerPlacement("h0", ((5, 0.5),)),))
    state = _State(Snapshot(nodes, (ClusterQueueSpec("a", {H100: Quota(16)}),), running=(victim, half)))
    victims = state.victims(H100)
    _, _, per_node = victims.release_of(victim, state.nodes)
    assert [(node.name, whole, fractions) for node, whole, fractions in per_node] == [("h0", 2, [])]
    _, _, per_node = victims.release_of(half, state.nodes)
    assert [(node.name, whole, fractions) for node, whole, fractions in per_node] in ([], [("h0", 0, [])])
