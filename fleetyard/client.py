"""A typed Python client of the Fleetyard REST API (/api/v1/).

    from fleetyard import Client
    client = Client()                           # FLEETYARD_URL / FLEETYARD_TOKEN, or the login config file
    result = client.apply_spec(open("train.yaml").read())
    job_id = result["object"]["id"]
    for line in client.logs(job_id, follow=True):   # yields until the job ends
        print(line.line)
    job = client.wait_for_job(job_id, timeout=600)

Token auth (`Authorization: Bearer fy_...`), retries with exponential backoff on 429 / 5xx / connection
errors (POST and PATCH only where the server cannot have acted: 429 and refused connections),
pagination iterators, a log-streaming generator, wait-for-state helpers and typed errors
(`fleetyard.errors`). Pure Python (requests): no Django, no Ray, no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import requests

from fleetyard.errors import (
    ApiError,
    BadRequest,
    ConfigError,
    ConnectionFailed,
    RateLimited,
    ServerError,
    TimeoutExpired,
)
from fleetyard.spec import accelerator_slug

JOB_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
DEPLOYMENT_TERMINAL = ("DELETED", "FAILED")
DEFAULT_CONFIG = Path("~/.config/fleetyard/config.json")


# ------------------------------------------------------------------------------------ configuration

def config_path() -> Path:
    return Path(os.environ.get("FLEETYARD_CONFIG") or DEFAULT_CONFIG).expanduser()


def load_config() -> dict:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a fleetyard config (a JSON object with url and token); run `fleetyard login`")
    for key in ("url", "token"):  # (a number or a list here was an AttributeError traceback; QA)
        if data.get(key) is not None and not isinstance(data[key], str):
            raise ConfigError(f"{path}: {key} must be text, got {type(data[key]).__name__}; run `fleetyard login`")
    return data


def save_config(*, url: str, token: str) -> Path:
    """Write the URL and token for later commands, readable by the owner only."""
    path = config_path()
    tmp = path.with_suffix(".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"url": url, "token": token}, handle)
        os.replace(tmp, path)
    except OSError as exc:  # (a traceback before; QA) - and no half-written .tmp file left behind
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc} (set FLEETYARD_CONFIG to a file you can "
                          "write)") from None
    return path


# ------------------------------------------------------------------------------------ typed results

@dataclass
class TrainingJob:
    id: int
    name: str
    team: str
    state: str
    reason: str
    queue: str
    queue_position: int | None
    accelerator_types: list[str]
    admitted_accelerator_type: str
    step: int | None
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.state in JOB_TERMINAL

    @classmethod
    def from_dict(cls, data: dict) -> TrainingJob:
        _check_object(data, "a training job")
        spec, status = data.get("spec", {}), data.get("status", {})
        return cls(id=data["id"], name=data["name"], team=data.get("team", ""), state=status.get("state", ""),
                   reason=status.get("reason", ""), queue=spec.get("queue", ""),
                   queue_position=status.get("queue_position"),
                   accelerator_types=list(spec.get("accelerator_types", [])),
                   admitted_accelerator_type=status.get("admitted_accelerator_type", ""),
                   step=status.get("step"), raw=data)


@dataclass
class Deployment:
    id: int
    name: str
    team: str
    state: str
    reason: str
    raw: dict = field(repr=False, default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.state in DEPLOYMENT_TERMINAL

    @classmethod
    def from_dict(cls, data: dict) -> Deployment:
        _check_object(data, "a deployment")
        status = data.get("status", {})
        return cls(id=data["id"], name=data["name"], team=data.get("team", ""), state=status.get("state", ""),
                   reason=status.get("reason", ""), raw=data)


@dataclass
class LogLine:
    id: int
    attempt: int
    worker: int | None
    line: str
    recorded_at: str

    @classmethod
    def from_dict(cls, data: dict) -> LogLine:
        if not (isinstance(data, dict) and isinstance(data.get("id"), int) and isinstance(data.get("line"), str)):
            raise _not_the_api(data, "a log line")
        return cls(id=data["id"], attempt=data.get("attempt", 0), worker=data.get("worker"), line=data["line"],
                   recorded_at=data.get("recorded_at", ""))


def _not_the_api(data, what: str) -> ApiError:
    """The server answered JSON, but not the API's (another service at that address, a proxy's JSON page): before,
    a KeyError or AttributeError traceback from the first field read (QA)."""
    preview = json.dumps(data)
    preview = preview if len(preview) <= 80 else preview[:77] + "..."
    return ApiError(f"the server answered {preview} where {what} was expected: not the Fleetyard API's answer (is "
                    "the server URL right?)", body=data)


def _check_object(data, what: str) -> None:
    if not (isinstance(data, dict) and isinstance(data.get("id"), int) and isinstance(data.get("name"), str)
            and isinstance(data.get("spec", {}), dict) and isinstance(data.get("status", {}), dict)):
        raise _not_the_api(data, what)


def _results(page, what: str) -> list[dict]:
    """The `results` of a page (a list of objects), or ApiError."""
    results = page.get("results") if isinstance(page, dict) else None
    if not isinstance(results, list) or not all(isinstance(item, dict) for item in results):
        raise _not_the_api(page, f"a page of {what}")
    return results


# ------------------------------------------------------------------------------------ the client

class Client:
    """One session against one server. Arguments override FLEETYARD_URL / FLEETYARD_TOKEN, which override
    the config file `fleetyard login` writes (~/.config/fleetyard/config.json, or FLEETYARD_CONFIG)."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 max_retries: int = 4, backoff: float = 0.5, session: requests.Session | None = None):
        url = url or os.environ.get("FLEETYARD_URL")
        token = token or os.environ.get("FLEETYARD_TOKEN")
        config = {} if (url and token) else load_config()  # (a broken config file matters only when it is read)
        self.url = (url or config.get("url") or "").strip().rstrip("/")
        self.token = (token or config.get("token") or "").strip()
        saved_url = str(config.get("url") or "").strip().rstrip("/")
        if not token and config.get("token") and saved_url and self.url and self.url != saved_url:
            # The saved token belongs to the server it was saved for: sent to another one (`--url OTHER` without a
            # token), it would hand that server the credential (found by QA).
            raise ConfigError(f"the saved API token is for {saved_url}, not {self.url}: give a token for {self.url} "
                              f"(--token or FLEETYARD_TOKEN) or run `fleetyard login --url {self.url}`")
        if not self.url:
            raise ConfigError("no server: run `fleetyard login` or set FLEETYARD_URL")
        if not self.token:
            raise ConfigError("no API token: run `fleetyard login` or set FLEETYARD_TOKEN (create one in the "
                              "console or with POST /api/v1/api-tokens/)")
        check_server_url(self.url)
        if not (self.token.isascii() and self.token.isprintable()) or any(c.isspace() for c in self.token):
            # (requests raised UnicodeEncodeError / InvalidHeader from deep inside: a traceback; QA)
            raise ConfigError("the API token has characters no token has (spaces, control or non-ASCII characters): "
                              "copy it again (it starts with fy_)")
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"Bearer {self.token}"
        self.session.headers["User-Agent"] = "fleetyard-sdk/0.1"

    # -------------------------------------------------------------------------------- plumbing

    def _url(self, path: str) -> str:
        if path.startswith("http://") or path.startswith("https://"):
            link, own = urllib.parse.urlsplit(path), urllib.parse.urlsplit(self.url)
            if (link.scheme, link.netloc) != (own.scheme, own.netloc):
                # A link the server built for another address (a `next` page behind a proxy, say): followed here,
                # on this client's own server, so the token is never sent anywhere else (review, 2026-11-29).
                return urllib.parse.urlunsplit((own.scheme, own.netloc, link.path, link.query, ""))
            return path
        return f"{self.url}/api/v1/{path.lstrip('/')}"

    def request(self, method: str, path: str, *, stream: bool = False, timeout: float | None = None,
                deadline: float | None = None, **kwargs) -> requests.Response:
        """One call with retries; returns the response or raises a typed ApiError. With `deadline` (a
        time.monotonic() instant), no attempt's HTTP timeout and no retry's backoff reaches past it: when it passes
        first, TimeoutExpired (the wait helpers' total stays within their timeout; before, each poll could take the
        client's 30 s timeout and its retries past it; QA)."""
        idempotent = method.upper() in ("GET", "HEAD", "OPTIONS", "PUT", "DELETE")
        attempt = 0
        while True:
            limit = timeout or self.timeout
            cut = False  # the deadline, not the client's timeout, bounds this attempt
            if deadline is not None:
                left = _time_left(deadline, f"{method} {path} was not sent")
                cut, limit = left < limit, min(limit, left)
            try:
                response = self.session.request(method, self._url(path), stream=stream, timeout=limit, **kwargs)
            except requests.ConnectionError as exc:
                refused = "refused" in str(exc).lower()
                why = f"cannot reach {self.url}: {exc.__class__.__name__}"
                if attempt < self.max_retries and (idempotent or refused) and _rewindable(kwargs):
                    self._sleep(attempt, None, deadline, why)
                    attempt += 1
                    continue
                raise ConnectionFailed(why, method=method, url=self._url(path)) from None
            except requests.Timeout:
                why = f"{method} {path} timed out after {limit:g} s"
                if cut:
                    raise TimeoutExpired(f"{why}: no answer before the time ran out") from None
                if attempt < self.max_retries and idempotent:
                    self._sleep(attempt, None, deadline, why)
                    attempt += 1
                    continue
                raise ConnectionFailed(why, method=method, url=self._url(path)) from None
            except requests.RequestException as exc:  # too many redirects, a bad header, ...: a typed error
                raise ConnectionFailed(f"{method} {self._url(path)} failed: {exc.__class__.__name__}: {exc}",
                                       method=method, url=self._url(path)) from None
            retryable = response.status_code == 429 or (response.status_code >= 500 and idempotent)
            if retryable and attempt < self.max_retries and _rewindable(kwargs):
                response.close()
                self._sleep(attempt, response.headers.get("Retry-After"), deadline,
                            f"{method} {path} answered {response.status_code}")
                attempt += 1
                continue
            if response.status_code >= 400:
                error = ApiError.from_response(response)
                if isinstance(error, RateLimited | ServerError):
                    error.args = (f"{error.args[0]} (after {attempt} retries)",)
                raise error
            return response

    def _sleep(self, attempt: int, retry_after: str | None, deadline: float | None = None, why: str = "") -> None:
        """The backoff before a retry; TimeoutExpired (saying `why` a retry was wanted) instead of a sleep that would
        reach the deadline."""
        delay = self.backoff * (2 ** attempt) * (0.5 + random.random() / 2)
        if retry_after:
            with contextlib.suppress(ValueError):
                delay = max(delay, min(float(retry_after), 60.0))
        if deadline is not None and time.monotonic() + delay >= deadline:
            raise TimeoutExpired(f"{why}; no time left to try again")
        time.sleep(delay)

    def _json(self, response: requests.Response):
        """The answer's JSON, or an ApiError saying the server is not answering as the API does (before, a page
        that was not JSON, say from a URL that is not a Fleetyard server, raised a JSONDecodeError traceback; QA)."""
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("Content-Type", "").split(";")[0].strip() or "no content type"
            raise ApiError(f"{response.request.method} {response.url} answered {response.status_code} with {kind}, "
                           f"not the API's JSON: is {self.url} the Fleetyard server's address?",
                           status=response.status_code, body=response.text[:2000], method=response.request.method,
                           url=response.url) from None

    def get(self, path: str, **params) -> dict | list:
        return self._json(self.request("GET", path, params={k: v for k, v in params.items() if v is not None}))

    def _get_by(self, path: str, deadline: float | None):
        """GET with a deadline (see request): what the wait helpers poll with."""
        return self._json(self.request("GET", path, deadline=deadline))

    def post(self, path: str, body: dict | None = None, **params) -> dict:
        response = self.request("POST", path, json=body or {}, params=params or None)
        return self._json(response) if response.content else {}

    def paginate(self, path: str, *, page_size: int = 100, **params) -> Iterator[dict]:
        """Every object of a paginated list, following `next` links, each once.

        The list is read by cursor (`?cursor=`, the API's keyset mode: each page starts after the last row of the one
        before), so an object that leaves a filtered list while it is read (a job that stops RUNNING while
        `state=RUNNING` is listed) does not shift the next one back onto a page already read, where a page-number
        reader missed it (QA). A server without the mode (a 400 naming `cursor`) is read by page numbers, as is a
        call that gives `page`. An object a later page shows again (with page numbers, a job submitted between two
        pages of a newest-first list pushes the last of one page onto the next) is not yielded twice (it was; QA)."""
        url: str | None = self._url(path)
        query = {"page_size": page_size, **{k: v for k, v in params.items() if v is not None}}
        by_cursor = "page" not in query and "cursor" not in query
        seen: set = set()
        while url:
            try:
                page = self._json(self.request("GET", url, params={**query, "cursor": ""} if by_cursor else query))
            except BadRequest as exc:
                if not (by_cursor and isinstance(exc.body, dict) and "cursor" in exc.body):
                    raise
                by_cursor = False  # a server that has no cursor mode, or a list it cannot read by cursor
                continue
            by_cursor = False  # the `next` link carries the cursor (and the rest of the query) from here on
            if isinstance(page, list) and all(isinstance(item, dict) for item in page):
                yield from page
                return
            for item in _results(page, "results"):
                key = item.get("id")
                if isinstance(key, int | str):
                    if key in seen:
                        continue
                    seen.add(key)
                yield item
            url, query = page.get("next"), None

    # -------------------------------------------------------------------------------- who am I

    def me(self) -> dict:
        me = self.get("me/")
        if not isinstance(me, dict) or not isinstance(me.get("username"), str):
            raise ApiError(f"GET {self._url('me/')} did not name a user: is {self.url} the Fleetyard server's "
                           "address?", status=200, body=me, method="GET", url=self._url("me/"))
        return me

    # -------------------------------------------------------------------------------- specs

    def apply_spec(self, text: str, *, dry_run: bool = False, secrets: dict[str, str] | None = None,
                   filename: str = "spec.yaml") -> dict:
        """Submit a YAML spec (POST /api/v1/specs/apply/): the plan, and the created object unless dry_run.

        Returns {"kind", "dry_run", "plan", "warnings", "object"}; a spec mistake is a BadRequest whose
        body's `spec` lists `file:line: field: reason` lines."""
        body = {"spec": text, "filename": filename, "secrets": dict(secrets or {})}
        return self.post("specs/apply/", body, **({"dry_run": "1"} if dry_run else {}))

    # -------------------------------------------------------------------------------- training jobs

    def training_jobs(self, **filters) -> Iterator[TrainingJob]:
        """Jobs you can see; filters as the API's (`state=QUEUED`, `queue=default`, `ordering=-created_at`)."""
        for item in self.paginate("training-jobs/", **filters):
            yield TrainingJob.from_dict(item)

    def training_job(self, job_id: int, *, deadline: float | None = None) -> TrainingJob:
        """``deadline``: see Client.request (the wait helpers poll with it)."""
        return TrainingJob.from_dict(self._get_by(f"training-jobs/{int(job_id)}/", deadline))

    def create_training_job(self, body: dict) -> TrainingJob:
        return TrainingJob.from_dict(self.post("training-jobs/", body))

    def cancel_training_job(self, job_id: int, *, reason: str = "") -> TrainingJob:
        return TrainingJob.from_dict(self.post(f"training-jobs/{int(job_id)}/cancel/", {"reason": reason}))

    def retry_training_job(self, job_id: int) -> TrainingJob:
        """A new job with an ended job's spec (secrets copied by the server), named `<name>-retry-<n>`."""
        return TrainingJob.from_dict(self.post(f"training-jobs/{int(job_id)}/retry/", {}))

    def training_job_events(self, job_id: int) -> Iterator[dict]:
        return self.paginate(f"training-jobs/{int(job_id)}/events/")

    def metrics(self, job_id: int, *, after: int | None = None, limit: int | None = None) -> list[dict]:
        """The job's step metrics (every worker's), oldest first: every row after `after`, read a page at a time, or
        with `limit` at most that many. (Before, one page of 1,000 rows: a 2-worker job of 1,000 steps came back cut
        at step 500 with nothing to say so; QA.)"""
        path, rows = f"training-jobs/{int(job_id)}/metrics/", []
        while limit is None or len(rows) < limit:
            want = 1000 if limit is None else min(1000, limit - len(rows))
            page = self.get(path, after=after, limit=want)
            results = _results(page, "metrics")
            rows.extend(results)
            if len(results) < want or not isinstance(page.get("next_after"), int):
                break
            after = page["next_after"]
        return rows

    def logs(self, job_id: int, *, follow: bool = False, after: int | None = None, worker: int | None = None,
             poll_timeout: int = 300) -> Iterator[LogLine]:
        """The job's log lines, oldest first. With follow, keeps streaming (NDJSON) and returns when the job
        has ended and every line is read; a dropped stream is resumed after the last line seen."""
        path = f"training-jobs/{int(job_id)}/logs/"
        if not follow:
            while True:
                page = _results(self.get(path, after=after, worker=worker, limit=1000), "log lines")
                for item in page:
                    line = LogLine.from_dict(item)
                    after = line.id
                    yield line
                if not page:
                    return
        bad_lines = 0  # lines in a row that were not log lines, each followed by a resume
        while True:
            params = {"follow": "true", "timeout": poll_timeout, "after": after, "worker": worker}
            try:
                response = self.request("GET", path, params={k: v for k, v in params.items() if v is not None},
                                        stream=True, timeout=poll_timeout + 30)
                with response:
                    for raw in response.iter_lines():
                        if raw:
                            line = _log_line(raw)
                            if line is None:
                                # A stream cut in the middle of a line (a connection closed early, where the body
                                # ends when the connection does) leaves half a line: a JSONDecodeError traceback
                                # before (QA). Resume after the last whole line, as for any broken stream; a
                                # server that answers something else entirely is an error after a few tries.
                                bad_lines += 1
                                if bad_lines > self.max_retries:
                                    raise _not_a_log_stream(response, raw, self.url)
                                break
                            bad_lines = 0
                            after = line.id
                            yield line
                if bad_lines:
                    time.sleep(self.backoff)
                    continue
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):
                time.sleep(self.backoff)  # the stream broke: resume after the last line seen
                continue
            # The server ends a stream when the job ended or its timeout passed; only the first is the end.
            if self.training_job(job_id).is_terminal:
                tail = _results(self.get(path, after=after, worker=worker, limit=1000), "log lines")
                for item in tail:
                    line = LogLine.from_dict(item)
                    after = line.id  # (left behind, the next stream sent these lines again; QA)
                    yield line
                if not tail:
                    return

    def wait_for_job(self, job_id: int, *, states: tuple[str, ...] = JOB_TERMINAL, timeout: float = 3600,
                     poll: float = 1.0) -> TrainingJob:
        """Poll until the job is in one of `states` (default: ended); TimeoutExpired otherwise."""
        return _wait(lambda deadline: self.training_job(job_id, deadline=deadline), states, timeout, poll,
                     f"training job {job_id}")

    # -------------------------------------------------------------------------------- deployments

    def deployments(self, **filters) -> Iterator[Deployment]:
        for item in self.paginate("deployments/", **filters):
            yield Deployment.from_dict(item)

    def deployment(self, deployment_id: int, *, deadline: float | None = None) -> Deployment:
        """``deadline``: see Client.request (the wait helpers poll with it)."""
        return Deployment.from_dict(self._get_by(f"deployments/{int(deployment_id)}/", deadline))

    def scale_deployment(self, deployment_id: int, *, replicas_min: int, replicas_max: int | None = None) -> Deployment:
        body = {"replicas_min": replicas_min, "replicas_max": replicas_max}
        return Deployment.from_dict(self.post(f"deployments/{int(deployment_id)}/scale/", body))

    def delete_deployment(self, deployment_id: int) -> None:
        self.request("DELETE", f"deployments/{int(deployment_id)}/")

    def wait_for_deployment(self, deployment_id: int, *, states: tuple[str, ...] = ("SERVING",),
                            timeout: float = 600, poll: float = 1.0) -> Deployment:
        """Poll until the deployment is in one of `states` (default: SERVING); TimeoutExpired when `timeout` passes
        first (the whole wait, requests included, keeps to it) or it ends DELETED or FAILED."""
        return _wait(lambda deadline: self.deployment(deployment_id, deadline=deadline), states, timeout, poll,
                     f"deployment {deployment_id}", give_up=DEPLOYMENT_TERMINAL)

    # -------------------------------------------------------------------------------- datasets

    def datasets(self, **filters) -> Iterator[dict]:
        return self.paginate("datasets/", **filters)

    def dataset_by_name(self, name: str) -> dict | None:
        return next(iter(d for d in self.paginate("datasets/", name=name) if d["name"] == name), None)

    def create_dataset(self, name: str, *, description: str = "", team: str | None = None) -> dict:
        body = {"name": name, "description": description, **({"team": team} if team else {})}
        return self.post("datasets/", body)

    def upload_dataset(self, name: str, path: str | os.PathLike, *, fmt: str = "", description: str = "",
                       team: str | None = None, progress: Callable[[int, int], None] | None = None) -> dict:
        """Upload a file as the next version of dataset `name`, creating the dataset if there is none. The file is
        checked first (ValueError: not a readable, non-empty file), before anything is created; when the upload
        then fails (a 400, a lost connection, Ctrl-C), a dataset this call created is deleted again, so a failed
        upload leaves nothing new behind. Returns the new version."""
        check_upload_file(path)
        dataset = self.dataset_by_name(name)
        created = dataset is None
        if created:
            dataset = self.create_dataset(name, description=description, team=team)
        try:
            return self.upload_dataset_version(dataset["id"], path, fmt=fmt, description=description,
                                               progress=progress)
        except BaseException as exc:
            if created:
                self._undo_dataset_create(dataset, exc)
            raise

    def _undo_dataset_create(self, dataset: dict, exc: BaseException) -> None:
        """Delete the dataset an upload created, unless a version reached it meanwhile (another upload's)."""
        try:
            current = self.get(f"datasets/{int(dataset['id'])}/")
            if current.get("version_count"):
                exc.add_note(f"dataset {dataset['name']} was kept: it has {current['version_count']} version(s)")
                return
            self.request("DELETE", f"datasets/{int(dataset['id'])}/")
        except Exception as undo:  # say so rather than hide the upload's own error
            exc.add_note(f"dataset {dataset['name']} (id {dataset['id']}) was created for this upload and could "
                         f"not be deleted again: {undo}")

    def upload_dataset_version(self, dataset_id: int, path: str | os.PathLike, *, fmt: str = "",
                               description: str = "", progress: Callable[[int, int], None] | None = None) -> dict:
        """Upload a file as the dataset's next version, streamed (never read whole into memory);
        `progress(sent_bytes, total_bytes)` is called as it goes."""
        size, digest = _size_and_sha256(Path(path))
        # The server checks both against what it received: a file cut short or changed on the way is refused, not
        # stored as good (review, 2026-11-29: only raw API calls sent them).
        fields = {"format": fmt, "description": description, "size_bytes": str(size), "checksum_sha256": digest}
        body = _MultipartFile(Path(path), fields, progress)
        response = self.request("POST", f"datasets/{int(dataset_id)}/versions/", data=body,
                                headers={"Content-Type": body.content_type}, timeout=max(self.timeout, 600))
        return self._json(response)

    # -------------------------------------------------------------------------------- parallel plans

    def plan(self, model: str | dict, global_batch_size: int, *, pools=(), devices=(), options: dict | None = None,
             compare: bool = False) -> dict:
        """Plan a training run without submitting it (POST /api/v1/plans/): the best parallel layout (DP / TP /
        PP / EP, micro-batches, recomputation, ZeRO) with its predicted step time, tokens/s, MFU, memory and
        price, ranked alternatives, and with `compare` each accelerator type alone beside the mix.

        `model`: a preset name ("llama2-70b") or a dict of model fields. `pools`: a list of node pool names, or
        "name:DEVICES" / (name, devices) / {"pool", "devices"} to use part of a pool. `devices`: a list of hypothetical
        devices as "TYPE:COUNT[:PER_NODE]", (accelerator_type, count[, devices_per_node]) or {"accelerator_type",
        "count", ...} dicts. A malformed entry raises ValueError before anything is sent.
        Nothing is written or reserved; predictions come from the planner's cost model, not measured runs."""
        body = {"model": model, "global_batch_size": global_batch_size,
                "pools": [plan_pool(entry) for entry in _entries(pools, "pools")],
                "devices": [plan_devices(entry) for entry in _entries(devices, "devices")], "compare": bool(compare)}
        if options:
            body["options"] = dict(options)
        return self.post("plans/", body)

    # -------------------------------------------------------------------------------- queues and quota

    def local_queues(self) -> list[dict]:
        return list(self.paginate("local-queues/"))

    def cluster_queues(self) -> list[dict]:
        return list(self.paginate("cluster-queues/"))

    def accelerator_types(self) -> list[dict]:
        return list(self.paginate("accelerator-types/"))


