"""An elastic victim gives back the workers the preemptor needs, whichever they are (issue 3: "shrunk instead of
preempted when shrinking suffices"). Before, a shrink always gave back the victim's last workers, so a victim whose
first worker sat on the node the preemptor needed was stopped whole, and a shrunk one kept none of its later workers
once an earlier one was needed. The first three cases fail on the code before (the last guards the minimum); the
reference in test_scheduler_speedups.py decides the same."""
from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement, without_workers
from controlplane.scheduling.scheduler import schedule
from tests.unit.test_scheduler_speedups import reference_schedule

H = "nvidia-h100"
QUEUES = (ClusterQueueSpec("q", {H: Quota(64)}),)


def half(node, upper=False):
    """Four of a node's eight devices: 0-3, or 4-7."""
    first = 4 if upper else 0
    return WorkerPlacement(node, tuple((d, 1.0) for d in range(first, first + 4)))


def nodes(count):
    return tuple(NodeSpec(f"n{i}", "p", H, "lg", 8) for i in range(count))


def elastic(workers, maximum=None):
    return Running(Workload("v", "q", (H,), 4.0, workers_min=1, workers_max=maximum or len(workers), priority=0), H,
                   tuple(workers))


def keeper(name, worker):
    """A job the preemptor may not take (higher priority)."""
    return Running(Workload(name, "q", (H,), 4.0, priority=9), H, (worker,))


def cycle(running):
    snap = Snapshot(nodes(3), QUEUES, tuple(running), (Workload("p", "q", (H,), 8.0, priority=5),))
    result = schedule(snap)
    assert result == reference_schedule(snap)
    return result


def test_a_victim_whose_first_worker_holds_the_needed_node_is_shrunk_not_stopped():
    """v runs on n0 and n1 (four devices each); n1's other half runs x, n0's is free. p needs a whole node: only n0
    can be freed, by v's first worker. Before: v was stopped (its last worker, on n1, made no room)."""
    v = elastic([half("n0"), half("n1")])
    result = cycle([v, keeper("x", half("n1", upper=True)), keeper("y", half("n2")), keeper("z", half("n2", True))])
    assert result.preempted == []
    assert [(s.workload_id, s.to_workers, s.released) for s in result.shrunk] == [("v", 1, (half("n0"),))]
    assert without_workers(v.workers, result.shrunk[0].released) == (half("n1"),)
    held = next(w.held for w in result.waiting if w.workload_id == "p")
    assert [worker.node for worker in held.workers] == ["n0"]


def test_a_stopped_victim_keeps_every_worker_the_preemptor_does_not_need():
    """v runs on n0, n1, n2; n0's other half is free, n1's and n2's run x and y. Only v's worker on n0 is in the
    way. Before: v was stopped whole; now it keeps its two other workers."""
    v = elastic([half("n0"), half("n1"), half("n2")])
    result = cycle([v, keeper("x", half("n1", True)), keeper("y", half("n2", True))])
    assert result.preempted == []
    assert [(s.workload_id, s.to_workers, s.released) for s in result.shrunk] == [("v", 2, (half("n0"),))]


def test_a_shrunk_victim_keeps_its_later_workers_past_one_the_preemptor_needs():
    """v runs on n0, n1, n2; n1's other half is free, n0's and n2's run x and y. Giving back v's worker on n1 is
    enough. Before: trying to keep that worker failed and the shrink stopped there, giving back the one on n2 too."""
    v = elastic([half("n0"), half("n1"), half("n2")])
    result = cycle([v, keeper("x", half("n0", True)), keeper("y", half("n2", True))])
    assert result.preempted == []
    assert [(s.workload_id, s.to_workers, s.released) for s in result.shrunk] == [("v", 2, (half("n1"),))]


def test_a_victim_that_cannot_keep_its_minimum_is_still_stopped():
    """v (minimum 2) has two workers on n0, the node p needs, and one on n1: it could keep only one. It is stopped,
    not left below its minimum."""
    v = Running(Workload("v", "q", (H,), 4.0, workers_min=2, workers_max=3, priority=0), H,
                (half("n0"), half("n1"), half("n0", True)))
    result = cycle([v, keeper("x", half("n1", True)), keeper("y", half("n2")), keeper("z", half("n2", True))])
    assert [p.workload_id for p in result.preempted] == ["v"]
    assert result.shrunk == []


def test_a_capacity_reason_counts_cordoned_nodes_and_a_cpu_reservation_says_cores():
    """QA: a job waiting while the other H100 node was cordoned read "0 devices free on 1 nodes" (the cluster page
    showed that node's 8 free devices), and a CPU job's reservation spoke of "the devices it needs"."""
    from controlplane.scheduling.model import Snapshot as Snap

    cordoned = (NodeSpec("n0", "p", H, "lg", 8), NodeSpec("n1", "p", H, "lg", 8, schedulable=False))
    snap = Snap(cordoned, QUEUES, (keeper("x", WorkerPlacement("n0", tuple((d, 1.0) for d in range(8)))),),
                (Workload("w", "q", (H,), 8.0, priority=0),))
    [wait] = schedule(snap).waiting
    assert "0 devices free on 1 node (1 more cordoned or down), needs 1 x 8" in wait.reason, wait.reason
    assert schedule(snap) == reference_schedule(snap)
    cpu = (NodeSpec("c0", "p", "cpu", "lg", 4),)
    busy = Running(Workload("b", "q", ("cpu",), 4.0, priority=9), "cpu",
                   (WorkerPlacement("c0", tuple((d, 1.0) for d in range(4))),))
    snap = Snap(cpu, (ClusterQueueSpec("q", {"cpu": Quota(64)}),), (busy,), (Workload("w", "q", ("cpu",), 2.0),))
    [wait] = schedule(snap).waiting
    assert wait.reason.endswith("(holds a reservation: later workloads cannot take the CPU cores it needs)")
    assert schedule(snap) == reference_schedule(snap)
