"""Pure fault detection for a training gang, from per-worker progress samples.

The Ray-side gang supervisor polls its workers about every 0.5 s, builds one `WorkerSample` per
worker and calls `detect_faults`. This module decides, deterministically and without I/O, which
workers are faulty and why; the supervisor decides what to do about it (restart the gang from the
last checkpoint, cordon a node, stop the job). Standard library only: no torch, Django or Ray.

Fault kinds, most severe first (a worker gets at most one fault, the most severe that applies):

1. NODE_LOST    the cluster reports the worker's node dead (`node_alive` False).
2. WORKER_CRASH the worker process is known dead while its node is alive (`alive` False), or the
                supervisor has not heard a heartbeat for longer than `heartbeat_timeout_s`.
3. BAD_LOSS     the last reported loss is NaN or +/-inf.
4. HANG         no step progress for longer than max(hang_floor_s, hang_factor x the gang's median
                step time); before the worker completed its first step, `first_step_timeout_s`
                instead (warm-up: compilation, data loading, NCCL init).
5. SLOW_NODE    the worker's median step time exceeds slow_factor x the median of its peers' medians (peers on
                other nodes only).

Step times are COMPUTE times. In synchronous data-parallel training every worker waits for the
slowest one at the gradient all-reduce, so wall-clock step times are the same on every rank and
cannot single out a slow node. The supervisor therefore feeds, as `step_times`, the time each rank
spent per step excluding the wait inside the collective (forward + backward + optimizer, measured
around the compute with the device synchronised). The slow rank is the one whose compute takes
longer; the others show shorter compute and a longer collective wait.

A worker that hangs also stalls every peer at the next collective, so a real hang usually shows up
as HANG on the whole gang; the supervisor restarts the gang either way, and `Fault.evidence` on the
rank with the oldest progress points at the culprit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FaultKind(StrEnum):
    WORKER_CRASH = "worker_crash"
    NODE_LOST = "node_lost"
    HANG = "hang"
    SLOW_NODE = "slow_node"
    BAD_LOSS = "bad_loss"  # NaN or inf loss


# Lower is more severe; `detect_faults` returns faults in this order.
SEVERITY: dict[FaultKind, int] = {
    FaultKind.NODE_LOST: 0,
    FaultKind.WORKER_CRASH: 1,
    FaultKind.BAD_LOSS: 2,
    FaultKind.HANG: 3,
    FaultKind.SLOW_NODE: 4,
}


@dataclass(frozen=True)
class WorkerSample:
    """What the supervisor knows about one worker of the gang at one poll.

    rank:             the worker's rank in the gang (unique within a call).
    node:             the Ray node id (or name) the worker runs on.
    step:             last completed step, -1 before the first one.
    last_progress_at: when `step` last advanced, or when the worker started (same clock as `now`).
    step_times:       recent per-step COMPUTE durations in seconds (collective wait excluded), newest
                      last. Non-finite or negative entries are ignored.
    last_loss:        the loss of the last completed step, None if not reported yet.
    heartbeat_at:     when the supervisor last heard from the worker; None when heartbeats are not
                      tracked (the heartbeat check is then skipped).
    alive:            False when the worker process is known dead.
    node_alive:       False when the cluster reports the worker's node dead.
    """

    rank: int
    node: str
    step: int
    last_progress_at: float
    step_times: tuple[float, ...] = ()
    last_loss: float | None = None
    heartbeat_at: float | None = None
    alive: bool = True
    node_alive: bool = True


@dataclass(frozen=True)
class Fault:
    """One detected fault: what, where, when, and the evidence in plain words and as data."""

    kind: FaultKind
    rank: int | None
    node: str | None
    detected_at: float
    evidence: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def severity(self) -> int:
        return SEVERITY[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "rank": self.rank,
            "node": self.node,
            "detected_at": self.detected_at,
            "evidence": self.evidence,
            "data": dict(self.data),
        }


@dataclass(frozen=True)
class DetectionPolicy:
    """Thresholds of `detect_faults`.

    hang_factor, hang_floor_s: HANG after max(hang_floor_s, hang_factor x gang median step time)
                               without progress.
    first_step_timeout_s:      HANG threshold before the worker's first completed step.
    heartbeat_timeout_s:       WORKER_CRASH when no heartbeat for longer than this.
    slow_factor:               SLOW_NODE when a worker's median step time > slow_factor x peers' median.
    slow_min_samples:          step times needed on a worker (and on each peer) to judge slowness.
    slow_min_peers:            peers with enough samples needed to judge slowness.
    """

    hang_factor: float = 10.0
    hang_floor_s: float = 5.0
    first_step_timeout_s: float = 120.0
    heartbeat_timeout_s: float = 3.0
    slow_factor: float = 1.5
    slow_min_samples: int = 5
    slow_min_peers: int = 1

    def __post_init__(self) -> None:
        for name in ("hang_factor", "hang_floor_s", "first_step_timeout_s", "heartbeat_timeout_s", "slow_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.hang_factor <= 0:
            raise ValueError(f"hang_factor must be > 0, got {self.hang_factor}")
        if self.hang_floor_s < 0:
            raise ValueError(f"hang_floor_s must be >= 0, got {self.hang_floor_s}")
        if self.first_step_timeout_s <= 0:
            raise ValueError(f"first_step_timeout_s must be > 0, got {self.first_step_timeout_s}")
        if self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0, got {self.heartbeat_timeout_s}")
        if self.slow_factor <= 1.0:
            raise ValueError(f"slow_factor must be > 1 (a factor of 1 flags healthy workers), got {self.slow_factor}")
        for name in ("slow_min_samples", "slow_min_peers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


# --------------------------------------------------------------------------------------------------
# Small statistics helpers
# --------------------------------------------------------------------------------------------------


def _clean(values: Iterable[float]) -> list[float]:
    """Finite, non-negative values, sorted."""
    return sorted(float(v) for v in values if isinstance(v, int | float) and math.isfinite(v) and v >= 0)


def _median_sorted(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _quantile_sorted(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default 'linear' method)."""
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def summarize_step_times(step_times: Iterable[float]) -> dict[str, float | int | None]:
    """count, median, p90 and mean of step durations (non-finite or negative entries ignored).

    With no usable entries, count is 0 and the statistics are None.
    """
    values = _clean(step_times)
    if not values:
        return {"count": 0, "median": None, "p90": None, "mean": None}
    return {
        "count": len(values),
        "median": _median_sorted(values),
        "p90": _quantile_sorted(values, 0.9),
        "mean": math.fsum(values) / len(values),
    }