def _log_line(raw: bytes) -> LogLine | None:
    """One NDJSON line of a log stream, or None when it is not a whole log line."""
    try:
        item = json.loads(raw)
        return LogLine.from_dict(item) if isinstance(item, dict) and isinstance(item.get("id"), int) else None
    except (ValueError, KeyError, TypeError):
        return None


def _not_a_log_stream(response: requests.Response, raw: bytes, url: str) -> ApiError:
    return ApiError(f"GET {response.url} streamed {raw[:80]!r}, not a log line (NDJSON): is {url} the Fleetyard "
                    "server's address?", status=response.status_code, body=raw[:2000].decode(errors="replace"),
                    method="GET", url=response.url)


def _time_left(deadline: float, what: str) -> float:
    """Seconds until `deadline` (time.monotonic()), or TimeoutExpired saying `what` when none are left."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutExpired(f"{what}: the time ran out")
    return left


def _wait(fetch, states, timeout, poll, what, give_up=()):
    """Poll `fetch(deadline)` until the object is in one of `states`. The whole wait keeps to `timeout`: each poll's
    request (its HTTP timeout and retries, through the deadline `fetch` passes to Client.request) and each sleep are
    cut to the time left (before, a poll slept its full interval and asked with the client's 30 s timeout and
    retries, however little was left: `deploy --wait 5` could take minutes; QA). TimeoutExpired when the time runs
    out, or the object ends in a state it cannot leave; its `last` is the object as last seen."""
    deadline = time.monotonic() + timeout
    wanted = ", ".join(states)
    last = None
    while True:
        if last is not None and time.monotonic() >= deadline:
            raise TimeoutExpired(f"{what} is still {last.state} ({last.reason}) after {timeout:g} s; waited for "
                                 f"{wanted}", last=last)
        try:
            obj = fetch(deadline)
        except TimeoutExpired as exc:
            seen = f"still {last.state} ({last.reason})" if last is not None else "no state read"
            raise TimeoutExpired(f"{what} did not reach {wanted} within {timeout:g} s: {seen}; {exc}",
                                 last=last) from None
        last = obj
        if obj.state in states:
            return obj
        if obj.state in give_up or (states != JOB_TERMINAL and getattr(obj, "is_terminal", False)):
            raise TimeoutExpired(f"{what} ended {obj.state} ({obj.reason}) while waiting for {wanted}", last=obj)
        time.sleep(max(0.0, min(poll, deadline - time.monotonic())))


def check_server_url(url: str) -> str:
    """The server's base URL, or ConfigError saying what is wrong with it (before, requests raised InvalidURL,
    MissingSchema or InvalidSchema from deep inside: a traceback; QA)."""
    example = "for example http://127.0.0.1:8000"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError as exc:
        raise ConfigError(f"server URL {url!r}: {exc} ({example})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"server URL {url!r}: give an http:// or https:// address ({example})")
    if not url.isprintable() or any(c.isspace() for c in url):
        raise ConfigError(f"server URL {url!r}: has a space or a control character in it")
    if parts.query or parts.fragment or parts.path.rstrip("/").endswith("/api/v1"):
        raise ConfigError(f"server URL {url!r}: give the server's address, without /api/v1 or a query ({example})")
    return url


def plan_pool(entry) -> dict:
    """A node pool for Client.plan: "name", "name:DEVICES", (name, devices) or {"pool": name, "devices": n}.
    Anything else is a ValueError that says what is accepted."""
    if isinstance(entry, dict):
        return dict(entry)
    if isinstance(entry, str):
        name, sep, count = entry.partition(":")
        if not name:
            raise ValueError(f"a pool is NAME or NAME:DEVICES, got {entry!r}")
        return {"pool": name, "devices": _positive(count, entry)} if sep else {"pool": name}
    if isinstance(entry, tuple | list) and len(entry) == 2 and isinstance(entry[0], str):
        return {"pool": entry[0], "devices": entry[1]}
    raise ValueError(f"a pool is a name, \"NAME:DEVICES\", (name, devices) or a dict, got {entry!r}")


def plan_devices(entry) -> dict:
    """Hypothetical devices for Client.plan: "TYPE:COUNT[:PER_NODE]", (type, count[, per_node]) or a dict of the API's
    fields. The type may be written as a spec writes it (H100, h100, nvidia-h100): a known short name becomes its
    slug (before, "H100" went to the server as is and came back as an unknown type; found by QA); any other name is
    sent as given, for the server to judge. Anything else is a ValueError that says what is accepted."""
    if isinstance(entry, dict):
        body = dict(entry)
        if isinstance(body.get("accelerator_type"), str):
            body["accelerator_type"] = _known_slug(body["accelerator_type"])
        return body
    if isinstance(entry, str):
        parts = entry.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError(f"devices are TYPE:COUNT or TYPE:COUNT:DEVICES_PER_NODE, got {entry!r}")
        entry = (parts[0], *(_positive(part, entry) for part in parts[1:]))
    if isinstance(entry, tuple | list) and len(entry) in (2, 3) and isinstance(entry[0], str):
        body = {"accelerator_type": _known_slug(entry[0]), "count": entry[1]}
        if len(entry) == 3:
            body["devices_per_node"] = entry[2]
        return body
    raise ValueError(f"devices are \"TYPE:COUNT[:PER_NODE]\", (type, count[, per_node]) or a dict, got {entry!r}")


def _known_slug(name: str) -> str:
    """The slug of a known accelerator name (spec.accelerator_slug), or the name as given."""
    try:
        return accelerator_slug(name)
    except ValueError:
        return name


def _positive(text: str, whole: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{whole}: {text!r} is not a positive whole number")
    return value


def _entries(value, what: str) -> list:
    """`pools` / `devices` of Client.plan: a list or tuple of entries (a bare string would be read letter by
    letter, and a single tuple as two entries)."""
    if isinstance(value, str | dict) or not isinstance(value, list | tuple):
        raise ValueError(f"{what} takes a list of entries, got {value!r}")
    # (a count second: ["a100:8", {...}] is two entries, which this refused before)
    if what == "devices" and len(value) in (2, 3) and isinstance(value[0], str) and isinstance(value[1], int | float) \
            and not isinstance(value[1], bool):
        raise ValueError(f"devices takes a list of entries: write [{tuple(value)!r}], not {tuple(value)!r}")
    return list(value)


def check_upload_file(path: str | os.PathLike) -> int:
    """The size of a file that can be uploaded as a dataset version, or ValueError saying why not: it is missing,
    not a regular file, unreadable, or empty (the server refuses an empty file)."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ValueError(f"{path}: not a file" if path.exists() else f"{path}: no such file")
        with path.open("rb") as handle:
            first = handle.read(1)
        size = path.stat().st_size
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if not first or size == 0:
        raise ValueError(f"{path}: the file is empty; a dataset version needs some data")
    return size


