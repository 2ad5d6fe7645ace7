"""One scheduling cycle: which pending workloads start now, where, and what must make room.

Rules (issue 3), in the order applied:
1. Order: priority (high first), then arrival, then id: best-effort FIFO.
2. Gangs: a workload is admitted with all `workers_min` workers placed, or not at all.
3. Type choice: the workload's accepted types in its preference order (cheapest per unit of work
   first, from the efficiency matrix); the next type is tried when the best is full or out of quota.
4. Placement: packed into as few leaf groups as possible (placement.place_gang).
5. Backfill with a reservation: the first workload that cannot start reserves the free devices it
   will need, and later workloads may only use what is left, so it is not starved.
6. Preemption: a workload that still cannot start may take the devices of lower-priority workloads,
   or (within its nominal quota) of workloads borrowing in its cohort. Victims are the lowest
   priority, then the least work lost since their last checkpoint; an elastic victim is shrunk
   before it is stopped; each victim at most once; nothing happens unless the preemptor then fits.
   Victims checkpoint first; the preemptor's devices and quota stay reserved until they are free.
7. Elastic growth: running workloads below `workers_max` grow into capacity nobody waits for.
The cycle is a pure function of the snapshot: the same snapshot gives the same decisions.
"""

from __future__ import annotations

import copy
from collections import defaultdict

from controlplane.scheduling.model import (
    Admit,
    CycleResult,
    Grow,
    Preempt,
    Running,
    Shrink,
    Snapshot,
    Wait,
    Workload,
)
from controlplane.scheduling.placement import EPS, NodeState, WorkerPlacement, best_fit, place_gang
from controlplane.scheduling.quota import QuotaLedger


class _State:
    """The cluster as this cycle sees it: node devices, quota usage and running workloads."""

    def __init__(self, snapshot: Snapshot):
        self.nodes: dict[str, NodeState] = {
            spec.name: NodeState(name=spec.name, pool=spec.pool, accelerator_type=spec.accelerator_type,
                                 leaf_group=spec.leaf_group, device_free=[1.0] * spec.devices,
                                 schedulable=spec.schedulable)
            for spec in sorted(snapshot.nodes, key=lambda n: n.name)
        }
        self.ledger = QuotaLedger(snapshot.cluster_queues)
        self.running: dict[str, Running] = {}
        for running in sorted(snapshot.running, key=lambda r: r.workload.id):
            for worker in running.workers:
                node = self.nodes.get(worker.node)
                if node is not None:
                    for index, share in worker.taken:
                        node.device_free[index] = max(0.0, node.device_free[index] - share)
            self.ledger.add(running.workload.cluster_queue, running.accelerator_type, running.usage)
            self.running[running.workload.id] = running
        self.started_before = frozenset(self.running)

    def nodes_of(self, accelerator_type: str) -> list[NodeState]:
        return [node for node in self.nodes.values() if node.accelerator_type == accelerator_type]

    def release(self, workers) -> None:
        for worker in workers:
            self.nodes[worker.node].give_back(worker.taken)


def schedule(snapshot: Snapshot) -> CycleResult:
    state = _State(snapshot)
    result = CycleResult()
    order = sorted(snapshot.pending, key=lambda w: (-w.priority, w.arrival, w.id))
    preempted: set[str] = set()
    reservation_made = False
    positions: dict[str, int] = defaultdict(int)
    waiting_types: set[str] = set()

    for workload in order:
        if workload.cluster_queue not in state.ledger.queues:
            positions[workload.cluster_queue] += 1
            result.waiting.append(Wait(workload.id, positions[workload.cluster_queue],
                                       f"cluster queue {workload.cluster_queue} does not exist"))
            continue
        types = tuple(snapshot.type_preference.get(workload.id, workload.accepted_types))
        admitted, reasons = _try_admit(state, workload, types)
        if admitted is not None:
            result.admitted.append(admitted)
            continue
        plan = _plan_preemption(state, workload, types, preempted)
        positions[workload.cluster_queue] += 1
        position = positions[workload.cluster_queue]
        if plan is not None:
            victims, shrinks, accelerator_type = plan
            result.preempted.extend(victims)
            result.shrunk.extend(shrinks)
            preempted.update(v.workload_id for v in victims)
            preempted.update(s.workload_id for s in shrinks)
            names = ", ".join([v.workload_id for v in victims] + [f"{s.workload_id} (shrunk)" for s in shrinks])
            result.waiting.append(Wait(workload.id, position, f"waiting for {names} to checkpoint and release "
                                                              f"{accelerator_type} devices", reserved=True))
            waiting_types.update(types)
            continue
        reserved = False
        if not reservation_made:
            reserved = _reserve(state, workload, types)
            reservation_made = reserved
        waiting_types.update(types)
        reason = "; ".join(reasons) or "no accepted accelerator type"
        if reserved:
            reason += " (holds a reservation: later workloads cannot take the devices it needs)"
        result.waiting.append(Wait(workload.id, position, reason, reserved=reserved))

    _grow_elastic(state, result, preempted, waiting_types)
    return result


