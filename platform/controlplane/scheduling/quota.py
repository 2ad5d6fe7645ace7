"""Quota accounting for ClusterQueues in cohorts, in Kueue's terms.

A queue may always use its nominal quota, unless others borrowed it (then it is reclaimed first).
Beyond nominal it borrows: at most `borrowing_limit` more, and only from what the other queues of
its cohort have idle and lend (each lends at most `lending_limit` of its idle quota). Usage changes
here only through `add`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.scheduling.model import ClusterQueueSpec, Quota

EPS = 1e-9
NO_QUOTA = Quota(nominal=0.0, borrowing_limit=0.0)


@dataclass(frozen=True)
class QuotaCheck:
    ok: bool
    borrowed: float
    reason: str


WITHIN_NOMINAL = QuotaCheck(True, 0.0, "within nominal quota")  # the most frequent answer, made once


def non_preemptible_refusal(queue: str, accelerator_type: str, fixed: float, amount: float, nominal: float) -> str:
    """Why a non-preemptible workload may not take `amount` more of the type in `queue`, or "". `fixed`: what the
    queue's non-preemptible workloads use now. Borrowed quota goes back to its lender only by preemption, so the
    queue's non-preemptible usage stays within its nominal quota: whatever the queue borrows is then held by work
    that can give it back (a non-preemptible workload never borrows; before, it kept the lender's quota, and its
    cohort over its nominal total, until it ended)."""
    if fixed + amount <= nominal + EPS:
        return ""
    return (f"{queue}'s non-preemptible workloads would use {fixed + amount:g} {accelerator_type}, beyond its "
            f"nominal quota of {nominal:g}: a non-preemptible workload does not borrow from its cohort")


def reserved_capacity_refusal(accelerator_type: str, fixed: float, amount: float, cap: float) -> str:
    """Why a non-preemptible workload may not take `amount` more of the type, all queues together, or "". `fixed`:
    what non-preemptible workloads of every queue use of it now; `cap`: the type's capacity that serving deployments
    have not reserved (Snapshot.non_preemptible_caps). Training on reserved capacity gives it back when the
    deployments scale out, by preemption; a non-preemptible workload cannot (before, one was admitted there and the
    deployment could never scale out; found by QA)."""
    if fixed + amount <= cap + EPS:
        return ""
    return (f"non-preemptible workloads would use {fixed + amount:g} {accelerator_type}, beyond the {cap:g} that "
            "serving deployments have not reserved: a non-preemptible workload could not give reserved capacity "
            "back when they scale out")


class QuotaLedger:
    def __init__(self, queues: Iterable[ClusterQueueSpec]):
        self.queues = {queue.name: queue for queue in queues}
        self.usage: dict[tuple[str, str], float] = defaultdict(float)
        self.cohorts: dict[str, list[str]] = defaultdict(list)
        for queue in self.queues.values():
            if queue.cohort:
                self.cohorts[queue.cohort].append(queue.name)

    def quota(self, queue: str, accelerator_type: str) -> Quota:
        return self.queues[queue].quotas.get(accelerator_type, NO_QUOTA)

    def add(self, queue: str, accelerator_type: str, amount: float) -> None:
        self.usage[(queue, accelerator_type)] += amount

    def members(self, queue: str) -> list[str]:
        cohort = self.queues[queue].cohort
        return self.cohorts[cohort] if cohort else [queue]

    def borrowed(self, queue: str, accelerator_type: str) -> float:
        return max(0.0, self.usage[(queue, accelerator_type)] - self.quota(queue, accelerator_type).nominal)

    def cohort_room(self, queue: str, accelerator_type: str) -> float:
        """How much more `queue` may use in its cohort now: the cohort's unused nominal quota, less what
        each other member does not lend (a member lends at most `lending_limit` of its idle quota)."""
        members = self.members(queue)
        usage, queues = self.usage, self.queues
        quotas = [queues[m].quotas.get(accelerator_type, NO_QUOTA) for m in members]
        room = sum([quota.nominal - usage[(m, accelerator_type)] for m, quota in zip(members, quotas, strict=True)])
        for other, quota in zip(members, quotas, strict=True):
            if other == queue:
                continue
            if quota.lending_limit is not None:
                idle = max(0.0, quota.nominal - usage[(other, accelerator_type)])
                room -= max(0.0, idle - quota.lending_limit)  # idle beyond its lending limit stays home
        return max(0.0, room)

    def ceiling(self, queue: str, accelerator_type: str) -> float:
        """The most `queue` could ever use of the type, with nothing else running: its nominal quota plus what the
        other members of its cohort lend at most (their nominal, or their lending limit), within its borrowing
        limit."""
        quota = self.quota(queue, accelerator_type)
        lend = 0.0
        for other in self.members(queue):
            if other != queue:
                theirs = self.quota(other, accelerator_type)
                lend += theirs.nominal if theirs.lending_limit is None else min(theirs.nominal, theirs.lending_limit)
        if quota.borrowing_limit is not None:
            lend = min(lend, quota.borrowing_limit)
        return quota.nominal + lend

    def check(self, queue: str, accelerator_type: str, amount: float) -> QuotaCheck:
        spec = self.queues[queue]
        quota = spec.quotas.get(accelerator_type, NO_QUOTA)
        usage = self.usage
        used = usage[(queue, accelerator_type)]
        if used + amount <= quota.nominal + EPS:
            # Within nominal, unless others borrowed that idle quota: then it must be reclaimed first
            # (by preemption), or a preemptor holding it would lose it to a third workload.
            # The room counts only what the other members lend (found by the property tests: a queue used
            # its own idle quota that a member's lending limit kept home, while a borrower still held it).
            if spec.cohort and self.cohort_room(queue, accelerator_type) + EPS < amount:
                return QuotaCheck(False, 0.0, f"{queue}'s idle {accelerator_type} quota is lent to its cohort; "
                                              "it must be reclaimed first")
            return WITHIN_NOMINAL
        need = used + amount - max(quota.nominal, used)  # the part beyond nominal still to borrow
        if accelerator_type not in spec.quotas:  # (an operator removed it while the workload waited: QA, 2026-12-07;
            # it read "uses 0 of 0 nominal + 0 borrowing", as if it would run once usage went down)
            return QuotaCheck(False, 0.0, f"{queue} has no {accelerator_type} quota: it can never take {amount:g} "
                                          f"{accelerator_type} until an operator gives it one")
        if quota.borrowing_limit is not None and used + amount > quota.nominal + quota.borrowing_limit + EPS:
            reason = (f"{queue} would exceed its {accelerator_type} quota: uses {used:g} of {quota.nominal:g} nominal "
                      f"+ {quota.borrowing_limit:g} borrowing")
            ceiling = self.ceiling(queue, accelerator_type)
            if amount > ceiling + EPS:  # not a matter of waiting, as below (it said nothing of it here)
                reason += (f"; it can never take {amount:g}: its nominal {quota.nominal:g} and the most it may borrow "
                           f"from its cohort add up to {ceiling:g}")
            return QuotaCheck(False, 0.0, reason)
        room = self.cohort_room(queue, accelerator_type)
        if room + EPS < amount:
            if spec.cohort:
                lendable = max(0.0, room - max(0.0, quota.nominal - used))
                reason = (f"{queue} needs to borrow {need:g} {accelerator_type} but its cohort lends only "
                          f"{lendable:g} now")
            else:  # nothing to borrow from (it read "its cohort lends only 0" for a queue without one)
                reason = (f"{queue} would exceed its {accelerator_type} quota: uses {used:g} of {quota.nominal:g} "
                          "nominal and is in no cohort to borrow from")
            ceiling = self.ceiling(queue, accelerator_type)
            if amount > ceiling + EPS and spec.cohort:  # not a matter of waiting: say so
                reason += (f"; it can never take {amount:g}: its nominal {quota.nominal:g} and the most its cohort "
                           f"could lend add up to {ceiling:g}")
            elif amount > ceiling + EPS:
                reason += f"; it can never take {amount:g}: its nominal quota is {quota.nominal:g}"
            return QuotaCheck(False, 0.0, reason)
        return QuotaCheck(True, need, f"borrows {need:g} {accelerator_type} from its cohort")
