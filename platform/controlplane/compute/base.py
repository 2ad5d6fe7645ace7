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


# ---------------------------------------------------------------------------------------------
# training runs: a gang of workers watched by a supervisor (jobs/runtime/supervisor.py on Ray)

# States a run reports. "awaiting_placement": the gang lost a node and waits for `place_training`.
RUN_STATES = ("starting", "running", "recovering", "awaiting_placement", "succeeded", "failed", "stopped",
              "unknown")
RUN_TERMINAL_STATES = ("succeeded", "failed", "stopped")


@dataclass(frozen=True)
class TrainingLaunch:
    """Everything a run needs: the nodes (one per worker, as the scheduler placed them) and the
    runtime spec (trainer, hyperparameters, checkpoint dir and policy, restarts, detection policy)."""

    handle: str
    job_id: int
    nodes: tuple[str, ...]
    accelerator_type: str
    devices_per_worker: float
    cpus_per_worker: float
    runtime: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingReport:
    """A run's state and the events (metric, log, checkpoint, fault, recovery, state, placement_needed)
    with sequence numbers after the cursor the caller passed."""

    handle: str
    state: str
    reason: str = ""
    step: int = -1
    nodes: tuple[str, ...] = ()
    restarts: int = 0
    last_checkpoint_step: int = -1
    events: tuple[dict, ...] = ()

    @property
    def terminal(self) -> bool:
        return self.state in RUN_TERMINAL_STATES


@runtime_checkable
class TrainingBackend(Protocol):
    """The training half of the compute backend (both implementations provide it)."""

    def launch_training(self, launch: TrainingLaunch) -> TrainingReport: ...

    def observe_training(self, handle: str, since: int = 0) -> TrainingReport: ...

    def place_training(self, handle: str, nodes: list[str], reason: str = "") -> None: ...

    def checkpoint_training(self, handle: str) -> bool: ...

    def stop_training(self, handle: str, *, checkpoint: bool, reason: str = "") -> None: ...

    def release_training(self, handle: str) -> None: ...

    def list_training_handles(self) -> list[str]: ...


# ---------------------------------------------------------------------------------------------
# inference services: one Ray Serve application per deployment (inference/runtime/serve_app.py on Ray)

SERVICE_STATES = ("deploying", "running", "unhealthy", "deleting", "not_found")
ROUTERS = ("prefix", "pow2", "round_robin")


@dataclass(frozen=True)
class ServiceSpec:
    """A deployment as the backend runs it. Applying a spec to an existing handle is a rolling update
    (Serve starts new replicas before it stops old ones, and old ones drain their requests).

    `model_dir`: a checkpoint directory holding the built-in LM's model.pt + config.json.
    `engine`: the LLM server's settings (inference/runtime/engine.EngineConfig.from_dict).
    `router`: "prefix" (prefix-aware, the default), "pow2" (Ray Serve's default) or "round_robin".
    """

    handle: str
    deployment_id: int
    revision: int
    model_dir: str
    accelerator_type: str
    devices_per_replica: float
    replicas_min: int
    replicas_max: int
    target_ongoing_requests: float
    max_ongoing_requests: int
    max_queued_requests: int
    pool: str | None = None
    cpus_per_replica: float = 0.25
    engine: dict = field(default_factory=dict)
    router: str = "prefix"
    # Serve's autoscaling delays (inference.autoscaling decides them from the SLA)
    upscale_delay_s: float = 3.0
    downscale_delay_s: float = 30.0


@dataclass(frozen=True)
class ServiceStatus:
    """What the backend sees of a service: its state, replica counts and the revision it runs."""

    handle: str
    state: str  # one of SERVICE_STATES
    replicas_running: int = 0
    replicas_target: int = 0
    revision: int = 0
    message: str = ""
    node_names: tuple[str, ...] = ()  # one entry per running replica: the node it runs on
    # one entry per replica placed on a node that does not run yet (starting): the node it is being deployed to
    starting_node_names: tuple[str, ...] = ()


class ServiceError(Exception):
    """A request could not be served; `status` is the HTTP status the gateway answers with."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ServiceOverloaded(ServiceError):
    """Every replica's queue is full: answer 429 with Retry-After."""

    status = 429


class ServiceUnavailable(ServiceError):
    """No replica can take the request (not deployed, starting, or gone): answer 503 with Retry-After."""

    status = 503


class ServiceRequestInvalid(ServiceError):
    """The replica refused the request as invalid (e.g. prompt longer than the model's window): 400."""

    status = 400


@runtime_checkable
class ServingBackend(Protocol):
    """The inference half of the compute backend (both implementations provide it).

    `stream_completion(handle, request)` yields event dicts, in order:
      {"type": "token", "token_id": int, "text": str}            one per generated token
      {"type": "done", "finish_reason": "stop"|"length", "metrics": {...}}
    where metrics holds queue_s, ttft_s, tpot_s (None with fewer than 2 tokens), prompt_tokens,
    cached_tokens, output_tokens and replica. `request` is
      {"prompt_tokens": [int], "max_tokens": int, "temperature": float, "seed": int,
       "stop": [str], "ignore_eos": bool}.
    It raises ServiceOverloaded / ServiceUnavailable / ServiceRequestInvalid before the first event.
    """

    def deploy_service(self, spec: ServiceSpec) -> ServiceStatus: ...

    def observe_service(self, handle: str) -> ServiceStatus: ...

    def delete_service(self, handle: str) -> None: ...

    def list_service_handles(self) -> list[str]: ...

    def stream_completion(self, handle: str, request: dict, *, timeout_s: float = 60.0): ...

    def serves_calls(self, handle: str) -> bool:
        """Whether stream_completion from this process can reach the service (False where the backend keeps it in
        another process: the in-memory one under scripts/up --no-ray)."""
        ...
