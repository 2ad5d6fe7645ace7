"""One scheduling cycle: which pending workloads start now, where, and what must make room.

Rules (issue 3), in the order applied:
1. Order: priority (high first), then arrival, then id: best-effort FIFO.
2. Gangs: a workload is admitted with all `workers_min` workers placed, or not at all.
3. Quota: nominal, then borrowed from the cohort (quota.QuotaLedger); a queue's non-preemptible workloads stay within
   its nominal quota (quota.non_preemptible_refusal): only preemption gives borrowed quota back to its lender.
4. Type choice: the workload's accepted types in its preference order (cheapest per unit of work
   first, from the efficiency matrix); the next type is tried when the best is full or out of quota.
5. Placement: packed into as few leaf groups as possible (placement.place_gang).
6. Backfill with a reservation: the first workload that cannot start reserves the free devices it
   will need, and later workloads may only use what is left, so it is not starved.
7. Preemption: a workload that still cannot start may take the devices of lower-priority workloads,
   or (within its nominal quota) of workloads borrowing in its cohort. A victim in another cluster
   queue is taken only while that queue uses more than its nominal quota (as Kueue does): a queue
   within its nominal quota keeps what it runs, whatever the priorities. Without this, a borrowing
   high-priority preemptor took a low-priority job within its queue's nominal quota, the requeued
   job reclaimed its queue's quota from the preemptor, and the two preempted each other in every
   cycle (found by the Q1 quota soak). Victims are the lowest priority, then the least work lost since
   their last checkpoint; an elastic victim is shrunk before it is stopped; each victim at most once;
   nothing happens unless the preemptor then fits. The trial stops candidates in that order until the
   preemptor fits, then puts back, from the last to the first, every one it still fits without (Kueue's
   minimal preemption; an elastic one that need not stop is only shrunk, and gives back only the workers, any of
   them, the preemptor needs): the walk stops victims
   wherever they run, and before, one 8-device worker could stop dozens of small jobs on other nodes.
   Those put back whole are spared for the rest of the cycle: a later trial on their accelerator type
   that reaches one stops there and preempts nothing on that type (its preemptor may still preempt on
   another accepted type, whose victims are ranked on their own, or waits a cycle), so no victim of the
   type ranked after a spared one is taken and the spared ones are not walked again and again
   (_room_after_all's bound walk stops there too). Victims checkpoint first; the
   preemptor's devices and quota stay reserved until they are free.
8. Elastic growth: running workloads below `workers_max` grow into capacity nobody waits for.
The cycle is a pure function of the snapshot: the same snapshot gives the same decisions.

Speed (decisions are those of the straightforward algorithm, checked in tests/unit/test_scheduler_speedups.py):
nodes are indexed per accelerator type and leaf group with cached free totals, whole-free counts and, per
worker shape, the number of workers each node, leaf group and type can still hold. A gang fits iff its type
can hold all its workers (greedy placement uses exactly one slot per worker), so failures cost O(1) and a
placement only looks at one leaf group. Quota checks are cached until a usage of the cohort changes, and a
cohort's room comes from sums kept up to date per cohort and type, not a loop over its members.
Preemption trials run on the live state with an undo log instead of a deep copy, skip types where even
every candidate victim could not make room (quota and capacity bounds), and take candidates from a
per-type list sorted once per cycle, from which a victim taken leaves at once. The best-fit node for each
worker of a gang comes from a heap of the group's fitting nodes; a gang spanning groups walks the groups
from the ranked list (ints: slots * groups + the group's place by name). A workload that can neither
start nor preempt is not tried again, within the cycle, for another workload of the same queue, types,
shape and priority while nothing of those types changed (failing changes nothing: trials are undone).
"""

from __future__ import annotations

import gc
import heapq
from bisect import bisect_left, insort
from collections import Counter, defaultdict
from itertools import chain, islice
from operator import attrgetter

from controlplane.scheduling.model import (
    Admit,
    CycleResult,
    Grow,
    Preempt,
    Quota,
    Running,
    Shrink,
    Snapshot,
    Wait,
    Workload,
)
from controlplane.scheduling.placement import EPS, WorkerPlacement
from controlplane.scheduling.quota import (
    NO_QUOTA,
    QuotaCheck,
    QuotaLedger,
    non_preemptible_refusal,
    reserved_capacity_refusal,
)

_WHOLE = 1.0 - EPS
_INF = float("inf")
# The smallest worker size (devices; cores on cpu) the cycle places: far below any real request (the platform refuses
# under 0.01 core), and far enough above 0 that shares divided by it stay finite (1e-310 overflowed them).
_MIN_SIZE = 1e-6
_SLACK = _WHOLE - 1e-6  # a device whose free share reaches this may be whole in the trial (sums in another order)
_EXACT = 1048576.0  # free totals that are multiples of 2**-20 add up exactly, in any order
_ID = attrgetter("id")


