"""Cases a review found against the preemption walk (_room_after_all: it must decide as running the trial would)
and the trial's release, each failing on the code before its fix."""
from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule
from tests.unit.test_scheduler_speedups import reference_schedule

H = "nvidia-h100"


def whole(node, first, count):
    return WorkerPlacement(node, tuple((d, 1.0) for d in range(first, first + count)))


def test_elastic_victim_with_a_worker_on_a_node_unknown_to_the_state():
    """The trial only shrinks v (releases its worker on a0) and fits; it never touches v's first worker, which is
    on a node the snapshot no longer lists (_State tolerates that). The walk's release_of looks up every worker's
    node: KeyError. Before 3657204 (and in the reference) v is shrunk for p."""
    nodes = (NodeSpec("a0", "p", H, "lg", 8), NodeSpec("a1", "p", H, "lg", 8))
    queues = (ClusterQueueSpec("q", {H: Quota(64)}),)
    v = Running(Workload("v", "q", (H,), 8.0, workers_min=1, workers_max=2, priority=0), H,
                (whole("gone", 0, 8), whole("a0", 0, 8)))
    h = Running(Workload("h", "q", (H,), 8.0, priority=9), H, (whole("a1", 0, 8),))
    p = Workload("p", "q", (H,), 8.0, priority=5)
    snap = Snapshot(nodes, queues, (v, h), (p,))
    expected = reference_schedule(snap)
    assert [s.workload_id for s in expected.shrunk] == ["v"]
    assert schedule(snap) == expected  # KeyError: 'gone' in _Victims.release_of


def test_a_victim_on_a_node_unknown_to_the_state_is_stopped_without_a_crash():
    """v's only worker is on a node the snapshot no longer lists: stopping it frees nothing (as _State counts it). The
    trial stops v first (least work since its checkpoint), then u, whose node p takes; v is then put back, as p's
    quota does not need it. The trial's release looked the node up: KeyError, and the whole cycle failed."""
    nodes = (NodeSpec("a0", "p", H, "lg", 8),)
    queues = (ClusterQueueSpec("q", {H: Quota(16)}),)
    v = Running(Workload("v", "q", (H,), 8.0, priority=0), H, (whole("gone", 0, 8),))
    u = Running(Workload("u", "q", (H,), 8.0, priority=0), H, (whole("a0", 0, 8),), 5.0)
    snap = Snapshot(nodes, queues, (v, u), (Workload("p", "q", (H,), 8.0, priority=5),))
    expected = reference_schedule(snap)
    assert [p.workload_id for p in expected.preempted] == ["u"]
    assert schedule(snap) == expected


def test_memo_stale_after_another_types_trial_frees_this_types_nodes():
    """x runs as type B but its workers sit on a0, a node of type A (a malformed snapshot: the platform builds
    Running from the admitted type, so this needs a node moved between types). w1 (A, 2 x 8) walks and fails
    (bound 1); wb (B) then preempts x and v, which frees a0 (type A) without any A victim being taken; w3 (shaped
    as w1) would now fit by preempting y1, y2, but the remembered walk (same taken count, same usages) skips it.
    (B's quota of 8 makes wb need x's quota too: else x, whose devices give wb nothing, would be put back.)"""
    A, B = "type-a", "type-b"
    nodes = (NodeSpec("a0", "pa", A, "lga", 8), NodeSpec("a1", "pa", A, "lga", 8), NodeSpec("a2", "pa", A, "lga", 8),
             NodeSpec("a3", "pa", A, "lga", 8), NodeSpec("b0", "pb", B, "lgb", 8))
    queues = (ClusterQueueSpec("q", {A: Quota(1000), B: Quota(8)}),)

    def run(name, t, node, first, count, priority, work=0.0):
        return Running(Workload(name, "q", (t,), float(count), priority=priority), t, (whole(node, first, count),),
                       work)

    running = (
        run("x", B, "a0", 0, 8, 0, 0.0),  # type B, on an A node
        run("v", B, "b0", 0, 8, 0, 10.0),
        run("y1", A, "a1", 0, 4, 0), run("z1", A, "a1", 4, 4, 9),
        run("y2", A, "a2", 0, 8, 0),
        run("y3", A, "a3", 0, 4, 0), run("z3", A, "a3", 4, 4, 9),
    )
    pending = (Workload("w1", "q", (A,), 8.0, workers_min=2, workers_max=2, priority=5, arrival=0),
               Workload("wb", "q", (B,), 8.0, priority=5, arrival=1),
               Workload("w3", "q", (A,), 8.0, workers_min=2, workers_max=2, priority=5, arrival=2))
    snap = Snapshot(nodes, queues, running, pending)
    expected = reference_schedule(snap)
    assert any(p.for_workload == "w3" for p in expected.preempted)
    assert schedule(snap) == expected


