"""The gang supervisor: a detached Ray actor per training job that runs, watches and recovers its gang.

It lives on the head node (it must outlive the worker nodes it watches), holds the gang's placement
group (one bundle per worker, each pinned by label to the node the scheduler chose), starts one
`worker.TrainingWorker` per bundle, polls every worker twice a second and feeds the samples to the
pure detector (`faults.detect_faults`). On a fault it records the evidence and recovers:

- worker crash, hang, NaN/inf loss: restart every worker in the same placement group from the latest
  complete checkpoint (a gang restarts as a whole: data-parallel ranks must agree on the step);
- node lost, slow node: the gang needs other nodes; it releases its placement group and waits in
  `awaiting_placement` until the control plane (which owns quotas and placement) calls `place()`
  with new nodes, possibly fewer (shrink, when min_workers allows) or more (grow);
- more than `max_restarts` restarts: it gives up with the reason.

The control plane talks to it only through actor calls: `report(since)` returns the state and every
event (metric, log, checkpoint, fault, recovery, state) after a cursor, `place`, `request_checkpoint`,
`stop`, `inject` (fault injection for tests and the benchmark) and `shutdown`. No Django here.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import statistics
import threading
import time
import traceback

from jobs.runtime.faults import DetectionPolicy, Fault, FaultKind, WorkerSample, detect_faults
from jobs.runtime.goodput import RESIZE

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
NODE_CHECK_INTERVAL_S = 0.5
# Ray Train waits 60 s for a worker group by default; a worker here is up in 2-10 s on a busy 2-core
# host (most of it importing torch), so 45 s is generous, and a miss is retried as a restart.
START_TIMEOUT_S = 45.0
PLACEMENT_TIMEOUT_S = 30.0
STOP_CHECKPOINT_TIMEOUT_S = 60.0
# After stop: how long to keep polling for the steps the workers were finishing (the old single poll waited 2 s).
STOP_DRAIN_TIMEOUT_S = 3.0
# Faults after which the gang must move off the worker's node; the others restart in place, except a
# slow node, which is advisory: the gang keeps running (slow beats stopped) and the control plane
# moves it only if it finds a better node.
NEEDS_NEW_NODES = (FaultKind.NODE_LOST,)
TERMINAL = ("succeeded", "failed", "stopped")


class GangSupervisor:
    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.handle = spec["handle"]
        self.policy = DetectionPolicy(**(spec.get("detection") or {}))
        self._lock = threading.RLock()
        self._events: list[dict] = []
        self._seq = 0
        self.state = "starting"
        self.reason = "starting the gang"
        self.nodes: list[str] = list(spec["nodes"])
        self.restarts = 0
        self.step = -1
        self.last_checkpoint_step = -1
        self._group = None
        self._workers: list = []
        self._samples: dict[int, dict] = {}
        self._pending_nodes: list[str] | None = None
        self._pending_reason = ""
        self._stop_request: dict | None = None
        self._inflight: dict[int, object] = {}
        self._node_alive: dict[str, bool] = {}
        self._node_checked = 0.0
        self._recovery: dict | None = None  # the fault being recovered from, until the first new step
        self._step_times: list[float] = []
        self._slow_reported: set[str] = set()
        self._raylets: dict[str, tuple[str, int]] = {}
        self._thread = threading.Thread(target=self._main, name=f"supervise-{self.handle}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ control-plane calls

    def report(self, since: int = 0) -> dict:
        """State plus every event with seq > since; events up to `since` are acknowledged and dropped."""
        with self._lock:
            self._events = [e for e in self._events if e["seq"] > since]
            return {"state": self.state, "reason": self.reason, "step": self.step, "nodes": list(self.nodes),
                    "workers": len(self.nodes), "restarts": self.restarts,
                    "last_checkpoint_step": self.last_checkpoint_step, "events": list(self._events)}

    def place(self, nodes: list[str], reason: str = "") -> str:
        """Run the gang on these nodes (after a node loss, or to shrink / grow): checkpoint, restart."""
        if not nodes:
            raise ValueError("nodes: at least one node is needed")
        with self._lock:
            self._pending_nodes = list(nodes)
            self._pending_reason = reason or "new placement"
            return self.state

    def request_checkpoint(self) -> bool:
        with self._lock:
            workers = list(self._workers)
        if not workers:
            return False
        workers[0].request_checkpoint.remote()
        return True

    def stop(self, checkpoint: bool = True, reason: str = "") -> str:
        with self._lock:
            if self.state not in TERMINAL:
                self._stop_request = {"checkpoint": checkpoint, "reason": reason or "stopped"}
            return self.state

    def inject(self, rank: int, fault: str, factor: float = 3.0) -> None:
        """Fault injection for tests and the benchmark: forwards to the worker of that rank."""
        with self._lock:
            worker = self._workers[rank]
        worker.inject.remote(fault, factor)

    def shutdown(self) -> None:
        import ray

        self._teardown(release=True)
        ray.actor.exit_actor()

    # ------------------------------------------------------------------ the loop

    def _main(self) -> None:
        try:
            self._launch(reason="first start")
            while True:
                with self._lock:
                    if self.state in TERMINAL:
                        return
                    stop, pending = self._stop_request, self._pending_nodes
                if stop is not None:
                    self._stop(stop)
                    return
                if pending is not None:
                    self._replace(pending)
                elif self.state == "running":
                    self._watch_once()
                time.sleep(POLL_INTERVAL_S)
        except Exception as exc:  # the supervisor must always end in a state the control plane can read
            self._set_state("failed", f"supervisor error: {type(exc).__name__}: {exc}")
            self._event({"type": "log", "rank": None, "line": traceback.format_exc(limit=8)})
            self._teardown(release=True)

    def _launch(self, *, reason: str) -> None:
        """Reserve the nodes (all or none), start the workers, wait until every one answers."""
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from jobs.runtime.worker import TrainingWorker

        spec = self.spec
        self._set_state("starting" if self.restarts == 0 and self.step < 0 else "recovering", reason)
        if self._group is None:
            bundle = dict(spec["bundle"])
            label = spec["node_label"]
            group = placement_group([dict(bundle) for _ in self.nodes], strategy="PACK",
                                    bundle_label_selector=[{label: node} for node in self.nodes])
            if not group.wait(timeout_seconds=float(spec.get("placement_timeout_s", PLACEMENT_TIMEOUT_S))):
                ray.util.remove_placement_group(group)
                self._await_placement(f"nodes {', '.join(self.nodes)} could not be reserved "
                                      f"within {spec.get('placement_timeout_s', PLACEMENT_TIMEOUT_S)} s")
                return
            self._group = group
            # Every bundle is reserved, so every node of the gang is alive now. A verdict from an earlier
            # placement must not outlive it: a node that died and came back under the same name (a restarted
            # machine) was otherwise "lost" again at once, forever (found by benchmarks/churn.py).
            self._node_alive.clear()
            self._raylets.clear()
        actor = ray.remote(TrainingWorker)
        cpus = float(spec["bundle"].get("CPU", 0.0))
        resources = {k: v for k, v in spec["bundle"].items() if k != "CPU"}
        world = len(self.nodes)
        workers = [
            actor.options(num_cpus=cpus, resources=resources, max_concurrency=4, max_restarts=0,
                          scheduling_strategy=PlacementGroupSchedulingStrategy(
                              placement_group=self._group, placement_group_bundle_index=rank)
                          ).remote(spec, rank, world, self.nodes[rank])
            for rank in range(world)
        ]
        with self._lock:
            self._workers = workers
            self._samples = {}
            self._inflight = {}
        try:
            addr, port = ray.get(workers[0].rendezvous.remote(), timeout=START_TIMEOUT_S)
            ray.get([w.start.remote(addr, port) for w in workers], timeout=START_TIMEOUT_S)
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as exc:
            self._start_failed(f"workers did not start within {START_TIMEOUT_S:.0f} s: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
            return
        now = time.time()
        with self._lock:
            for rank, node in enumerate(self.nodes):
                self._samples[rank] = {"rank": rank, "node": node, "step": -1, "progress_at": now,
                                       "heartbeat_at": now, "alive": True, "loss": None, "compute_times": [],
                                       "done": False, "error": "", "phase": "starting"}
        self._set_state("running", f"{world} worker(s) on {', '.join(self.nodes)}")

    def _start_failed(self, evidence: str) -> None:
        """A gang that does not come up counts as a restart; it is tried again until max_restarts."""
        now = time.time()
        self._kill_workers()
        self._event({"type": "fault", "kind": str(FaultKind.WORKER_CRASH), "rank": None, "node": None,
                     "occurred_at": now, "detected_at": now, "evidence": evidence, "data": {}, "step": self.step})
        self.restarts += 1
        max_restarts = int(self.spec.get("max_restarts", 3))
        if self.restarts > max_restarts:
            self._teardown(release=True)
            self._set_state("failed", f"gave up after {max_restarts} restart(s); last fault: {evidence}")
            return
        if not self._group_intact():  # a node of the gang is gone: the control plane must re-place it
            self._teardown(release=True)
            dead = sorted(n for n in self.nodes if not self._raylet_answers(n))
            self._await_placement(f"the gang could not start: {evidence}", exclude=dead)
            return
        time.sleep(1.0)
        self._launch(reason=f"retrying the start ({self.restarts}/{max_restarts}): {evidence}")

    def _poll(self, timeout: float) -> float:
        """Ask every live worker for its progress (one call in flight per worker, never dropped: a
        poll drains the worker's events) and absorb the answers that arrive within `timeout`."""
        import ray

        with self._lock:
            workers = list(self._workers)
        for rank, worker in enumerate(workers):
            if rank not in self._inflight and self._samples[rank]["alive"]:
                self._inflight[rank] = worker.poll.remote()
        refs = list(self._inflight.values())
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout)
        now = time.time()
        for rank, ref in list(self._inflight.items()):
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del self._inflight[rank]
            sample = self._samples[rank]
            try:
                result = ray.get(ref)
            except Exception as exc:  # the actor died: a crash, or its node went away
                sample["alive"] = False
                sample["process_dead"] = True
                sample["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                continue
            self._absorb(sample, result, now)
        return now

    def _watch_once(self) -> None:
        now = self._poll(POLL_INTERVAL_S)
        self._check_nodes(now)
        if any(not s["alive"] or now - s["heartbeat_at"] > self.policy.heartbeat_timeout_s
               for s in self._samples.values()):
            # Something failed. The cluster takes seconds to declare a node dead, and a worker whose
            # peer's node died fails at once in the collective while the call to the dead worker
            # hangs; so ask every node of the gang directly: its raylet answers (or not) at once.
            for node in set(self.nodes):
                if self._node_alive.get(node, True):
                    self._node_alive[node] = self._raylet_answers(node)
        samples = [self._worker_sample(s) for s in self._samples.values()]
        if self._samples and all(s["done"] for s in self._samples.values()):
            self._finish()
            return
        faults = detect_faults(samples, now=now, policy=self.policy)
        slow = [f for f in faults if f.kind == FaultKind.SLOW_NODE]
        faults = [f for f in faults if f.kind != FaultKind.SLOW_NODE]
        if faults:
            self._recover(faults, now)
            return
        for fault in slow:
            if fault.node not in self._slow_reported:
                self._slow_reported.add(fault.node)
                self._event({"type": "fault", "kind": str(fault.kind), "rank": fault.rank, "node": fault.node,
                             "occurred_at": self._occurred_at(fault), "detected_at": fault.detected_at,
                             "evidence": fault.evidence, "data": dict(fault.data), "step": self.step,
                             "advisory": True})
                self._event({"type": "placement_needed", "exclude": [fault.node], "nodes": list(self.nodes),
                             "advisory": True, "reason": f"slow node {fault.node}: {fault.evidence}"})

    def _absorb(self, sample: dict, result: dict, now: float) -> None:
        sample["heartbeat_at"] = now
        if result["step"] > sample["step"]:
            sample["progress_at"] = now
            resumed_from = -1 if result.get("resumed_from") is None else result["resumed_from"]
            if self._recovery is not None and result["step"] > resumed_from:
                self._resumed(now)
        sample.update(step=result["step"], loss=result["loss"], compute_times=result["compute_times"],
                      done=result["done"], error=result["error"], phase=result["phase"])
        if result["error"]:
            sample["alive"] = False
        for event in result["events"]:
            if event["type"] == "checkpoint":
                self.last_checkpoint_step = max(self.last_checkpoint_step, event["step"])
            if event["type"] == "metric" and event["rank"] == 0 and not event.get("replayed"):
                self._step_times.append(event["compute_time"])
                del self._step_times[:-200]
            self._event(event)
        with self._lock:
            self.step = max(self.step, result["step"])

    def _check_nodes(self, now: float) -> None:
        import ray

        if now - self._node_checked < NODE_CHECK_INTERVAL_S:
            return
        self._node_checked = now
        label = self.spec["node_label"]
        alive: dict[str, bool] = {}
        for raw in ray.nodes():
            name = (raw.get("Labels") or {}).get(label)
            if name:
                alive[name] = alive.get(name, False) or bool(raw.get("Alive"))
                if raw.get("Alive"):
                    self._raylets[name] = (raw.get("NodeManagerAddress", ""), int(raw.get("NodeManagerPort") or 0))
        for node in self.nodes:
            if not alive.get(node, False):
                self._node_alive[node] = False

    def _raylet_answers(self, node: str) -> bool:
        """Whether the node's raylet accepts a TCP connection (refused or silent for 1 s: the node is gone)."""
        host, port = self._raylets.get(node, ("", 0))
        if not host or not port:
            return True  # unknown address: leave the verdict to the cluster's own health checks
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            return False

    def _worker_sample(self, sample: dict) -> WorkerSample:
        return WorkerSample(rank=sample["rank"], node=sample["node"], step=sample["step"],
                            last_progress_at=sample["progress_at"], step_times=tuple(sample["compute_times"]),
                            last_loss=sample["loss"], heartbeat_at=sample["heartbeat_at"], alive=sample["alive"],
                            node_alive=self._node_alive.get(sample["node"], True))

    # ------------------------------------------------------------------ recovery

    def _recover(self, faults: list[Fault], now: float) -> None:
        primary = _primary(faults, self._samples)
        fault = primary
        error = self._samples.get(fault.rank, {}).get("error") if fault.rank is not None else ""
        if error and error not in fault.evidence:
            fault = dataclasses.replace(fault, evidence=f"{fault.evidence}; worker error: {error[:500]}")
        occurred = self._occurred_at(fault)
        if self._recovery is not None and self._recovery["kind"] == RESIZE:
            # the relaunch on new nodes never trained: lost until this fault, which is recovered from on its own
            self._resumed(max(occurred, self._recovery["detected_at"]))
        recomputed_steps = max(0, self.step - max(self.last_checkpoint_step, -1))
        median = statistics.median(self._step_times) if self._step_times else 0.0
        self._event({"type": "fault", "kind": str(fault.kind), "rank": fault.rank, "node": fault.node,
                     "occurred_at": occurred, "detected_at": fault.detected_at, "evidence": fault.evidence,
                     "data": dict(fault.data), "step": self.step,
                     "others": [{"kind": str(f.kind), "rank": f.rank, "evidence": f.evidence}
                                for f in faults if f is not primary]})
        self._recovery = {"kind": str(fault.kind), "occurred_at": occurred, "detected_at": fault.detected_at,
                          "node": fault.node, "rank": fault.rank, "recomputed_steps": recomputed_steps,
                          "recomputed_s": recomputed_steps * median, "from_step": self.step,
                          "checkpoint_step": self.last_checkpoint_step}
        self._kill_workers()
        self.restarts += 1
        max_restarts = int(self.spec.get("max_restarts", 3))
        if self.restarts > max_restarts:
            self._teardown(release=True)
            self._set_state("failed", f"gave up after {max_restarts} restart(s); last fault: {fault.kind} on "
                                      f"{fault.node or '?'} (rank {fault.rank}): {fault.evidence}")
            return
        self.step = self.last_checkpoint_step
        if fault.kind in NEEDS_NEW_NODES or not self._group_intact():
            self._teardown(release=True)
            lost = {fault.node} if fault.kind in NEEDS_NEW_NODES and fault.node else set()
            dead = sorted(lost | {n for n in self.nodes if not self._node_alive.get(n, True)})
            self._await_placement(f"{fault.kind} on {fault.node}: waiting for the control plane to place "
                                  f"the gang on other nodes", exclude=dead)
            return
        self._launch(reason=f"restarting after {fault.kind} on {fault.node} (rank {fault.rank}) from "
                            f"checkpoint step {self.last_checkpoint_step} (restart {self.restarts}/{max_restarts})")

    def _group_intact(self) -> bool:
        """Whether the placement group still holds every bundle (not rescheduling after a node loss)."""
        import ray

        if self._group is None:
            return False
        try:
            return ray.util.placement_group_table(self._group).get("state") == "CREATED"
        except Exception:  # cannot tell: place it again rather than restart into a broken group
            return False

    def _occurred_at(self, fault: Fault) -> float:
        """Best estimate of when the fault began: the last good sign of life of the worker(s) it hit."""
        if fault.rank is None or fault.rank not in self._samples:
            return fault.detected_at
        sample = self._samples[fault.rank]
        if fault.kind == FaultKind.HANG:
            return sample["progress_at"]
        if fault.kind == FaultKind.SLOW_NODE:
            return fault.detected_at
        return min(sample["heartbeat_at"], fault.detected_at)

    def _resumed(self, now: float) -> None:
        recovery, self._recovery = self._recovery, None
        self._event({"type": "recovery", **recovery, "resumed_at": now, "restarts": self.restarts,
                     "nodes": list(self.nodes)})

    def _await_placement(self, reason: str, exclude: list[str] | None = None) -> None:
        self._set_state("awaiting_placement", reason)
        self._event({"type": "placement_needed", "exclude": exclude or [], "nodes": list(self.nodes),
                     "reason": reason})

    def _replace(self, nodes: list[str]) -> None:
        with self._lock:
            self._pending_nodes = None
            reason = self._pending_reason
        if self.state == "running" and self._workers and sorted(nodes) == sorted(self.nodes):
            # Already there: the control plane saw the old nodes while the last placement was applied (a checkpoint
            # and a relaunch take seconds) and asked again; applying it again restarted the gang a second time.
            return
        if self.state == "running" and self._workers:
            stopped_at = self._checkpoint_then_stop() or time.time()
            if self._recovery is None:
                # Not training from the stop until the first step on the new nodes: reported as a recovery of kind
                # RESIZE (the control plane's ETTR counted a shrink, grow or move as productive; QA on Ray). Steps
                # finished after the checkpoint are redone.
                recomputed_steps = max(0, self.step - max(self.last_checkpoint_step, -1))
                median = statistics.median(self._step_times) if self._step_times else 0.0
                self._recovery = {"kind": RESIZE, "occurred_at": stopped_at, "detected_at": stopped_at,
                                  "node": None, "rank": None, "recomputed_steps": recomputed_steps,
                                  "recomputed_s": recomputed_steps * median, "from_step": self.step,
                                  "checkpoint_step": self.last_checkpoint_step}
        self._teardown(release=True)
        self.nodes = list(nodes)
        self._slow_reported.clear()
        self._launch(reason=f"{reason}: {len(nodes)} worker(s) on {', '.join(nodes)}")

    def _checkpoint_then_stop(self) -> float:
        """Ask rank 0 for a checkpoint at its current step and wait until it is complete, then stop the workers;
        returns when they were told to stop."""
        wanted = self.step
        self._workers[0].request_checkpoint.remote()
        deadline = time.time() + STOP_CHECKPOINT_TIMEOUT_S
        while time.time() < deadline and self.last_checkpoint_step < max(wanted, 0):
            self._poll(1.0)
            if all(s["done"] for s in self._samples.values()):
                break
            time.sleep(0.1)
        stopped_at = time.time()
        for worker in self._workers:
            worker.stop.remote()
        self._drain_after_stop()
        self._kill_workers()
        return stopped_at

    def _drain_after_stop(self, timeout: float = STOP_DRAIN_TIMEOUT_S) -> None:
        """Poll until every live worker has left its step loop, so the metrics and logs of the steps it finished
        reach the control plane before the actors are killed. One poll is not enough: a poll already in flight
        when stop was sent answers with what the worker had then, not with the step it was finishing. A rank
        blocked in a collective whose peer stopped first never leaves; the deadline ends the wait."""
        deadline = time.time() + timeout
        while True:
            self._poll(max(0.0, min(1.0, deadline - time.time())))
            if all(not s["alive"] or s["done"] or s.get("phase") in ("stopped", "done")
                   for s in self._samples.values()):
                return
            if time.time() >= deadline:
                return

    def _stop(self, request: dict) -> None:
        if request["checkpoint"] and self.state == "running" and self._workers:
            self._checkpoint_then_stop()
        self._teardown(release=True)
        self._set_state("stopped", request["reason"])

    def _finish(self) -> None:
        self._teardown(release=True)
        self._set_state("succeeded", f"all {len(self.nodes)} worker(s) finished at step {self.step}")

    # ------------------------------------------------------------------ helpers

    def _kill_workers(self) -> None:
        import ray

        with self._lock:
            workers, self._workers = self._workers, []
            self._inflight = {}
        for worker in workers:
            try:
                ray.kill(worker, no_restart=True)
            except Exception as exc:  # already gone
                log.debug("kill worker: %s", exc)

    def _teardown(self, *, release: bool) -> None:
        import ray

        self._kill_workers()
        if release and self._group is not None:
            try:
                ray.util.remove_placement_group(self._group)
            except Exception as exc:
                log.debug("remove placement group: %s", exc)
            self._group = None

    def _set_state(self, state: str, reason: str) -> None:
        with self._lock:
            self.state, self.reason = state, reason
        self._event({"type": "state", "state": state, "reason": reason, "step": self.step,
                     "nodes": list(self.nodes), "restarts": self.restarts})

    def _event(self, event: dict) -> None:
        with self._lock:
            self._seq += 1
            self._events.append({**event, "seq": self._seq, "at": event.get("at") or time.time()})


def _primary(faults: list[Fault], samples: dict[int, dict]) -> Fault:
    """The fault to act on. In a synchronous gang a hang stops every rank; the culprit is the rank
    still computing (the others wait in the all-reduce), else the one furthest behind."""
    hangs = [f for f in faults if f.kind == FaultKind.HANG]
    if hangs and len(hangs) == len(faults):
        computing = [f for f in hangs if samples.get(f.rank, {}).get("phase") == "compute"]
        pool = computing or hangs
        return min(pool, key=lambda f: (samples.get(f.rank, {}).get("step", 0), f.rank))
    # A worker whose process died is the cause; its peers fail in the collective right after it.
    return min(faults, key=lambda f: (f.severity, not samples.get(f.rank, {}).get("process_dead", False), f.rank))
