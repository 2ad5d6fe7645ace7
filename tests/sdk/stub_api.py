"""A tiny HTTP server that plays the Fleetyard API for the CLI and SDK tests that need no Django (the QA passes'
tests/sdk/test_cli_qa2.py and test_cli_qa3.py): it answers from a table of routes and records what it was asked."""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubApi:
    """`routes` maps a path to a function of the query (a dict, with `_method` and `_body` added) returning (status,
    content type, body bytes); `asked` lists every path?query asked, in order."""

    def __init__(self) -> None:
        self.routes: dict = {}
        self.asked: list[str] = []
        self.url = ""

    def json(self, path: str, answer, status: int = 200) -> None:
        """`answer`: a document, or a function of the query returning one."""
        self.routes[path] = lambda query: (status, "application/json",
                                           json.dumps(answer(query) if callable(answer) else answer).encode())


@contextmanager
def served(stub: StubApi) -> Iterator[StubApi]:
    """`stub` answering on a free local port (`stub.url`) until the block ends."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes, as streams do behind many proxies

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            parts = urllib.parse.urlsplit(self.path)
            stub.asked.append(self.path)
            route = stub.routes.get(parts.path)
            query = {**dict(urllib.parse.parse_qsl(parts.query)), "_method": self.command, "_body": body}
            status, kind, data = route(query) if route else (404, "application/json", b'{"detail": "Not found."}')
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:
            """A client that hung up before a slow answer (a request's timeout passed) is no error of the stub's."""
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    stub.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield stub
    finally:
        httpd.shutdown()
        httpd.server_close()
