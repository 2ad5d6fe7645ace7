"""Effective training time ratio (ETTR): a job's goodput ledger, and its extrapolation to big clusters.

ETTR = productive time / wall time since the job first started. Baige's published bar is 99.5%
(`BAIGE_ETTR_TARGET`). Time that is not productive falls into four parts:

- detection:  from the moment a fault occurs to the moment the supervisor notices it;
- restart:    from detection until the gang trains again (tear down, reschedule, reload checkpoint), and from
              the stop of a planned relaunch on other nodes (kind `RESIZE`: shrink, grow, move) until it trains;
- recompute:  training time that had been spent on steps after the last complete checkpoint and is
              lost, so it has to be done again;
- paused:     the job was not running by no fault of its own after its first start (preempted,
              waiting in the queue for capacity, suspended by a user).

`GoodputLedger` records what happened to one job and summarises it at any time; `extrapolate_ettr`
predicts the ETTR of a job of a given size from a published failure rate (for example the Llama 3
pre-training run, `LLAMA3_FAILURES`) and the platform's measured detection and restart times.
Standard library only; deterministic.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

BAIGE_ETTR_TARGET = 0.995

LLAMA3_FAILURES: dict[str, Any] = dict(
    interruptions=419,
    period_days=54,
    devices=16384,
    source=(
        "Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', 2024, section 3.3.4: 419 unexpected interruptions "
        "during a 54-day snapshot of pre-training on 16,384 H100 GPUs"
    ),
)

# The interruption kind of a planned relaunch on other nodes (the control plane shrank, grew or moved the gang:
# checkpoint, stop, start on the new nodes). Not a fault, but not productive either: its time from the stop to
# the first new step is restart time (no detection), and steps done after the checkpoint are recomputed.
RESIZE = "resize"

# Lost-time parts, in the order they win when their intervals overlap (see GoodputLedger).
PARTS = ("detection", "restart", "paused", "recompute")


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of half-open intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _back_over_gaps(end: float, duration: float, covered: list[tuple[float, float]], lo: float):
    """Intervals totalling `duration` (or less, when `lo` is reached) that end at `end` and run
    backwards through the time NOT in `covered` (a sorted disjoint union)."""
    remaining = duration
    cursor = end
    for a, b in reversed(covered):
        if remaining <= 0 or cursor <= lo:
            return
        if a >= cursor:
            continue
        if b < cursor:  # a gap (b, cursor) of productive time
            start = max(b, cursor - remaining, lo)
            if cursor > start:
                yield (start, cursor)
                remaining -= cursor - start
        cursor = min(cursor, a)
    if remaining > 0 and cursor > lo:
        yield (max(lo, cursor - remaining), cursor)


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------
# Records and summary
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interruption:
    """One fault and its recovery. Times are on the ledger's clock (seconds)."""

    kind: str
    occurred_at: float
    detected_at: float
    resumed_at: float
    recomputed_s: float = 0.0
    recomputed_steps: int = 0

    def __post_init__(self) -> None:
        for name in ("occurred_at", "detected_at", "resumed_at", "recomputed_s"):
            _finite(name, getattr(self, name))
        if not (self.occurred_at <= self.detected_at <= self.resumed_at):
            raise ValueError(
                f"need occurred_at <= detected_at <= resumed_at, got {self.occurred_at}, {self.detected_at}, "
                f"{self.resumed_at}"
            )
        if self.recomputed_s < 0:
            raise ValueError(f"recomputed_s must be >= 0, got {self.recomputed_s}")
        if isinstance(self.recomputed_steps, bool) or not isinstance(self.recomputed_steps, int) or (
            self.recomputed_steps < 0
        ):
            raise ValueError(f"recomputed_steps must be an integer >= 0, got {self.recomputed_steps!r}")
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError("kind must be a non-empty string")

    @property
    def detection_s(self) -> float:
        return self.detected_at - self.occurred_at

    @property
    def restart_s(self) -> float:
        return self.resumed_at - self.detected_at

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "occurred_at": self.occurred_at,
            "detected_at": self.detected_at,
            "resumed_at": self.resumed_at,
            "recomputed_s": self.recomputed_s,
            "recomputed_steps": self.recomputed_steps,
        }