def gang_median_step_time(samples: Sequence[WorkerSample]) -> float | None:
    """Median over all workers' recent step times pooled together; None when there are none."""
    values = _clean(t for s in samples for t in s.step_times)
    return _median_sorted(values) if values else None


def hang_threshold_s(sample: WorkerSample, *, gang_median_s: float | None, policy: DetectionPolicy) -> float:
    """Seconds without step progress after which `sample` counts as hung.

    Before the worker's first completed step (step < 0), or when the gang has no step time to scale
    from, it is `first_step_timeout_s`; otherwise max(hang_floor_s, hang_factor x gang median).
    """
    if sample.step < 0 or gang_median_s is None:
        return policy.first_step_timeout_s
    return max(policy.hang_floor_s, policy.hang_factor * gang_median_s)


def _fmt(x: float) -> str:
    """Compact number for evidence strings: 3 significant digits, no trailing zeros."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


# --------------------------------------------------------------------------------------------------
# Detection
# --------------------------------------------------------------------------------------------------


def detect_faults(samples: Sequence[WorkerSample], *, now: float, policy: DetectionPolicy) -> list[Fault]:
    """Faults of a gang at time `now`: at most one per worker, most severe first, then by rank.

    A healthy gang gives an empty list. See the module docstring for the kinds and their order.
    Raises ValueError on duplicate ranks or a non-finite `now`.
    """
    if not math.isfinite(now):
        raise ValueError(f"now must be finite, got {now!r}")
    ranks = [s.rank for s in samples]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"duplicate ranks in samples: {sorted(ranks)}")

    gang_median = gang_median_step_time(samples)
    clean_times = {s.rank: _clean(s.step_times) for s in samples}
    node_of = {s.rank: s.node for s in samples}
    faults: list[Fault] = []
    for sample in samples:
        fault = (
            _lost_or_crashed(sample, now=now, policy=policy)
            or _bad_loss(sample, now=now)
            or _hang(sample, now=now, policy=policy, gang_median=gang_median)
            or _slow(sample, now=now, policy=policy, clean_times=clean_times, node_of=node_of)
        )
        if fault is not None:
            faults.append(fault)
    faults.sort(key=lambda f: (f.severity, f.rank if f.rank is not None else -1))
    return faults


def _lost_or_crashed(sample: WorkerSample, *, now: float, policy: DetectionPolicy) -> Fault | None:
    heartbeat_age = None if sample.heartbeat_at is None else now - sample.heartbeat_at
    age_text = "" if heartbeat_age is None else f"; last heartbeat {_fmt(heartbeat_age)} s ago"
    common = {"step": sample.step, "heartbeat_age_s": heartbeat_age}
    if not sample.node_alive:
        return Fault(
            FaultKind.NODE_LOST, sample.rank, sample.node, now,
            f"node {sample.node} reported dead by the cluster (rank {sample.rank}{age_text}); last step {sample.step}",
            common,
        )
    if not sample.alive:
        return Fault(
            FaultKind.WORKER_CRASH, sample.rank, sample.node, now,
            f"worker process of rank {sample.rank} is dead on live node {sample.node}{age_text}; "
            f"last step {sample.step}",
            {**common, "reason": "process_dead"},
        )
    # Before its first step a worker is importing and initialising (torch holds the GIL for seconds
    # on a busy host) and may answer late; the first-step timeout covers a start that never ends.
    if heartbeat_age is not None and heartbeat_age > policy.heartbeat_timeout_s and sample.step >= 0:
        return Fault(
            FaultKind.WORKER_CRASH, sample.rank, sample.node, now,
            f"no heartbeat for {_fmt(heartbeat_age)} s (timeout {_fmt(policy.heartbeat_timeout_s)} s) "
            f"from rank {sample.rank} on live node {sample.node}; last step {sample.step}",
            {**common, "reason": "heartbeat_timeout", "heartbeat_timeout_s": policy.heartbeat_timeout_s},
        )
    return None


def _bad_loss(sample: WorkerSample, *, now: float) -> Fault | None:
    loss = sample.last_loss
    if loss is None or math.isfinite(loss):
        return None
    return Fault(
        FaultKind.BAD_LOSS, sample.rank, sample.node, now,
        f"loss is {loss} at step {sample.step} on rank {sample.rank}",
        {"step": sample.step, "loss": str(loss)},  # str: NaN/inf are not valid JSON numbers
    )


def _hang(sample: WorkerSample, *, now: float, policy: DetectionPolicy, gang_median: float | None) -> Fault | None:
    threshold = hang_threshold_s(sample, gang_median_s=gang_median, policy=policy)
    stalled = now - sample.last_progress_at
    if stalled <= threshold:
        return None
    data = {"step": sample.step, "stalled_s": stalled, "threshold_s": threshold, "gang_median_step_s": gang_median}
    if sample.step < 0:
        evidence = (
            f"no first step after {_fmt(stalled)} s (first-step timeout {_fmt(policy.first_step_timeout_s)} s)"
        )
    elif gang_median is None:
        evidence = (
            f"no step progress for {_fmt(stalled)} s (no step times to scale from; "
            f"timeout {_fmt(policy.first_step_timeout_s)} s); last step {sample.step}"
        )
    else:
        evidence = (
            f"no step progress for {_fmt(stalled)} s ({_fmt(policy.hang_factor)} x median step time "
            f"{_fmt(gang_median)} s; floor {_fmt(policy.hang_floor_s)} s); last step {sample.step}"
        )
    return Fault(FaultKind.HANG, sample.rank, sample.node, now, evidence, data)


def _slow(
    sample: WorkerSample, *, now: float, policy: DetectionPolicy, clean_times: dict[int, list[float]],
    node_of: dict[int, str],
) -> Fault | None:
    """A slow NODE: the worker against its peers on other nodes. A peer on the same node runs on the same hardware,
    so a gap between the two is not the node's (before, a gang of two workers on one node was told, from timing noise,
    that its node was slow, and moved; found by QA on the demo cluster)."""
    own = clean_times[sample.rank]
    if len(own) < policy.slow_min_samples:
        return None
    peer_medians = sorted(
        _median_sorted(times)
        for rank, times in clean_times.items()
        if rank != sample.rank and node_of[rank] != sample.node and len(times) >= policy.slow_min_samples
    )
    if len(peer_medians) < policy.slow_min_peers:
        return None
    own_median = _median_sorted(own)
    peers_median = _median_sorted(peer_medians)
    if peers_median <= 0 or own_median <= policy.slow_factor * peers_median:
        return None
    ratio = own_median / peers_median
    return Fault(
        FaultKind.SLOW_NODE, sample.rank, sample.node, now,
        f"median compute step time {_fmt(own_median)} s is {ratio:.2f} x the peers' median {_fmt(peers_median)} s "
        f"(limit {_fmt(policy.slow_factor)} x; {len(own)} samples, {len(peer_medians)} peers) on node {sample.node}",
        {
            "median_step_s": own_median,
            "peers_median_step_s": peers_median,
            "ratio": ratio,
            "samples": len(own),
            "peers": len(peer_medians),
            "slow_factor": policy.slow_factor,
        },
    )
