"""A third QA pass over the CLI and the SDK (2026-12): each test failed on the code before its fix. No Django here:
a tiny HTTP server plays the API, answering from a table of routes, and records what it was asked."""

from __future__ import annotations

import json

import pytest

from fleetyard.cli import main
from fleetyard.client import Client
from tests.sdk.stub_api import StubApi, served


def _job(job_id: int, state: str = "SUCCEEDED", **status) -> dict:
    return {"id": job_id, "name": f"job-{job_id}", "team": "alpha",
            "spec": {"queue": "default", "accelerator_types": ["nvidia-h100"]},
            "status": {"state": state, "reason": "as scripted", "step": 10, **status}}


def _log(line_id: int) -> dict:
    return {"id": line_id, "attempt": 0, "worker": 0, "line": f"line {line_id}", "recorded_at": ""}


@pytest.fixture
def api():
    with served(StubApi()) as stub:
        yield stub


@pytest.fixture(autouse=True)
def environment(monkeypatch, tmp_path, api):
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("FLEETYARD_URL", api.url)
    monkeypatch.setenv("FLEETYARD_TOKEN", "fy_qa3")


# ------------------------------------------------------------------------------ a followed log's last lines

def test_the_lines_read_after_a_followed_stream_ended_are_not_repeated(api, capsys):
    """A stream that ended at its timeout just before the job did (lines 3 and 4 written in between): the tail read
    after it yielded 3 and 4 but left `after` at 2, so the next stream sent them again ([1, 2, 3, 4, 3, 4])."""
    def logs(query):
        after = int(query.get("after", 0))
        if query.get("follow") == "true":
            last = 2 if after == 0 else 4  # the first stream ends (its timeout) after line 2
            return 200, "application/x-ndjson", b"".join(json.dumps(_log(i)).encode() + b"\n"
                                                         for i in range(after + 1, last + 1))
        rows = [_log(i) for i in range(after + 1, 5)]
        return 200, "application/json", json.dumps({"results": rows, "next_after": rows[-1]["id"] if rows
                                                    else after}).encode()
    api.routes["/api/v1/training-jobs/7/logs/"] = logs
    api.json("/api/v1/training-jobs/7/", _job(7))
    client = Client(api.url, "fy_qa3", backoff=0.001)
    assert [line.id for line in client.logs(7, follow=True)] == [1, 2, 3, 4]
    assert main(["jobs", "logs", "7", "-f", "--json"]) == 0
    assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [1, 2, 3, 4]


# ------------------------------------------------------------------------------ terminal escapes in server text

EVIL = "ok \x1b]52;c;cHduZWQ=\x07\x1b[2J\x9b31m \u202eevil"


@pytest.mark.parametrize("argv", [["datasets", "list"], ["jobs", "status", "7"], ["jobs", "status"], ["jobs", "queue"],
                                  ["jobs", "logs", "7"], ["endpoints"]])
