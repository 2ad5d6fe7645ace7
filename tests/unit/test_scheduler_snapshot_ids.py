"""The scheduling core refuses a snapshot in which two workloads share an id (pending twice, running twice, or one
id both pending and running): it keys its state and decisions by id, and with a duplicate it acted on one workload
for the other. The platform's ids are primary keys, so only a caller of the public core can pass one."""

from __future__ import annotations

import pytest

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule

H100 = "nvidia-h100"
NODES = (NodeSpec("h0", "h100-pool", H100, "lg0", 8), NodeSpec("h1", "h100-pool", H100, "lg0", 8))
QUEUES = (ClusterQueueSpec("a", {H100: Quota(16)}),)


def job(name, devices=4, priority=0):
    return Workload(name, "a", (H100,), devices, priority=priority)


def on(node, *indexes):
    return (WorkerPlacement(node, tuple((i, 1.0) for i in indexes)),)


def test_two_pending_workloads_with_one_id_are_refused_naming_it():
    snapshot = Snapshot(NODES, QUEUES, pending=(job("7"), job("8"), job("7", devices=2)))
    with pytest.raises(ValueError, match=r"duplicate workload id '7' in the snapshot \(pending 2 times\)"):
        schedule(snapshot)


def test_two_running_workloads_with_one_id_are_refused_naming_it():
    snapshot = Snapshot(NODES, QUEUES, running=(Running(job("5"), H100, on("h0", 0, 1, 2, 3)),
                                                Running(job("5"), H100, on("h1", 0, 1, 2, 3))))
    with pytest.raises(ValueError, match=r"duplicate workload id '5' in the snapshot \(running 2 times\)"):
        schedule(snapshot)


def test_one_id_both_running_and_pending_is_refused_naming_it():
    # (before: the pending one was admitted and replaced the running one in the cycle's state, so the devices of
    # the running one were counted twice or given away)
    snapshot = Snapshot(NODES, QUEUES, running=(Running(job("3"), H100, on("h0", 0, 1, 2, 3)),),
                        pending=(job("3", priority=10), job("4")))
    with pytest.raises(ValueError, match=r"duplicate workload id '3' in the snapshot \(both running and pending\)"):
        schedule(snapshot)


def test_distinct_ids_are_scheduled_as_before():
    snapshot = Snapshot(NODES, QUEUES, running=(Running(job("1"), H100, on("h0", 0, 1, 2, 3)),),
                        pending=(job("2"), job("3")))
    result = schedule(snapshot)
    assert sorted(a.workload_id for a in result.admitted) == ["2", "3"]
