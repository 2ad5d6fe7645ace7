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
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(value)
    try:
        # Two processes starting together: the first link wins, the other reads the winner's key.
        os.link(tmp, path)
    except FileExistsError:
        value = path.read_text().strip()
    finally:
        tmp.unlink(missing_ok=True)
    return value
