"""The SLA-aware autoscaling policy: a pure core (no Django, no Ray), plain dataclasses in, decisions out.

Ray Serve scales a deployment so that each replica has about `target_ongoing_requests` requests in
flight. Our LLM server decodes `slots` sequences together; a request beyond them waits in the
replica's queue, and that wait is time to first token. So the policy starts the target at the slot
count (a replica is "full" when its slots are), and then steers it from what was measured:

- a p95 TTFT or TPOT above the SLA (over at least `MIN_REQUESTS` requests in the window), or too many
  requests not served (refused as overloaded, 429, or failed, 5xx, timeouts (504) included: they wanted service
  and got none, so they count as SLA misses), is a *breach*: the target is halved (never below 1) so Serve adds
  replicas before queues build up, and the breach text is what marks the deployment DEGRADED. Errors never scale
  past `replicas_max` (the target stops at 1 per replica), and the reason says they were counted: a model that fails
  for another reason than load gets no further replicas from its errors;
- both p95 comfortably under the SLA (below `RELAX_FRACTION` of it), with no request refused or failed, is *calm*:
  the target goes back up one step toward the slot count, so replicas are not kept idle;
- anything in between holds.

Hysteresis, so it does not flap: after any change the policy waits a full window (the measurements
still describe the old setting) before lowering again, and `RELAX_AFTER_WINDOWS` windows before
raising; between the relax and breach thresholds there is a dead band where nothing changes. A target
that breached the SLA is remembered with the request rate it breached under: calm windows raise the
target only below it until the rate falls under `RETRY_LOAD_FRACTION` of that rate (before, a steady
load that breached at target 3 and was calm at 2 went 3 -> 1 -> 2 -> 3 -> breach every five windows,
marking the deployment DEGRADED each time).

    decision = initial_autoscaling(Sla(500, 50), slots=4, replicas_min=1, replicas_max=3)
    decision = adjust_autoscaling(decision, ObservedWindow(at=now, window_s=60, requests=40,
                                                           ttft_p95_ms=812, tpot_p95_ms=20), Sla(500, 50))
    decision.breach  # "TTFT p95 812 ms > SLA 500 ms over 40 requests in the last 60 s"
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Fewer requests than this in a window say nothing about a p95: no breach, no change.
MIN_REQUESTS = 20
# Both p95 under this fraction of their SLA: calm, the target may rise again.
RELAX_FRACTION = 0.5
# More than this fraction of the window's requests not served (refused as overloaded, 429, or failed, 5xx, timeouts
# included) is a breach: counted as SLA misses, they alone put the p95 over the SLA.
OVERLOAD_FRACTION = 0.05
# Windows of quiet after the last change before the target is raised (lowering waits one window).
RELAX_AFTER_WINDOWS = 2
# A target that breached is tried again only once the request rate is below this fraction of the rate it breached at.
RETRY_LOAD_FRACTION = 0.75
# Serve's delays: scale up quickly when the SLA is tight, scale down slowly (replicas are costly to start).
UPSCALE_DELAY_RANGE_S = (3.0, 30.0)
DOWNSCALE_DELAY_S = 300.0


@dataclass(frozen=True)
class Sla:
    ttft_p95_ms: float
    tpot_p95_ms: float
    min_throughput_tps: float | None = None


@dataclass(frozen=True)
class ObservedWindow:
    """What the requests of the last `window_s` seconds measured (ending at `at`, epoch seconds)."""

    at: float
    window_s: float
    requests: int
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None
    errors: int = 0  # answered 5xx (the gateway's timeouts, 504, included), not counting "not serving yet"
    overloaded: int = 0
    timeouts: int = 0  # of `errors`: the model did not answer in time (504)
    replicas_running: int = 0
    output_tokens_per_s: float | None = None
    cache_hit_rate: float | None = None
    # The requests answered (2xx) whose timings the p95s are taken over; None: all `requests`.
    measured: int | None = None

    @property
    def latency_samples(self) -> int:
        return self.requests if self.measured is None else min(self.measured, self.requests)


@dataclass(frozen=True)
class AutoscalingDecision:
    """Ray Serve autoscaling settings, why they are what they are, and whether the SLA was breached."""

    target_ongoing_requests: int
    min_replicas: int
    max_replicas: int
    upscale_delay_s: float
    downscale_delay_s: float
    slots: int
    reason: str
    breach: str | None = None
    changed: bool = False
    changed_at: float = 0.0
    # The last target lowered for a breach, and the requests per second of the window that breached it.
    breached_target: int | None = None
    breached_rate: float | None = None

    def serve_config(self) -> dict[str, Any]:
        """The `autoscaling_config` of a Ray Serve deployment."""
        return {"target_ongoing_requests": self.target_ongoing_requests, "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas, "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> AutoscalingDecision | None:
        """The decision stored with a deployment; None when there is none (or it is unreadable)."""
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in dict(data or {}).items() if k in names})
        except TypeError:
            return None


def initial_autoscaling(sla: Sla, slots: int, replicas_min: int, replicas_max: int) -> AutoscalingDecision:
    """The settings a deployment starts with: one replica's worth of slots per replica."""
    slots = max(1, int(slots))
    low, high = UPSCALE_DELAY_RANGE_S
    upscale = round(min(high, max(low, sla.ttft_p95_ms / 100.0)), 1)
    min_replicas = max(0, int(replicas_min))
    max_replicas = max(1, int(replicas_max), min_replicas)
    reason = (f"target {slots} ongoing request(s) per replica (the engine decodes {slots} at once; more would "
              f"queue and add to TTFT, SLA {_ms(sla.ttft_p95_ms)} ms); replicas {min_replicas}-{max_replicas}; "
              f"scale up after {upscale:g} s, down after {DOWNSCALE_DELAY_S:g} s")
    return AutoscalingDecision(target_ongoing_requests=slots, min_replicas=min_replicas, max_replicas=max_replicas,
                               upscale_delay_s=upscale, downscale_delay_s=DOWNSCALE_DELAY_S, slots=slots,
                               reason=reason)


