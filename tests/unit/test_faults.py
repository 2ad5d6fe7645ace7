"""Pure fault detection of a training gang (jobs.runtime.faults)."""

from __future__ import annotations

import math

import pytest

from jobs.runtime.faults import (
    DetectionPolicy,
    FaultKind,
    WorkerSample,
    detect_faults,
    gang_median_step_time,
    hang_threshold_s,
    summarize_step_times,
)

POLICY = DetectionPolicy()
NOW = 1000.0


def worker(rank: int, **overrides) -> WorkerSample:
    """A healthy worker: 40 steps done, last one 0.2 s ago, 0.4 s compute per step, heartbeat just now."""
    fields = dict(
        rank=rank,
        node=f"node-{rank}",
        step=40,
        last_progress_at=NOW - 0.2,
        step_times=(0.4,) * 8,
        last_loss=2.5,
        heartbeat_at=NOW - 0.3,
    )
    fields.update(overrides)
    return WorkerSample(**fields)


def gang(n: int = 4, **overrides_by_rank) -> list[WorkerSample]:
    return [worker(r, **overrides_by_rank.get(f"r{r}", {})) for r in range(n)]


def test_healthy_gang_has_no_faults():
    assert detect_faults(gang(8), now=NOW, policy=POLICY) == []
    assert detect_faults([], now=NOW, policy=POLICY) == []


def test_node_lost():
    faults = detect_faults(gang(r2={"node_alive": False, "alive": False}), now=NOW, policy=POLICY)
    assert len(faults) == 1
    f = faults[0]
    assert (f.kind, f.rank, f.node, f.detected_at) == (FaultKind.NODE_LOST, 2, "node-2", NOW)
    assert "node node-2 reported dead" in f.evidence and "last step 40" in f.evidence


def test_dead_process_on_live_node_is_a_worker_crash():
    [f] = detect_faults(gang(r1={"alive": False}), now=NOW, policy=POLICY)
    assert (f.kind, f.rank) == (FaultKind.WORKER_CRASH, 1)
    assert f.data["reason"] == "process_dead"
    assert "dead on live node node-1" in f.evidence


def test_missing_heartbeat_is_a_worker_crash_with_its_age():
    [f] = detect_faults(gang(r3={"heartbeat_at": NOW - 4.25}), now=NOW, policy=POLICY)
    assert (f.kind, f.rank) == (FaultKind.WORKER_CRASH, 3)
    assert f.data["reason"] == "heartbeat_timeout"
    assert f.data["heartbeat_age_s"] == pytest.approx(4.25)
    assert f.evidence.startswith("no heartbeat for 4.25 s (timeout 3 s)")
    # Just inside the timeout: fine. No heartbeat tracking (None): never a heartbeat fault.
    assert detect_faults(gang(r3={"heartbeat_at": NOW - 2.9}), now=NOW, policy=POLICY) == []
    assert detect_faults(gang(r3={"heartbeat_at": None}), now=NOW, policy=POLICY) == []


def test_a_late_heartbeat_before_the_first_step_is_not_a_crash():
    """Caught in the fault benchmark: a worker importing torch on a loaded host answered after 3.01 s
    and its healthy gang was restarted. A start that never ends is a hang after first_step_timeout_s."""
    starting = {"heartbeat_at": NOW - 10.0, "step": -1, "last_progress_at": NOW - 10.0, "step_times": ()}
    assert detect_faults(gang(r3=starting), now=NOW, policy=POLICY) == []
    stuck = {**starting, "heartbeat_at": NOW - 200.0, "last_progress_at": NOW - 200.0}
    assert [f.kind for f in detect_faults(gang(r3=stuck), now=NOW, policy=POLICY)] == [FaultKind.HANG]


def test_missing_heartbeat_on_a_dead_node_is_node_lost():
    [f] = detect_faults(gang(r0={"heartbeat_at": NOW - 30, "node_alive": False}), now=NOW, policy=POLICY)
    assert f.kind == FaultKind.NODE_LOST
    assert "last heartbeat 30 s ago" in f.evidence


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_loss(loss):
    [f] = detect_faults(gang(r1={"last_loss": loss}), now=NOW, policy=POLICY)
    assert (f.kind, f.rank) == (FaultKind.BAD_LOSS, 1)
    assert f.evidence == f"loss is {loss} at step 40 on rank 1"
    assert f.data["loss"] == str(loss)


