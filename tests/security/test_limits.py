"""S6 (issue 8): limits on what one request may ask for, each a fast 4xx naming the field and the reason, with
memory bounded (OWASP API4, unrestricted resource consumption).

- request body: a body over FLEETYARD_MAX_REQUEST_BODY_BYTES is a 413 from its Content-Length alone; the test
  feeds a 1 GiB body from a counting stream and shows that 0 bytes of it are read and that handling it
  allocates almost nothing (tracemalloc), against the same request without the limit, whose body the JSON
  parser read whole. Dataset uploads (multipart) have their own limit, checked the same way, before the
  upload is spooled to a temporary file.
- page size: ?page_size=10^9 is capped (FLEETYARD_MAX_PAGE_SIZE): the query asks the database for that many
  rows, no more.
- workers and devices per job, replicas per deployment: 400 naming the field, nothing written.
- submissions per team per minute: 429 with Retry-After for training jobs, deployments and spec apply, counted
  in the database (concurrent submitters on separate connections, like separate web processes, cannot exceed
  it), per team, and not given back by cancelling and deleting.

`pytest tests/security/test_limits.py -s` prints the figures.
"""

from __future__ import annotations

import threading
import time
import tracemalloc
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.datasets.models import DatasetVersion
from controlplane.datasets.services import dataset_create
from controlplane.tenancy.models import AuditEvent
from controlplane.tenancy.services import api_token_create
from inference.models import Deployment
from jobs.models import TrainingJob
from jobs.services import training_job_create
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY

GIB = 1024**3
MIB = 1024**2


class CountingBody:
    """A WSGI input stream of `size` bytes made on demand (never held in memory), counting what is read."""

    def __init__(self, size: int, *, head: bytes = b"", tail: bytes = b"", filler: bytes = b"7"):
        self.head, self.tail, self.filler = head, tail, filler
        self.size = size
        self.read_bytes = 0

    def _byte_range(self, start: int, end: int) -> bytes:
        out = bytearray()
        head_end, tail_start = len(self.head), self.size - len(self.tail)
        if start < head_end:
            out += self.head[start:min(end, head_end)]
        middle = max(0, min(end, tail_start) - max(start, head_end))
        out += self.filler * middle
        if end > tail_start:
            out += self.tail[max(0, start - tail_start):end - tail_start]
        return bytes(out)

    def read(self, size: int = -1) -> bytes:
        remaining = self.size - self.read_bytes
        size = remaining if size is None or size < 0 else min(size, remaining)
        chunk = self._byte_range(self.read_bytes, self.read_bytes + size)
        self.read_bytes += size
        return chunk

    def readline(self, size: int = -1) -> bytes:
        remaining = self.size - self.read_bytes
        limit = remaining if size is None or size < 0 else min(size, remaining)
        data = self._byte_range(self.read_bytes, self.read_bytes + min(limit, 64 * 1024))
        cut = data.find(b"\n")
        data = data if cut < 0 else data[:cut + 1]
        self.read_bytes += len(data)
        return data


def _token(world, team="alpha", role="member") -> str:
    user = world[team][role]
    return api_token_create(actor=user, team=world[team]["team"], user=user, name="s6")[1]


