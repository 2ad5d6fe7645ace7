"""Datasets and versions through the REST API: register by URI, upload a file, errors leave nothing behind."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.datasets.models import Dataset, DatasetVersion


def make_dataset(client, name="corpus"):
    response = client.post("/api/v1/datasets/", {"name": name, "description": "tiny"}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_create_list_and_duplicate_name(api):
    client = api("alpha", "member")
    body = make_dataset(client)
    assert body["team"] == "alpha" and body["version_count"] == 0
    response = client.post("/api/v1/datasets/", {"name": "corpus"}, format="json")
    assert response.status_code == 400 and "name" in response.json()
    assert [d["name"] for d in client.get("/api/v1/datasets/").json()["results"]] == ["corpus"]


def test_viewer_cannot_create(api):
    assert api("alpha", "viewer").post("/api/v1/datasets/", {"name": "x"}, format="json").status_code == 403


def test_register_uri_versions_are_numbered(api):
    client = api("alpha", "member")
    dataset = make_dataset(client)
    url = f"/api/v1/datasets/{dataset['id']}/versions/"
    first = client.post(url, {"uri": "s3://bucket/corpus/v1/", "format": "jsonl"}, format="json")
    second = client.post(url, {"uri": "https://example.org/corpus.txt", "format": "text",
                               "checksum_sha256": "a" * 64, "size_bytes": 10}, format="json")
    assert first.status_code == 201 and second.status_code == 201, second.json()
    assert (first.json()["version"], second.json()["version"]) == (1, 2)
    assert second.json()["reference"] == "dataset://corpus@2"
    listed = client.get(url).json()["results"]
    assert [v["version"] for v in listed] == [2, 1]


def test_register_bad_input_names_the_field(api):
    client = api("alpha", "member")
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    cases = [({"uri": "ftp://x/y"}, "uri"), ({"uri": "s3://b/k", "format": "exe"}, "format"),
             ({"uri": "s3://b/k", "checksum_sha256": "xyz"}, "checksum_sha256"),
             ({"uri": "s3://b/k", "size_bytes": -1}, "size_bytes"), ({}, "uri")]
    for body, field in cases:
        response = client.post(url, body, format="json")
        assert response.status_code == 400 and field in response.json(), (body, response.json())
    assert DatasetVersion.objects.count() == 0


def test_upload_stores_file_with_checksum(api, settings):
    client = api("alpha", "member")
    dataset = make_dataset(client)
    payload = b"the quick brown fox\n" * 1000
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("../../evil name.txt", payload), "format": "text"},
                           format="multipart")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["uploaded"] is True and body["size_bytes"] == len(payload)
    assert body["checksum_sha256"] == hashlib.sha256(payload).hexdigest()
    stored = Path(urlparse(DatasetVersion.objects.get(pk=body["id"]).uri).path)
    assert stored.read_bytes() == payload
    assert Path(settings.MEDIA_ROOT) in stored.parents and ".." not in stored.parts


def test_an_uploaded_version_shows_an_upload_uri_not_the_servers_storage_path(api, world, settings):
    """QA: an uploaded version's `uri` was `file:///<MEDIA_ROOT>/datasets/...`, a path on the control plane, in the
    API (and in a job's error when the file was gone). Members see `upload://<team>/<dataset>/v<n>/<file>`; the row
    keeps the stored path, which jobs read."""
    from controlplane.datasets.fetching import DatasetUnavailable, dataset_local_file

    client = api("alpha", "member")
    dataset = make_dataset(client)
    created = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                          {"file": SimpleUploadedFile("corpus.txt", b"abc"), "format": "text"},
                          format="multipart").json()
    shown = "upload://alpha/corpus/v1/corpus.txt"
    listed = api("alpha", "viewer").get(f"/api/v1/datasets/{dataset['id']}/versions/").json()["results"]
    assert created["uri"] == shown and [v["uri"] for v in listed] == [shown]
    media = str(settings.MEDIA_ROOT)
    assert media not in str(created) and media not in str(listed)
    version = DatasetVersion.objects.get(pk=created["id"])
    assert version.uri.startswith("file://") and dataset_local_file(version).read_bytes() == b"abc"
    dataset_local_file(version).unlink()
    with pytest.raises(DatasetUnavailable) as missing:
        dataset_local_file(version)
    assert shown in str(missing.value) and media not in str(missing.value)


def test_upload_over_the_limit_leaves_nothing(api, settings):
    settings.FLEETYARD_MAX_DATASET_UPLOAD_BYTES = 100
    client = api("alpha", "member")
    dataset = make_dataset(client)
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("big.bin", b"x" * 1000)}, format="multipart")
    assert response.status_code == 400 and "file" in response.json()
    assert DatasetVersion.objects.count() == 0
    leftovers = [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()]
    assert leftovers == []


def test_upload_failing_in_the_database_removes_the_file(api, settings, monkeypatch):
    client = api("alpha", "member")
    dataset = make_dataset(client)

    def boom(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr("controlplane.datasets.services.audit_record", boom)
    client.raise_request_exception = False
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("a.txt", b"abc")}, format="multipart")
    assert response.status_code == 500
    assert DatasetVersion.objects.count() == 0
    assert [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()] == []


def test_delete_dataset_removes_uploaded_files(api, settings):
    client = api("alpha", "member")
    dataset = make_dataset(client)
    body = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                       {"file": SimpleUploadedFile("a.txt", b"abc")}, format="multipart").json()
    path = Path(urlparse(DatasetVersion.objects.get(pk=body["id"]).uri).path)
    assert path.exists()
    from django.test import TestCase

    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204
    assert not Dataset.objects.exists() and not path.exists()


def test_dataset_in_use_by_a_live_job_cannot_be_deleted(api):
    client = api("alpha", "member")
    dataset = make_dataset(client)
    client.post(f"/api/v1/datasets/{dataset['id']}/versions/", {"uri": "s3://b/k"}, format="json")
    job = client.post("/api/v1/training-jobs/", {"name": "j", "queue": "default", "accelerator_types": ["cpu"],
                                                 "devices_per_worker": 0, "dataset": "dataset://corpus@1"},
                      format="json")
    assert job.status_code == 201, job.json()
    response = client.delete(f"/api/v1/datasets/{dataset['id']}/")
    assert response.status_code == 409
    assert Dataset.objects.filter(pk=dataset["id"]).exists()


def test_dataset_cited_by_a_finished_job_is_a_409_not_a_500(api):
    """Found by QA: a finished job keeps its dataset version (PROTECT), and deleting the dataset under it was a 500.
    Now a 409 names the jobs; nothing is deleted; once those jobs are deleted the dataset can be."""
    client = api("alpha", "member")
    dataset = make_dataset(client)
    client.post(f"/api/v1/datasets/{dataset['id']}/versions/", {"uri": "s3://b/k"}, format="json")
    job = client.post("/api/v1/training-jobs/", {"name": "j", "queue": "default", "accelerator_types": ["cpu"],
                                                 "devices_per_worker": 0, "dataset": "dataset://corpus@1"},
                      format="json").json()
    from jobs.models import TrainingJob

    TrainingJob.objects.filter(pk=job["id"]).update(state="FAILED")
    response = client.delete(f"/api/v1/datasets/{dataset['id']}/")
    assert response.status_code == 409, response.content
    assert str(job["id"]) in response.json()["detail"]
    assert DatasetVersion.objects.filter(dataset_id=dataset["id"]).count() == 1
    assert client.delete(f"/api/v1/training-jobs/{job['id']}/").status_code == 204
    assert client.delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204


def test_size_beyond_a_64_bit_integer_is_a_field_error(api):
    """Found by QA: a size_bytes too large for the column was a 500 at the insert."""
    client = api("alpha", "member")
    dataset = make_dataset(client)
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/", {"uri": "s3://b/k", "size_bytes": 2**63},
                           format="json")
    assert response.status_code == 400 and "size_bytes" in response.json()
    assert not DatasetVersion.objects.exists()
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"uri": "s3://b/k", "size_bytes": 2**63 - 1}, format="json")
    assert response.status_code == 201 and response.json()["version"] == 1


@pytest.mark.parametrize(("extra", "field"), [
    ({"size_bytes": 5}, "size_bytes"),
    ({"checksum_sha256": hashlib.sha256(b"something else").hexdigest()}, "checksum_sha256"),
    ({"checksum_sha256": "ABC"}, "checksum_sha256"),
])
def test_an_upload_that_does_not_match_its_size_or_checksum_is_refused(api, settings, extra, field):
    """Found by QA: size_bytes and checksum_sha256 sent with a file were silently ignored, so an upload the client
    meant to verify was stored whatever arrived. Now a mismatch is a 400 naming the field, and nothing remains."""
    client = api("alpha", "member")
    dataset = make_dataset(client)
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("a.txt", b"abc"), **extra}, format="multipart")
    assert response.status_code == 400 and field in response.json(), response.json()
    assert DatasetVersion.objects.count() == 0
    assert [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()] == []
    good = {"size_bytes": 3, "checksum_sha256": hashlib.sha256(b"abc").hexdigest()}
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("a.txt", b"abc"), **good}, format="multipart")
    assert response.status_code == 201 and response.json()["version"] == 1, response.json()


@pytest.mark.parametrize("uri", ["https://user:hunter2@example.org/corpus.txt", "s3://AKIAEXAMPLE:hunter2@bucket/k",
                                 "hf://user:hunter2@datasets/corpus", "https://hunter2@example.org/corpus.txt",
                                 "ftp://user:hunter2@example.org/corpus.txt", "gs://hunter2@bucket/k"])
def test_credentials_in_a_uri_are_refused_and_not_repeated(api, uri):
    """Found by QA: `https://user:password@host/...` and `s3://KEY:SECRET@bucket/...` were registered as sent and shown
    to every member of the team (viewers included) in the version list and kept in the audit log; an unsupported
    scheme's error repeated the URI, password and all."""
    from controlplane.tenancy.models import AuditEvent

    client = api("alpha", "member")
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    audit = AuditEvent.objects.count()
    response = client.post(url, {"uri": uri}, format="json")
    assert response.status_code == 400 and "credentials" in response.json()["uri"][0], response.json()
    assert "hunter2" not in response.content.decode()
    assert not DatasetVersion.objects.exists() and AuditEvent.objects.count() == audit
    assert client.post(url, {"uri": "https://example.org/corpus.txt?X-Amz-Signature=abc"},
                       format="json").status_code == 201  # a pre-signed URL is taken


def test_a_version_registered_with_credentials_before_they_were_refused_shows_them_masked(api, world):
    """Versions registered before credentials were refused still hold them: members see them masked (jobs still read
    the stored URI)."""
    from django.test import Client

    client = api("alpha", "member")
    dataset = make_dataset(client)
    version = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                          {"uri": "https://example.org/corpus.txt"}, format="json").json()
    DatasetVersion.objects.filter(pk=version["id"]).update(uri="https://user:hunter2@example.org/corpus.txt")
    listed = api("alpha", "viewer").get(f"/api/v1/datasets/{dataset['id']}/versions/").json()["results"]
    assert [v["uri"] for v in listed] == ["https://***@example.org/corpus.txt"]
    page = Client()
    page.force_login(world["alpha"]["viewer"])
    html = page.get("/datasets/").content.decode()
    assert "https://***@example.org/corpus.txt" in html and "hunter2" not in html
    assert DatasetVersion.objects.get(pk=version["id"]).uri == "https://user:hunter2@example.org/corpus.txt"


