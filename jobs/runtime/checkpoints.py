"""Atomic training checkpoints: temp dir, fsync, a manifest with sha256 hashes, publish by rename; and their loader.

Standard library only (no torch, Django or Ray): rank 0 of a Ray training gang writes with `save_checkpoint`, the
control plane lists with `list_checkpoints` / `latest_checkpoint` and the inference server loads with
`load_checkpoint` / `load_latest`. All checkpoints of one job live under one root directory:

    root/
      step-0000000100/               a published checkpoint: its files and manifest.json
      .tmp-step-0000000200-<id>/     a save in progress, or what a crashed save left behind
      .tmp-deleting-<name>-<id>/     a checkpoint (or leftover) being deleted

Invariants (DESIGN.md, "Data that must never be lost"):
- a directory gets a published name `step-NNNNNNNNNN` only by one atomic rename, after every file and then the
  manifest (written last) were written and fsynced and the directory itself was fsynced; the root is fsynced after;
- a published checkpoint is never changed in place. It is deleted by first renaming it to a `.tmp-deleting-` name
  (and fsyncing the root) before removing its files, so a reader sees it whole or not at all, even after a crash;
- listing trusts only published names whose manifest is readable and whose files exist with the listed sizes
  ("complete"); loading also checks every file's sha256 ("verified") unless told not to.
POSIX only (rename and directory-fsync semantics).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointInfo",
    "apply_retention",
    "clean_partial",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest",
    "save_checkpoint",
]

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
TMP_PREFIX = ".tmp-"
DELETING_PREFIX = ".tmp-deleting-"

_STEP_DIR = re.compile(r"step-(\d{10,})")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
_MAX_NAME_BYTES = 255
_PUBLISH_ATTEMPTS = 3

StrPath = str | os.PathLike[str]


class CheckpointError(Exception):
    """A checkpoint cannot be saved or loaded: not there (or removed meanwhile), unknown format, ..."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint's content does not match its manifest, or its manifest is unreadable.

    `path` is the checkpoint directory and `file` the offending file name (None when the manifest itself is bad).
    """

    def __init__(self, message: str, *, path: Path | None = None, file: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.file = file


class _UnsupportedFormat(ValueError):
    pass


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint as its manifest describes it. `files` maps each file name to its sha256 (hex)."""

    step: int
    path: Path
    size_bytes: int
    created_at: float
    files: dict[str, str]
    metadata: dict

    @property
    def name(self) -> str:
        return self.path.name


# --- writing ---------------------------------------------------------------------------------------------------------


def save_checkpoint(
    root: StrPath, *, step: int, files: Mapping[str, bytes], metadata: Mapping[str, Any] | None = None
) -> CheckpointInfo:
    """Write `files` as the checkpoint of `step` under `root` and publish it atomically; return what was published.

    Idempotent: when a checkpoint of `step` already exists and verifies, it is returned unchanged (and `files` is
    ignored), so a retried save neither fails nor overwrites. A published checkpoint of `step` that is broken or
    corrupt is moved aside (logged) and replaced. On any error the temporary directory is removed again; a crash
    can leave one behind (see `clean_partial`), never a half-written published checkpoint.
    """
    _check_step(step)
    blobs = _check_files(files)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping, not {type(metadata).__name__}")
    metadata_doc = dict(metadata or {})
    json.dumps(metadata_doc, sort_keys=True)  # not JSON-serialisable: TypeError / ValueError before touching disk

    root_path = Path(root)
    _ensure_root(root_path)
    final = root_path / _step_dir_name(step)
    existing = _existing_checkpoint(final)
    if existing is not None:
        return existing

    tmp = root_path / f"{TMP_PREFIX}step-{step:010d}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.mkdir(tmp)
    try:
        entries = {}
        for name, data in blobs.items():
            _write_file(tmp / name, data)
            entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": data.nbytes}
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "created_at": time.time(),
            "files": entries,
            "metadata": metadata_doc,
        }
        raw = json.dumps(manifest, indent=2, sort_keys=True).encode()
        info, _ = _parse_manifest(raw, final)  # exactly what a reader of the published checkpoint will see
        _write_file(tmp / MANIFEST_NAME, raw)  # last: a manifest means every file before it is on disk
        _fsync_dir(tmp)
        winner = _publish(tmp, final)
    except BaseException:
        _discard(tmp)
        raise
    if winner is not None:  # a concurrent save of the same step published first
        _discard(tmp)
        return winner
    _fsync_dir(root_path)
    return info


