"""The SDK's retries against a real HTTP server that answers 429 / 503 first: backoff honours Retry-After,
non-idempotent calls are not repeated on 5xx, and the typed error says how many retries were made."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetyard.client import Client
from fleetyard.errors import RateLimited, ServerError


class Script:
    """Status codes to answer in turn (then 200 with {"ok": true}), and what was asked."""

    def __init__(self, statuses: list[int], retry_after: str | None = None) -> None:
        self.statuses = list(statuses)
        self.retry_after = retry_after
        self.calls: list[tuple[str, str, float]] = []


@pytest.fixture
def server():
    script = Script([])

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            script.calls.append((self.command, self.path, time.monotonic()))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            status = script.statuses.pop(0) if script.statuses else 200
            body = json.dumps({"ok": True} if status == 200 else {"detail": f"status {status}"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if status == 429 and script.retry_after:
                self.send_header("Retry-After", script.retry_after)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield script, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_429_and_503_are_retried_with_backoff_until_success(server):
    script, url = server
    script.statuses = [429, 503, 502]
    client = Client(url, "fy_test", backoff=0.01)
    assert client.request("GET", "me/").json() == {"ok": True}
    assert len(script.calls) == 4
    assert all(path == "/api/v1/me/" for _, path, _ in script.calls)


def test_retry_after_is_honoured(server):
    script, url = server
    script.statuses, script.retry_after = [429], "1"
    client = Client(url, "fy_test", backoff=0.01)
    client.request("GET", "me/")
    waited = script.calls[1][2] - script.calls[0][2]
    assert 0.9 <= waited < 5


def test_giving_up_raises_a_typed_error_naming_the_retries(server):
    script, url = server
    script.statuses = [429] * 10
    client = Client(url, "fy_test", backoff=0.001, max_retries=2)
    with pytest.raises(RateLimited, match="after 2 retries"):
        client.request("GET", "me/")
    assert len(script.calls) == 3


def test_a_post_is_not_repeated_after_a_server_error(server):
    script, url = server
    script.statuses = [503]
    client = Client(url, "fy_test", backoff=0.001)
    with pytest.raises(ServerError):
        client.request("POST", "training-jobs/", json={"name": "x"})
    assert len(script.calls) == 1  # it may have been applied: only 429 (refused before work) is safe to resend
    script.statuses = [429]
    assert client.request("POST", "training-jobs/", json={"name": "x"}).json() == {"ok": True}
