"""benchmarks/platform_cycle.py: the scale benchmark's cluster written as platform rows, and the cycle timed."""

from __future__ import annotations

import pytest

from benchmarks.platform_cycle import measure_cycles, populate, summarize, table
from benchmarks.scale import build_snapshot


@pytest.mark.django_db(transaction=True)
def test_the_platform_cycle_runs_on_the_scale_benchmarks_cluster_and_reports_its_phases():
    from controlplane.cluster.models import Node
    from jobs.models import TrainingJob

    snapshot = build_snapshot(400, 120, seed=1)
    written = populate(snapshot)
    assert written["nodes"] == Node.objects.count() == len(snapshot.nodes)
    assert written["running"] == TrainingJob.objects.filter(state="RUNNING").count() > 0
    assert written["pending"] == TrainingJob.objects.filter(state="QUEUED").count() > 0
    rows = measure_cycles(2, seed=1)
    assert [r["cycle"] for r in rows] == [0, 1]
    first = rows[0]
    assert first["admitted"] > 0 and first["queries"] > 0
    assert abs(first["load_ms"] + first["core_ms"] + first["apply_ms"] - first["total_ms"]) < 1.0
    assert TrainingJob.objects.filter(state="ADMITTED").exists()  # the decisions were applied
    summary = summarize(400, written, rows)
    assert summary["first_admitted"] == first["admitted"] and summary["cycles"] == 2
    assert "first ms" in table([summary])
