"""An in-memory compute backend: a fake cluster for unit tests and for runs without Ray.

It keeps nodes and gangs in a dict and places gangs all-or-none on nodes of the requested type,
so tests of services and tasks exercise the same protocol as the Ray backend.
"""

from __future__ import annotations

import threading

from controlplane.compute.base import GangRequest, GangStatus, ObservedNode
from controlplane.compute.topology import ACCEL_RESOURCE_PREFIX, Topology


class InMemoryComputeBackend:
    name = "memory"

    def __init__(self, nodes: list[ObservedNode] | None = None):
        self._lock = threading.Lock()
        self._nodes = {node.name: node for node in nodes or []}
        self._free = {node.name: dict(node.free or node.capacity) for node in nodes or []}
        self._gangs: dict[str, GangStatus] = {}
        self._reservations: dict[str, list[tuple[str, dict[str, float]]]] = {}

    @classmethod
    def from_topology(cls, topology: Topology) -> InMemoryComputeBackend:
        nodes = []
        for spec in topology.node_specs():
            capacity = {"CPU": spec.num_cpus, **spec.resources}
            nodes.append(ObservedNode(
                node_id=f"mem-{spec.name}", name=spec.name, pool=spec.pool,
                accelerator_type=spec.labels["fleetyard.io/accelerator"],
                leaf_group=spec.labels["fleetyard.io/leaf-group"], alive=True,
                simulated=spec.labels["fleetyard.io/simulated"] == "true",
                capacity=capacity, free=dict(capacity), labels=dict(spec.labels),
            ))
        return cls(nodes)

    def list_nodes(self) -> list[ObservedNode]:
        with self._lock:
            return [
                ObservedNode(**{**node.__dict__, "free": dict(self._free[name])})
                for name, node in self._nodes.items()
            ]

    def set_alive(self, name: str, alive: bool) -> None:
        with self._lock:
            node = self._nodes[name]
            self._nodes[name] = ObservedNode(**{**node.__dict__, "alive": alive})

    def launch_gang(self, request: GangRequest) -> GangStatus:
        with self._lock:
            if request.handle in self._gangs and self._gangs[request.handle].state != "stopped":
                return self._gangs[request.handle]
            demand = self._bundle(request)
            free = {name: dict(values) for name, values in self._free.items()}
            placed = []
            for _ in range(request.workers):
                node = next((name for name, node in self._nodes.items()
                             if node.alive and self._matches(node, request)
                             and all(free[name].get(key, 0.0) >= amount for key, amount in demand.items())),
                            None)
                if node is None:
                    status = GangStatus(request.handle, "pending", (), "not enough free capacity")
                    self._gangs[request.handle] = status
                    return status
                for key, amount in demand.items():
                    free[node][key] -= amount
                placed.append((node, demand))
            self._free = free
            self._reservations[request.handle] = placed
            status = GangStatus(request.handle, "ready", tuple(node for node, _ in placed))
            self._gangs[request.handle] = status
            return status

    def observe_gang(self, handle: str) -> GangStatus:
        with self._lock:
            return self._gangs.get(handle, GangStatus(handle, "unknown"))

    def stop_gang(self, handle: str) -> GangStatus:
        with self._lock:
            for node, demand in self._reservations.pop(handle, []):
                for key, amount in demand.items():
                    self._free[node][key] += amount
            status = GangStatus(handle, "stopped")
            if handle in self._gangs:
                self._gangs[handle] = status
            return status

    @staticmethod
    def _bundle(request: GangRequest) -> dict[str, float]:
        demand = {}
        if request.accelerator_type != "cpu" and request.devices_per_worker:
            demand[ACCEL_RESOURCE_PREFIX + request.accelerator_type] = request.devices_per_worker
        if request.cpus_per_worker:
            demand["CPU"] = request.cpus_per_worker
        return demand

    @staticmethod
    def _matches(node: ObservedNode, request: GangRequest) -> bool:
        if node.accelerator_type != request.accelerator_type:
            return False
        if request.pool and node.pool != request.pool:
            return False
        return not (request.leaf_group and node.leaf_group != request.leaf_group)
