"""Writes about datasets: create, add a version by URI or upload, delete."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse, urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from controlplane.common import netguard
from controlplane.common.errors import ConflictError, ValidationFailed
from controlplane.datasets import storage
from controlplane.datasets.models import Dataset, DatasetFormat, DatasetVersion
from controlplane.tenancy.models import Team
from controlplane.tenancy.services import audit_record

# file:// is not among them: a registered path would let a job read the platform host's files (upload instead).
ALLOWED_URI_SCHEMES = {"s3", "gs", "az", "http", "https", "hf"}
SHA256 = re.compile(r"^[0-9a-f]{64}$")


@transaction.atomic
def dataset_create(*, actor, team: Team, name: str, description: str = "") -> Dataset:
    if Dataset.objects.filter(team=team, name=name).exists():
        raise ValidationFailed(f"team {team.name} already has a dataset named {name!r}", field="name")
    dataset = Dataset(team=team, name=name, description=description, created_by=actor)
    dataset.full_clean()
    dataset.save()
    audit_record(actor=actor, team=team, action="dataset.create", target=dataset, data={"name": name})
    return dataset


def _next_version(dataset: Dataset) -> int:
    # Lock the dataset row: concurrent uploads to one dataset get distinct, gapless numbers.
    try:
        Dataset.objects.select_for_update().get(pk=dataset.pk)
    except Dataset.DoesNotExist:
        # Deleted while the file was uploading (or the request was on its way): that was a 500 (QA).
        raise ConflictError(f"dataset {dataset.name} was deleted; nothing was stored") from None
    latest = dataset.versions.aggregate(latest=Max("version"))["latest"] or 0
    return latest + 1


def _check_uri(uri: str) -> None:
    """A URI a team may register: a known scheme, and for http(s) a host that is not internal (SSRF)."""
    try:
        parsed = urlparse(uri)
    except ValueError:  # `https://[abc/x` (an unclosed IPv6 bracket) was a 500 (QA)
        raise ValidationFailed(f"{netguard.uri_without_credentials(uri)!r} is not a valid URI (an IPv6 host is "
                               "written in closed brackets: https://[2001:db8::1]/x)", field="uri") from None
    if "@" in parsed.netloc:
        # A version's uri is shown to every member of the team (viewers too), in lists, the console and the audit
        # log: `https://user:password@host/...` or `s3://KEY:SECRET@bucket/...` was stored and shown as sent, and an
        # error repeated it (QA). The message names the host only.
        raise ValidationFailed(f"credentials in a URI are not accepted ({parsed.scheme}://...@"
                               f"{parsed.netloc.rpartition('@')[2]}/...): every member of the team would see them; "
                               "give the platform access to the storage instead, or use a pre-signed URL",
                               field="uri")
    if parsed.scheme == "file":
        raise ValidationFailed("file:// URIs are not accepted: they would let a job read the platform's own "
                               "files; upload the file instead", field="uri")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in uri):
        raise ValidationFailed("a URI holds no spaces or control characters (percent-encode them: %20)", field="uri")
    if parsed.scheme in ALLOWED_URI_SCHEMES and not parsed.netloc:
        # `hf:foo` or `s3:bucket/x` was accepted and could only fail when a job read it (QA)
        raise ValidationFailed(f"{uri!r} names no host or bucket: write it as "
                               f"{parsed.scheme}://<bucket or host>/<path>", field="uri")
    if parsed.scheme not in ALLOWED_URI_SCHEMES or not (parsed.netloc or parsed.path):
        raise ValidationFailed(
            f"{uri!r} is not a supported URI (schemes: {', '.join(sorted(ALLOWED_URI_SCHEMES))})", field="uri"
        )
    _check_authority(uri, parsed)
    if parsed.scheme in netguard.FETCH_SCHEMES:
        try:
            netguard.check_url(uri, require_resolution=False)
        except netguard.UnsafeURL as exc:
            raise ValidationFailed(f"{exc}", field="uri") from None


def _check_authority(uri: str, parsed) -> None:
    """The host (or bucket) and port of a URI as a reader could open them: `https://a..b/x` (an empty DNS label) or a
    port of 0 were registered and could only fail when a job read them (QA). A host in brackets is an IPv6 literal
    (no labels); one dot at the end of a name (`example.org.`) is the DNS root and is allowed."""
    shown = netguard.uri_without_credentials(uri)
    try:
        port = parsed.port
    except ValueError:  # not a number, or above 65535
        raise ValidationFailed(f"{shown!r} has an invalid port: give a number from 1 to 65535, or none",
                               field="uri") from None
    if port == 0:
        raise ValidationFailed(f"{shown!r} names port 0, which nothing can be reached on: give a port from 1 to "
                               "65535, or none", field="uri")
    host = parsed.netloc.rpartition("@")[2]
    if host.startswith("["):
        return
    host = host.rpartition(":")[0] if ":" in host else host
    name = host[:-1] if host.endswith(".") else host
    if not name:
        raise ValidationFailed(f"{shown!r} names no host or bucket", field="uri")
    labels = name.split(".")
    if "" in labels:
        raise ValidationFailed(f"{shown!r} names the host {host!r}, which has an empty label (a dot at its start "
                               "or two dots in a row)", field="uri")
    longest = max(labels, key=len)
    if len(longest) > 63:
        raise ValidationFailed(f"{shown!r} names a host with a label of {len(longest)} characters (at most 63 "
                               "between dots)", field="uri")
    if len(name) > 253:
        raise ValidationFailed(f"{shown!r} names a host of {len(name)} characters (at most 253)", field="uri")
    if parsed.scheme in netguard.FETCH_SCHEMES:
        try:
            name.encode("idna")
        except UnicodeError:
            raise ValidationFailed(f"{shown!r} names the host {host!r}, which is not a valid host name",
                                   field="uri") from None


def _check_format(fmt: str) -> None:
    if fmt not in DatasetFormat.values:
        raise ValidationFailed(f"{fmt!r} is not a format (choose {', '.join(DatasetFormat.values)})",
                               field="format")


@transaction.atomic
def dataset_version_register(*, actor, dataset: Dataset, uri: str, fmt: str = DatasetFormat.OTHER,
                             size_bytes: int | None = None, checksum_sha256: str = "",
                             description: str = "") -> DatasetVersion:
    _check_uri(uri)
    _check_format(fmt)
    if size_bytes is not None and size_bytes < 0:
        raise ValidationFailed("size must not be negative", field="size_bytes")
    if checksum_sha256 and not SHA256.match(checksum_sha256):
        raise ValidationFailed("checksum must be 64 lowercase hex digits (SHA-256)", field="checksum_sha256")
    version = DatasetVersion.objects.create(
        dataset=dataset, version=_next_version(dataset), uri=uri, uploaded=False, size_bytes=size_bytes,
        checksum_sha256=checksum_sha256, format=fmt, description=description, created_by=actor,
    )
    audit_record(actor=actor, team=dataset.team_id, action="dataset_version.register", target=version,
                 data={"dataset": dataset.name, "version": version.version, "uri": uri})
    return version


def dataset_version_upload(*, actor, dataset: Dataset, upload, fmt: str = DatasetFormat.OTHER,
                           description: str = "", size_bytes: int | None = None,
                           checksum_sha256: str = "") -> DatasetVersion:
    """Store an uploaded file and record it as the next version; on any failure nothing remains. A `size_bytes` or
    `checksum_sha256` given is checked against what arrived (they were silently ignored: an upload the client meant
    to verify was stored whatever it held; found by QA)."""
    _check_format(fmt)
    if upload is None:
        raise ValidationFailed("attach a file", field="file")
    if checksum_sha256 and not SHA256.match(checksum_sha256):
        raise ValidationFailed("checksum must be 64 lowercase hex digits (SHA-256)", field="checksum_sha256")
    # A folder of its own per upload: two uploads of one file name at once shared `.staging/<name>`, so the second
    # replaced the first's bytes before the first moved them to its version (QA).
    staging = f"datasets/{dataset.team.name}/{dataset.name}/.staging/{uuid.uuid4().hex}"
    try:
        return _upload_staged(actor=actor, dataset=dataset, upload=upload, staging=staging, fmt=fmt,
                              description=description, size_bytes=size_bytes, checksum_sha256=checksum_sha256)
    finally:
        storage.remove_empty_dir(storage.storage_root() / staging)


def _upload_staged(*, actor, dataset: Dataset, upload, staging: str, fmt: str, description: str,
                   size_bytes: int | None, checksum_sha256: str) -> DatasetVersion:
    try:
        stored = storage.store_stream(chunks=upload.chunks(), relative_dir=staging, filename=upload.name,
                                      max_bytes=settings.FLEETYARD_MAX_DATASET_UPLOAD_BYTES)
    except storage.UploadTooLarge as exc:
        raise ValidationFailed(str(exc), field="file") from exc
    mismatch = None
    if size_bytes is not None and size_bytes != stored.size_bytes:
        mismatch = ValidationFailed(f"the file that arrived has {stored.size_bytes} bytes, not {size_bytes}",
                                    field="size_bytes")
    elif checksum_sha256 and checksum_sha256 != stored.checksum_sha256:
        mismatch = ValidationFailed(f"the file that arrived has SHA-256 {stored.checksum_sha256}, not "
                                    f"{checksum_sha256}", field="checksum_sha256")
    if mismatch is not None:
        storage.remove_stored(stored.path)
        raise mismatch
    final_path = None
    try:
        with transaction.atomic():
            number = _next_version(dataset)
            final_dir = storage.dataset_dir(dataset.team.name, dataset.name) / f"v{number}"
            final_dir.mkdir(parents=True, exist_ok=True)
            final_path = final_dir / stored.path.name
            if final_path.exists():
                raise ConflictError(f"storage for version {number} already exists; retry")
            stored.path.rename(final_path)
            version = DatasetVersion.objects.create(
                dataset=dataset, version=number, uri=final_path.as_uri(), uploaded=True,
                size_bytes=stored.size_bytes, checksum_sha256=stored.checksum_sha256, format=fmt,
                description=description, created_by=actor,
            )
            audit_record(actor=actor, team=dataset.team_id, action="dataset_version.upload", target=version,
                         data={"dataset": dataset.name, "version": number, "size_bytes": stored.size_bytes,
                               "checksum_sha256": stored.checksum_sha256})
    except BaseException:
        storage.remove_stored(stored.path)
        if final_path is not None:
            storage.remove_stored(final_path)
        raise
    return version


@transaction.atomic
def dataset_delete(*, actor, dataset: Dataset) -> None:
    from jobs.models import TrainingJob  # jobs depend on datasets, not the other way round

    # Lock the row as uploads do (_next_version): an upload finishing during the delete either lands before it (and
    # is deleted with its file) or finds the dataset gone (409), never a version the delete did not see.
    Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
    citing = TrainingJob.objects.filter(dataset_version__dataset=dataset)
    if citing.exclude(state__in=TrainingJob.terminal_state_values()).exists():
        raise ConflictError(f"dataset {dataset.name} is used by a job that has not finished")
    # A finished job keeps the version it trained on (PROTECT): deleting under it was a 500 (found by QA).
    ended = list(citing.order_by("id").values_list("id", flat=True)[:6])
    if ended:
        shown = ", ".join(str(pk) for pk in ended[:5]) + (", ..." if len(ended) > 5 else "")
        raise ConflictError(f"dataset {dataset.name} is cited by finished training jobs ({shown}); "
                            f"delete those jobs first")
    # (the stored path as fetching reads it: percent-decoded; a storage path with a space was not removed)
    uploaded = {number: Path(unquote(urlsplit(uri).path))
                for number, uri in dataset.versions.filter(uploaded=True).values_list("version", "uri")}
    folder = storage.dataset_dir(dataset.team.name, dataset.name)
    # http(s) versions a job read were fetched to storage/datasets/fetched/v<pk>/: those copies outlived the dataset
    # (QA); they go with it.
    version_pks = list(dataset.versions.values_list("pk", flat=True))
    audit_record(actor=actor, team=dataset.team_id, action="dataset.delete", target=dataset,
                 data={"name": dataset.name, "versions": len(version_pks)})
    dataset.delete()

    transaction.on_commit(lambda: storage.remove_deleted_dataset(folder=folder, uploaded=uploaded,
                                                                 version_pks=version_pks))
