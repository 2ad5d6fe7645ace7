"""Mixed load (issue 3): training uses capacity deployments reserved but do not use, and gives it back
(checkpoint, then shrink or stop) when they need it. Pure core: controlplane.scheduling.mixed_load."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.scheduling.mixed_load import (
    SERVING_QUEUE,
    ServingDemand,
    loans,
    plan_mixed_load,
    training_usage_after,
)
from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule

QUEUES = (ClusterQueueSpec("team", {"h100": Quota(64)}),)


def nodes(count: int = 2, devices: int = 8, pool: str = "p") -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(f"n{i}", pool, "h100", "g0", devices) for i in range(count))


def running(workload_id: str, node_devices: list[tuple[str, list[int]]], *, priority: int = 0, workers_min=None,
            since_checkpoint: float = 0.0, preemptible: bool = True) -> Running:
    devices = len(node_devices[0][1])
    workers = tuple(WorkerPlacement(node, tuple((i, 1.0) for i in idx)) for node, idx in node_devices)
    workload = Workload(workload_id, "team", ("h100",), devices_per_worker=devices,
                        workers_min=len(workers) if workers_min is None else workers_min, workers_max=len(workers),
                        priority=priority, preemptible=preemptible)
    return Running(workload, "h100", workers, since_checkpoint)


def serving(wanted: int, on: tuple[str, ...] = (), *, per_replica: float = 2, maximum: int = 4, pool=None):
    return ServingDemand("d1", "h100", per_replica, maximum, wanted, on, pool)


def test_running_replicas_hold_their_devices_so_training_is_not_admitted_onto_them():
    snap = Snapshot(nodes(1), QUEUES, pending=(Workload("big", "team", ("h100",), devices_per_worker=8),))
    plan = plan_mixed_load(snap, [serving(1, ("n0",))])
    result = schedule(plan.snapshot)
    assert not result.admitted and "6 devices free" in result.waiting[0].reason
    assert schedule(snap).admitted, "without the deployment the job fits"


def test_training_may_use_reserved_idle_capacity_and_it_is_reported_as_a_loan():
    snap = Snapshot(nodes(2), QUEUES, pending=(Workload("job", "team", ("h100",), devices_per_worker=8,
                                                        workers_min=1),))
    demand = serving(1, ("n0",), maximum=4)  # reserves 8 devices, uses 2
    plan = plan_mixed_load(snap, [demand])
    result = schedule(plan.snapshot)
    assert [a.workload_id for a in result.admitted] == ["job"]
    usage = training_usage_after(plan.snapshot, result)
    assert usage == {"h100": 8.0}
    assert loans(snap, [demand], usage) == {"h100": 0.0}  # 16 - 8 reserved = 8 unreserved: no loan yet
    second = Snapshot(nodes(2), QUEUES, running=(running("job", [("n1", list(range(8)))]),),
                      pending=(Workload("more", "team", ("h100",), devices_per_worker=4),))
    plan = plan_mixed_load(second, [demand])
    result = schedule(plan.snapshot)
    assert [a.workload_id for a in result.admitted] == ["more"]
    assert loans(second, [demand], training_usage_after(plan.snapshot, result)) == {"h100": 4.0}


def test_a_deployment_scaling_out_takes_back_its_reserved_capacity_from_the_lowest_priority_training():
    snap = Snapshot(nodes(1), QUEUES, running=(
        running("high", [("n0", [0, 1])], priority=5),
        running("low", [("n0", [2, 3, 4, 5])], priority=1),
    ))
    # the replica on n0 holds devices 6 and 7; the deployment now wants a second replica of 2
    plan = plan_mixed_load(snap, [serving(2, ("n0",))])
    assert [p.workload_id for p in plan.preempted] == ["low"]
    assert plan.preempted[0].for_workload == "serving:d1" and "gives back capacity" in plan.preempted[0].reason
    assert plan.preempted[0].checkpoint_first
    held = next(r for r in plan.snapshot.running if r.workload.cluster_queue == SERVING_QUEUE)
    assert len(held.workers) == 2
    assert {r.workload.id for r in plan.snapshot.running} == {"high", "serving:d1"}


def test_an_elastic_victim_is_shrunk_before_it_is_stopped_and_not_touched_again_in_the_cycle():
    elastic = running("elastic", [("n0", [0, 1]), ("n0", [2, 3]), ("n0", [4, 5])], workers_min=1)
    snap = Snapshot(nodes(2), QUEUES, running=(elastic, running("other", [("n1", list(range(8)))])),
                    pending=(Workload("urgent", "team", ("h100",), devices_per_worker=2, priority=9),))
    plan = plan_mixed_load(snap, [serving(2, ("n0",), pool="p")])
    assert plan.preempted == []
    assert [(s.workload_id, s.to_workers) for s in plan.shrunk] == [("elastic", 1)]
    narrowed = next(r for r in plan.snapshot.running if r.workload.id == "elastic")
    assert narrowed.settled and narrowed.workload.workers_max == 1
    result = schedule(plan.snapshot)  # the 2 devices the shrink freed beyond the replica's go to "urgent"
    assert [a.workload_id for a in result.admitted] == ["urgent"]
    assert not result.preempted and not result.grown and not result.shrunk
    usage = training_usage_after(plan.snapshot, result)
    assert usage == {"h100": 2.0 + 8.0 + 2.0}  # narrowed elastic, other, urgent: each counted once


def test_every_deployments_running_replicas_hold_their_devices_before_any_wanted_replica_is_placed():
    d1 = ServingDemand("d1", "h100", 8, 2, 2, ("n0",))  # wants a second replica
    d2 = ServingDemand("d2", "h100", 8, 1, 1, ("n1",))  # runs on n1
    plan = plan_mixed_load(Snapshot(nodes(2), QUEUES), [d1, d2])
    held = {r.workload.id: [w.node for w in r.workers] for r in plan.snapshot.running}
    assert held == {"serving:d1": ["n0"], "serving:d2": ["n1"]}
    assert "d1" in plan.waiting  # no room for d1's second replica: n1 is d2's


def test_only_the_victims_on_the_node_the_replica_lands_on_give_anything_back():
    snap = Snapshot(nodes(2), QUEUES, running=(
        running("low-on-n0", [("n0", [0, 1, 2, 3])], priority=0),
        running("keep-on-n0", [("n0", [4, 5, 6, 7])], preemptible=False),
        running("on-n1", [("n1", list(range(8)))], priority=1),
    ))
    plan = plan_mixed_load(snap, [ServingDemand("d", "h100", 8, 1, 1)])
    assert [p.workload_id for p in plan.preempted] == ["on-n1"]  # freeing n0 is impossible: nothing of it is given


def test_a_replica_on_a_node_the_snapshot_does_not_know_still_holds_devices_of_its_type():
    snap = Snapshot(nodes(1), QUEUES, pending=(Workload("job", "team", ("h100",), devices_per_worker=8),))
    plan = plan_mixed_load(snap, [ServingDemand("d", "h100", 8, 1, 1, ("gone-node",))])
    assert not schedule(plan.snapshot).admitted


def test_the_least_work_since_a_checkpoint_goes_first_among_equal_priorities():
    snap = Snapshot(nodes(1), QUEUES, running=(
        running("a", [("n0", [0, 1, 2])], since_checkpoint=300.0),
        running("b", [("n0", [3, 4, 5])], since_checkpoint=10.0),
    ))
    plan = plan_mixed_load(snap, [serving(2, ("n0",))])
    assert [p.workload_id for p in plan.preempted] == ["b"]


def test_nothing_is_given_back_when_the_replica_would_still_not_fit():
    snap = Snapshot(nodes(1), QUEUES, running=(
        running("keep", [("n0", [0, 1, 2, 3, 4, 5])], preemptible=False),
    ))
    plan = plan_mixed_load(snap, [serving(2, ("n0",))])
    assert plan.preempted == [] and plan.shrunk == []
    assert "fit nowhere" in plan.waiting["d1"]


def test_free_devices_are_used_before_anyone_gives_anything_back_and_a_pinned_pool_is_respected():
    two_pools = nodes(1, pool="a") + (NodeSpec("m0", "b", "h100", "g1", 8),)
    snap = Snapshot(two_pools, QUEUES, running=(running("t", [("n0", list(range(8)))]),))
    free_elsewhere = plan_mixed_load(snap, [serving(1)])
    assert free_elsewhere.preempted == []
    assert plan_mixed_load(snap, [serving(1, pool="a")]).preempted[0].workload_id == "t"


def test_no_deployments_leaves_the_snapshot_as_it_was():
    snap = Snapshot(nodes(1), QUEUES, running=(running("t", [("n0", [0])]),))
    assert plan_mixed_load(snap, []).snapshot is snap


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(0, 3), st.booleans()), max_size=6),
       st.integers(0, 4), st.integers(0, 4), st.sampled_from([0.5, 1.0, 2.0]))
def test_after_the_plan_no_device_is_over_committed_and_give_back_only_happens_when_the_replica_then_fits(
        jobs, replicas_running, wanted, per_replica):
    free = {f"n{i}": list(range(8)) for i in range(2)}
    runs = []
    for index, (node_index, width, priority, elastic) in enumerate(jobs):
        node = f"n{node_index % 2}"
        if len(free[node]) < width * 2:
            continue
        workers = []
        for _ in range(2):
            workers.append((node, free[node][:width]))
            free[node] = free[node][width:]
        runs.append(running(f"j{index}", workers, priority=priority, workers_min=1 if elastic else None))
    on = []
    for r in range(replicas_running):  # replicas run where devices are free (Ray would not place them otherwise)
        node = f"n{r % 2}"
        need = max(1, int(per_replica))
        if len(free[node]) >= need:
            on.append(node)
            free[node] = free[node][need:]
    snap = Snapshot(nodes(2), QUEUES, running=tuple(runs))
    demand = ServingDemand("d", "h100", per_replica, 4, wanted, tuple(on))
    other = ServingDemand("e", "h100", 1.0, 2, 2)  # a second deployment wanting 2 single-device replicas
    plan = plan_mixed_load(snap, [demand, other])
    load: dict[tuple[str, int], float] = {}
    for r in plan.snapshot.running:
        for worker in r.workers:
            for index, share in worker.taken:
                load[(worker.node, index)] = load.get((worker.node, index), 0.0) + share
    assert max(load.values(), default=0.0) <= 1.0 + 1e-9
    held = {r.workload.id: r for r in plan.snapshot.running if r.workload.cluster_queue == SERVING_QUEUE}
    placed = len(held["serving:d"].workers) if "serving:d" in held else 0
    placed_other = len(held["serving:e"].workers) if "serving:e" in held else 0
    if plan.preempted or plan.shrunk:
        assert placed > len(on) or placed_other > 0, "something was given back, so a wanted replica was placed"
    for decision in [*plan.preempted, *plan.shrunk]:  # each victim had a worker where a new replica now runs
        victim = next(r for r in snap.running if r.workload.id == decision.workload_id)
        new_nodes = {w.node for r in held.values() for w in r.workers}
        assert {w.node for w in victim.workers} & new_nodes
    victims = [p.workload_id for p in plan.preempted] + [s.workload_id for s in plan.shrunk]
    assert len(victims) == len(set(victims)), "each victim at most once"
    assert placed <= max(len(on), min(wanted, 4))


# ----------------------------------------------------------------------------- deployments count against quotas


def test_replicas_count_against_their_queues_quota_so_training_there_waits_for_quota():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    snap = Snapshot(nodes(2), queues, pending=(Workload("job", "team", ("h100",), devices_per_worker=8),))
    demand = ServingDemand("d1", "h100", 2, 4, 1, ("n0",), cluster_queue="team")
    result = schedule(plan_mixed_load(snap, [demand]).snapshot)
    assert not result.admitted and "quota" in result.waiting[0].reason, result.waiting[0].reason
    queueless = ServingDemand("d1", "h100", 2, 4, 1, ("n0",))  # held outside every quota, as before
    assert [a.workload_id for a in schedule(plan_mixed_load(snap, [queueless]).snapshot).admitted] == ["job"]


def test_a_wanted_replica_beyond_its_queues_quota_waits_and_says_so():
    queues = (ClusterQueueSpec("team", {"h100": Quota(4, borrowing_limit=0)}),)
    snap = Snapshot(nodes(2), queues)
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 4, 4, ("n0",), cluster_queue="team")])
    held = next(r for r in plan.snapshot.running if r.workload.id == "serving:d1")
    assert len(held.workers) == 2 and held.workload.cluster_queue == "team"  # 2 x 2 devices = the nominal 4
    assert "2 wanted replica(s) wait for quota" in plan.waiting["d1"] and "would exceed" in plan.waiting["d1"]


def test_a_replica_may_borrow_from_its_cohort_and_within_nominal_is_not_held_off_by_borrowers():
    queues = (ClusterQueueSpec("serve", {"h100": Quota(4)}, cohort="c"),
              ClusterQueueSpec("train", {"h100": Quota(12)}, cohort="c"))
    borrower = Running(Workload("borrower", "train", ("h100",), devices_per_worker=14),
                       "h100", (WorkerPlacement("n1", tuple((i, 1.0) for i in range(8))),
                                WorkerPlacement("n0", tuple((i, 1.0) for i in range(6)))))
    snap = Snapshot(nodes(2), queues, running=(borrower,))
    # train borrows 2 of serve's idle 4; serve's first wanted replica (2) is within its nominal quota
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="serve")])
    assert "d1" not in plan.waiting
    held = next(r for r in plan.snapshot.running if r.workload.id == "serving:d1")
    assert held.workload.cluster_queue == "serve" and len(held.workers) == 1
    # borrowing beyond nominal follows the cohort's rules: nothing idle is left to lend
    snap = Snapshot(nodes(2), queues)
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 6, 2, 1, (), cluster_queue="serve")])
    assert "d1" not in plan.waiting  # 6 > 4 nominal: borrows 2 of train's idle 12


# ----------------------------------------------------------------------------- quota training holds is given back

def _cohort(serve_nominal: float = 4, train_nominal: float = 4) -> tuple[ClusterQueueSpec, ...]:
    return (ClusterQueueSpec("serve", {"h100": Quota(serve_nominal)}, cohort="c"),
            ClusterQueueSpec("train", {"h100": Quota(train_nominal)}, cohort="c"))


def _job(workload_id: str, queue: str, node: str, workers: int, per_worker: int, *, workers_min=None, priority=0,
         since_checkpoint=0.0, preemptible=True, first_device: int = 0) -> Running:
    placements = tuple(WorkerPlacement(node, tuple((first_device + w * per_worker + i, 1.0) for i in range(per_worker)))
                       for w in range(workers))
    workload = Workload(workload_id, queue, ("h100",), devices_per_worker=per_worker,
                        workers_min=workers if workers_min is None else workers_min, workers_max=workers,
                        priority=priority, preemptible=preemptible)
    return Running(workload, "h100", placements, since_checkpoint)


def _usage(snapshot: Snapshot) -> dict[str, float]:
    usage: dict[str, float] = {}
    for r in snapshot.running:
        usage[r.workload.cluster_queue] = usage.get(r.workload.cluster_queue, 0.0) + r.usage
    return usage


def test_a_replica_within_nominal_reclaims_what_another_queue_borrowed_even_with_devices_free():
    """Capacity beyond the cohort's quotas: the replica fits on free devices, but the cohort would end over its
    quota (serve 2 + train 8 > 8), so the borrower gives back first."""
    borrower = _job("borrower", "train", "n0", 1, 8)
    snap = Snapshot(nodes(3), _cohort(), running=(borrower,))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="serve")])
    assert [p.workload_id for p in plan.preempted] == ["borrower"] and "d1" not in plan.waiting
    assert "quota" in plan.preempted[0].reason and "borrowed" in plan.preempted[0].reason, plan.preempted[0].reason
    assert _usage(plan.snapshot) == {"serve": 2.0}


def test_an_elastic_borrower_gives_back_workers_down_to_what_the_cohort_needs_before_anyone_is_stopped():
    elastic = _job("elastic", "train", "n0", 4, 2, workers_min=1)  # 8 = its 4 nominal + 4 borrowed
    snap = Snapshot(nodes(3), _cohort(), running=(elastic,))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="serve")])
    assert not plan.preempted
    assert [(s.workload_id, s.to_workers, len(s.released)) for s in plan.shrunk] == [("elastic", 3, 1)]
    assert _usage(plan.snapshot) == {"train": 6.0, "serve": 2.0}  # the cohort's 8, not 10


def test_the_lowest_priority_then_least_work_borrower_gives_back_and_a_queue_within_nominal_keeps_its_jobs():
    keep = _job("keep-high", "train", "n0", 1, 4, priority=5)
    cheap = _job("cheap", "train", "n1", 1, 4, since_checkpoint=10.0)
    costly = _job("costly", "train", "n2", 1, 4, since_checkpoint=500.0)
    snap = Snapshot(nodes(3), _cohort(serve_nominal=8), running=(keep, cheap, costly))  # train uses 12 of 4
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 4, 2, 1, (), cluster_queue="serve")])
    # serve's 4 within its nominal 8: the cohort's 12 has 0 room, 4 must come back: "cheap" alone suffices
    assert [p.workload_id for p in plan.preempted] == ["cheap"]
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 4, 2, 2, (), cluster_queue="serve")])
    # two replicas (8): train gives back down to its nominal 4, and keeps the high-priority job
    assert sorted(p.workload_id for p in plan.preempted) == ["cheap", "costly"]


def test_the_teams_own_training_gives_its_quota_back_to_a_replica_even_when_devices_are_free():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    own = _job("own", "team", "n0", 1, 8)
    snap = Snapshot(nodes(2), queues, running=(own,))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="team")])
    assert [p.workload_id for p in plan.preempted] == ["own"] and "its queue's quota" in plan.preempted[0].reason
    assert _usage(plan.snapshot) == {"team": 2.0}  # not 10 of 8


def test_nothing_is_reclaimed_when_it_cannot_make_room_or_when_the_replica_is_not_placed():
    pinned = _job("pinned", "train", "n0", 1, 8, preemptible=False)
    snap = Snapshot(nodes(3), _cohort(), running=(pinned,))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="serve")])
    assert not plan.preempted and not plan.shrunk  # the replica runs; the cohort stays over until "pinned" ends
    # The borrowed quota could be reclaimed (serve's 8 within its nominal 8, the cohort's room 6), but no node has
    # room for the replica even then (one 8-device node, non-preemptible training of another queue on 2): nothing
    # is given back.
    borrower = _job("borrower", "train", "n0", 1, 6)
    blocker = _job("blocker", "other", "n0", 1, 2, preemptible=False, first_device=6)
    queues = (*_cohort(serve_nominal=8), ClusterQueueSpec("other", {"h100": Quota(8)}))
    snap = Snapshot(nodes(1), queues, running=(borrower, blocker))
    plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", 8, 1, 1, (), cluster_queue="serve")])
    assert "fit nowhere" in plan.waiting["d1"], plan.waiting
    assert not plan.preempted and not plan.shrunk
    assert _usage(plan.snapshot) == {"train": 6.0, "other": 2.0}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(1, 4), st.integers(1, 8), st.integers(0, 3),
                          st.booleans()), max_size=6),
       st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.sampled_from([1.0, 2.0, 4.0]),
       st.integers(2, 8), st.integers(2, 8), st.integers(2, 8), st.integers(0, 2))
def test_after_the_plan_no_queue_and_no_cohort_is_over_its_quota_when_all_training_is_preemptible(
        jobs, serve_queue, wanted, per_replica, nominal_a, nominal_b, nominal_c, replicas_running):
    """Three queues in one cohort (nominal quotas summing to less than the 4 x 8 devices), training admitted within
    the quota rules, one deployment in one of the queues with replicas already running (started before the cycle
    saw them, within what the queue may use) and wanting more: whatever is placed, every queue stays within
    nominal + borrowing limit and the cohort within its nominal total; a victim at most once; and something is given
    back only when a replica runs or is placed."""
    queues = (ClusterQueueSpec("a", {"h100": Quota(nominal_a, borrowing_limit=4)}, cohort="k"),
              ClusterQueueSpec("b", {"h100": Quota(nominal_b)}, cohort="k"),
              ClusterQueueSpec("c", {"h100": Quota(nominal_c, borrowing_limit=0)}, cohort="k"))
    ledger_queues = {q.name: q.quotas["h100"] for q in queues}
    total = nominal_a + nominal_b + nominal_c
    free = {f"n{i}": list(range(8)) for i in range(4)}
    usage = {"a": 0.0, "b": 0.0, "c": 0.0}
    runs = []
    for index, (queue, workers, per_worker, priority, elastic) in enumerate(jobs):
        demand = workers * per_worker
        quota = ledger_queues[queue]
        limit = quota.nominal + (quota.borrowing_limit if quota.borrowing_limit is not None else total)
        if usage[queue] + demand > limit or sum(usage.values()) + demand > total:
            continue  # the scheduler would not have admitted it
        node = next((n for n, devs in free.items() if len(devs) >= demand), None)
        if node is None:
            continue
        first = free[node][0]
        free[node] = free[node][demand:]
        runs.append(_job(f"j{index}", queue, node, workers, per_worker, workers_min=1 if elastic else None,
                         priority=priority, first_device=first))
        usage[queue] += demand
    on = []
    serve_quota = ledger_queues[serve_queue]
    serve_limit = serve_quota.nominal + (serve_quota.borrowing_limit if serve_quota.borrowing_limit is not None
                                         else total)
    others = sum(amount for queue, amount in usage.items() if queue != serve_queue)
    for _ in range(replicas_running):
        node = next((n for n, devs in free.items() if len(devs) >= max(1, int(per_replica))), None)
        replicas = (len(on) + 1) * per_replica
        # what the deploy check lets start: within nominal always; beyond it, what the cohort lends when the queue's
        # own (preemptible) training gives its quota back
        if node is None or not (replicas <= serve_quota.nominal or (replicas <= serve_limit
                                                                     and replicas + others <= total)):
            break
        on.append(node)
        free[node] = free[node][max(1, int(per_replica)):]
    snap = Snapshot(nodes(4), queues, running=tuple(runs))
    plan = plan_mixed_load(snap, [ServingDemand("d", "h100", per_replica, 4, max(wanted, len(on)), tuple(on),
                                                cluster_queue=serve_queue)])
    after = _usage(plan.snapshot)
    for name, quota in ledger_queues.items():
        limit = quota.nominal + (quota.borrowing_limit if quota.borrowing_limit is not None else total)
        assert after.get(name, 0.0) <= limit + 1e-9, (name, after)
    assert sum(after.values()) <= total + 1e-9, after
    victims = [p.workload_id for p in plan.preempted] + [s.workload_id for s in plan.shrunk]
    assert len(victims) == len(set(victims))
    placed = next((len(r.workers) for r in plan.snapshot.running if r.workload.id == "serving:d"), 0)
    if victims:
        assert placed > 0


# ----------------------------------------------------------------------------- replica limits (Serve's autoscaler cap)


def test_a_deployments_limit_is_what_its_queues_quota_takes():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    plan = plan_mixed_load(Snapshot(nodes(2), queues),
                           [ServingDemand("d1", "h100", 2, 8, 1, ("n0",), cluster_queue="team")])
    limit, why = plan.limits["d1"]
    assert limit == 4  # 4 replicas x 2 devices = the nominal 8, of the 8 it may scale to
    assert "team" in why and "8" in why, why
    roomy = (ClusterQueueSpec("team", {"h100": Quota(64)}),)
    plan = plan_mixed_load(Snapshot(nodes(2), roomy),
                           [ServingDemand("d1", "h100", 2, 8, 1, ("n0",), cluster_queue="team")])
    assert plan.limits["d1"] == (8, "")  # all of replicas_max fits: nothing limits it


def test_deployments_of_one_queue_share_its_headroom_instead_of_each_counting_all_of_it():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    demands = [ServingDemand("d1", "h100", 2, 8, 1, ("n0",), cluster_queue="team"),
               ServingDemand("d2", "h100", 2, 8, 1, ("n1",), cluster_queue="team")]
    plan = plan_mixed_load(Snapshot(nodes(2), queues), demands)
    assert plan.limits["d1"][0] == 2 and plan.limits["d2"][0] == 2  # 1 + 1 running, the room one replica each
    assert (plan.limits["d1"][0] + plan.limits["d2"][0]) * 2 == 8


def test_the_limit_borrows_from_the_cohort_under_its_rules():
    queues = (ClusterQueueSpec("serve", {"h100": Quota(4, borrowing_limit=4)}, cohort="c"),
              ClusterQueueSpec("train", {"h100": Quota(12)}, cohort="c"))
    plan = plan_mixed_load(Snapshot(nodes(2), queues),
                           [ServingDemand("d1", "h100", 2, 8, 1, (), cluster_queue="serve")])
    assert plan.limits["d1"][0] == 4  # nominal 4 + borrowing limit 4 = 8 devices = 4 replicas
    assert "borrow" in plan.limits["d1"][1], plan.limits["d1"][1]


def test_the_teams_own_preemptible_training_counts_as_headroom_but_non_preemptible_does_not():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    job = running("job", [("n1", [0, 1, 2, 3, 4, 5])])
    demand = ServingDemand("d1", "h100", 2, 8, 1, ("n0",), cluster_queue="team")
    plan = plan_mixed_load(Snapshot(nodes(2), queues, running=(job,)), [demand])
    assert plan.limits["d1"][0] == 4  # the job's 6 devices of quota come back when replicas need them
    fixed = running("job", [("n1", [0, 1, 2, 3, 4, 5])], preemptible=False)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, running=(fixed,)), [demand])
    assert plan.limits["d1"][0] == 1


def test_the_limit_never_goes_below_replicas_min_and_is_not_set_outside_a_queue_or_before_deploying():
    queues = (ClusterQueueSpec("team", {"h100": Quota(2, borrowing_limit=0)}),)
    demands = [ServingDemand("d1", "h100", 2, 8, 3, ("n0", "n0", "n1"), cluster_queue="team", replicas_min=3),
               ServingDemand("d2", "h100", 2, 8, 1, ("n1",)),  # no queue: held outside every quota
               ServingDemand("d3", "h100", 2, 8, 1, (), cluster_queue="team", all_or_none=True)]
    plan = plan_mixed_load(Snapshot(nodes(2), queues), demands)
    assert plan.limits["d1"][0] == 3
    assert "d2" not in plan.limits and "d3" not in plan.limits


LENDERS = (ClusterQueueSpec("serve", {"h100": Quota(8)}, cohort="c"),
           ClusterQueueSpec("train", {"h100": Quota(8)}, cohort="c"))


def test_a_deployment_borrowing_quota_that_a_lenders_waiting_job_needs_is_limited_below_what_it_runs():
    demand = ServingDemand("d1", "h100", 8, 2, 2, ("n0", "n1"), cluster_queue="serve", replicas_min=1)
    idle = plan_mixed_load(Snapshot(nodes(2), LENDERS), [demand])
    assert idle.limits["d1"] == (2, "")  # train lends its idle 8: both replicas run
    waiting = Workload("job", "train", ("h100",), devices_per_worker=8)
    plan = plan_mixed_load(Snapshot(nodes(2), LENDERS, pending=(waiting,)), [demand])
    limit, why = plan.limits["d1"]
    assert limit == 1, "the borrowed replica goes: train's waiting job needs its nominal quota back"
    assert "gives back borrowed quota that waiting work of train needs within its nominal quota" in why, why
    too_big = Workload("job", "train", ("h100",), devices_per_worker=16)  # beyond train's nominal: no claim
    plan = plan_mixed_load(Snapshot(nodes(2), LENDERS, pending=(too_big,)), [demand])
    assert plan.limits["d1"][0] == 2


THREE = (ClusterQueueSpec("a", {"h100": Quota(8)}, cohort="c"), ClusterQueueSpec("b", {"h100": Quota(4)}, cohort="c"),
         ClusterQueueSpec("c", {"h100": Quota(4)}, cohort="c"))


def test_borrowing_preemptible_training_gives_back_before_a_replica_does():
    queues = THREE
    borrower = Running(Workload("borrower", "c", ("h100",), devices_per_worker=8), "h100",
                       (WorkerPlacement("n1", tuple((i, 1.0) for i in range(8))),))
    demand = ServingDemand("d1", "h100", 4, 3, 2, ("n0", "n0"), cluster_queue="b", replicas_min=1)
    small = Workload("job", "a", ("h100",), devices_per_worker=4)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, running=(borrower,), pending=(small,)), [demand])
    assert plan.limits["d1"][0] == 2, "the borrower's 4 borrowed cover the job: the replicas stay"
    big = Workload("job", "a", ("h100",), devices_per_worker=8)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, running=(borrower,), pending=(big,)), [demand])
    assert plan.limits["d1"][0] == 1, "the borrower's 4 and one replica's 4 make the job's 8"


def test_headroom_is_not_lent_out_of_quota_a_lenders_waiting_job_claims_nor_taken_from_the_teams_own_jobs():
    queues = THREE
    demand = ServingDemand("d1", "h100", 4, 3, 1, ("n0",), cluster_queue="b", replicas_min=1)
    lender_waits = Workload("job", "a", ("h100",), devices_per_worker=8)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, pending=(lender_waits,)), [demand])
    assert plan.limits["d1"][0] == 2  # 4 own + the 4 c lends; a's idle 8 is claimed by its waiting job
    own_waits = Workload("job", "b", ("h100",), devices_per_worker=4)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, pending=(own_waits,)), [demand])
    assert plan.limits["d1"][0] == 3  # within nominal serving always may: the team's own waiting job does not count


@settings(max_examples=300, deadline=None)
@given(nominals=st.lists(st.integers(0, 16), min_size=2, max_size=3),
       per_replica=st.sampled_from([1, 2, 4]), running_replicas=st.integers(1, 6), replicas_min=st.integers(1, 3),
       pending=st.lists(st.tuples(st.integers(0, 2), st.sampled_from([1, 2, 4, 8])), max_size=4),
       trainer=st.tuples(st.integers(0, 2), st.integers(0, 8), st.booleans()))
def test_a_replica_limit_settles_once_serve_follows_it(nominals, per_replica, running_replicas, replicas_min,
                                                       pending, trainer):
    """Cycle after cycle, with the cycle's give-backs applied (victims requeued) and Serve running as many replicas
    as the limit says, the limit settles on one value (it never swings between two: the replicas Serve runs do not
    change what waiting work claims), within replicas_min..replicas_max."""
    limits = _limits_over_cycles(nominals, per_replica, running_replicas, replicas_min, pending, trainer)
    assert len(set(limits[-4:])) == 1, limits


def test_a_limit_that_swung_between_two_values_settles():
    """Found by a search over random cohorts: q0's own waiting job claimed quota only while q0 ran few replicas, so
    a borrower's give-back, and with it the limit, changed with the replicas Serve ran (1, 2, 1, 2, ...)."""
    limits = _limits_over_cycles([7, 3, 2], 4, 6, 1, [(1, 2), (0, 2), (2, 8)], (2, 5, True))
    assert limits[-4:] == [2, 2, 2, 2], limits


