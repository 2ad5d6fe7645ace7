"""The SDK and CLI given a wrong server URL, a mangled token, or a server that answers with web pages instead of the
API's JSON: a typed error and a one-line CLI message (exit 3), never a traceback (QA found InvalidURL,
InvalidSchema, UnicodeEncodeError and JSONDecodeError tracebacks, and 2000 characters of HTML as the message).
No Django here: a tiny HTTP server plays the wrong server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetyard.cli import main
from fleetyard.client import Client, save_config
from fleetyard.errors import ApiError, ConfigError, NotFound, ServerError

PAGES = {  # path -> (status, content type, body)
    "/api/v1/me/": (200, "text/html", "<html><head><title>Welcome</title></head><body>hello</body></html>"),
    "/json/api/v1/me/": (200, "application/json", json.dumps({"hello": "world"})),
    "/api/v1/training-jobs/99/": (404, "application/json", json.dumps({"detail": "Not found."})),
    "/boom/api/v1/training-jobs/": (500, "text/html",
                                    "<!doctype html><html><head><title>Server Error (500)</title></head>"
                                    "<body><h1>Server Error (500)</h1>" + "x" * 3000 + "</body></html>"),
}


SEEN: list[tuple[str, str]] = []  # (path, Authorization header) of every request the stub server got


@pytest.fixture
def server():
    SEEN.clear()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            SEEN.append((self.path, self.headers.get("Authorization", "")))
            path = self.path.split("?")[0]
            status, kind, body = PAGES.get(path, (404, "text/html", "<html><title>Not Found</title>nothing</html>"))
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def no_config(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.delenv("FLEETYARD_URL", raising=False)
    monkeypatch.delenv("FLEETYARD_TOKEN", raising=False)


@pytest.mark.parametrize(("url", "says"), [
    ("127.0.0.1:8000", "give an http:// or https:// address"),
    ("ftp://example.com", "give an http:// or https:// address"),
    ("http://", "give an http:// or https:// address"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://127.0.0.1:99999", "Port out of range"),
    ("http://exa mple:8000", "a space or a control character"),
    ("http://127.0.0.1:8000/api/v1/", "without /api/v1"),
])
def test_a_malformed_server_url_is_a_config_error_naming_it(url, says):
    with pytest.raises(ConfigError) as caught:
        Client(url=url, token="fy_x")
    assert says in str(caught.value) and repr(url.rstrip("/")) in str(caught.value)


@pytest.mark.parametrize("token", ["fy_тест", "fy_a\nb", "fy_a b", "fy_\x00"])
def test_a_token_no_server_could_have_issued_is_a_config_error(token):
    with pytest.raises(ConfigError, match="the API token has characters no token has"):
        Client(url="http://127.0.0.1:8000", token=token)


def test_surrounding_whitespace_of_a_pasted_token_or_url_is_dropped():
    client = Client(url=" http://127.0.0.1:8000/ ", token=" fy_abc\n")
    assert (client.url, client.token) == ("http://127.0.0.1:8000", "fy_abc")


def test_a_web_page_where_the_api_should_answer_is_an_api_error(server):
    with pytest.raises(ApiError) as caught:
        Client(url=server, token="fy_x").me()
    assert "answered 200 with text/html, not the API's JSON" in str(caught.value)
    assert f"is {server} the Fleetyard server's address?" in str(caught.value)


def test_json_that_names_no_user_is_not_taken_for_a_login(server):
    with pytest.raises(ApiError, match="did not name a user"):
        Client(url=server + "/json", token="fy_x").me()


def test_an_html_error_page_is_summed_up_by_its_title(server):
    with pytest.raises(NotFound) as caught:
        list(Client(url=server + "/nowhere", token="fy_x").training_jobs())
    assert str(caught.value) == "404: Not Found (an HTML page, not the API's answer: is the server URL right?)"
    with pytest.raises(ServerError) as caught:
        list(Client(url=server + "/boom", token="fy_x", max_retries=0).training_jobs())
    assert str(caught.value).startswith("500: Server Error (500) (an HTML page, not the API's answer)")
    assert "xxx" not in str(caught.value) and "xxx" in caught.value.body  # the page is kept for whoever needs it


@pytest.mark.parametrize("argv", [
    ["--url", "127.0.0.1:8141", "--token", "fy_x", "jobs", "queue"],
    ["--url", "http://[::1", "--token", "fy_x", "quota"],
    ["login", "--url", "http://127.0.0.1:1", "--token", "fy_тест"],
    ["login", "--url", "SERVER", "--token", "fy_x"],
    ["--url", "SERVER/nowhere", "--token", "fy_x", "jobs", "status"],
])
def test_the_cli_says_what_is_wrong_in_one_line_and_exits_3(server, argv, capsys, tmp_path):
    code = main([arg.replace("SERVER", server) for arg in argv])
    out, err = capsys.readouterr()
    assert code == 3, (out, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err and "<" not in err
    assert not (tmp_path / "config.json").exists()  # a failed login saves nothing


@pytest.mark.parametrize(("content", "says"), [
    ('{"url": 5, "token": "fy_x"}', "url must be text, got int"),
    ('{"url": "http://127.0.0.1:8000", "token": ["fy_x"]}', "token must be text, got list"),
    ("[1, 2]", "not a fleetyard config"),
    ("not json", "cannot read"),
])
def test_a_broken_config_file_is_a_config_error_naming_it(tmp_path, capsys, content, says):
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError, match=says):
        Client()
    assert main(["quota"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(tmp_path / "config.json") in err and "Traceback" not in err


def test_a_broken_config_file_is_not_read_when_the_environment_says_it_all(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("[1, 2]")
    monkeypatch.setenv("FLEETYARD_URL", "http://127.0.0.1:8000")
    monkeypatch.setenv("FLEETYARD_TOKEN", "fy_x")
    assert Client().url == "http://127.0.0.1:8000"


def test_login_that_cannot_write_its_config_says_so_and_leaves_nothing(server, tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "a-file" / "config.json"))
    with pytest.raises(ConfigError, match="cannot write .*a-file/config.json"):
        save_config(url="http://127.0.0.1:8000", token="fy_x")
    monkeypatch.setenv("FLEETYARD_CONFIG", str(tmp_path / "config.json"))
    (tmp_path / "config.json").mkdir()  # os.replace onto a directory fails after the .tmp file was written
    with pytest.raises(ConfigError, match="cannot write"):
        save_config(url="http://127.0.0.1:8000", token="fy_x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "config.json"]  # no config.tmp left


def test_a_404_names_what_was_looked_for(server, capsys):
    with pytest.raises(NotFound) as caught:
        Client(url=server, token="fy_x").training_job(99)
    assert str(caught.value) == "404: Not found. (GET /api/v1/training-jobs/99/)"
    assert main(["--url", server, "--token", "fy_x", "jobs", "status", "99"]) == 3
    assert "GET /api/v1/training-jobs/99/" in capsys.readouterr().err


def test_the_saved_token_is_not_sent_to_another_server(server):
    save_config(url="http://127.0.0.1:1", token="fy_saved")
    with pytest.raises(ConfigError) as caught:
        Client(url=server)
    assert "the saved API token is for http://127.0.0.1:1" in str(caught.value) and server in str(caught.value)
    assert Client(url="http://127.0.0.1:1/").token == "fy_saved"  # the server it was saved for (a trailing / alike)
    assert Client(url=server, token="fy_other").token == "fy_other"  # a token given for the other server
    assert main(["jobs", "status", "--url", server]) == 3  # the CLI: a one-line error, exit 3
    assert SEEN == []  # nothing reached the other server, the saved token least of all (review: the 404 it answers
    # for every path gave exit 3 too, so the exit code alone could not tell)


def test_a_next_link_to_another_address_is_followed_on_the_clients_own_server(server):
    """A `next` page link naming another host (a proxy's, say) is followed on this client's own server: the token
    is never sent elsewhere (review, 2026-11-29)."""
    client = Client(url=server, token="fy_x")
    assert client._url("http://elsewhere.example:9/api/v1/training-jobs/?page=2") == \
        f"{server}/api/v1/training-jobs/?page=2"
    assert client._url(f"{server}/api/v1/x/?page=3") == f"{server}/api/v1/x/?page=3"
