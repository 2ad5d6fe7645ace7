"""Mixed load: serving deployments in the training scheduling cycle (issue 3). Pure: no Django, no Ray.

A serving deployment reserves `replicas_max` replicas of `devices_per_replica` on its accelerator type (and pool,
when pinned) but uses only the replicas its autoscaler wants now. Training may use the reserved-but-idle devices
(a loan); when the deployment wants more replicas than fit on free devices, training gives them back: victims are
the lowest priority, then the least work since their last checkpoint; an elastic victim is shrunk before it is
stopped; each checkpoints first. Nothing is given back unless the replica then fits.

`plan_mixed_load(snapshot, serving)` runs before `scheduler.schedule`: it holds the devices of running replicas
(on the nodes they run on) and of wanted replicas (on free devices, or on devices training gives back) as
settled running workloads, so the cycle neither admits training onto them nor takes them as victims. A
deployment's replicas count against its ClusterQueue's quota like training does: they are held in that queue
(`SERVING_QUEUE`, outside every quota, only for a demand that names none), and a wanted replica the queue's quota
cannot take (nominal, then what it may borrow from its cohort) waits, saying so. Running replicas are always held:
they exist. It returns the snapshot to schedule and the give-back decisions. `loans(...)` then says how much of
each type's reserved-idle capacity training uses after the cycle.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, replace

from controlplane.scheduling.model import Preempt, Running, Shrink, Snapshot, Workload
from controlplane.scheduling.placement import EPS, WorkerPlacement, without_workers
from controlplane.scheduling.quota import QuotaLedger

SERVING_QUEUE = "(serving)"  # not a ClusterQueue: a demand without a queue is held outside every quota
SERVING_PREFIX = "serving:"


@dataclass(frozen=True)
class ServingDemand:
    """One live deployment as the cycle sees it."""

    id: str
    accelerator_type: str
    devices_per_replica: float
    replicas_max: int
    replicas_wanted: int  # what its autoscaler wants now (at least replicas_min)
    replica_nodes: tuple[str, ...] = ()  # one entry per running replica: the node it runs on
    pool: str | None = None  # pinned to one pool, or any pool of the type
    replicas_running: int | None = None  # when more run than `replica_nodes` names (None: as many as it names)
    cluster_queue: str | None = None  # the ClusterQueue whose quota its replicas count against
    all_or_none: bool = False  # deploys only once all wanted replicas fit (PENDING): nothing given back for fewer
    replicas_min: int = 0  # its replica limit never goes below this (the deploy check let it run that many)
    replicas_limit: int | None = None  # the limit the last cycle set (Serve runs no more); None: replicas_max
    # one entry per wanted replica the backend has put on a node that does not run yet (starting): held there first
    starting_nodes: tuple[str, ...] = ()
    # the nodes the last cycle held for its wanted replicas (`capacity_held`): tried first for them again, so that a
    # hold stays on the node the replica is being deployed to rather than moving to another each cycle
    held_nodes: tuple[str, ...] = ()

    @property
    def allowed(self) -> int:
        """The most replicas it may run now: Serve's autoscaler is capped at the last cycle's limit."""
        return self.replicas_max if self.replicas_limit is None else min(self.replicas_max, self.replicas_limit)

    @property
    def reserved(self) -> float:
        """The devices replicas_max replicas take: whole devices each, or as many shares as fit on one device each
        (before, 3 replicas of 0.6 counted as 1.8 devices, though no two of them share a device; found by a review)."""
        return replica_devices(self.replicas_max, self.devices_per_replica)


def replica_devices(replicas: int, per_replica: float) -> float:
    """The devices `replicas` replicas of `per_replica` take as `_Free.take` places them: ceil(per_replica) whole
    devices each, or shares of a device, as many on one as fit."""
    if replicas <= 0 or per_replica <= EPS:
        return 0.0
    if per_replica >= 1.0 - EPS:
        return replicas * math.ceil(per_replica - EPS)
    return float(math.ceil(replicas / int(1 / per_replica + 1e-9)))


@dataclass
class MixedLoadPlan:
    snapshot: Snapshot  # serving replicas held; victims removed, shrunk victims narrowed
    preempted: list[Preempt] = field(default_factory=list)
    shrunk: list[Shrink] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # deployment id -> why wanted replicas still wait
    # deployment id -> (the most replicas its ClusterQueue's quota lets it run now, why not replicas_max or "");
    # live deployments in a ClusterQueue only: the platform caps Ray Serve's autoscaler there (`replica_limits`)
    limits: dict[str, tuple[int, str]] = field(default_factory=dict)
    # deployment id -> the devices held for the replicas of a deployment waiting to be deployed (free ones, or ones
    # training gives back): the platform stores them so that placing another deployment does not take them meanwhile
    held_for_wanted: dict[str, tuple[WorkerPlacement, ...]] = field(default_factory=dict)


class _Free:
    """Free share per (node, device index) after what runs, with the node facts the plan needs."""

    def __init__(self, snapshot: Snapshot):
        self.nodes = {n.name: n for n in snapshot.nodes}
        self.free = {n.name: [1.0] * max(0, n.devices) for n in snapshot.nodes}
        for running in snapshot.running:
            self.hold(running.workers, -1.0)

    def hold(self, workers, sign: float) -> None:
        for worker in workers:
            shares = self.free.get(worker.node)
            if shares is None:
                continue
            for index, share in worker.taken:
                if index < len(shares):
                    shares[index] = min(1.0, max(0.0, shares[index] + sign * share))

    def take(self, node: str, devices: float, *, force: bool = False) -> tuple[tuple[int, float], ...] | None:
        """Devices for one replica on `node` (whole free devices, or the fullest device with room for a fraction);
        None when they do not fit. `force`: a replica that already runs there takes what is left, if not enough."""
        shares = self.free.get(node, [])
        taken: list[tuple[int, float]] = []
        if devices >= 1.0 - EPS:
            whole = [i for i in range(len(shares) - 1, -1, -1) if shares[i] >= 1.0 - EPS]
            need = math.ceil(devices - EPS)  # (round(2.5) took 2 devices for 2.5)
            if len(whole) < need and not force:
                return None
            for index in whole[:need]:
                taken.append((index, 1.0))
        elif devices > EPS:
            fitting = sorted((s, -i) for i, s in enumerate(shares) if s >= devices - EPS)
            if not fitting and not force:
                return None
            if fitting:
                taken.append((-fitting[0][1], devices))
        for index, share in taken:
            shares[index] = max(0.0, shares[index] - share)
        return tuple(taken)

    def candidates(self, demand: ServingDemand) -> list[str]:
        """Nodes a new replica may go to, fullest first (best fit), then by name."""
        names = [n.name for n in self.nodes.values()
                 if n.accelerator_type == demand.accelerator_type and n.schedulable
                 and (demand.pool is None or n.pool == demand.pool)]
        return sorted(names, key=lambda name: (sum(self.free[name]), name))


def _queue_of(demand: ServingDemand, snapshot: Snapshot) -> str:
    known = {queue.name for queue in snapshot.cluster_queues}
    return demand.cluster_queue if demand.cluster_queue in known else SERVING_QUEUE


def _quota_ledger(snapshot: Snapshot) -> QuotaLedger:
    ledger = QuotaLedger(snapshot.cluster_queues)
    for running in snapshot.running:
        ledger.add(running.workload.cluster_queue, running.accelerator_type, running.usage)
    return ledger


def serving_quota_refusal(ledger: QuotaLedger, queue: str, accelerator_type: str, amount: float,
                          giveable: float = 0.0) -> str:
    """Why `amount` more devices of serving replicas exceed the queue's quota, or "". `giveable`: what preemptible
    training of the same queue and type holds; that training uses the team's quota on loan and gives it back (the
    give-back), so it does not hold the replicas off. Within its nominal quota serving always may: nominal quota is
    the queue's own, and training elsewhere in the cohort that borrowed it gives the devices back rather than holding
    the replicas off; beyond nominal it borrows under the cohort's rules. The platform's deploy check uses it too."""
    kind = accelerator_type
    if ledger.usage[(queue, kind)] - giveable + amount <= ledger.quota(queue, kind).nominal + EPS:
        return ""
    ledger.add(queue, kind, -giveable)
    try:
        check = ledger.check(queue, kind, amount)
    finally:
        ledger.add(queue, kind, giveable)
    return "" if check.ok else check.reason


def _pseudo(demand: ServingDemand, workers: tuple[WorkerPlacement, ...], queue: str) -> Running:
    """The replicas held as a running workload the cycle leaves alone (settled: no victim, no growth). Not of a
    non-preemptible class: replicas give borrowed quota back through their limit (replica_limits), so they are no
    non-preemptible usage (counted as such, they held a non-preemptible job of their queue back; found by QA)."""
    workload = Workload(id=SERVING_PREFIX + demand.id, cluster_queue=queue,
                        accepted_types=(demand.accelerator_type,), devices_per_worker=demand.devices_per_replica,
                        workers_min=len(workers), workers_max=len(workers), priority=2**31, preemptible=True,
                        workload_class="serving")
    return Running(workload, demand.accelerator_type, workers, settled=True)


def plan_mixed_load(snapshot: Snapshot, serving: tuple[ServingDemand, ...] | list[ServingDemand]) -> MixedLoadPlan:
    if not serving:
        return MixedLoadPlan(snapshot)
    free = _Free(snapshot)
    running = {r.workload.id: r for r in snapshot.running}
    plan = MixedLoadPlan(snapshot)
    touched: set[str] = set()  # training workloads already shrunk or preempted (each at most once)
    demands = [d for d in sorted(serving, key=lambda d: d.id) if d.devices_per_replica > EPS]
    held: dict[str, list[WorkerPlacement]] = {d.id: [] for d in demands}
    # (a replica on a node of another type, as Ray may run a CPU replica on an accelerator node, holds nothing of the
    # deployment's type: before, it held 0.25 of an H100 there; found by a review)
    runs = {d.id: max(len(d.replica_nodes), d.replicas_running or 0) - len(_foreign(d, free.nodes)) for d in demands}
    # 1. Every deployment's running replicas first, on the nodes they run on, before any wanted replica is placed
    #    (or one deployment's new replica could be put on devices another's replica already uses).
    for demand in demands:
        for node in sorted(n for n in demand.replica_nodes if n in free.nodes
                           and free.nodes[n].accelerator_type == demand.accelerator_type):
            taken = free.take(node, demand.devices_per_replica, force=True)
            if taken:
                held[demand.id].append(WorkerPlacement(node, taken))
    # 2. Running replicas the backend did not place on a known node (or whose node had no room left in this
    #    bookkeeping): they hold free devices of the type.
    for demand in demands:
        for _ in range(runs[demand.id] - len(held[demand.id])):
            placed = _place_replica(free, demand)
            if placed is not None:
                held[demand.id].append(placed)
    running_held = {d.id: len(held[d.id]) for d in demands}
    # 3. Wanted replicas not running yet, within their queue's quota: free devices, or what training gives back.
    ledger = _quota_ledger(snapshot)
    for demand in demands:
        queue = _queue_of(demand, snapshot)
        if queue != SERVING_QUEUE:
            ledger.add(queue, demand.accelerator_type, len(held[demand.id]) * demand.devices_per_replica)
    # Replicas that run already count: training holding quota they need on loan gives it back (they exist; the
    # queue would otherwise stay over its quota, e.g. when a replica started before the cycle saw the deployment).
    for demand in demands:
        queue, kind = _queue_of(demand, snapshot), demand.accelerator_type
        amount = len(held[demand.id]) * demand.devices_per_replica
        if queue == SERVING_QUEUE or amount <= EPS:
            continue
        ledger.add(queue, kind, -amount)
        again = _again(plan)
        if not serving_quota_refusal(ledger, queue, kind, amount, _giveable(running, touched - again, queue, kind)):
            reclaimed = _reclaim_quota(ledger, queue, demand, running, touched, free, amount, again=again)
            if reclaimed is not None:
                reclaimed.commit(plan)
        ledger.add(queue, kind, amount)
    for demand in demands:
        queue = _queue_of(demand, snapshot)
        missing = max(0, min(demand.replicas_wanted, demand.allowed) - runs[demand.id])
        saved = _save(free, running, touched, ledger, plan, held[demand.id]) if demand.all_or_none else None
        # wanted replicas the backend already put on a node (starting there) are held there, as running ones are
        for node in sorted(n for n in demand.starting_nodes if n in free.nodes
                           and free.nodes[n].accelerator_type == demand.accelerator_type)[:missing]:
            taken = free.take(node, demand.devices_per_replica, force=True)
            if taken:
                held[demand.id].append(WorkerPlacement(node, taken))
                missing -= 1
                if queue != SERVING_QUEUE:
                    ledger.add(queue, demand.accelerator_type, demand.devices_per_replica)
        for number in range(missing):
            if queue != SERVING_QUEUE:
                again = _again(plan)
                why = serving_quota_refusal(ledger, queue, demand.accelerator_type, demand.devices_per_replica,
                                            _giveable(running, touched - again, queue, demand.accelerator_type))
                if why:
                    plan.waiting[demand.id] = f"{missing - number} wanted replica(s) wait for quota: {why}"
                    break
                reclaimed = _reclaim_quota(ledger, queue, demand, running, touched, free, demand.devices_per_replica,
                                           again=again)
            else:
                reclaimed = None
            placed = _place_replica(free, demand) or _give_back(free, demand, running, touched, plan, ledger)
            if reclaimed is not None and placed is not None:
                reclaimed.commit(plan)
            elif reclaimed is not None:
                reclaimed.undo()
            if placed is None:
                plan.waiting[demand.id] = (f"{missing - number} wanted replica(s) of {demand.devices_per_replica:g} "
                                           f"{demand.accelerator_type} fit nowhere, and no preemptible training "
                                           "holds enough to give back")
                break
            held[demand.id].append(placed)
            if queue != SERVING_QUEUE:
                ledger.add(queue, demand.accelerator_type, demand.devices_per_replica)
        if saved is not None and demand.id in plan.waiting:  # fewer than all: as if none had been tried
            _restore(saved, free, running, touched, ledger, plan, held[demand.id])
    # Every deployment's wanted replicas that do not run yet, live ones too: a replica being deployed (DEPLOYING, or
    # a scale-out) is not reported as running until it is, and without its hold a worker re-placed off a node went
    # onto the devices it was being deployed to (QA). Held where the backend started it when it says so, else on the
    # node held for it before (the one freed for it), else where it fits (a review had dropped these holds for live
    # deployments: picked here rather than where Serve starts them, they hid a free node from others).
    plan.held_for_wanted = {d.id: tuple(held[d.id][running_held[d.id]:]) for d in demands
                            if len(held[d.id]) > running_held[d.id]}
    plan.limits = replica_limits(ledger, demands, held, running, touched, snapshot, _again(plan))
    shrunk = {s.workload_id for s in plan.shrunk}
    kept = tuple(_settled(running[r.workload.id]) if r.workload.id in shrunk else running[r.workload.id]
                 for r in snapshot.running if r.workload.id in running)
    pseudo = tuple(_pseudo(d, tuple(held[d.id]), _queue_of(d, snapshot)) for d in demands if held[d.id])
    plan.snapshot = replace(snapshot, running=kept + pseudo,
                            non_preemptible_caps=non_preemptible_caps(snapshot, demands))
    return plan


def non_preemptible_caps(snapshot: Snapshot, serving) -> dict[str, float]:
    """Per type that deployments reserve, the devices non-preemptible training may hold: the schedulable capacity
    minus every deployment's reservation (as `loans` counts it), and within any cap the snapshot already has. Only
    preemptible training uses reserved capacity on loan: it gives it back when the deployments scale out, which a
    non-preemptible job cannot (before, one was admitted onto it, and the deployment could never scale out; found
    by QA).

    A deployment pinned to a pool reserves that pool's devices. The core places by type, not by pool, so the cap
    is conservative there: non-preemptible training of the type holds no more than what the pinned reservations
    leave free in the pool they take most of, wherever it is placed (before, with the cap per type alone, a
    non-preemptible job whose only room was the pinned pool took it; found by a review). Such a job may wait while
    another pool of the type has room."""
    capacity, reserved = _capacity_and_reserved(snapshot, serving)
    by_pool, pinned = _capacity_and_reserved(snapshot, serving, by_pool=True)
    caps = dict(snapshot.non_preemptible_caps)
    for kind, amount in reserved.items():
        cap = max(0.0, capacity[kind] - amount)
        for (pool_kind, pool), held in pinned.items():
            # (a pool with no schedulable node takes no new work, so it has nothing to protect: before, it set the
            # whole type's cap to 0; found by a review)
            if pool_kind == kind and by_pool.get((kind, pool), 0.0) > 0:
                cap = min(cap, max(0.0, by_pool[(kind, pool)] - held))
        caps[kind] = min(cap, caps.get(kind, cap))
    return caps


def hold_in_place(snapshot: Snapshot, serving, held: list[tuple[str, float]] = (),
                  devices: list[tuple[str, int]] = ()) -> Snapshot:
    """The snapshot with what training must not be moved onto held as settled running workloads, and nothing given
    back: the devices deployments' running replicas use (on the nodes they run on), then `devices` ((node, device
    index) pairs, whole), then `held` ((node, devices) amounts, on free devices of the node). For re-placing a
    running gang's workers off a node (before, they were placed from the training snapshot alone, onto a running
    replica's devices or a stopping run's; found by QA)."""
    running_only = [replace(d, replicas_wanted=0, cluster_queue=None, all_or_none=False) for d in serving]
    snapshot = plan_mixed_load(snapshot, running_only).snapshot
    free = _Free(snapshot)
    placements = []  # (what holds it: "stopping" for `devices`, "held" for `held`; the devices)
    for node, index in sorted(set(devices)):
        shares = free.free.get(node)
        if shares is not None and index < len(shares) and shares[index] > EPS:
            placements.append(("stopping", WorkerPlacement(node, ((index, shares[index]),))))
            shares[index] = 0.0
    for node, amount in held:
        taken = free.take(node, amount, force=True) if node in free.free else None
        if taken:
            placements.append(("held", WorkerPlacement(node, taken)))
    extra = tuple(Running(Workload(id=f"{what}:{i}", cluster_queue=SERVING_QUEUE, accepted_types=(kind,),
                                   devices_per_worker=sum(share for _, share in w.taken)), kind, (w,), settled=True)
                  for i, (what, w) in enumerate(placements) for kind in (free.nodes[w.node].accelerator_type,))
    return replace(snapshot, running=snapshot.running + extra)


def taken_by_others(snapshot: Snapshot, workers, own_id: str) -> dict[str, list[str]]:
    """node -> ids of the running workloads of `snapshot` (all but `own_id`) that use devices `workers` want there,
    so that the workers do not fit beside them ("unschedulable" for a node taking no new work): where a placement
    cannot be reserved. Ids as the snapshot has them (a job's id, `serving:<deployment id>`, `held:<n>`)."""
    used: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for running in snapshot.running:
        if running.workload.id == own_id:
            continue
        for worker in running.workers:
            for index, share in worker.taken:
                holders = used[(worker.node, index)]
                holders[running.workload.id] = holders.get(running.workload.id, 0.0) + share
    schedulable = {n.name: n.schedulable for n in snapshot.nodes}
    taken: dict[str, list[str]] = {}
    for worker in workers:
        if not schedulable.get(worker.node, False):
            taken[worker.node] = ["unschedulable"]
            continue
        for index, share in worker.taken:
            holders = used.get((worker.node, index), {})
            if sum(holders.values()) + share > 1.0 + EPS:
                taken[worker.node] = sorted(set(taken.get(worker.node, [])) | set(holders))
    return taken


def replica_limits(ledger: QuotaLedger, demands: list[ServingDemand], held: dict[str, list],
                   running: dict[str, Running], touched: set[str], snapshot: Snapshot,
                   again: frozenset[str] = frozenset()) -> dict[str, tuple[int, str]]:
    """The most replicas each live deployment's ClusterQueue lets it run now (Ray Serve's autoscaler is capped
    there), never fewer than `replicas_min` nor more than `replicas_max`. Counted on a copy of the ledger without
    the live deployments' replicas, in this order, so that the result does not depend on deployment ids and does
    not swing with the replicas Serve runs:

    1. every deployment's replicas that run (or are held) within its queue's nominal quota: within nominal serving
       always may, the team's own preemptible training giving its share back;
    2. what other queues' waiting work claims within their nominal quota (pending training, and deployments waiting
       to be deployed) is not idle, so it is not lent: borrowing preemptible training gives it back first (lower
       priority: the cycle preempts it), and only for what the cohort's idle quota does not cover;
    3. the replicas that run on borrowed quota, as far as the cohort still lends: a deployment borrowing quota a
       lender's waiting work claims gets a limit below what it runs, and Serve scales in;
    4. the headroom: one replica of room each first (those that want more than they hold first), then to those
       whose autoscaler wants more than they hold, then to all, each in turn, so no deployment's scale-out takes
       quota another one's running replicas use or all the headroom of its queue."""
    scratch = QuotaLedger(snapshot.cluster_queues)
    scratch.usage.update(ledger.usage)
    queue_of = {d.id: _queue_of(d, snapshot) for d in demands}
    live = [d for d in demands if queue_of[d.id] != SERVING_QUEUE and not d.all_or_none]
    for demand in live:  # counted again below
        scratch.add(queue_of[demand.id], demand.accelerator_type, -len(held[demand.id]) * demand.devices_per_replica)
    giveable = {(q, k): _giveable(running, touched - again, q, k)
                for q, k in {(queue_of[d.id], d.accelerator_type) for d in live}}
    own_training = dict(giveable)  # the queue's own preemptible training (not already giving something back)
    counts = {d.id: 0 for d in live}
    reasons: dict[str, str] = {}

    def within_nominal(demand: ServingDemand) -> bool:
        """Within nominal serving always may, its own preemptible training aside: that training then uses the
        rest, borrowing what it uses beyond nominal (which it gives back when the cohort needs it)."""
        key = (queue_of[demand.id], demand.accelerator_type)
        step = demand.devices_per_replica
        if counts[demand.id] < demand.replicas_min \
                or scratch.usage[key] - own_training[key] + step <= scratch.quota(*key).nominal + EPS:
            scratch.add(*key, step)
            counts[demand.id] += 1
            return True
        return False

    for demand in live:  # 1.
        while counts[demand.id] < len(held[demand.id]) and within_nominal(demand):
            pass
    claims = _claims(snapshot, scratch, demands, held)  # 2.
    for (queue, kind), amount in _given_back_to_claims(ledger, running, touched, claims).items():
        scratch.add(queue, kind, -amount)
        if (queue, kind) in giveable:  # (training's quota goes to one of them, not to both)
            giveable[(queue, kind)] = max(0.0, giveable[(queue, kind)] - amount)
            own_training[(queue, kind)] = max(0.0, own_training[(queue, kind)] - amount)
    for (queue, kind), amount in claims.items():
        scratch.add(queue, kind, amount)

    def borrowing(demand: ServingDemand) -> bool:
        queue, kind = queue_of[demand.id], demand.accelerator_type
        step, own_claim = demand.devices_per_replica, claims.get((queue, kind), 0.0)
        scratch.add(queue, kind, -own_claim)  # the team's own waiting work does not hold its replicas off
        try:
            if within_nominal(demand):
                return True
            why = serving_quota_refusal(scratch, queue, kind, step)
            if not why:
                scratch.add(queue, kind, step)
            else:
                why = serving_quota_refusal(scratch, queue, kind, step, giveable[(queue, kind)])
                if why:
                    reasons[demand.id] = why
                    return False
                giveable[(queue, kind)] -= step
            counts[demand.id] += 1
            return True
        finally:
            scratch.add(queue, kind, own_claim)

    for demand in live:  # 3.
        while counts[demand.id] < len(held[demand.id]) and borrowing(demand):
            pass
        if counts[demand.id] < len(held[demand.id]):
            claimants = sorted({queue for (queue, kind), amount in claims.items()
                                if kind == demand.accelerator_type and amount > EPS
                                and queue in scratch.members(queue_of[demand.id]) and queue != queue_of[demand.id]})
            if claimants:
                reasons[demand.id] += (f": gives back borrowed quota that waiting work of {', '.join(claimants)} needs"
                                       " within its nominal quota")
    # 4. First one replica of room each (Serve's autoscaler can only show it wants more below its cap), then for
    # those whose autoscaler wants more than they hold, then for all, each in turn. It depends on what they hold and
    # want, not on the last limits, so steady load gives the same limits cycle after cycle.
    growing = [d for d in live if counts[d.id] == len(held[d.id])]
    # (those that want more take their replica of room first: in id order, one that did not use it took the last
    # room of a queue for good while another at its cap wanted more; found by QA)
    for demand in sorted(growing, key=lambda d: d.replicas_wanted <= len(held[d.id])):
        if counts[demand.id] < demand.replicas_max:
            borrowing(demand)
    for turn in ([d for d in growing if d.replicas_wanted > len(held[d.id])], growing):
        while turn:
            turn = [d for d in turn if counts[d.id] < d.replicas_max and borrowing(d)]
    limits: dict[str, tuple[int, str]] = {}
    for demand in live:
        limit = min(demand.replicas_max, max(counts[demand.id], demand.replicas_min))
        limits[demand.id] = (limit, reasons.get(demand.id, "") if limit < demand.replicas_max else "")
    return limits


def _given_back_to_claims(ledger: QuotaLedger, running: dict[str, Running], touched: set[str],
                          claims: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """What borrowing preemptible training gives back to waiting work's claims, per (queue, type): the part of the
    cohort's claims that its unused quota (with every replica counted as it runs) does not cover, taken from the
    part of each queue beyond its nominal quota that preemptible training (not already giving back) holds. A
    lender's waiting work reclaims that (the cycle preempts it) before any serving replica gives anything back."""
    preemptible: dict[tuple[str, str], float] = defaultdict(float)
    for r in running.values():
        if r.workload.preemptible and not r.settled and r.workload.id not in touched \
                and r.workload.cluster_queue in ledger.queues:
            preemptible[(r.workload.cluster_queue, r.accelerator_type)] += r.usage
    short: dict[tuple[tuple[str, ...], str], float] = {}  # (cohort members, type) -> claims idle quota does not cover
    given: dict[tuple[str, str], float] = {}
    for (queue, kind), amount in sorted(preemptible.items()):
        members = tuple(ledger.members(queue))
        if (members, kind) not in short:
            claimed = sum(claims.get((member, kind), 0.0) for member in members)
            short[(members, kind)] = max(0.0, claimed - _unused_for_claims(ledger, members, kind, claims)) \
                if claimed > EPS else 0.0
        part = min(amount, ledger.borrowed(queue, kind), short[(members, kind)])
        if part > EPS:
            given[(queue, kind)] = part
            short[(members, kind)] -= part
    return given


def _unused_for_claims(ledger: QuotaLedger, members: tuple[str, ...], kind: str,
                       claims: dict[tuple[str, str], float]) -> float:
    """The cohort's quota its waiting work could use now, as `QuotaLedger.cohort_room` counts it: every member's
    unused nominal quota less what borrowers use beyond theirs, where a member lends at most its lending limit of
    its idle quota beyond its own claim (a claimant uses its own). Never below 0."""
    room = 0.0
    for member in members:
        quota = ledger.quota(member, kind)
        unused = quota.nominal - ledger.usage[(member, kind)]
        if unused > 0 and quota.lending_limit is not None:  # a claimant uses its own; it lends at most the limit
            unused = min(unused, claims.get((member, kind), 0.0) + quota.lending_limit)
        room += unused
    return max(0.0, room)


def _claims(snapshot: Snapshot, ledger: QuotaLedger, demands: list[ServingDemand],
            held: dict[str, list]) -> dict[tuple[str, str], float]:
    """Quota that waiting work claims within its queue's nominal quota, per (queue, type): the demands of the
    queue's pending workloads on their preferred type (highest priority and earliest first), then the wanted replicas
    of its deployments waiting to be deployed that are not held yet, while they fit in the nominal quota the queue
    does not use."""
    claims: dict[tuple[str, str], float] = defaultdict(float)

    def claim(queue: str, kind: str, amount: float) -> None:
        if queue not in ledger.queues:
            return
        key = (queue, kind)
        if amount <= ledger.quota(queue, kind).nominal - ledger.usage[key] - claims[key] + EPS:
            claims[key] += amount

    for workload in sorted(snapshot.pending, key=lambda w: (-w.priority, w.arrival, w.id)):
        types = snapshot.type_preference.get(workload.id, workload.accepted_types)
        if types:
            claim(workload.cluster_queue, types[0], workload.on(types[0]).demand())  # its size on that type
    for demand in demands:
        queue = _queue_of(demand, snapshot)
        missing = demand.replicas_wanted - len(held[demand.id])
        if demand.all_or_none and queue != SERVING_QUEUE and missing > 0:
            claim(queue, demand.accelerator_type, missing * demand.devices_per_replica)
    return {key: amount for key, amount in claims.items() if amount > EPS}


def _save(free: _Free, running, touched, ledger: QuotaLedger, plan: MixedLoadPlan, held: list) -> tuple:
    return ({n: list(s) for n, s in free.free.items()}, dict(running), set(touched), dict(ledger.usage),
            list(plan.preempted), list(plan.shrunk), len(held))


def _restore(saved: tuple, free: _Free, running, touched, ledger: QuotaLedger, plan: MixedLoadPlan,
             held: list) -> None:
    shares, before, was_touched, usage, preempted, shrunk, placed = saved
    free.free = shares
    running.clear()
    running.update(before)
    touched.clear()
    touched.update(was_touched)
    ledger.usage.clear()
    ledger.usage.update(usage)
    plan.preempted[:], plan.shrunk[:] = preempted, shrunk
    del held[placed:]


class _Reclaimed:
    """Quota training gave back for one wanted replica: decisions kept only if the replica is then placed."""

    def __init__(self, ledger: QuotaLedger, running: dict[str, Running], touched: set[str], free: _Free, kind: str):
        self.ledger, self.running, self.touched, self.free, self.kind = ledger, running, touched, free, kind
        self.decisions: list[Preempt | Shrink] = []
        self.log: list[tuple[Running, tuple[WorkerPlacement, ...]]] = []  # (before, workers released), in order

    def release(self, victim: Running, workers: tuple[WorkerPlacement, ...]) -> None:
        self.free.hold(workers, 1.0)
        self.ledger.add(victim.workload.cluster_queue, self.kind, -len(workers) * victim.workload.devices_per_worker)
        self.log.append((victim, workers, victim.workload.id in self.touched))
        self.touched.add(victim.workload.id)

    def commit(self, plan: MixedLoadPlan) -> None:
        for decision in self.decisions:
            # A victim shrunk for an earlier replica's quota: one decision still, with everything it gives back.
            earlier = next((s for s in plan.shrunk if s.workload_id == decision.workload_id), None)
            if earlier is not None:
                plan.shrunk.remove(earlier)
                if isinstance(decision, Shrink):
                    decision = replace(decision, released=earlier.released + decision.released)
            (plan.shrunk if isinstance(decision, Shrink) else plan.preempted).append(decision)

    def undo(self) -> None:
        for before, workers, was_touched in reversed(self.log):  # the earliest entry of a victim is its state before
            self.free.hold(workers, -1.0)
            self.ledger.add(before.workload.cluster_queue, self.kind, len(workers) * before.workload.devices_per_worker)
            self.running[before.workload.id] = before
            if not was_touched:
                self.touched.discard(before.workload.id)
        self.log, self.decisions = [], []


def _again(plan: MixedLoadPlan) -> frozenset[str]:
    """Victims shrunk for a replica's quota earlier in the cycle: they may give back more quota (not devices)."""
    return frozenset(s.workload_id for s in plan.shrunk if gives_back_quota(s))


def _giveable(running: dict[str, Running], touched: set[str], queue: str, kind: str) -> float:
    """What preemptible training of `queue` holds of `kind` (and is not already giving something back)."""
    return sum(r.usage for r in running.values() if r.workload.cluster_queue == queue and r.accelerator_type == kind
               and r.workload.preemptible and not r.settled and r.workload.id not in touched)


def _reclaim_quota(ledger: QuotaLedger, queue: str, demand: ServingDemand, running: dict[str, Running],
                   touched: set[str], free: _Free, amount: float, own_only: bool = False,
                   again: frozenset[str] = frozenset()) -> _Reclaimed | None:
    """Make the quota `amount` devices of a deployment's replicas were allowed (`serving_quota_refusal`) true in the
    ledger, or change nothing.

    The replica may count on two kinds of quota that training holds: the team's own preemptible training in its
    queue (it uses the quota on loan), and, within the queue's nominal quota, what other queues of the cohort
    borrowed. Devices may still be free, so the give-back for room on a node would not touch that training, and the
    queue (or its cohort) would end over its quota. So it gives the quota back first: the lowest priority, then the
    least work since its last checkpoint; an elastic job gives up workers (down to its minimum) before it is
    stopped. All or none: unless the replica then fits the quota, nothing is given back (None; the replica still
    runs: within nominal quota serving always may, and the cohort stays over until those borrowers end). The
    caller commits the decisions once the replica is placed, or undoes them."""
    kind = demand.accelerator_type
    if ledger.check(queue, kind, amount).ok:
        return None
    # Within nominal once the queue's own preemptible training gave its share back: then the cohort's borrowers too.
    own = _giveable(running, touched - again, queue, kind)
    within_nominal = ledger.usage[(queue, kind)] - own + amount <= ledger.quota(queue, kind).nominal + EPS
    cohort = set(ledger.members(queue)) if within_nominal and not own_only else {queue}

    def borrows(other: str) -> bool:
        return other == queue or ledger.usage[(other, kind)] > ledger.quota(other, kind).nominal + EPS

    def fits() -> bool:
        if own_only:  # the queue itself back within its nominal quota
            return ledger.usage[(queue, kind)] + amount <= ledger.quota(queue, kind).nominal + EPS
        return ledger.check(queue, kind, amount).ok

    candidates = sorted((r for r in running.values()
                         if r.accelerator_type == kind and r.workload.preemptible and not r.settled
                         and (r.workload.id not in touched or r.workload.id in again)
                         and r.workload.cluster_queue in cohort and borrows(r.workload.cluster_queue)),
                        key=lambda r: (r.workload.priority, r.work_since_checkpoint_s, r.workload.id))
    where = "its queue's quota" if cohort == {queue} else f"the nominal quota of {queue} that its cohort borrowed"
    reclaimed = _Reclaimed(ledger, running, touched, free, kind)
    for victim in candidates:
        if fits():
            break
        workload = victim.workload
        if not borrows(workload.cluster_queue):
            continue  # another queue that gave back down to its nominal quota keeps the rest
        width = len(victim.workers)
        while width > workload.workers_min and not fits():
            reclaimed.release(victim, victim.workers[width - 1:width])
            width -= 1
        if width < len(victim.workers):
            narrowed = replace(victim, workers=victim.workers[:width])
            running[workload.id] = narrowed
            reclaimed.decisions.append(Shrink(workload.id, width, victim.workers[width:], SERVING_PREFIX + demand.id,
                                              f"shrunk to {width} workers: gives back {kind} quota deployment "
                                              f"{demand.id} needs within {where}", quota=True))
            if fits():
                break
            victim = narrowed
        reclaimed.release(victim, victim.workers)
        running.pop(workload.id)
        reclaimed.decisions = [d for d in reclaimed.decisions if d.workload_id != workload.id]
        reclaimed.decisions.append(Preempt(workload.id, SERVING_PREFIX + demand.id,
                                           f"preempted: gives back {kind} quota deployment {demand.id} needs within "
                                           f"{where} ({victim.work_since_checkpoint_s:g} s since its last "
                                           "checkpoint)", quota=True))
    if fits():
        return reclaimed
    reclaimed.undo()
    if within_nominal and not own_only:
        # The cohort's borrowers cannot all give back (not preemptible), yet the replica runs (within nominal serving
        # always may): the queue's own training still gives back what would take the queue over its own quota.
        return _reclaim_quota(ledger, queue, demand, running, touched, free, amount, own_only=True, again=again)
    return None


def _settled(running: Running) -> Running:
    """A victim shrunk here is left alone by the rest of the cycle: not preempted or shrunk again (settled), and not
    grown (its maximum is its width). It stays preemptible: its queue's non-preemptible usage does not include it."""
    width = len(running.workers)
    return replace(running, workload=replace(running.workload, workers_max=width), settled=True)


def _place_replica(free: _Free, demand: ServingDemand) -> WorkerPlacement | None:
    candidates = free.candidates(demand)
    held_before = [node for node in dict.fromkeys(demand.held_nodes) if node in candidates]
    for node in held_before + [node for node in candidates if node not in held_before]:
        taken = free.take(node, demand.devices_per_replica)
        if taken is not None:
            return WorkerPlacement(node, taken)
    return None


def _give_back(free: _Free, demand: ServingDemand, running: dict[str, Running], touched: set[str],
               plan: MixedLoadPlan, ledger: QuotaLedger) -> WorkerPlacement | None:
    """Free one node's devices for one wanted replica from the training on it, or None (and nothing changed) when
    no node can be freed. Every node is tried; the replica goes where the training that gives back costs least: the
    lowest highest priority among its victims, then the fewest stopped, then the least work since their last
    checkpoint, then the node with the most free devices (before, the node with the most free devices was taken
    whatever ran there: a high-priority job was stopped while a low-priority one elsewhere could have given back). On
    a node, victims go lowest priority first, then least work since their last checkpoint; an elastic victim gives
    up its workers on that node (down to its minimum) before it is stopped."""
    nodes = sorted(free.candidates(demand), key=lambda name: (-sum(free.free[name]), name))
    best = None
    for order, node in enumerate(nodes):
        trial = _free_node(free, demand, running, touched, node)
        if trial is None:
            continue
        placed, decisions, undo = trial
        before = {workload_id: was for workload_id, was, _ in undo}
        stopped = [before[d.workload_id] for d in decisions if isinstance(d, Preempt)]
        cost = (max(before[d.workload_id].workload.priority for d in decisions), len(stopped),
                sum(r.work_since_checkpoint_s for r in stopped), order)
        free.hold((WorkerPlacement(node, placed),), 1.0)  # first: shares are clamped at 0 and 1
        _put_back(free, running, undo)
        if best is None or cost < best[0]:
            best = (cost, node)
    if best is None:
        return None
    placed, decisions, undo = _free_node(free, demand, running, touched, best[1])
    return _commit(WorkerPlacement(best[1], placed), decisions, touched, plan, undo, ledger)


def _free_node(free: _Free, demand: ServingDemand, running: dict[str, Running], touched: set[str], node: str):
    """Make room for one replica on `node` from the training there: (devices taken, decisions, undo) with the state
    changed, or None with nothing changed."""
    victims = sorted((r for r in running.values()
                      if r.accelerator_type == demand.accelerator_type and r.workload.preemptible
                      and not r.settled and r.workload.id not in touched
                      and any(w.node == node for w in r.workers)),
                     key=lambda r: (r.workload.priority, r.work_since_checkpoint_s, r.workload.id))
    undo: list[tuple[str, Running, tuple[WorkerPlacement, ...]]] = []
    decisions: list[Preempt | Shrink] = []
    for victim in victims:
        workload = victim.workload
        spare = len(victim.workers) - workload.workers_min
        on_node = [w for w in victim.workers if w.node == node]
        if spare > 0:
            released = tuple(on_node[-spare:])
            free.hold(released, 1.0)
            undo.append((workload.id, victim, released))
            narrowed = replace(victim, workers=without_workers(victim.workers, released))
            running[workload.id] = narrowed
            decisions.append(Shrink(workload.id, len(narrowed.workers), released, SERVING_PREFIX + demand.id,
                                    f"shrunk to {len(narrowed.workers)} workers: gives back {_capacity_for(demand)}"))
            placed = free.take(node, demand.devices_per_replica)
            if placed is not None:
                return placed, decisions, undo
            if len(released) == len(on_node):
                continue  # nothing of it is left on this node: stopping it would not help here
            victim = narrowed
        free.hold(victim.workers, 1.0)
        undo.append((workload.id, running.pop(workload.id), victim.workers))
        decisions = [d for d in decisions if d.workload_id != workload.id]
        decisions.append(Preempt(workload.id, SERVING_PREFIX + demand.id,
                                 f"preempted: gives back {_capacity_for(demand)} "
                                 f"({victim.work_since_checkpoint_s:g} s since its last checkpoint)"))
        placed = free.take(node, demand.devices_per_replica)
        if placed is not None:
            return placed, decisions, undo
    _put_back(free, running, undo)  # this node cannot be freed
    return None


def _capacity_for(demand: ServingDemand) -> str:
    """Whose capacity a give-back is for: a live deployment's reserved replicas, or one waiting to be deployed (which
    has reserved nothing yet)."""
    if demand.all_or_none:
        return f"capacity deployment {demand.id} needs to be deployed"
    return f"capacity deployment {demand.id} reserved and now needs"


def _put_back(free: _Free, running: dict[str, Running], undo) -> None:
    for workload_id, before, released in reversed(undo):
        free.hold(released, -1.0)
        running[workload_id] = before


def _commit(placed: WorkerPlacement, decisions, touched: set[str], plan: MixedLoadPlan, undo,
            ledger: QuotaLedger) -> WorkerPlacement:
    for _, before, released in undo:  # what the victims give back no longer counts against their queues
        ledger.add(before.workload.cluster_queue, before.accelerator_type,
                   -len(released) * before.workload.devices_per_worker)
    for decision in decisions:
        touched.add(decision.workload_id)
        (plan.shrunk if isinstance(decision, Shrink) else plan.preempted).append(decision)
    return placed


def gives_back_quota(decision: Preempt | Shrink) -> bool:
    """Whether a give-back returns quota a deployment needs (`_reclaim_quota`), not devices on a node."""
    return decision.quota


def is_serving(workload: Workload) -> bool:
    """Whether a running workload of the plan's snapshot holds a deployment's replicas (not training)."""
    return workload.id.startswith(SERVING_PREFIX)


def training_usage_after(snapshot: Snapshot, result) -> dict[str, float]:
    """Devices training holds per type once the cycle's decisions apply (`snapshot` is the plan's)."""
    usage: dict[str, float] = defaultdict(float)
    preempted = {p.workload_id for p in result.preempted}
    for running in snapshot.running:
        if not is_serving(running.workload) and running.workload.id not in preempted:
            usage[running.accelerator_type] += running.usage
    widths = {r.workload.id: r for r in snapshot.running}
    for shrink in result.shrunk:
        usage[widths[shrink.workload_id].accelerator_type] -= len(shrink.released) * \
            widths[shrink.workload_id].workload.devices_per_worker
    for grow in result.grown:
        usage[widths[grow.workload_id].accelerator_type] += len(grow.added) * \
            widths[grow.workload_id].workload.devices_per_worker
    held = [w.held for w in result.waiting if w.held is not None]
    for admit in [*result.admitted, *held]:
        usage[admit.accelerator_type] += sum(share for w in admit.workers for _, share in w.taken)
    return dict(usage)


def loans(snapshot: Snapshot, serving, training_usage: dict[str, float]) -> dict[str, float]:
    """Per accelerator type, the devices of capacity deployments reserved that training uses (0 when none):
    training usage beyond the schedulable capacity minus every deployment's reservation."""
    capacity, reserved = _capacity_and_reserved(snapshot, serving)
    return {t: max(0.0, used - max(0.0, capacity[t] - reserved[t])) for t, used in training_usage.items()
            if reserved.get(t)}


def _foreign(demand: ServingDemand, nodes) -> list[str]:
    """The nodes of `demand`'s running replicas that are known (in `nodes`, name -> NodeSpec) but of another type."""
    return [n for n in demand.replica_nodes if n in nodes and nodes[n].accelerator_type != demand.accelerator_type]


def replicas_fit(devices: float, per_replica: float) -> int:
    """How many replicas of `per_replica` `devices` free devices of one node hold, as `_Free.take` places them:
    ceil(per_replica) whole devices each, or as many shares on each whole device as fit (1 // 0.1 is 9.0 in floating
    point: 10 shares of 0.1 were counted as 9)."""
    if per_replica <= EPS:
        return 0
    if per_replica >= 1.0 - EPS:
        return int(devices / math.ceil(per_replica - EPS) + 1e-9)
    return int(devices + 1e-9) * int(1 / per_replica + 1e-9)


def _capacity_and_reserved(snapshot: Snapshot, serving, by_pool: bool = False) -> tuple[dict, dict]:
    """Per type, the devices of schedulable nodes, and what the deployments reserve of them: replicas_max each, less
    the replicas that run on nodes outside that capacity (cordoned or unhealthy: before, a 1-replica deployment whose
    replica ran on a cordoned node reserved a second node's worth; found by QA). `by_pool`: per (type, pool), and the
    reservations of deployments pinned to a pool only."""
    capacity: dict = defaultdict(float)
    known = {node.name: node for node in snapshot.nodes}
    for node in snapshot.nodes:
        if node.schedulable:
            capacity[(node.accelerator_type, node.pool) if by_pool else node.accelerator_type] += node.devices
    reserved: dict = defaultdict(float)
    for demand in serving:
        if by_pool and demand.pool is None:
            continue
        # replicas on known nodes outside the type's schedulable capacity (a name the snapshot does not know still
        # reserves: mixed load holds such a replica on the type's free devices; a review)
        elsewhere = sum(1 for node in demand.replica_nodes if node in known
                        and not (known[node].schedulable and known[node].accelerator_type == demand.accelerator_type))
        key = (demand.accelerator_type, demand.pool) if by_pool else demand.accelerator_type
        reserved[key] += replica_devices(max(0, demand.replicas_max - elsewhere), demand.devices_per_replica)
    return capacity, reserved
