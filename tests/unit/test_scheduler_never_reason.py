"""A workload its queue can never take says so in every refusal (QA, 2026-12-07). Two refusals said nothing of it:
a queue with a borrowing limit ("uses 0 of 8 nominal + 4 borrowing" for a 16-device gang, as if it would run once
usage went down), and a queue an operator took the type's quota away from while the workload waited ("uses 0 of 0
nominal + 0 borrowing")."""

from __future__ import annotations

from controlplane.scheduling.model import ClusterQueueSpec, NodeSpec, Quota, Snapshot, Workload
from controlplane.scheduling.scheduler import schedule

H100 = "nvidia-h100"
A100 = "nvidia-a100"
NODES = tuple(NodeSpec(f"h{i}", "p", H100, "g", 8) for i in range(4))


def _reason(queues, workload) -> str:
    result = schedule(Snapshot(NODES, queues, running=(), pending=(workload,)))
    assert result.admitted == []
    (wait,) = result.waiting
    return wait.reason


def test_a_gang_beyond_nominal_plus_the_borrowing_limit_is_told_it_can_never_run():
    queues = (ClusterQueueSpec("a", {H100: Quota(8, borrowing_limit=4)}, "c"),
              ClusterQueueSpec("b", {H100: Quota(16)}, "c"))
    reason = _reason(queues, Workload("1", "a", (H100,), 16.0))
    assert reason == ("a would exceed its nvidia-h100 quota: uses 0 of 8 nominal + 4 borrowing; it can never take "
                      "16: its nominal 8 and the most it may borrow from its cohort add up to 12")


def test_a_workload_whose_type_has_no_quota_in_its_queue_is_told_so():
    queues = (ClusterQueueSpec("a", {A100: Quota(8)}, "c"), ClusterQueueSpec("b", {H100: Quota(16)}, "c"))
    reason = _reason(queues, Workload("1", "a", (H100,), 8.0))
    assert reason == "a has no nvidia-h100 quota: it can never take 8 nvidia-h100 until an operator gives it one"