@pytest.mark.parametrize("uri,why", [
    ("https://exa mple.org/x", "no spaces"), ("https://example.org/my file.txt", "no spaces"),
    ("https://example.org/a\tb", "no spaces"), ("hf:foo", "names no host or bucket"),
    ("s3:bucket/key", "names no host or bucket"), ("az:container", "names no host or bucket"),
])
def test_a_uri_no_reader_could_open_is_refused_at_registration(api, uri, why):
    """QA (2026-11-29): these were registered and could only fail when a job read them."""
    client = api("alpha", "member")
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    response = client.post(url, {"uri": uri}, format="json")
    assert response.status_code == 400 and why in response.json()["uri"][0], response.json()
    assert not DatasetVersion.objects.exists()


def test_two_uploads_of_one_file_name_at_once_keep_their_own_bytes(world, settings, monkeypatch):
    """Uploads staged their file at `.staging/<name>`: a second upload of the same name, stored while the first was
    between storing and moving its file, replaced the first's bytes (the first then failed, or kept the other's
    content under its own checksum; QA). Each upload stages in a folder of its own, removed afterwards."""
    from controlplane.datasets import services, storage
    from controlplane.datasets.services import dataset_create, dataset_version_upload

    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["member"], team=alpha["team"], name="corpus")
    real_store, nested = storage.store_stream, []

    def store_then_let_another_upload_in(**kwargs):
        stored = real_store(**kwargs)
        if not nested:
            nested.append(None)  # (the second upload stores without letting a third in)
            nested[0] = dataset_version_upload(actor=alpha["member"], dataset=dataset,
                                               upload=SimpleUploadedFile("data.txt", b"second upload"))
        return stored

    monkeypatch.setattr(services.storage, "store_stream", store_then_let_another_upload_in)
    first = dataset_version_upload(actor=alpha["member"], dataset=dataset,
                                   upload=SimpleUploadedFile("data.txt", b"first upload"))
    second = nested[0]
    for version, content in ((first, b"first upload"), (second, b"second upload")):
        path = Path(urlparse(version.uri).path)
        assert path.read_bytes() == content, version
        assert version.checksum_sha256 == hashlib.sha256(content).hexdigest()
    staging = Path(settings.MEDIA_ROOT) / "datasets" / "alpha" / "corpus" / ".staging"
    assert not staging.exists() or list(staging.iterdir()) == []