class _Node:
    """A node's devices (as placement.NodeState) plus the cached values the indexes are built from."""

    __slots__ = ("name", "accelerator_type", "leaf_group", "device_free", "schedulable", "free", "whole", "slots",
                 "pool", "simple")

    def __init__(self, name, accelerator_type, leaf_group, devices, schedulable):
        self.name = name
        self.accelerator_type = accelerator_type
        self.leaf_group = leaf_group
        self.device_free = [1.0] * devices
        self.schedulable = schedulable
        self.free = 0.0
        self.whole = 0
        self.simple = True  # every share is exactly 0.0 or 1.0 (then whole counts the 1.0s)
        self.slots: dict[float, int] = {}
        self.pool: _Pool | None = None

    @property
    def capacity(self) -> int:
        return len(self.device_free)

    def fits(self, devices: float) -> bool:  # as NodeState.fits
        if not self.schedulable:
            return False
        if devices >= 1.0 - EPS:
            return self.whole >= round(devices)
        return any(share >= devices - EPS for share in self.device_free)

    def slots_for(self, devices: float) -> int:  # as placement._slots
        if not self.schedulable:
            return 0
        if devices >= 1.0 - EPS:
            return self.whole // max(1, round(devices))
        return sum(int((share + EPS) // devices) for share in self.device_free)

    def measure(self) -> None:
        """Set free, whole and simple from device_free."""
        free = self.device_free
        ones = free.count(1.0)
        self.simple = simple = ones + free.count(0.0) == len(free)
        self.free = sum(free)
        self.whole = ones if simple else len([share for share in free if share >= _WHOLE])

    def take(self, devices: float) -> tuple[tuple[int, float], ...]:  # as NodeState.take (best)
        free = self.device_free
        if devices >= 1.0 - EPS:
            chosen = [i for i, share in enumerate(free) if share >= _WHOLE][:round(devices)]
            for index in chosen:
                free[index] = 0.0
            taken = tuple([(index, 1.0) for index in chosen])
        else:
            index = min((i for i, share in enumerate(free) if share >= devices - EPS), key=lambda i: (free[i], i))
            free[index] = max(0.0, free[index] - devices)
            taken = ((index, devices),)
        self.pool.refresh(self)
        return taken


class _Pool:
    """The nodes of one accelerator type, by leaf group, with per-shape slot counts kept up to date."""

    def __init__(self, nodes: list[_Node]):
        self.nodes = nodes  # name order
        self.sched = [node for node in nodes if node.schedulable]
        self.groups: dict[str, list[_Node]] = {}
        for node in self.sched:
            self.groups.setdefault(node.leaf_group, []).append(node)
            node.pool = self
        for node in nodes:
            node.pool = self
        self.group_slots: dict[float, dict[str, int]] = {}
        # Per shape, the groups sorted by (slots, name), each as one int, slots * span + the group's place in
        # name order: ints compare much faster than (slots, name) tuples and sort the same.
        self.names = sorted(self.groups)
        self.place = {name: i for i, name in enumerate(self.names)}
        self.span = max(1, len(self.names))
        self.ranked: dict[float, list[int]] = {}
        self.dirty: dict[float, dict[str, int]] = {}  # per shape: groups whose ranked entry is out of date -> it
        # Per shape, split by kind (a node's whole-device slots change only with its whole count):
        self.whole_shapes: list[tuple] = []  # (devices, divisor, group_slots, dirty)
        self.part_shapes: list[tuple] = []  # fractions: (devices, per_one, per_zero, group_slots, dirty)
        self.total: dict[float, int] = {}
        self.version = 0  # bumped by every refresh: any change to the devices of the type
        self.freed = 0  # bumped by every refresh that gave a node more free share or whole devices
        self.free_sum = 0.0  # over schedulable nodes, exact while `inexact` is 0 and not `stale`
        self.inexact = 0
        self.stale = False
        self.whole_sum = 0
        self.info: dict[float, tuple[int, int, int]] = {}
        self.most: dict[float, int] = {}  # most_slots, per shape
        for node in nodes:
            node.measure()
            if node.schedulable:
                self.free_sum += node.free
                self.whole_sum += node.whole
                if not (node.free * _EXACT).is_integer():
                    self.inexact += 1
        self.stale = self.inexact > 0

    def shape(self, devices: float) -> dict[str, int]:
        slots = self.group_slots.get(devices)
        if slots is None:
            slots = self.group_slots[devices] = {}
            total = 0
            info = self._info(devices)
            divisor = info[0]
            for name, members in self.groups.items():
                if divisor:  # (_node_slots, inline)
                    counts = [node.whole // divisor for node in members]
                else:
                    counts = [_node_slots(node, devices, info) for node in members]
                for node, own in zip(members, counts, strict=True):
                    node.slots[devices] = own
                slots[name] = count = sum(counts)
                total += count
            self.total[devices] = total
            span, place = self.span, self.place
            self.ranked[devices] = sorted([count * span + place[name] for name, count in slots.items()])
            self.dirty[devices] = {}
            divisor, per_one, per_zero = info
            if divisor:
                self.whole_shapes.append((devices, divisor, slots, self.dirty[devices]))
            else:
                self.part_shapes.append((devices, per_one, per_zero, slots, self.dirty[devices]))
        return slots

    def _info(self, devices: float) -> tuple[int, int, int]:
        info = self.info.get(devices)
        if info is None:
            if devices >= _WHOLE:
                info = (max(1, round(devices)), 0, 0)
            else:
                info = (0, int((1.0 + EPS) // devices), int((0.0 + EPS) // devices))
            self.info[devices] = info
        return info

    def most_slots(self, devices: float) -> int:
        """How many workers of `devices` the schedulable nodes could hold were nothing running (as slots_for on
        every device free): fewer than a gang's workers, and it can never be placed on these nodes."""
        most = self.most.get(devices)
        if most is None:
            if devices >= 1.0 - EPS:
                divisor = max(1, round(devices))
                most = sum([node.capacity // divisor for node in self.sched])
            else:
                most = sum([node.capacity for node in self.sched]) * int((1.0 + EPS) // devices)
            self.most[devices] = most
        return most

    def slots(self, devices: float) -> int:
        if devices not in self.total:
            self.shape(devices)
        return self.total[devices]

    def refresh(self, node: _Node) -> None:
        """Recompute a node's cached values after its device_free changed."""
        self.version += 1
        old_free, old_whole, was_simple = node.free, node.whole, node.simple
        shares = node.device_free
        ones = shares.count(1.0)
        capacity = len(shares)
        node.simple = simple = ones + shares.count(0.0) == capacity
        node.free = free = sum(shares)
        node.whole = whole = ones if simple else len([share for share in shares if share >= _WHOLE])
        if free > old_free or whole > old_whole:
            self.freed += 1
        if not node.schedulable:
            return
        # A simple node's free total is a whole number, exact; only the others need the test.
        was_exact = was_simple or (old_free * _EXACT).is_integer()
        now_exact = simple or (free * _EXACT).is_integer()
        if not (was_exact and now_exact):
            self.inexact += (not now_exact) - (not was_exact)
            self.stale = True
        self.free_sum += free - old_free
        node_slots, group, total = node.slots, node.leaf_group, self.total
        if whole == old_whole:
            if simple and was_simple:
                return  # the same whole count and nothing fractional: every shape's slots are as they were
        else:
            self.whole_sum += whole - old_whole
            for devices, divisor, group_slots, dirty in self.whole_shapes:
                own = whole // divisor
                delta = own - node_slots[devices]
                if delta:  # (the same 5 lines as below: a call per shape costs more than the rest)
                    node_slots[devices] = own
                    old = group_slots[group]
                    group_slots[group] = old + delta
                    total[devices] += delta
                    if group not in dirty:
                        dirty[group] = old
        for devices, per_one, per_zero, group_slots, dirty in self.part_shapes:
            if simple:
                own = ones * per_one + (capacity - ones) * per_zero
            else:
                own = sum([int((share + EPS) // devices) for share in shares])
            delta = own - node_slots[devices]
            if delta:
                node_slots[devices] = own
                old = group_slots[group]
                group_slots[group] = old + delta
                total[devices] += delta
                if group not in dirty:
                    dirty[group] = old

    def rank(self, devices: float) -> list[int]:
        """The ranked list of a shape (after shape(devices)), sorted and up to date."""
        ranked = self.ranked[devices]
        dirty = self.dirty[devices]
        if dirty:
            group_slots, span, place = self.group_slots[devices], self.span, self.place
            for group, old in dirty.items():
                new = group_slots[group]
                if new != old:
                    where = place[group]
                    del ranked[bisect_left(ranked, old * span + where)]
                    insort(ranked, new * span + where)
            dirty.clear()
        return ranked

    def free_total(self) -> float:
        if self.inexact:  # not exactly representable: add up in the straightforward order
            return sum(node.free for node in self.sched)
        if self.stale:  # exact again: start over from the exact sum
            self.free_sum, self.stale = sum(node.free for node in self.sched), False
        return self.free_sum + 0.0


def _node_slots(node: _Node, devices: float, info: tuple[int, int, int]) -> int:
    """node.slots_for(devices) for a schedulable node, with the shape's constants precomputed."""
    divisor, per_one, per_zero = info
    if divisor:
        return node.whole // divisor
    if node.simple:
        ones = node.whole
        return ones * per_one + (len(node.device_free) - ones) * per_zero
    return sum(int((share + EPS) // devices) for share in node.device_free)


def _exact(value: float) -> bool:
    return (value * _EXACT).is_integer()


def _kept_home(quota: Quota, used: float) -> float:
    """What a cohort member with a lending limit does not lend: its idle quota beyond that limit."""
    return max(0.0, max(0.0, quota.nominal - used) - quota.lending_limit)


class _CohortSums:
    """Per (cohort, type), kept up to date as usage changes: the cohort's unused nominal quota and what its
    members keep home (idle beyond their lending limits), so cohort_room costs O(1), not O(members).
    Exact while every usage and quota is a multiple of 2**-20 (then sums do not depend on their order and
    equal QuotaLedger.cohort_room's); otherwise the ledger falls back to the straightforward sum."""

    __slots__ = ("room", "home", "inexact", "stale", "quotas_inexact")

    def __init__(self, ledger: QuotaLedger, cohort: str, accelerator_type: str):
        self.room = self.home = 0.0
        self.inexact = 0  # members whose usage is not exact
        self.stale = False  # an inexact value passed through the sums: add them up again once all are exact
        self.quotas_inexact = False
        for member in ledger.cohorts[cohort]:
            quota = ledger.queues[member].quotas.get(accelerator_type, NO_QUOTA)
            used = ledger.usage[(member, accelerator_type)]
            self.room += quota.nominal - used
            if quota.lending_limit is not None:
                self.home += _kept_home(quota, used)
                self.quotas_inexact |= not _exact(quota.lending_limit)
            self.quotas_inexact |= not _exact(quota.nominal)
            self.inexact += not _exact(used)


class _Ledger(QuotaLedger):
    """QuotaLedger whose checks are cached until a usage of the queue's cohort (for that type) changes, and
    whose cohort room comes from sums kept per cohort and type (_CohortSums)."""

    def __init__(self, queues):
        super().__init__(queues)
        # The checks of a queue are cached per (its cohort, or itself alone, type).
        self.scopes = {name: spec.cohort if spec.cohort else ("", name) for name, spec in self.queues.items()}
        self.version: dict[tuple, int] = defaultdict(int)
        self.cache: dict[tuple, tuple[int, QuotaCheck]] = {}
        self.sums: dict[tuple[str, str], _CohortSums] = {}
        self.type_version: dict[str, int] = defaultdict(int)  # bumped by add and set, per accelerator type
        self.borrowing_cache: dict[str, tuple[int, frozenset[str]]] = {}
        self.what_if = QuotaLedger(())  # for _could_fit: the same queues, its own usage
        self.what_if.queues, self.what_if.cohorts = self.queues, self.cohorts
        # (queue, type) -> the usage this cycle added for work that did not run before it: admissions, preemptors'
        # held admissions, the reservation's hold (_reserve). In usage, so no later workload takes that quota, but it
        # never makes its queue a borrower others may reclaim from (rule 7 looks at the work that runs: before, a
        # waiting head's reservation or a job admitted by borrowing in the same cycle made its queue a borrower, and a
        # cohort member preempted a job of it that ran within its nominal quota; found by QA).
        self.new_usage: dict[tuple[str, str], float] = {}

    def _scope(self, queue: str, accelerator_type: str) -> tuple:
        scope = self.scopes.get(queue)
        return (scope if scope is not None else ("", queue)), accelerator_type

    def change(self, queue: str, accelerator_type: str, value: float) -> None:
        """Set a usage, keeping the cohort sums current; cached checks stay (callers that need them
        invalidated use add or set)."""
        key = (queue, accelerator_type)
        old = self.usage[key]
        self.usage[key] = value
        spec = self.queues.get(queue)
        if spec is None or not spec.cohort:
            return
        sums = self.sums.get((spec.cohort, accelerator_type))
        if sums is None:
            return
        quota = spec.quotas.get(accelerator_type, NO_QUOTA)
        sums.room += old - value
        if quota.lending_limit is not None:
            sums.home += _kept_home(quota, value) - _kept_home(quota, old)
        was, now = _exact(old), _exact(value)
        if not (was and now):
            sums.stale = True
            sums.inexact += (not now) - (not was)

    def cohort_room(self, queue: str, accelerator_type: str) -> float:
        spec = self.queues[queue]
        if not spec.cohort:
            return super().cohort_room(queue, accelerator_type)
        key = (spec.cohort, accelerator_type)
        sums = self.sums.get(key)
        if sums is None or (sums.stale and not sums.inexact):
            sums = self.sums[key] = _CohortSums(self, spec.cohort, accelerator_type)
        if sums.inexact or sums.quotas_inexact:
            return super().cohort_room(queue, accelerator_type)
        quota = spec.quotas.get(accelerator_type, NO_QUOTA)
        own = _kept_home(quota, self.usage[(queue, accelerator_type)]) if quota.lending_limit is not None else 0.0
        return max(0.0, sums.room - (sums.home - own))

    def add(self, queue: str, accelerator_type: str, amount: float) -> None:
        self.change(queue, accelerator_type, self.usage[(queue, accelerator_type)] + amount)
        self.version[self._scope(queue, accelerator_type)] += 1
        self.type_version[accelerator_type] += 1

    def set(self, queue: str, accelerator_type: str, value: float) -> None:
        self.change(queue, accelerator_type, value)
        self.version[self._scope(queue, accelerator_type)] += 1
        self.type_version[accelerator_type] += 1

    def add_new(self, queue: str, accelerator_type: str, amount: float) -> None:
        """`add` for work that did not run before the cycle (see new_usage)."""
        key = (queue, accelerator_type)
        self.new_usage[key] = self.new_usage.get(key, 0.0) + amount
        self.add(queue, accelerator_type, amount)

    def borrowed_by_running(self, queue: str, accelerator_type: str) -> float:
        """What the queue's work that ran before the cycle (less what the cycle stopped) uses beyond its nominal
        quota: what others may reclaim from it."""
        return max(0.0, self.usage[(queue, accelerator_type)] - self.new_usage.get((queue, accelerator_type), 0.0)
                   - self.quota(queue, accelerator_type).nominal)

    def borrowing(self, accelerator_type: str) -> frozenset[str]:
        """The queues whose running work uses more than their nominal quota of the type now (new_usage left out).
        Cached until an add or set."""
        version = self.type_version[accelerator_type]
        hit = self.borrowing_cache.get(accelerator_type)
        if hit is None or hit[0] != version:
            queues = frozenset(queue for queue in self.queues
                               if self.borrowed_by_running(queue, accelerator_type) > EPS)
            hit = self.borrowing_cache[accelerator_type] = (version, queues)
        return hit[1]

    def check(self, queue: str, accelerator_type: str, amount: float) -> QuotaCheck:
        version = self.version[self._scope(queue, accelerator_type)]
        key = (queue, accelerator_type, amount)
        hit = self.cache.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        result = super().check(queue, accelerator_type, amount)
        self.cache[key] = (version, result)
        return result


class _State:
    """The cluster as this cycle sees it: node devices, quota usage and running workloads."""

    def __init__(self, snapshot: Snapshot):
        self.nodes: dict[str, _Node] = {
            spec.name: _Node(spec.name, spec.accelerator_type, spec.leaf_group, spec.devices, spec.schedulable)
            for spec in sorted(snapshot.nodes, key=attrgetter("name"))
        }
        self.ledger = _Ledger(snapshot.cluster_queues)
        self.running: dict[str, Running] = {}
        nodes = self.nodes
        running_by_id = self.running
        usage: dict[tuple[str, str], float] = {}  # added up in the order ledger.add would, so to the same values
        # The ids of running workloads that may be below their maximum number of workers (a superset: every
        # running workload set below it is added), so that elastic growth need not look at all of them.
        self.elastic: set[str] = set()
        elastic = self.elastic
        # Per running workload, what releasing all of it gives back: (devices of quota, device shares, device
        # entries), for _could_fit's bounds (which leave room for the rounding of the shares' sums).
        self.amounts: dict[str, tuple[float, float, int]] = {}
        amounts = self.amounts
        # What non-preemptible workloads use per (queue, type): it stays within nominal (rule 3).
        self.fixed: dict[tuple[str, str], float] = {}
        fixed = self.fixed
        # What they use per type, all queues together, against the snapshot's non_preemptible_caps.
        self.caps = snapshot.non_preemptible_caps
        self.fixed_by_type: dict[str, float] = {}
        for running in sorted(snapshot.running, key=attrgetter("workload.id")):
            workload = running.workload
            shares = 0.0
            entries = 0
            for worker in running.workers:
                taken = worker.taken
                entries += len(taken)
                node = nodes.get(worker.node)
                if node is None:
                    for _, share in taken:
                        shares += share
                    continue
                free = node.device_free
                size = len(free)
                for index, share in taken:
                    shares += share
                    if index < size:  # a node that shrank since: its lost devices hold nothing
                        # (a share >= 1 leaves 0.0, as max(0.0, free - share) does: free is at most 1.0)
                        free[index] = 0.0 if share >= 1.0 else max(0.0, free[index] - share)
            used = len(running.workers) * workload.devices_per_worker
            amounts[workload.id] = (used, shares, entries)
            key = (workload.cluster_queue, running.accelerator_type)
            usage[key] = usage.get(key, 0.0) + used
            if not workload.preemptible:
                fixed[key] = fixed.get(key, 0.0) + used
                self.fixed_by_type[running.accelerator_type] = \
                    self.fixed_by_type.get(running.accelerator_type, 0.0) + used
            running_by_id[workload.id] = running
            if len(running.workers) < workload.workers_max:
                elastic.add(workload.id)
        for (queue, accelerator_type), value in usage.items():
            self.ledger.set(queue, accelerator_type, value)
        self.started_before = frozenset(self.running)
        # The preemptible ones per type: a type's victims are set up at its first preemption trial, and until then
        # nothing changes the running workloads of that type that started before the cycle.
        self.preemptible: dict[str, list[Running]] = {}
        # Those that may not be victims in this cycle (settled: the platform's jobs STARTING or RECOVERING, runs mixed
        # load shrank), per type: a waiting workload's reason names them when they are what it could not preempt.
        self.settled: dict[str, list[Running]] = {}
        for running in running_by_id.values():
            if running.workload.preemptible:
                (self.settled if running.settled else self.preemptible).setdefault(
                    running.accelerator_type, []).append(running)
        by_type: dict[str, list[_Node]] = {}
        for node in nodes.values():
            by_type.setdefault(node.accelerator_type, []).append(node)
        self.pools = {accelerator_type: _Pool(members) for accelerator_type, members in by_type.items()}
        self._empty = _Pool([])
        self._victims: dict[str, _Victims] = {}
        self.reserved: dict[str, tuple[str, float]] = {}  # type -> (the workload holding the reservation, devices)
        self.hold: tuple[str, str, float, str] | None = None  # the reservation's quota: (queue, type, amount, holder)

    def pool(self, accelerator_type: str) -> _Pool:
        return self.pools.get(accelerator_type, self._empty)

    def hold_fixed(self, workload: Workload, accelerator_type: str, amount: float) -> None:
        """Count `amount` more of the type in use by `workload`, in its queue's non-preemptible usage if it is so."""
        if not workload.preemptible:
            key = (workload.cluster_queue, accelerator_type)
            self.fixed[key] = self.fixed.get(key, 0.0) + amount
            self.fixed_by_type[accelerator_type] = self.fixed_by_type.get(accelerator_type, 0.0) + amount

    def fixed_refusal(self, workload: Workload, accelerator_type: str, amount: float) -> str:
        """Why `amount` more of the type would take a non-preemptible workload's queue past its nominal quota in
        non-preemptible usage (quota.non_preemptible_refusal), or all non-preemptible usage of the type past its
        cap (quota.reserved_capacity_refusal), or "" (always "" for a preemptible workload)."""
        if workload.preemptible:
            return ""
        queue = workload.cluster_queue
        why = non_preemptible_refusal(queue, accelerator_type, self.fixed.get((queue, accelerator_type), 0.0),
                                      amount, self.ledger.quota(queue, accelerator_type).nominal)
        cap = self.caps.get(accelerator_type)
        if why or cap is None:
            return why
        return reserved_capacity_refusal(accelerator_type, self.fixed_by_type.get(accelerator_type, 0.0), amount, cap)

    def versions(self, types) -> tuple:
        """What changes whenever anything a workload's admission or preemption depends on changes, for its types:
        the quota usage of the type (any queue) and its devices."""
        type_version, pools, empty = self.ledger.type_version, self.pools, self._empty
        return tuple([(type_version[t], pools.get(t, empty).version) for t in types])

    def victims(self, accelerator_type: str) -> _Victims:
        victims = self._victims.get(accelerator_type)
        if victims is None:
            victims = self._victims[accelerator_type] = _Victims(self.preemptible.get(accelerator_type, ()),
                                                                 self.ledger.queues, self.amounts)
        return victims


class _Victims:
    """Workloads of one type that may be preempted (running before the cycle, preemptible), sorted as victims
    are chosen, with what releasing all of them per (priority, queue) would give back."""

    def __init__(self, running, known_queues, amounts: dict[str, tuple[float, float, int]]):
        # Sorted by (priority, work since the last checkpoint, id): stable sorts from the last key to the first give
        # that order, faster than one sort on tuples.
        self.order = sorted(running, key=attrgetter("workload.id"))
        self.order.sort(key=attrgetter("work_since_checkpoint_s"))
        self.order.sort(key=attrgetter("workload.priority"))
        self.eligible_cache: dict[tuple[str, frozenset[str]], frozenset[str]] = {}
        self.start = 0
        self.priorities = [r.workload.priority for r in self.order]
        # queue -> the indexes in order of its victims not yet taken (a taken one leaves at once, so a trial does
        # not walk past the victims of earlier trials again)
        self.positions: dict[str, list[int]] = {}
        self.index: dict[str, int] = {}
        self.totals: dict[int, dict[str, list[float]]] = {}  # priority -> queue -> [usage, shares, entries, n]
        self.amounts = amounts  # id -> what it adds to its totals (_State.amounts)
        positions, indexes, totals = self.positions, self.index, self.totals
        for index, r in enumerate(self.order):
            workload = r.workload
            queue = workload.cluster_queue
            positions.setdefault(queue, []).append(index)
            indexes[workload.id] = index
            amount = amounts[workload.id]
            per_queue = totals.get(workload.priority)
            if per_queue is None:
                per_queue = totals[workload.priority] = {}
            total = per_queue.get(queue)
            if total is None:
                total = per_queue[queue] = [0.0, 0.0, 0.0, 0.0]
            total[3] += 1.0
            total[0] += amount[0]
            total[1] += amount[1]
            total[2] += amount[2]
        self.unknown = frozenset(queue for queue in self.positions if queue not in known_queues)  # no quota
        self.cache: dict[tuple, tuple[dict[str, float], float, float, float]] = {}
        self.released: dict[str, tuple[float, float, list]] = {}  # id -> release_of(...), made when first needed
        self.walks: dict[tuple, tuple[int, tuple, int]] = {}  # _room_after_all's failed walks
        self.spared: set[str] = set()  # walked by a successful trial and put back whole (_plan_preemption)

    def release_of(self, running: Running, nodes: dict[str, _Node]) -> tuple[float, float, list]:
        """What a trial taking `running` subtracts from its queue's usage, in the trial's steps (shrunk to its
        minimum first when elastic, then stopped), and the device entries it frees per schedulable node."""
        victim = running.workload
        if len(running.workers) > victim.workers_min:
            steps = (-(len(running.workers) - victim.workers_min) * victim.devices_per_worker,
                     -(victim.workers_min * victim.devices_per_worker))
        else:
            steps = (-running.usage, 0.0)
        per_node: dict[_Node, list] = {}  # node -> [whole devices, [(index, share) of the fractional ones]]
        for worker in running.workers:
            node = nodes.get(worker.node)  # (a node the snapshot no longer lists frees nothing)
            if node is not None and node.schedulable:
                freed = per_node.get(node)
                if freed is None:
                    freed = per_node[node] = [0, []]
                size = len(node.device_free)
                for index, share in worker.taken:
                    if index >= size:  # a node that shrank since: its lost devices free nothing (as in _State)
                        continue
                    if share >= 1.0:
                        freed[0] += 1
                    else:
                        freed[1].append((index, share))
        entry = self.released[victim.id] = (steps[0], steps[1], [(n, w, f) for n, (w, f) in per_node.items()])
        return entry

    def eligible(self, own: str, borrowing: frozenset[str], within: bool = True,
                 others: bool = True) -> frozenset[str]:
        """The queues a preemptor of queue `own` may take lower-priority victims from: its own (unless `within` is
        False: its policy says Never), and (unless `others` is False) those above their nominal quota (`borrowing`)
        or without quota."""
        key = (own, borrowing, within, others)
        hit = self.eligible_cache.get(key)
        if hit is None:
            hit = self.eligible_cache[key] = frozenset(
                queue for queue in self.positions
                if (within and queue == own) or (others and queue != own
                                                 and (queue in borrowing or queue in self.unknown)))
        return hit

    def gone(self, running: Running) -> None:
        usage, shares, entries = self.amounts[running.workload.id]
        total = self.totals[running.workload.priority][running.workload.cluster_queue]
        total[3] -= 1.0
        total[0] -= usage
        total[1] -= shares
        total[2] -= entries
        self.cache.clear()
        positions = self.positions[running.workload.cluster_queue]
        at = bisect_left(positions, self.index[running.workload.id])
        del positions[at]

    def releasable(self, priority: int, reclaim: set[str],
                   queues: frozenset[str]) -> tuple[dict[str, float], float, float, float]:
        key = (priority, frozenset(reclaim), queues)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._releasable(priority, reclaim, queues)
        return hit

    def _releasable(self, priority: int, reclaim: set[str],
                    queues: frozenset[str]) -> tuple[dict[str, float], float, float, float]:
        usage: dict[str, float] = defaultdict(float)
        shares = entries = victims = 0.0
        for victim_priority, per_queue in self.totals.items():
            for queue, (amount, share, count, number) in per_queue.items():
                if (victim_priority < priority and queue in queues) or queue in reclaim:
                    usage[queue] += amount
                    shares += share
                    entries += count
                    victims += number
        return usage, shares, entries, victims

    def candidates(self, priority: int, reclaim: set[str], already: set[str], live: set[str]):
        """Victims in the order they are taken: lower priority ones of the queues in `live` (the preemptor's
        own and those borrowing), then, from the priority boundary on, those of the queues whose borrowed
        quota is reclaimed. The caller removes a queue from `live` once it no longer borrows: nothing more is
        drawn from it."""
        order = self.order
        while self.start < len(order) and order[self.start].workload.id in already:
            self.start += 1
        boundary = max(self.start, bisect_left(self.priorities, priority))  # lower priority before it
        lower = []
        for queue in live:
            positions = self.positions.get(queue)
            if positions:
                low, high = bisect_left(positions, self.start), bisect_left(positions, boundary)
                if low < high:
                    lower.append((queue, islice(positions, low, high)))
        yield from self._merged(lower, live, already)
        tails = []  # from the boundary on, only workloads of reclaimed queues are candidates
        for queue in reclaim:
            positions = self.positions.get(queue)
            if positions:
                at = bisect_left(positions, boundary)
                if at < len(positions):
                    tails.append((queue, islice(positions, at, None)))
        yield from self._merged(tails, live, already)

    def _merged(self, lists, live: set[str], already: set[str]):
        """The running workloads at the merged indexes of per-queue index lists, skipping the rest of a list
        whose queue left `live`."""
        heap = []
        for queue, indexes in lists:
            first = next(indexes, None)
            if first is not None:
                heap.append((first, queue, indexes))
        heapq.heapify(heap)
        order = self.order
        while heap:
            index, queue, indexes = heap[0]
            if queue not in live:
                heapq.heappop(heap)
                continue
            following = next(indexes, None)
            if following is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (following, queue, indexes))
            running = order[index]
            if running.workload.id not in already:
                yield running


class _Undo:
    """Changes made by a preemption trial, to be undone when the trial makes no room."""

    def __init__(self, state: _State):
        self.state = state
        self.devices: dict[str, list[float]] = {}
        self.usage: dict[tuple[str, str], float] = {}
        self.running: dict[str, Running | None] = {}

    def release(self, workers) -> None:
        """Free the devices of `workers` (a victim stopped or shrunk in the trial)."""
        for free, index, share in self._entries(workers):
            # (a share >= 1 gives 1.0, as min(1.0, free + share) does: free is never below 0.0)
            free[index] = 1.0 if share >= 1.0 else min(1.0, free[index] + share)
        self._refresh(workers)

    def take(self, workers) -> None:
        """Occupy the devices of `workers` again (a victim put back), as _State counts a running workload's."""
        for free, index, share in self._entries(workers):
            free[index] = 0.0 if share >= 1.0 else max(0.0, free[index] - share)
        self._refresh(workers)

    def _entries(self, workers):
        """(the node's device_free, device index, share) of each device entry of `workers` on a node the state
        counts, the node's devices saved for undo first. A node the snapshot no longer lists, or device indexes
        beyond a node's current size (it shrank since), hold nothing, as in _State."""
        nodes, saved = self.state.nodes, self.devices
        for worker in workers:
            node = nodes.get(worker.node)
            if node is None:
                continue
            free = node.device_free
            if node.name not in saved:
                saved[node.name] = free[:]
            size = len(free)
            for index, share in worker.taken:
                if index < size:
                    yield free, index, share

    def _refresh(self, workers) -> None:
        nodes = self.state.nodes
        for worker in workers:
            node = nodes.get(worker.node)
            if node is not None:
                node.pool.refresh(node)

    def add(self, queue: str, accelerator_type: str, amount: float) -> None:
        key = (queue, accelerator_type)
        if key not in self.usage:
            self.usage[key] = self.state.ledger.usage[key]
        self.state.ledger.add(queue, accelerator_type, amount)

    def set_running(self, workload_id: str, running: Running | None) -> None:
        if workload_id not in self.running:
            self.running[workload_id] = self.state.running.get(workload_id)
        if running is None:
            del self.state.running[workload_id]
        else:
            self.state.running[workload_id] = running
            if len(running.workers) < running.workload.workers_max:
                self.state.elastic.add(workload_id)

    def undo(self) -> None:
        state = self.state
        for name, free in self.devices.items():
            node = state.nodes[name]
            node.device_free[:] = free
            node.pool.refresh(node)
        for (queue, accelerator_type), value in self.usage.items():
            state.ledger.set(queue, accelerator_type, value)
        for workload_id, running in self.running.items():
            if running is None:
                state.running.pop(workload_id, None)
            else:
                state.running[workload_id] = running


def _place_gang(pool: _Pool, workers: int, devices: float) -> tuple[WorkerPlacement, ...] | None:
    """placement.place_gang(nodes, workers=..., devices=..., score=best_fit, leaf_group_aware=True), indexed."""
    if workers <= 0:
        return ()
    pool.shape(devices)
    if pool.total[devices] < workers:
        return None  # every worker placed takes exactly one slot: the gang cannot fit anywhere
    ranked = pool.rank(devices)
    at = bisect_left(ranked, workers * pool.span)  # the group with the fewest slots >= workers, ties by name
    if at < len(ranked):
        placed = []
        members = pool.groups[pool.names[ranked[at] % pool.span]]
        # Best fit, ties by name: members are in name order, so by position. slots > 0: fits(devices) (for whole
        # devices, slots = whole // divisor: whole >= divisor, read without the dict). A heap of the fitting
        # nodes: a worker placed changes only the key (or the fit) of the node it went to.
        divisor = pool.info[devices][0]
        if divisor:
            fitting = [(node.free - devices, i) for i, node in enumerate(members) if node.whole >= divisor]
        else:
            fitting = [(node.free - devices, i) for i, node in enumerate(members) if node.slots[devices] > 0]
        if workers == 1 and fitting:  # the heap's first pop, without the heap
            node = members[min(fitting)[1]]
            return (WorkerPlacement(node=node.name, taken=node.take(devices)),)
        heapq.heapify(fitting)
        for _ in range(workers):
            if not fitting:  # cannot happen (slots >= workers); roll back as place_gang does
                for node_name, taken in placed:
                    _give_back(pool, node_name, taken)
                placed = None
                break
            at = heapq.heappop(fitting)[1]
            node = members[at]
            placed.append((node.name, node.take(devices)))
            if node.slots[devices] > 0:
                heapq.heappush(fitting, (node.free - devices, at))
        if placed is not None:
            return tuple(WorkerPlacement(node=name, taken=taken) for name, taken in placed)
    placed = []
    for name in _most_slots_first(pool, ranked, workers):
        # Only the nodes with a slot now (taking from one node leaves the others' slots as they are).
        for node in [node for node in pool.groups[name] if node.slots[devices] > 0]:
            while len(placed) < workers and node.slots[devices] > 0:  # slots > 0: fits(devices)
                placed.append(WorkerPlacement(node=node.name, taken=node.take(devices)))
            if len(placed) == workers:
                return tuple(placed)
    for worker in placed:  # cannot happen either (the type has enough slots)
        _give_back(pool, worker.node, worker.taken)
    return None


def _most_slots_first(pool: _Pool, ranked: list[int], workers: int) -> list[str]:
    """The groups in the order (most slots first, ties by name) that place_gang fills them when no single group
    holds the gang, up to the first whose slots, with those of the groups before it, reach `workers` (each
    group is filled up before the next is touched, so no later one is reached). `ranked` is sorted ascending."""
    chosen: list[str] = []
    total = 0
    end = len(ranked)
    span, names = pool.span, pool.names
    while end > 0 and total < workers:
        count = ranked[end - 1] // span
        start = bisect_left(ranked, count * span, 0, end)  # the run of groups with `count` slots, by name
        for value in ranked[start:end]:
            chosen.append(names[value % span])
            total += count
            if total >= workers:
                break
        end = start
    return chosen


def _give_back(pool: _Pool, name: str, taken) -> None:
    node = next(node for node in pool.nodes if node.name == name)
    for index, share in taken:
        node.device_free[index] = min(1.0, node.device_free[index] + share)
    pool.refresh(node)


def schedule(snapshot: Snapshot) -> CycleResult:
    # The cycle allocates many small objects and creates no reference cycles worth collecting while it
    # runs: pause the cyclic garbage collector (it would walk the whole snapshot again and again).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _schedule(snapshot)
    finally:
        if enabled:
            gc.enable()


def _schedule(snapshot: Snapshot) -> CycleResult:
    state = _State(snapshot)
    _refuse_duplicate_ids(snapshot, state.running)
    result = CycleResult()
    order = _by_priority_arrival_id(snapshot.pending)
    preempted: set[str] = set()
    reservation_made = False
    positions: dict[str, int] = defaultdict(int)
    waiting_types: set[str] = set()
    # Workloads that could neither start nor preempt, by what that depends on (queue, types in order, shape,
    # priority, preemptible) -> (state.versions(types) then, the reasons). Failing changes nothing (trials are
    # undone), so while the versions are the same the next such workload fails for the same reasons: no need to try
    # again.
    failed: dict[tuple, tuple[tuple, list[str]]] = {}
    could_ever: dict[tuple, tuple[str, ...]] = {}  # per such kind: _could_ever_run_on (fixed within a cycle)

    for workload in order:
        if workload.cluster_queue not in state.ledger.queues:
            positions[workload.cluster_queue] += 1
            result.waiting.append(Wait(workload.id, positions[workload.cluster_queue],
                                       f"cluster queue {workload.cluster_queue} does not exist"))
            continue
        if not all(_MIN_SIZE <= size < _INF for size in (workload.devices_per_worker, *(z for _, z in workload.sizes))):
            # (one such workload must not stop the whole cycle)
            positions[workload.cluster_queue] += 1
            result.waiting.append(Wait(workload.id, positions[workload.cluster_queue], _size_refusal(workload)))
            continue
        types = tuple(snapshot.type_preference.get(workload.id, workload.accepted_types))
        kind = (workload.cluster_queue, types, workload.devices_per_worker, workload.workers_min, workload.priority,
                workload.preemptible, workload.sizes)
        seen = failed.get(kind)
        if seen is not None and seen[0] == state.versions(types):
            plan, reasons = None, seen[1]
        else:
            admitted, reasons = _try_admit(state, workload, types)
            if admitted is not None:
                result.admitted.append(admitted)
                continue
            plan = _plan_preemption(state, workload, types, preempted)
            if plan is None:
                if state.settled:
                    reasons = _with_settled_notes(state, workload, types, reasons)
                failed[kind] = (state.versions(types), reasons)
        if plan is not None:
            victims, shrinks, accelerator_type = plan
            result.preempted.extend(victims)
            result.shrunk.extend(shrinks)
            preempted.update(v.workload_id for v in victims)
            preempted.update(s.workload_id for s in shrinks)
            names = ", ".join([v.workload_id for v in victims] + [f"{s.workload_id} (shrunk)" for s in shrinks])
            reason = f"waiting for {names} to checkpoint and release {accelerator_type} {units_of(accelerator_type)}"
            # Position 0: it holds its admission (the platform admits it now), so it is nobody's place in the queue
            # (counted, it left a gap: the job behind it was "position 2" with nobody at 1).
            result.waiting.append(Wait(workload.id, 0, reason, reserved=True,
                                       held=_held_admission(state, workload, accelerator_type, reason)))
            waiting_types.update(types)
            continue
        positions[workload.cluster_queue] += 1
        position = positions[workload.cluster_queue]
        reserved = ""
        if not reservation_made:
            reserved = _reserve(state, workload, types)
            reservation_made = reserved
        could = could_ever.get(kind)
        if could is None:
            could = could_ever[kind] = _could_ever_run_on(state, workload, types)
        waiting_types.update(could)
        reason = "; ".join(reasons) or "no accepted accelerator type"
        if reserved:
            reason += f" (holds a reservation: later workloads cannot take the {units_of(reserved)} it needs)"
        result.waiting.append(Wait(workload.id, position, reason, reserved=bool(reserved)))

    _grow_elastic(state, result, preempted, waiting_types)
    return result


def _with_settled_notes(state: _State, workload: Workload, types, reasons: list[str]) -> list[str]:
    """`reasons` (one per type, in order) with, on each type, the running workloads this one would have been allowed
    to preempt (preemptible, of lower priority, in its own queue or a borrowing queue of its cohort, as its queue's
    policies allow) but that are settled, so no victim in this cycle. Before, a non-preemptible job whose queue's
    quota a lower-priority job still STARTING used was told only that "its cohort lends only 0" (true, and not what
    kept it waiting: once that job runs, it is preempted for it)."""
    if len(reasons) != len(types):
        return reasons
    ledger, own = state.ledger, workload.cluster_queue
    spec = ledger.queues[own]
    within, others = spec.preemption_within_queue != "Never", spec.reclaim_within_cohort != "Never"
    noted = list(reasons)
    members = ledger.members(own)
    for at, accelerator_type in enumerate(types):
        settled = state.settled.get(accelerator_type)
        if not settled or "can never" in reasons[at]:
            continue
        sized = workload.on(accelerator_type)
        if state.fixed_refusal(sized, accelerator_type, sized.demand()):
            continue  # a non-preemptible rule refuses it: preempting preemptible work would not help
        borrowing = ledger.borrowing(accelerator_type) if others else frozenset()
        blockers = sorted([r for r in settled if r.workload.priority < workload.priority and (
            (within and r.workload.cluster_queue == own)
            or (r.workload.cluster_queue != own and r.workload.cluster_queue in members
                and r.workload.cluster_queue in borrowing))], key=attrgetter("workload.id"))
        if not blockers:
            continue
        used = sum(r.usage for r in blockers)
        names = ", ".join(r.workload.id for r in blockers[:5]) + (f" and {len(blockers) - 5} more"
                                                                  if len(blockers) > 5 else "")
        one = len(blockers) == 1
        noted[at] += (f"; lower-priority {names} ({used:g} {accelerator_type} {units_of(accelerator_type)}), which it "
                      f"may preempt, {'is' if one else 'are'} starting, recovering or shrinking now: no victim until "
                      f"{'it settles' if one else 'they settle'}")
    return noted


def _refuse_duplicate_ids(snapshot: Snapshot, running_by_id: dict[str, Running]) -> None:
    """ValueError naming the id when two workloads of the snapshot share one (pending or running, or one id both
    pending and running): the cycle keys its state, decisions and the platform's rows by id, and with a duplicate it
    admitted, preempted or counted one workload for the other. The platform's ids are primary keys, but the core is
    public. Set sizes only (the cycle's _State has already keyed the running ones by id); the search for the id runs
    only when there is one."""
    pending = snapshot.pending
    ids = set(map(_ID, pending))
    if len(running_by_id) == len(snapshot.running) and len(ids) == len(pending) and ids.isdisjoint(running_by_id):
        return
    running = Counter([r.workload.id for r in snapshot.running])
    waiting = Counter([workload.id for workload in pending])
    for workload_id in chain(running, waiting):
        times_running, times_pending = running[workload_id], waiting[workload_id]
        if times_running + times_pending > 1:
            where = "both running and pending" if times_running and times_pending else \
                f"{'running' if times_running else 'pending'} {times_running + times_pending} times"
            raise ValueError(f"duplicate workload id {workload_id!r} in the snapshot ({where}): each workload must "
                             "have its own id")


def _could_ever_run_on(state: _State, workload: Workload, types) -> tuple[str, ...]:
    """The accepted types a waiting workload could run on some day: its queue could take its demand there (nominal
    quota plus the most its cohort could lend) and the type's schedulable nodes could hold its gang with nothing
    running. Elastic growth keeps off these types (someone waits for them), not off the others: a workload that can
    never run there held idle capacity back for good (found by QA, 2026-11-28). A non-preemptible workload never
    borrows, so its ceiling is its queue's nominal quota (and the type's non-preemptible cap, when there is one)."""
    ledger, queue = state.ledger, workload.cluster_queue
    could = []
    for accelerator_type in types:
        sized = workload.on(accelerator_type)
        ceiling = ledger.ceiling(queue, accelerator_type) if workload.preemptible else \
            min(ledger.quota(queue, accelerator_type).nominal, state.caps.get(accelerator_type, _INF))
        if sized.demand() > ceiling + EPS:
            continue
        if state.pool(accelerator_type).most_slots(sized.devices_per_worker) < sized.workers_min:
            continue
        could.append(accelerator_type)
    return tuple(could)


def _size_refusal(workload: Workload) -> str:
    sizes = [("", workload.devices_per_worker), *((f" on {slug}", size) for slug, size in workload.sizes)]
    bad = ", ".join(f"{size:g}{where}" for where, size in sizes if not _MIN_SIZE <= size < _INF)
    return (f"asks for {bad} devices (CPU cores on cpu) per worker: a worker must ask for at least {_MIN_SIZE:g} "
            "(and a finite amount)")


def _by_priority_arrival_id(items, workload: str = "") -> list:
    """`items` (workloads, or objects with the workload at attribute path `workload`, e.g. "workload.") sorted
    by (-priority, arrival, id): as sorted() on that tuple, but by stable sorts from the last key to the first
    (reverse=True keeps ties in order), faster."""
    ordered = sorted(items, key=attrgetter(workload + "id"))
    ordered.sort(key=attrgetter(workload + "arrival"))
    ordered.sort(key=attrgetter(workload + "priority"), reverse=True)
    return ordered


def _try_admit(state: _State, pending: Workload, types) -> tuple[Admit | None, list[str]]:
    reasons = []
    ledger, queue = state.ledger, pending.cluster_queue
    for accelerator_type in types:
        workload = pending.on(accelerator_type)  # its size on this type
        demand = workload.demand()
        check = ledger.check(queue, accelerator_type, demand)
        why = state.fixed_refusal(workload, accelerator_type, demand)
        if why:  # (said even when the cohort lends too little: more lending would not help it)
            check = QuotaCheck(False, 0.0, why)
        if not check.ok:
            reasons.append(check.reason if why else check.reason + hold_note(state.ledger, state.hold, queue,
                                                                             accelerator_type, demand))
            continue
        workers = _place_gang(state.pool(accelerator_type), workload.workers_min, workload.devices_per_worker)
        if workers is None:
            reasons.append(_capacity_reason(state, workload, accelerator_type))
            continue
        ledger.add_new(queue, accelerator_type, demand)
        state.hold_fixed(workload, accelerator_type, demand)
        state.running[workload.id] = Running(workload, accelerator_type, workers)
        if len(workers) < workload.workers_max:
            state.elastic.add(workload.id)
        nodes = state.nodes
        if len(workers) == 1:
            groups = [nodes[workers[0].node].leaf_group]
        else:
            groups = sorted({nodes[w.node].leaf_group for w in workers})
        why = f"{workload.workers_min} x {workload.devices_per_worker:g} {accelerator_type} in leaf group(s) " \
              f"{', '.join(groups)}; {check.reason}"
        if accelerator_type != types[0]:
            why += f" (fallback: {types[0]} was not available)"
        return Admit(workload.id, accelerator_type, workers, check.borrowed, why), reasons
    return None, reasons


def hold_note(ledger: _Ledger, hold: tuple[str, str, float, str] | None, queue: str, accelerator_type: str,
              amount: float) -> str:
    """Why a quota refusal of `amount` more for `queue` is the reservation's doing, or "": the quota `hold` sets aside
    ((its queue, type, amount, the waiting workload)) counts in the refusal's usage figure though no workload uses
    it yet (before, a job behind a reservation read "uses 16 of 16 nominal" of a queue whose workloads used 8; found
    by QA). Said only when the check would pass without the hold (a review found it added to refusals it had no part
    in)."""
    if hold is None or hold[1] != accelerator_type:
        return ""
    held_queue, _, held, holder = hold
    if held_queue != queue and held_queue not in ledger.members(queue):
        return ""
    key = (held_queue, accelerator_type)
    after = ledger.what_if
    after.usage = _UsageAfter(ledger.usage, {key: ledger.usage[key] - held})
    if not QuotaLedger.check(after, queue, accelerator_type, amount).ok:
        return ""
    return f" ({held:g} {accelerator_type} of {held_queue}'s quota set aside for {holder}, which waits ahead of it)"


def _held_admission(state: _State, workload: Workload, accelerator_type: str, reason: str) -> Admit:
    """What `_plan_preemption` set aside for the preemptor, as the admission it becomes once the victims are gone."""
    held = state.running[workload.id]
    borrowed = min(held.usage, state.ledger.borrowed(workload.cluster_queue, accelerator_type))
    return Admit(workload.id, accelerator_type, held.workers, borrowed, reason)


def units_of(accelerator_type: str) -> str:
    """What a node's slots are, in reasons: CPU cores on the CPU pool, devices elsewhere (before, a CPU job was told
    of "2 devices"; found by QA)."""
    return "CPU cores" if accelerator_type == "cpu" else "devices"


def _nodes_note(schedulable: int, nodes: int) -> str:
    """"2 nodes", "1 node (1 more cordoned or down)": a job waiting while a node was cordoned read "0 devices free on
    1 nodes", and the cluster page showed that node's 8 free devices (QA)."""
    note = f"{schedulable} node{'' if schedulable == 1 else 's'}"
    return note + (f" ({nodes - schedulable} more cordoned or down)" if nodes > schedulable else "")


def _capacity_reason(state: _State, workload: Workload, accelerator_type: str) -> str:
    pool = state.pool(accelerator_type)
    if not pool.sched:
        return f"no schedulable {accelerator_type} nodes"
    most = pool.most_slots(workload.devices_per_worker)
    if most < workload.workers_min:
        return (f"{accelerator_type} nodes can never hold it: its {len(pool.sched)} schedulable nodes (the largest "
                f"with {max(node.capacity for node in pool.sched)} {units_of(accelerator_type)}) would hold at most "
                f"{most} workers of "
                f"{workload.devices_per_worker:g} even with nothing running, it needs {workload.workers_min}")
    free = pool.free_total()
    reason = (f"not enough free {accelerator_type}: {free:g} {units_of(accelerator_type)} free on "
              f"{_nodes_note(len(pool.sched), len(pool.nodes))}, needs "
              f"{workload.workers_min} x {workload.devices_per_worker:g} placed all at once")
    held = state.reserved.get(accelerator_type)
    if held is not None:  # "0 devices free" read as a full cluster while devices stood idle, set aside (QA)
        reason += f" ({held[1]:g} more set aside for {held[0]}, which waits ahead of it)"
    return reason


def _plan_preemption(state: _State, pending: Workload, types, already: set[str]):
    """Victims that make `pending` fit, or None. On success the state already excludes them and
    holds the preemptor's devices and quota, so no later workload can take them."""
    ledger = state.ledger
    for accelerator_type in types:
        workload = pending.on(accelerator_type)  # its size on this type
        borrowing = ledger.borrowing(accelerator_type)
        own = workload.cluster_queue
        spec = ledger.queues[own]
        reclaim: set[str] = set()
        if spec.reclaim_within_cohort == "Any" and _within_nominal(state, workload, accelerator_type):
            reclaim = {queue for queue in ledger.members(own) if queue != own and queue in borrowing}
        pool_victims = state.victims(accelerator_type)
        queues = pool_victims.eligible(own, borrowing, spec.preemption_within_queue != "Never",
                                       spec.reclaim_within_cohort != "Never")
        if not _could_fit(state, workload, accelerator_type, pool_victims, reclaim, queues):
            continue  # no candidates, or even every candidate would not make room: preempt nothing
        live = set(queues | reclaim)
        if not _room_after_all(state, workload, accelerator_type, pool_victims, reclaim, already, set(live)):
            continue  # the trial below would take every victim it may and still not make room: it preempts nothing
        candidates = pool_victims.candidates(workload.priority, reclaim, already, live)
        first = next(candidates, None)
        if first is None:
            continue
        undo = _Undo(state)
        victims, shrinks, gone = [], [], []
        fitted = False
        known, usage, new = ledger.queues, ledger.usage, ledger.new_usage
        for running in chain((first,), candidates):
            victim = running.workload
            queue = victim.cluster_queue
            # Another queue whose running work uses no more than its nominal quota of the type now (a queue unknown
            # to the ledger has no quota to protect; new_usage is not running work):
            if queue != workload.cluster_queue and queue in known and usage[(queue, accelerator_type)] \
                    - new.get((queue, accelerator_type), 0.0) \
                    - known[queue].quotas.get(accelerator_type, NO_QUOTA).nominal <= EPS:
                live.discard(queue)  # and, being no longer borrowing, the rest of it
                continue  # another queue within its nominal quota keeps it (see rule 7)
            if victim.id in pool_victims.spared:
                break  # an earlier trial put it back: taking anyone ranked after it would break the victim order
            gone.append(running)
            kind = _preemption_kind(victim, workload)
            if len(running.workers) > victim.workers_min:  # shrink an elastic victim before stopping it
                released = running.workers[victim.workers_min:]
                undo.release(released)
                undo.add(victim.cluster_queue, accelerator_type, -len(released) * victim.devices_per_worker)
                undo.set_running(victim.id, Running(victim, accelerator_type, running.workers[:victim.workers_min],
                                                    running.work_since_checkpoint_s))
                shrinks.append(Shrink(victim.id, victim.workers_min, tuple(released), workload.id,
                                      f"shrunk to {victim.workers_min} workers for {workload.id} ({kind})"))
                if _fits(state, workload, accelerator_type):
                    fitted = True
                    break
            current = state.running[victim.id]
            undo.release(current.workers)
            undo.add(victim.cluster_queue, accelerator_type, -current.usage)
            undo.set_running(victim.id, None)
            if shrinks:
                shrinks = [s for s in shrinks if s.workload_id != victim.id]
            victims.append(Preempt(victim.id, workload.id,
                                   f"preempted for {workload.id} ({kind}; {running.work_since_checkpoint_s:g} s "
                                   "since its last checkpoint)"))
            if _fits(state, workload, accelerator_type):
                fitted = True
                break
        if not fitted:
            undo.undo()
            continue
        victims, kept_shrunk, put_back = _add_back(state, workload, accelerator_type, undo, victims, gone,
                                                   last_shrunk=bool(shrinks))
        victims, shrinks, kept_whole = _keep_workers(state, workload, accelerator_type, undo, victims,
                                                     kept_shrunk + shrinks, gone)
        put_back |= kept_whole
        # The ones put back whole stay candidates, spared: a later trial on this type that reaches one stops there
        # and preempts nothing on it, so it neither walks them all again nor takes a victim ranked after one of them.
        pool_victims.spared.update(put_back)
        gone = [r for r in gone if r.workload.id not in put_back]
        # Hold the freed devices and quota for the preemptor until the victims are gone.
        workers = _place_gang(state.pool(accelerator_type), workload.workers_min, workload.devices_per_worker)
        ledger.add_new(workload.cluster_queue, accelerator_type, workload.demand())
        state.hold_fixed(workload, accelerator_type, workload.demand())
        state.running[workload.id] = Running(workload, accelerator_type, workers)
        if len(workers) < workload.workers_max:
            state.elastic.add(workload.id)
        for running in gone:
            pool_victims.gone(running)
        return victims, shrinks, accelerator_type
    return None


def _add_back(state: _State, workload: Workload, accelerator_type: str, undo: _Undo, victims: list[Preempt],
              gone: list[Running], last_shrunk: bool) -> tuple[list[Preempt], list[Shrink], set[str]]:
    """The victims the preemptor still needs: each one stopped before the one that made it fit, from the last to the
    first, is put back (its devices and quota taken again) and stays running if the preemptor still fits without it
    (Kueue's minimal preemption); an elastic one that cannot stay whole stays at its minimum if that is enough (it is
    shrunk, not stopped). The walk releases victims wherever they run until some node has room, so for one 8-device
    worker it could stop dozens of small jobs on other nodes (found by the scale benchmark's steady cycles: 35
    victims holding 54 devices for an 8-device gang, thousands preempted per cycle on 100k accelerators with ten
    arrivals). Those kept run on: the lowest priority and least work since a checkpoint are still stopped first.
    Returns the victims still stopped, the ones now only shrunk (in walk order) and the ids of those put back whole."""
    stopped = {p.workload_id for p in victims}
    walked = [running for running in gone if running.workload.id in stopped]
    if not last_shrunk:
        walked = walked[:-1]  # the one that made it fit is needed
    kept: set[str] = set()  # put back, whole or at the minimum
    shrunk: list[Shrink] = []
    for running in reversed(walked):
        victim = running.workload
        for workers in (running.workers, running.workers[:victim.workers_min]):
            usage = len(workers) * victim.devices_per_worker
            undo.take(workers)
            undo.add(victim.cluster_queue, accelerator_type, usage)
            undo.set_running(victim.id, Running(victim, accelerator_type, workers, running.work_since_checkpoint_s)
                             if workers is not running.workers else running)
            if _fits(state, workload, accelerator_type):
                kept.add(victim.id)
                if workers is not running.workers:
                    shrunk.append(Shrink(victim.id, victim.workers_min, running.workers[victim.workers_min:],
                                         workload.id, f"shrunk to {victim.workers_min} workers for {workload.id} "
                                                      f"({_preemption_kind(victim, workload)})"))
                break
            undo.release(workers)
            undo.add(victim.cluster_queue, accelerator_type, -usage)
            undo.set_running(victim.id, None)
            if len(running.workers) <= victim.workers_min:
                break  # not elastic above its minimum: nothing smaller to try
    shrunk.reverse()
    whole = kept - {s.workload_id for s in shrunk}
    return ([p for p in victims if p.workload_id not in kept] if kept else victims), shrunk, whole


def _keep_workers(state: _State, workload: Workload, accelerator_type: str, undo: _Undo, victims: list[Preempt],
                  shrinks: list[Shrink], gone: list[Running]) -> tuple[list[Preempt], list[Shrink], set[str]]:
    """Each elastic victim the trial shrank or stopped keeps every one of its workers the preemptor still fits beside,
    any of them, tried in the order it lists them (the victims ranked last first, as _add_back); one stopped that keeps
    at least its minimum is shrunk instead (issue 3: shrunk instead of preempted when shrinking suffices). Before, a
    shrink gave back its last workers: a victim whose first worker sat where the preemptor needed room was stopped
    whole, and a shrunk one gave back all its later workers once the first of them was in the way. A victim the
    preemptor fits beside whole was put back by _add_back.
    Returns the victims still stopped, the shrinks (in walk order) and the ids of any victim that keeps every worker."""
    stopped = {p.workload_id for p in victims}
    shrunk_to = {s.workload_id: s.to_workers for s in shrinks}
    decided: dict[str, Shrink | None] = {}  # id -> its shrink, or None: it keeps every worker
    for running in reversed(gone):
        victim, workers = running.workload, running.workers
        if victim.id in shrunk_to:
            keep = [i < shrunk_to[victim.id] for i in range(len(workers))]  # the trial shrank it to a prefix
        elif victim.id in stopped and len(workers) > victim.workers_min:
            keep = [False] * len(workers)
        else:
            continue
        # A stopped one that keeps too few tries again from its next worker on: the workers kept first may be the
        # ones in the preemptor's way while the rest would have been enough (before, one of 4 devices on one node was
        # kept, its two others on a second node could not be, and it was stopped though keeping those two and giving
        # the first back let the preemptor fit; found by QA).
        for start in range(len(workers) if victim.id in stopped else 1):
            for position in chain(range(start, len(workers)), range(start)):
                worker = workers[position]
                if keep[position]:
                    continue
                before = state.running.get(victim.id)
                undo.take((worker,))
                undo.add(victim.cluster_queue, accelerator_type, victim.devices_per_worker)
                undo.set_running(victim.id, Running(victim, accelerator_type, tuple(
                    w for i, w in enumerate(workers) if keep[i] or i == position), running.work_since_checkpoint_s))
                if _fits(state, workload, accelerator_type):
                    keep[position] = True
                    continue
                undo.release((worker,))
                undo.add(victim.cluster_queue, accelerator_type, -victim.devices_per_worker)
                undo.set_running(victim.id, before)
            count = sum(keep)
            if victim.id not in stopped or count >= max(1, victim.workers_min):
                break
            kept = tuple(w for i, w in enumerate(workers) if keep[i])
            if not kept:
                break  # not one worker fits beside the preemptor: no other start keeps any
            undo.release(kept)  # too few to run: given back, to try from the next worker, or it is stopped after all
            undo.add(victim.cluster_queue, accelerator_type, -len(kept) * victim.devices_per_worker)
            undo.set_running(victim.id, None)
            keep = [False] * len(workers)
        if victim.id in stopped and count < max(1, victim.workers_min):
            continue
        decided[victim.id] = None if count == len(workers) else Shrink(
            victim.id, count, tuple(w for i, w in enumerate(workers) if not keep[i]), workload.id,
            f"shrunk to {count} workers for {workload.id} ({_preemption_kind(victim, workload)})")
    victims = [p for p in victims if p.workload_id not in decided]
    shrinks = [decided[r.workload.id] for r in gone if decided.get(r.workload.id) is not None]
    return victims, shrinks, {key for key, shrink in decided.items() if shrink is None}


def _preemption_kind(victim: Workload, preemptor: Workload) -> str:
    return "lower priority" if victim.priority < preemptor.priority else "borrowed quota reclaimed"


def _could_fit(state: _State, workload: Workload, accelerator_type: str, victims: _Victims,
               reclaim: set[str], queues: frozenset[str]) -> bool:
    """False only when even releasing every candidate victim could not make `workload` fit (quota and
    capacity are monotone in what is released, so the trial would preempt nothing). A bound: a trial it lets
    through and that fails is undone, so decisions depend only on its never ruling out one that would succeed
    (hence the slack for the rounding of the sums)."""
    usage, shares, entries, count = victims.releasable(workload.priority, reclaim, queues)
    if count < 0.5:
        return False  # no candidates
    pool = state.pool(accelerator_type)
    devices, workers = workload.devices_per_worker, workload.workers_min
    if workers > 0:
        if devices >= 1.0 - EPS:
            if (pool.whole_sum + entries + 0.5) // max(1, round(devices)) < workers:
                return False
        elif (pool.free_total() + shares + 1e-3) / devices < workers:
            return False
    # The straightforward check on the usage as it would be after releasing them all (a plain QuotaLedger over
    # the same queues, whose usage reads the changed values over the ledger's): the ledger itself is not touched.
    ledger = state.ledger
    base = ledger.usage
    after = ledger.what_if
    after.usage = _UsageAfter(base, {(queue, accelerator_type): base[(queue, accelerator_type)] - amount - 1e-6
                                     for queue, amount in usage.items()})
    return _allowed(state, workload, accelerator_type, workload.demand(),
                    QuotaLedger.check(after, workload.cluster_queue, accelerator_type, workload.demand()))


def _room_after_all(state: _State, workload: Workload, accelerator_type: str, victims: _Victims,
                    reclaim: set[str], already: set[str], live: set[str]) -> bool:
    """False only when the preemption trial would take every victim it may and still not have room for the gang
    (the trial then undoes everything: decisions do not change, only the time it takes). For whole-device workers,
    the trial is walked without changing anything: the same victims in the same order, the same queues left alone
    once within their nominal quota (usage subtracted as the trial subtracts it, so equal to the last bit), and per
    node the devices the victims would leave whole (one a victim holds whole, or one whose free share and the
    fractions victims hold there add up to one, with slack for the order of the sums): an upper bound on the slots
    the trial would find. (A trial that fails at capacity releases every victim, each changing its nodes' indexes and
    then changing them back: on a busy cluster most of the cycle's time before.)"""
    devices = workload.devices_per_worker
    if devices < _WHOLE:
        return True  # fractional workers: the trial decides
    pool = state.pool(accelerator_type)
    divisor = max(1, round(devices))
    need = workload.workers_min
    have = pool.slots(devices)
    if have >= need:
        return True  # room enough now: the trial is about quota
    own = workload.cluster_queue
    known, usage, new = state.ledger.queues, state.ledger.usage, state.ledger.new_usage
    # A walk that failed stays failed for as long as nothing could raise its bound: no device of the type's nodes
    # gained free share since (pool.freed: a trial's release, kept or undone) and the queues it may stop drawing
    # from use what they used then (an admission there lets a walk draw more of their victims before they are
    # within nominal). Admissions, reservations and victims taken since only lowered the bound. Kept per
    # (priority, queues, shape): the bound it reached.
    key = (workload.priority, frozenset(reclaim), frozenset(live), own, divisor)
    usages = tuple([usage[(queue, accelerator_type)] for queue in sorted(live) if queue != own])
    walked = victims.walks.get(key)
    if walked is not None and walked[0] == pool.freed and walked[1] == usages and need > walked[2]:
        return False
    left: dict[str, float] = {}  # a queue's usage of the type as the trial would leave it
    extra: dict[_Node, int] = {}  # node -> whole devices the victims so far free there
    shared: dict[tuple, float] = {}  # (node, index) -> free share of a device victims so far hold a fraction of
    released, spared = victims.released, victims.spared
    for running in victims.candidates(workload.priority, reclaim, already, live):
        victim = running.workload
        queue = victim.cluster_queue
        used = left[queue] if queue in left else usage[(queue, accelerator_type)]
        if queue != own and queue in known and used - new.get((queue, accelerator_type), 0.0) \
                - known[queue].quotas.get(accelerator_type, NO_QUOTA).nominal <= EPS:
            live.discard(queue)
            continue
        if victim.id in spared:
            break  # the trial stops here (_plan_preemption)
        entries = released.get(victim.id)
        if entries is None:
            entries = victims.release_of(running, state.nodes)
        first, then, per_node = entries
        used = used + first
        if then:
            used = used + then
        left[queue] = used
        for node, count, fractions in per_node:
            for index, share in fractions:  # whole once the fractions freed on it and its free share add up to 1
                free = shared.get((node, index))
                if free is None:
                    free = node.device_free[index] if index < len(node.device_free) else 1.0
                shared[(node, index)] = after = free + share
                if free < _SLACK <= after:
                    count += 1
            if not count:
                continue
            before = extra.get(node, 0)
            after = extra[node] = before + count
            capacity, whole = len(node.device_free), node.whole
            if whole + before < capacity:
                have += min(capacity, whole + after) // divisor - (whole + before) // divisor
        if have >= need:
            return True
    victims.walks[key] = (pool.freed, usages, have)
    return False


class _UsageAfter(dict):
    """Quota usages: its own (changed) values, the base's for the rest."""

    __slots__ = ("base",)

    def __init__(self, base: dict, changed: dict):
        super().__init__(changed)
        self.base = base

    def __missing__(self, key):
        return self.base[key]


def _within_nominal(state: _State, workload: Workload, accelerator_type: str) -> bool:
    quota = state.ledger.quota(workload.cluster_queue, accelerator_type)
    return state.ledger.usage[(workload.cluster_queue, accelerator_type)] + workload.demand() <= quota.nominal + EPS


def _fits(state: _State, workload: Workload, accelerator_type: str) -> bool:
    # Capacity first: it is O(1) and, in a trial, usually what is still missing (both tests are pure).
    if workload.workers_min > 0 and state.pool(accelerator_type).slots(workload.devices_per_worker) \
            < workload.workers_min:
        return False
    return _allowed(state, workload, accelerator_type, workload.demand(),
                    state.ledger.check(workload.cluster_queue, accelerator_type, workload.demand()))


def _allowed(state: _State, workload: Workload, accelerator_type: str, amount: float, check: QuotaCheck) -> bool:
    """Whether the quota takes `amount` more of `workload`: `check` passed, and a non-preemptible workload keeps its
    queue's non-preemptible usage within nominal (quota.non_preemptible_refusal)."""
    return check.ok and not state.fixed_refusal(workload, accelerator_type, amount)


def _reserve(state: _State, pending: Workload, types) -> str:
    """Set aside the free devices the blocked head workload will need on its first feasible type: one whose quota
    takes it and whose nodes could hold its gang were they empty (before, a gang no node could hold, 1 x 9 devices on
    8-device nodes, reserved 9 devices in every cycle and kept other queues' jobs off them for good)."""
    for accelerator_type in types:
        workload = pending.on(accelerator_type)  # its size on this type
        if not _allowed(state, workload, accelerator_type, workload.demand(),
                        state.ledger.check(workload.cluster_queue, accelerator_type, workload.demand())):
            continue
        pool = state.pool(accelerator_type)
        if pool.most_slots(workload.devices_per_worker) < workload.workers_min:
            continue  # its nodes could never hold the gang: it would hold their devices for ever
        ordered = sorted(pool.groups.values(), key=lambda group: (-sum(n.free for n in group), group[0].leaf_group))
        remaining = workload.demand()
        for group in ordered:
            for node in sorted(group, key=lambda n: (-n.free, n.name)):
                touched = False
                for index, share in enumerate(node.device_free):
                    if remaining <= EPS:
                        break
                    if share > EPS:
                        taken = min(share, remaining)
                        node.device_free[index] -= taken
                        remaining -= taken
                        touched = True
                if touched:
                    pool.refresh(node)
        # Its quota is held as far as its queue's nominal quota goes: a part it would borrow is the lenders' idle
        # quota, which their own work may take back (before, the hold borrowed it and kept a lender's job, within its
        # nominal and with free devices, waiting for as long as the head waited; found by a review).
        queue = workload.cluster_queue
        own = min(workload.demand(), state.ledger.quota(queue, accelerator_type).nominal
                  - state.ledger.usage[(queue, accelerator_type)])
        if own > EPS:
            state.ledger.add_new(queue, accelerator_type, own)
            state.hold = (queue, accelerator_type, own, workload.id)
        set_aside = workload.demand() - max(0.0, remaining)
        if set_aside > EPS:  # (with nothing free, others were told "0 more set aside for ...")
            state.reserved[accelerator_type] = (workload.id, set_aside)
        return accelerator_type
    return ""


def _grow_elastic(state: _State, result: CycleResult, preempted: set[str], waiting_types: set[str]) -> None:
    admitted_now: dict[str, int] | None = None  # admission index by id, made when first needed
    # As sorted(r for r in state.running.values() if ... below workers_max ...), from the ids that may be (those
    # of a chip someone waits for are skipped below anyway: left out before sorting).
    running_now = state.running
    elastic = _by_priority_arrival_id(
        [r for r in (running_now.get(i) for i in state.elastic)
         if r is not None and r.workload.id not in preempted and len(r.workers) < r.workload.workers_max
         and r.accelerator_type not in waiting_types and _MIN_SIZE <= r.workload.devices_per_worker < _INF],
        "workload.")
    # Per (type, shape): a heap of (free - devices, name, seq, free, node) over nodes with a slot for the shape;
    # nodes only lose capacity here, so an entry is current iff its node's free is unchanged (and it has a slot).
    heaps: dict[str, dict[float, list]] = {}
    seq = 0
    for running in elastic:
        workload, accelerator_type = running.workload, running.accelerator_type
        if accelerator_type in waiting_types:
            continue  # someone waits for this chip: do not grow into it
        added: list[WorkerPlacement] = []
        pool = state.pool(accelerator_type)
        devices = workload.devices_per_worker
        used_before = state.ledger.usage[(workload.cluster_queue, accelerator_type)]
        while len(running.workers) + len(added) < workload.workers_max:
            if not _allowed(state, workload, accelerator_type, devices,
                            state.ledger.check(workload.cluster_queue, accelerator_type, devices)):
                break
            if pool.slots(devices) < 1:
                break
            pool_heaps = heaps.setdefault(accelerator_type, {})
            heap = pool_heaps.get(devices)
            if heap is None:
                heap = pool_heaps[devices] = [(n.free - devices, n.name, i, n.free, n)
                                              for i, n in enumerate(pool.sched) if n.slots[devices] > 0]
                heapq.heapify(heap)
                seq = max(seq, len(heap))
            while True:  # the fullest node that still fits (best fit), ties by name
                entry = heap[0]
                node = entry[4]
                if node.free == entry[3] and node.slots[devices] > 0:
                    break
                heapq.heappop(heap)
            state.ledger.add_new(workload.cluster_queue, accelerator_type, devices)
            state.hold_fixed(workload, accelerator_type, devices)
            added.append(WorkerPlacement(node=node.name, taken=node.take(devices)))
            free = node.free
            for shape, shape_heap in pool_heaps.items():
                if node.slots[shape] > 0:
                    seq += 1
                    heapq.heappush(shape_heap, (free - shape, node.name, seq, free, node))
        if not added:
            continue
        workers = running.workers + tuple(added)
        state.running[workload.id] = Running(workload, accelerator_type, workers, running.work_since_checkpoint_s)
        if admitted_now is None:
            admitted_now = {admit.workload_id: i for i, admit in enumerate(result.admitted)}
        if workload.id in admitted_now:
            index = admitted_now[workload.id]
            admit = result.admitted[index]
            # The workers beyond its minimum may borrow where the minimum did not (before, such a job was recorded as
            # "within nominal quota", borrowed 0, while its queue used twice its nominal; found by QA).
            extra = _borrowed_by_adding(state.ledger, workload.cluster_queue, accelerator_type, used_before)
            note = f"; borrows {extra:g} {accelerator_type} from its cohort for them" if extra > EPS else ""
            result.admitted[index] = Admit(admit.workload_id, admit.accelerator_type, workers,
                                           admit.borrowed + extra, admit.reason + f"; started with {len(workers)} "
                                           f"workers (elastic, capacity was idle{note})")
        else:
            result.grown.append(Grow(workload.id, len(workers), tuple(added),
                                     f"grown to {len(workers)} workers into idle {accelerator_type} capacity"))


def _borrowed_by_adding(ledger: QuotaLedger, queue: str, accelerator_type: str, used_before: float) -> float:
    """What the usage added since the queue used `used_before` took beyond its nominal quota (as a quota check counts
    what an admission borrows)."""
    nominal = ledger.quota(queue, accelerator_type).nominal
    return max(0.0, ledger.usage[(queue, accelerator_type)] - max(nominal, used_before))


def place_additional_workers(snapshot: Snapshot, *, accelerator_type: str, workers: int,
                             devices: float) -> tuple[WorkerPlacement, ...] | None:
    """Where `workers` more workers of `devices` each would go, given everything already running.

    Used to re-place the workers a running gang lost (a dead or cordoned node): the gang keeps its
    quota, so only capacity matters. Same placement rules as admission (leaf groups, best fit);
    None when they do not all fit.
    """
    if workers <= 0:
        return ()
    return _place_gang(_State(snapshot).pool(accelerator_type), workers, devices)
