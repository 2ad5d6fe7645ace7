"""An in-memory compute backend: a fake cluster for unit tests and for runs without Ray.

It keeps nodes and gangs in a dict and places gangs all-or-none on nodes of the requested type,
so tests of services and tasks exercise the same protocol as the Ray backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controlplane.compute.base import (
    GangRequest,
    GangStatus,
    ObservedNode,
    ServiceOverloaded,
    ServiceRequestInvalid,
    ServiceSpec,
    ServiceStatus,
    ServiceUnavailable,
    TrainingLaunch,
    TrainingReport,
)
from controlplane.compute.topology import ACCEL_RESOURCE_PREFIX, Topology

# Each process has its own in-memory backend (compute/registry.py): under scripts/up --no-ray the Celery worker
# deploys a service into its copy, and the web server's copy never has it (found by QA: SERVING, yet every model
# call answered 503 "service fy-serve-N is not running").
PROCESS_LOCAL = ("the in-memory compute backend (scripts/up --no-ray) keeps a service in the process that deployed "
                 "it (the Celery worker), so model calls through the web server (/v1, the console playground) cannot "
                 "reach it; run scripts/up without --no-ray to call models")


class InMemoryComputeBackend:
    name = "memory"

    def __init__(self, nodes: list[ObservedNode] | None = None):
        self._lock = threading.Lock()
        self._nodes = {node.name: node for node in nodes or []}
        self._free = {node.name: dict(node.free or node.capacity) for node in nodes or []}
        self._gangs: dict[str, GangStatus] = {}
        self._reservations: dict[str, list[tuple[str, dict[str, float]]]] = {}
        self.runs: dict[str, _FakeRun] = {}
        self.services: dict[str, ServiceSpec] = {}
        self.service_states: dict[str, ServiceStatus] = {}
        self.overloaded_services: set[str] = set()  # tests: every call to these answers "overloaded"
        self.steps_per_observe = 50
        self.deleted_services: set[str] = set()
        # Set (to PROCESS_LOCAL) when services are deployed in another process than the one that calls them: the
        # status of each service says so, and a deployment's SERVING reason with it.
        self.process_note = ""
        # What "now" is for simulated runs (seconds since the epoch); a test may set a fixed or stepped clock. A run's
        # simulated steps (0.1 s each) never run ahead of it, so its events carry true times, never future ones.
        self.now: Callable[[], float] = time.time

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

    # ------------------------------------------------------------------ training runs (simulated)

    def launch_training(self, launch: TrainingLaunch) -> TrainingReport:
        with self._lock:
            if launch.handle not in self.runs:
                self.runs[launch.handle] = _FakeRun(launch, clock=self.now)
            return self.runs[launch.handle].report(0)

    def observe_training(self, handle: str, since: int = 0) -> TrainingReport:
        with self._lock:
            run = self.runs.get(handle)
            if run is None:
                return TrainingReport(handle=handle, state="unknown", reason="no run with this name")
            run.advance(self.steps_per_observe)
            return run.report(since)

    def place_training(self, handle: str, nodes: list[str], reason: str = "") -> None:
        with self._lock:
            self._run(handle).place(list(nodes), reason)

    def checkpoint_training(self, handle: str) -> bool:
        with self._lock:
            run = self._run(handle)
            run.checkpoint()
            return True

    def stop_training(self, handle: str, *, checkpoint: bool, reason: str = "") -> None:
        with self._lock:
            run = self.runs.get(handle)
            if run is not None and run.state not in ("succeeded", "failed", "stopped"):
                if checkpoint:
                    run.checkpoint()
                run.set_state("stopped", reason or "stopped")

    def release_training(self, handle: str) -> None:
        with self._lock:
            self.runs.pop(handle, None)

    def list_training_handles(self) -> list[str]:
        with self._lock:
            return sorted(self.runs)

    def inject_training_fault(self, handle: str, *, rank: int, fault: str, node_lost: bool = False) -> None:
        """Simulate a fault: a lost node waits for placement; anything else restarts in place."""
        with self._lock:
            self._run(handle).fault(rank, fault, node_lost=node_lost)

    # ---- inference services (fake): an "echo model" that answers with the prompt's bytes, for unit tests

    def deploy_service(self, spec: ServiceSpec) -> ServiceStatus:
        with self._lock:
            self.services[spec.handle] = spec
            self.deleted_services.discard(spec.handle)
            status = ServiceStatus(handle=spec.handle, state="running", replicas_running=max(1, spec.replicas_min),
                                   replicas_target=max(1, spec.replicas_min), revision=spec.revision,
                                   message=self.process_note)
            self.service_states[spec.handle] = status
            return status

    def observe_service(self, handle: str) -> ServiceStatus:
        with self._lock:
            return self.service_states.get(handle) or ServiceStatus(handle=handle, state="not_found")

    def set_service_status(self, handle: str, **changes) -> None:
        with self._lock:
            self.service_states[handle] = ServiceStatus(**{**self.service_states[handle].__dict__, **changes})

    def delete_service(self, handle: str) -> None:
        with self._lock:
            if self.services.pop(handle, None) is not None:
                self.deleted_services.add(handle)
            self.service_states.pop(handle, None)

    def serves_calls(self, handle: str) -> bool:
        """Whether a model call made in this process reaches the service (one deployed in this process)."""
        with self._lock:
            return handle in self.services

    def list_service_handles(self) -> list[str]:
        with self._lock:
            return sorted(self.services)

    def stream_completion(self, handle: str, request: dict, *, timeout_s: float = 60.0):
        with self._lock:
            spec = self.services.get(handle)
            overloaded = handle in self.overloaded_services
            deleted = handle in self.deleted_services
        if spec is None and deleted:
            raise ServiceUnavailable(f"service {handle} is not running", retry_after_s=5.0)
        if spec is None:  # never deployed here: another process's (see PROCESS_LOCAL)
            raise ServiceUnavailable(f"service {handle} is not running in this process: {PROCESS_LOCAL}",
                                     retry_after_s=5.0)
        if overloaded:
            raise ServiceOverloaded(f"service {handle}: every replica queue is full", retry_after_s=1.0)
        prompt = [int(t) for t in request["prompt_tokens"]]
        limit = int(spec.engine.get("max_prompt_tokens") or 4096)  # 0: the model's window (the echo model has none)
        if len(prompt) > limit:
            raise ServiceRequestInvalid(f"prompt: {len(prompt)} tokens; this model accepts at most {limit}")
        return _echo_events(prompt, request)

    def _run(self, handle: str) -> _FakeRun:
        run = self.runs.get(handle)
        if run is None:
            raise LookupError(f"no training run {handle!r}")
        return run


# jobs.runtime.goodput.RESIZE (the platform package does not import the jobs app): the recovery kind of a relaunch
# on new nodes.
RESIZE = "resize"
RELAUNCH_S = 5.0  # simulated: checkpoint, stop and start on the new nodes


def workers_on(nodes) -> str:
    """"N worker(s) on ...", each node named once with its count when it holds more than one worker ("3 worker(s)
    on cpu-0 (2), cpu-1"); before, a node was named once per worker ("2 worker(s) on cpu-0, cpu-0")."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    where = ", ".join(name if count == 1 else f"{name} ({count})" for name, count in counts.items())
    return f"{len(nodes)} worker(s) on {where}"


class _FakeRun:
    """A simulated run: each observation advances it by some steps (per worker metrics, periodic
    checkpoints), and faults produce the same events as the Ray supervisor."""

    def __init__(self, launch: TrainingLaunch, clock: Callable[[], float] = time.time) -> None:
        self.launch = launch
        self.now = clock
        runtime = launch.runtime or {}
        self.total_steps = int((runtime.get("hyperparameters") or {}).get("steps", 200))
        self.interval = int(runtime.get("checkpoint_interval_steps", 100))
        self.max_restarts = int(runtime.get("max_restarts", 3))
        self.nodes = list(launch.nodes)
        self.state, self.reason = "starting", "starting the gang"
        self.step = -1
        self.last_checkpoint_step = -1
        self.restarts = 0
        self.events: list[dict] = []
        self.seq = 0
        self.recovering: dict | None = None
        # The time its events carry: it starts now and moves by the simulated durations, but never past now (an
        # observation advances many 0.1 s steps at once). Before, it started an hour in the past so that it never
        # ran ahead, and a job's started_at, logs and metrics read an hour early (goodput: 3602 s for a 2 s job).
        self.clock = clock()
        self.set_state("running", workers_on(self.nodes))

    def tick(self, seconds: float) -> None:
        """Simulated time passes, up to now (the clock never goes back)."""
        self.clock = max(self.clock, min(self.clock + seconds, self.now()))

    def event(self, **event) -> None:
        self.seq += 1
        self.events.append({**event, "seq": self.seq, "at": event.get("at", self.clock)})

    def set_state(self, state: str, reason: str) -> None:
        self.state, self.reason = state, reason
        self.event(type="state", state=state, reason=reason, step=self.step, nodes=list(self.nodes),
                   restarts=self.restarts)

    def checkpoint(self) -> None:
        if self.step >= 0 and self.step > self.last_checkpoint_step:
            self.last_checkpoint_step = self.step
            self.event(type="checkpoint", rank=0, step=self.step, size_bytes=1024, path="", save_s=0.01)

    def advance(self, steps: int) -> None:
        if self.state != "running":
            return
        for _ in range(steps):
            if self.step + 1 >= self.total_steps:
                break
            self.step += 1
            self.tick(0.1)
            if self.recovering is not None:  # before the step's metrics, as the supervisor reports it
                self.event(type="recovery", **self.recovering, resumed_at=self.clock, restarts=self.restarts,
                           nodes=list(self.nodes))
                self.recovering = None
            for rank in range(len(self.nodes)):
                self.event(type="metric", rank=rank, step=self.step, loss=5.0 / (1 + self.step / 50),
                           step_time=0.1, compute_time=0.08, tokens_per_s=10240.0)
            if (self.step + 1) % self.interval == 0 or self.step + 1 == self.total_steps:
                self.checkpoint()
        if self.step + 1 >= self.total_steps:
            self.set_state("succeeded", f"all {len(self.nodes)} worker(s) finished at step {self.step}")

    def fault(self, rank: int, kind: str, *, node_lost: bool) -> None:
        node = self.nodes[rank]
        self.tick(1.0)
        if kind == "slow_node":  # advisory: reported, the run keeps going
            self.event(type="fault", kind=kind, rank=rank, node=node, occurred_at=self.clock, detected_at=self.clock,
                       evidence="simulated slow node", data={}, step=self.step, advisory=True)
            self.event(type="placement_needed", exclude=[node], nodes=list(self.nodes), advisory=True, reason=kind)
            return
        if self.recovering is not None and self.recovering["kind"] == RESIZE:
            self.event(type="recovery", **self.recovering, resumed_at=self.clock - 1.0, restarts=self.restarts,
                       nodes=list(self.nodes))  # a relaunch that never trained: lost until the fault
            self.recovering = None
        self.event(type="fault", kind=kind, rank=rank, node=node, occurred_at=self.clock - 1.0,
                   detected_at=self.clock, evidence=f"simulated {kind}", data={}, step=self.step)
        self.recovering = {"kind": kind, "occurred_at": self.clock - 1.0, "detected_at": self.clock, "node": node,
                           "rank": rank, "recomputed_steps": max(0, self.step - self.last_checkpoint_step),
                           "recomputed_s": 0.1 * max(0, self.step - self.last_checkpoint_step),
                           "from_step": self.step, "checkpoint_step": self.last_checkpoint_step}
        self.restarts += 1
        self.step = self.last_checkpoint_step
        if self.restarts > self.max_restarts:
            self.set_state("failed", f"gave up after {self.max_restarts} restart(s); last fault: {kind} on {node}")
            return
        if node_lost:
            self.set_state("awaiting_placement", f"{kind} on {node}: waiting for the control plane")
            self.event(type="placement_needed", exclude=[node], nodes=list(self.nodes), reason=kind)
        else:
            self.set_state("recovering", f"restarting after {kind} on {node}")
            self.set_state("running", workers_on(self.nodes))

    def place(self, nodes: list[str], reason: str) -> None:
        """Like GangSupervisor._replace: a running gang checkpoints, stops and starts on the new nodes (which takes
        RELAUNCH_S), and reports a recovery of kind "resize" at its first step there."""
        if self.state == "running" and sorted(nodes) == sorted(self.nodes):
            return
        if self.state == "running":
            self.checkpoint()
            if self.recovering is None:
                self.recovering = {"kind": RESIZE, "occurred_at": self.clock, "detected_at": self.clock,
                                   "node": None, "rank": None, "recomputed_steps": 0, "recomputed_s": 0.0,
                                   "from_step": self.step, "checkpoint_step": self.last_checkpoint_step}
            self.tick(RELAUNCH_S)
        self.nodes = nodes
        self.set_state("recovering", reason or "new placement")
        self.set_state("running", workers_on(nodes))

    def report(self, since: int) -> TrainingReport:
        self.events = [e for e in self.events if e["seq"] > since]
        return TrainingReport(handle=self.launch.handle, state=self.state, reason=self.reason, step=self.step,
                              nodes=tuple(self.nodes), restarts=self.restarts,
                              last_checkpoint_step=self.last_checkpoint_step, events=tuple(self.events))


def _echo_events(prompt: list[int], request: dict):
    """The fake model: repeats the prompt's bytes (cycling) up to max_tokens; like the real engine, the output
    ends before the first stop string, which is never streamed."""
    started = time.monotonic()
    source = [t for t in prompt if 0 <= t < 256] or [ord("?")]
    tokens = [source[i % len(source)] for i in range(int(request.get("max_tokens", 16)))]
    text = bytes(tokens).decode("utf-8", errors="replace")
    cuts = [text.find(s) for s in request.get("stop") or [] if s and s in text]
    finish = "stop" if cuts else "length"
    if cuts:
        text = text[:min(cuts)]
        tokens = list(text.encode("utf-8"))
    for token in tokens:
        yield {"type": "token", "token_id": token, "text": bytes([token]).decode("utf-8", errors="replace")}
    elapsed = time.monotonic() - started
    produced = len(tokens)
    yield {"type": "done", "finish_reason": finish, "metrics": {
        "queue_s": 0.0, "ttft_s": elapsed / max(1, produced), "tpot_s": elapsed / max(1, produced) if produced > 1
        else None, "prompt_tokens": len(prompt), "cached_tokens": 0, "output_tokens": produced,
        "replica": "memory-0"}}