def _send(client: Client, path: str, body: CountingBody, content_type: str):
    """POST `body` through the whole Django stack (middleware included); returns (response, seconds, peak
    bytes allocated while handling it)."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        response = client.generic("POST", path, content_type=content_type, **{
            "wsgi.input": body, "CONTENT_LENGTH": str(body.size), "CONTENT_TYPE": content_type})
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return response, elapsed, peak


# ---- request bodies --------------------------------------------------------------------------------------------


def test_an_oversized_json_body_is_a_413_before_any_of_it_is_read(world, settings):
    token = _token(world)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    jobs_before = TrainingJob.objects.count()
    body = CountingBody(GIB, head=b'{"name": "', filler=b"a")
    response, elapsed, peak = _send(client, "/api/v1/training-jobs/", body, "application/json")
    assert response.status_code == 413, response.content
    reason = response.json()["body"][0]
    assert f"{GIB} bytes" in reason and str(settings.FLEETYARD_MAX_REQUEST_BODY_BYTES) in reason
    assert "FLEETYARD_MAX_REQUEST_BODY_BYTES" in reason
    assert body.read_bytes == 0
    assert peak < 2 * MIB, peak
    assert elapsed < 2.0
    assert TrainingJob.objects.count() == jobs_before
    print(f"\n[S6] 1 GiB JSON body: 413 in {elapsed * 1000:.1f} ms, {body.read_bytes} bytes read, "
          f"peak {peak / 1024:.0f} KiB allocated")

    # The same request with the limit taken out (the platform before S6): Django's form-data limit refused it
    # without reading it too, but as a bare "Bad Request (400)" page naming no field or reason.
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.endswith("RequestBodyLimitMiddleware")]
    unguarded = Client(HTTP_AUTHORIZATION=f"Bearer {token}", raise_request_exception=False)
    body = CountingBody(GIB, head=b'{"name": "', filler=b"a")
    response, _, _ = _send(unguarded, "/api/v1/training-jobs/", body, "application/json")
    assert response.status_code == 400 and not response["Content-Type"].startswith("application/json")
    print(f"[S6] without the limit: {response.status_code} {response['Content-Type']} "
          f"{response.content[:40]!r}, {body.read_bytes} bytes read")


def test_a_body_within_the_limit_still_works_and_one_byte_over_does_not(world, settings):
    settings.FLEETYARD_MAX_REQUEST_BODY_BYTES = 4096
    client = Client(HTTP_AUTHORIZATION=f"Bearer {_token(world)}")
    import json

    small = json.dumps({**JOB_BODY, "name": "fits"})
    assert client.post("/api/v1/training-jobs/", small, content_type="application/json").status_code == 201
    padded = json.dumps({**JOB_BODY, "name": "too-big", "hyperparameters": {}}).encode()
    padded = padded[:-1] + b" " * (4097 - len(padded)) + b"}"
    assert len(padded) == 4097
    response = client.post("/api/v1/training-jobs/", padded, content_type="application/json")
    assert response.status_code == 413 and "4097 bytes" in response.json()["body"][0]
    assert not TrainingJob.objects.filter(name="too-big").exists()


def _multipart(size_of_file: int) -> tuple[CountingBody, str]:
    boundary = "s6boundary"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"format\"\r\n\r\ntext\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.txt\"\r\n"
            "Content-Type: text/plain\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return (CountingBody(len(head) + size_of_file + len(tail), head=head, tail=tail),
            f"multipart/form-data; boundary={boundary}")


def test_a_dataset_upload_over_its_limit_is_a_413_before_it_is_spooled(world, settings, tmp_path):
    settings.FLEETYARD_MAX_REQUEST_BODY_BYTES = 64 * 1024
    settings.FLEETYARD_MAX_DATASET_UPLOAD_BYTES = 1 * MIB
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path / "spool")
    (tmp_path / "spool").mkdir()
    dataset = dataset_create(actor=world["alpha"]["member"], team=world["alpha"]["team"], name="corpus")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {_token(world)}")
    path = f"/api/v1/datasets/{dataset.pk}/versions/"

    # Over the general body limit but within the upload limit: accepted, stored whole.
    body, content_type = _multipart(300 * 1024)
    response, _, _ = _send(client, path, body, content_type)
    assert response.status_code == 201, response.content
    assert response.json()["size_bytes"] == 300 * 1024

    body, content_type = _multipart(GIB)
    response, elapsed, peak = _send(client, path, body, content_type)
    assert response.status_code == 413, response.content
    reason = response.json()["file"][0]
    assert "FLEETYARD_MAX_DATASET_UPLOAD_BYTES" in reason and str(1 * MIB) in reason
    assert body.read_bytes == 0 and peak < 2 * MIB and elapsed < 2.0
    assert list((tmp_path / "spool").iterdir()) == []
    assert DatasetVersion.objects.filter(dataset=dataset).count() == 1
    print(f"\n[S6] 1 GiB dataset upload (limit 1 MiB): 413 in {elapsed * 1000:.1f} ms, {body.read_bytes} bytes "
          f"read, peak {peak / 1024:.0f} KiB allocated, nothing spooled")

    # Without the limit (the platform before S6) the whole upload was read and spooled to a temporary file
    # before the service looked at its size: 16 MiB here, any size in general.
    settings.MIDDLEWARE = [m for m in settings.MIDDLEWARE if not m.endswith("RequestBodyLimitMiddleware")]
    unguarded = Client(HTTP_AUTHORIZATION=f"Bearer {_token(world)}")
    body, content_type = _multipart(16 * MIB)
    response, elapsed, _ = _send(unguarded, path, body, content_type)
    assert response.status_code == 400 and body.read_bytes == body.size
    print(f"[S6] without the limit: a 16 MiB upload was read whole ({body.read_bytes / MIB:.0f} MiB) before "
          f"its 400, in {elapsed * 1000:.0f} ms")
    settings.MIDDLEWARE = [*settings.MIDDLEWARE[:1], "controlplane.common.limits.RequestBodyLimitMiddleware",
                           *settings.MIDDLEWARE[1:]]

    # Any other path does not get the upload allowance, multipart or not.
    body, content_type = _multipart(300 * 1024)
    response, _, _ = _send(client, "/api/v1/datasets/", body, content_type)
    assert response.status_code == 413 and "body" in response.json()


def test_the_gateway_answers_an_oversized_body_in_openai_shape(world):
    client = Client(HTTP_AUTHORIZATION=f"Bearer {_token(world)}")
    body = CountingBody(GIB, head=b'{"model": "chat", "messages": [{"role": "user", "content": "')
    response, elapsed, _ = _send(client, "/v1/chat/completions", body, "application/json")
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and "FLEETYARD_MAX_REQUEST_BODY_BYTES" in error["message"]
    assert body.read_bytes == 0 and elapsed < 2.0


@pytest.mark.parametrize(("path", "content_type", "body"), [
    ("/api/v1/training-jobs/", "application/json", "[" * 100_000),
    ("/api/v1/datasets/", "application/json", '{"name": ' + "[" * 100_000),
    ("/api/v1/specs/apply/", "application/json", "{" + '"a": {' * 50_000),
    ("/api/v1/specs/apply/", "application/yaml", "[" * 3_000),
    ("/v1/chat/completions", "application/json", "[" * 100_000),
])
def test_a_body_nested_too_deeply_is_a_400_not_a_500(world, path, content_type, body):
    """100 KB of `[[[[...` made every JSON endpoint (and YAML specs) fail with RecursionError, a 500 (found by
    this test); now each says why."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {_token(world)}", raise_request_exception=False)
    started = time.perf_counter()
    response = client.post(path, body, content_type=content_type)
    elapsed = time.perf_counter() - started
    assert response.status_code == 400, (response.status_code, response.content[:300])
    assert "nested" in response.content.decode(), response.content[:300]
    assert elapsed < 2.0


