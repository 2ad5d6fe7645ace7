"""A second QA pass over the CLI and SDK commands the first one left out (`jobs status`, `jobs logs -f`, `undeploy`,
prompts, `Client.metrics`), each test failing on the code before its fix. No Django here: a tiny HTTP server plays
the API, answering from a table of routes, and records what it was asked."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetyard.cli import main
from fleetyard.client import Client
from fleetyard.errors import ApiError
from tests.sdk.stub_api import StubApi, served

ROOT = Path(__file__).resolve().parents[2]


def _job(job_id: int, state: str = "SUCCEEDED") -> dict:
    return {"id": job_id, "name": f"job-{job_id}", "team": "alpha",
            "spec": {"queue": "default", "accelerator_types": ["nvidia-h100"]},
            "status": {"state": state, "reason": "as scripted", "step": 10}}


class Api(StubApi):
    """The stub API with a paginated job list."""

    def job_list(self, count: int) -> None:
        """`count` jobs, newest first, paginated like the API (page, page_size, next links)."""
        def page(query):
            number, size = int(query.get("page", 1)), int(query.get("page_size", 100))
            items = [_job(i) for i in range(count, 0, -1)][(number - 1) * size:number * size]
            more = number * size < count
            return {"count": count, "results": items,
                    "next": f"{self.url}/api/v1/training-jobs/?page={number + 1}&page_size={size}" if more else None}
        self.json("/api/v1/training-jobs/", page)


@pytest.fixture
def api():
    with served(Api()) as stub:
        yield stub


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path, api):
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("FLEETYARD_URL", api.url)
    monkeypatch.setenv("FLEETYARD_TOKEN", "fy_qa2")


# ------------------------------------------------------------------------------ a closed output pipe

def test_a_reader_that_goes_away_ends_the_command_quietly(api):
    """`fleetyard jobs status --json | head -1` printed a BrokenPipeError traceback; now it stops quietly with 141, as
    `seq 1000000 | head -1` does."""
    api.job_list(3000)
    process = subprocess.Popen([sys.executable, "-m", "fleetyard", "jobs", "status", "--limit", "3000", "--json"],
                               cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.readline()
    process.stdout.close()  # what head does once it has its line
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, err
    assert err == ""


class _ClosedPipe:
    """A stdout whose reader has gone away."""

    encoding = "utf-8"

    def write(self, _text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")

    def isatty(self):
        return False


@pytest.mark.parametrize("argv", [["jobs", "status"], ["jobs", "status", "--json"], ["jobs", "queue"]])
def test_a_closed_stdout_is_exit_141_for_tables_and_json_alike(api, monkeypatch, capsys, argv):
    """Tables went through rich, whose answer to a closed pipe was SystemExit(1): the exit code of a failed job."""
    api.job_list(3)
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(argv) == 141
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------ jobs status --limit

def test_jobs_status_reads_only_the_pages_it_shows(api, capsys):
    """`jobs status --limit 3` of 900 jobs followed every `next` link (300 requests) and then kept three."""
    api.job_list(900)
    assert main(["jobs", "status", "--limit", "3", "--json"]) == 0
    assert [job["id"] for job in json.loads(capsys.readouterr().out)] == [900, 899, 898]
    assert len(api.asked) == 1 and "page_size=3" in api.asked[0]
    api.asked.clear()
    assert main(["jobs", "status"]) == 0  # the default, 20
    assert len(api.asked) == 1 and "job-881" in capsys.readouterr().out


# ------------------------------------------------------------------------------ jobs logs -f on a cut stream

def _log(line_id: int) -> bytes:
    return json.dumps({"id": line_id, "attempt": 0, "worker": 0, "line": f"line {line_id}",
                       "recorded_at": ""}).encode() + b"\n"


def _stream(script):
    """The logs route: a follow request answers script(after) as NDJSON; a page request answers no more lines."""
    def answer(query):
        if query.get("follow") == "true":
            return 200, "application/x-ndjson", script(int(query.get("after", 0)))
        return 200, "application/json", json.dumps({"results": [], "next_after": query.get("after")}).encode()
    return answer


@pytest.mark.parametrize("as_json", [False, True])
def test_a_log_stream_cut_in_the_middle_of_a_line_is_resumed(api, capsys, as_json):
    """A stream whose connection closed in the middle of a line handed half a line to json.loads: a JSONDecodeError
    traceback. Now the half line is dropped and the stream resumed after the last whole line, as for any break."""
    api.json("/api/v1/training-jobs/7/", _job(7))
    api.routes["/api/v1/training-jobs/7/logs/"] = _stream(
        lambda after: _log(1) + _log(2)[:15] if after == 0 else b"".join(_log(i) for i in range(after + 1, 4)))
    assert main(["jobs", "logs", "7", "-f", *(["--json"] if as_json else [])]) == 0
    out, err = capsys.readouterr()
    if as_json:
        assert [json.loads(line)["line"] for line in out.splitlines()] == ["line 1", "line 2", "line 3"]
    else:
        assert out.splitlines()[:3] == ["[w0] line 1", "[w0] line 2", "[w0] line 3"]
    assert err == ""
    follows = [path for path in api.asked if "follow=true" in path]
    assert len(follows) == 2 and "after=1" in follows[1]


def test_a_stream_that_is_no_log_stream_is_an_api_error_not_a_traceback(api):
    api.json("/api/v1/training-jobs/7/", _job(7, "RUNNING"))
    api.routes["/api/v1/training-jobs/7/logs/"] = _stream(lambda after: b"<html><title>Gateway</title></html>\n")
    client = Client(api.url, "fy_qa2", backoff=0.001, max_retries=2)
    with pytest.raises(ApiError, match=r"streamed b'<html><title>Gateway</title></html>', not a log line"):
        list(client.logs(7, follow=True))
    assert len([path for path in api.asked if "follow=true" in path]) == 3


# ------------------------------------------------------------------------------ questions and --json

def test_a_question_goes_to_stderr_so_json_stdout_stays_one_document(api, monkeypatch, capsys):
    """input() wrote "Delete deployment ...? [y/N] " to stdout: under --json it went into the document (and with
    stdout redirected the user never saw the question the command was waiting on)."""
    deleted = []

    def deployment(query):
        if query["_method"] == "DELETE":
            deleted.append(True)
            return 204, "application/json", b""
        state = "DELETING" if deleted else "SERVING"
        body = {"id": 5, "name": "chat", "team": "alpha", "status": {"state": state, "reason": "as scripted"}}
        return 200, "application/json", json.dumps(body).encode()

    api.routes["/api/v1/deployments/5/"] = deployment
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    assert main(["undeploy", "5", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["status"]["state"] == "DELETING" and deleted
    assert err == "Delete deployment 5 (chat, SERVING)? [y/N] "


# ------------------------------------------------------------------------------ Client.metrics

def test_metrics_reads_every_page(api):
    """Client.metrics(job) returned the first page of 1,000 rows only (a 2-worker job of 1,000 steps cut at step
    500, nothing said); `limit` still caps it."""
    def page(query):
        after, limit = int(query.get("after", 0)), int(query["limit"])
        rows = [{"id": i, "step": (i - 1) // 2, "worker": (i - 1) % 2}
                for i in range(after + 1, min(after + limit, 2500) + 1)]
        return {"results": rows, "next_after": rows[-1]["id"] if rows else after}

    api.json("/api/v1/training-jobs/7/metrics/", page)
    client = Client(api.url, "fy_qa2")
    rows = client.metrics(7)
    assert [row["id"] for row in rows] == list(range(1, 2501))
    assert [row["id"] for row in client.metrics(7, after=100, limit=1500)] == list(range(101, 1601))
    assert [row["id"] for row in client.metrics(7, limit=10)] == list(range(1, 11))


# ------------------------------------------------------------------------------ a deployment refused at once

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


def _refused_deployment(api) -> dict:
    """The API creates the deployment and answers with it already FAILED (the backend refused it at once)."""
    plan = {"name": "chat", "kind": "deployment", "options": [], "chosen": None, "notes": []}
    deployment = {"id": 9, "name": "chat", "team": "alpha",
                  "status": {"state": "FAILED", "reason": "the backend refused the deploy: no such model"}}
    api.json("/api/v1/specs/apply/", lambda query: {"kind": "deployment", "dry_run": "dry_run" in query,
                                                    "plan": plan, "warnings": [],
                                                    "object": None if "dry_run" in query else deployment})
    api.json("/api/v1/deployments/9/", deployment)
    return deployment


@pytest.mark.parametrize("wait", [[], ["--wait", "5"]])
def test_deploy_whose_answer_is_failed_exits_1_with_json_on_stdout(api, tmp_path, capsys, wait):
    """`deploy -y --json` without --wait exited 0 when the API's answer already said FAILED (a script checking the
    exit code thought it deployed); --wait said 1. Both exit 1 now, stdout still one JSON document."""
    _refused_deployment(api)
    spec = tmp_path / "serve.yaml"
    spec.write_text(_SERVE_SPEC)
    assert main(["deploy", str(spec), "-y", "--json", *wait]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["deployment"]["status"]["state"] == "FAILED"
    assert "FAILED" in err and "no such model" in err


def test_deploy_whose_answer_is_failed_exits_1_without_json(api, tmp_path, capsys):
    _refused_deployment(api)
    spec = tmp_path / "serve.yaml"
    spec.write_text(_SERVE_SPEC)
    assert main(["deploy", str(spec), "-y"]) == 1
    out, err = capsys.readouterr()
    assert "Created deployment 9" in out and "error:" in err and "no such model" in err