def _limits_over_cycles(nominals, per_replica, running_replicas, replicas_min, pending, trainer) -> list[int]:
    queues = tuple(ClusterQueueSpec(f"q{i}", {"h100": Quota(n)}, cohort="c") for i, n in enumerate(nominals))
    runs = ()
    queue, devices, preemptible = trainer
    if devices and queue < len(queues):
        runs = (Running(Workload("t", f"q{queue}", ("h100",), devices_per_worker=devices, preemptible=preemptible),
                        "h100", (WorkerPlacement("n3", tuple((i, 1.0) for i in range(devices))),)),)
    waiting = tuple(Workload(f"w{i}", f"q{q % len(queues)}", ("h100",), devices_per_worker=d)
                    for i, (q, d) in enumerate(pending))
    snap = Snapshot(nodes(4), queues, running=runs, pending=waiting)
    maximum = max(replicas_min, running_replicas) + 2
    floor = min(replicas_min, running_replicas)
    replicas, limits = running_replicas, []
    for _ in range(8):
        on = tuple(f"n{i % 3}" for i in range(replicas))
        plan = plan_mixed_load(snap, [ServingDemand("d1", "h100", per_replica, maximum, replicas, on,
                                                    cluster_queue="q0", replicas_min=floor)])
        limit = plan.limits["d1"][0]
        assert floor <= limit <= maximum
        limits.append(limit)
        gone = {p.workload_id for p in plan.preempted} | {s.workload_id for s in plan.shrunk}
        snap = replace(snap, running=tuple(r for r in snap.running if r.workload.id not in gone),
                       pending=snap.pending + tuple(r.workload for r in snap.running if r.workload.id in gone))
        replicas = limit
    return limits