def test_a_victim_placed_on_devices_its_node_no_longer_has_is_released_without_a_crash():
    """_State ignores a placement's device indexes beyond its node's current size (a node that shrank since); a
    trial releasing that victim wrote to them (IndexError)."""
    nodes = (NodeSpec("a0", "p", H, "lg", 4),)  # 8 devices when v was placed, 4 now
    v = Running(Workload("v", "q", (H,), 8.0, priority=0), H, (whole("a0", 0, 8),))
    queues = (ClusterQueueSpec("q", {H: Quota(64)}),)
    snap = Snapshot(nodes, queues, (v,), (Workload("p", "q", (H,), 4.0, priority=5),))
    result = schedule(snap)
    assert [p.workload_id for p in result.preempted] == ["v"]
    assert result.waiting[0].held.workers == (whole("a0", 0, 4),)


def test_a_training_job_mixed_load_shrank_does_not_count_as_its_queues_non_preemptible_usage():
    """Mixed load shrinks J (queue A) for a deployment's replicas and leaves it alone for the rest of the cycle; it
    used to do so by marking J non-preemptible, which made A's non-preemptible usage 8 and refused N (2, non-
    preemptible, within A's nominal 8) for usage A does not have. Found by review."""
    from controlplane.scheduling.mixed_load import ServingDemand, plan_mixed_load

    t = "h"
    nodes = (NodeSpec("p1-0", "p1", t, "lg1", 8), NodeSpec("p1-1", "p1", t, "lg1", 8),
             NodeSpec("p2-0", "p2", t, "lg2", 8))
    queues = tuple(ClusterQueueSpec(name, {t: Quota(nominal)}, cohort="co") for name, nominal in
                   (("A", 8), ("B", 8), ("C", 16)))
    j = Workload("J", "A", (t,), 1.0, workers_min=1, workers_max=16, priority=0)
    workers = tuple(WorkerPlacement(node, ((i, 1.0),)) for node in ("p1-0", "p1-1") for i in range(8))
    n = Workload("N", "A", (t,), 1.0, workers_min=2, workers_max=2, priority=10, arrival=1.0, preemptible=False)
    snap = Snapshot(nodes, queues, (Running(j, t, workers, 1.0),), (n,))
    serving = [ServingDemand(id="s1", accelerator_type=t, devices_per_replica=1.0, replicas_max=2, replicas_wanted=2,
                             pool="p1", cluster_queue="B")]
    plan = plan_mixed_load(snap, serving)
    assert [s.workload_id for s in plan.shrunk] == ["J"]
    result = schedule(plan.snapshot)
    assert [a.workload_id for a in result.admitted] == ["N"], result.waiting
    assert not any(p.workload_id == "J" for p in result.preempted)  # still left alone in this cycle
    assert result == reference_schedule(plan.snapshot)


def test_a_workload_of_no_devices_waits_and_the_cycle_goes_on():
    """One workload asking for 0 (or NaN) per worker, as a job of 0 CPU cores once did, raised ZeroDivisionError and
    so stopped the whole cycle: nobody else was admitted. It now waits, saying why; the others are scheduled."""
    from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
    from controlplane.scheduling.placement import WorkerPlacement
    from controlplane.scheduling.scheduler import schedule

    nodes = (NodeSpec("c0", "cpu-pool", "cpu", "g0", 8),)
    queues = (ClusterQueueSpec("q", {"cpu": Quota(8)}),)
    zero = Workload("zero", "q", ("cpu",), devices_per_worker=0.0)
    nan = Workload("nan", "q", ("cpu",), devices_per_worker=float("nan"), arrival=1)
    fine = Workload("fine", "q", ("cpu",), devices_per_worker=2.0, arrival=2)
    grown = Workload("grown", "q", ("cpu",), devices_per_worker=0.0, workers_max=3)  # stored before the rule
    running = (Running(grown, "cpu", (WorkerPlacement("c0", ((0, 0.0),)),)),)
    result = schedule(Snapshot(nodes, queues, running=running, pending=(zero, nan, fine)))
    assert [a.workload_id for a in result.admitted] == ["fine"]
    waits = {w.workload_id: w for w in result.waiting}
    assert waits["zero"].position == 1 and waits["nan"].position == 2
    assert "asks for 0 devices (CPU cores on cpu) per worker: a worker must ask for at least 1e-06" \
        in waits["zero"].reason
    assert not result.grown
    # a subnormal size overflowed the shares divided by it (a review); a bad size on one type is the one named
    tiny = Workload("tiny", "q", ("cpu",), devices_per_worker=1e-310)
    mixed = Workload("mixed", "q", ("h100", "cpu"), devices_per_worker=8.0, sizes=(("cpu", 0.0),), arrival=3)
    result = schedule(Snapshot(nodes, queues, pending=(tiny, mixed, fine)))
    assert [a.workload_id for a in result.admitted] == ["fine"]
    waits = {w.workload_id: w.reason for w in result.waiting}
    assert waits["tiny"].startswith("asks for 1e-310 devices") and waits["mixed"].startswith("asks for 0 on cpu ")


