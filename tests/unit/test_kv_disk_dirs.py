"""The KV cache's disk-tier folders (`fy-kv-*` in the temp directory): a replica that stops removes its own; one
that crashed or was killed left its folder in /tmp for good (QA), so the next one made sweeps the folders whose
owner process (owner.pid) is gone, and never a live owner's. Real processes and pids throughout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from inference.runtime import kv_cache
from inference.runtime.kv_cache import (
    OWNER_FILE,
    UNOWNED_MAX_IDLE_S,
    TieredPrefixCache,
    make_disk_dir,
    sweep_orphan_disk_dirs,
)
from jobs.runtime.lm import write_random_model_dir

ROOT = Path(__file__).resolve().parents[2]
SHAPE = {"context": 64, "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
ENGINE = {"slots": 1, "block_size": 4, "device_cache_blocks": 4, "host_cache_blocks": 0, "disk_cache_blocks": 8}


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    """The temp directory, here and in child processes, is this test's own folder."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("TMPDIR", str(root))
    return root


def _kv_dirs(root: Path) -> set[Path]:
    return {path for path in root.iterdir() if path.name.startswith("fy-kv-")}


def _crash_after(code: str, root: Path) -> Path:
    """Runs `code` (which prints a folder's path) in a child process that then dies of SIGKILL, as a replica killed
    by the OOM killer or a lost node does: nothing of its own cleans up. Returns the folder it left."""
    script = f"{code}\nimport os, signal, sys\nsys.stdout.flush()\nos.kill(os.getpid(), signal.SIGKILL)\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TMPDIR": str(root)})
    assert result.returncode == -signal.SIGKILL, result.stderr
    left = Path(result.stdout.strip().splitlines()[-1])
    assert left.is_dir() and left.parent == root
    return left


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _owned_by(root: Path, name: str, pid: int, **identity: str) -> Path:
    path = root / name
    path.mkdir()
    me = {**kv_cache._process_identity(os.getpid()), "start": "", **identity}
    (path / OWNER_FILE).write_text(f"{pid}\n" + "".join(f"{k}={v}\n" for k, v in me.items()))
    (path / "1.kv").write_bytes(b"kv")
    return path


def test_a_killed_caches_folder_is_swept_when_the_next_cache_starts(tmp_root):
    left = _crash_after("from inference.runtime.kv_cache import TieredPrefixCache\n"
                        "cache = TieredPrefixCache(block_size=4, device_blocks=1, disk_blocks=4)\n"
                        "print(cache.disk_dir)", tmp_root)
    cache = TieredPrefixCache(block_size=4, device_blocks=1, disk_blocks=4)
    try:
        assert not left.exists()  # before: every killed replica's folder stayed in /tmp
        assert _kv_dirs(tmp_root) == {cache.disk_dir}
        assert (cache.disk_dir / OWNER_FILE).read_text().splitlines()[0] == str(os.getpid())
    finally:
        cache.close()
    assert not _kv_dirs(tmp_root)  # a cache that stops removes its own


def test_a_killed_replicas_folder_is_swept_by_the_next_replica_and_a_stopped_one_removes_its_own(tmp_root, tmp_path):
    model_dir = write_random_model_dir(tmp_path / "model", SHAPE)
    left = _crash_after("from inference.runtime.serve_app import LLMReplica\n"
                        f"replica = LLMReplica({str(model_dir)!r}, {ENGINE!r}, 1)\n"
                        "print(replica._cache_dir)", tmp_root)
    assert left.name.startswith("fy-kv-local-")

    from inference.runtime.serve_app import LLMReplica

    replica = LLMReplica(str(model_dir), ENGINE, 1)
    try:
        assert not left.exists()
        assert _kv_dirs(tmp_root) == {Path(replica._cache_dir)}
    finally:
        replica.__del__()  # what Ray Serve calls when it stops a replica
    assert not _kv_dirs(tmp_root)


def test_a_replica_without_a_disk_tier_makes_no_disk_folder(tmp_root, tmp_path):
    """QA: every replica made an `fy-kv-*` folder (with its owner.pid), also when its deployment has no disk tier
    (disk_cache_blocks 0) and nothing would ever be written there."""
    from inference.runtime.serve_app import LLMReplica

    model_dir = write_random_model_dir(tmp_path / "model", SHAPE)
    replica = LLMReplica(str(model_dir), {**ENGINE, "disk_cache_blocks": 0}, 1)
    try:
        assert not _kv_dirs(tmp_root) and replica._cache_dir is None
        assert replica.engine.cache.disk_dir is None
    finally:
        replica.__del__()
    assert not _kv_dirs(tmp_root)
    with_disk = LLMReplica(str(model_dir), ENGINE, 1)  # a disk tier still has its folder
    try:
        assert _kv_dirs(tmp_root) == {Path(with_disk._cache_dir)}
    finally:
        with_disk.__del__()
    assert not _kv_dirs(tmp_root)