# Found by a review (each failed before its fix): the limit must not depend on deployment ids, claim quota nobody can
# use, overshoot and fall back, preempt for nothing, flip while training shrinks, or ignore deployments waiting.

def cohort_of(**nominals: float) -> tuple[ClusterQueueSpec, ...]:
    return tuple(ClusterQueueSpec(name, {"h100": Quota(n)}, cohort="c") for name, n in nominals.items())


A0_B4 = cohort_of(a=0, b=4)


def test_a_lenders_own_replicas_count_before_a_borrowers_whatever_their_ids():
    job = Workload("job", "b", ("h100",), devices_per_worker=2)
    for borrower_id, lender_id in (("1", "2"), ("2", "1")):
        borrower = ServingDemand(borrower_id, "h100", 1, 4, 2, ("n0", "n0"), cluster_queue="a")
        lender = ServingDemand(lender_id, "h100", 1, 4, 2, ("n1", "n1"), cluster_queue="b", replicas_min=2)
        plan = plan_mixed_load(Snapshot(nodes(2), A0_B4, pending=(job,)), [borrower, lender])
        assert plan.limits[borrower_id][0] == 0 and plan.limits[lender_id][0] == 4, (borrower_id, plan.limits)


def test_waiting_work_that_could_not_fit_its_nominal_quota_claims_nothing():
    job = Workload("job", "b", ("h100",), devices_per_worker=4)  # b's own 2 replicas use half of its nominal 4
    borrower = ServingDemand("2", "h100", 1, 4, 2, ("n0", "n0"), cluster_queue="a")
    lender = ServingDemand("1", "h100", 1, 2, 2, ("n1", "n1"), cluster_queue="b", replicas_min=2)
    plan = plan_mixed_load(Snapshot(nodes(2), A0_B4, pending=(job,)), [borrower, lender])
    assert plan.limits["2"][0] == 2  # scaling it in would not let the job in


