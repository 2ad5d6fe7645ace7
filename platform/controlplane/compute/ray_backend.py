"""The real compute backend: training gangs as Ray placement groups on labelled node pools.

The only control-plane module that imports `ray`. A gang is a named, detached placement group
(name = the gang's handle) of one bundle per worker, `{accel:<type>: devices, CPU: cpus}`, pinned
to nodes by label selectors (accelerator type, and pool / leaf group when asked), strategy PACK.
Ray reserves all bundles or none, so a gang is either ready or pending, never half placed.
Nodes are read from the GCS directly (no dashboard needed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from controlplane.compute.base import (
    GangRequest,
    GangStatus,
    ObservedNode,
    ServiceError,
    ServiceOverloaded,
    ServiceRequestInvalid,
    ServiceSpec,
    ServiceStatus,
    ServiceUnavailable,
    TrainingLaunch,
    TrainingReport,
)
from controlplane.compute.topology import (
    ACCEL_RESOURCE_PREFIX,
    LABEL_ACCELERATOR,
    LABEL_LEAF_GROUP,
    LABEL_NODE,
    LABEL_POOL,
    LABEL_SIMULATED,
)

logger = logging.getLogger(__name__)

_CONNECT_LOCK = threading.Lock()
LAUNCH_WAIT_S = 1.0
OBSERVE_TIMEOUT_S = 10.0
# Supervisors run on the head node (it outlives the worker nodes); Ray gives the head this resource.
HEAD_RESOURCE = "node:__internal_head__"
TRAINING_PREFIX = "fy-train-"
SERVICE_PREFIX = "fy-serve-"
_SERVE_STATES = {"RUNNING": "running", "DEPLOYING": "deploying", "DEPLOY_FAILED": "unhealthy",
                 "UNHEALTHY": "unhealthy", "DELETING": "deleting", "NOT_STARTED": "deploying"}
# Serve replica states of a replica placed on a node that does not serve yet (its actor holds the node's resources)
_STARTING_REPLICA_STATES = ("STARTING", "UPDATING", "RECOVERING")

# Resources that describe the node rather than schedulable capacity a workload asks for.
_HIDDEN_RESOURCES = ("memory", "object_store_memory")

_STATE_MAP = {
    "CREATED": "ready",
    "PENDING": "pending",
    "PREPARED": "pending",
    "RESCHEDULING": "pending",
    "REMOVED": "stopped",
}


class RayComputeBackend:
    """ComputeBackend on a Ray cluster reached at `address` (GCS host:port, or "auto")."""

    name = "ray"

    def __init__(self, *, address: str, namespace: str = "fleetyard",
                 env: Mapping[str, str] | None = None) -> None:
        """`env`: variables to set before connecting, e.g. LocalCluster.client_env() (auth token)."""
        self.address = address
        self.namespace = namespace
        self.env = dict(env or {})
        self._handles: dict[str, Any] = {}
        self._handles_lock = threading.Lock()  # guards _handle_locks
        self._handle_locks: dict[str, threading.Lock] = {}  # one per service: a slow one does not hold the rest

    # ------------------------------------------------------------------ connection

    def _ray(self):
        """Import ray and connect once per process (lazily: constructing the backend is free)."""
        import ray

        if ray.is_initialized():
            return ray
        with _CONNECT_LOCK:
            if ray.is_initialized():
                return ray
            os.environ.update(self.env)
            _reload_ray_auth_config()
            ray.init(address=self.address, namespace=self.namespace, logging_level=logging.WARNING)
        return ray

    # ------------------------------------------------------------------ nodes

    def list_nodes(self) -> list[ObservedNode]:
        """Every pool node (the head, which has no pool label, is left out), dead ones included.

        A node name that was restarted shows only its live incarnation.
        """
        ray = self._ray()
        from ray._private import state as ray_state

        available = ray_state.available_resources_per_node()
        by_name: dict[str, ObservedNode] = {}
        for raw in ray.nodes():
            labels = {str(k): str(v) for k, v in (raw.get("Labels") or {}).items()}
            pool = labels.get(LABEL_POOL)
            if not pool:
                continue
            node_id = raw["NodeID"]
            alive = bool(raw.get("Alive"))
            capacity = _visible(raw.get("Resources") or {})
            free_raw = available.get(node_id, {}) if alive else {}
            free = {key: float(free_raw.get(key, 0.0)) for key in capacity}
            name = labels.get(LABEL_NODE) or raw.get("NodeName") or node_id
            node = ObservedNode(
                node_id=node_id, name=name, pool=pool,
                accelerator_type=labels.get(LABEL_ACCELERATOR, ""),
                leaf_group=labels.get(LABEL_LEAF_GROUP, ""), alive=alive,
                simulated=labels.get(LABEL_SIMULATED, "").lower() == "true",
                capacity=capacity, free=free, labels=labels,
                address=f"{raw.get('NodeManagerAddress', '')}:{raw.get('NodeManagerPort', '')}",
            )
            previous = by_name.get(name)
            if previous is None or (node.alive and not previous.alive):
                by_name[name] = node
        return sorted(by_name.values(), key=lambda n: (n.pool, n.name))

    # ------------------------------------------------------------------ gangs

    def launch_gang(self, request: GangRequest) -> GangStatus:
        """Reserve the gang (all or none); returns ready or pending within about a second."""
        bundle = gang_bundle(request)
        selector = gang_label_selector(request)
        existing = self._placement_group_info(request.handle)
        if existing is not None and existing["state"] != "REMOVED":
            return self._status(request.handle, existing)
        ray = self._ray()
        from ray.util.placement_group import placement_group

        try:
            group = placement_group([dict(bundle) for _ in range(request.workers)], strategy="PACK",
                                    name=request.handle, lifetime="detached",
                                    bundle_label_selector=[dict(selector) for _ in range(request.workers)])
        except ray.exceptions.RaySystemError as exc:
            # Another process created the same handle between our look-up and our create.
            if "already exists" not in str(exc):
                raise
        else:
            group.wait(timeout_seconds=LAUNCH_WAIT_S)
        return self.observe_gang(request.handle)

    def observe_gang(self, handle: str) -> GangStatus:
        """ready / pending / stopped, or unknown when Ray has no placement group by that name."""
        info = self._placement_group_info(handle)
        if info is None:
            return GangStatus(handle=handle, state="unknown", message="no placement group with this name")
        return self._status(handle, info)

    def stop_gang(self, handle: str) -> GangStatus:
        """Release the gang's reservation. Stopping an unknown or stopped gang is a no-op."""
        info = self._placement_group_info(handle)
        if info is not None and info["state"] != "REMOVED":
            self._ray()
            from ray._raylet import PlacementGroupID
            from ray.util.placement_group import PlacementGroup, remove_placement_group

            group_id = PlacementGroupID(bytes.fromhex(info["placement_group_id"]))
            remove_placement_group(PlacementGroup(group_id))
        return GangStatus(handle=handle, state="stopped")

    # ------------------------------------------------------------------ training runs

    def launch_training(self, launch: TrainingLaunch) -> TrainingReport:
        """Start the run's supervisor (a detached actor on the head, named by the handle); idempotent."""
        ray = self._ray()
        from jobs.runtime.supervisor import GangSupervisor

        request = GangRequest(handle=launch.handle, accelerator_type=launch.accelerator_type,
                              workers=len(launch.nodes), devices_per_worker=launch.devices_per_worker,
                              cpus_per_worker=launch.cpus_per_worker)
        spec = {**launch.runtime, "handle": launch.handle, "job_id": launch.job_id, "nodes": list(launch.nodes),
                "bundle": gang_bundle(request), "node_label": LABEL_NODE}
        ray.remote(GangSupervisor).options(
            name=launch.handle, namespace=self.namespace, lifetime="detached", get_if_exists=True,
            num_cpus=0, max_concurrency=16, max_restarts=0, resources={HEAD_RESOURCE: 0.001},
        ).remote(spec)
        return self.observe_training(launch.handle)

    def observe_training(self, handle: str, since: int = 0) -> TrainingReport:
        supervisor = self._supervisor(handle)
        if supervisor is None:
            return TrainingReport(handle=handle, state="unknown", reason="no supervisor with this name")
        ray = self._ray()
        try:
            raw = ray.get(supervisor.report.remote(since), timeout=OBSERVE_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            return TrainingReport(handle=handle, state="unknown", reason=f"supervisor unreachable: {exc}")
        return TrainingReport(handle=handle, state=raw["state"], reason=raw["reason"], step=raw["step"],
                              nodes=tuple(raw["nodes"]), restarts=raw["restarts"],
                              last_checkpoint_step=raw["last_checkpoint_step"], events=tuple(raw["events"]))

    def place_training(self, handle: str, nodes: list[str], reason: str = "") -> None:
        supervisor = self._require_supervisor(handle)
        self._ray().get(supervisor.place.remote(list(nodes), reason), timeout=OBSERVE_TIMEOUT_S)

    def checkpoint_training(self, handle: str) -> bool:
        supervisor = self._require_supervisor(handle)
        return bool(self._ray().get(supervisor.request_checkpoint.remote(), timeout=OBSERVE_TIMEOUT_S))

    def stop_training(self, handle: str, *, checkpoint: bool, reason: str = "") -> None:
        supervisor = self._supervisor(handle)
        if supervisor is not None:
            self._ray().get(supervisor.stop.remote(checkpoint, reason), timeout=OBSERVE_TIMEOUT_S)

    def release_training(self, handle: str) -> None:
        """End the supervisor (and anything it still holds). Releasing an unknown run is a no-op."""
        supervisor = self._supervisor(handle)
        if supervisor is None:
            return
        ray = self._ray()
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            ray.get(supervisor.shutdown.remote(), timeout=OBSERVE_TIMEOUT_S)
        try:
            ray.kill(supervisor, no_restart=True)
        except Exception as exc:  # already gone
            logger.debug("kill supervisor %s: %s", handle, exc)

    def list_training_handles(self) -> list[str]:
        ray = self._ray()
        names = ray.util.list_named_actors(all_namespaces=True)
        return sorted(entry["name"] for entry in names
                      if entry.get("namespace") == self.namespace and entry["name"].startswith(TRAINING_PREFIX))

    def inject_training_fault(self, handle: str, *, rank: int, fault: str, factor: float = 3.0) -> None:
        """Fault injection (tests, the fault benchmark): crash / hang / slow / nan on one worker."""
        supervisor = self._require_supervisor(handle)
        self._ray().get(supervisor.inject.remote(rank, fault, factor), timeout=OBSERVE_TIMEOUT_S)

    def _supervisor(self, handle: str):
        ray = self._ray()
        try:
            return ray.get_actor(handle, namespace=self.namespace)
        except ValueError:
            return None

    def _require_supervisor(self, handle: str):
        supervisor = self._supervisor(handle)
        if supervisor is None:
            raise LookupError(f"no training run {handle!r}")
        return supervisor

    # ------------------------------------------------------------------ inference services (Ray Serve)

    def _serve(self):
        """Connects and makes sure Serve runs (no HTTP proxies: callers use deployment handles)."""
        self._ray()
        from ray import serve

        with _CONNECT_LOCK:
            if not getattr(self, "_serve_started", False):
                serve.start(proxy_location="Disabled")
                self._serve_started = True
        return serve

    def shutdown_serving(self) -> None:
        """Stops Ray Serve (its controller and every application); the next service call starts it again."""
        self._ray()
        from ray import serve

        with _CONNECT_LOCK:
            serve.shutdown()
            self._serve_started = False
        self._handles.clear()

    def deploy_service(self, spec: ServiceSpec) -> ServiceStatus:
        """Creates the application or rolls it to `spec` (new replicas first, old ones drain); returns at once."""
        import dataclasses

        from ray.serve.api import _run

        from inference.runtime.serve_app import build_application

        self._serve()
        _run(build_application(dataclasses.asdict(spec)), name=spec.handle, route_prefix=None, _blocking=False)
        self._handles.pop(spec.handle, None)
        return self.observe_service(spec.handle)

    def observe_service(self, handle: str) -> ServiceStatus:
        self._serve()
        from ray.serve.context import _get_global_client

        details = _get_global_client().get_serve_details()
        app = (details.get("applications") or {}).get(handle)
        if not app:
            return ServiceStatus(handle=handle, state="not_found")
        deployment = (app.get("deployments") or {}).get("llm") or {}
        replicas = deployment.get("replicas") or []
        running = sum(1 for r in replicas if r.get("state") == "RUNNING")
        config = deployment.get("deployment_config") or {}
        user_config = config.get("user_config") or {}
        target = deployment.get("target_num_replicas") or config.get("num_replicas") or 0
        state = _SERVE_STATES.get(app.get("status", ""), "unhealthy")
        message = app.get("message") or deployment.get("message") or ""
        names = self._node_names_by_id()
        nodes = tuple(sorted(names.get(r.get("node_id"), r.get("node_id") or "") for r in replicas
                             if r.get("state") == "RUNNING"))  # one per replica: mixed load counts their devices
        # replicas Serve placed that do not run yet: the cycle holds their devices there until they run
        starting = tuple(sorted(names.get(r.get("node_id"), r.get("node_id")) for r in replicas
                                if r.get("state") in _STARTING_REPLICA_STATES and r.get("node_id")))
        return ServiceStatus(handle=handle, state=state, replicas_running=running, replicas_target=int(target or 0),
                             revision=int(user_config.get("revision", 0)) if state == "running" else 0,
                             message=str(message)[:500], node_names=nodes, starting_node_names=starting)

    def delete_service(self, handle: str) -> None:
        serve = self._serve()
        self._handles.pop(handle, None)
        serve.delete(handle, _blocking=False)

    def serves_calls(self, handle: str) -> bool:
        return True  # Serve applications are called from any process connected to the cluster

    def list_service_handles(self) -> list[str]:
        self._serve()
        from ray.serve.context import _get_global_client

        apps = _get_global_client().get_serve_details().get("applications") or {}
        return sorted(name for name in apps if name.startswith(SERVICE_PREFIX))

    def service_stats(self, handle: str, *, calls: int = 8) -> list[dict]:
        """Engine and cache counters of the replicas reached by `calls` calls (benchmarks and tests)."""
        deployment = self._service_handle(handle)
        seen: dict[str, dict] = {}
        for _ in range(calls):
            stats = deployment.stats.remote().result(timeout_s=OBSERVE_TIMEOUT_S)
            seen[stats["replica"]] = stats
        return list(seen.values())

    def stream_completion(self, handle: str, request: dict, *, timeout_s: float = 60.0):
        """Starts the request and waits for its first event, so refusals raise here (see ServingBackend)."""
        import queue as queue_module

        events: queue_module.Queue = queue_module.Queue()
        try:
            response = self._service_handle(handle).options(stream=True).generate.remote(request)
        except Exception as exc:
            raise _service_error(exc, handle) from exc

        def pump() -> None:
            try:
                for event in response:
                    events.put(event)
            except Exception as exc:  # surfaced to the caller in order, as the last item
                events.put(exc)
            finally:
                events.put(None)

        threading.Thread(target=pump, name=f"serve-stream-{handle}", daemon=True).start()

        def next_event():
            try:
                item = events.get(timeout=timeout_s)
            except queue_module.Empty:
                response.cancel()
                raise ServiceUnavailable(f"service {handle} sent nothing for {timeout_s:g} s",
                                         retry_after_s=5.0) from None
            if isinstance(item, Exception):
                raise _service_error(item, handle)
            if isinstance(item, dict) and item.get("type") == "error":
                kind = item.get("kind")
                if kind == "overloaded":
                    raise ServiceOverloaded(item.get("message", "overloaded"), retry_after_s=1.0)
                if kind == "invalid":
                    raise ServiceRequestInvalid(item.get("message", "invalid request"))
                raise ServiceUnavailable(item.get("message", "unavailable"), retry_after_s=5.0)
            return item

        first = next_event()

        def stream():
            item = first
            try:
                while item is not None:
                    yield item
                    if item.get("type") == "done":
                        return
                    item = next_event()
            finally:
                if item is None or item.get("type") != "done":
                    response.cancel()

        return stream()

    def _service_handle(self, handle: str):
        """The service's DeploymentHandle, its router created once. Serve creates a handle's router on its first
        call without a lock: callers in several threads at once each created one, and the routers left over were
        never shut down; with autoscaling on, their metrics pushers kept running after Serve and Ray shut down
        and started a local Ray head in this process, again every 30 s (found by the SLA scale-out test)."""
        deployment = self._handles.get(handle)
        if deployment is not None:
            return deployment
        with self._handles_lock:
            lock = self._handle_locks.setdefault(handle, threading.Lock())
        with lock:
            deployment = self._handles.get(handle)
            if deployment is None:
                serve = self._serve()
                try:
                    deployment = serve.get_deployment_handle("llm", app_name=handle)
                except Exception as exc:
                    raise ServiceUnavailable(f"service {handle} is not running: {exc}", retry_after_s=5.0) from exc
                deployment.options()  # creates the router now, under the lock (a no-op once it exists)
                _wait_for_replicas_known(deployment)
                self._handles[handle] = deployment
        return deployment

    # ------------------------------------------------------------------ helpers

    def _placement_group_info(self, handle: str) -> dict[str, Any] | None:
        self._ray()
        from ray._private import state as ray_state

        return ray_state.state.get_placement_group_by_name(handle, self.namespace)

    def _status(self, handle: str, info: dict[str, Any]) -> GangStatus:
        raw_state = info["state"]
        state = _STATE_MAP.get(raw_state, "unknown")
        node_names: tuple[str, ...] = ()
        if state == "ready":
            names_by_id = self._node_names_by_id()
            ordered = [names_by_id.get(node_id, node_id)
                       for _, node_id in sorted(info.get("bundles_to_node_id", {}).items())]
            node_names = tuple(dict.fromkeys(ordered))
        message = ""
        if raw_state == "RESCHEDULING":
            message = "a node holding part of the gang died; Ray is placing its bundles again"
        elif state == "pending":
            message = "waiting for capacity: all bundles are reserved together or not at all"
        return GangStatus(handle=handle, state=state, node_names=node_names, message=message)

    def _node_names_by_id(self) -> dict[str, str]:
        ray = self._ray()
        names = {}
        for raw in ray.nodes():
            labels = raw.get("Labels") or {}
            names[raw["NodeID"]] = labels.get(LABEL_NODE) or raw.get("NodeName") or raw["NodeID"]
        return names


def gang_bundle(request: GangRequest) -> dict[str, float]:
    """One worker's bundle: `accel:<type>` devices plus CPUs; a CPU gang asks for CPUs only."""
    if request.workers < 1:
        raise ValueError(f"gang {request.handle}: workers must be >= 1")
    if request.devices_per_worker < 0 or request.cpus_per_worker < 0:
        raise ValueError(f"gang {request.handle}: sizes must be non-negative")
    bundle: dict[str, float] = {}
    if request.accelerator_type == "cpu":
        cpus = request.cpus_per_worker or request.devices_per_worker
        if cpus:
            bundle["CPU"] = float(cpus)
    else:
        if request.devices_per_worker:
            bundle[ACCEL_RESOURCE_PREFIX + request.accelerator_type] = float(request.devices_per_worker)
        if request.cpus_per_worker:
            bundle["CPU"] = float(request.cpus_per_worker)
    if not bundle:
        raise ValueError(f"gang {request.handle}: a worker must ask for devices or CPUs")
    return bundle


def gang_label_selector(request: GangRequest) -> dict[str, str]:
    """Pin every bundle to nodes of the gang's accelerator type, and its pool / leaf group if given.

    The accelerator label also keeps a CPU gang off the accelerator nodes' CPUs.
    """
    selector = {LABEL_ACCELERATOR: request.accelerator_type}
    if request.pool:
        selector[LABEL_POOL] = request.pool
    if request.leaf_group:
        selector[LABEL_LEAF_GROUP] = request.leaf_group
    return selector


def _visible(resources: Mapping[str, float]) -> dict[str, float]:
    """Schedulable resources: CPU, GPU, accel:* ...; not node:<ip>, memory or placement-group ones."""
    return {
        str(key): float(value) for key, value in resources.items()
        if key not in _HIDDEN_RESOURCES and not key.startswith("node:") and "_group_" not in key
    }


def _reload_ray_auth_config() -> None:
    """Make an already imported ray see RAY_AUTH_MODE / RAY_AUTH_TOKEN[_PATH] set after its import.

    Ray reads its config (auth mode included) from the environment when `ray` is imported and caches
    the token; without this, a process that imported ray before the variables were set connects
    without a token and is refused.
    """
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:  # pragma: no cover - other Ray versions
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _wait_for_replicas_known(deployment, timeout_s: float = 10.0) -> None:
    """Wait (bounded) until a new handle's router has heard which replicas run. A router that knows the deployment's
    queue limit but no replica yet queues every request, and the first burst of callers was refused with 429
    although the replicas were idle (found by the R4 fault test once the router was created eagerly)."""
    router = getattr(deployment, "_router", None)
    populated = getattr(router, "running_replicas_populated", None)
    if populated is None:  # another Ray version: the first calls may queue a moment
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if populated():
                return
        except Exception:  # a router shutting down: the call itself will say what is wrong
            return
        time.sleep(0.02)


def _service_error(exc: Exception, handle: str) -> ServiceError:
    """Ray Serve's exceptions as the gateway's: back pressure -> 429, anything else -> 503."""
    from ray.serve.exceptions import BackPressureError

    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, BackPressureError):
        return ServiceOverloaded(f"service {handle}: every replica queue is full", retry_after_s=1.0)
    return ServiceUnavailable(f"service {handle} failed the request: {type(exc).__name__}: {exc}"[:500],
                              retry_after_s=5.0)
