"""The SLA autoscaling policy (a pure core): initial settings, breaches, relaxing, hysteresis."""

from __future__ import annotations

import dataclasses

import pytest

from inference.autoscaling import (
    MIN_REQUESTS,
    AutoscalingDecision,
    ObservedWindow,
    Sla,
    adjust_autoscaling,
    find_breach,
    initial_autoscaling,
    percentile,
)

SLA = Sla(ttft_p95_ms=500, tpot_p95_ms=50)


def window(at: float, *, requests: int = 40, ttft: float | None = 100.0, tpot: float | None = 10.0,
           overloaded: int = 0) -> ObservedWindow:
    return ObservedWindow(at=at, window_s=60, requests=requests, ttft_p95_ms=ttft, tpot_p95_ms=tpot,
                          overloaded=overloaded, replicas_running=1)


def test_initial_settings_start_at_the_slot_count_and_explain_themselves():
    decision = initial_autoscaling(SLA, slots=4, replicas_min=1, replicas_max=3)
    assert decision.target_ongoing_requests == 4 and decision.slots == 4
    assert (decision.min_replicas, decision.max_replicas) == (1, 3)
    assert decision.upscale_delay_s == 5.0 and decision.downscale_delay_s > decision.upscale_delay_s
    assert decision.breach is None and not decision.changed
    assert "4" in decision.reason and "500 ms" in decision.reason
    assert decision.serve_config() == {"target_ongoing_requests": 4, "min_replicas": 1, "max_replicas": 3,
                                       "upscale_delay_s": 5.0, "downscale_delay_s": 300.0}


def test_a_tight_sla_scales_up_sooner_within_bounds():
    assert initial_autoscaling(Sla(100, 20), 2, 1, 1).upscale_delay_s == 3.0
    assert initial_autoscaling(Sla(60_000, 20), 2, 1, 1).upscale_delay_s == 30.0


def test_round_trips_through_a_dict():
    decision = initial_autoscaling(SLA, slots=8, replicas_min=0, replicas_max=2)
    assert AutoscalingDecision.from_dict(decision.to_dict()) == decision
    assert AutoscalingDecision.from_dict({}) is None and AutoscalingDecision.from_dict(None) is None


def test_a_ttft_breach_lowers_the_target_and_names_the_breach():
    decision = adjust_autoscaling(initial_autoscaling(SLA, 4, 1, 3), window(1000.0, ttft=812), SLA)
    assert decision.breach == "TTFT p95 812 ms > SLA 500 ms over 40 requests in the last 60 s"
    assert decision.changed and decision.target_ongoing_requests == 2 and decision.changed_at == 1000.0
    assert "lowered from 4 to 2" in decision.reason


def test_a_tpot_breach_counts_too():
    decision = adjust_autoscaling(initial_autoscaling(SLA, 4, 1, 3), window(1000.0, tpot=75), SLA)
    assert decision.breach.startswith("TPOT p95 75 ms > SLA 50 ms") and decision.target_ongoing_requests == 2


def test_overloaded_refusals_are_a_breach():
    decision = adjust_autoscaling(initial_autoscaling(SLA, 4, 1, 3), window(1000.0, overloaded=10), SLA)
    assert "10 of 40 requests refused as overloaded" in decision.breach and decision.changed


def test_too_few_requests_say_nothing():
    start = initial_autoscaling(SLA, 4, 1, 3)
    decision = adjust_autoscaling(start, window(1000.0, requests=MIN_REQUESTS - 1, ttft=5000), SLA)
    assert decision.breach is None and not decision.changed and decision.target_ongoing_requests == 4
    assert find_breach(window(0, requests=MIN_REQUESTS, ttft=501), SLA) is not None


def test_the_target_never_goes_below_one_and_the_breach_stays():
    decision = initial_autoscaling(SLA, 4, 1, 3)
    at = 0.0
    for _ in range(6):
        at += 61
        decision = adjust_autoscaling(decision, window(at, ttft=900), SLA)
    assert decision.target_ongoing_requests == 1 and decision.breach is not None and not decision.changed
    assert "already at 1" in decision.reason


