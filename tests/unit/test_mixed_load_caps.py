"""The non-preemptible cap of mixed load (mixed_load.non_preemptible_caps, scheduler fixed_refusal): cases a review
of the first version found (2026-11-29), each a failure on that version."""

from __future__ import annotations

from dataclasses import replace

from controlplane.scheduling.mixed_load import ServingDemand, non_preemptible_caps, plan_mixed_load
from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule

QUEUES = (ClusterQueueSpec("team", {"h100": Quota(64)}),)


def _running(workload_id, node, indexes, *, preemptible=True, per=None):
    per = per or len(indexes)
    workers = (WorkerPlacement(node, tuple((i, 1.0) for i in indexes)),)
    workload = Workload(workload_id, "team", ("h100",), devices_per_worker=per, preemptible=preemptible)
    return Running(workload, "h100", workers)


def _admit_then_scale_out(nodes, demand, pending, before=()):
    """Cycle 1: the deployment runs what it runs and the non-preemptible job is admitted (or not); cycle 2: the
    deployment wants replicas_max replicas. Returns (admitted ids in cycle 1, the cycle-2 plan)."""
    snap = Snapshot(nodes, QUEUES, running=tuple(before), pending=(pending,))
    result = schedule(plan_mixed_load(snap, [demand]).snapshot)
    admitted = [a.workload_id for a in result.admitted]
    running = list(before)
    for admit in result.admitted:
        running.append(Running(pending, admit.accelerator_type, admit.workers))
    out = Snapshot(nodes, QUEUES, running=tuple(running))
    return admitted, plan_mixed_load(out, [replace(demand, replicas_wanted=demand.replicas_max)])


def test_a_deployment_pinned_to_a_pool_cannot_scale_out_after_a_non_preemptible_job_took_its_pool():
    """Pool p (n0) holds the deployment's whole reservation (4 x 2 = 8 devices, pinned to p); pool q (n1) is busy
    with preemptible training. The cap is per type (16 - 8 = 8), so the non-preemptible 1 x 6 job is admitted, and
    the only place it fits is the pinned pool: the deployment can then never scale out to its replicas_max (the
    exact failure the cap was meant to prevent). It should wait (or go where the deployment cannot be)."""
    nodes = (NodeSpec("n0", "p", "h100", "g0", 8), NodeSpec("n1", "q", "h100", "g1", 8))
    demand = ServingDemand("d1", "h100", 2, 4, 1, ("n0",), pool="p")
    pinned = Workload("pinned", "team", ("h100",), devices_per_worker=6, preemptible=False)
    busy = _running("busy", "n1", list(range(8)))
    admitted, plan = _admit_then_scale_out(nodes, demand, pinned, before=(busy,))
    assert admitted == [] and not plan.waiting, (admitted, plan.waiting)  # it waits; the deployment scales out
    # the cap is conservative: with pool q idle, it still waits (nothing pinned leaves room it could not take)
    admitted, plan = _admit_then_scale_out(nodes, demand, pinned)
    assert admitted == [] and not plan.waiting
    # without the pin, the deployment's reservation may be met on either pool: 16 - 8 leaves room for 6
    unpinned = ServingDemand("d1", "h100", 2, 4, 1, ("n0",))
    admitted, plan = _admit_then_scale_out(nodes, unpinned, pinned)
    assert admitted == ["pinned"] and not plan.waiting, plan.waiting


def test_fractional_replicas_are_undercounted_so_a_non_preemptible_job_blocks_scale_out():
    """3 replicas of 0.6 device reserve 1.8 devices in the cap's arithmetic, but no two of them share a device:
    they need 3. On one 8-device node with a replica running, the cap is 8 - 1.8 = 6.2, so a non-preemptible 1 x 6
    job is admitted, leaving 1 whole device and two 0.4 slivers: the third replica then fits nowhere."""
    nodes = (NodeSpec("n0", "p", "h100", "g0", 8),)
    demand = ServingDemand("d1", "h100", 0.6, 3, 1, ("n0",))
    pinned = Workload("pinned", "team", ("h100",), devices_per_worker=6, preemptible=False)
    admitted, plan = _admit_then_scale_out(nodes, demand, pinned)
    assert admitted == [] and not plan.waiting, (admitted, plan.waiting)
    five = Workload("pinned", "team", ("h100",), devices_per_worker=5, preemptible=False)  # 8 - 3 devices
    admitted, plan = _admit_then_scale_out(nodes, demand, five)
    assert admitted == ["pinned"] and not plan.waiting, plan.waiting