def _publish(tmp: Path, final: Path) -> CheckpointInfo | None:
    """Rename `tmp` to `final`. None when ours was published; the existing checkpoint when one was already there."""
    for _ in range(_PUBLISH_ATTEMPTS):
        try:
            os.rename(tmp, final)
            return None
        except FileNotFoundError:
            if not tmp.exists():
                raise CheckpointError(
                    f"{tmp} disappeared before it was published (clean_partial running concurrently?)"
                ) from None
            raise
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        existing = _existing_checkpoint(final)
        if existing is not None:
            return existing
    raise CheckpointError(f"could not publish {final}: a broken checkpoint keeps reappearing under that name")


def _existing_checkpoint(final: Path) -> CheckpointInfo | None:
    """The checkpoint at `final` if there is one and it verifies; a corrupt one is moved aside and None returned."""
    if not os.path.lexists(final):
        return None
    try:
        info, sizes = _open_manifest(final)
        for name in info.files:
            _read_checked(final, name, sizes[name], info.files[name], verify=True, keep=False)
        return info
    except CheckpointCorrupt as exc:
        logger.warning("replacing corrupt checkpoint %s: %s", final, exc)
        _remove_published(final)
        return None
    except CheckpointError:
        if not os.path.lexists(final):  # deleted meanwhile (retention)
            return None
        raise


def _write_file(path: Path, data: memoryview | bytes) -> None:
    """Create `path` (it must not exist), write `data` and fsync it."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _ensure_root(root: Path) -> None:
    if root.is_dir():
        return
    os.makedirs(root, exist_ok=True)
    _fsync_dir(root.parent)


# --- reading ---------------------------------------------------------------------------------------------------------


def list_checkpoints(root: StrPath) -> list[CheckpointInfo]:
    """Every complete checkpoint under `root`, oldest step first; anything else there is ignored. No root: []."""
    root_path = Path(root)
    try:
        with os.scandir(root_path) as it:
            names = [entry.name for entry in it]
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        match = _STEP_DIR.fullmatch(name)
        if match is None or name != _step_dir_name(int(match.group(1))):
            continue
        info = _complete_info(root_path / name)
        if info is not None:
            found.append(info)
    found.sort(key=lambda info: info.step)
    return found


def latest_checkpoint(root: StrPath) -> CheckpointInfo | None:
    """The complete checkpoint with the highest step (hashes not checked: see `load_latest`), or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(
    checkpoint: CheckpointInfo | StrPath, *, verify: bool = True
) -> tuple[CheckpointInfo, dict[str, bytes]]:
    """Read every file of a checkpoint directory; with `verify`, check each against its sha256 in the manifest.

    The manifest on disk is authoritative (a CheckpointInfo only gives the path). Sizes are always checked.
    Raises CheckpointCorrupt (with `.file`) when a file is missing, has the wrong size or hash, or the manifest is
    unreadable; CheckpointError when there is no checkpoint there (any more) or it is not a published one.
    """
    path = checkpoint.path if isinstance(checkpoint, CheckpointInfo) else Path(checkpoint)
    if path.name.startswith(TMP_PREFIX):
        raise CheckpointError(f"{path} is not a published checkpoint")
    info, sizes = _open_manifest(path)
    data = {}
    for name, sha256 in info.files.items():
        data[name] = _read_checked(path, name, sizes[name], sha256, verify=verify, keep=True)
    return info, data


def load_latest(root: StrPath) -> tuple[CheckpointInfo, dict[str, bytes]] | None:
    """Load the newest checkpoint that verifies; corrupt newer ones are skipped with a warning. None if none does."""
    for info in reversed(list_checkpoints(root)):
        try:
            return load_checkpoint(info.path, verify=True)
        except CheckpointCorrupt as exc:
            logger.warning("skipping corrupt checkpoint %s (step %d): %s", info.path, info.step, exc)
        except CheckpointError as exc:
            logger.warning("skipping checkpoint %s (step %d): %s", info.path, info.step, exc)
    return None


