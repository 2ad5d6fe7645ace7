"""The compute backend protocol and the plain records that cross it.

Control-plane services and Celery tasks talk to the cluster only through `ComputeBackend`. Two
implementations: `memory.InMemoryComputeBackend` (a fake for unit tests) and
`ray_backend.RayComputeBackend` (the real one; the only module that imports `ray`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ObservedNode:
    """A node as the cluster reports it. Capacity and free are per resource name (CPU, accel:...)."""

    node_id: str
    name: str
    pool: str
    accelerator_type: str
    leaf_group: str
    alive: bool
    simulated: bool
    capacity: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    address: str = ""


@dataclass(frozen=True)
class GangRequest:
    """All-or-none resources for a workload: `workers` bundles of `devices_per_worker` chips each."""

    handle: str
    accelerator_type: str
    workers: int
    devices_per_worker: float
    cpus_per_worker: float = 0.0
    pool: str | None = None
    leaf_group: str | None = None


@dataclass(frozen=True)
class GangStatus:
    handle: str
    state: str  # "pending" | "ready" | "stopped" | "unknown"
    node_names: tuple[str, ...] = ()
    message: str = ""


@runtime_checkable
class ComputeBackend(Protocol):
    name: str

    def list_nodes(self) -> list[ObservedNode]: ...

    def launch_gang(self, request: GangRequest) -> GangStatus: ...

    def observe_gang(self, handle: str) -> GangStatus: ...

    def stop_gang(self, handle: str) -> GangStatus: ...