def _rewindable(kwargs: dict) -> bool:
    """A streamed upload body cannot be sent twice unless it can rewind."""
    data = kwargs.get("data")
    if isinstance(data, _MultipartFile):
        data.rewind()
    return True


def _size_and_sha256(path: Path) -> tuple[int, str]:
    """The file's size and SHA-256, read in chunks (never whole into memory)."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_MultipartFile.CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


class _MultipartFile:
    """A multipart/form-data body read in chunks from disk, with a known length (so the server gets a
    Content-Length, not chunked encoding) and a progress callback."""

    CHUNK = 1 << 20

    def __init__(self, path: Path, fields: dict[str, str], progress: Callable[[int, int], None] | None):
        self.path = path
        self.boundary = f"fleetyard-{random.getrandbits(64):016x}"
        self.content_type = f"multipart/form-data; boundary={self.boundary}"
        head = b"".join(
            f'--{self.boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
            for name, value in fields.items()
        )
        filename = path.name.replace('"', "")
        head += (f'--{self.boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 f"Content-Type: application/octet-stream\r\n\r\n").encode()
        self.head = head
        self.tail = f"\r\n--{self.boundary}--\r\n".encode()
        self.size = path.stat().st_size
        self.len = len(self.head) + self.size + len(self.tail)
        self.progress = progress
        self._handle = None
        self.rewind()

    def __len__(self) -> int:
        return self.len

    def rewind(self) -> None:
        if self._handle is not None:
            self._handle.close()
        self._handle = None
        self._stage = 0
        self._sent = 0

    def read(self, size: int = -1) -> bytes:
        if self._stage == 0:
            self._stage = 1
            self._handle = self.path.open("rb")
            return self.head
        if self._stage == 1:
            chunk = self._handle.read(self.CHUNK if size is None or size < 0 else min(size, self.CHUNK))
            if chunk:
                self._sent += len(chunk)
                if self.progress:
                    self.progress(self._sent, self.size)
                return chunk
            self._handle.close()
            self._stage = 2
            return self.tail
        return b""
