"""A workload blocked by lower-priority preemptible work that may not be a victim in this cycle (settled: the
platform's jobs STARTING or RECOVERING) says so in its reason. Before, a non-preemptible job whose queue's quota a
preemptible job still STARTING used was told only that its cohort "lends only 0", which did not say what kept it
waiting: once that job runs, it is preempted for it."""

from __future__ import annotations

from dataclasses import replace

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Running, Snapshot, Workload
from controlplane.scheduling.placement import WorkerPlacement
from controlplane.scheduling.scheduler import schedule

H100 = "nvidia-h100"
NODES = (NodeSpec("h0", "p", H100, "g", 8), NodeSpec("h1", "p", H100, "g", 8))
STARTING = Running(Workload("12", "a", (H100,), 8.0, priority=0), H100,
                   (WorkerPlacement("h0", tuple((i, 1.0) for i in range(8))),), settled=True)
FIXED = Workload("13", "a", (H100,), 8.0, priority=100, preemptible=False)


def test_a_non_preemptible_job_blocked_by_a_starting_preemptible_job_is_told_so():
    queues = (ClusterQueueSpec("a", {H100: Quota(8)}, "c"), ClusterQueueSpec("b", {H100: Quota(0)}, "c"))
    result = schedule(Snapshot(NODES, queues, running=(STARTING,), pending=(FIXED,)))
    assert result.admitted == [] and result.preempted == []
    (wait,) = result.waiting
    assert wait.reason == ("a needs to borrow 8 nvidia-h100 but its cohort lends only 0 now; lower-priority 12 "
                           "(8 nvidia-h100 devices), which it may preempt, is starting, recovering or shrinking now: "
                           "no victim until it settles")
    # once it runs, it is the victim
    result = schedule(Snapshot(NODES, queues, running=(replace(STARTING, settled=False),), pending=(FIXED,)))
    assert [p.workload_id for p in result.preempted] == ["12"]


def test_the_note_names_only_work_it_could_preempt():
    queues = (ClusterQueueSpec("a", {H100: Quota(8)}),)
    # of the same priority: not a victim even once it runs, so nothing to add
    same = replace(STARTING, workload=replace(STARTING.workload, priority=100))
    result = schedule(Snapshot(NODES, queues, running=(same,), pending=(FIXED,)))
    assert result.waiting[0].reason == ("a would exceed its nvidia-h100 quota: uses 8 of 8 nominal and is in no "
                                        "cohort to borrow from")
    # a queue whose workloads never preempt each other
    never = (replace(queues[0], preemption_within_queue="Never"),)
    result = schedule(Snapshot(NODES, never, running=(STARTING,), pending=(FIXED,)))
    assert "starting" not in result.waiting[0].reason
    result = schedule(Snapshot(NODES, queues, running=(STARTING,), pending=(FIXED,)))
    assert result.waiting[0].reason.endswith("; lower-priority 12 (8 nvidia-h100 devices), which it may preempt, is "
                                             "starting, recovering or shrinking now: no victim until it settles")