def test_the_sweep_removes_only_folders_whose_owner_is_gone(tmp_root):
    mine = make_disk_dir()  # (it sweeps too: made first)
    dead = _dead_pid()
    gone = _owned_by(tmp_root, "fy-kv-gone", dead)
    reused = _owned_by(tmp_root, "fy-kv-reused", os.getpid(), start="1")  # the pid now names a later process
    also_mine = _owned_by(tmp_root, "fy-kv-mine", os.getpid(), start=kv_cache._process_identity(os.getpid())["start"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = _owned_by(tmp_root, "fy-kv-live", sleeper.pid)
        unowned = tmp_root / "fy-kv-unowned"  # no owner file, just made: kept until idle for UNOWNED_MAX_IDLE_S
        unowned.mkdir()
        elsewhere = _owned_by(tmp_root, "fy-kv-elsewhere", dead, host="another-node")
        other_ns = _owned_by(tmp_root, "fy-kv-other-ns", dead, pidns="pid:[1]")
        not_ours = _owned_by(tmp_root, "other-thing", dead)
        target = _owned_by(tmp_root, "target", dead)
        (tmp_root / "fy-kv-link").symlink_to(target)

        assert set(sweep_orphan_disk_dirs()) == {gone, reused}
        assert not gone.exists() and not reused.exists()
        for kept in (mine, also_mine, live, unowned, elsewhere, other_ns, not_ours, target / "1.kv"):
            assert kept.exists(), kept
        assert (tmp_root / "fy-kv-link").is_symlink()

        sleeper.kill()
        sleeper.wait()
        assert sweep_orphan_disk_dirs() == [live]  # once its owner is gone, a live owner's folder goes too
    finally:
        sleeper.kill()
        sleeper.wait()


def _unowned(root: Path, name: str, *, idle_s: float, fresh_file: bool = False) -> Path:
    """A folder as a version before owner files left it: block files, no owner.pid, nothing modified for `idle_s`."""
    path = root / name
    path.mkdir()
    old = time.time() - idle_s
    for i in range(3):
        (path / f"{i}.kv").write_bytes(b"kv")
        os.utime(path / f"{i}.kv", (old, old))
    if fresh_file:
        (path / "3.kv").write_bytes(b"kv")  # written just now: its cache is in use
    os.utime(path, (old, old))
    return path


def _age(path: Path) -> None:
    for file in path.iterdir():
        os.utime(file, (0, 0))
    os.utime(path, (0, 0))


def test_a_folder_without_an_owner_file_is_swept_once_long_idle_and_not_in_use(tmp_root):
    """QA: `fy-kv-*` folders made before owner files existed (no owner.pid) were never swept, whatever their age."""
    stale = _unowned(tmp_root, "fy-kv-stale", idle_s=UNOWNED_MAX_IDLE_S + 60)
    recent = _unowned(tmp_root, "fy-kv-recent", idle_s=UNOWNED_MAX_IDLE_S - 600)  # idle, but not for long enough
    written = _unowned(tmp_root, "fy-kv-written", idle_s=2 * UNOWNED_MAX_IDLE_S, fresh_file=True)
    being_made = tmp_root / "fy-kv-new"  # made a moment ago, its owner file not written yet
    being_made.mkdir()
    used = _unowned(tmp_root, "fy-kv-used", idle_s=2 * UNOWNED_MAX_IDLE_S)
    cache = TieredPrefixCache(block_size=4, device_blocks=1, disk_blocks=4, disk_dir=used)  # a cache uses it
    try:
        later = _unowned(tmp_root, "fy-kv-later", idle_s=2 * UNOWNED_MAX_IDLE_S)
        made = make_disk_dir()  # the next cache or replica's folder: it sweeps first
        assert not stale.exists() and not later.exists()  # before: kept for good
        for kept in (recent, written, being_made, used, made):
            assert kept.exists(), kept
        _age(used)
        assert sweep_orphan_disk_dirs() == []  # idle for decades, but a cache of this process uses it
    finally:
        cache.close()  # (empties the folder it was given, and leaves it)
    _age(used)
    assert sweep_orphan_disk_dirs() == [used]  # once no cache uses it, it goes too
    assert sorted(sweep_orphan_disk_dirs(unowned_max_idle_s=3600)) == [recent]  # a shorter threshold, by argument
    assert written.exists() and being_made.exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_zombie_owner_counts_as_gone(tmp_root):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while kv_cache._proc_stat(child.pid)[:1] != ["Z"]:  # ended, not reaped yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        folder = _owned_by(tmp_root, "fy-kv-zombie", child.pid)
        assert sweep_orphan_disk_dirs() == [folder]
    finally:
        child.wait()


def test_a_disk_dir_prefix_the_sweep_would_not_find_is_refused(tmp_root):
    with pytest.raises(ValueError, match="fy-kv-"):
        make_disk_dir(prefix="kv-")
