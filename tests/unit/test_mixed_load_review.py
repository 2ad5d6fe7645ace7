"""Review of the mixed-load quota give-back (commits ee7681f, 780eb27): scenarios the hypothesis properties of
tests/unit/test_mixed_load.py do not reach."""

from __future__ import annotations

from controlplane.scheduling.mixed_load import ServingDemand, plan_mixed_load
from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement


def nodes(count: int, devices: int = 8) -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(f"n{i}", "p", "h100", "g0", devices) for i in range(count))


def job(workload_id: str, queue: str, node: str, devices: list[int], *, workers: int = 1, priority: int = 0,
        preemptible: bool = True, workers_min: int | None = None) -> Running:
    per_worker = len(devices) // workers
    placements = tuple(WorkerPlacement(node, tuple((i, 1.0) for i in devices[w * per_worker:(w + 1) * per_worker]))
                       for w in range(workers))
    workload = Workload(workload_id, queue, ("h100",), devices_per_worker=per_worker,
                        workers_min=workers if workers_min is None else workers_min, workers_max=workers,
                        priority=priority, preemptible=preemptible)
    return Running(workload, "h100", placements)


def usage(snapshot: Snapshot) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in snapshot.running:
        out[r.workload.cluster_queue] = out.get(r.workload.cluster_queue, 0.0) + r.usage
    return out


def victims(plan) -> list[str]:
    return sorted([p.workload_id for p in plan.preempted] + [s.workload_id for s in plan.shrunk])


def test_a_victim_that_gave_back_a_node_is_not_counted_again_so_no_second_job_is_preempted_for_quota():
    """The first replica fits the quota but no node: job "a" gives back n0 (8 devices, for devices, not quota).
    The second replica fits on the 4 devices "a" left on n0, and the queue's quota (16) holds both replicas and
    job "b" (4 + 8 = 12): nothing more needs to be given back. The ledger still counted "a" (16 of 16), so the
    quota give-back preempted "b" as well."""
    queues = (ClusterQueueSpec("serve", {"h100": Quota(16, borrowing_limit=0)}),
              ClusterQueueSpec("other", {"h100": Quota(8)}))
    snap = Snapshot(nodes(2), queues, running=(
        job("a", "serve", "n0", list(range(8))),
        job("b", "serve", "n1", [0, 1, 2, 3], priority=1),
        job("pinned", "other", "n1", [4, 5, 6, 7], preemptible=False),
    ))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 4, 2, 2, (), cluster_queue="serve")])
    held = next(r for r in plan.snapshot.running if r.workload.id == "serving:d1")
    assert len(held.workers) == 2 and "d1" not in plan.waiting
    assert victims(plan) == ["a"], plan.preempted
    assert usage(plan.snapshot)["serve"] == 12.0


def test_the_queues_own_training_gives_back_even_when_a_cohort_borrower_cannot():
    """serve (nominal 4, no borrowing) runs its own preemptible job "own" (2); train (nominal 4) runs a
    non-preemptible job (6) that borrows 2 of serve's idle quota. A replica of 4 is allowed (within serve's nominal
    once "own" gives back) and placed on free devices. The cohort may stay over until the borrower ends (by
    design), but serve itself must not end at 6 of its 4 + 0: "own" gives its quota back."""
    queues = (ClusterQueueSpec("serve", {"h100": Quota(4, borrowing_limit=0)}, cohort="c"),
              ClusterQueueSpec("train", {"h100": Quota(4)}, cohort="c"))
    snap = Snapshot(nodes(3), queues, running=(
        job("own", "serve", "n0", [0, 1]),
        job("pinned", "train", "n1", [0, 1, 2, 3, 4, 5], preemptible=False),
    ))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 4, 1, 1, (), cluster_queue="serve")])
    assert "d1" not in plan.waiting
    assert usage(plan.snapshot)["serve"] <= 4.0, usage(plan.snapshot)


def test_an_elastic_borrower_shrunk_for_one_replica_gives_back_more_for_the_next_so_the_cohort_stays_within():
    """serve and train (nominal 4 each) in one cohort; train's elastic job (4 workers of 2, min 1) borrows serve's
    idle 4. Two replicas of 2 are wanted, each within serve's nominal quota: the first has the job give back one
    worker; the second found the job already shrunk this cycle (each victim at most once), so nothing was given back
    and the replica was placed anyway: the cohort ended at 10 of 8 while all its training is preemptible."""
    queues = (ClusterQueueSpec("serve", {"h100": Quota(4)}, cohort="c"),
              ClusterQueueSpec("train", {"h100": Quota(4)}, cohort="c"))
    elastic = job("elastic", "train", "n0", list(range(8)), workers=4, workers_min=1)
    snap = Snapshot(nodes(3), queues, running=(elastic,))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 2, (), cluster_queue="serve")])
    held = next(r for r in plan.snapshot.running if r.workload.id == "serving:d1")
    assert len(held.workers) == 2
    after = usage(plan.snapshot)
    assert sum(after.values()) <= 8.0, after
    assert victims(plan) == ["elastic"]  # still each victim once: one decision, down to 2 workers
    assert [(s.to_workers, len(s.released)) for s in plan.shrunk] == [(2, 2)]