@pytest.mark.parametrize("uri", ["https://[abc/x", "s3://[bucket/k", "https://user:hunter2@[::1/x", "hf://a]b/x"])
def test_a_uri_python_cannot_parse_is_a_field_error_not_a_500(api, uri):
    """QA (2026-12-07): a URI with an unclosed IPv6 bracket (`https://[abc/x`) made the URL parser raise, a 500."""
    client = api("alpha", "member")
    client.raise_request_exception = False
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    response = client.post(url, {"uri": uri}, format="json")
    assert response.status_code == 400 and "uri" in response.json(), response.content
    assert "hunter2" not in response.content.decode()
    assert not DatasetVersion.objects.exists()


def test_an_upload_whose_dataset_is_deleted_meanwhile_is_a_409_and_leaves_no_file(api, settings, monkeypatch):
    """QA (2026-12-07): a dataset deleted while a file was uploading to it made the upload a 500 (the dataset row was
    gone when the version was numbered). Now a 409; the staged file is removed."""
    from controlplane.datasets import services, storage

    client = api("alpha", "member")
    client.raise_request_exception = False
    dataset = make_dataset(client)
    real_store = storage.store_stream

    def store_then_delete_the_dataset(**kwargs):
        stored = real_store(**kwargs)
        Dataset.objects.filter(pk=dataset["id"]).delete()
        return stored

    monkeypatch.setattr(services.storage, "store_stream", store_then_delete_the_dataset)
    response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                           {"file": SimpleUploadedFile("a.txt", b"abc")}, format="multipart")
    assert response.status_code == 409 and "deleted" in response.json()["detail"], response.content
    assert not DatasetVersion.objects.exists()
    assert [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("body,field", [
    ({"file": [SimpleUploadedFile("a.txt", b"first"), SimpleUploadedFile("b.txt", b"second")]}, "file"),
    ({"uri": ["s3://bucket/one", "s3://bucket/two"]}, "uri"),
    ({"file": SimpleUploadedFile("a.txt", b"abc"), "format": ["text", "jsonl"]}, "format"),
])
def test_a_field_given_twice_in_an_upload_or_registration_is_refused(api, settings, body, field):
    """QA: two `file` parts (or two `uri` fields) in one request stored only the last; now a 400 naming the field,
    and nothing is stored."""
    client = api("alpha", "member")
    response = client.post(f"/api/v1/datasets/{make_dataset(client)['id']}/versions/", body, format="multipart")
    assert response.status_code == 400 and "more than once" in response.json()[field][0], response.json()
    assert not DatasetVersion.objects.exists()
    assert [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()] == []


def _multipart_upload(client, dataset_id, disposition: bytes, extra: bytes = b""):
    body = (extra + b'--B0UND\r\nContent-Disposition: form-data; name="file"; ' + disposition +
            b"\r\nContent-Type: text/plain\r\n\r\nabc\r\n--B0UND--\r\n")
    return client.generic("POST", f"/api/v1/datasets/{dataset_id}/versions/", body,
                          content_type="multipart/form-data; boundary=B0UND")


@pytest.mark.parametrize("disposition,why", [
    (b'filename="\xff\xfedata.txt"', "could not be decoded"),  # not UTF-8: Django's parser dropped the whole part
    (b"filename*=no-such-charset''data.txt", "could not be decoded"),
    (b"filename*=utf-8''%ff%fedata.txt", "could not be decoded"),
    (b'filename=".."', "is empty once"),
    (b'filename="\x01\x02"', "is empty once"),
])
def test_an_upload_whose_file_name_cannot_be_read_names_the_file_field(api, settings, disposition, why):
    """QA: Django's multipart parser drops a file part whose name it cannot decode (or that is nothing once cleaned)
    without a word, so the upload was refused for a missing `uri`. The 400 names `file` and says why."""
    client = api("alpha", "member")
    response = _multipart_upload(client, make_dataset(client)["id"], disposition)
    assert response.status_code == 400 and why in response.json()["file"][0], response.content
    assert "uri" not in response.json()
    assert not DatasetVersion.objects.exists()
    assert [p for p in Path(settings.MEDIA_ROOT).rglob("*") if p.is_file()] == []


def test_an_upload_named_in_utf8_is_still_stored(api):
    client = api("alpha", "member")
    dataset_id = make_dataset(client)["id"]
    plain = _multipart_upload(client, dataset_id, 'filename="données.txt"'.encode())
    encoded = _multipart_upload(client, dataset_id, b"filename*=UTF-8''donn%C3%A9es.txt")
    # a first part larger than a read of the body: the file part's headers straddle two reads
    padded = _multipart_upload(client, dataset_id, b'filename="a.txt"', extra=(
        b'--B0UND\r\nContent-Disposition: form-data; name="description"\r\n\r\n' + b"x" * (64 * 1024 - 70) + b"\r\n"))
    for response in (plain, encoded, padded):
        assert response.status_code == 201, response.content
    assert padded.json()["description"] == "x" * (64 * 1024 - 70)


def test_the_multipart_watch_finds_a_dropped_part_whatever_the_read_sizes():
    """The watch sees the body in the reads Django's parser makes: a part's headers may be split across them."""
    import io

    from controlplane.common.parsers import _PartHeaderWatch

    body = (b"preamble\r\n--B0UND\r\nContent-Disposition: form-data; name=\"format\"\r\n\r\ntext\r\n"
            b"--B0UND\r\nContent-Disposition: form-data; name=\"upload\"; filename=\"\xff.txt\"\r\n\r\nabc\r\n"
            b"--B0UND\r\nContent-Disposition: form-data; name=\"ok\"; filename=\"a.txt\"\r\n\r\n--B0UND-\r\n"
            b"--B0UND--\r\n")

    class Trickle(io.BytesIO):
        def __init__(self, data, size):
            super().__init__(data)
            self.size = size

        def read(self, *args):
            return super().read(self.size)

    for size in range(1, len(body) + 1):
        watch = _PartHeaderWatch(Trickle(body, size), b"B0UND")
        read = b""
        while chunk := watch.read(65536):
            read += chunk
        assert read == body
        assert list(watch.dropped) == ["upload"], size


@pytest.mark.parametrize("uri,why", [
    ("https://a..b/x", "empty label"), ("https://.example.org/x", "empty label"),
    ("https://example..org./x", "empty label"), ("s3://my..bucket/key", "empty label"),
    ("https://example.org:0/x", "port 0"), ("http://example.org:00/x", "port 0"), ("s3://bucket:0/key", "port 0"),
    ("https://example.org:65536/x", "invalid port"), ("https://example.org:99999/x", "invalid port"),
    ("https://example.org:http/x", "invalid port"), ("https://:443/x", "names no host"),
    (f"https://{'a' * 64}.example.org/x", "64 characters"),
    (f"https://{'.'.join(['abcdefgh'] * 30)}/x", "at most 253"),
])
def test_a_uri_with_an_unusable_host_or_port_is_refused_at_registration(api, uri, why):
    """QA: `https://a..b/x` (an empty DNS label) and a URL with port 0 were registered and failed only when a job
    read them (port 0 was even checked as the default port)."""
    client = api("alpha", "member")
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    response = client.post(url, {"uri": uri}, format="json")
    assert response.status_code == 400 and why in response.json()["uri"][0], response.json()
    assert not DatasetVersion.objects.exists()


def test_hosts_and_ports_a_reader_can_open_are_still_registered(api):
    client = api("alpha", "member")
    url = f"/api/v1/datasets/{make_dataset(client)['id']}/versions/"
    for uri in ("https://example.org./corpus.txt", "https://example.org:8443/x", "http://example.org:65535/x",
                "https://[2606:4700:4700::1111]:443/x", "https://bücher.example/x", "s3://my.bucket.name/key",
                f"https://{'a' * 63}.example.org/x", "hf://datasets/org/name", "gs://bucket/k", "az://container/k"):
        assert client.post(url, {"uri": uri}, format="json").status_code == 201, uri


def test_deleting_a_dataset_removes_the_folders_it_leaves_empty_and_nothing_else(api, settings):
    """QA: a delete removed the uploaded files but left `datasets/<team>/<dataset>/v<n>/` (and `.staging/`) on disk,
    empty. They go with the dataset; another dataset's folder and the team's folder stay."""
    from django.test import TestCase

    client = api("alpha", "member")
    corpus, other = make_dataset(client), make_dataset(client, "other")
    for dataset in (corpus, corpus, other):
        response = client.post(f"/api/v1/datasets/{dataset['id']}/versions/",
                               {"file": SimpleUploadedFile("a.txt", b"abc")}, format="multipart")
        assert response.status_code == 201, response.json()
    team = Path(settings.MEDIA_ROOT) / "datasets" / "alpha"
    assert (team / "corpus" / "v2" / "a.txt").is_file() and (team / "corpus" / ".staging").is_dir()
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/datasets/{corpus['id']}/").status_code == 204
    assert not (team / "corpus").exists()
    assert (team / "other" / "v1" / "a.txt").read_bytes() == b"abc"


def test_a_dataset_is_deleted_even_when_its_files_cannot_be_removed(api, settings, monkeypatch, caplog):
    """Removing the files runs after the delete committed: a failure there is logged, not raised (it was raised out
    of the commit, after the rows were gone)."""
    from django.test import TestCase

    from controlplane.datasets import storage

    client = api("alpha", "member")
    dataset = make_dataset(client)
    client.post(f"/api/v1/datasets/{dataset['id']}/versions/", {"file": SimpleUploadedFile("a.txt", b"abc")},
                format="multipart")

    def refuse(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(storage, "remove_stored", refuse)
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204
    assert not Dataset.objects.exists()
    assert "Permission denied" in caplog.text and "left on disk" in caplog.text
    assert (Path(settings.MEDIA_ROOT) / "datasets" / "alpha" / "corpus" / "v1" / "a.txt").is_file()


def test_deleting_a_dataset_removes_files_under_a_storage_path_with_a_space(api, settings, tmp_path):
    """A stored path is kept as a file:// URI, percent-encoded: the delete removed the undecoded path (`%20`), so
    under a storage root with a space in it the file stayed."""
    from django.test import TestCase

    settings.MEDIA_ROOT = tmp_path / "media root"
    client = api("alpha", "member")
    dataset = make_dataset(client)
    client.post(f"/api/v1/datasets/{dataset['id']}/versions/", {"file": SimpleUploadedFile("a.txt", b"abc")},
                format="multipart")
    assert (settings.MEDIA_ROOT / "datasets" / "alpha" / "corpus" / "v1" / "a.txt").is_file()
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204
    assert not (settings.MEDIA_ROOT / "datasets" / "alpha" / "corpus").exists()