@pytest.mark.parametrize(("label", "spec"), [
    ("a 60 KiB flow list", "name: x\nqueue: default\nenvs: {A: [" + ",".join(["1"] * 30_000) + "]}\n"),
    ("3,000 levels of [", "name: x\nqueue: default\nenvs: " + "[" * 3000),
    ("a spec over FLEETYARD_MAX_SPEC_BYTES", "name: x\nqueue: default\nrun: |\n" + "  echo hi\n" * 8000),
])
def test_a_spec_too_costly_to_parse_is_a_fast_400(world, api, label, spec):
    """Parsing YAML in Python costs about 0.1 ms per line or flow item: a 256 KiB flow list took 29 s of CPU on a
    web worker before the spec size and structure were bounded (found by this test's first version)."""
    started = time.perf_counter()
    response = api("alpha").post("/api/v1/specs/apply/", {"spec": spec}, format="json")
    elapsed = time.perf_counter() - started
    assert response.status_code == 400, response.content[:300]
    reason = str(response.json()["spec"])
    assert "at most" in reason or "no more than" in reason, reason
    assert elapsed < 2.0, f"{label}: {elapsed:.2f} s"
    print(f"\n[S6] spec apply, {label} ({len(spec) // 1024} KiB): 400 in {elapsed * 1000:.0f} ms: {reason[:100]}")