def test_replica_devices_counts_whole_devices_and_shares_per_device():
    from controlplane.scheduling.mixed_load import replica_devices

    assert [replica_devices(n, 0.6) for n in (0, 1, 2, 3)] == [0.0, 1.0, 2.0, 3.0]
    assert [replica_devices(n, 0.25) for n in (1, 4, 5, 8)] == [1.0, 1.0, 2.0, 2.0]
    assert replica_devices(3, 0.1) == 1.0  # ten shares of 0.1 fit on one device (1 // 0.1 is 9.0)
    assert (replica_devices(2, 2.5), replica_devices(2, 8)) == (6, 16)


def test_a_replica_on_a_node_the_snapshot_does_not_know_is_still_reserved():
    """eeda2bc: `_capacity_and_reserved` drops a running replica from the reservation when its node is "not in
    schedulable", meant for cordoned / unhealthy nodes. A node name the snapshot does not know at all (Serve reported
    a name that is not a Node row) is dropped too, although `plan_mixed_load` step 2 holds that replica on free
    schedulable capacity of the type. 2 x 8 H100, a 1-2 replica deployment (8 each), one replica running on "ghost":
    the cap becomes 16 - 8 = 8, a non-preemptible 1 x 8 job takes the other node, and the deployment can never scale
    out to its replicas_max (the failure the cap exists to prevent). Before eeda2bc the cap was 0."""
    nodes = (NodeSpec("n0", "p", "h100", "g", 8), NodeSpec("n1", "p", "h100", "g", 8))
    demand = ServingDemand("d1", "h100", 8, 2, 1, ("ghost",))
    assert non_preemptible_caps(Snapshot(nodes, QUEUES), [demand]) == {"h100": 0.0}

    pinned = Workload("np", "team", ("h100",), devices_per_worker=8, preemptible=False)
    result = schedule(plan_mixed_load(Snapshot(nodes, QUEUES, pending=(pinned,)), [demand]).snapshot)
    assert [a.workload_id for a in result.admitted] == []


def test_a_pinned_deployment_on_a_pool_with_no_schedulable_node_does_not_zero_the_whole_types_cap():
    """a7ec1d8: the pinned cap is min(..., schedulable capacity of the pinned pool - pinned reservation). Pool p's only
    node is cordoned (or the pool name is not a pool at all), so its schedulable capacity is 0 and the cap for every
    H100 becomes 0: no non-preemptible H100 job is admitted anywhere, although pool q (8 devices, nothing reserved)
    is idle and no training can be placed in p either (nothing there to protect)."""
    nodes = (NodeSpec("n0", "p", "h100", "g0", 8, schedulable=False), NodeSpec("n1", "q", "h100", "g1", 8),
             NodeSpec("n2", "q", "h100", "g1", 8))
    # one replica runs on the cordoned node (a replica on an unschedulable node is not reserved again)
    demand = ServingDemand("d1", "h100", 8, 1, 1, ("n0",), pool="p")
    caps = non_preemptible_caps(Snapshot(nodes, QUEUES), [demand])
    assert caps["h100"] == 16.0, caps  # 16 schedulable, nothing left to reserve on them
    # not running at all (pool under maintenance): q's 16 less the per-type reservation 8
    idle = replace(demand, replica_nodes=(), replicas_wanted=0)
    caps = non_preemptible_caps(Snapshot(nodes, QUEUES), [idle])
    assert caps["h100"] == 8.0, caps