def find_breach(window: ObservedWindow, sla: Sla) -> str | None:
    """The first SLA breach the window shows, in words, or None (also with too few requests to tell). A p95 counts
    only over at least MIN_REQUESTS answered requests (before, one slow answer among 19 refused requests was a "TTFT
    p95 ... over 20 requests" breach)."""
    if window.requests < MIN_REQUESTS:
        return None
    span = f"over {window.latency_samples} requests in the last {window.window_s:g} s"
    if window.latency_samples >= MIN_REQUESTS:
        if window.ttft_p95_ms is not None and window.ttft_p95_ms > sla.ttft_p95_ms:
            return f"TTFT p95 {_ms(window.ttft_p95_ms)} ms > SLA {_ms(sla.ttft_p95_ms)} ms {span}"
        if window.tpot_p95_ms is not None and window.tpot_p95_ms > sla.tpot_p95_ms:
            return f"TPOT p95 {_ms(window.tpot_p95_ms)} ms > SLA {_ms(sla.tpot_p95_ms)} ms {span}"
    unserved = window.overloaded + window.errors
    if unserved > OVERLOAD_FRACTION * window.requests:
        if not window.errors:
            return (f"{window.overloaded} of {window.requests} requests refused as overloaded (429) "
                    f"in the last {window.window_s:g} s")
        return (f"{unserved} of {window.requests} requests not served ({_unserved_parts(window)}) in the last "
                f"{window.window_s:g} s; errors and timeouts count as SLA misses")
    return None


def _unserved_parts(window: ObservedWindow) -> str:
    timeouts = min(window.timeouts, window.errors)
    parts = [f"{window.overloaded} refused as overloaded (429)" if window.overloaded else "",
             f"{timeouts} timed out (504)" if timeouts else "",
             f"{window.errors - timeouts} failed (5xx)" if window.errors - timeouts else ""]
    return ", ".join(part for part in parts if part)


