"""The scheduling core's inputs and outputs: plain, immutable dataclasses (no Django, no Ray).

Inputs describe a moment of the cluster: nodes with per-device free shares, ClusterQueues with their
per-accelerator quotas and cohorts, running workloads and pending workloads. Outputs are decisions
the control plane applies transactionally: admit, preempt (checkpoint first), shrink, grow, and for
every workload left waiting, its position and the reason it waits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controlplane.scheduling.placement import WorkerPlacement


@dataclass(frozen=True)
class Quota:
    """One ClusterQueue's quota of one accelerator type, in devices (CPU cores for the `cpu` type)."""

    nominal: float
    borrowing_limit: float | None = None  # None: may borrow whatever the cohort has idle
    lending_limit: float | None = None  # None: lends all of its idle nominal quota


@dataclass(frozen=True)
class ClusterQueueSpec:
    name: str
    quotas: Mapping[str, Quota]
    cohort: str | None = None
    # Kueue's preemption policies (rule 7 of scheduler.py): may a workload of this queue take lower-priority
    # workloads of its own queue ("LowerPriority") or not ("Never"); may it take workloads of other queues of its
    # cohort that use more than their nominal quota: of any priority while it reclaims quota within its own nominal
    # ("Any"), only lower-priority ones ("LowerPriority"), or none ("Never").
    preemption_within_queue: str = "LowerPriority"
    reclaim_within_cohort: str = "Any"


@dataclass(frozen=True)
class Workload:
    """A gang request: `workers` (elastic between min and max) x `devices_per_worker` on one chip type."""

    id: str
    cluster_queue: str
    accepted_types: tuple[str, ...]
    devices_per_worker: float = 1.0
    workers_min: int = 1
    workers_max: int = 1
    priority: int = 0
    arrival: float = 0.0
    workload_class: str = "default"
    preemptible: bool = True
    # Per accepted type, the worker's size there where it differs from `devices_per_worker`: a job that accepts the
    # CPU pool and an accelerator is so many cores on the one and so many devices on the other.
    sizes: tuple[tuple[str, float], ...] = ()

    def demand(self, workers: int | None = None) -> float:
        return (self.workers_min if workers is None else workers) * self.devices_per_worker

    def on(self, accelerator_type: str) -> Workload:
        """This workload as it would run on `accelerator_type`: its size there (itself when it has one size)."""
        if not self.sizes:
            return self
        for slug, size in self.sizes:
            if slug == accelerator_type:
                return replace(self, devices_per_worker=size, sizes=())
        return replace(self, sizes=())


@dataclass(frozen=True)
class Running:
    """An admitted workload and where its workers are."""

    workload: Workload
    accelerator_type: str
    workers: tuple[WorkerPlacement, ...]
    work_since_checkpoint_s: float = 0.0  # what preempting it now would throw away
    # Not preempted or shrunk in this cycle: already shrunk before it (mixed load), or not in a state a victim can
    # leave now (the platform's jobs STARTING or RECOVERING).
    settled: bool = False

    def __post_init__(self) -> None:
        # Its workload as sized on the type it runs on: given the pending workload with per-type `sizes`, its usage,
        # release and growth were counted at the default size (4 cores on cpu counted as 1, and a queue of nominal 4
        # admitted 3 more; found by QA).
        if self.workload.sizes:
            object.__setattr__(self, "workload", self.workload.on(self.accelerator_type))

    @property
    def usage(self) -> float:
        return len(self.workers) * self.workload.devices_per_worker


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str
    accelerator_type: str
    leaf_group: str
    devices: int
    schedulable: bool = True


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeSpec, ...]
    cluster_queues: tuple[ClusterQueueSpec, ...]
    running: tuple[Running, ...] = ()
    pending: tuple[Workload, ...] = ()
    # Preference order of accepted types per workload id (cheapest per unit of work first); when a
    # workload is absent, its accepted_types order is used.
    type_preference: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Per type, the most devices non-preemptible workloads may hold, all queues together (mixed load: the capacity
    # serving deployments have not reserved; a non-preemptible workload could not give reserved capacity back when
    # they scale out). A type absent here has no such cap.
    non_preemptible_caps: Mapping[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Admit:
    workload_id: str
    accelerator_type: str
    workers: tuple[WorkerPlacement, ...]
    borrowed: float
    reason: str


@dataclass(frozen=True)
class Preempt:
    """Ask the victim to checkpoint, then stop; its quota and devices go to `for_workload`."""

    workload_id: str
    for_workload: str
    reason: str
    checkpoint_first: bool = True
    quota: bool = False  # a give-back of quota a deployment needs (mixed load), not of devices on a node


@dataclass(frozen=True)
class Shrink:
    """Checkpoint, then continue with fewer workers (an elastic victim shrunk instead of preempted)."""

    workload_id: str
    to_workers: int
    released: tuple[WorkerPlacement, ...]
    for_workload: str
    reason: str
    quota: bool = False  # a give-back of quota a deployment needs (mixed load), not of devices on a node


@dataclass(frozen=True)
class Grow:
    workload_id: str
    to_workers: int
    added: tuple[WorkerPlacement, ...]
    reason: str


@dataclass(frozen=True)
class Wait:
    workload_id: str
    position: int  # 1-based place among the waiting workloads of its ClusterQueue; 0 for one that is `held`
    reason: str
    reserved: bool = False  # holds a reservation: later workloads may not take its devices
    # After a preemption: the admission the preemptor holds (devices and quota) while its victims checkpoint and
    # stop. The platform admits it at once so no later workload takes what the victims give back, and starts it
    # once they are gone (jobs/admission.py); a simulator may ignore it and admit on a later cycle.
    held: Admit | None = None


@dataclass
class CycleResult:
    admitted: list[Admit] = field(default_factory=list)
    preempted: list[Preempt] = field(default_factory=list)
    shrunk: list[Shrink] = field(default_factory=list)
    grown: list[Grow] = field(default_factory=list)
    waiting: list[Wait] = field(default_factory=list)
