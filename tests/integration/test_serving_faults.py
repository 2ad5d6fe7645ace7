"""Issue 8, R4: serving under faults, through the real gateway process on the real local Ray cluster.

A request goes client -> gateway (gunicorn workers running Django's /v1/completions, as `scripts/up` starts them)
-> a Ray Serve deployment handle inside that gunicorn worker (Serve's HTTP proxies are disabled) -> an LLMReplica.
So "the proxy" killed here is a gunicorn worker: the process that carries requests from the gateway into Serve.

- kill a replica (SIGKILL, pid from Ray's GCS actor table), then a gateway worker, under steady streaming load: only
  requests in flight on the killed process may fail (none started after the kill), a broken stream ends with an
  error event (replica) or a dropped connection (the gateway process itself died), nothing hangs; recovery times
  are printed;
- overload far beyond slots + queues: every excess request is refused with 429/503 and Retry-After, quickly, and
  the RSS of the gateway workers and the replicas stays flat.

The harness (gateway server, load, kills, RSS) is benchmarks/serving_faults.py, whose command runs longer.
"""

from __future__ import annotations

import json
import time

import pytest

from benchmarks import serving_faults as harness

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def faults_model_dir(tmp_path_factory):
    return harness.write_model(tmp_path_factory.mktemp("faults-model"))


@pytest.fixture(scope="module")
def faults_service(ray_backend, faults_model_dir):
    ray_backend.deploy_service(harness.service_spec(faults_model_dir))
    harness.wait_replicas(ray_backend, 2)
    yield ray_backend
    ray_backend.delete_service(harness.HANDLE)
    deadline = time.monotonic() + 60
    while ray_backend.observe_service(harness.HANDLE).state != "not_found" and time.monotonic() < deadline:
        time.sleep(0.5)
    ray_backend.shutdown_serving()  # no replica outlives this module
    assert harness.replica_pids(harness.HANDLE) == []


def _database_url(settings_dict: dict) -> str:
    from urllib.parse import quote

    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite://{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "")
    password = quote(settings_dict.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if user else ""
    return f"postgres://{auth}{settings_dict.get('HOST') or 'localhost'}:{settings_dict.get('PORT') or 5432}/" \
           f"{quote(settings_dict['NAME'])}"


@pytest.fixture(scope="module")
def gateway(ray_cluster, faults_service, django_db_setup, django_db_blocker, tmp_path_factory):
    """The gateway as its own processes, on the test database (tests here commit: transaction=True)."""
    from django.db import connection

    with django_db_blocker.unblock():
        url = _database_url(connection.settings_dict)
    data_dir = tmp_path_factory.mktemp("gateway-data")
    server = harness.GatewayServer(env={**ray_cluster.client_env(), "FLEETYARD_DATABASE_URL": url,
                                        "FLEETYARD_DATA_DIR": str(data_dir)}, log_path=data_dir / "gunicorn.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
        assert harness.children_of(server.process.pid) == []


@pytest.fixture
def token(world, faults_model_dir):
    """The SERVING deployment row the gateway resolves `model` to, and a team token."""
    from controlplane.tenancy.services import api_token_create
    from inference.models import Deployment

    alpha = world["alpha"]
    Deployment.objects.create(team=alpha["team"], local_queue=alpha["queue"], created_by=alpha["member"],
                              **harness.deployment_fields(faults_model_dir))
    _, raw = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="faults")
    return raw


def _warm(gateway, token, *, clients: int = 6, per_client: int = 3, timeout_s: float = 120.0) -> None:
    """Load until every client thread has had `per_client` answers: each gunicorn worker connects to Ray on its
    first request (seconds on this host), and with fresh connections both workers have served by then."""
    deadline = time.monotonic() + timeout_s
    with harness.SteadyLoad(gateway.port, token, clients=clients) as load:
        while time.monotonic() < deadline and len(load.snapshot()) < clients * per_client + clients:
            time.sleep(0.2)
        outcomes = load.snapshot()
    assert len(outcomes) >= clients * per_client, f"the gateway answered {len(outcomes)} requests in {timeout_s} s"
    assert all(o.ok for o in outcomes), [(o.kind, o.status, o.error) for o in outcomes if not o.ok][:3]


@pytest.mark.django_db(transaction=True)
def test_killing_a_replica_then_the_gateway_process_fails_only_the_requests_in_flight_there(
        faults_service, gateway, token):
    _warm(gateway, token)
    with harness.SteadyLoad(gateway.port, token, clients=6, max_tokens=24) as load:  # long enough to be cut
        replica = harness.run_kill(lambda: harness.kill_replica(faults_service), load)
        proxy = harness.run_kill(lambda: harness.kill_gateway_worker(gateway), load)
    print("\nR4 kills under steady load (6 streaming clients):")
    harness.print_kill_table([replica, proxy])
    print(json.dumps({"replica": replica, "gateway_worker": proxy}, indent=1))

    every = load.snapshot()
    assert not [o for o in every if o.kind == "hung"], "a request hung"
    for report in (replica, proxy):
        assert report["requests_total"] > 20, report  # steady load really ran through the kill
        assert report["failed_not_in_flight"] == 0, report  # nothing started after the kill failed
        assert report["failed"] <= report["in_flight_on_killed"], report
        assert report["first_success_after_s"] is not None and report["first_success_after_s"] < 5.0, report
        assert report["throughput_recovered_s"] is not None and report["throughput_recovered_s"] < 15.0, report
        assert report["replacement_s"] is not None, report
    # The gateway outlived the replica: a stream the dead replica broke ends with an error event or an HTTP error,
    # never a dropped connection.
    assert "broken" not in replica["failed_kinds"], replica


@pytest.mark.django_db(transaction=True)
def test_overload_is_refused_quickly_with_retry_after_and_memory_stays_flat(faults_service, gateway, token):
    _warm(gateway, token)
    pids = {f"gateway worker {i}": pid for i, pid in enumerate(gateway.worker_pids())}
    pids.update({f"replica {i}": pid for i, pid in enumerate(harness.replica_pids(harness.HANDLE))})
    result = harness.overload(gateway.port, token, clients=48, duration_s=8.0, warmup_s=3.0, pids=pids)
    result["refusal_in_gateway"] = harness.recorded_refusals(result["measured_from_epoch"])
    print()
    harness.print_overload(result)

    assert result["served"] > 0 and result["refused"] > 0, result
    assert result["hung"] == 0 and result["other_failures"] == 0, result
    assert result["refused_without_retry_after"] == 0, result
    # The gateway itself answers a refusal fast; what the client waits beyond that is a free gunicorn thread on a
    # CPU the replicas keep busy (2 cores here): bounded well below the hang timeout, never a hang.
    assert result["refusal_in_gateway"]["recorded"] >= result["refused"] * 0.9, result
    assert result["refusal_in_gateway"]["p99_ms"] < 1500, result
    assert result["refusal_p99_ms"] < harness.REQUEST_TIMEOUT_S * 1000 / 3, result
    for name, rss in result["rss_mib"].items():
        assert rss["end"] - rss["start"] < 48, (name, rss)
        assert rss["peak"] - rss["start"] < 96, (name, rss)
    assert len(result["rss_mib"]) == len(pids)