def _try_admit(state: _State, workload: Workload, types) -> tuple[Admit | None, list[str]]:
    reasons = []
    for accelerator_type in types:
        demand = workload.demand()
        check = state.ledger.check(workload.cluster_queue, accelerator_type, demand)
        if not check.ok:
            reasons.append(check.reason)
            continue
        placement = place_gang(state.nodes_of(accelerator_type), workers=workload.workers_min,
                               devices=workload.devices_per_worker, score=best_fit)
        if placement is None:
            reasons.append(_capacity_reason(state, workload, accelerator_type))
            continue
        state.ledger.add(workload.cluster_queue, accelerator_type, demand)
        workers = tuple(placement.workers)
        state.running[workload.id] = Running(workload=workload, accelerator_type=accelerator_type, workers=workers)
        groups = sorted({state.nodes[w.node].leaf_group for w in workers})
        why = f"{workload.workers_min} x {workload.devices_per_worker:g} {accelerator_type} in leaf group(s) " \
              f"{', '.join(groups)}; {check.reason}"
        if accelerator_type != types[0]:
            why += f" (fallback: {types[0]} was not available)"
        return Admit(workload.id, accelerator_type, workers, check.borrowed, why), reasons
    return None, reasons


def _capacity_reason(state: _State, workload: Workload, accelerator_type: str) -> str:
    nodes = [node for node in state.nodes_of(accelerator_type) if node.schedulable]
    if not nodes:
        return f"no schedulable {accelerator_type} nodes"
    free = sum(node.free_total() for node in nodes)
    return (f"not enough free {accelerator_type}: {free:g} devices free on {len(nodes)} nodes, needs "
            f"{workload.workers_min} x {workload.devices_per_worker:g} placed all at once")


def _plan_preemption(state: _State, workload: Workload, types, already: set[str]):
    """Victims that make `workload` fit, or None. On success the state already excludes them and
    holds the preemptor's devices and quota, so no later workload can take them."""
    for accelerator_type in types:
        candidates = []
        for running in state.running.values():
            victim = running.workload
            if running.accelerator_type != accelerator_type or victim.id in already or not victim.preemptible \
                    or victim.id not in state.started_before:
                continue  # only workloads that were running before this cycle can be victims
            lower = victim.priority < workload.priority
            reclaim = (victim.cluster_queue != workload.cluster_queue
                       and victim.cluster_queue in state.ledger.members(workload.cluster_queue)
                       and state.ledger.borrowed(victim.cluster_queue, accelerator_type) > EPS
                       and _within_nominal(state, workload, accelerator_type))
            if lower or reclaim:
                candidates.append(running)
        if not candidates:
            continue
        candidates.sort(key=lambda r: (r.workload.priority, r.work_since_checkpoint_s, r.workload.id))
        trial = copy.deepcopy(state)
        victims, shrinks = [], []
        for running in candidates:
            victim = running.workload
            kind = "lower priority" if victim.priority < workload.priority else "borrowed quota reclaimed"
            if len(running.workers) > victim.workers_min:  # shrink an elastic victim before stopping it
                released = running.workers[victim.workers_min:]
                trial.release(released)
                trial.ledger.add(victim.cluster_queue, accelerator_type, -len(released) * victim.devices_per_worker)
                trial.running[victim.id] = Running(victim, accelerator_type, running.workers[:victim.workers_min],
                                                   running.work_since_checkpoint_s)
                shrinks.append(Shrink(victim.id, victim.workers_min, tuple(released), workload.id,
                                      f"shrunk to {victim.workers_min} workers for {workload.id} ({kind})"))
                if _fits(trial, workload, accelerator_type):
                    break
            trial.release(trial.running[victim.id].workers)
            trial.ledger.add(victim.cluster_queue, accelerator_type, -trial.running[victim.id].usage)
            del trial.running[victim.id]
            shrinks = [s for s in shrinks if s.workload_id != victim.id]
            victims.append(Preempt(victim.id, workload.id,
                                   f"preempted for {workload.id} ({kind}; {running.work_since_checkpoint_s:g} s "
                                   "since its last checkpoint)"))
            if _fits(trial, workload, accelerator_type):
                break
        else:
            continue  # even every candidate would not make room: preempt nothing
        # Hold the freed devices and quota for the preemptor until the victims are gone.
        placement = place_gang(trial.nodes_of(accelerator_type), workers=workload.workers_min,
                               devices=workload.devices_per_worker)
        trial.ledger.add(workload.cluster_queue, accelerator_type, workload.demand())
        trial.running[workload.id] = Running(workload, accelerator_type, tuple(placement.workers))
        state.__dict__.update(trial.__dict__)
        return victims, shrinks, accelerator_type
    return None


