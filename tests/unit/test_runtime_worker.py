"""Pieces of the training worker that run without Ray: the asynchronous checkpoint writer and the
progress lines of user entrypoints."""

from __future__ import annotations

import threading

from jobs.runtime import checkpoints
from jobs.runtime.worker import AsyncCheckpointWriter, parse_progress_line


def test_async_writer_reports_a_checkpoint_only_once_it_is_complete(tmp_path, monkeypatch):
    events: list[dict] = []
    gate = threading.Event()
    real_save = checkpoints.save_checkpoint

    def slow_save(root, **kwargs):
        gate.wait(5)
        return real_save(root, **kwargs)

    monkeypatch.setattr(checkpoints, "save_checkpoint", slow_save)
    writer = AsyncCheckpointWriter(tmp_path, keep_last=2, emit=events.append)
    writer.submit(step=9, files={"model.pt": b"a" * 100}, metadata={}, requested=False, blocked_s=0.01)
    assert events == [] and checkpoints.list_checkpoints(tmp_path) == []  # training goes on meanwhile
    gate.set()
    writer.wait()
    [event] = events
    assert (event["type"], event["step"], event["size_bytes"]) == ("checkpoint", 9, 100)
    assert event["blocked_s"] >= 0.01 and [c.step for c in checkpoints.list_checkpoints(tmp_path)] == [9]
    for step in (19, 29, 39):  # one write at a time, retention applied
        writer.submit(step=step, files={"model.pt": b"b"}, metadata={}, requested=step == 39, blocked_s=0.0)
    writer.wait()
    assert [e["step"] for e in events] == [9, 19, 29, 39] and events[-1]["requested"]
    assert [c.step for c in checkpoints.list_checkpoints(tmp_path)] == [29, 39]


def test_a_failed_write_is_reported_and_training_goes_on(tmp_path, monkeypatch):
    events: list[dict] = []

    def broken(root, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoints, "save_checkpoint", broken)
    writer = AsyncCheckpointWriter(tmp_path, keep_last=2, emit=events.append)
    writer.submit(step=5, files={"model.pt": b"x"}, metadata={}, requested=False, blocked_s=0.0)
    writer.wait()
    assert [e["type"] for e in events] == ["log"] and "disk full" in events[0]["line"]


def test_progress_lines_of_user_entrypoints():
    assert parse_progress_line("fleetyard: step=12 loss=3.5") == {"step": 12.0, "loss": 3.5}
    assert parse_progress_line("FLEETYARD: step=3") == {"step": 3.0}
    assert parse_progress_line("fleetyard: step=x loss=2") == {"loss": 2.0}
    assert parse_progress_line("step=12 loss=3.5") == {}


def test_an_entrypoint_step_time_is_per_step_or_what_the_program_reported():
    from jobs.runtime.worker import entrypoint_step_time

    assert parse_progress_line("fleetyard: step=20 step_time=0.25") == {"step": 20.0, "step_time": 0.25}
    assert entrypoint_step_time({"step": 20.0}, 5.0, 10) == 0.5  # printed every 10th step
    assert entrypoint_step_time({"step": 20.0}, 5.0, 0) == 5.0  # a repeated step number counts as one
    assert entrypoint_step_time({"step": 20.0, "step_time": 0.25}, 5.0, 10) == 0.25
    assert entrypoint_step_time({"step": 20.0, "step_time": float("nan")}, 5.0, 10) == 0.5
    assert entrypoint_step_time({"step": 20.0, "step_time": -1.0}, 5.0, 1) == 5.0


def test_an_entrypoint_printing_bytes_that_are_not_utf8_keeps_running(tmp_path):
    """Its output was decoded strictly: the first line holding such a byte raised UnicodeDecodeError in the worker's
    training thread, a worker crash on every restart until the job failed (QA). They read as U+FFFD now."""
    from jobs.runtime.worker import TrainingWorker

    worker = TrainingWorker({"trainer": "entrypoint", "checkpoint_dir": str(tmp_path / "ckpt"),
                             "entrypoint": "printf 'ok\\n\\377\\376 bar\\n'; echo 'fleetyard: step=1 loss=2.5'"},
                            rank=0, world_size=1, node="n1")
    worker._run_entrypoint("127.0.0.1", 1)
    state = worker.poll()
    assert state["done"] and state["step"] == 1 and state["loss"] == 2.5
    assert [e["line"] for e in state["events"] if e["type"] == "log"] == [
        "ok", "\ufffd\ufffd bar", "fleetyard: step=1 loss=2.5"]