@dataclass(frozen=True)
class Pause:
    """A span after the first start when the job was not running by no fault of its own."""

    kind: str
    start: float
    end: float

    def __post_init__(self) -> None:
        _finite("start", self.start)
        _finite("end", self.end)
        if self.end < self.start:
            raise ValueError(f"pause ends before it starts: {self.start} > {self.end}")
        if not isinstance(self.kind, str) or not self.kind:
            raise ValueError("kind must be a non-empty string")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class GoodputSummary:
    """A job's time since its first start, split into productive time and the four lost parts.

    wall_s = productive_s + detection_s + restart_s + recompute_s + paused_s (to rounding).
    interruptions / pauses: how many of each kind happened by `now`.
    ettr = productive_s / wall_s, 1.0 when wall_s == 0.
    """

    wall_s: float
    productive_s: float
    detection_s: float
    restart_s: float
    recompute_s: float
    paused_s: float
    interruptions: Mapping[str, int] = field(default_factory=dict)
    pauses: Mapping[str, int] = field(default_factory=dict)
    recomputed_steps: int = 0
    ettr: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "interruptions", dict(self.interruptions))
        object.__setattr__(self, "pauses", dict(self.pauses))
        ettr = 1.0 if self.wall_s <= 0 else min(1.0, max(0.0, self.productive_s / self.wall_s))
        object.__setattr__(self, "ettr", ettr)

    @property
    def lost_s(self) -> float:
        return self.detection_s + self.restart_s + self.recompute_s + self.paused_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "detection_s": self.detection_s,
            "restart_s": self.restart_s,
            "recompute_s": self.recompute_s,
            "paused_s": self.paused_s,
            "interruptions": dict(self.interruptions),
            "pauses": dict(self.pauses),
            "recomputed_steps": self.recomputed_steps,
            "ettr": self.ettr,
        }


# --------------------------------------------------------------------------------------------------
# The ledger
# --------------------------------------------------------------------------------------------------