def test_claims_the_cohorts_unused_quota_covers_take_nothing_from_anyone():
    queues = cohort_of(a=0, b=10, c=0)
    train = Running(Workload("t", "a", ("h100",), devices_per_worker=2), "h100",
                    (WorkerPlacement("n2", ((0, 1.0), (1, 1.0))),))
    job = Workload("job", "b", ("h100",), devices_per_worker=2)
    snap = Snapshot(nodes(3), queues, running=(train,), pending=(job,))
    first = plan_mixed_load(snap, [ServingDemand("1", "h100", 1, 10, 4, ("n0",) * 4, cluster_queue="c")])
    assert first.limits["1"][0] == 6  # 10 - the borrower's 2 - the job's 2
    admitted = replace(snap, running=(train, Running(job, "h100", (WorkerPlacement("n2", ((6, 1.0), (7, 1.0))),))),
                       pending=())
    after = plan_mixed_load(admitted, [ServingDemand("1", "h100", 1, 10, 6, ("n0",) * 6, cluster_queue="c")])
    assert after.limits["1"][0] == 6, "no overshoot to fall back from"


def test_a_queues_own_borrowing_training_gives_back_and_no_replica_elsewhere_is_limited_for_nothing():
    queues = cohort_of(a=4, b=4, c=0)
    train = Running(Workload("t", "a", ("h100",), devices_per_worker=2), "h100",
                    (WorkerPlacement("n2", ((0, 1.0), (1, 1.0))),))
    job = Workload("job", "b", ("h100",), devices_per_worker=2)
    for a_id, c_id in (("1", "2"), ("2", "1")):
        on_a = ServingDemand(a_id, "h100", 1, 4, 4, ("n0",) * 4, cluster_queue="a", replicas_min=1)
        on_c = ServingDemand(c_id, "h100", 1, 2, 2, ("n1",) * 2, cluster_queue="c", replicas_min=0)
        plan = plan_mixed_load(Snapshot(nodes(3), queues, running=(train,), pending=(job,)), [on_a, on_c])
        assert (plan.limits[a_id][0], plan.limits[c_id][0]) == (4, 2), (a_id, plan.limits)
        assert [p.workload_id for p in schedule(plan.snapshot).preempted] == ["t"]  # t gives the job its quota


