"""`fleetyard deploy --wait N` and the SDK's wait helpers keep to N seconds in all: each poll's sleep and each request's
HTTP timeout and retries are cut to the time left (QA: a poll slept its full interval, and asked with the client's
30 s timeout and its retries, however little of N was left). When N passes, a clear message and exit 1, no
traceback. No Django here: the stub API plays the server."""

from __future__ import annotations

import json
import threading
import time

import pytest

from fleetyard.cli import main
from fleetyard.client import Client
from fleetyard.errors import TimeoutExpired
from tests.sdk.stub_api import StubApi, served

_SERVE_SPEC = """\
name: chat
queue: default
resources:
  accelerators: A100:0.5
service:
  model: file:///checkpoints/lm/step-100
  replicas: {min: 1, max: 3}
  sla: {ttft_p95: 500ms, tpot_p95: 50ms}
"""


def _deployment(state: str = "PENDING") -> dict:
    return {"id": 9, "name": "chat", "team": "alpha", "spec": {},
            "status": {"state": state, "reason": "waiting for a replica"}}


@pytest.fixture
def release():
    """Set at the end of a test: a slow route stops holding its answer back."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def api(release):
    with served(StubApi()) as stub:
        plan = {"name": "chat", "kind": "deployment", "options": [], "chosen": None, "notes": []}
        stub.json("/api/v1/specs/apply/", lambda query: {"kind": "deployment", "dry_run": "dry_run" in query,
                                                         "plan": plan, "warnings": [],
                                                         "object": None if "dry_run" in query else _deployment()})
        yield stub


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path, api):
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("FLEETYARD_URL", api.url)
    monkeypatch.setenv("FLEETYARD_TOKEN", "fy_wait")


def _slow(api, release, seconds: float) -> None:
    """The deployment's route answers PENDING, after `seconds`."""
    def answer(query):
        release.wait(seconds)
        return 200, "application/json", json.dumps(_deployment()).encode()
    api.routes["/api/v1/deployments/9/"] = answer


def _deploy(tmp_path, *args) -> tuple[int, float]:
    spec = tmp_path / "serve.yaml"
    spec.write_text(_SERVE_SPEC)
    started = time.monotonic()
    code = main(["deploy", str(spec), "-y", *args])
    return code, time.monotonic() - started


def test_deploy_wait_does_not_sleep_past_its_time(api, tmp_path, capsys):
    """A quick server, --wait 0.3: the poll interval (1 s) was slept whole after the last check."""
    api.json("/api/v1/deployments/9/", _deployment())
    code, took = _deploy(tmp_path, "--wait", "0.3")
    out, err = capsys.readouterr()
    assert code == 1, err
    assert took < 0.8, took
    assert "deployment 9 is still PENDING (waiting for a replica) after 0.3 s; waited for SERVING" in err
    assert "Traceback" not in out + err


def test_deploy_wait_bounds_each_request_by_the_time_left(api, release, tmp_path, capsys):
    """A server that takes 5 s to answer, --wait 1: the poll asked with the client's 30 s timeout, so the command
    took 5 s (and with a server that never answered, 30 s a try, retried 4 times)."""
    _slow(api, release, 5)
    code, took = _deploy(tmp_path, "--wait", "1")
    out, err = capsys.readouterr()
    assert code == 1, err
    assert took < 1.7, took
    assert "deployment 9 did not reach SERVING within 1 s: no state read" in err
    assert "no answer before the time ran out" in err
    assert "Traceback" not in out + err


def test_deploy_wait_json_gives_the_deployment_as_last_seen_without_asking_again(api, tmp_path, capsys):
    """Under --json the document holds the deployment as last seen; no request after the time ran out (it asked
    again, with the full client timeout)."""
    api.json("/api/v1/deployments/9/", _deployment())
    code, took = _deploy(tmp_path, "--wait", "0.3", "--json")
    out, err = capsys.readouterr()
    assert code == 1 and took < 0.8, (code, took, err)
    assert json.loads(out)["deployment"]["status"]["state"] == "PENDING"
    asked = [path for path in api.asked if path.startswith("/api/v1/deployments/9/")]
    assert asked and len(asked) <= 2, asked  # one poll at 0, perhaps one more; none after the time ran out


def test_wait_for_deployment_does_not_retry_past_its_timeout(api, monkeypatch):
    """A 503 answer is retried with backoff: a retry whose backoff would pass the deadline is not made; the wait
    ends at its timeout, saying what the last answer was."""
    api.json("/api/v1/deployments/9/", {"detail": "unavailable"}, status=503)
    client = Client(backoff=0.4)
    started = time.monotonic()
    with pytest.raises(TimeoutExpired) as caught:
        client.wait_for_deployment(9, timeout=1.0)
    took = time.monotonic() - started
    assert took < 1.2, took
    assert "answered 503; no time left to try again" in str(caught.value)
    assert caught.value.last is None


def test_wait_for_job_keeps_to_its_timeout_too(api, release):
    """wait_for_job shares the helper."""
    def answer(query):
        release.wait(5)
        return 200, "application/json", json.dumps({"id": 3, "name": "j", "spec": {},
                                                    "status": {"state": "RUNNING"}}).encode()
    api.routes["/api/v1/training-jobs/3/"] = answer
    started = time.monotonic()
    with pytest.raises(TimeoutExpired, match="training job 3 did not reach SUCCEEDED, FAILED, CANCELLED within 0.5 s"):
        Client().wait_for_job(3, timeout=0.5)
    assert time.monotonic() - started < 1.2
