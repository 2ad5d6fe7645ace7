"""Rank 0 saves the metric events of its last steps with each checkpoint and replays them when a run resumes from
it: a worker whose node dies before the supervisor polls it takes those metrics with it, while the run goes on
from the checkpoint it wrote after them (benchmarks/churn.py found steps 262-269 with no metric that way)."""

from __future__ import annotations

import math

from jobs.runtime import checkpoints
from jobs.runtime.worker import STEP_RECORD_FILE, TrainingWorker, read_step_record, step_record_bytes

TINY = {"context": 16, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32, "batch_size": 2}


def run_worker(tmp_path, *, steps: int, attempt: int) -> TrainingWorker:
    spec = {"trainer": "builtin", "hyperparameters": {**TINY, "steps": steps}, "checkpoint_dir": str(tmp_path),
            "checkpoint_interval_steps": 5, "checkpoint_keep_last": 2, "attempt": attempt}
    worker = TrainingWorker(spec, rank=0, world_size=1, node="n0")
    worker._run_builtin("127.0.0.1", 0)  # the training loop, in this thread; nobody polls it meanwhile
    return worker


def test_a_resumed_run_replays_the_metrics_its_checkpoint_carries(tmp_path):
    run_worker(tmp_path, steps=12, attempt=3)  # its events are never polled: as if its node died
    resumed = run_worker(tmp_path, steps=16, attempt=4)
    events = resumed.poll()["events"]
    metrics = [e for e in events if e["type"] == "metric"]
    replayed = [e for e in metrics if e.get("replayed")]
    assert [e["step"] for e in replayed] == list(range(12))
    assert {e["attempt"] for e in replayed} == {3} and all(e["rank"] == 0 for e in replayed)
    assert [e["step"] for e in metrics if not e.get("replayed")] == [12, 13, 14, 15]
    logs = [e["line"] for e in events if e["type"] == "log"]
    assert "rank 0: resumed from checkpoint step 11" in logs  # the step stays the line's last word (tests parse it)
    assert any("replaying the 12 step metric(s) recorded with checkpoint step 11" in line for line in logs)
    # the record carries over: the next checkpoint holds the replayed steps and the new ones
    _, files = checkpoints.load_latest(tmp_path)
    record = read_step_record(files)
    assert [e["step"] for e in record] == list(range(16))
    assert [e["attempt"] for e in record] == [3] * 12 + [4] * 4


def test_a_missing_or_damaged_record_replays_nothing():
    assert read_step_record({}) == []
    assert read_step_record({STEP_RECORD_FILE: b"\xff not json"}) == []
    assert read_step_record({STEP_RECORD_FILE: b'{"step": 1}'}) == []
    good = {"type": "metric", "rank": 0, "step": 4, "loss": float("nan")}
    kept = read_step_record({STEP_RECORD_FILE: step_record_bytes([good, {"type": "log"}, {"type": "metric"}])})
    assert len(kept) == 1 and kept[0]["step"] == 4 and math.isnan(kept[0]["loss"])
