"""The gang supervisor's stop path without a Ray cluster: a fake `ray` module answers the workers' polls, so the
test can hold a poll in flight across the stop (what happened in benchmarks/churn.py: the metric of the step a
worker finished after an on-demand checkpoint was lost when the gang was stopped right after it)."""

from __future__ import annotations

import sys
import threading
import types

import pytest

from jobs.runtime import supervisor as supervisor_module
from jobs.runtime.supervisor import GangSupervisor


class _Ref:
    def __init__(self, answer):
        self.answer = answer


class _Method:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return self._fn(*args)


class _FakeWorker:
    """A worker whose loop the test drives: `finish_step` appends a metric, `stop` makes it leave its loop."""

    def __init__(self, rank: int):
        self.rank = rank
        self.step = 3
        self.phase = "compute"
        self.events: list[dict] = []
        self.stopped = False
        self.poll = _Method(self._poll)
        self.stop = _Method(self._stop)
        self.request_checkpoint = _Method(lambda: None)

    def finish_step(self) -> None:
        self.step += 1
        self.events.append({"type": "metric", "rank": self.rank, "step": self.step, "loss": 1.0,
                            "compute_time": 0.1})

    def _stop(self) -> None:
        # The step under way when stop arrives still completes and reports, then the loop ends.
        self.finish_step()
        self.phase = "stopped"
        self.stopped = True

    def _poll(self):
        events, self.events = self.events, []
        return _Ref({"rank": self.rank, "step": self.step, "loss": 1.0, "compute_times": [0.1],
                     "phase": self.phase, "done": False, "error": "", "resumed_from": None, "events": events})


def _fake_ray(killed: list) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.wait = lambda refs, num_returns=1, timeout=None: (list(refs), [])
    ray.get = lambda ref: ref.answer
    ray.kill = lambda actor, no_restart=True: killed.append(actor)
    return ray


def _supervisor(workers: list[_FakeWorker]) -> GangSupervisor:
    """A supervisor in the running state, built without its watch thread."""
    sup = object.__new__(GangSupervisor)
    sup._lock = threading.RLock()
    sup._events, sup._seq = [], 0
    sup.state, sup.step, sup.last_checkpoint_step = "running", 3, 3
    sup._workers = list(workers)
    sup._inflight = {}
    sup._step_times = []
    sup._recovery = None
    sup._samples = {w.rank: {"rank": w.rank, "node": f"n{w.rank}", "step": 3, "progress_at": 0.0,
                             "heartbeat_at": 0.0, "alive": True, "loss": 1.0, "compute_times": [], "done": False,
                             "error": "", "phase": "compute"} for w in workers}
    return sup


def test_a_stop_keeps_the_metric_of_the_step_finished_after_a_poll_already_in_flight(monkeypatch):
    killed: list = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(killed))
    workers = [_FakeWorker(0), _FakeWorker(1)]
    sup = _supervisor(workers)
    # A poll sent before the stop is still in flight: it answers with what the workers had then (nothing new).
    sup._inflight = {w.rank: w._poll() for w in workers}

    sup._checkpoint_then_stop()

    metric_steps = sorted((e["rank"], e["step"]) for e in sup._events if e["type"] == "metric")
    assert metric_steps == [(0, 4), (1, 4)]
    assert sup.step == 4
    assert len(killed) == 2 and sup._workers == []


def test_the_drain_gives_up_at_its_deadline_when_a_rank_never_leaves_its_loop(monkeypatch):
    """A rank blocked in a collective whose peer stopped first never reports "stopped": the wait is bounded."""
    killed: list = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(killed))
    stuck = _FakeWorker(1)
    stuck.stop = _Method(lambda: None)  # never leaves its loop
    sup = _supervisor([_FakeWorker(0), stuck])
    monkeypatch.setattr(supervisor_module, "STOP_DRAIN_TIMEOUT_S", 0.3)
    clock = {"now": 1000.0}
    monkeypatch.setattr(supervisor_module.time, "time", lambda: clock["now"])
    monkeypatch.setattr(supervisor_module.time, "sleep", lambda s: None)
    real_poll = sup._poll

    def poll_and_tick(timeout):
        clock["now"] += max(timeout, 0.05)
        return real_poll(timeout)

    sup._poll = poll_and_tick
    sup._drain_after_stop(timeout=0.3)
    assert clock["now"] <= 1000.0 + 0.3 + 1.0
    assert sup._samples[1]["phase"] == "compute"


