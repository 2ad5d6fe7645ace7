"""Where a training job's workers read a dataset version from: a local file the platform vouches for.

- Uploaded versions: the stored file, only if it really lies inside the platform's storage (a row edited
  to point elsewhere, or a symlink out of storage, is refused).
- http(s) versions: downloaded once by the control plane through the SSRF guard (common/netguard: public
  addresses only, checked before connecting, on the connected socket and on every redirect), with a size
  limit and the registered SHA-256 verified; kept under storage/datasets/fetched/.
- Anything else (file:// outside storage, s3://, gs://, az://, hf://): refused with the reason, so a job
  never silently trains on something other than the data it named.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import requests
from django.conf import settings

from controlplane.common import netguard
from controlplane.datasets import storage
from controlplane.datasets.models import DatasetVersion

MAX_REDIRECTS = 3
FETCH_TIMEOUT_S = 30


class DatasetUnavailable(Exception):
    """The version cannot be given to the workers; the message says why."""


def dataset_local_file(version: DatasetVersion) -> Path:
    """A local file with this version's bytes, fetching it first if it is remote."""
    scheme = urlsplit(version.uri).scheme.lower()
    if scheme == "file":
        return _stored_file(version)
    if scheme in netguard.FETCH_SCHEMES:
        return _fetched_file(version)
    raise DatasetUnavailable(f"dataset version {version.version} is at {scheme}://, which this platform cannot "
                             f"read (no credentials for it); upload the file or register an https URL")


def _inside_storage(path: Path) -> bool:
    root = storage.storage_root().resolve()
    try:
        path.resolve().relative_to(root)
    except ValueError:
        return False
    return True


def _stored_file(version: DatasetVersion) -> Path:
    path = Path(unquote(urlsplit(version.uri).path))
    if not version.uploaded or not _inside_storage(path):
        raise DatasetUnavailable(f"dataset version {version.version} points at {version.shown_uri}, outside the "
                                 f"platform's dataset storage; only uploaded files are read from disk")
    if not path.is_file():
        raise DatasetUnavailable(f"the stored file of dataset version {version.version} is missing: "
                                 f"{version.shown_uri}")
    return path


def _fetched_file(version: DatasetVersion) -> Path:
    target_dir = storage.fetched_dir(version.pk)
    cached = storage.storage_root() / target_dir / "data"
    if cached.is_file() and (not version.checksum_sha256 or _sha256(cached) == version.checksum_sha256):
        return cached
    limit = settings.FLEETYARD_MAX_DATASET_UPLOAD_BYTES
    url = version.uri
    session = netguard.guarded_session()
    try:
        for _ in range(MAX_REDIRECTS + 1):
            netguard.check_url(url)  # refused before any connection; the connection checks its address again
            response = session.get(url, stream=True, allow_redirects=False, timeout=FETCH_TIMEOUT_S)
            if response.is_redirect:
                url = urljoin(url, response.headers.get("Location", ""))
                response.close()
                continue
            if response.status_code != 200:
                raise DatasetUnavailable(f"fetching dataset version {version.version} from {version.shown_uri} "
                                         f"answered HTTP {response.status_code}")
            stored = storage.store_stream(chunks=response.iter_content(storage.CHUNK), relative_dir=target_dir,
                                          filename="data", max_bytes=limit)
            break
        else:
            raise DatasetUnavailable(f"fetching {version.shown_uri} was redirected more than {MAX_REDIRECTS} times")
    except netguard.UnsafeURL as exc:
        raise DatasetUnavailable(f"dataset version {version.version} was not fetched: {exc}") from None
    except storage.UploadTooLarge as exc:
        raise DatasetUnavailable(f"dataset version {version.version} is larger than {limit} bytes") from exc
    except requests.RequestException as exc:
        raise DatasetUnavailable(f"fetching dataset version {version.version} from {version.shown_uri} failed: "
                                 f"{type(exc).__name__}") from exc
    finally:
        session.close()
    if version.checksum_sha256 and stored.checksum_sha256 != version.checksum_sha256:
        storage.remove_stored(stored.path)
        raise DatasetUnavailable(f"dataset version {version.version} does not match its registered SHA-256 "
                                 f"(got {stored.checksum_sha256[:12]}..., registered "
                                 f"{version.checksum_sha256[:12]}...)")
    return stored.path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(storage.CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