def test_hysteresis_waits_a_window_before_lowering_again():
    first = adjust_autoscaling(initial_autoscaling(SLA, 8, 1, 3), window(1000.0, ttft=900), SLA)
    assert first.target_ongoing_requests == 4
    soon = adjust_autoscaling(first, window(1010.0, ttft=900), SLA)
    assert not soon.changed and soon.target_ongoing_requests == 4 and soon.breach is not None
    later = adjust_autoscaling(soon, window(1061.0, ttft=900), SLA)
    assert later.changed and later.target_ongoing_requests == 2


def test_calm_windows_raise_the_target_back_slowly_toward_the_slots():
    lowered = dataclasses.replace(initial_autoscaling(SLA, 4, 1, 3), target_ongoing_requests=1, changed_at=1000.0)
    calm = window(1060.0, ttft=100, tpot=10)
    held = adjust_autoscaling(lowered, calm, SLA)
    assert not held.changed and held.target_ongoing_requests == 1  # raising waits two windows
    raised = adjust_autoscaling(lowered, window(1121.0, ttft=100, tpot=10), SLA)
    assert raised.changed and raised.target_ongoing_requests == 2 and raised.breach is None
    again = adjust_autoscaling(raised, window(1242.0, ttft=100, tpot=10), SLA)
    assert again.target_ongoing_requests == 3
    top = adjust_autoscaling(again, window(1363.0, ttft=100, tpot=10), SLA)
    assert top.target_ongoing_requests == 4
    assert not adjust_autoscaling(top, window(1500.0, ttft=100, tpot=10), SLA).changed  # never above the slots


def test_the_dead_band_holds():
    lowered = dataclasses.replace(initial_autoscaling(SLA, 4, 1, 3), target_ongoing_requests=2, changed_at=0.0)
    decision = adjust_autoscaling(lowered, window(10_000.0, ttft=300, tpot=10), SLA)  # 60% of the SLA
    assert not decision.changed and decision.target_ongoing_requests == 2 and decision.breach is None


def test_the_reason_says_when_the_sla_is_met_again():
    breached = adjust_autoscaling(initial_autoscaling(SLA, 4, 1, 3), window(1000.0, ttft=900), SLA)
    recovered = adjust_autoscaling(breached, window(1030.0, ttft=300), SLA)
    assert recovered.breach is None and "SLA met again" in recovered.reason


@pytest.mark.parametrize("values,q,expected", [
    ([], 95, None), ([7.0], 95, 7.0), ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
    (list(range(1, 101)), 95, 95.05), ([1.0, 2.0], 100, 2.0),
])
def test_percentile(values, q, expected):
    result = percentile(values, q)
    assert result == (None if expected is None else pytest.approx(expected))


def _steady(decision, ttft_at_target, *, windows: int, start: float = 0.0, requests: int = 40):
    """Runs the policy for `windows` windows of one steady load whose TTFT p95 depends only on the target."""
    seen = []
    for i in range(1, windows + 1):
        at = start + i * 61.0
        decision = adjust_autoscaling(decision, window(at, requests=requests,
                                                       ttft=ttft_at_target[decision.target_ongoing_requests]), SLA)
        seen.append((decision.target_ongoing_requests, decision.breach is not None))
    return decision, seen


# A steady load: target 4 and 3 breach the 500 ms SLA, 2 is calm (under half of it), 1 calmer still.
STEADY = {4: 900.0, 3: 700.0, 2: 200.0, 1: 100.0}


def test_a_steady_load_does_not_flap_back_to_a_target_that_breached():
    """QA: a steady load that breached at target 3 and was calm at 2 went 3 -> 1 -> 2 -> 3 -> breach every five
    windows (DEGRADED each time); a target that breached is not tried again at the load it breached under."""
    decision, seen = _steady(initial_autoscaling(SLA, 4, 1, 3), STEADY, windows=40)
    settled = seen[10:]
    assert not any(breach for _, breach in settled), seen
    assert {target for target, _ in settled} == {2}, seen
    assert "held" in decision.reason and "3 breached the SLA" in decision.reason
    assert AutoscalingDecision.from_dict(decision.to_dict()) == decision


def test_a_target_that_breached_is_tried_again_once_the_load_falls():
    decision, _ = _steady(initial_autoscaling(SLA, 4, 1, 3), STEADY, windows=20)
    assert decision.target_ongoing_requests == 2
    calm = {4: 200.0, 3: 150.0, 2: 100.0, 1: 80.0}  # half the requests: every target is calm
    decision, seen = _steady(decision, calm, windows=10, start=20 * 61.0, requests=20)
    assert decision.target_ongoing_requests == 4 and decision.breached_target is None, seen