@pytest.mark.parametrize("phase", ["stopped", "done"])
def test_the_drain_ends_as_soon_as_every_worker_has_left_its_loop(monkeypatch, phase):
    monkeypatch.setitem(sys.modules, "ray", _fake_ray([]))
    worker = _FakeWorker(0)
    worker.phase = phase
    sup = _supervisor([worker])
    polls = []
    real_poll = sup._poll
    sup._poll = lambda timeout: polls.append(timeout) or real_poll(timeout)
    sup._drain_after_stop(timeout=3.0)
    assert len(polls) == 1


def test_a_placement_repeated_while_the_last_one_was_applied_restarts_nothing():
    """While a resize checkpoints and relaunches (seconds), the run still reports its old nodes, so the control plane's
    next sync asks for the same placement again; the supervisor applied it a second time: two checkpoint-and-restart
    cycles for one shrink (QA, on Ray)."""
    sup = _supervisor([_FakeWorker(0), _FakeWorker(1)])
    sup.nodes, sup._pending_nodes, sup._pending_reason, sup._slow_reported = ["n0", "n1"], None, "", set()
    launches = []

    def launch(*, reason):
        launches.append(reason)
        sup.state, sup._workers = "running", [_FakeWorker(0)]

    sup._checkpoint_then_stop = lambda: None
    sup._teardown = lambda release: setattr(sup, "_workers", [])
    sup._launch = launch
    sup.place(["n0"], "shrinking from 2 to 1 worker(s)")
    sup._replace(sup._pending_nodes)
    assert sup.nodes == ["n0"] and len(launches) == 1
    sup.place(["n0"], "shrinking from 2 to 1 worker(s)")  # the same placement, sent while the first was applied
    sup._replace(sup._pending_nodes)
    assert len(launches) == 1 and sup._pending_nodes is None and sup.state == "running"
    sup.place(["n1"], "moving 1 worker(s) to new nodes")  # a real change still moves it
    sup._replace(sup._pending_nodes)
    assert sup.nodes == ["n1"] and len(launches) == 2


def test_a_relaunch_on_new_nodes_is_reported_as_a_resize_recovery_at_its_first_new_step(monkeypatch):
    """A shrink, grow or move stops the gang and starts it on the new nodes: the time from the stop until the first
    step there is lost, so the supervisor reports it as a recovery of kind "resize" (it reported nothing, and the
    control plane counted the relaunch as productive time: ETTR 1.0 after three moves; QA on Ray)."""
    monkeypatch.setitem(sys.modules, "ray", _fake_ray([]))
    clock = {"now": 1000.0}
    monkeypatch.setattr(supervisor_module.time, "time", lambda: clock["now"])
    monkeypatch.setattr(supervisor_module.time, "sleep", lambda s: None)
    sup = _supervisor([_FakeWorker(0), _FakeWorker(1)])
    sup.nodes, sup._pending_nodes, sup._pending_reason, sup._slow_reported = ["n0", "n1"], None, "", set()
    sup._step_times, sup.restarts = [0.1], 0
    sup._teardown = lambda release: setattr(sup, "_workers", [])
    new = _FakeWorker(0)

    def launch(*, reason):
        clock["now"] += 6.0  # reserving the nodes and starting the workers
        sup.state, sup._workers = "running", [new]
        sup._samples = {0: {"rank": 0, "node": "n2", "step": -1, "progress_at": clock["now"],
                            "heartbeat_at": clock["now"], "alive": True, "loss": None, "compute_times": [],
                            "done": False, "error": "", "phase": "starting"}}

    sup._launch = launch
    sup.place(["n2"], "moving 1 worker(s) to new nodes")
    sup._replace(sup._pending_nodes)
    assert not [e for e in sup._events if e["type"] == "recovery"]  # not training yet
    assert sup.step == 4 and sup.last_checkpoint_step == 3  # step 4 finished after the checkpoint: redone
    new.step = 3  # resumed from the checkpoint at step 3 ...
    sup._absorb(sup._samples[0], {**new._poll().answer, "resumed_from": 3}, clock["now"])
    assert not [e for e in sup._events if e["type"] == "recovery"]
    clock["now"] += 0.5
    new.finish_step()  # ... and finished step 4 again on the new node
    sup._absorb(sup._samples[0], {**new._poll().answer, "resumed_from": 3}, clock["now"])
    kinds = [e["type"] for e in sup._events]
    recovery = next(e for e in sup._events if e["type"] == "recovery")
    assert recovery["kind"] == "resize" and recovery["occurred_at"] == recovery["detected_at"] == 1000.0
    assert recovery["resumed_at"] == 1006.5
    assert recovery["recomputed_steps"] == 1 and recovery["recomputed_s"] == pytest.approx(0.1)
    # before the new step's metric, as after a fault (the control plane closes the recovery with it)
    assert kinds.index("recovery") < len(kinds) - 1 and sup._events[-1]["type"] == "metric"