def _complete_info(path: Path) -> CheckpointInfo | None:
    """The checkpoint at a published name if its manifest is readable and its files have the listed sizes."""
    try:
        info, sizes = _open_manifest(path)
        for name, size in sizes.items():
            st = os.stat(path / name)
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                logger.debug("ignoring %s: %s has %d bytes, manifest says %d", path, name, st.st_size, size)
                return None
    except (CheckpointError, OSError) as exc:
        logger.debug("ignoring %s: %s", path, exc)
        return None
    return info


def _open_manifest(path: Path) -> tuple[CheckpointInfo, dict[str, int]]:
    try:
        raw = (path / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        if not path.is_dir():
            raise CheckpointError(f"no checkpoint at {path}") from None
        raise CheckpointCorrupt(f"{path}: {MANIFEST_NAME} is missing", path=path) from None
    except NotADirectoryError:
        raise CheckpointError(f"no checkpoint at {path}") from None
    try:
        info, sizes = _parse_manifest(raw, path)
    except _UnsupportedFormat as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointCorrupt(f"{path}: unreadable {MANIFEST_NAME}: {exc}", path=path) from None
    if _STEP_DIR.fullmatch(path.name) and path.name != _step_dir_name(info.step):
        raise CheckpointCorrupt(f"{path}: its manifest is for step {info.step}", path=path)
    return info, sizes


def _parse_manifest(raw: bytes, path: Path) -> tuple[CheckpointInfo, dict[str, int]]:
    """The CheckpointInfo and file sizes a manifest describes; ValueError when it is not a valid manifest."""
    doc = json.loads(raw)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("format") != FORMAT_VERSION:
        raise _UnsupportedFormat(f"unsupported manifest format {doc.get('format')!r} (this reader: {FORMAT_VERSION})")
    step = doc.get("step")
    if not _is_int(step) or step < 0:
        raise ValueError(f"bad step {step!r}")
    created_at = doc.get("created_at")
    if not isinstance(created_at, int | float) or isinstance(created_at, bool):
        raise ValueError(f"bad created_at {created_at!r}")
    files_doc = doc.get("files")
    metadata = doc.get("metadata", {})
    if not isinstance(files_doc, dict) or not isinstance(metadata, dict):
        raise ValueError("files and metadata must be objects")
    hashes: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name, entry in files_doc.items():
        _check_name(name)
        if not isinstance(entry, dict):
            raise ValueError(f"bad entry for {name!r}")
        sha256, size = entry.get("sha256"), entry.get("size")
        if not isinstance(sha256, str) or not _SHA256_HEX.fullmatch(sha256):
            raise ValueError(f"bad sha256 for {name!r}")
        if not _is_int(size) or size < 0:
            raise ValueError(f"bad size for {name!r}")
        hashes[name], sizes[name] = sha256, size
    info = CheckpointInfo(
        step=step,
        path=path,
        size_bytes=sum(sizes.values()),
        created_at=float(created_at),
        files=hashes,
        metadata=metadata,
    )
    return info, sizes


def _read_checked(path: Path, name: str, size: int, sha256: str, *, verify: bool, keep: bool) -> bytes | None:
    """Read one file of a checkpoint, checking its size (and hash with `verify`); return it when `keep`."""
    digest = hashlib.sha256()
    chunks: list[bytes] = []
    total = 0
    try:
        with open(path / name, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise CheckpointCorrupt(f"{path}: {name!r} is not a regular file", path=path, file=name)
            while chunk := f.read(_CHUNK if not keep else max(size + 1, 1)):
                total += len(chunk)
                if total > size:
                    break
                if verify:
                    digest.update(chunk)
                if keep:
                    chunks.append(chunk)
    except FileNotFoundError:
        if not path.is_dir():  # the whole checkpoint went away (retention) while we read it
            raise CheckpointError(f"{path} was removed while it was being read") from None
        raise CheckpointCorrupt(f"{path}: file {name!r} is missing", path=path, file=name) from None
    if total != size:
        raise CheckpointCorrupt(
            f"{path}: file {name!r} has {'more than ' if total > size else ''}{total} bytes, the manifest says {size}",
            path=path,
            file=name,
        )
    if verify and digest.hexdigest() != sha256:
        raise CheckpointCorrupt(
            f"{path}: file {name!r} does not match its sha256 in the manifest", path=path, file=name
        )
    if not keep:
        return None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# --- deleting --------------------------------------------------------------------------------------------------------


def apply_retention(root: StrPath, *, keep_last: int, keep_steps: Collection[int] = ()) -> list[int]:
    """Delete every complete checkpoint except the newest `keep_last` and those in `keep_steps`; return their steps.

    Broken published directories are neither counted nor deleted (they are left for inspection).
    """
    if not _is_int(keep_last) or keep_last < 1:
        raise ValueError(f"keep_last must be an int >= 1, not {keep_last!r}")
    complete = list_checkpoints(root)
    keep = set(keep_steps) | {info.step for info in complete[-keep_last:]}
    removed = []
    for info in complete:
        if info.step not in keep and _remove_published(info.path):
            removed.append(info.step)
    return removed


def clean_partial(root: StrPath, *, older_than_s: float = 0.0) -> int:
    """Remove `.tmp-*` directories (crashed saves, interrupted deletions) untouched for `older_than_s`; return count.

    A directory is first claimed by renaming it, so a save that is still running fails cleanly instead of publishing
    a half-deleted checkpoint; still, pass an age well above a save's duration while a writer may be running.
    """
    if older_than_s < 0:
        raise ValueError("older_than_s must be >= 0")
    root_path = Path(root)
    try:
        with os.scandir(root_path) as it:
            candidates = [entry for entry in it if entry.name.startswith(TMP_PREFIX)]
    except FileNotFoundError:
        return 0
    now = time.time()
    count = 0
    for entry in candidates:
        try:
            if not entry.is_dir(follow_symlinks=False) or now - _last_modified(entry.path) < older_than_s:
                continue
        except FileNotFoundError:
            continue
        target = Path(entry.path)
        if not entry.name.startswith(DELETING_PREFIX):
            target = root_path / f"{DELETING_PREFIX}{entry.name[len(TMP_PREFIX) :]}-{uuid.uuid4().hex[:8]}"
            try:
                os.rename(entry.path, target)
            except FileNotFoundError:  # published or discarded by its writer meanwhile
                continue
        if _rmtree(target):
            count += 1
    if count:
        _fsync_dir(root_path)
    return count


def _remove_published(path: Path) -> bool:
    """Delete a published checkpoint: rename it out of sight (durably), then remove it. False if it was gone."""
    target = path.parent / f"{DELETING_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return False
    _fsync_dir(path.parent)  # a crash must not bring back a half-deleted directory under its published name
    if not _rmtree(target):
        logger.warning("could not remove %s entirely; clean_partial will retry", target)
    return True


def _discard(tmp: Path) -> None:
    """Best-effort removal of an unpublished temporary directory."""
    shutil.rmtree(tmp, ignore_errors=True)


def _rmtree(path: Path) -> bool:
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def _last_modified(path: str) -> float:
    newest = os.stat(path, follow_symlinks=False).st_mtime
    with os.scandir(path) as it:
        for entry in it:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
    return newest


# --- helpers ---------------------------------------------------------------------------------------------------------


def _step_dir_name(step: int) -> str:
    return f"step-{step:010d}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_step(step: object) -> None:
    if not _is_int(step):
        raise TypeError(f"step must be an int, not {type(step).__name__}")
    if step < 0:  # type: ignore[operator]
        raise ValueError(f"step must be >= 0, not {step}")


def _check_name(name: object) -> None:
    """A checkpoint file name must be a plain file name: no path separators, not '.', '..' or the manifest's."""
    if not isinstance(name, str):
        raise ValueError(f"file name must be a str, not {type(name).__name__}")
    if name in ("", ".", "..") or any(c in name for c in "/\\\x00") or name.casefold() == MANIFEST_NAME:
        raise ValueError(f"bad checkpoint file name {name!r}: it must be a plain file name, not {MANIFEST_NAME!r}")
    if len(os.fsencode(name)) > _MAX_NAME_BYTES:
        raise ValueError(f"checkpoint file name {name[:40]!r}... is longer than {_MAX_NAME_BYTES} bytes")


def _check_files(files: Mapping[str, bytes]) -> dict[str, memoryview]:
    if not isinstance(files, Mapping):
        raise TypeError(f"files must be a mapping of name to bytes, not {type(files).__name__}")
    blobs = {}
    for name, data in files.items():
        _check_name(name)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"file {name!r}: content must be bytes, not {type(data).__name__}")
        view = memoryview(data)
        if not view.c_contiguous:
            raise TypeError(f"file {name!r}: content must be a contiguous buffer")
        blobs[name] = view.cast("B")
    return blobs


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot fsync a directory; nothing more can be done there
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