# ---- page size -------------------------------------------------------------------------------------------------


def test_a_huge_page_size_is_capped_in_the_query(world, api):
    alpha = world["alpha"]
    AuditEvent.objects.bulk_create([
        AuditEvent(team=alpha["team"], actor=alpha["member"], actor_label="s6", action="s6.fill",
                   target_type="x", target_id=str(i)) for i in range(620)])
    client = api("alpha", "admin")
    with CaptureQueriesContext(connection) as queries:
        started = time.perf_counter()
        response = client.get("/api/v1/audit-events/?page_size=1000000000")
        elapsed = time.perf_counter() - started
    assert response.status_code == 200
    body = response.json()
    from django.conf import settings

    cap = settings.FLEETYARD_MAX_PAGE_SIZE
    assert len(body["results"]) == cap == 500 and body["next"]
    assert body["count"] >= 620
    page_queries = [q["sql"] for q in queries.captured_queries if "tenancy_auditevent" in q["sql"]
                    and "LIMIT" in q["sql"]]
    assert page_queries and all(f"LIMIT {cap}" in sql for sql in page_queries), page_queries
    print(f"\n[S6] ?page_size=10^9 over {body['count']} rows: {len(body['results'])} returned (LIMIT {cap}) "
          f"in {elapsed * 1000:.0f} ms")


def test_the_page_size_cap_is_a_setting(world, api, settings):
    settings.FLEETYARD_MAX_PAGE_SIZE = 3
    for index in range(5):
        training_job_create(actor=world["alpha"]["member"], team=world["alpha"]["team"], name=f"j{index}",
                            local_queue=world["alpha"]["queue"], accelerator_types=["nvidia-h100"])
    body = api("alpha").get("/api/v1/training-jobs/?page_size=99999999999999999999").json()
    assert len(body["results"]) == 3 and body["count"] == 5


# ---- workers, devices, replicas --------------------------------------------------------------------------------


def _refused(response, field: str, *words: str, status: int = 400) -> float:
    assert response.status_code == status, response.content
    reasons = " ".join(response.json()[field])
    for word in words:
        assert word in reasons, reasons
    return reasons


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"workers_min": 1, "workers_max": 1025}, "workers_max", ("1024",)),
    ({"workers_min": 2000, "workers_max": 2000}, "workers_min", ("1024",)),
    ({"devices_per_worker": 65}, "devices_per_worker", ("64",)),
    ({"workers_min": 1, "workers_max": 200, "devices_per_worker": 64}, "workers_max",
     ("12800 devices", "8192", "FLEETYARD_MAX_DEVICES_PER_JOB")),
])
def test_an_oversized_job_is_a_400_naming_the_field(world, api, change, field, words):
    started = time.perf_counter()
    response = api("alpha").post("/api/v1/training-jobs/", {**JOB_BODY, **change}, format="json")
    elapsed = time.perf_counter() - started
    _refused(response, field, *words)
    assert elapsed < 2.0
    assert not TrainingJob.objects.exists()


