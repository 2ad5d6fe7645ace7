"""benchmarks/scale.py's follow-on cycles: the state a cycle leaves, as the next cycle sees it."""

from __future__ import annotations

import random
from collections import defaultdict

from benchmarks.scale import build_snapshot, follow_on, main
from controlplane.scheduling.scheduler import schedule


def test_a_follow_on_snapshot_applies_the_decisions_and_tops_the_queue_up():
    snapshot = build_snapshot(1000, 400, seed=3)
    result = schedule(snapshot)
    assert result.admitted and result.preempted  # the generator makes both happen
    after = follow_on(snapshot, result, random.Random(0), cycle=0, pending=400, finish=0.1)

    ids = [r.workload.id for r in after.running] + [w.id for w in after.pending]
    assert len(ids) == len(set(ids))  # every workload once, running or pending
    assert len(after.pending) == 400
    running = {r.workload.id for r in after.running}
    pending = {w.id for w in after.pending}
    assert {p.workload_id for p in result.preempted} <= pending  # victims go back to the queue
    started = {a.workload_id for a in result.admitted} | {w.workload_id for w in result.waiting if w.held}
    before = len(snapshot.running) - len(result.preempted) + len(started)
    assert len(after.running) == before - int(before * 0.1)  # 10% finished
    assert not started & pending
    still = started & running
    assert len(still) > len(started) * 0.8  # (some of them finished)
    shares = defaultdict(float)
    for r in after.running:
        for worker in r.workers:
            for index, share in worker.taken:
                shares[(worker.node, index)] += share
    assert max(shares.values()) <= 1.0 + 1e-9  # no device given twice
    shrunk = {s.workload_id: len(s.released) for s in result.shrunk}
    widths = {r.workload.id: len(r.workers) for r in snapshot.running}
    for r in after.running:
        if r.workload.id in shrunk:
            assert len(r.workers) == widths[r.workload.id] - shrunk[r.workload.id]
    schedule(after)  # and the core takes it


def test_a_steady_snapshot_takes_as_many_arrivals_as_workloads_finished():
    snapshot = build_snapshot(1000, 400, seed=3)
    result = schedule(snapshot)
    after = follow_on(snapshot, result, random.Random(0), cycle=0, pending=400, finish=0.1, steady=True)
    started = {a.workload_id for a in result.admitted} | {w.workload_id for w in result.waiting if w.held}
    before = len(snapshot.running) - len(result.preempted) + len(started)
    finished = int(before * 0.1)
    assert len(after.running) == before - finished
    arrivals = [w for w in after.pending if w.id.startswith("c0-")]
    left = len(snapshot.pending) - len(started) + len(result.preempted)  # waiting before the arrivals
    assert len(arrivals) == min(finished, 400 - left) and len(after.pending) == left + len(arrivals)
    assert len(after.pending) < 400  # not topped up: the first cycle admitted more than finished


def test_the_benchmark_reports_first_follow_on_and_steady_cycles(tmp_path, capsys):
    assert main(["--sizes", "1000", "--pending", "300", "--cycles", "2", "--follow-on", "2", "--steady", "3",
                 "--out", str(tmp_path / "scale")]) == 0
    out = capsys.readouterr().out
    assert "first cycles" in out and "follow-on cycles" in out and "steady cycles" in out
    assert "target: p99 < 100 ms" in out and "steady p99" in out
    import json

    row = json.loads((tmp_path / "scale.json").read_text())["results"][0]
    assert row["follow_cycles"] == 2 and len(row["follow_times_ms"]) == 2 and row["follow_p99_ms"] > 0
    assert row["steady_cycles"] == 3 and len(row["steady_times_ms"]) == 3 and row["steady_p99_ms"] > 0
    assert len(row["steady_admitted"]) == 3 and row["steady_pending_at_end"] <= 300
