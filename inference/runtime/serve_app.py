"""The Ray Serve application of a deployment: LLM replicas and the request routers that pick one.

    build_application(spec) -> a Serve application with one deployment, "llm", of `LLMReplica`s.

`LLMReplica` loads the built-in LM from a checkpoint directory (model.pt + config.json) and serves
it with an `LLMEngine` (continuous batching, tiered prefix cache); `generate(request)` streams
events. Replicas are placed on the chosen pool by label selector and ask for the pool's chips as a
custom resource (`accel:<type>`), so Ray places them only where the devices are free.

Routers (they run inside the caller's process, in the deployment handle):
- `PrefixAwareRouter`: the replica holding the longest cached prefix of the prompt (an approximate
  index of what it sent where, `prefix_index.PrefixIndex`) among the replicas whose queue is within
  `imbalance_threshold` (two engine slot-fulls by default) or `imbalance_ratio` of the shortest.
- `RoundRobinRouter`: replicas in turn.
- Ray Serve's default (power of two choices) when the spec says "pow2".

Ray-side code: imports ray and torch, never Django.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig, RequestRouterConfig
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from inference.runtime.engine_config import EngineConfig
from inference.runtime.prefix_index import PrefixIndex, ReplicaLoad, choose_replica

DEPLOYMENT_NAME = "llm"
ROUTER_CLASSES = {
    "prefix": "inference.runtime.serve_app.PrefixAwareRouter",
    "round_robin": "inference.runtime.serve_app.RoundRobinRouter",
    "pow2": None,  # Ray Serve's default PowerOfTwoChoicesRequestRouter
}
ROUTING_STATS_PERIOD_S = 1.0


# ---------------------------------------------------------------------------------------------------- replica


class LLMReplica:
    """One inference replica: the model from `model_dir`, served by an LLMEngine."""

    def __init__(self, model_dir: str, engine: dict, revision: int) -> None:
        import torch

        from inference.runtime.engine import LLMEngine
        from inference.runtime.kv_cache import make_disk_dir
        from jobs.runtime.lm import load_model_for_inference

        config = EngineConfig.from_dict(engine)
        torch.set_num_threads(config.torch_threads)
        files = {name: (Path(model_dir) / name).read_bytes() for name in ("model.pt", "config.json")}
        model, self.tokenizer, _ = load_model_for_inference(files)
        try:
            replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside Serve (tests)
            replica = "local"
        self.revision = revision
        self.replica = replica
        # Only with a disk tier (before, every replica made one, also with disk_cache_blocks 0). Owned by this process
        # (owner.pid): removed in __del__, or by the next replica's sweep after a crash.
        self._cache_dir = str(make_disk_dir(prefix=f"fy-kv-{replica}-")) if config.disk_cache_blocks > 0 else None
        try:
            self.engine = LLMEngine(model, config, replica=replica, cache_dir=self._cache_dir).start()
        except BaseException:
            if self._cache_dir is not None:
                shutil.rmtree(self._cache_dir, ignore_errors=True)
            raise

    async def generate(self, request: dict):
        """Streams the request's events (see ServingBackend.stream_completion); errors become an "error" event
        carrying `kind` ("overloaded", "invalid", "stopped") so the caller can answer 429 / 400 / 503."""
        from inference.runtime.engine import (
            EngineOverloaded,
            EngineRequestInvalid,
            EngineStopped,
            GenerationRequest,
        )

        loop = asyncio.get_running_loop()
        events: asyncio.Queue[dict] = asyncio.Queue()
        try:
            request_id = self.engine.submit(GenerationRequest.from_dict(request),
                                            lambda e: loop.call_soon_threadsafe(events.put_nowait, e))
        except EngineOverloaded as exc:
            yield {"type": "error", "kind": "overloaded", "message": str(exc)}
            return
        except EngineRequestInvalid as exc:
            yield {"type": "error", "kind": "invalid", "message": str(exc)}
            return
        except EngineStopped as exc:
            yield {"type": "error", "kind": "stopped", "message": str(exc)}
            return
        try:
            while True:
                event = await events.get()
                if event["type"] == "done":
                    event["metrics"]["revision"] = self.revision
                yield event
                if event["type"] in ("done", "error"):
                    return
        finally:
            self.engine.cancel(request_id)  # no-op when finished; frees the slot when the caller went away

    def reconfigure(self, user_config: dict) -> None:
        """Serve passes the deployment's user_config: it only names the revision (observed by the control plane)."""
        self.revision = int(user_config.get("revision", self.revision))

    def stats(self) -> dict:
        return {**self.engine.stats(), "revision": self.revision}

    def record_routing_stats(self) -> dict[str, Any]:
        load = self.engine.load()
        return {"running": load["running"], "waiting": load["waiting"], "revision": self.revision}

    def check_health(self) -> None:
        if not self.engine.alive:
            raise RuntimeError("the LLM engine thread is not running")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()
        cache_dir = getattr(self, "_cache_dir", None)
        if cache_dir is not None:
            shutil.rmtree(cache_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- routers


def _prompt_tokens(pending_request: PendingRequest | None) -> list[int]:
    if pending_request is None:
        return []
    for arg in list(pending_request.args) + list(pending_request.kwargs.values()):
        if isinstance(arg, dict) and isinstance(arg.get("prompt_tokens"), list):
            return arg["prompt_tokens"]
    return []


class PrefixAwareRouter(RequestRouter):
    """Longest cached prefix among the replicas not too far above the shortest queue (see
    prefix_index.choose_replica). ``imbalance_threshold``: build_application passes twice the engine's slots (a
    request may wait up to one batch more for its cached prefix; benchmarks/router_sim.py compares settings)."""

    def initialize_state(self, block_size: int = 16, max_blocks_per_replica: int = 4096,
                         imbalance_threshold: int = 8, min_match_ratio: float = 0.1,
                         imbalance_ratio: float | None = 1.5) -> None:
        self._index = PrefixIndex(block_size=block_size, max_blocks_per_replica=max_blocks_per_replica)
        self._imbalance_threshold = imbalance_threshold
        self._imbalance_ratio = imbalance_ratio
        self._min_match_ratio = min_match_ratio
        self.decisions = {"prefix": 0, "balance": 0, "least_loaded": 0}

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        self._index.retain_replicas(set(by_id) | set(self._known_replica_ids()))
        loads = []
        missing = []
        for r in candidate_replicas:
            queue_len = self._replica_queue_len_cache.get(r.replica_id)
            if queue_len is None:
                missing.append(r)
            else:
                loads.append(ReplicaLoad(r.replica_id.unique_id, queue_len, r.max_ongoing_requests))
        if missing:
            for r, queue_len in await self._probe_queue_lens(missing, 0):
                if queue_len is not None:
                    loads.append(ReplicaLoad(r.replica_id.unique_id, queue_len, r.max_ongoing_requests))
        if not loads:
            return [candidate_replicas]
        tokens = _prompt_tokens(pending_request)
        matched = self._index.match(tokens)
        prompt_blocks = max(1, len(tokens) // self._index.block_size)
        choice = choose_replica(loads, matched, prompt_blocks, imbalance_threshold=self._imbalance_threshold,
                                min_match_ratio=self._min_match_ratio, imbalance_ratio=self._imbalance_ratio,
                                blocks_held={load.replica_id: self._index.blocks_held(load.replica_id)
                                             for load in loads})
        self.decisions[choice.reason] = self.decisions.get(choice.reason, 0) + 1
        chosen = by_id[choice.replica_id]
        return [[chosen], [r for r in candidate_replicas if r is not chosen]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        tokens = _prompt_tokens(pending_request)
        if tokens:
            self._index.insert(replica_id.unique_id, tokens)

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.remove_replica(replica_id.unique_id)

    def _known_replica_ids(self) -> list[str]:
        return [rid.unique_id for rid in self.curr_replicas]


class RoundRobinRouter(RequestRouter):
    """Replicas in a fixed order, one after the other (skipping full ones: Serve retries the next rank)."""

    def initialize_state(self, **_: Any) -> None:
        self._turn = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        start = next(self._turn) % len(ordered)
        ordered = ordered[start:] + ordered[:start]
        return [[r] for r in ordered]


# ---------------------------------------------------------------------------------------------------- the app


def build_application(spec: dict):
    """The Serve application for a ServiceSpec given as a dict (controlplane.compute.base.ServiceSpec fields)."""
    engine = EngineConfig.from_dict(spec.get("engine") or {})
    router = spec.get("router") or "prefix"
    if router not in ROUTER_CLASSES:
        raise ValueError(f"router: must be one of {', '.join(ROUTER_CLASSES)}")
    resources = {}
    if spec["devices_per_replica"] > 0 and spec["accelerator_type"] != "cpu":
        resources[f"accel:{spec['accelerator_type']}"] = float(spec["devices_per_replica"])
    actor_options: dict[str, Any] = {"num_cpus": float(spec.get("cpus_per_replica", 0.25)), "resources": resources}
    if spec.get("pool"):
        actor_options["label_selector"] = {"fleetyard.io/pool": spec["pool"]}
    elif spec.get("accelerator_type") == "cpu":  # off the accelerator nodes' cores, which their devices come with
        actor_options["label_selector"] = {"fleetyard.io/accelerator": "cpu"}
    router_kwargs = {}
    if router == "prefix":
        router_kwargs = {"block_size": engine.block_size, "max_blocks_per_replica": max(
            1, engine.device_cache_blocks + engine.host_cache_blocks + engine.disk_cache_blocks),
            "imbalance_threshold": 2 * engine.slots}
    router_config = RequestRouterConfig(request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
                                        request_router_kwargs=router_kwargs,
                                        **({"request_router_class": ROUTER_CLASSES[router]}
                                           if ROUTER_CLASSES[router] else {}))
    lo, hi = int(spec["replicas_min"]), int(spec["replicas_max"])
    options: dict[str, Any] = {
        "name": DEPLOYMENT_NAME,
        "ray_actor_options": actor_options,
        "max_ongoing_requests": int(spec["max_ongoing_requests"]),
        "max_queued_requests": int(spec["max_queued_requests"]),
        "request_router_config": router_config,
        "user_config": {"revision": int(spec["revision"])},
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 10.0,
        "graceful_shutdown_wait_loop_s": 0.5,
        "graceful_shutdown_timeout_s": 30.0,
    }
    if hi > lo:
        options["autoscaling_config"] = AutoscalingConfig(
            min_replicas=max(lo, 1), max_replicas=hi,
            target_ongoing_requests=float(spec["target_ongoing_requests"]),
            upscale_delay_s=float(spec.get("upscale_delay_s", 3.0)),
            downscale_delay_s=float(spec.get("downscale_delay_s", 30.0)), metrics_interval_s=1.0,
            look_back_period_s=5.0)
    else:
        options["num_replicas"] = max(lo, 1)
    # A stable version per revision: Serve otherwise versions every deploy at random and restarts every replica
    # (losing their caches) even when only the autoscaling settings changed. A new revision rolls the replicas.
    app = serve.deployment(LLMReplica).options(**options).options(version=f"revision-{int(spec['revision'])}",
                                                                   _internal=True)
    return app.bind(spec["model_dir"], engine.to_dict(), int(spec["revision"]))

