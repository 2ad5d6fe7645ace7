"""The node churner of benchmarks/churn.py (issue 8, R1): kill cadence, overlapping kills, restarts."""

from __future__ import annotations

import random

import pytest

from benchmarks import churn


class FakeCluster:
    def __init__(self) -> None:
        self.killed: list[str] = []
        self.restarted: list[str] = []

    def kill_node(self, name: str) -> None:
        self.killed.append(name)

    def restart_node(self, name: str, wait: bool = True) -> None:
        self.restarted.append(name)


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(churn.time, "monotonic", lambda: now[0])
    return now


def drive(churner: churn.Churner, clock, *, seconds: float, back_after: float, step: float = 0.25) -> None:
    """Tick for `seconds`; a restarted node is reported alive (a new incarnation) `back_after` s after its kill."""
    end = clock[0] + seconds
    while clock[0] < end:
        alive = {node: f"{node}-0" for node in churner.nodes}  # each node's live incarnation, if any
        for index, record in enumerate(churner.records):
            if record.restarted_at is not None and clock[0] - record.killed_at >= back_after:
                alive[record.node] = f"{record.node}-{index + 1}"
            else:
                alive.pop(record.node, None)
        churner.tick(alive, churning=True)
        clock[0] += step


def test_with_several_away_the_kills_keep_a_5_to_10_s_cadence(clock):
    cluster = FakeCluster()
    churner = churn.Churner(cluster, ["a", "b", "c", "d"], rng=random.Random(1), max_down=3, log=lambda _: None)
    drive(churner, clock, seconds=120, back_after=16.0)
    summary = churner.summary()
    assert summary["kills"] >= 12 and summary["kill_gap_s_max"] <= 10.5 and summary["kill_gap_s_mean"] >= 5.0
    assert 2 <= summary["most_away_at_once"] <= 3
    assert not summary["errors"]
    # Never a node killed while it is still away; every node killed is restarted.
    for index, record in enumerate(churner.records):
        earlier = [r for r in churner.records[:index] if r.node == record.node]
        assert all(r.back_at is not None and r.back_at <= record.killed_at for r in earlier)
    assert len(cluster.restarted) >= len(cluster.killed) - 3


def test_with_one_away_the_next_kill_waits_for_the_node_to_return(clock):
    churner = churn.Churner(FakeCluster(), ["a", "b", "c"], rng=random.Random(1), max_down=1, log=lambda _: None)
    drive(churner, clock, seconds=120, back_after=16.0)
    summary = churner.summary()
    assert summary["most_away_at_once"] == 1 and summary["kill_gap_s_mean"] >= 16.0
    assert churner.postponed > 0


def test_most_away_at_once_counts_overlaps():
    records = [churn.ChurnRecord("a", 0.0, back_at=10.0), churn.ChurnRecord("b", 5.0, back_at=12.0),
               churn.ChurnRecord("c", 11.0, back_at=20.0), churn.ChurnRecord("d", 12.0)]
    assert churn._most_at_once(records) == 2
    assert churn._most_at_once([]) == 0