def test_finite_or_missing_loss_is_fine():
    assert detect_faults(gang(r0={"last_loss": None}, r1={"last_loss": 1e30}), now=NOW, policy=POLICY) == []


def test_hang_uses_factor_times_gang_median_when_above_floor():
    # Median step 1.0 s -> threshold max(5, 10 x 1.0) = 10 s.
    samples = [worker(r, step_times=(1.0,) * 6) for r in range(3)]
    stalled = [*samples[:2], worker(2, step_times=(1.0,) * 6, last_progress_at=NOW - 12.3, step=37)]
    [f] = detect_faults(stalled, now=NOW, policy=POLICY)
    assert (f.kind, f.rank) == (FaultKind.HANG, 2)
    assert f.evidence == "no step progress for 12.3 s (10 x median step time 1 s; floor 5 s); last step 37"
    assert f.data["threshold_s"] == pytest.approx(10.0)
    # 9.9 s without progress is under 10 x median: not a hang, although it is above the floor.
    ok = [*samples[:2], worker(2, step_times=(1.0,) * 6, last_progress_at=NOW - 9.9)]
    assert detect_faults(ok, now=NOW, policy=POLICY) == []


def test_hang_honours_the_floor_for_fast_steps():
    # Median 0.41 s -> 10 x median = 4.1 s, below the 5 s floor.
    fast = dict(step_times=(0.41,) * 6)
    assert detect_faults(gang(2, r0=fast, r1={**fast, "last_progress_at": NOW - 4.9}), now=NOW, policy=POLICY) == []
    [f] = detect_faults(gang(2, r0=fast, r1={**fast, "last_progress_at": NOW - 5.2}), now=NOW, policy=POLICY)
    assert f.kind == FaultKind.HANG
    assert f.evidence == "no step progress for 5.2 s (10 x median step time 0.41 s; floor 5 s); last step 40"
    assert f.data["threshold_s"] == pytest.approx(5.0)


def test_hang_threshold_uses_the_median_over_the_whole_gang():
    samples = [worker(0, step_times=(1.0, 1.0, 1.0)), worker(1, step_times=(3.0, 3.0)), worker(2, step_times=())]
    assert gang_median_step_time(samples) == 1.0
    policy = DetectionPolicy(hang_factor=4, hang_floor_s=0.5)
    assert hang_threshold_s(samples[2], gang_median_s=1.0, policy=policy) == 4.0
    assert hang_threshold_s(samples[2], gang_median_s=0.01, policy=policy) == 0.5


def test_warm_up_uses_first_step_timeout():
    starting = dict(step=-1, step_times=(), last_loss=None)
    # 100 s without a first step: still warming up (compile, data loading), not hung.
    warm = gang(2, r0={**starting, "last_progress_at": NOW - 100}, r1={**starting, "last_progress_at": NOW - 100})
    assert detect_faults(warm, now=NOW, policy=POLICY) == []
    [f] = detect_faults(gang(2, r0=starting, r1={**starting, "last_progress_at": NOW - 130}), now=NOW, policy=POLICY)
    assert (f.kind, f.rank) == (FaultKind.HANG, 1)
    assert f.evidence == "no first step after 130 s (first-step timeout 120 s)"
    # The warm-up timeout applies to a worker that has not stepped even if its peers already did.
    mixed = [worker(0), worker(1, **starting, last_progress_at=NOW - 60)]
    assert detect_faults(mixed, now=NOW, policy=POLICY) == []


def test_slow_worker_detected_among_two_or_more():
    slow = dict(step_times=(0.7,) * 6)
    [f] = detect_faults(gang(2, r1=slow), now=NOW, policy=POLICY)
    assert (f.kind, f.rank, f.node) == (FaultKind.SLOW_NODE, 1, "node-1")
    assert f.data["median_step_s"] == pytest.approx(0.7)
    assert f.data["peers_median_step_s"] == pytest.approx(0.4)
    assert f.data["ratio"] == pytest.approx(1.75)
    assert "0.7 s is 1.75 x the peers' median 0.4 s" in f.evidence
    # Among eight, the peers' median ignores a second slow worker.
    faults = detect_faults(gang(8, r1=slow, r5={"step_times": (0.9,) * 6}), now=NOW, policy=POLICY)
    assert [(f.kind, f.rank) for f in faults] == [(FaultKind.SLOW_NODE, 1), (FaultKind.SLOW_NODE, 5)]