def test_control_characters_in_server_text_are_shown_not_obeyed(api, capsys, argv):
    """A dataset's description or a cancel reason (free text any team member writes), an accelerator type an operator
    named, or a log line went to the terminal as it was: ESC sequences that write the clipboard (OSC 52), set the title
    or clear the screen, and bidi overrides that reorder what is shown. Now they are shown as \\x1b, \\u202e."""
    api.json("/api/v1/datasets/", {"results": [{"id": 1, "name": "d", "team": "alpha", "version_count": 0,
                                                "latest_version": None, "description": EVIL}], "next": None})
    job = _job(7, "QUEUED", reason=EVIL, admitted_accelerator_type=EVIL)
    job["spec"]["accelerator_types"] = [EVIL]
    api.json("/api/v1/training-jobs/7/", job)
    api.json("/api/v1/training-jobs/", {"results": [job], "next": None})
    api.json("/api/v1/training-jobs/7/logs/", lambda query: {"results": [] if query.get("after") else
                                                               [{**_log(1), "line": EVIL}], "next_after": 1})
    api.json("/api/v1/deployments/", {"results": [{"id": 3, "name": "chat", "team": "alpha",
                                                   "spec": {"sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}},
                                                   "status": {"state": EVIL, "reason": EVIL,
                                                              "accelerator_type": EVIL}}], "next": None})
    assert main(argv) == 0
    out, err = capsys.readouterr()
    shown = out + err
    assert "evil" in shown
    assert not any(ch in shown for ch in "\x1b\x07\x9b\u202e"), repr(shown)
    assert "\\x1b]52" in shown and "\\u202e" in shown


# ------------------------------------------------------------------------------ JSON that is not the API's

@pytest.mark.parametrize("answer", [{"hello": "world"}, ["x"], "just text", {"results": "none"}, 7])
@pytest.mark.parametrize("argv", [["jobs", "logs", "7"], ["jobs", "status", "7"], ["jobs", "status"],
                                  ["jobs", "queue"], ["datasets", "list"], ["endpoints"], ["jobs", "cancel", "7"]])
def test_json_of_another_shape_is_an_api_error_not_a_traceback(api, capsys, argv, answer):
    """A URL that is some other JSON service (or a proxy's JSON page) answering 200: KeyError 'results' / 'id' and
    AttributeError tracebacks. Now exit 3 with one line saying the answer is not the API's."""
    for path in ("/api/v1/training-jobs/7/logs/", "/api/v1/training-jobs/7/", "/api/v1/training-jobs/",
                 "/api/v1/datasets/", "/api/v1/deployments/", "/api/v1/training-jobs/7/cancel/"):
        api.json(path, answer)
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert "not the Fleetyard API's answer" in err and len(err.splitlines()) == 1, err


def test_a_page_of_log_lines_without_next_after_still_ends(api):
    api.json("/api/v1/training-jobs/7/logs/", lambda query: {"results": [] if query.get("after") else [_log(1)]})
    assert [line.id for line in Client(api.url, "fy_qa3").logs(7)] == [1]


# ------------------------------------------------------------------------------ pages that shift while read

def test_a_job_submitted_while_the_pages_are_read_does_not_repeat_one(api, capsys):
    """The list is newest first, a page at a time: a job submitted between two pages pushed the last job of the first
    page onto the second, and `jobs queue` (any list of more than a page) showed it twice."""
    jobs = [_job(i, "QUEUED") for i in range(150, 0, -1)]

    def page(query):
        number, size = int(query.get("page", 1)), int(query.get("page_size", 100))
        if number == 2:
            jobs.insert(0, _job(151, "QUEUED"))  # submitted after the first page was read
        more = number * size < len(jobs)
        return {"count": len(jobs), "results": jobs[(number - 1) * size:number * size],
                "next": f"{api.url}/api/v1/training-jobs/?page={number + 1}&page_size={size}" if more else None}
    api.json("/api/v1/training-jobs/", page)
    ids = [job.id for job in Client(api.url, "fy_qa3").training_jobs(state="QUEUED")]
    assert sorted(ids) == list(range(1, 151))
    jobs[:] = [_job(i, "QUEUED") for i in range(150, 0, -1)]
    assert main(["jobs", "queue", "--json"]) == 0
    assert sorted(job["id"] for job in json.loads(capsys.readouterr().out)) == list(range(1, 151))


# ------------------------------------------------------------------------------ a huge file given as a spec

@pytest.mark.parametrize("argv", [["jobs", "launch", "{}", "--dry-run"], ["deploy", "{}", "--dry-run"],
                                  ["plan", "{}", "--batch", "8", "--devices", "H100:8"]])
def test_a_huge_file_given_as_a_spec_is_refused_before_it_is_read_whole(api, tmp_path, capsys, argv):
    """A checkpoint or a disk image given by mistake (or /dev/zero) was read whole into memory before anything was
    said about it: 4 GB of memory for a 4 GB file, and never an answer for an endless one."""
    huge = tmp_path / "model.yaml"
    with huge.open("wb") as handle:  # sparse: 64 MiB of zeros on no disk
        handle.truncate(64 << 20)
    assert main([part.replace("{}", str(huge)) for part in argv]) == 2
    err = capsys.readouterr().err
    assert "model.yaml: larger than 16 MiB" in err and "Traceback" not in err
    assert api.asked == []