def _calm(window: ObservedWindow, sla: Sla) -> bool:
    if window.latency_samples < MIN_REQUESTS or window.overloaded or window.errors or window.ttft_p95_ms is None:
        return False
    if window.ttft_p95_ms >= RELAX_FRACTION * sla.ttft_p95_ms:
        return False
    return window.tpot_p95_ms is None or window.tpot_p95_ms < RELAX_FRACTION * sla.tpot_p95_ms


def adjust_autoscaling(current: AutoscalingDecision, window: ObservedWindow, sla: Sla) -> AutoscalingDecision:
    """The next settings from a measured window. `changed` says whether the Serve settings differ."""
    breach = find_breach(window, sla)
    since_change = window.at - current.changed_at
    target = current.target_ongoing_requests
    hold = dataclasses.replace(current, breach=breach, changed=False)
    if breach is not None:
        if target <= 1:
            return dataclasses.replace(hold, reason=f"{breach}; target already at 1 ongoing request per replica, "
                                                    f"replicas capped at {current.max_replicas}"
                                                    + _errors_note(window))
        if since_change < window.window_s:
            return dataclasses.replace(hold, reason=f"{breach}; waiting a full window after the last change "
                                                    f"(target {target})")
        lowered = max(1, target // 2)
        return dataclasses.replace(
            hold, target_ongoing_requests=lowered, changed=True, changed_at=window.at, breached_target=target,
            breached_rate=_rate(window),
            reason=f"{breach}: target lowered from {target} to {lowered} ongoing request(s) per replica so Serve "
                   f"adds replicas (up to {current.max_replicas})" + _errors_note(window))
    if _calm(window, sla) and target < current.slots:
        if since_change < RELAX_AFTER_WINDOWS * window.window_s:
            return hold
        raised = min(current.slots, target + max(1, target // 2))
        ceiling = current.breached_target
        if ceiling is not None and current.breached_rate is not None \
                and _rate(window) >= RETRY_LOAD_FRACTION * current.breached_rate:
            if target >= ceiling - 1:  # the next step is a target that breached at about this load
                return dataclasses.replace(
                    hold, reason=f"target {target} ongoing request(s)/replica held: {ceiling} breached the SLA at "
                                 f"{current.breached_rate:.3g} requests/s, and the load is {_rate(window):.3g}/s "
                                 f"(it is tried again under {RETRY_LOAD_FRACTION:.0%} of that)")
            raised = min(raised, ceiling - 1)
        elif ceiling is not None:  # the load fell: the breached target may be tried again
            hold = dataclasses.replace(hold, breached_target=None, breached_rate=None)
        return dataclasses.replace(
            hold, target_ongoing_requests=raised, changed=True, changed_at=window.at,
            reason=f"TTFT p95 {_ms(window.ttft_p95_ms)} ms and TPOT p95 {_ms(window.tpot_p95_ms)} ms under "
                   f"{RELAX_FRACTION:.0%} of the SLA over {window.latency_samples} requests: target raised from "
                   f"{target} to {raised} (the engine's {current.slots} slots at most)")
    if current.breach is not None:
        return dataclasses.replace(hold, reason=f"SLA met again over {window.requests} requests in the last "
                                                f"{window.window_s:g} s; target {target} ongoing request(s)/replica")
    return hold


def _errors_note(window: ObservedWindow) -> str:
    """What a decision's reason adds when the window's failed requests were counted."""
    if not window.errors:
        return ""
    return (f" ({window.errors} failed or timed-out request(s) counted as SLA misses; never beyond replicas_max: "
            f"more replicas do not help a model that fails for another reason than load)")


def _rate(window: ObservedWindow) -> float:
    """The window's requests per second (what the replicas were asked to carry)."""
    return window.requests / window.window_s if window.window_s > 0 else float(window.requests)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation between closest ranks; None for no values."""
    data = sorted(v for v in values if v is not None and not math.isnan(v))
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