def test_slow_needs_peers_samples_and_a_real_margin():
    slow = (0.7,) * 6
    assert detect_faults([worker(0, step_times=slow)], now=NOW, policy=POLICY) == []
    # Too few samples on the slow worker, or on every peer.
    assert detect_faults(gang(2, r1={"step_times": (0.7,) * 4}), now=NOW, policy=POLICY) == []
    assert detect_faults(gang(2, r0={"step_times": (0.4,) * 3}, r1={"step_times": slow}), now=NOW, policy=POLICY) == []
    # 1.4 x is within slow_factor 1.5.
    assert detect_faults(gang(2, r1={"step_times": (0.56,) * 6}), now=NOW, policy=POLICY) == []
    # More peers required than there are.
    policy = DetectionPolicy(slow_min_peers=2)
    assert detect_faults(gang(2, r1={"step_times": slow}), now=NOW, policy=policy) == []
    assert [f.rank for f in detect_faults(gang(3, r1={"step_times": slow}), now=NOW, policy=policy)] == [1]


def test_a_slow_node_is_judged_against_peers_on_other_nodes_only():
    """Two workers on one node run on the same hardware: a gap between them is not the node's. QA saw a gang of two on
    one demo node told its node was slow (1.53 x, from timing noise on one host) and moved three times."""
    one_node = [worker(0, node="node-a"), worker(1, node="node-a", step_times=(0.7,) * 6)]
    assert detect_faults(one_node, now=NOW, policy=POLICY) == []
    # with a third worker on another node, it is judged against that one alone
    three = [*one_node, worker(2, node="node-b")]
    assert [(f.rank, f.data["peers"]) for f in detect_faults(three, now=NOW, policy=POLICY)] == [(1, 1)]


def test_one_fault_per_worker_in_severity_order():
    samples = gang(
        6,
        # Everything wrong at once: the node loss wins.
        r4={"node_alive": False, "alive": False, "last_loss": math.nan, "last_progress_at": NOW - 500},
        r3={"alive": False, "last_loss": math.inf},
        r2={"last_loss": math.nan, "last_progress_at": NOW - 500, "step_times": (2.0,) * 6},
        r1={"last_progress_at": NOW - 500, "step_times": (2.0,) * 6},
        r0={"step_times": (2.0,) * 6},
    )
    faults = detect_faults(samples, now=NOW, policy=POLICY)
    assert [(f.kind, f.rank) for f in faults] == [
        (FaultKind.NODE_LOST, 4),
        (FaultKind.WORKER_CRASH, 3),
        (FaultKind.BAD_LOSS, 2),
        (FaultKind.HANG, 1),
        (FaultKind.SLOW_NODE, 0),
    ]
    assert len({f.rank for f in faults}) == len(faults)
    # JSON-friendly form.
    assert faults[2].to_dict()["kind"] == "bad_loss"


def test_detection_is_deterministic_and_order_independent():
    samples = gang(5, r3={"alive": False}, r1={"last_loss": math.nan})
    a = detect_faults(samples, now=NOW, policy=POLICY)
    b = detect_faults(list(reversed(samples)), now=NOW, policy=POLICY)
    assert a == b


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="duplicate ranks"):
        detect_faults([worker(0), worker(0)], now=NOW, policy=POLICY)
    with pytest.raises(ValueError, match="now"):
        detect_faults([worker(0)], now=math.nan, policy=POLICY)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hang_factor": 0},
        {"hang_floor_s": -1},
        {"first_step_timeout_s": 0},
        {"heartbeat_timeout_s": math.inf},
        {"slow_factor": 1.0},
        {"slow_min_samples": 0},
        {"slow_min_peers": 1.5},
    ],
)
def test_policy_validation(kwargs):
    with pytest.raises(ValueError):
        DetectionPolicy(**kwargs)


def test_summarize_step_times():
    s = summarize_step_times([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, math.nan, -1.0])
    assert s["count"] == 10
    assert s["median"] == 5.5
    assert s["p90"] == pytest.approx(9.1)
    assert s["mean"] == 5.5
    assert summarize_step_times([]) == {"count": 0, "median": None, "p90": None, "mean": None}