def test_a_decision_stored_before_the_breach_memory_still_loads():
    stored = initial_autoscaling(SLA, 4, 1, 3).to_dict()
    del stored["breached_target"], stored["breached_rate"]
    assert AutoscalingDecision.from_dict(stored).breached_target is None


def test_a_p95_over_too_few_answered_requests_is_no_breach_and_not_calm():
    """QA: 19 requests refused (400) and one slow answer were a "TTFT p95 900 ms ... over 20 requests" breach."""
    few = ObservedWindow(at=1000.0, window_s=60, requests=20, ttft_p95_ms=900.0, tpot_p95_ms=10.0, measured=1)
    assert find_breach(few, SLA) is None
    start = dataclasses.replace(initial_autoscaling(SLA, 4, 1, 3), target_ongoing_requests=1)
    fast = dataclasses.replace(few, ttft_p95_ms=10.0, at=10_000.0)
    assert not adjust_autoscaling(start, fast, SLA).changed  # nor calm: one answer says nothing of a p95
    enough = dataclasses.replace(few, requests=60, measured=MIN_REQUESTS)
    assert find_breach(enough, SLA) == f"TTFT p95 900 ms > SLA 500 ms over {MIN_REQUESTS} requests in the last 60 s"
    refused = dataclasses.replace(few, ttft_p95_ms=None, tpot_p95_ms=None, overloaded=20, measured=0)
    assert "20 of 20 requests refused as overloaded" in find_breach(refused, SLA)  # 429s still count


def test_failed_requests_are_sla_misses_not_a_calm_window():
    """QA: 5xx answers were left out of the policy: 20 fast answers and 20 failed requests were a calm window (the
    target went up, fewer replicas), and a window of nothing but failures was no breach at all."""
    lowered = dataclasses.replace(initial_autoscaling(SLA, 4, 1, 3), target_ongoing_requests=2, changed_at=0.0)
    failing = ObservedWindow(at=10_000.0, window_s=60, requests=40, ttft_p95_ms=100.0, tpot_p95_ms=10.0, errors=20,
                             measured=20)
    decision = adjust_autoscaling(lowered, failing, SLA)
    assert decision.breach == ("20 of 40 requests not served (20 failed (5xx)) in the last 60 s; errors and "
                               "timeouts count as SLA misses")
    assert decision.changed and decision.target_ongoing_requests == 1
    assert "counted as SLA misses" in decision.reason and "up to 3" in decision.reason
    only_errors = dataclasses.replace(failing, ttft_p95_ms=None, tpot_p95_ms=None, errors=40, measured=0)
    assert find_breach(only_errors, SLA).startswith("40 of 40 requests not served")
    few = dataclasses.replace(failing, errors=1, requests=40, measured=39)  # 2.5%: no breach, but not calm either
    held = adjust_autoscaling(lowered, few, SLA)
    assert held.breach is None and not held.changed and held.target_ongoing_requests == 2


def test_timeouts_are_named_and_errors_never_scale_past_replicas_max():
    """A deployment that fails for another reason than load: its errors lower the target to 1 (Serve runs up to
    replicas_max), no further, and the reason says the errors were counted."""
    window_ = ObservedWindow(at=0.0, window_s=60, requests=40, errors=40, timeouts=30, overloaded=0, measured=0)
    decision = initial_autoscaling(SLA, 4, 1, 3)
    for i in range(1, 8):
        decision = adjust_autoscaling(decision, dataclasses.replace(window_, at=i * 61.0), SLA)
    assert decision.breach == ("40 of 40 requests not served (30 timed out (504), 10 failed (5xx)) in the last 60 s; "
                               "errors and timeouts count as SLA misses")
    assert (decision.target_ongoing_requests, decision.min_replicas, decision.max_replicas) == (1, 1, 3)
    assert not decision.changed and "replicas capped at 3" in decision.reason
    assert "40 failed or timed-out request(s) counted as SLA misses" in decision.reason
    mixed = dataclasses.replace(window_, errors=2, timeouts=2, overloaded=3, measured=35)
    assert find_breach(mixed, SLA).startswith("5 of 40 requests not served (3 refused as overloaded (429), 2 timed "
                                              "out (504))")
