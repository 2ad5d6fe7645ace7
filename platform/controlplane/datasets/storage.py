"""The platform's file storage for uploaded datasets: write to a temp file, hash, fsync, rename.

A reader never sees a partial file: the final name appears only after the bytes are on disk.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

log = logging.getLogger(__name__)

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
    """Remove the folder `path` if it exists and is empty (an upload's own staging folder, once its file moved); a
    folder that could not be removed for another reason is logged and left (never raised: the caller is done)."""
    try:
        path.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):  # gone, or not empty: nothing to do
            log.warning("could not remove the empty folder %s: %s", path, exc)


def dataset_dir(team_name: str, dataset_name: str) -> Path:
    """The folder of a dataset's uploaded versions (`v<n>/<file>`) and of its uploads' staging (`.staging/`)."""
    return storage_root() / "datasets" / team_name / dataset_name


def remove_deleted_dataset(*, folder: Path, uploaded: dict[int, Path], version_pks: list[int]) -> None:
    """After a dataset's delete committed: remove its uploaded files (`uploaded`: version number -> stored path),
    the copies fetched of its versions, and the folders that leaves empty: each version's `v<n>` (when its file lies
    there), the dataset's `.staging` and the dataset's folder, which stayed on disk (QA). Nothing else is touched
    (its team's folder stays), a folder still holding anything stays, and a failure is logged, never raised: the
    delete is done and was answered."""
    steps = []
    for number, path in uploaded.items():
        steps.append((remove_stored, path))
        if path.parent == folder / f"v{number}":
            steps.append((remove_empty_dir, path.parent))
    steps += [(remove_fetched, pk) for pk in version_pks]
    steps += [(remove_empty_dir, folder / ".staging"), (remove_empty_dir, folder)]
    for step, target in steps:
        try:
            step(target)
        except Exception:
            log.exception("deleted dataset's storage: %s(%s) failed; left on disk", step.__name__, target)
