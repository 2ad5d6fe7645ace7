"""S4 (issue 8): server-side request forgery through dataset URIs, checked at the API (registration) and
where the platform fetches (the launch of a job that reads the dataset). A local listener counts every
connection that gets through; the count must stay 0 for every internal address form."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from controlplane.common import netguard
from controlplane.datasets.fetching import DatasetUnavailable, dataset_local_file
from controlplane.datasets.models import DatasetVersion
from controlplane.datasets.services import dataset_create
from tests.conftest import client_for

PUBLIC = "93.184.216.34"  # a globally routable address (the fake resolver's answer for public names)


class Listener:
    """An HTTP server on 127.0.0.1 that counts the connections it accepts; optionally redirects."""

    def __init__(self, body: bytes = b"the quick brown fox\n", redirect: str | None = None):
        self.connections = 0
        self.body, self.redirect = body, redirect
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if outer.redirect:
                    self.send_response(302)
                    self.send_header("Location", outer.redirect)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            def verify_request(self, request, client_address):
                outer.connections += 1
                return True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def fake_dns(monkeypatch):
    """Names the tests use: public ones answer a public address; the others answer internal ones."""
    real = netguard.resolve
    table = {"files.example.com": [PUBLIC], "intranet.example.com": ["10.1.2.3"],
             "sneaky.example.com": [PUBLIC, "127.0.0.1"], "v6.example.com": ["::1"],
             "metadata.example.com": ["169.254.169.254"]}

    def resolve(host, port):
        return table[host] if host in table else real(host, port)

    monkeypatch.setattr(netguard, "resolve", resolve)
    return table


def internal_forms(port: int) -> list[str]:
    """Every spelling of an internal address a URI can use (the listener is on 127.0.0.1:port)."""
    hosts = ["127.0.0.1", "localhost", "LOCALHOST.", "2130706433", "0x7f000001", "0177.0.0.1", "127.1",
             "0.0.0.0", "0", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "[64:ff9b::7f00:1]",  # noqa: S104
             "[2002:7f00:1::]", "169.254.169.254", "[fe80::1]", "10.0.0.1", "172.16.0.1", "192.168.1.1",
             "100.64.0.1", "[fd00::1]", "[fd00:ec2::254]", "224.0.0.1", "240.0.0.1", "metadata.google.internal",
             "intranet.example.com", "sneaky.example.com", "v6.example.com", "metadata.example.com",
             "foo.localhost"]
    urls = [f"http://{host}:{port}/data.txt" for host in hosts]
    urls += [f"https://{host}:{port}/data.txt" for host in ("127.0.0.1", "[::1]", "2130706433")]
    urls += [f"http://user:pw@127.0.0.1:{port}/", f"http://127.0.0.1:{port}@127.0.0.1:{port}/"]
    return urls


OTHER_SCHEMES = ["file:///etc/passwd", "file://localhost/etc/passwd", "gopher://127.0.0.1:70/", "ftp://10.0.0.1/x",
                 "dict://127.0.0.1:11211/", "ldap://127.0.0.1/", "jar:http://127.0.0.1/x!/", "data:text/plain,hi",
                 "javascript:alert(1)", "//127.0.0.1/x"]


@pytest.fixture
def dataset(world):
    return dataset_create(actor=world["alpha"]["admin"], team=world["alpha"]["team"], name="corpus")


def test_the_api_refuses_every_internal_form_and_writes_nothing(world, dataset, listener, fake_dns):
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    url = f"/api/v1/datasets/{dataset.pk}/versions/"
    refused = 0
    for uri in internal_forms(listener.port) + OTHER_SCHEMES:
        response = client.post(url, {"uri": uri, "format": "text"}, format="json")
        assert response.status_code == 400, (uri, response.status_code, response.content)
        assert "uri" in response.json(), (uri, response.json())
        refused += 1
    assert not DatasetVersion.objects.filter(dataset=dataset).exists()
    print(f"\nSSRF at the API: {refused} URIs refused with a 400 naming `uri`; connections that got through: "
          f"{listener.connections}")
    assert listener.connections == 0


def test_the_api_accepts_public_hosts_and_names_it_cannot_resolve_yet(world, dataset, fake_dns):
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    url = f"/api/v1/datasets/{dataset.pk}/versions/"
    for uri in ("https://files.example.com/corpus.txt", f"http://{PUBLIC}/corpus.txt", "s3://bucket/key",
                "https://no-such-name.invalid/corpus.txt"):
        assert client.post(url, {"uri": uri}, format="json").status_code == 201, uri


def _row(dataset, uri: str, **extra) -> DatasetVersion:
    """A version row written straight to the database: the fetch must not trust what the API checked."""
    number = DatasetVersion.objects.filter(dataset=dataset).count() + 1
    return DatasetVersion.objects.create(dataset=dataset, version=number, uri=uri, **extra)


def test_the_fetch_refuses_every_internal_form(world, dataset, listener, fake_dns):
    refused = 0
    for uri in internal_forms(listener.port) + OTHER_SCHEMES:
        with pytest.raises(DatasetUnavailable):
            dataset_local_file(_row(dataset, uri))
        refused += 1
    print(f"\nSSRF at the fetch: {refused} URIs refused; connections that got through: {listener.connections}")
    assert listener.connections == 0


def test_dns_rebinding_between_the_check_and_the_connection_gets_nowhere(world, dataset, listener, monkeypatch):
    answers = iter([[PUBLIC], ["127.0.0.1"], ["127.0.0.1"]])
    monkeypatch.setattr(netguard, "resolve", lambda host, port: next(answers))
    with pytest.raises(DatasetUnavailable, match="127.0.0.1"):
        dataset_local_file(_row(dataset, f"http://rebind.example.com:{listener.port}/data.txt"))
    assert listener.connections == 0


def test_stored_files_are_read_only_from_inside_the_platforms_storage(world, dataset, settings, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("host secrets")
    with pytest.raises(DatasetUnavailable, match="outside the platform's dataset storage"):
        dataset_local_file(_row(dataset, outside.as_uri(), uploaded=True))
    storage = settings.MEDIA_ROOT / "datasets"
    storage.mkdir(parents=True)
    link = storage / "link.txt"
    os.symlink(outside, link)
    with pytest.raises(DatasetUnavailable, match="outside the platform's dataset storage"):
        dataset_local_file(_row(dataset, link.as_uri(), uploaded=True))
    inside = storage / "real.txt"
    inside.write_text("ok")
    assert dataset_local_file(_row(dataset, inside.as_uri(), uploaded=True)) == inside
    with pytest.raises(DatasetUnavailable):  # registered (not uploaded) file rows are never read
        dataset_local_file(_row(dataset, inside.as_uri(), uploaded=False))


def test_an_allowed_mirror_is_fetched_and_verified(world, dataset, listener, settings):
    settings.FLEETYARD_FETCH_ALLOW_HOSTS = [f"127.0.0.1:{listener.port}"]
    digest = hashlib.sha256(listener.body).hexdigest()
    path = dataset_local_file(_row(dataset, f"http://127.0.0.1:{listener.port}/data.txt", checksum_sha256=digest))
    assert path.read_bytes() == listener.body
    wrong = _row(dataset, f"http://127.0.0.1:{listener.port}/other.txt", checksum_sha256="0" * 64)
    with pytest.raises(DatasetUnavailable, match="does not match its registered SHA-256"):
        dataset_local_file(wrong)
    assert not (settings.MEDIA_ROOT / f"datasets/fetched/v{wrong.pk}/data").exists()


@pytest.mark.parametrize("target", ["http://127.0.0.1:{port}/", "http://localhost:{port}/", "http://[::1]:{port}/",
                                    "http://2130706433:{port}/", "file:///etc/passwd",
                                    "http://169.254.169.254/latest/meta-data/"])
def test_a_redirect_to_an_internal_address_is_not_followed(world, dataset, listener, settings, target):
    mirror = Listener(redirect=target.format(port=listener.port))
    try:
        settings.FLEETYARD_FETCH_ALLOW_HOSTS = [f"127.0.0.1:{mirror.port}"]
        with pytest.raises(DatasetUnavailable):
            dataset_local_file(_row(dataset, f"http://127.0.0.1:{mirror.port}/data.txt"))
        assert mirror.connections == 1
    finally:
        mirror.close()
    assert listener.connections == 0


def test_a_job_whose_dataset_is_refused_fails_with_the_reason_and_frees_its_quota(world, dataset, listener):
    from controlplane.compute.registry import get_compute_backend
    from jobs import workflows
    from jobs.models import TrainingJob
    from jobs.selectors import quota_usage
    from jobs.services import training_job_create
    from jobs.states import JobState

    version = _row(dataset, f"http://127.0.0.1:{listener.port}/data.txt")
    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="reads-internal",
                              local_queue=alpha["queue"], accelerator_types=["cpu"], dataset_version=version)
    TrainingJob.objects.filter(pk=job.pk).update(
        state=JobState.ADMITTED, admitted_accelerator_type="cpu",
        placement=[{"node": "cpu-pool-0", "worker": 0}])
    assert quota_usage().get(("shared", "cpu"))
    job = workflows.training_job_launch(job_id=job.pk, backend=get_compute_backend())
    assert job.state == JobState.FAILED
    reason = job.events.order_by("-id").first().reason
    assert "was not fetched" in reason and "127.0.0.1" in reason and "loopback" in reason
    assert not quota_usage().get(("shared", "cpu"))
    assert listener.connections == 0


def test_resolver_errors_are_refusals(monkeypatch):
    def broken(host, port):
        raise socket.gaierror("no")

    monkeypatch.setattr(netguard, "resolve", broken)
    with pytest.raises(netguard.UnsafeURL, match="does not resolve"):
        netguard.check_url("https://files.example.com/x")
    assert netguard.check_url("https://files.example.com/x", require_resolution=False) == []


def test_a_failed_fetch_does_not_repeat_credentials_a_legacy_version_holds(world, dataset, settings):
    """A version registered before credentials in a URI were refused still holds them (members see them masked:
    `shown_uri`); a fetch that failed repeated the stored URI, password included, in the reason a job's timeline
    and error show."""
    with socket.socket() as probe:  # a port nothing listens on: the connection is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.FLEETYARD_FETCH_ALLOW_HOSTS = [f"127.0.0.1:{port}"]
    with pytest.raises(DatasetUnavailable) as refused:
        dataset_local_file(_row(dataset, f"http://user:hunter2@127.0.0.1:{port}/data.txt"))
    assert "hunter2" not in str(refused.value) and f"http://***@127.0.0.1:{port}/data.txt" in str(refused.value)


@pytest.mark.parametrize("url, says", [("https://user:s3cret@example.org:99999/x", "has an invalid port"),
                                       # port 0 was taken for none and checked as 443 (QA)
                                       ("https://user:s3cret@example.org:0/x", "has an invalid port"),
                                       ("https://user:s3cret@/x", "names no host")])
def test_a_refused_url_does_not_repeat_its_credentials(url, says):
    """Two refusals repeated the whole URL, so a legacy dataset version's password could reach a job's failure
    reason, which every member of its team reads (QA)."""
    with pytest.raises(netguard.UnsafeURL) as refused:
        netguard.check_target(url)
    assert says in str(refused.value) and "s3cret" not in str(refused.value) and "***@" in str(refused.value)


def test_deleting_a_dataset_removes_the_fetched_copies_of_its_versions(world, dataset, listener, settings):
    """QA (2026-12-07): an https version a job read is fetched to storage/datasets/fetched/v<pk>/data; deleting the
    dataset removed only uploaded files, and those fetched copies stayed on disk for good."""
    from django.test import TestCase

    from controlplane.datasets.services import dataset_delete

    settings.FLEETYARD_FETCH_ALLOW_HOSTS = [f"127.0.0.1:{listener.port}"]
    path = dataset_local_file(_row(dataset, f"http://127.0.0.1:{listener.port}/data.txt"))
    assert path.is_file()
    with TestCase.captureOnCommitCallbacks(execute=True):
        dataset_delete(actor=world["alpha"]["admin"], dataset=dataset)
    assert not path.exists() and not path.parent.exists()
    assert [p for p in settings.MEDIA_ROOT.rglob("*") if p.is_file()] == []
