"""QA: the rules of issue 3 (scheduler.py's docstring) checked on the cycle's output: hand-made edge cases found by
QA."""

from __future__ import annotations

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule


def _devices(first: int, count: int) -> tuple[tuple[int, float], ...]:
    return tuple((index, 1.0) for index in range(first, first + count))


def test_an_elastic_victim_keeps_the_workers_out_of_the_preemptors_way_and_is_shrunk_not_stopped():
    # v (2..3 x 4 devices) runs one worker on n1 and two on n2. An 8-device worker of higher priority needs a whole
    # node: giving back the worker on n1 is enough (v keeps its minimum of 2 on n2). Before, v kept its first worker
    # (on n1, where the preemptor would then not go), could keep neither of the others beside it, and was stopped.
    nodes = (NodeSpec("n1", "p", "h100", "g", 8), NodeSpec("n2", "p", "h100", "g", 8))
    victim = Workload("v", "a", ("h100",), 4, 2, 3, priority=0)
    running = Running(victim, "h100", (WorkerPlacement("n1", _devices(0, 4)), WorkerPlacement("n2", _devices(0, 4)),
                                       WorkerPlacement("n2", _devices(4, 4))))
    snapshot = Snapshot(nodes, (ClusterQueueSpec("a", {"h100": Quota(16)}),), running=(running,),
                        pending=(Workload("p", "a", ("h100",), 8, 1, 1, priority=1),))
    result = schedule(snapshot)
    assert result.preempted == []
    assert [(s.workload_id, s.to_workers, s.released) for s in result.shrunk] == [
        ("v", 2, (WorkerPlacement("n1", _devices(0, 4)),))]
    held = result.waiting[0].held
    assert held is not None and [w.node for w in held.workers] == ["n1"]