def test_training_shrunk_for_a_replica_in_this_cycle_still_counts_as_quota_it_gives_back():
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)

    def trainer(width):
        return Running(Workload("t", "team", ("h100",), devices_per_worker=2, workers_min=1, workers_max=4), "h100",
                       tuple(WorkerPlacement("n1", ((2 * i, 1.0), (2 * i + 1, 1.0))) for i in range(width)))

    limits = set()
    for runs, wanted, width in ((1, 1, 3), (1, 2, 3), (2, 2, 2), (2, 3, 2)):
        demand = ServingDemand("1", "h100", 2, 4, wanted, ("n0",) * runs, cluster_queue="team", replicas_min=1)
        limits.add(plan_mixed_load(Snapshot(nodes(2), queues, running=(trainer(width),)), [demand]).limits["1"][0])
    assert limits == {4}


def test_a_deployment_waiting_to_be_deployed_claims_its_nominal_quota_back():
    borrower = ServingDemand("1", "h100", 1, 4, 4, ("n0",) * 4, cluster_queue="a")
    waiting = ServingDemand("2", "h100", 1, 2, 2, (), replicas_running=0, cluster_queue="b", all_or_none=True)
    plan = plan_mixed_load(Snapshot((NodeSpec("n0", "p", "h100", "g0", 4),), A0_B4), [borrower, waiting])
    limit, why = plan.limits["1"]
    assert limit == 2 and "waiting work of b" in why, plan.limits