def test_a_gang_no_node_could_ever_hold_takes_no_reservation_and_says_so():
    """QA found a 1 x 9-device job on 8-device nodes holding a reservation of 9 devices in every cycle, for good: a
    1 x 8 job of another cluster queue then waited on 7 free devices. Nor does 3 x 6 on two 8-device nodes fit
    ever. Neither reserves now, and the reason says the nodes can never hold it; the next gang that can reserves."""
    from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
    from controlplane.scheduling.placement import WorkerPlacement
    from controlplane.scheduling.scheduler import schedule
    from tests.unit.test_scheduler_speedups import reference_schedule

    nodes = (NodeSpec("h0", "p", "h100", "g0", 8), NodeSpec("h1", "p", "h100", "g0", 8))
    queues = (ClusterQueueSpec("a", {"h100": Quota(32)}), ClusterQueueSpec("b", {"h100": Quota(32)}))
    small = Workload("small", "b", ("h100",), devices_per_worker=1.0)
    running = (Running(small, "h100", (WorkerPlacement("h0", ((0, 1.0),)),)),)
    fat = Workload("fat", "a", ("h100",), devices_per_worker=9.0, priority=5)
    three = Workload("three", "a", ("h100",), devices_per_worker=6.0, workers_min=3, priority=5, arrival=1)
    whole = Workload("whole", "b", ("h100",), devices_per_worker=8.0, arrival=2)
    snapshot = Snapshot(nodes, queues, running=running, pending=(fat, three, whole))
    result = schedule(snapshot)
    assert result == reference_schedule(snapshot)
    assert [a.workload_id for a in result.admitted] == ["whole"]
    waits = {w.workload_id: w for w in result.waiting}
    assert not waits["fat"].reserved and not waits["three"].reserved
    assert waits["fat"].reason == ("h100 nodes can never hold it: its 2 schedulable nodes (the largest with 8 devices) "
                                   "would hold at most 0 workers of 9 even with nothing running, it needs 1")
    assert "would hold at most 2 workers of 6 even with nothing running, it needs 3" in waits["three"].reason
    # a gang that fits the nodes once they are free still reserves, as before
    big = Workload("big", "a", ("h100",), devices_per_worker=8.0, workers_min=2, priority=5, arrival=3)
    result = schedule(Snapshot(nodes, queues, running=running, pending=(fat, big)))
    assert {w.workload_id: w.reserved for w in result.waiting} == {"fat": False, "big": True}


