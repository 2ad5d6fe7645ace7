"""Per-device node state, fit tests and node-choice policies for workers of a gang.

A node is a list of devices, each with a free share in [0, 1] (1.0 = a whole free device). A worker
asks for `devices` per worker: a whole number (>= 1) takes that many *whole* free devices on one
node; a fraction (< 1) takes that share of a single device (inference replicas sharing a chip).
Policies choose the node for one worker; `place_gang` places all workers of a gang or none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

EPS = 1e-9


@dataclass
class NodeState:
    name: str
    pool: str
    accelerator_type: str
    leaf_group: str
    device_free: list[float]
    schedulable: bool = True  # false when cordoned or unhealthy
    cpu_free: float = 0.0

    @property
    def capacity(self) -> int:
        return len(self.device_free)

    def free_total(self) -> float:
        return sum(self.device_free)

    def whole_free(self) -> int:
        return sum(1 for share in self.device_free if share >= 1.0 - EPS)

    def fits(self, devices: float) -> bool:
        if not self.schedulable:
            return False
        if devices >= 1.0 - EPS:
            return self.whole_free() >= round(devices)
        return any(share >= devices - EPS for share in self.device_free)

    def take(self, devices: float, *, prefer: str = "best") -> tuple[tuple[int, float], ...]:
        """Consume `devices` and return what was taken as (device index, share) pairs.

        A fraction goes to the device with the least free share that still fits (best fit), so
        whole devices stay whole for gangs; whole devices take the lowest free indices.
        """
        if not self.fits(devices):
            raise ValueError(f"{self.name} cannot fit {devices} devices")
        if devices >= 1.0 - EPS:
            count = round(devices)
            chosen = [i for i, share in enumerate(self.device_free) if share >= 1.0 - EPS][:count]
            for index in chosen:
                self.device_free[index] = 0.0
            return tuple((index, 1.0) for index in chosen)
        candidates = [i for i, share in enumerate(self.device_free) if share >= devices - EPS]
        key = (lambda i: (self.device_free[i], i)) if prefer == "best" else (lambda i: (-self.device_free[i], i))
        index = min(candidates, key=key)
        self.device_free[index] = max(0.0, self.device_free[index] - devices)
        return ((index, devices),)

    def give_back(self, taken: Sequence[tuple[int, float]]) -> None:
        for index, share in taken:
            self.device_free[index] = min(1.0, self.device_free[index] + share)


# A node-choice policy scores candidate nodes for one worker; the lowest score wins (ties: name).
NodeScore = Callable[[NodeState, float], float]


def first_fit(node: NodeState, devices: float) -> float:
    return 0.0  # ties broken by node order: the first node that fits


def best_fit(node: NodeState, devices: float) -> float:
    return node.free_total() - devices  # the fullest node that still fits


@dataclass(frozen=True)
class WorkerPlacement:
    node: str
    taken: tuple[tuple[int, float], ...]


def without_workers(workers: Sequence[WorkerPlacement], released: Sequence[WorkerPlacement]
                    ) -> tuple[WorkerPlacement, ...]:
    """`workers` less `released`, one for one: two workers with equal placements (two half-core workers on one core)
    are two workers, so releasing one keeps the other (a set difference dropped both). The last equal ones go first,
    as a shrink releases the last workers."""
    left = Counter(released)
    kept = []
    for worker in reversed(workers):
        if left[worker] > 0:
            left[worker] -= 1
        else:
            kept.append(worker)
    return tuple(reversed(kept))


@dataclass
class GangPlacement:
    workers: list[WorkerPlacement] = field(default_factory=list)

    def nodes(self) -> list[str]:
        return [worker.node for worker in self.workers]


# Takes a worker's devices on the chosen node (NodeState.take when none is given: a fraction on the fullest device).
DeviceTake = Callable[[NodeState, float], tuple[tuple[int, float], ...]]


def place_gang(nodes: Sequence[NodeState], *, workers: int, devices: float, score: NodeScore = best_fit,
               leaf_group_aware: bool = True, take: DeviceTake | None = None) -> GangPlacement | None:
    """Place `workers` workers of `devices` each on `nodes`, all or none (state is left untouched on failure).

    With `leaf_group_aware`, the gang goes into the leaf group that can hold all of it with the least
    capacity left over (so bigger groups stay whole for bigger gangs); if no single group can, groups
    are filled largest-capacity-first so the gang spans as few groups as possible.
    """
    if workers <= 0:
        return GangPlacement()
    candidates = [node for node in nodes if node.schedulable]
    if leaf_group_aware:
        groups: dict[str, list[NodeState]] = {}
        for node in candidates:
            groups.setdefault(node.leaf_group, []).append(node)
        holding = []
        for name, members in groups.items():
            slots = sum(_slots(node, devices) for node in members)
            if slots >= workers:
                holding.append((slots - workers, name))
        if holding:
            _, best_group = min(holding)
            placement = _place_in(groups[best_group], workers, devices, score, take=take)
            if placement is not None:
                return placement
        ordered = sorted(groups.values(), key=lambda members: (-sum(_slots(n, devices) for n in members),
                                                                members[0].leaf_group))
        candidates = [node for members in ordered for node in members]
        return _place_in(candidates, workers, devices, score, keep_order=True, take=take)
    return _place_in(candidates, workers, devices, score, take=take)


def _slots(node: NodeState, devices: float) -> int:
    """How many workers of `devices` this node could hold now."""
    if not node.schedulable:
        return 0
    if devices >= 1.0 - EPS:
        return node.whole_free() // max(1, round(devices))
    return sum(int((share + EPS) // devices) for share in node.device_free)


def _place_in(nodes: Sequence[NodeState], workers: int, devices: float, score: NodeScore,
              keep_order: bool = False, take: DeviceTake | None = None) -> GangPlacement | None:
    placement = GangPlacement()
    for _ in range(workers):
        fitting = [node for node in nodes if node.fits(devices)]
        if not fitting:
            for worker in placement.workers:  # roll back: all or none
                next(node for node in nodes if node.name == worker.node).give_back(worker.taken)
            return None
        if keep_order:
            node = fitting[0]
        else:
            node = min(fitting, key=lambda n: (score(n, devices), n.name))
        taken = node.take(devices) if take is None else take(node, devices)
        placement.workers.append(WorkerPlacement(node=node.name, taken=taken))
    return placement