# From a second review (each failed before its fix).


def test_with_no_claims_no_training_counts_as_giving_back_to_a_borrowing_deployment():
    ta = Running(Workload("ta", "a", ("h100",), devices_per_worker=4), "h100",
                 (WorkerPlacement("n3", tuple((i, 1.0) for i in range(4))),))
    queues = cohort_of(a=0, b=4, z=0)  # ta and z's replicas both borrow b's 4: the cohort is over, nobody waits
    running_four = ServingDemand("1", "h100", 1, 4, 4, ("n0",) * 4, cluster_queue="z")
    none_running = ServingDemand("1", "h100", 1, 4, 0, (), cluster_queue="z")
    four = plan_mixed_load(Snapshot(nodes(4), queues, running=(ta,)), [running_four]).limits["1"][0]
    none = plan_mixed_load(Snapshot(nodes(4), queues, running=(ta,)), [none_running]).limits["1"][0]
    assert four == none == 0, (four, none)  # before: 4 while it ran 4 (ta "gave back" to nobody), 0 once it ran 0


def test_idle_quota_a_lending_limit_keeps_home_does_not_cover_a_claim():
    queues = (*cohort_of(a=0, b=8), ClusterQueueSpec("L", {"h100": Quota(4, lending_limit=0)}, cohort="c"),
              *cohort_of(z=0))
    t = Running(Workload("t", "a", ("h100",), devices_per_worker=4), "h100",
                (WorkerPlacement("n3", tuple((i, 1.0) for i in range(4))),))
    job = Workload("job", "b", ("h100",), devices_per_worker=4)
    demand = ServingDemand("1", "h100", 1, 4, 4, ("n0",) * 4, cluster_queue="z")
    plan = plan_mixed_load(Snapshot(nodes(4), queues, running=(t,), pending=(job,)), [demand])
    assert plan.limits["1"][0] == 4  # L lends none of its idle 4: t (borrowing training) gives the job its quota
    assert [p.workload_id for p in schedule(plan.snapshot).preempted] == ["t"]


