"""The platform's file storage for uploaded datasets: write to a temp file, hash, fsync, rename.

A reader never sees a partial file: the final name appears only after the bytes are on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

CHUNK = 1024 * 1024
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class StoredFile:
    path: Path
    size_bytes: int
    checksum_sha256: str


class UploadTooLarge(Exception):
    pass


def storage_root() -> Path:
    return Path(settings.MEDIA_ROOT)


def safe_filename(name: str) -> str:
    cleaned = SAFE_NAME.sub("_", os.path.basename(name or "")).strip("._")
    return cleaned[:200] or "data"


def store_stream(*, chunks, relative_dir: str, filename: str, max_bytes: int) -> StoredFile:
    target_dir = storage_root() / relative_dir
    target_dir.mkdir(parents=True, exist_ok=True)
    final = target_dir / safe_filename(filename)
    tmp = target_dir / f".incoming-{uuid.uuid4().hex}"
    digest, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as handle:
            for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise UploadTooLarge(f"upload exceeds the limit of {max_bytes} bytes")
                digest.update(chunk)
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        dir_fd = os.open(target_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return StoredFile(path=final, size_bytes=size, checksum_sha256=digest.hexdigest())


def fetched_dir(version_pk: int) -> str:
    """The folder (relative to the storage root) where the fetched copy of an http(s) version is kept."""
    return f"datasets/fetched/v{version_pk}"


def remove_fetched(version_pk: int) -> None:
    """Remove the fetched copy of a version, if any, and its folder."""
    folder = storage_root() / fetched_dir(version_pk)
    remove_stored(folder / "data")
    remove_empty_dir(folder)


def remove_stored(path: Path) -> None:
    path.unlink(missing_ok=True)


def remove_empty_dir(path: Path) -> None:
    """Remove the folder `path` if it exists and is empty (an upload's own staging folder, once its file moved)."""
    with contextlib.suppress(OSError):  # gone, or not empty
        path.rmdir()