class GoodputLedger:
    """The timeline of one training job since its first start: interruptions and pauses.

    Only lost time is recorded; productive time is what remains of the wall time. Each lost part is
    made of intervals on the timeline:

    - detection  [occurred_at, detected_at]
    - restart    [detected_at, resumed_at]
    - paused     [start, end]
    - recompute  the last `recomputed_s` seconds of training before `occurred_at`: the steps done since
                 the last complete checkpoint, wasted at the moment of the fault (they are redone after
                 resuming, but the time lost is the time that was spent on them). The window runs back
                 from occurred_at over time that is not already lost (it skips earlier detections,
                 restarts and pauses, since no training happened then) and stops at the first start.

    Overlap rule: `summary(now)` clips every interval to [first_started_at, now], ignores
    interruptions that occur after `now`, and counts each instant at most once. An instant covered by
    several parts goes to the first of detection, restart, paused (observed spans; a pause that
    overlaps a fault's detection or restart counts as the fault's), then recompute (an estimate,
    placed in the time that is left). Two recompute windows that overlap count once. So
    productive_s = wall_s - |union of all lost intervals|, which is never negative, and the parts
    always add up to the lost time. Recording the same span twice does not lose it twice.
    """

    def __init__(self, first_started_at: float) -> None:
        self.first_started_at = _finite("first_started_at", first_started_at)
        self.interruption_records: list[Interruption] = []
        self.pause_records: list[Pause] = []

    def record_interruption(
        self,
        *,
        kind: str,
        occurred_at: float,
        detected_at: float,
        resumed_at: float,
        recomputed_s: float = 0.0,
        recomputed_steps: int = 0,
    ) -> Interruption:
        """Record a fault and its recovery; raises ValueError on an impossible timeline."""
        record = Interruption(
            kind=str(kind),
            occurred_at=occurred_at,
            detected_at=detected_at,
            resumed_at=resumed_at,
            recomputed_s=recomputed_s,
            recomputed_steps=recomputed_steps,
        )
        if record.occurred_at < self.first_started_at:
            raise ValueError(f"interruption at {occurred_at} precedes the first start {self.first_started_at}")
        self.interruption_records.append(record)
        return record

    def record_pause(self, *, kind: str, start: float, end: float) -> Pause:
        """Record a span when the job was not running by no fault of its own (preempted, queued ...)."""
        record = Pause(kind=str(kind), start=start, end=end)
        if record.start < self.first_started_at:
            raise ValueError(f"pause at {start} precedes the first start {self.first_started_at}")
        self.pause_records.append(record)
        return record

    def _lost_intervals(self, lo: float, hi: float) -> list[tuple[float, float, int]]:
        """(start, end, part index into PARTS) of every lost interval, clipped to [lo, hi].

        Interruptions that occur after `hi` have not happened yet and contribute nothing.
        """
        fixed: list[tuple[float, float, int]] = []
        happened = [it for it in self.interruption_records if it.occurred_at <= hi]
        for it in happened:
            fixed.append((it.occurred_at, it.detected_at, 0))
            fixed.append((it.detected_at, it.resumed_at, 1))
        fixed.extend((p.start, p.end, 2) for p in self.pause_records)
        clipped = [(max(a, lo), min(b, hi), part) for a, b, part in fixed]
        clipped = [(a, b, part) for a, b, part in clipped if b > a]
        covered = _union((a, b) for a, b, _ in clipped)
        for it in happened:
            clipped.extend((a, b, 3) for a, b in _back_over_gaps(it.occurred_at, it.recomputed_s, covered, lo))
        return clipped

    def summary(self, now: float) -> GoodputSummary:
        """The job's goodput as of `now` (see the class doc for the overlap rule)."""
        now = _finite("now", now)
        lo = self.first_started_at
        hi = max(lo, now)
        # Sweep over the interval ends, keeping a count of open intervals per part; each elementary
        # segment goes to the first open part in PARTS order.
        events: list[tuple[float, int, int]] = []
        for a, b, part in self._lost_intervals(lo, hi):
            events.append((a, +1, part))
            events.append((b, -1, part))
        events.sort()
        open_count = [0] * len(PARTS)
        lost = [0.0] * len(PARTS)
        prev = lo
        for at, delta, part in events:
            if at > prev:
                active = next((i for i, n in enumerate(open_count) if n > 0), None)
                if active is not None:
                    lost[active] += at - prev
                prev = at
            open_count[part] += delta
        wall = hi - lo
        detection, restart, paused, recompute = lost
        productive = max(0.0, wall - math.fsum(lost))
        happened = [it for it in self.interruption_records if it.occurred_at <= now]
        return GoodputSummary(
            wall_s=wall,
            productive_s=productive,
            detection_s=detection,
            restart_s=restart,
            recompute_s=recompute,
            paused_s=paused,
            interruptions=dict(sorted(Counter(it.kind for it in happened).items())),
            pauses=dict(sorted(Counter(p.kind for p in self.pause_records if p.start <= now).items())),
            recomputed_steps=sum(it.recomputed_steps for it in happened),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form, for the control plane to persist."""
        return {
            "version": 1,
            "first_started_at": self.first_started_at,
            "interruptions": [it.to_dict() for it in self.interruption_records],
            "pauses": [p.to_dict() for p in self.pause_records],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GoodputLedger:
        version = data.get("version", 1)
        if version != 1:
            raise ValueError(f"unsupported goodput ledger version {version!r}")
        ledger = cls(data["first_started_at"])
        for it in data.get("interruptions", ()):
            ledger.record_interruption(
                kind=it["kind"],
                occurred_at=it["occurred_at"],
                detected_at=it["detected_at"],
                resumed_at=it["resumed_at"],
                recomputed_s=it.get("recomputed_s", 0.0),
                recomputed_steps=it.get("recomputed_steps", 0),
            )
        for p in data.get("pauses", ()):
            ledger.record_pause(kind=p["kind"], start=p["start"], end=p["end"])
        return ledger

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GoodputLedger):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"GoodputLedger(first_started_at={self.first_started_at}, "
            f"interruptions={len(self.interruption_records)}, pauses={len(self.pause_records)})"
        )


def cluster_ettr(summaries: Iterable[GoodputSummary]) -> float:
    """ETTR of many jobs together: sum of productive time / sum of wall time (1.0 when no wall time).

    Long jobs weigh more than short ones, as they should: this is the share of all job time that
    trained, not the mean of the jobs' ratios.
    """
    productive = wall = 0.0
    for s in summaries:
        productive += s.productive_s
        wall += s.wall_s
    return 1.0 if wall <= 0 else min(1.0, max(0.0, productive / wall))


# --------------------------------------------------------------------------------------------------
# Extrapolation
# --------------------------------------------------------------------------------------------------


def young_daly_interval_s(*, checkpoint_save_s: float, mtbf_s: float) -> float:
    """Young/Daly first-order optimal checkpoint interval: sqrt(2 x save time x MTBF).

    Returns inf when the MTBF is infinite (no failures: never checkpoint for resilience) and 0 when
    saving is free.
    """
    if isinstance(checkpoint_save_s, bool) or not isinstance(checkpoint_save_s, int | float) or checkpoint_save_s < 0:
        raise ValueError(f"checkpoint_save_s must be >= 0, got {checkpoint_save_s!r}")
    if isinstance(mtbf_s, bool) or not isinstance(mtbf_s, int | float) or not mtbf_s > 0:
        raise ValueError(f"mtbf_s must be > 0, got {mtbf_s!r}")
    if math.isinf(mtbf_s):
        return 0.0 if checkpoint_save_s == 0 else math.inf
    return math.sqrt(2.0 * checkpoint_save_s * mtbf_s)


@dataclass(frozen=True)
class ExtrapolatedGoodput:
    """Expected ETTR of a job of `devices` under a reference failure rate.

    The lost fractions add up to `lost_fraction`; ettr = clamp(1 - lost_fraction, 0, 1).
    """

    devices: int
    failures_per_device_hour: float
    failures_per_hour: float  # for the whole job
    mtbf_hours: float  # for the whole job; inf without failures
    detection_fraction: float
    restart_fraction: float
    recompute_fraction: float
    checkpoint_fraction: float
    lost_fraction: float
    ettr: float
    young_daly_interval_s: float  # the optimal checkpoint interval for this MTBF and save time

    @property
    def meets_baige_target(self) -> bool:
        return self.ettr >= BAIGE_ETTR_TARGET

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:  # inf is not JSON
            return x if math.isfinite(x) else None

        return {
            "devices": self.devices,
            "failures_per_device_hour": self.failures_per_device_hour,
            "failures_per_hour": self.failures_per_hour,
            "mtbf_hours": num(self.mtbf_hours),
            "detection_fraction": self.detection_fraction,
            "restart_fraction": self.restart_fraction,
            "recompute_fraction": self.recompute_fraction,
            "checkpoint_fraction": self.checkpoint_fraction,
            "lost_fraction": self.lost_fraction,
            "ettr": self.ettr,
            "young_daly_interval_s": num(self.young_daly_interval_s),
        }


def extrapolate_ettr(
    *,
    devices: int,
    interruptions: int,
    period_days: float,
    reference_devices: int,
    detection_s: float,
    restart_s: float,
    checkpoint_interval_s: float,
    checkpoint_save_s: float = 0.0,
) -> ExtrapolatedGoodput:
    """Expected ETTR of a synchronous job on `devices` devices.

    The reference observed `interruptions` on `reference_devices` devices over `period_days`; failures
    are assumed independent per device, so the job's rate scales linearly with its size:

        rate_device = interruptions / (reference_devices x period_days x 24)      [per device-hour]
        rate_job    = rate_device x devices / 3600                                [per second]
        lost        = rate_job x (detection_s + restart_s + checkpoint_interval_s / 2)
                      + checkpoint_save_s / checkpoint_interval_s
        ettr        = clamp(1 - lost, 0, 1)

    A fault lands on average half-way through a checkpoint interval, hence interval / 2 recomputed.
    Saving is assumed to block training (an asynchronous save would make checkpoint_save_s ~ 0).
    """
    for name, value in (("devices", devices), ("reference_devices", reference_devices)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(interruptions, bool) or not isinstance(interruptions, int) or interruptions < 0:
        raise ValueError(f"interruptions must be an integer >= 0, got {interruptions!r}")
    if _finite("period_days", period_days) <= 0:
        raise ValueError(f"period_days must be > 0, got {period_days}")
    nonnegative = (("detection_s", detection_s), ("restart_s", restart_s), ("checkpoint_save_s", checkpoint_save_s))
    for name, value in nonnegative:
        if _finite(name, value) < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    if _finite("checkpoint_interval_s", checkpoint_interval_s) <= 0:
        raise ValueError(f"checkpoint_interval_s must be > 0, got {checkpoint_interval_s}")

    per_device_hour = interruptions / (reference_devices * period_days * 24.0)
    per_hour = per_device_hour * devices
    per_second = per_hour / 3600.0
    mtbf_hours = math.inf if per_hour == 0 else 1.0 / per_hour
    detection = per_second * detection_s
    restart = per_second * restart_s
    recompute = per_second * checkpoint_interval_s / 2.0
    checkpoint = checkpoint_save_s / checkpoint_interval_s
    lost = detection + restart + recompute + checkpoint
    return ExtrapolatedGoodput(
        devices=devices,
        failures_per_device_hour=per_device_hour,
        failures_per_hour=per_hour,
        mtbf_hours=mtbf_hours,
        detection_fraction=detection,
        restart_fraction=restart,
        recompute_fraction=recompute,
        checkpoint_fraction=checkpoint,
        lost_fraction=lost,
        ettr=min(1.0, max(0.0, 1.0 - lost)),
        young_daly_interval_s=young_daly_interval_s(checkpoint_save_s=checkpoint_save_s, mtbf_s=mtbf_hours * 3600.0),
    )
