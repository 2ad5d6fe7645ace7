"""Typed errors of the Fleetyard SDK: spec mistakes (with line, field and reason) and API failures.

Pure Python: no Django, no Ray, no torch (the SDK runs on a laptop).
"""

from __future__ import annotations

import html
import re
import urllib.parse
from dataclasses import dataclass


class FleetyardError(Exception):
    """Base class of every error the SDK raises on purpose."""


@dataclass(frozen=True)
class SpecIssue:
    """One mistake in a spec: where (line, dotted field path) and why."""

    line: int | None
    field: str
    reason: str

    def format(self, filename: str = "spec.yaml") -> str:
        where = f"{filename}:{self.line}" if self.line else filename
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"

    def to_dict(self) -> dict:
        return {"line": self.line, "field": self.field, "reason": self.reason}


class SpecError(FleetyardError):
    """A spec that cannot be turned into a request; `issues` lists every mistake found."""

    def __init__(self, issues: list[SpecIssue], *, filename: str = "spec.yaml"):
        self.issues = list(issues)
        self.filename = filename
        super().__init__("\n".join(issue.format(filename) for issue in self.issues))

    @property
    def messages(self) -> list[str]:
        return [issue.format(self.filename) for issue in self.issues]


class ConfigError(FleetyardError):
    """No server URL or token: the user has not logged in or set FLEETYARD_URL / FLEETYARD_TOKEN."""


class TimeoutExpired(FleetyardError):
    """A wait-for-state helper gave up (the time ran out, or the object ended in a state it cannot leave); `last` is
    the object as last seen (None when no answer came in time). A request given a deadline (Client.request) raises it
    too, when the deadline passes before an answer."""

    def __init__(self, message: str, *, last=None):
        self.last = last
        super().__init__(message)


class ApiError(FleetyardError):
    """The REST API answered with an error (or could not be reached: `status` is None)."""

    def __init__(self, message: str, *, status: int | None = None, body=None, method: str = "", url: str = ""):
        self.status = status
        self.body = body
        self.method = method
        self.url = url
        super().__init__(message)

    @classmethod
    def from_response(cls, response) -> ApiError:
        try:
            body = response.json()
        except ValueError:
            body = response.text[:2000]
        message = describe_error_body(body) or f"HTTP {response.status_code}"
        if isinstance(body, str) and _looks_like_html(body, response.headers.get("Content-Type", "")):
            # a web page, not the API (a proxy's or Django's error page, or a URL that is not a Fleetyard server):
            # its title, not 2000 characters of HTML (QA)
            message = f"{_html_title(body) or response.reason or 'HTTP error'} (an HTML page, not the API's answer"
            message += ": is the server URL right?)" if response.status_code == 404 else ")"
        elif response.status_code == 404 and response.request is not None:
            # DRF says only "Not found.": name what was looked for (`jobs status 99` printed "404: Not found."; QA)
            path = urllib.parse.urlsplit(response.request.url or "").path
            message = f"{message} ({response.request.method} {path})"
        kind = _BY_STATUS.get(response.status_code)
        if kind is None:
            kind = ServerError if response.status_code >= 500 else ApiError
        return kind(f"{response.status_code}: {message}", status=response.status_code, body=body,
                    method=response.request.method if response.request is not None else "", url=response.url)


class BadRequest(ApiError):
    """400: the request (or the spec) is invalid; the body names the field and the reason."""


class AuthenticationError(ApiError):
    """401: no token, or a token that is wrong, expired or revoked."""


class PermissionDenied(ApiError):
    """403: the token's user lacks the role for this."""


class NotFound(ApiError):
    """404: no such object in the caller's teams."""


class Conflict(ApiError):
    """409: the object's state does not allow it (for example cancelling a finished job)."""


class RateLimited(ApiError):
    """429: slow down (retried with backoff before it is raised)."""


class ServerError(ApiError):
    """5xx (retried with backoff before it is raised)."""


class ConnectionFailed(ApiError):
    """The server could not be reached."""


_BY_STATUS = {400: BadRequest, 401: AuthenticationError, 403: PermissionDenied, 404: NotFound, 409: Conflict,
              429: RateLimited}


def _looks_like_html(text: str, content_type: str) -> bool:
    return "html" in content_type.lower() or text.lstrip()[:1] == "<"


def _html_title(text: str) -> str:
    match = re.search(r"<title[^>]*>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
    return " ".join(html.unescape(match.group(1)).split())[:200] if match else ""


def describe_error_body(body) -> str:
    """DRF error bodies (`{"detail": ...}` or `{"field": ["reason"]}`) as one readable line per problem."""
    if isinstance(body, str):
        return body.strip()
    if isinstance(body, list):
        return "; ".join(describe_error_body(item) for item in body)
    if not isinstance(body, dict):
        return str(body)
    if "spec" in body and isinstance(body["spec"], list):
        return "\n".join(str(line) for line in body["spec"])
    parts = []
    for key, value in body.items():
        if key == "errors":
            continue
        text = describe_error_body(value) if isinstance(value, dict | list) else str(value)
        parts.append(text if key in ("detail", "non_field_errors") else f"{key}: {text}")
    return "; ".join(parts)