def test_job_limits_are_settings_and_hold_for_spec_apply_and_retry(world, api, settings):
    settings.FLEETYARD_MAX_WORKERS_PER_JOB = 8
    settings.FLEETYARD_MAX_DEVICES_PER_WORKER = 4
    settings.FLEETYARD_MAX_DEVICES_PER_JOB = 16
    client = api("alpha")
    _refused(client.post("/api/v1/training-jobs/", {**JOB_BODY, "workers_max": 9, "devices_per_worker": 1},
                         format="json"), "workers_max", "FLEETYARD_MAX_WORKERS_PER_JOB")
    _refused(client.post("/api/v1/training-jobs/", {**JOB_BODY, "devices_per_worker": 8}, format="json"),
             "devices_per_worker", "FLEETYARD_MAX_DEVICES_PER_WORKER")
    _refused(client.post("/api/v1/training-jobs/", {**JOB_BODY, "workers_max": 5, "devices_per_worker": 4},
                         format="json"), "workers_max", "20 devices")
    spec = "kind: training_job\nname: big\nqueue: default\nworkers: 9\nresources: {accelerators: H100:1}\n"
    response = client.post("/api/v1/specs/apply/", {"spec": spec}, format="json")
    assert response.status_code == 400 and "FLEETYARD_MAX_WORKERS_PER_JOB" in str(response.json())
    assert not TrainingJob.objects.exists()

    # A job submitted under a higher limit is not retried past the lower one.
    settings.FLEETYARD_MAX_WORKERS_PER_JOB = 16
    job = training_job_create(actor=world["alpha"]["member"], team=world["alpha"]["team"], name="wide",
                              local_queue=world["alpha"]["queue"], accelerator_types=["cpu"], workers_min=12,
                              devices_per_worker=0)
    TrainingJob.objects.filter(pk=job.pk).update(state="FAILED")
    settings.FLEETYARD_MAX_WORKERS_PER_JOB = 8
    _refused(client.post(f"/api/v1/training-jobs/{job.pk}/retry/"), "workers_min", "FLEETYARD_MAX_WORKERS_PER_JOB")
    assert TrainingJob.objects.count() == 1


def test_replicas_per_deployment_are_limited_on_create_update_and_scale(world, api, settings):
    client = api("alpha")
    _refused(client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "replicas_max": 257}, format="json"),
             "replicas_max", "256")
    settings.FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT = 4
    _refused(client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "replicas_max": 5}, format="json"),
             "replicas_max", "FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT")
    assert not Deployment.objects.exists()
    created = client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "replicas_max": 4}, format="json")
    assert created.status_code == 201, created.content
    url = f"/api/v1/deployments/{created.json()['id']}/"
    _refused(client.patch(url, {"replicas_max": 5}, format="json"), "replicas_max", "over the limit")
    _refused(client.post(f"{url}scale/", {"replicas_min": 6}, format="json"), "replicas_min", "over the limit")
    assert Deployment.objects.get().replicas_max == 4


# ---- submissions per team per minute ---------------------------------------------------------------------------


SPEC = "kind: training_job\nname: {name}\nqueue: default\nresources: {{accelerators: H100:1}}\n"


def test_submissions_beyond_the_team_rate_get_429_with_retry_after(world, api, settings):
    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = 5
    client = api("alpha")
    for index in range(3):
        assert client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": f"j{index}"},
                           format="json").status_code == 201
    assert client.post("/api/v1/deployments/", DEPLOYMENT_BODY, format="json").status_code == 201
    # A dry run creates nothing and takes no slot; a refused (400) submission neither.
    dry = client.post("/api/v1/specs/apply/?dry_run=1", {"spec": SPEC.format(name="dry")}, format="json")
    assert dry.status_code == 200, dry.content
    assert client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "bad", "queue": "nope"},
                       format="json").status_code == 400
    assert client.post("/api/v1/specs/apply/", {"spec": SPEC.format(name="fifth")},
                       format="json").status_code == 201

    j0 = TrainingJob.objects.get(name="j0")
    assert client.post(f"/api/v1/training-jobs/{j0.pk}/cancel/", {}, format="json").status_code == 200
    refusals = {
        "training job": client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "sixth"}, format="json"),
        "deployment": client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "name": "chat-2"}, format="json"),
        "spec apply": client.post("/api/v1/specs/apply/", {"spec": SPEC.format(name="sixth")}, format="json"),
        "retry": client.post(f"/api/v1/training-jobs/{j0.pk}/retry/"),
    }
    for kind, response in refusals.items():
        assert response.status_code == 429, (kind, response.content)
        retry_after = int(response["Retry-After"])
        assert 1 <= retry_after <= 60, (kind, retry_after)
        detail = response.json()["detail"]
        assert "FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE" in detail and "team alpha" in detail, detail
    assert TrainingJob.objects.count() == 4 and Deployment.objects.count() == 1
    print(f"\n[S6] team limit 5/min: 5 accepted, then 429 for job, deployment, spec apply and retry "
          f"(Retry-After {refusals['training job']['Retry-After']} s)")

    # Other teams are not affected.
    assert api("beta").post("/api/v1/training-jobs/", {**JOB_BODY, "name": "beta-1"},
                            format="json").status_code == 201

    # Cancelling and deleting does not give a slot back.
    job = TrainingJob.objects.get(name="j1")
    assert client.post(f"/api/v1/training-jobs/{job.pk}/cancel/", {}, format="json").status_code == 200
    assert client.delete(f"/api/v1/training-jobs/{job.pk}/").status_code == 204
    assert client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "again"}, format="json").status_code == 429

    # A minute later the window has moved on.
    AuditEvent.objects.filter(team=world["alpha"]["team"]).update(
        created_at=timezone.now() - timedelta(seconds=61))
    assert client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "later"}, format="json").status_code == 201


