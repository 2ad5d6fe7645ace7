"""Atomic checkpoints (jobs/runtime/checkpoints.py): round trip, crashes mid-save, corruption, retention, races."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import random
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.runtime import checkpoints
from jobs.runtime.checkpoints import (
    CheckpointCorrupt,
    CheckpointError,
    CheckpointInfo,
    apply_retention,
    clean_partial,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    load_latest,
    save_checkpoint,
)


def payload(step: int, size: int = 20_000) -> dict[str, bytes]:
    """Deterministic content for a step; the sizes differ per step so a mix-up shows."""
    rng = random.Random(step)
    return {"model.bin": rng.randbytes(size + 7 * step), "optim.bin": rng.randbytes(1000 + step), "tiny.txt": b"x"}


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-")) if root.exists() else []


def flip_byte(path: Path, offset: int = 100) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


# --- basics ----------------------------------------------------------------------------------------------------------


def test_round_trip(tmp_path):
    root = tmp_path / "ckpt"
    files = payload(7)
    info = save_checkpoint(root, step=7, files=files, metadata={"loss": 1.25, "epoch": 2, "tags": ["a"]})

    assert info.step == 7
    assert info.name == "step-0000000007"
    assert info.path == root / "step-0000000007"
    assert info.size_bytes == sum(len(b) for b in files.values())
    assert info.files == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    assert info.metadata == {"loss": 1.25, "epoch": 2, "tags": ["a"]}

    assert list_checkpoints(root) == [info]
    assert latest_checkpoint(root) == info
    for source in (info, info.path, str(info.path)):
        loaded_info, data = load_checkpoint(source)
        assert loaded_info == info
        assert data == files
    assert load_latest(root) == (info, files)
    assert leftovers(root) == []


def test_accepts_bytearray_and_memoryview_and_empty_files(tmp_path):
    info = save_checkpoint(tmp_path, step=0, files={"a": bytearray(b"abc"), "b": memoryview(b"defg"), "empty": b""})
    assert load_checkpoint(info)[1] == {"a": b"abc", "b": b"defg", "empty": b""}
    assert info.size_bytes == 7


def test_manifest_contents(tmp_path):
    before = time.time()
    info = save_checkpoint(tmp_path, step=12, files={"w.bin": b"hello", "b.bin": b""}, metadata={"lr": 0.1})
    after = time.time()

    manifest = json.loads((info.path / "manifest.json").read_text())
    assert manifest["format"] == checkpoints.FORMAT_VERSION
    assert manifest["step"] == 12
    assert before <= manifest["created_at"] <= after
    assert manifest["created_at"] == info.created_at
    assert manifest["files"] == {
        "w.bin": {"sha256": hashlib.sha256(b"hello").hexdigest(), "size": 5},
        "b.bin": {"sha256": hashlib.sha256(b"").hexdigest(), "size": 0},
    }
    assert manifest["metadata"] == {"lr": 0.1}
    assert sorted(p.name for p in info.path.iterdir()) == ["b.bin", "manifest.json", "w.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000000012"]


def test_save_is_idempotent(tmp_path):
    first = save_checkpoint(tmp_path, step=3, files=payload(3), metadata={"try": 1})
    again = save_checkpoint(tmp_path, step=3, files=payload(99), metadata={"try": 2})

    assert again == first
    assert load_checkpoint(first)[1] == payload(3)
    assert [p.name for p in tmp_path.iterdir()] == ["step-0000000003"]


def test_resave_replaces_a_corrupt_checkpoint_of_that_step(tmp_path, caplog):
    first = save_checkpoint(tmp_path, step=3, files=payload(3))
    flip_byte(first.path / "model.bin")

    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        second = save_checkpoint(tmp_path, step=3, files=payload(3))

    assert "corrupt" in caplog.text
    assert load_checkpoint(second)[1] == payload(3)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "nul\x00", "manifest.json", "MANIFEST.json", "x" * 256, 5],
)
def test_bad_file_names_are_rejected(tmp_path, name):
    root = tmp_path / "ckpt"
    with pytest.raises(ValueError):
        save_checkpoint(root, step=1, files={"ok.bin": b"1", name: b"2"})
    assert not root.exists()  # validation happens before anything is written


def test_bad_steps_and_contents_are_rejected(tmp_path):
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path, step=-1, files={"a": b""})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, step=True, files={"a": b""})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, step=1.0, files={"a": b""})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, step=1, files={"a": "text, not bytes"})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, step=1, files={"a": b""}, metadata={"f": object()})
    assert list(tmp_path.iterdir()) == []


def test_a_missing_root_is_empty(tmp_path):
    root = tmp_path / "never-created"
    assert list_checkpoints(root) == []
    assert latest_checkpoint(root) is None
    assert load_latest(root) is None
    assert clean_partial(root) == 0
    assert apply_retention(root, keep_last=1) == []
    assert not root.exists()


def test_large_steps_sort_numerically(tmp_path):
    for step in (10_000_000_000, 9, 100):
        save_checkpoint(tmp_path, step=step, files={"a": str(step).encode()})
    assert [c.step for c in list_checkpoints(tmp_path)] == [9, 100, 10_000_000_000]
    assert latest_checkpoint(tmp_path).name == "step-10000000000"


# --- crashes mid-save ------------------------------------------------------------------------------------------------


def _failing_rename(*args, **kwargs):
    raise OSError("simulated crash at publish")


def _manifest_write_fails(real):
    def write(path, data):
        if path.name == "manifest.json":
            real(path, data[: len(data) // 2])  # half a manifest reaches the disk, then the "crash"
            raise OSError("simulated crash while writing the manifest")
        real(path, data)

    return write


@pytest.mark.parametrize("crash", ["rename", "manifest"])
def test_a_failed_save_publishes_nothing_and_cleans_up(tmp_path, monkeypatch, crash):
    good = save_checkpoint(tmp_path, step=1, files=payload(1))
    if crash == "rename":
        monkeypatch.setattr(checkpoints.os, "rename", _failing_rename)
    else:
        monkeypatch.setattr(checkpoints, "_write_file", _manifest_write_fails(checkpoints._write_file))

    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, step=2, files=payload(2))

    monkeypatch.undo()
    assert not (tmp_path / "step-0000000002").exists()
    assert leftovers(tmp_path) == []
    assert list_checkpoints(tmp_path) == [good]
    assert load_latest(tmp_path)[0] == good
    # The retry succeeds.
    assert save_checkpoint(tmp_path, step=2, files=payload(2)).step == 2


@pytest.mark.parametrize("crash", ["rename", "manifest"])
def test_leftovers_of_a_hard_crash_are_ignored_then_cleaned(tmp_path, monkeypatch, crash):
    good = save_checkpoint(tmp_path, step=1, files=payload(1))
    monkeypatch.setattr(checkpoints, "_discard", lambda path: None)  # the process "died": no clean-up ran
    if crash == "rename":  # everything including the manifest is on disk, only the publishing rename is missing
        monkeypatch.setattr(checkpoints.os, "rename", _failing_rename)
    else:
        monkeypatch.setattr(checkpoints, "_write_file", _manifest_write_fails(checkpoints._write_file))
    with pytest.raises(OSError, match="simulated crash"):
        save_checkpoint(tmp_path, step=2, files=payload(2))
    monkeypatch.undo()

    (leftover,) = leftovers(tmp_path)
    assert leftover.startswith(".tmp-step-0000000002-")
    assert list_checkpoints(tmp_path) == [good]
    assert latest_checkpoint(tmp_path) == good
    assert load_latest(tmp_path)[0] == good
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / leftover)  # never load an unpublished directory, even a complete one

    assert clean_partial(tmp_path, older_than_s=3600) == 0  # too fresh: could be a save in progress
    old = time.time() - 7200
    for path in [tmp_path / leftover, *(tmp_path / leftover).iterdir()]:
        os.utime(path, (old, old))
    assert clean_partial(tmp_path, older_than_s=3600) == 1
    assert leftovers(tmp_path) == []
    assert list_checkpoints(tmp_path) == [good]
    assert clean_partial(tmp_path) == 0


def test_clean_partial_racing_a_save_never_publishes_a_half_deleted_checkpoint(tmp_path, monkeypatch):
    real = checkpoints._write_file

    def write_then_clean(path, data):
        real(path, data)
        if path.name == "manifest.json":
            assert clean_partial(tmp_path) == 1  # claims and deletes the save's temporary directory

    monkeypatch.setattr(checkpoints, "_write_file", write_then_clean)
    with pytest.raises((CheckpointError, OSError)):
        save_checkpoint(tmp_path, step=5, files=payload(5))
    assert list(tmp_path.iterdir()) == []


def test_a_concurrent_save_of_the_same_step_returns_the_winner(tmp_path, monkeypatch):
    real_rename = os.rename
    winner = {}

    def rename_after_someone_else(src, dst):
        if not winner:
            winner["info"] = None  # the nested save below renames too
            winner["info"] = save_checkpoint(tmp_path, step=4, files=payload(40))
        return real_rename(src, dst)

    monkeypatch.setattr(checkpoints.os, "rename", rename_after_someone_else)
    info = save_checkpoint(tmp_path, step=4, files=payload(4))
    monkeypatch.undo()
    assert info == winner["info"]
    assert load_checkpoint(info)[1] == payload(40)
    assert [p.name for p in tmp_path.iterdir()] == ["step-0000000004"]


# --- corruption ------------------------------------------------------------------------------------------------------


def test_a_flipped_byte_is_detected_and_load_latest_falls_back(tmp_path, caplog):
    older = save_checkpoint(tmp_path, step=1, files=payload(1))
    newer = save_checkpoint(tmp_path, step=2, files=payload(2))
    flip_byte(newer.path / "optim.bin")

    assert list_checkpoints(tmp_path) == [older, newer]  # same sizes: complete, only hashes tell
    with pytest.raises(CheckpointCorrupt, match="optim.bin") as exc_info:
        load_checkpoint(newer)
    assert exc_info.value.file == "optim.bin"
    assert load_checkpoint(newer, verify=False)[1]["model.bin"] == payload(2)["model.bin"]

    with caplog.at_level(logging.WARNING, logger=checkpoints.__name__):
        info, data = load_latest(tmp_path)
    assert info == older
    assert data == payload(1)
    assert "step-0000000002" in caplog.text and "optim.bin" in caplog.text

    flip_byte(older.path / "model.bin")
    assert load_latest(tmp_path) is None


def test_a_truncated_file_is_not_listed(tmp_path):
    older = save_checkpoint(tmp_path, step=1, files=payload(1))
    newer = save_checkpoint(tmp_path, step=2, files=payload(2))
    model = newer.path / "model.bin"
    model.write_bytes(model.read_bytes()[:-1])

    assert list_checkpoints(tmp_path) == [older]
    assert latest_checkpoint(tmp_path) == older
    assert load_latest(tmp_path)[0] == older
    for verify in (True, False):
        with pytest.raises(CheckpointCorrupt, match="model.bin"):
            load_checkpoint(newer, verify=verify)


def test_broken_directories_and_stray_files_are_ignored(tmp_path):
    good = save_checkpoint(tmp_path, step=1, files=payload(1))
    for step in (2, 3, 4, 5, 6):
        save_checkpoint(tmp_path, step=step, files=payload(step))
    (tmp_path / "step-0000000002" / "manifest.json").unlink()  # no manifest
    (tmp_path / "step-0000000003" / "manifest.json").write_text("{not json")  # garbage manifest
    (tmp_path / "step-0000000004" / "optim.bin").unlink()  # a listed file is missing
    manifest = json.loads((tmp_path / "step-0000000005" / "manifest.json").read_text())
    manifest["step"] = 50  # manifest disagrees with the directory name
    (tmp_path / "step-0000000005" / "manifest.json").write_text(json.dumps(manifest))
    manifest["step"], manifest["format"] = 6, 999  # a format from the future
    (tmp_path / "step-0000000006" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "step-0000000007").write_text("a stray file")
    (tmp_path / "step-8").mkdir()  # not a canonical name
    (tmp_path / "step-0000000009").mkdir()  # empty
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / ".tmp-step-0000000010-abc").mkdir()

    assert list_checkpoints(tmp_path) == [good]
    assert load_latest(tmp_path)[0] == good
    for step in (2, 3, 4, 5):
        with pytest.raises(CheckpointCorrupt):
            load_checkpoint(tmp_path / f"step-{step:010d}")
    with pytest.raises(CheckpointError, match="format"):
        load_checkpoint(tmp_path / "step-0000000006")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "step-0000000099")
    # Retention neither counts nor deletes broken directories.
    assert apply_retention(tmp_path, keep_last=1) == []
    assert (tmp_path / "step-0000000002").exists()


def test_a_manifest_naming_a_path_outside_the_checkpoint_is_corrupt(tmp_path):
    info = save_checkpoint(tmp_path, step=1, files={"a": b"1"})
    (tmp_path / "secret").write_bytes(b"1")
    manifest = json.loads((info.path / "manifest.json").read_text())
    manifest["files"]["../secret"] = manifest["files"].pop("a")
    (info.path / "manifest.json").write_text(json.dumps(manifest))
    assert list_checkpoints(tmp_path) == []
    with pytest.raises(CheckpointCorrupt):
        load_checkpoint(info)


# --- retention -------------------------------------------------------------------------------------------------------


def test_retention_keeps_the_newest_and_the_pinned(tmp_path):
    for step in range(6):
        save_checkpoint(tmp_path, step=step * 10, files=payload(step))

    assert apply_retention(tmp_path, keep_last=2, keep_steps={10}) == [0, 20, 30]
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 40, 50]
    assert apply_retention(tmp_path, keep_last=2, keep_steps={10}) == []
    assert apply_retention(tmp_path, keep_last=1) == [10, 40]
    assert [p.name for p in tmp_path.iterdir()] == ["step-0000000050"]
    assert apply_retention(tmp_path, keep_last=5) == []
    with pytest.raises(ValueError):
        apply_retention(tmp_path, keep_last=0)


def test_retention_renames_before_deleting(tmp_path, monkeypatch):
    for step in range(3):
        save_checkpoint(tmp_path, step=step, files=payload(step))
    seen = []

    def rmtree(path, ignore_errors=False):
        seen.append(Path(path).name)
        assert not (tmp_path / "step-0000000000").exists()  # the published name is already gone
        if not ignore_errors:
            raise OSError("disk trouble")

    monkeypatch.setattr(checkpoints.shutil, "rmtree", rmtree)
    assert apply_retention(tmp_path, keep_last=2) == [0]
    monkeypatch.undo()
    assert seen and seen[0].startswith(".tmp-deleting-step-0000000000-")
    # The interrupted deletion is invisible to readers and finished by clean_partial.
    assert [c.step for c in list_checkpoints(tmp_path)] == [1, 2]
    assert clean_partial(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-0000000001", "step-0000000002"]


# --- races and killed writers ----------------------------------------------------------------------------------------


def test_a_reader_never_sees_a_partial_checkpoint_while_writing_and_retention_run(tmp_path):
    stop = threading.Event()
    problems: list[str] = []
    counts = {"saved": 0, "loaded": 0, "vanished": 0}

    def writer():
        step = 0
        try:
            while not stop.is_set():
                save_checkpoint(tmp_path, step=step, files=payload(step, size=200_000), metadata={"step": step})
                apply_retention(tmp_path, keep_last=2)
                counts["saved"] += 1
                step += 1
        except Exception as exc:
            problems.append(f"writer: {exc!r}")

    def reader():
        while not stop.is_set():
            found = list_checkpoints(tmp_path)
            if [c.step for c in found] != sorted({c.step for c in found}):
                problems.append(f"unsorted listing {[c.step for c in found]}")
            for info in found:
                try:
                    loaded, data = load_checkpoint(info)
                except CheckpointCorrupt as exc:
                    problems.append(f"corrupt: {exc}")
                    continue
                except CheckpointError:
                    counts["vanished"] += 1  # deleted by retention after it was listed: fine
                    continue
                if data != payload(info.step, size=200_000) or loaded.metadata != {"step": info.step}:
                    problems.append(f"wrong content for step {info.step}")
                counts["loaded"] += 1
            latest = load_latest(tmp_path)
            if latest is not None and latest[1] != payload(latest[0].step, size=200_000):
                problems.append(f"wrong latest content for step {latest[0].step}")

    threads = [threading.Thread(target=writer), threading.Thread(target=reader), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)

    assert problems == []
    assert counts["saved"] >= 3 and counts["loaded"] >= 3, counts
    assert len(list_checkpoints(tmp_path)) == 2
    assert leftovers(tmp_path) == []


def _mp_context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _save_until_exit_inside_a_file(root: str, die_at_step: int) -> None:
    """Child: save steps 0, 1, ... and os._exit half-way through writing model.bin of `die_at_step`."""
    real = checkpoints._write_file

    def dying_write(path, data):
        if path.parent.name.startswith(f".tmp-step-{die_at_step:010d}-") and path.name == "model.bin":
            with open(path, "xb") as f:
                f.write(data[: len(data) // 2])
                f.flush()
                os.fsync(f.fileno())
            os._exit(17)
        real(path, data)

    checkpoints._write_file = dying_write
    for step in range(die_at_step + 5):
        save_checkpoint(root, step=step, files=payload(step))
    os._exit(0)


def _save_slowly_forever(root: str) -> None:
    """Child: save ever newer checkpoints with slow, chunked writes and apply retention, until killed."""

    def slow_write(path, data):
        with open(path, "xb") as f:
            for offset in range(0, len(data), 4096):
                f.write(data[offset : offset + 4096])
                time.sleep(0.0002)
            f.flush()
            os.fsync(f.fileno())

    checkpoints._write_file = slow_write
    step = 0
    while True:
        save_checkpoint(root, step=step, files=payload(step))
        apply_retention(root, keep_last=3)
        step += 1


def test_a_writer_that_exits_mid_file_leaves_only_complete_checkpoints(tmp_path):
    proc = _mp_context().Process(target=_save_until_exit_inside_a_file, args=(str(tmp_path), 3))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 17

    assert [c.step for c in list_checkpoints(tmp_path)] == [0, 1, 2]
    for info in list_checkpoints(tmp_path):
        assert load_checkpoint(info)[1] == payload(info.step)
    assert load_latest(tmp_path)[0].step == 2
    (leftover,) = leftovers(tmp_path)
    assert leftover.startswith(".tmp-step-0000000003-")
    assert not (tmp_path / leftover / "manifest.json").exists()

    assert clean_partial(tmp_path) == 1
    assert leftovers(tmp_path) == []
    assert save_checkpoint(tmp_path, step=3, files=payload(3)) == latest_checkpoint(tmp_path)


def test_a_writer_killed_at_random_moments_leaves_only_complete_checkpoints(tmp_path):
    rng = random.Random(20240611)
    ctx = _mp_context()
    for round_ in range(4):
        root = tmp_path / f"round-{round_}"
        proc = ctx.Process(target=_save_slowly_forever, args=(str(root),))
        proc.start()
        deadline = time.monotonic() + 30
        while len(list_checkpoints(root)) < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=30)
        assert proc.exitcode == -signal.SIGKILL

        found = list_checkpoints(root)
        assert 1 <= len(found) <= 4  # retention keeps 3; a 4th may have been published just before the kill
        steps = [c.step for c in found]
        assert steps == list(range(steps[0], steps[0] + len(steps)))
        for info in found:
            assert load_checkpoint(info)[1] == payload(info.step)
        assert load_latest(root)[0] == found[-1]

        clean_partial(root)
        assert leftovers(root) == []
        assert list_checkpoints(root) == found
        nxt = steps[-1] + 1
        assert save_checkpoint(root, step=nxt, files=payload(nxt)).step == nxt


# --- properties ------------------------------------------------------------------------------------------------------

_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x00"), min_size=1, max_size=40
).filter(lambda n: n not in (".", "..") and n.casefold() != "manifest.json")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    files=st.dictionaries(_names, st.binary(max_size=300), max_size=5),
    step=st.integers(min_value=0, max_value=10**12),
    metadata=st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10) | st.booleans(), max_size=3),
)
def test_any_valid_checkpoint_round_trips(files, step, metadata):
    with tempfile.TemporaryDirectory() as tmp:
        info = save_checkpoint(tmp, step=step, files=files, metadata=metadata)
        assert list_checkpoints(tmp) == [info]
        assert isinstance(info, CheckpointInfo)
        loaded, data = load_checkpoint(info)
        assert loaded == info
        assert data == files
        assert info.metadata == metadata
        assert sorted(os.listdir(tmp)) == [info.name]
