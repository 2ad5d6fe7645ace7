"""A per-installation secret kept in a file, created once with owner-only permissions."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def read_or_create_secret(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    value = secrets.token_urlsafe(50)
    tmp = _private_copy(path, value)
    try:
        # Two processes starting together: the first link wins, the other reads the winner's key.
        os.link(tmp, path)
    except FileExistsError:
        value = path.read_text().strip()
    finally:
        tmp.unlink(missing_ok=True)
    return value


def write_secret(path: Path, value: str) -> None:
    """Replace the secret in `path` with `value`, atomically, readable by its owner only."""
    os.replace(_private_copy(path, value), path)


def _private_copy(path: Path, value: str) -> Path:
    """`value` written to a temporary file beside `path` that only its owner may read."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    return tmp