def test_every_deployment_gets_a_replica_of_room_first_and_steady_load_keeps_the_same_limits():
    """Serve's autoscaler can only show that it wants more below its cap. A third review found the limits of two
    deployments under steady load swapping every cycle (1/3, 2/2, 1/3, ...) when the one at its cap went first."""
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    limits = {"d1": 2, "d2": 2}
    seen = []
    for _ in range(4):  # d1 runs and wants 1 replica, d2 runs and wants 2; each cycle Serve is capped at the limits
        calm = ServingDemand("d1", "h100", 2, 4, 1, ("n0",), cluster_queue="team", replicas_min=1,
                             replicas_limit=limits["d1"])
        busy = ServingDemand("d2", "h100", 2, 4, 2, ("n1", "n1"), cluster_queue="team", replicas_min=1,
                             replicas_limit=limits["d2"])
        plan = plan_mixed_load(Snapshot(nodes(2), queues), [calm, busy])
        limits = {key: value[0] for key, value in plan.limits.items()}
        seen.append((limits["d1"], limits["d2"]))
    assert seen == [(2, 2)] * 4, seen
    roomy = (ClusterQueueSpec("team", {"h100": Quota(16, borrowing_limit=0)}),)
    plan = plan_mixed_load(Snapshot(nodes(2), roomy), [
        ServingDemand("d1", "h100", 2, 4, 1, ("n0",), cluster_queue="team", replicas_min=1),
        ServingDemand("d2", "h100", 2, 8, 2, ("n1", "n1"), cluster_queue="team", replicas_min=1)])
    assert (plan.limits["d1"][0], plan.limits["d2"][0]) == (4, 4)  # 1 + 2 held, then the 5 of room in turn


def test_a_claimants_idle_quota_beyond_its_lending_limit_does_not_cover_another_queues_claim():
    """From a third review: a (lends nothing) claims 1 of its idle 4; b claims 3; z's training borrows 3. Before, a's
    whole idle 4 counted as cover, so z's training gave nothing back and b's job had no room."""
    from controlplane.scheduling.mixed_load import _given_back_to_claims
    from controlplane.scheduling.quota import QuotaLedger

    queues = (ClusterQueueSpec("a", {"h100": Quota(4, lending_limit=0)}, cohort="c"), *cohort_of(b=3, z=0))
    ledger = QuotaLedger(queues)
    ledger.add("z", "h100", 3)
    t = Running(Workload("t", "z", ("h100",), devices_per_worker=3), "h100",
                (WorkerPlacement("n3", tuple((i, 1.0) for i in range(3))),))
    given = _given_back_to_claims(ledger, {"t": t}, set(), {("a", "h100"): 1.0, ("b", "h100"): 3.0})
    assert given == {("z", "h100"): 3.0}


def test_a_waiting_job_claims_its_size_on_its_preferred_type():
    """A review found a job of 1 H100 or 4 cores (accepting both) claiming 4 H100 of its lender's quota when the CPU
    pool was listed first: a borrowing deployment was scaled in for quota nobody would use."""
    queues = (ClusterQueueSpec("a", {"h100": Quota(8), "cpu": Quota(8)}, "c"),
              ClusterQueueSpec("s", {"h100": Quota(0)}, "c"))
    borrower = ServingDemand("d1", "h100", 1, 8, 8, ("n0",) * 8, cluster_queue="s")
    limits = []
    for listed in (("cpu", "h100"), ("h100", "cpu")):
        base = 4.0 if listed[0] == "cpu" else 1.0
        job = Workload("job", "a", listed, devices_per_worker=base,
                       sizes=(("h100", 1.0), ("cpu", 4.0)))
        snapshot = Snapshot(nodes(2), queues, pending=(job,), type_preference={"job": ("h100", "cpu")})
        limits.append(plan_mixed_load(snapshot, [borrower]).limits["d1"][0])
    assert limits == [7, 7], limits  # the job claims 1 of a's 8 H100 either way


def test_a_settled_job_gives_nothing_back_for_a_replica():
    """A job STARTING or RECOVERING on the platform is `settled` (preemptible by its class, not at this moment):
    neither its devices nor its quota go to a replica, as a non-preemptible job's do not."""
    snap = Snapshot(nodes(1), QUEUES, running=(replace(running("t", [("n0", list(range(8)))]), settled=True),))
    plan = plan_mixed_load(snap, [serving(1, pool="p")])
    assert plan.preempted == [] and plan.shrunk == []
    queues = (ClusterQueueSpec("team", {"h100": Quota(8, borrowing_limit=0)}),)
    own = replace(_job("own", "team", "n0", 1, 8), settled=True)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, running=(own,)),
                           [ServingDemand("d1", "h100", 2, 2, 1, (), cluster_queue="team")])
    assert plan.preempted == [] and plan.shrunk == []


def test_the_lowest_priority_training_gives_back_whichever_node_it_is_on():
    """QA (2026-11-28): the node with the most free devices was freed whatever ran there, so a priority-900 job on a
    half-free node was stopped while a priority-100 job filling another node ran on."""
    low = running("low", [("n0", list(range(8)))], priority=100)
    high = running("high", [("n1", [0, 1, 2, 3])], priority=900)
    plan = plan_mixed_load(Snapshot(nodes(2), QUEUES, running=(low, high)), [serving(1, per_replica=8)])
    assert [p.workload_id for p in plan.preempted] == ["low"]
    # equal priorities: the one with less work since its last checkpoint, then the node with more free devices
    a = running("a", [("n0", list(range(8)))], since_checkpoint=50.0)
    b = running("b", [("n1", [0, 1, 2, 3])], since_checkpoint=10.0)
    plan = plan_mixed_load(Snapshot(nodes(2), QUEUES, running=(a, b)), [serving(1, per_replica=8)])
    assert [p.workload_id for p in plan.preempted] == ["b"]


def test_a_job_stopped_for_a_pending_deployment_says_it_is_for_deploying_it():
    """QA (2026-11-28): it said the pending deployment had "reserved" the capacity, which it never had."""
    job_running = running("j", [("n0", list(range(8)))])
    plan = plan_mixed_load(Snapshot(nodes(1), QUEUES, running=(job_running,)),
                           [ServingDemand("7", "h100", 8, 1, 1, (), cluster_queue="team", all_or_none=True)])
    assert plan.preempted[0].reason.startswith("preempted: gives back capacity deployment 7 needs to be deployed")
    plan = plan_mixed_load(Snapshot(nodes(1), QUEUES, running=(job_running,)), [serving(1, per_replica=8)])
    assert plan.preempted[0].reason.startswith("preempted: gives back capacity deployment d1 reserved and now needs")


def test_serving_replicas_are_no_non_preemptible_usage_of_their_queue():
    """QA (2026-11-28): held replicas counted as non-preemptible usage, so a non-preemptible job of their queue was
    refused ("shared's non-preemptible workloads would use 16 ...") although only it was non-preemptible."""
    queues = (ClusterQueueSpec("shared", {"h100": Quota(8)}, cohort="c"),
              ClusterQueueSpec("lender", {"h100": Quota(8)}, cohort="c"))
    pinned = Workload("pinned", "shared", ("h100",), devices_per_worker=8, preemptible=False)
    plan = plan_mixed_load(Snapshot(nodes(2), queues, pending=(pinned,)),
                           [ServingDemand("d1", "h100", 8, 1, 1, ("n0",), cluster_queue="shared")])
    result = schedule(plan.snapshot)
    assert [a.workload_id for a in result.admitted] == ["pinned"], result.waiting


