"""The prefix cache inside one replica: KV blocks in a radix tree over token blocks, in three tiers.

A prompt is cut into blocks of `block_size` tokens; block j's KV depends on every token before it, so
the tree is keyed by the blocks themselves (a path from the root spells a prefix). Each tree node
holds one block's KV tensor (all layers) in one tier:

    device  the accelerator's memory (the replica computes with these)
    host    host DRAM: blocks evicted from the device tier
    disk    a local directory: blocks evicted from host DRAM, one file each

When a tier is over capacity its least recently used block moves down a tier (device -> host ->
disk); a block pushed off the disk tier is dropped with its subtree. `match` walks the tree and
brings every matched block back to the device tier, so a block found on host or disk is loaded, not
recomputed. LRU order: a lookup touches the path from its deepest node up to the root, so parents
are always more recent than their children and leaves go down (and out) first.

On a host without accelerators (this machine), the device and host tiers are both host memory:
they differ only in capacity accounting (a move between them copies nothing); the disk tier is real
file I/O. Callers own the tensors `match` returns: evicting a block later does not change them.

The disk tier's folder (`make_disk_dir`: `fy-kv-*` in the temp directory, unless the caller names one) holds an
`owner.pid` naming the process that made it. Its owner removes it when it stops (`close`, or the replica's
shutdown); a replica that crashed or was killed cannot, so each new folder's maker first sweeps the `fy-kv-*`
folders whose owner process is gone (`sweep_orphan_disk_dirs`). A folder made on another host or in another PID
namespace is left alone: nothing says its owner is gone. A folder with no (readable) owner file, made by a version
before owner files or caught being made, is swept only once nothing in it (the folder, its files) has been modified
for `UNOWNED_MAX_IDLE_S` (a day) and no cache of this process uses it: a disk tier in use writes a file for every
block it spills, and a file a sweep removed under a live cache is only a miss, recomputed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import shutil
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import torch

TIERS = ("device", "host", "disk")
_NUMPY_DTYPES = {torch.float32: numpy.float32, torch.float16: numpy.float16, torch.float64: numpy.float64}
DISK_DIR_PREFIX = "fy-kv-"
OWNER_FILE = "owner.pid"
# A folder without an owner file is swept once nothing in it was modified for this long (seconds): one day, far more
# than a new folder takes to get its owner file (milliseconds); a disk tier in use writes a file for each block it
# spills, so one that spilled nothing for a day holds nothing recent (and a file swept under it is only a miss).
UNOWNED_MAX_IDLE_S = 24 * 60 * 60
# The disk-tier folders this process's caches use (real paths): never swept, whatever their files' age.
_IN_USE: set[str] = set()
_IN_USE_LOCK = threading.Lock()


def _use_dir(path: Path, used: bool) -> None:
    key = os.path.realpath(path)
    with _IN_USE_LOCK:
        if used:
            _IN_USE.add(key)
        else:
            _IN_USE.discard(key)


def _in_use(path: str) -> bool:
    key = os.path.realpath(path)
    with _IN_USE_LOCK:
        return key in _IN_USE


# ---------------------------------------------------------------------------------------------- disk-tier folders

def make_disk_dir(prefix: str = DISK_DIR_PREFIX, *, root: str | os.PathLike | None = None) -> Path:
    """A new, empty disk-tier folder `<root>/<prefix>XXXX` (root: the temp directory) whose `owner.pid` names this
    process. Folders left by owners that are gone are swept first (see the module doc), so a crashed replica's
    folder does not stay for good. `prefix` must start with DISK_DIR_PREFIX, or its folder is never swept."""
    if not prefix.startswith(DISK_DIR_PREFIX):
        raise ValueError(f"prefix: must start with {DISK_DIR_PREFIX!r}")
    root = Path(root if root is not None else tempfile.gettempdir())
    sweep_orphan_disk_dirs(root)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
    _use_dir(path, True)  # (until a cache using it closes; its owner file keeps it from other processes' sweeps)
    me = _process_identity(os.getpid())
    text = f"{os.getpid()}\n" + "".join(f"{key}={value}\n" for key, value in me.items())
    tmp = path / f"{OWNER_FILE}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path / OWNER_FILE)  # a sweeper reads a whole owner file or none
    return path


def sweep_orphan_disk_dirs(root: str | os.PathLike | None = None, *,
                           unowned_max_idle_s: float = UNOWNED_MAX_IDLE_S) -> list[Path]:
    """Removes the `fy-kv-*` folders under `root` (the temp directory) whose owner.pid names a process that is gone
    (no such pid, a zombie, or a pid reused by a process started later), and those without a readable owner file
    (an older version's) in which nothing was modified for `unowned_max_idle_s`; returns them. Kept: folders of live
    owners (this process's too), folders a cache of this process uses, unowned folders modified more recently (one
    being made), other users' folders, links, and folders made on another host or in another PID namespace (their
    pids mean nothing here)."""
    root = Path(root if root is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    now = time.time()
    me = _process_identity(os.getpid())
    uid = os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        if not entry.name.startswith(DISK_DIR_PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if _in_use(entry.path):
            continue
        owner = _read_owner(Path(entry.path))
        if owner is None:  # before owner files (or being made): swept only when long idle
            if _modified_within(entry.path, now - unowned_max_idle_s):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
            continue
        pid, recorded = owner
        if recorded.get("host", "") != me["host"] or recorded.get("pidns", "") != me["pidns"]:
            continue
        if _owner_alive(pid, recorded.get("start", "")):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


def _modified_within(path: str, since: float) -> bool:
    """Whether the folder, or anything in it, was modified at or after `since` (epoch seconds); True when that cannot
    be read (keep it). Stops at the first recent entry."""
    try:
        if os.lstat(path).st_mtime >= since:
            return True
        for folder, dirs, files in os.walk(path, onerror=_raise):
            for name in itertools.chain(dirs, files):
                if os.lstat(os.path.join(folder, name)).st_mtime >= since:
                    return True
    except OSError:
        return True
    return False


def _raise(error: OSError) -> None:
    raise error


def _read_owner(path: Path) -> tuple[int, dict[str, str]] | None:
    try:
        lines = (path / OWNER_FILE).read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    if pid <= 0:  # (os.kill(0, ...) would ask about this process group, not a process)
        return None
    return pid, dict(line.split("=", 1) for line in lines[1:] if "=" in line)


def _process_identity(pid: int) -> dict[str, str]:
    """What tells a process apart from a later one with the same pid ("start": its start time in clock ticks since
    boot) and where its pid means something ("pidns", "host"); "" for what this system does not say."""
    stat = _proc_stat(pid)
    try:
        pidns = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        pidns = ""
    return {"start": stat[19] if len(stat) > 19 else "", "pidns": pidns, "host": socket.gethostname()}


def _proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state first), or [] where there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return text[text.rfind(")") + 1:].split()


def _owner_alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return True  # cannot tell: keep its folder
    stat = _proc_stat(pid)
    if stat and stat[0] in ("Z", "X"):  # ended, not yet reaped by its parent
        return False
    return not (start and len(stat) > 19 and stat[19] != start)  # else the pid names a process started later


@dataclass(eq=False)
class _Node:
    key: tuple[int, ...]
    parent: _Node | None
    node_id: int
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    tier: str = "device"
    payload: torch.Tensor | None = None  # None while on disk
    shape: tuple[int, ...] = ()  # of the payload, to read its raw file back
    dtype: torch.dtype = torch.float32
    write_pending: bool = False  # on the disk tier, payload still in memory until the writer has written it


@dataclass
class CacheMatch:
    """The longest cached whole-block prefix: one KV tensor per block, and where each was found."""

    blocks: list[torch.Tensor]
    found_in: dict[str, int]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


@dataclass
class CacheStats:
    lookups: int = 0
    lookup_blocks: int = 0
    hit_blocks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    inserted_blocks: int = 0
    spilled_to_host: int = 0
    spilled_to_disk: int = 0
    dropped_blocks: int = 0
    loaded_from_host: int = 0
    loaded_from_disk: int = 0

    def to_dict(self) -> dict:
        hits = sum(self.hit_blocks.values())
        return {
            "lookups": self.lookups, "lookup_blocks": self.lookup_blocks, "hit_blocks": dict(self.hit_blocks),
            "hit_rate": hits / self.lookup_blocks if self.lookup_blocks else 0.0,
            "inserted_blocks": self.inserted_blocks, "spilled_to_host": self.spilled_to_host,
            "spilled_to_disk": self.spilled_to_disk, "dropped_blocks": self.dropped_blocks,
            "loaded_from_host": self.loaded_from_host, "loaded_from_disk": self.loaded_from_disk,
        }


class TieredPrefixCache:
    """Radix tree of KV blocks over three tiers with per-tier capacities (in blocks; 0 turns a tier off)."""

    def __init__(self, *, block_size: int, device_blocks: int, host_blocks: int = 0, disk_blocks: int = 0,
                 disk_dir: str | os.PathLike | None = None, device: str | torch.device = "cpu") -> None:
        if block_size < 1:
            raise ValueError("block_size: must be at least 1")
        for name, value in (("device_blocks", device_blocks), ("host_blocks", host_blocks),
                            ("disk_blocks", disk_blocks)):
            if value < 0:
                raise ValueError(f"{name}: must not be negative")
        self.block_size = block_size
        self.capacity = {"device": device_blocks, "host": host_blocks, "disk": disk_blocks}
        self.device = torch.device(device)
        self._own_dir = disk_blocks > 0 and disk_dir is None
        self.disk_dir = Path(disk_dir or make_disk_dir()) if disk_blocks > 0 else None
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            _use_dir(self.disk_dir, True)  # this process's sweeps leave it alone, owner file or not
        self._root = _Node(key=(), parent=None, node_id=0, tier="root")
        self._ids = itertools.count(1)
        self._lru: dict[str, OrderedDict[int, _Node]] = {tier: OrderedDict() for tier in TIERS}
        self.stats = CacheStats()
        # Disk writes happen in a background thread, off the serving path: a block spilled to disk keeps its
        # tensor until its file is written, and a lookup in the meantime takes the tensor (a disk-tier hit).
        self._io_lock = threading.Lock()
        self._writes: queue.Queue[_Node | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        if self.disk_dir is not None:
            self._writer = threading.Thread(target=self._write_loop, name="kv-disk-writer", daemon=True)
            self._writer.start()

    # ------------------------------------------------------------------ reads

    def blocks_in(self, tier: str) -> int:
        return len(self._lru[tier])

    def match(self, tokens: Sequence[int]) -> CacheMatch:
        """The longest cached prefix of whole blocks of `tokens`, every block brought to the device tier."""
        keys = self._block_keys(tokens)
        self.stats.lookups += 1
        self.stats.lookup_blocks += len(keys)
        path: list[_Node] = []
        node = self._root
        for key in keys:
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        found = dict.fromkeys(TIERS, 0)
        blocks = []
        for depth, child in enumerate(path):
            tier = child.tier
            try:
                blocks.append(self._bring_to_device(child))
            except (OSError, ValueError):
                # its file is gone or damaged (a /tmp cleaner, a full disk, a host crash): the match ends here and the
                # block is dropped, so it is recomputed and cached again instead of failing every lookup that hits it
                self._drop_subtree(child)
                path = path[:depth]
                break
            found[tier] += 1
            self.stats.hit_blocks[tier] += 1
        self._touch(path)
        self._enforce_capacity()
        return CacheMatch(blocks=blocks, found_in=found)

    # ------------------------------------------------------------------ writes

    def insert(self, tokens: Sequence[int], blocks: Sequence[torch.Tensor]) -> int:
        """Caches block j of `tokens` with KV `blocks[j]` (only whole blocks; blocks already cached are kept).

        Returns how many blocks were new. `blocks` may be shorter than the whole-block prefix: only that
        many are inserted.
        """
        keys = self._block_keys(tokens)[: len(blocks)]
        node = self._root
        path: list[_Node] = []
        new = 0
        for key, kv in zip(keys, blocks, strict=False):
            child = node.children.get(key)
            if child is None:
                child = _Node(key=key, parent=node, node_id=next(self._ids), tier="device",
                              payload=kv.detach().to(self.device))
                node.children[key] = child
                self._lru["device"][child.node_id] = child
                new += 1
            path.append(child)
            node = child
        self.stats.inserted_blocks += new
        self._touch(path)
        self._enforce_capacity()
        return new

    def clear(self) -> None:
        with self._io_lock:
            for node in self._lru["disk"].values():
                node.write_pending = False  # a queued write of a cleared block is skipped
        for tier in TIERS:
            self._lru[tier].clear()
        self._root.children.clear()
        if self.disk_dir is not None:
            for file in self.disk_dir.glob("*.kv"):
                file.unlink(missing_ok=True)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Waits until every block spilled to disk so far is written (tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def close(self) -> None:
        """Stops the writer, drops everything and removes the disk tier's directory when this cache made it."""
        if self._writer is not None:
            self._writes.put(None)
            self._writer.join(timeout=30)
            self._writer = None
        self.clear()
        if self.disk_dir is not None:
            _use_dir(self.disk_dir, False)
        if self._own_dir and self.disk_dir is not None:
            shutil.rmtree(self.disk_dir, ignore_errors=True)

    # ------------------------------------------------------------------ internals

    def _block_keys(self, tokens: Sequence[int]) -> list[tuple[int, ...]]:
        ids = [int(t) for t in tokens]
        whole = len(ids) // self.block_size
        return [tuple(ids[j * self.block_size:(j + 1) * self.block_size]) for j in range(whole)]

    def _touch(self, path: list[_Node]) -> None:
        for node in reversed(path):  # deepest first, so the root end of the path is the most recent
            lru = self._lru[node.tier]
            if node.node_id in lru:
                lru.move_to_end(node.node_id)

    def _bring_to_device(self, node: _Node) -> torch.Tensor:
        if node.tier == "host":
            self._move(node, "device")
            self.stats.loaded_from_host += 1
        elif node.tier == "disk":
            with self._io_lock:
                payload = node.payload if node.write_pending else None
                node.write_pending = False  # the writer discards a file it writes after this
            if payload is None:
                path = self._disk_path(node)
                raw = numpy.fromfile(path, dtype=_NUMPY_DTYPES[node.dtype]).reshape(node.shape)
                payload = torch.from_numpy(raw).to(self.device)
                path.unlink(missing_ok=True)
            del self._lru["disk"][node.node_id]
            node.payload, node.tier = payload, "device"
            self._lru["device"][node.node_id] = node
            self.stats.loaded_from_disk += 1
        return node.payload

    def _move(self, node: _Node, tier: str) -> None:
        del self._lru[node.tier][node.node_id]
        if tier == "host" and self.device.type != "cpu":
            node.payload = node.payload.to("cpu")
        elif tier == "device" and node.payload.device != self.device:
            node.payload = node.payload.to(self.device)
        node.tier = tier
        self._lru[tier][node.node_id] = node

    def _enforce_capacity(self) -> None:
        while len(self._lru["device"]) > self.capacity["device"]:
            _, victim = next(iter(self._lru["device"].items()))
            if self.capacity["host"] > 0:
                self._move(victim, "host")
                self.stats.spilled_to_host += 1
            else:
                self._spill_to_disk_or_drop(victim)
        while len(self._lru["host"]) > self.capacity["host"]:
            _, victim = next(iter(self._lru["host"].items()))
            self._spill_to_disk_or_drop(victim)
        while len(self._lru["disk"]) > self.capacity["disk"]:
            _, victim = next(iter(self._lru["disk"].items()))
            self._drop_subtree(victim)

    def _spill_to_disk_or_drop(self, node: _Node) -> None:
        if self.capacity["disk"] <= 0 or self.disk_dir is None:
            self._drop_subtree(node)
            return
        del self._lru[node.tier][node.node_id]
        with self._io_lock:
            node.payload = node.payload.detach().cpu().contiguous()
            node.shape, node.dtype = tuple(node.payload.shape), node.payload.dtype
            node.tier, node.write_pending = "disk", True
        self._lru["disk"][node.node_id] = node
        self.stats.spilled_to_disk += 1
        self._writes.put(node)

    def _write_loop(self) -> None:
        while True:
            node = self._writes.get()
            tmp = None
            try:
                if node is None:
                    return
                with self._io_lock:
                    payload = node.payload if node.write_pending else None
                if payload is None:
                    continue  # loaded back or dropped before its turn
                path = self._disk_path(node)
                tmp = path.with_name(f"{path.name}.tmp")
                payload.numpy().tofile(tmp)  # raw bytes: a block is a fixed-shape tensor, no container needed
                os.replace(tmp, path)
                with self._io_lock:
                    if node.write_pending:
                        node.payload, node.write_pending = None, False
                        continue
                path.unlink(missing_ok=True)  # loaded back or dropped while being written
            except OSError:
                # the block stays pending, in memory: lookups keep finding it there rather than lose it; a partial
                # file is removed (nothing reads it, and left behind, one per failed write, it would fill a full disk)
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        tmp.unlink(missing_ok=True)
            finally:
                self._writes.task_done()

    def _drop_subtree(self, node: _Node) -> None:
        stack = [node]
        while stack:
            current = stack.pop()
            stack.extend(current.children.values())
            self._lru[current.tier].pop(current.node_id, None)
            if current.tier == "disk":
                with self._io_lock:
                    current.write_pending = False
                self._disk_path(current).unlink(missing_ok=True)
            current.payload = None
            self.stats.dropped_blocks += 1
        if node.parent is not None:
            node.parent.children.pop(node.key, None)

    def _disk_path(self, node: _Node) -> Path:
        return self.disk_dir / f"{node.node_id}.kv"
