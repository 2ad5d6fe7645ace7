"""Effective training time (ETTR) accounting and extrapolation (jobs.runtime.goodput)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.runtime.goodput import (
    BAIGE_ETTR_TARGET,
    LLAMA3_FAILURES,
    GoodputLedger,
    GoodputSummary,
    cluster_ettr,
    extrapolate_ettr,
    young_daly_interval_s,
)


def test_fault_free_run_has_ettr_one():
    ledger = GoodputLedger(first_started_at=100.0)
    s = ledger.summary(now=3700.0)
    assert (s.wall_s, s.productive_s, s.ettr) == (3600.0, 3600.0, 1.0)
    assert (s.detection_s, s.restart_s, s.recompute_s, s.paused_s) == (0.0, 0.0, 0.0, 0.0)
    assert s.interruptions == {}
    # No wall time yet: 1.0, not a division by zero.
    assert ledger.summary(now=100.0).ettr == 1.0


def test_one_interruption_by_hand():
    ledger = GoodputLedger(first_started_at=0.0)
    # Fault at 1000 s; noticed 4 s later; training again 60 s after that; 120 s of steps since the
    # last checkpoint (30 steps) had to be redone.
    ledger.record_interruption(
        kind="hang", occurred_at=1000.0, detected_at=1004.0, resumed_at=1064.0, recomputed_s=120.0, recomputed_steps=30
    )
    s = ledger.summary(now=2000.0)
    assert s.wall_s == 2000.0
    assert (s.detection_s, s.restart_s, s.recompute_s, s.paused_s) == (4.0, 60.0, 120.0, 0.0)
    assert s.productive_s == 2000.0 - 184.0
    assert s.ettr == pytest.approx(1816.0 / 2000.0)
    assert s.interruptions == {"hang": 1}
    assert s.recomputed_steps == 30
    assert s.productive_s + s.lost_s == pytest.approx(s.wall_s)


def test_two_interruptions_and_a_pause_by_hand():
    ledger = GoodputLedger(first_started_at=0.0)
    ledger.record_interruption(
        kind="worker_crash", occurred_at=500.0, detected_at=501.0, resumed_at=531.0, recomputed_s=50.0
    )
    ledger.record_interruption(
        kind="node_lost", occurred_at=2000.0, detected_at=2003.0, resumed_at=2100.0, recomputed_s=200.0
    )
    ledger.record_pause(kind="preempted", start=3000.0, end=3600.0)
    s = ledger.summary(now=4000.0)
    assert s.detection_s == 4.0
    assert s.restart_s == 30.0 + 97.0
    assert s.recompute_s == 250.0
    assert s.paused_s == 600.0
    assert s.productive_s == 4000.0 - (4.0 + 127.0 + 250.0 + 600.0)
    assert s.interruptions == {"node_lost": 1, "worker_crash": 1}
    assert s.pauses == {"preempted": 1}


def test_overlapping_intervals_are_not_double_counted():
    ledger = GoodputLedger(first_started_at=0.0)
    # A pause recorded over part of a restart (waiting for capacity while restarting).
    ledger.record_interruption(kind="hang", occurred_at=100.0, detected_at=110.0, resumed_at=200.0)
    ledger.record_pause(kind="waiting_for_capacity", start=150.0, end=250.0)
    # The next fault's 120 s of lost training run back over time that trained: [250, 300] and [30, 100].
    ledger.record_interruption(kind="hang", occurred_at=300.0, detected_at=305.0, resumed_at=320.0, recomputed_s=120.0)
    s = ledger.summary(now=1000.0)
    assert s.detection_s == 10.0 + 5.0
    assert s.restart_s == 90.0 + 15.0
    assert s.paused_s == 50.0  # [200, 250]; [150, 200] is already the restart's
    assert s.recompute_s == 120.0
    assert s.productive_s == 1000.0 - 290.0
    assert s.productive_s + s.lost_s == pytest.approx(s.wall_s)
    # Recording the same pause twice loses nothing more.
    ledger.record_pause(kind="waiting_for_capacity", start=150.0, end=250.0)
    assert ledger.summary(now=1000.0).productive_s == 710.0


def test_recompute_windows_skip_lost_time_and_overlap_once():
    ledger = GoodputLedger(first_started_at=0.0)
    ledger.record_interruption(kind="a", occurred_at=100.0, detected_at=110.0, resumed_at=120.0, recomputed_s=100.0)
    # Overstated: 200 s back from 150 s crosses the first fault's detection and restart ([100, 120]),
    # takes [120, 150], then [0, 100], which the first fault already lost, and stops at the first start.
    ledger.record_interruption(kind="b", occurred_at=150.0, detected_at=151.0, resumed_at=161.0, recomputed_s=200.0)
    s = ledger.summary(now=200.0)
    assert s.recompute_s == 130.0
    assert (s.detection_s, s.restart_s) == (11.0, 20.0)
    assert s.productive_s == 200.0 - 161.0


def test_recompute_window_jumps_over_a_pause():
    ledger = GoodputLedger(first_started_at=0.0)
    ledger.record_pause(kind="preempted", start=100.0, end=200.0)
    # 150 s of steps since the last checkpoint: 100 s after the pause and 50 s before it.
    ledger.record_interruption(kind="hang", occurred_at=300.0, detected_at=300.0, resumed_at=300.0, recomputed_s=150.0)
    s = ledger.summary(now=400.0)
    assert (s.paused_s, s.recompute_s) == (100.0, 150.0)
    assert s.productive_s == 150.0


def test_summary_clips_to_now_and_first_start():
    ledger = GoodputLedger(first_started_at=100.0)
    # The recompute window reaches back before the first start; the restart is still under way at now.
    ledger.record_interruption(kind="hang", occurred_at=130.0, detected_at=140.0, resumed_at=400.0, recomputed_s=50.0)
    s = ledger.summary(now=200.0)
    assert s.wall_s == 100.0
    assert (s.recompute_s, s.detection_s, s.restart_s) == (30.0, 10.0, 60.0)
    # Before the fault occurs, none of it counts, not even the training it will waste.
    early = ledger.summary(now=120.0)
    assert (early.productive_s, early.recompute_s, early.interruptions) == (20.0, 0.0, {})
    assert s.productive_s == 0.0
    assert s.ettr == 0.0
    assert ledger.summary(now=50.0).wall_s == 0.0


def test_ledger_rejects_impossible_timelines():
    ledger = GoodputLedger(first_started_at=10.0)
    with pytest.raises(ValueError):
        ledger.record_interruption(kind="hang", occurred_at=20.0, detected_at=15.0, resumed_at=30.0)
    with pytest.raises(ValueError):
        ledger.record_interruption(kind="hang", occurred_at=5.0, detected_at=15.0, resumed_at=30.0)
    with pytest.raises(ValueError):
        ledger.record_interruption(kind="hang", occurred_at=20.0, detected_at=25.0, resumed_at=30.0, recomputed_s=-1)
    with pytest.raises(ValueError):
        ledger.record_pause(kind="preempted", start=40.0, end=30.0)
    with pytest.raises(ValueError):
        GoodputLedger(first_started_at=math.nan)


def test_to_dict_from_dict_round_trip_through_json():
    ledger = GoodputLedger(first_started_at=12.5)
    ledger.record_interruption(
        kind="slow_node", occurred_at=100.0, detected_at=101.5, resumed_at=140.0, recomputed_s=33.3, recomputed_steps=7
    )
    ledger.record_pause(kind="preempted", start=500.0, end=900.0)
    data = json.loads(json.dumps(ledger.to_dict()))
    again = GoodputLedger.from_dict(data)
    assert again == ledger
    assert again.summary(now=1000.0) == ledger.summary(now=1000.0)
    summary = json.loads(json.dumps(ledger.summary(now=1000.0).to_dict()))
    assert summary["ettr"] == pytest.approx(ledger.summary(now=1000.0).ettr)
    assert summary["interruptions"] == {"slow_node": 1}


def test_cluster_ettr_weights_by_wall_time():
    none = dict(detection_s=0.0, recompute_s=0.0, paused_s=0.0)
    long_job = GoodputSummary(wall_s=9000.0, productive_s=9000.0, restart_s=0.0, **none)
    short_job = GoodputSummary(wall_s=1000.0, productive_s=500.0, restart_s=500.0, **none)
    assert short_job.ettr == 0.5
    # (9000 + 500) / 10000, not the mean of 1.0 and 0.5.
    assert cluster_ettr([long_job, short_job]) == pytest.approx(0.95)
    assert cluster_ettr([]) == 1.0


def test_young_daly_interval():
    assert young_daly_interval_s(checkpoint_save_s=10.0, mtbf_s=3600.0) == pytest.approx(math.sqrt(72000.0))
    assert young_daly_interval_s(checkpoint_save_s=0.0, mtbf_s=3600.0) == 0.0
    assert young_daly_interval_s(checkpoint_save_s=5.0, mtbf_s=math.inf) == math.inf
    with pytest.raises(ValueError):
        young_daly_interval_s(checkpoint_save_s=5.0, mtbf_s=0.0)


def test_extrapolation_by_hand():
    # 24 failures in one day on 100 devices: 0.01 per device-hour; a 100-device job fails once an hour.
    e = extrapolate_ettr(
        devices=100,
        interruptions=24,
        period_days=1,
        reference_devices=100,
        detection_s=36.0,
        restart_s=72.0,
        checkpoint_interval_s=720.0,
        checkpoint_save_s=7.2,
    )
    assert e.failures_per_device_hour == pytest.approx(0.01)
    assert e.failures_per_hour == pytest.approx(1.0)
    assert e.mtbf_hours == pytest.approx(1.0)
    assert e.detection_fraction == pytest.approx(0.01)
    assert e.restart_fraction == pytest.approx(0.02)
    assert e.recompute_fraction == pytest.approx(0.1)  # 360 s lost per failure
    assert e.checkpoint_fraction == pytest.approx(0.01)
    assert e.ettr == pytest.approx(0.86)
    assert e.young_daly_interval_s == pytest.approx(math.sqrt(2 * 7.2 * 3600))
    assert json.loads(json.dumps(e.to_dict()))["ettr"] == pytest.approx(0.86)
    # Half the devices, half the failure rate.
    assert extrapolate_ettr(
        devices=50, interruptions=24, period_days=1, reference_devices=100,
        detection_s=36.0, restart_s=72.0, checkpoint_interval_s=720.0,
    ).mtbf_hours == pytest.approx(2.0)


def test_llama3_reference_gives_one_failure_about_every_three_hours():
    e = extrapolate_ettr(
        devices=LLAMA3_FAILURES["devices"],
        interruptions=LLAMA3_FAILURES["interruptions"],
        period_days=LLAMA3_FAILURES["period_days"],
        reference_devices=LLAMA3_FAILURES["devices"],
        detection_s=10.0,
        restart_s=60.0,
        checkpoint_interval_s=600.0,
    )
    assert e.mtbf_hours == pytest.approx(54 * 24 / 419)  # 3.09 h
    # A small job on the same hardware barely ever fails; no failures at all gives an ETTR of 1.
    small = extrapolate_ettr(devices=8, interruptions=419, period_days=54, reference_devices=16384,
                             detection_s=10.0, restart_s=60.0, checkpoint_interval_s=600.0)
    assert small.ettr > BAIGE_ETTR_TARGET and small.meets_baige_target
    none = extrapolate_ettr(devices=8, interruptions=0, period_days=54, reference_devices=16384,
                            detection_s=10.0, restart_s=60.0, checkpoint_interval_s=600.0)
    assert (none.ettr, none.mtbf_hours, none.to_dict()["mtbf_hours"]) == (1.0, math.inf, None)


def test_extrapolation_clamps_to_zero_and_validates():
    hopeless = extrapolate_ettr(devices=16384, interruptions=419, period_days=54, reference_devices=16384,
                                detection_s=3600.0, restart_s=7200.0, checkpoint_interval_s=36000.0)
    assert hopeless.lost_fraction > 1 and hopeless.ettr == 0.0
    with pytest.raises(ValueError):
        extrapolate_ettr(devices=0, interruptions=1, period_days=1, reference_devices=1,
                         detection_s=1, restart_s=1, checkpoint_interval_s=1)
    with pytest.raises(ValueError):
        extrapolate_ettr(devices=1, interruptions=1, period_days=1, reference_devices=1,
                         detection_s=1, restart_s=1, checkpoint_interval_s=0)


seconds = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(
    devices=st.integers(min_value=1, max_value=100_000),
    detection=seconds,
    faster_by=seconds,
    restart=seconds,
    interval=st.floats(min_value=1.0, max_value=36000.0),
    save=st.floats(min_value=0.0, max_value=600.0),
)
def test_faster_detection_never_lowers_ettr(devices, detection, faster_by, restart, interval, save):
    common = dict(devices=devices, interruptions=419, period_days=54, reference_devices=16384,
                  restart_s=restart, checkpoint_interval_s=interval, checkpoint_save_s=save)
    slow = extrapolate_ettr(detection_s=detection + faster_by, **common)
    fast = extrapolate_ettr(detection_s=detection, **common)
    assert fast.ettr >= slow.ettr
    bigger = extrapolate_ettr(**{**common, "devices": devices + 1}, detection_s=detection)
    assert bigger.ettr <= fast.ettr
    assert 0.0 <= fast.ettr <= 1.0


events = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=1000.0),  # occurred_at
        st.floats(min_value=0.0, max_value=50.0),  # detection
        st.floats(min_value=0.0, max_value=200.0),  # restart
        st.floats(min_value=0.0, max_value=500.0),  # recompute
    ),
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(events=events, pauses=st.lists(st.tuples(st.floats(0.0, 1000.0), st.floats(0.0, 300.0)), max_size=4),
       now=st.floats(0.0, 2000.0))
def test_ledger_parts_add_up_and_stay_in_bounds(events, pauses, now):
    ledger = GoodputLedger(first_started_at=0.0)
    for occurred, detect, restart, recompute in events:
        ledger.record_interruption(kind="x", occurred_at=occurred, detected_at=occurred + detect,
                                   resumed_at=occurred + detect + restart, recomputed_s=recompute)
    for start, length in pauses:
        ledger.record_pause(kind="p", start=start, end=start + length)
    s = ledger.summary(now=now)
    assert s.wall_s == now
    assert 0.0 <= s.productive_s <= s.wall_s
    assert s.productive_s + s.lost_s == pytest.approx(s.wall_s, abs=1e-6)
    assert 0.0 <= s.ettr <= 1.0
    # Lost time never shrinks as time passes (productive time can: a fault wastes the training before it),
    # and never exceeds the plain sum of the recorded parts.
    later = ledger.summary(now=now + 100.0)
    assert later.lost_s >= s.lost_s - 1e-6
    assert later.productive_s <= s.productive_s + 100.0 + 1e-6
    assert s.lost_s <= sum(d + r + c for _, d, r, c in events) + sum(length for _, length in pauses) + 1e-6


@settings(max_examples=100, deadline=None)
@given(events=events, pauses=st.lists(st.tuples(st.floats(0.0, 1000.0), st.floats(0.0, 300.0)), max_size=4),
       now=st.floats(0.0, 2000.0), data=st.data())
def test_ledger_summary_does_not_depend_on_recording_order(events, pauses, now, data):
    def build(evs, ps):
        ledger = GoodputLedger(first_started_at=0.0)
        for occurred, detect, restart, recompute in evs:
            ledger.record_interruption(kind="x", occurred_at=occurred, detected_at=occurred + detect,
                                       resumed_at=occurred + detect + restart, recomputed_s=recompute)
        for start, length in ps:
            ledger.record_pause(kind="p", start=start, end=start + length)
        return ledger.summary(now=now)

    a = build(events, pauses)
    b = build(data.draw(st.permutations(events)), data.draw(st.permutations(pauses)))
    for part in ("productive_s", "detection_s", "restart_s", "recompute_s", "paused_s"):
        assert getattr(a, part) == pytest.approx(getattr(b, part), abs=1e-6)