def test_the_cluster_queue_preemption_policies():
    """Kueue's policies, per preemptor's queue: within its own queue LowerPriority (default) or Never; in other queues
    of its cohort that borrow, Any priority while it reclaims within its nominal (default), only LowerPriority, or
    Never."""
    from dataclasses import replace

    from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
    from controlplane.scheduling.placement import WorkerPlacement
    from controlplane.scheduling.scheduler import schedule
    from tests.unit.test_scheduler_speedups import reference_schedule

    nodes = (NodeSpec("h0", "p", "h100", "g0", 8),)
    a = ClusterQueueSpec("a", {"h100": Quota(8)}, "c")
    b = ClusterQueueSpec("b", {"h100": Quota(0)}, "c")  # whatever b runs, it borrows from a

    def decide(spec, own_priority, borrower_priority, preemptor_priority=1):
        running = []
        if own_priority is not None:  # a job of a on devices 0-3, b's borrower on 4-7
            running.append(Running(Workload("own", "a", ("h100",), 4.0, priority=own_priority), "h100",
                                   (WorkerPlacement("h0", tuple((i, 1.0) for i in range(4))),)))
        first = 4 if own_priority is not None else 0  # else b's borrower holds the whole node
        running.append(Running(Workload("borrower", "b", ("h100",), 8.0 - first, priority=borrower_priority), "h100",
                               (WorkerPlacement("h0", tuple((i, 1.0) for i in range(first, 8))),)))
        new = Workload("new", "a", ("h100",), 4.0, priority=preemptor_priority)
        snapshot = Snapshot(nodes, (spec, b), running=tuple(running), pending=(new,))
        result = schedule(snapshot)
        assert result == reference_schedule(snapshot)
        return [p.workload_id for p in result.preempted]

    # within its own queue: a lower-priority job of a (ranked before b's higher-priority borrower)
    assert decide(a, 0, 5) == ["own"]
    assert decide(replace(a, preemption_within_queue="Never"), 0, 5) == ["borrower"]  # it reclaims instead
    assert decide(replace(a, preemption_within_queue="Never", reclaim_within_cohort="Never"), 0, 5) == []
    # reclaim: a runs nothing, b borrows all of a's quota at priority 5 (higher than the preemptor's 1)
    assert decide(a, None, 5) == ["borrower"]
    assert decide(replace(a, reclaim_within_cohort="LowerPriority"), None, 5) == []
    assert decide(replace(a, reclaim_within_cohort="LowerPriority"), None, 0) == ["borrower"]
    assert decide(replace(a, reclaim_within_cohort="Never"), None, 0) == []


def test_a_workload_its_queue_could_never_take_says_so():
    """QA found a job bigger than its queue could ever get (3 x 8 H100 on a nominal 16 without a lender) waiting for
    good with a reason that read like a wait ("its cohort lends only 0 now"); the reason now says it never fits."""
    from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Snapshot, Workload
    from controlplane.scheduling.quota import QuotaLedger
    from controlplane.scheduling.scheduler import schedule
    from tests.unit.test_scheduler_speedups import reference_schedule

    nodes = tuple(NodeSpec(f"h{i}", "p", "h100", "g0", 8) for i in range(4))
    alone = ClusterQueueSpec("alone", {"h100": Quota(16)})
    big = Workload("big", "alone", ("h100",), 8.0, workers_min=3)
    small = Workload("small", "alone", ("h100",), 8.0, workers_min=2, arrival=1)
    snapshot = Snapshot(nodes, (alone,), pending=(big, small))
    result = schedule(snapshot)
    assert result == reference_schedule(snapshot)
    wait = next(w for w in result.waiting if w.workload_id == "big")
    assert wait.reason.endswith("it can never take 24: its nominal quota is 16"), wait.reason
    assert "its cohort" not in wait.reason and "is in no cohort" in wait.reason  # QA 2026-11-28
    assert not wait.reserved and [a.workload_id for a in result.admitted] == ["small"]
    full = ledger_of(alone, used=16).check("alone", "h100", 8)
    assert full.reason == "alone would exceed its h100 quota: uses 16 of 16 nominal and is in no cohort to borrow from"
    # in a cohort: what the others lend at most (nominal, or the lending limit), within the borrowing limit
    ledger = QuotaLedger([ClusterQueueSpec("a", {"h100": Quota(8, borrowing_limit=4)}, "c"),
                          ClusterQueueSpec("b", {"h100": Quota(16, lending_limit=6)}, "c"),
                          ClusterQueueSpec("d", {"h100": Quota(2)}, "c")])
    assert ledger.ceiling("a", "h100") == 12 and ledger.ceiling("b", "h100") == 16 + 8 + 2
    assert ledger.ceiling("d", "h100") == 2 + 8 + 6
    assert ledger.check("d", "h100", 20).reason.endswith(
        "it can never take 20: its nominal 2 and the most its cohort could lend add up to 16")


def ledger_of(spec, used: float):
    from controlplane.scheduling.quota import QuotaLedger

    ledger = QuotaLedger([spec])
    ledger.add(spec.name, "h100", used)
    return ledger


def test_a_held_admission_names_the_jobs_it_waits_for_as_jobs():
    from jobs.admission import waits_on

    assert waits_on(["12"], "stop") == "job 12 checkpoints and stops"
    assert waits_on(["12", "14"], "shrink") == "jobs 12, 14 checkpoint and shrink"