def test_the_plan_names_the_devices_it_holds_for_wanted_replicas_that_do_not_run_yet():
    """The platform stores them so that placing another deployment leaves them out; running replicas are not in it."""
    snap = Snapshot(nodes(2), QUEUES)
    pending = replace(serving(3, per_replica=4), all_or_none=True)  # waiting to be deployed: 3 replicas of 4
    held = plan_mixed_load(snap, [pending]).held_for_wanted["d1"]
    assert len(held) == 3 and all(len(w.taken) == 4 for w in held)
    # a live deployment's wanted replicas that do not run yet are held too (a replica being deployed, a scale-out),
    # on the nodes the backend started them on when it says so, else on the node held for them before
    live = serving(3, ("n0",), per_replica=4)  # one runs on n0, two more wanted
    held = plan_mixed_load(snap, [live]).held_for_wanted["d1"]
    assert len(held) == 2 and all(len(w.taken) == 4 for w in held)
    held = plan_mixed_load(snap, [replace(live, starting_nodes=("n1", "n1"))]).held_for_wanted["d1"]
    assert [w.node for w in held] == ["n1", "n1"]
    held = plan_mixed_load(snap, [replace(live, held_nodes=("n1",))]).held_for_wanted["d1"]
    assert [w.node for w in held] == ["n1", "n1"]  # (the rest of n0 would be the best fit otherwise)
    assert plan_mixed_load(snap, [serving(1, ("n0",), per_replica=4)]).held_for_wanted == {}


def test_the_last_replica_of_room_goes_to_the_deployment_that_wants_it_not_the_first_by_id():
    """Found by QA: with room for one more replica in the queue, d1 (idle) took it in id order every cycle while d2,
    which wanted more, stayed at its cap."""
    queues = (ClusterQueueSpec("team", {"h100": Quota(6, borrowing_limit=0)}),)
    demands = [ServingDemand("d1", "h100", 2, 4, 1, ("n0",), cluster_queue="team"),
               ServingDemand("d2", "h100", 2, 4, 2, ("n1",), cluster_queue="team", replicas_limit=1)]
    plan = plan_mixed_load(Snapshot(nodes(2), queues), demands)
    assert plan.limits["d2"][0] == 2 and plan.limits["d1"][0] == 1, plan.limits
    idle = [replace(demands[1], replicas_wanted=1)]  # nobody wants more: the room goes in id order, as before
    assert plan_mixed_load(Snapshot(nodes(2), queues), [demands[0], *idle]).limits["d1"][0] == 2


def test_non_preemptible_training_is_kept_off_reserved_capacity_and_preempts_nobody_for_it():
    """Only preemptible training may use reserved-idle capacity: it gives it back when the deployment scales out; a
    non-preemptible job could not (found by QA). The cap counts every queue's non-preemptible usage of the type."""
    pinned = Workload("pinned", "team", ("h100",), devices_per_worker=4, priority=100, preemptible=False)
    snap = Snapshot(nodes(2), QUEUES, running=(running("low", [("n1", [0, 1, 2, 3])]),), pending=(pinned,))
    demand = serving(1, ("n0",), maximum=6)  # reserves 12 of 16: 4 are not reserved
    plan = plan_mixed_load(snap, [demand])
    assert plan.snapshot.non_preemptible_caps == {"h100": 4.0}
    assert [a.workload_id for a in schedule(plan.snapshot).admitted] == ["pinned"]  # within the 4

    fixed = running("fixed", [("n1", [4, 5])], preemptible=False)  # 2 of the 4 already non-preemptible
    snap = replace(snap, running=(*snap.running, fixed))
    result = schedule(plan_mixed_load(snap, [demand]).snapshot)
    assert not result.admitted and not result.preempted and not result.shrunk
    assert "non-preemptible workloads would use 6 h100, beyond the 4 that serving deployments have not reserved" \
        in result.waiting[0].reason, result.waiting[0].reason
    # a preemptible job of the same size is admitted on the loan
    result = schedule(plan_mixed_load(replace(snap, pending=(replace(pinned, preemptible=True),)), [demand]).snapshot)
    assert [a.workload_id for a in result.admitted] == ["pinned"]


def test_elastic_non_preemptible_training_grows_no_further_than_the_unreserved_capacity():
    elastic = Workload("elastic", "team", ("h100",), devices_per_worker=2, workers_min=1, workers_max=8,
                       preemptible=False)
    snap = Snapshot(nodes(2), QUEUES, pending=(elastic,))
    result = schedule(plan_mixed_load(snap, [serving(1, ("n0",), maximum=5)]).snapshot)  # reserves 10: 6 are not
    [admit] = result.admitted
    assert len(admit.workers) == 3, admit
    assert len(schedule(snap).admitted[0].workers) == 8  # without the deployment it takes all it may


def test_hold_in_place_holds_replicas_stopping_devices_and_held_amounts_and_gives_nothing_back():
    """For re-placing a gang's workers: what runs or is held stays unavailable, and no training is preempted or
    shrunk, whatever the deployments want (found by QA: workers were moved onto a running replica's devices)."""
    from controlplane.scheduling.mixed_load import hold_in_place
    from controlplane.scheduling.scheduler import place_additional_workers

    snap = Snapshot(nodes(3), QUEUES, running=(running("low", [("n2", [0, 1, 2, 3])]),))
    demand = serving(4, ("n0",), per_replica=8, maximum=4)  # one replica runs on n0, it wants 4
    held = hold_in_place(snap, [demand], held=[("n1", 4.0)], devices=[("n1", 0), ("n1", 1)])
    assert {r.workload.id for r in held.running} >= {"low", "serving:d1"}  # nobody gives anything back
    assert place_additional_workers(held, accelerator_type="h100", workers=1, devices=4) is not None  # n2's free 4
    assert place_additional_workers(held, accelerator_type="h100", workers=2, devices=4) is None  # n0, n1 held
    assert place_additional_workers(held, accelerator_type="h100", workers=1, devices=3) is not None
    assert place_additional_workers(snap, accelerator_type="h100", workers=3, devices=4) is not None


def test_a_replica_on_an_unschedulable_node_is_not_reserved_again_on_the_schedulable_ones():
    """A 1-replica deployment whose replica runs on a cordoned node: the schedulable capacity is not reserved for it
    (before, it reserved a second node's worth; found by QA)."""
    from controlplane.scheduling.mixed_load import non_preemptible_caps

    cordoned = (replace(nodes(2)[0], schedulable=False), nodes(2)[1])
    snap = Snapshot(cordoned, QUEUES)
    assert non_preemptible_caps(snap, [serving(1, ("n0",), per_replica=8, maximum=1)]) == {"h100": 8.0}
    assert non_preemptible_caps(snap, [serving(1, ("n0",), per_replica=8, maximum=2)]) == {"h100": 0.0}
    assert non_preemptible_caps(Snapshot(nodes(2), QUEUES), [serving(1, ("n0",), per_replica=8, maximum=1)]) \
        == {"h100": 8.0}