def test_retry_after_tells_when_the_oldest_submission_leaves_the_window(world, api, settings):
    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = 2
    client = api("alpha")
    for index in range(2):
        assert client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": f"j{index}"},
                           format="json").status_code == 201
    events = AuditEvent.objects.filter(team=world["alpha"]["team"], action="training_job.create").order_by("id")
    AuditEvent.objects.filter(pk=events[0].pk).update(created_at=timezone.now() - timedelta(seconds=50))
    response = client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "j2"}, format="json")
    assert response.status_code == 429 and 9 <= int(response["Retry-After"]) <= 11, response["Retry-After"]


@pytest.mark.django_db(transaction=True)
def test_concurrent_submitters_cannot_exceed_the_team_rate(world, settings):
    """Eight submitters at once, each on its own database connection (as separate web processes are): exactly
    the limit is accepted."""
    limit, threads_n, per_thread = 6, 8, 3
    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = limit
    alpha = world["alpha"]
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n)

    def submitter(index: int) -> None:
        from controlplane.common.errors import RateLimited

        close_old_connections()
        try:
            barrier.wait()
            for round_ in range(per_thread):
                try:
                    training_job_create(actor=alpha["member"], team=alpha["team"], name=f"c{index}-{round_}",
                                        local_queue=alpha["queue"], accelerator_types=["nvidia-h100"])
                    outcome = "accepted"
                except RateLimited:
                    outcome = "refused"
                with lock:
                    outcomes.append(outcome)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=submitter, args=(i,)) for i in range(threads_n)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    elapsed = time.perf_counter() - started
    assert len(outcomes) == threads_n * per_thread, outcomes
    assert outcomes.count("accepted") == limit, outcomes
    assert TrainingJob.objects.filter(team=alpha["team"]).count() == limit
    print(f"\n[S6] {threads_n} concurrent submitters x {per_thread} on {connection.vendor}: "
          f"{outcomes.count('accepted')} accepted (limit {limit}), {outcomes.count('refused')} refused, "
          f"{elapsed:.2f} s")


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_of_one_deployment_name_give_one_deployment_and_clear_refusals(world, settings):
    """QA (2026-11-29): the live-name check ran before anything was locked, so two creates of one name at once could
    both pass it; the second then hit the database's unique constraint (a 500 on PostgreSQL, or Django's
    "Constraint ... is violated" on no field). Each refusal must be the service's 400 on `name`."""
    from controlplane.common.errors import ValidationFailed
    from inference.models import Deployment
    from inference.services import deployment_create

    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = 0  # no rate limit: its lock must not be what orders them
    alpha, threads_n = world["alpha"], 6
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads_n)

    def creator() -> None:
        close_old_connections()
        try:
            barrier.wait()
            try:
                deployment_create(actor=alpha["admin"], team=alpha["team"], name="chat", local_queue=alpha["queue"],
                                  accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=450, sla_tpot_p95_ms=40,
                                  model_uri="file:///models/lm")
                outcome = "created"
            except ValidationFailed as exc:
                outcome = f"refused on {exc.field}"
            except Exception as exc:  # noqa: BLE001 - what the test is about
                outcome = f"{type(exc).__name__}: {exc}"
            with lock:
                outcomes.append(outcome)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=creator) for _ in range(threads_n)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert sorted(outcomes) == ["created"] + ["refused on name"] * (threads_n - 1), outcomes
    assert Deployment.objects.filter(team=alpha["team"], name="chat").count() == 1