def _within_nominal(state: _State, workload: Workload, accelerator_type: str) -> bool:
    quota = state.ledger.quota(workload.cluster_queue, accelerator_type)
    return state.ledger.usage[(workload.cluster_queue, accelerator_type)] + workload.demand() <= quota.nominal + EPS


def _fits(state: _State, workload: Workload, accelerator_type: str) -> bool:
    if not state.ledger.check(workload.cluster_queue, accelerator_type, workload.demand()).ok:
        return False
    probe = [copy.deepcopy(node) for node in state.nodes_of(accelerator_type)]
    return place_gang(probe, workers=workload.workers_min, devices=workload.devices_per_worker) is not None


def _reserve(state: _State, workload: Workload, types) -> bool:
    """Set aside the free devices the blocked head workload will need on its first feasible type."""
    for accelerator_type in types:
        if not state.ledger.check(workload.cluster_queue, accelerator_type, workload.demand()).ok:
            continue
        nodes = [node for node in state.nodes_of(accelerator_type) if node.schedulable]
        capacity = sum(node.capacity for node in nodes)
        if capacity + EPS < workload.demand():
            continue
        by_group: dict[str, list[NodeState]] = defaultdict(list)
        for node in nodes:
            by_group[node.leaf_group].append(node)
        ordered = sorted(by_group.values(),
                         key=lambda group: (-sum(n.free_total() for n in group), group[0].leaf_group))
        remaining = workload.demand()
        for group in ordered:
            for node in sorted(group, key=lambda n: (-n.free_total(), n.name)):
                for index, share in enumerate(node.device_free):
                    if remaining <= EPS:
                        break
                    if share > EPS:
                        taken = min(share, remaining)
                        node.device_free[index] -= taken
                        remaining -= taken
        state.ledger.add(workload.cluster_queue, accelerator_type, workload.demand())
        return True
    return False


def _grow_elastic(state: _State, result: CycleResult, preempted: set[str], waiting_types: set[str]) -> None:
    admitted_now = {admit.workload_id for admit in result.admitted}
    elastic = sorted((r for r in state.running.values()
                      if r.workload.id not in preempted and len(r.workers) < r.workload.workers_max),
                     key=lambda r: (-r.workload.priority, r.workload.arrival, r.workload.id))
    for running in elastic:
        workload, accelerator_type = running.workload, running.accelerator_type
        if accelerator_type in waiting_types:
            continue  # someone waits for this chip: do not grow into it
        added: list[WorkerPlacement] = []
        groups = {state.nodes[w.node].leaf_group for w in running.workers}
        while len(running.workers) + len(added) < workload.workers_max:
            if not state.ledger.check(workload.cluster_queue, accelerator_type, workload.devices_per_worker).ok:
                break
            nodes = state.nodes_of(accelerator_type)
            near = [n for n in nodes if n.leaf_group in groups] + [n for n in nodes if n.leaf_group not in groups]
            placement = place_gang(near, workers=1, devices=workload.devices_per_worker, leaf_group_aware=False)
            if placement is None:
                break
            state.ledger.add(workload.cluster_queue, accelerator_type, workload.devices_per_worker)
            added.extend(placement.workers)
        if not added:
            continue
        workers = running.workers + tuple(added)
        state.running[workload.id] = Running(workload, accelerator_type, workers, running.work_since_checkpoint_s)
        if workload.id in admitted_now:
            index = next(i for i, a in enumerate(result.admitted) if a.workload_id == workload.id)
            admit = result.admitted[index]
            result.admitted[index] = Admit(admit.workload_id, admit.accelerator_type, workers,
                                           admit.borrowed, admit.reason + f"; started with {len(workers)} workers "
                                           "(elastic, capacity was idle)")
        else:
            result.grown.append(Grow(workload.id, len(workers), tuple(added),
                                     f"grown to {len(workers)} workers into idle {accelerator_type} capacity"))
