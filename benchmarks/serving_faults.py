"""Serving under faults (issue 8, R4): kill a Serve replica, then a gateway process, under steady load; overload.

    flock /tmp/fleetyard-ray.lock .venv/bin/python -m benchmarks.serving_faults [--clients 6] [--kills 3]
                                                                   [--overload-s 30] [--json PATH] [--no-write]

How a request travels: client -> the gateway (Django, /v1/completions, served by gunicorn workers: 2 processes x
16 threads, as `scripts/up` runs it) -> RayComputeBackend.stream_completion -> a Ray Serve deployment handle held
*inside that gunicorn worker* (Serve's HTTP proxies are disabled: `serve.start(proxy_location="Disabled")`) ->
an `LLMReplica` actor. So "the proxy", the process carrying requests from the gateway into Serve, is the gunicorn
worker holding the handle; gunicorn's master forks a new one when it dies.

What it does (everything measured in this run, on this host):
1. starts a local multi-node Ray cluster (node_pools.yaml), migrates a fresh SQLite database, creates a team,
   a token and a SERVING deployment row, deploys its service (2 replicas of the built-in LM, random weights, the
   cpu pool) with the spec the platform builds (inference.workflows.build_spec), and starts the gateway;
2. steady load: `--clients` threads stream short completions back to back; every request's start, first byte,
   end and outcome are kept; kills a replica (SIGKILL, pid from Ray's GCS actor table) and then a gunicorn worker,
   `--kills` times each, and reports per kill: requests in flight at the kill, in flight on the killed process
   (counted there just before the kill), failed, failed that were not in flight (must be 0), and the time until
   a request started after the kill succeeds, until throughput is back to half its level before the kill,
   and until the replacement (replica RUNNING / new gunicorn worker) is there;
3. overload: far more concurrent clients than slots + queues for `--overload-s` seconds: status counts, p50/p99
   latency of the refusals (429/503, each must carry Retry-After), and the RSS of the gunicorn workers and the
   replicas (start after a warm-up, peak, end).

Tables go to stdout, JSON to benchmarks/results/serving_faults.json. Exit status 1 when a kill failed a request
that was not in flight, a request hung, or a refusal came without Retry-After.
The test tests/integration/test_serving_faults.py runs a short variant with the same harness.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET, positive_float  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
HANDLE = "fy-serve-faults"
MODEL_NAME = "tales"
SHAPE = {"context": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
# 2 slots + 2 waiting per replica, 2 replicas: build_spec gives max_ongoing_requests 4 and max_queued_requests 8
ENGINE = {"slots": 2, "block_size": 8, "max_waiting": 2}
REQUEST_TIMEOUT_S = 30.0  # a request without an answer for this long counts as hung
GUNICORN_WORKERS = 2
GUNICORN_THREADS = 16


# ---------------------------------------------------------------------------------------------------- the model


def write_model(directory: Path) -> Path:
    """A checkpoint of the built-in LM with random (seeded) weights: this measures serving, not text."""
    from jobs.runtime.lm import write_random_model_dir

    return write_random_model_dir(directory, SHAPE, seed=5)


def deployment_fields(model_dir: Path) -> dict:
    """The Deployment row (a SERVING deployment of MODEL_NAME on the cpu pool) both the test and the benchmark use."""
    return dict(name=MODEL_NAME, accelerator_types=["cpu"], devices_per_replica=0.0, replicas_min=2, replicas_max=2,
                sla_ttft_p95_ms=5000, sla_tpot_p95_ms=1000, engine=dict(ENGINE), router="prefix", revision=1,
                state="SERVING", compute_handle=HANDLE, replicas_ready=2, replicas_target=2, applied_revision=1,
                accelerator_type="cpu", pool="cpu-pool", model_dir=str(model_dir))


def service_spec(model_dir: Path):
    """The ServiceSpec the platform builds for that deployment (inference.workflows.build_spec)."""
    from inference.models import Deployment
    from inference.workflows import autoscaling_for, build_spec

    deployment = Deployment(id=1, **deployment_fields(model_dir))
    return build_spec(deployment, autoscaling_for(deployment))


def wait_replicas(backend, count: int, timeout_s: float = 120.0, *, exclude_pids: frozenset[int] = frozenset()):
    """Wait until the service has `count` RUNNING replicas, none of them one of `exclude_pids`; their pids."""
    deadline = time.monotonic() + timeout_s
    status, pids = None, []
    while time.monotonic() < deadline:
        status = backend.observe_service(HANDLE)
        pids = replica_pids(HANDLE)
        if (status.state == "running" and status.replicas_running == count and len(pids) == count
                and not exclude_pids & set(pids)):
            return pids
        time.sleep(0.2)
    raise AssertionError(f"the service did not get {count} running replicas in {timeout_s:g} s: {status}, {pids}")


# ---------------------------------------------------------------------------------------------------- processes


def replica_actors(handle: str) -> list[dict]:
    """The live replica actors of the service's "llm" deployment, from the GCS actor table: name and pid.

    (Ray's state API, ray.util.state.list_actors, needs the dashboard, which the local cluster does not run.)
    """
    from ray._private import state as ray_state

    table = ray_state.state.actor_table(None, actor_state_name="ALIVE")
    return [{"name": a["Name"], "pid": int(a["Pid"])} for a in table.values()
            if a.get("ActorClassName", "").startswith("ServeReplica:") and f":{handle}:" in f"{a['ActorClassName']}:"
            and a.get("Pid")]


def replica_pids(handle: str) -> list[int]:
    return sorted(a["pid"] for a in replica_actors(handle))


def replica_ongoing(actor_name: str) -> int:
    """Requests the replica is handling right now (Serve's own count, asked of the replica actor)."""
    import ray

    actor = ray.get_actor(actor_name, namespace="serve")
    return int(ray.get(actor.get_num_ongoing_requests.remote(), timeout=5))


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return sorted(found)


def established_connections(pid: int, port: int) -> int:
    """TCP connections to `port` that process `pid` holds open (the requests it has accepted), from /proc."""
    inodes = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:["):-1])
    return sum(1 for parts in _tcp_sockets(port) if parts[3] == "01" and parts[9] in inodes)


def accept_queue(port: int) -> int:
    """Connections waiting to be accepted on the listening socket of `port` (the LISTEN entry's rx_queue in /proc)."""
    return sum(int(parts[4].split(":")[1], 16) for parts in _tcp_sockets(port) if parts[3] == "0A")


def _tcp_sockets(port: int):
    """The fields of each /proc/net/tcp(6) entry whose local port is `port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if int(parts[1].rsplit(":", 1)[1], 16) == port:
                    yield parts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GatewayServer:
    """The platform's web process as `scripts/up` runs it (gunicorn, gthread workers), in its own process group."""

    def __init__(self, *, env: dict[str, str], log_path: Path, workers: int = GUNICORN_WORKERS,
                 threads: int = GUNICORN_THREADS) -> None:
        self.port = free_port()
        self.log_path = log_path
        full_env = {**os.environ, **env, "DJANGO_SETTINGS_MODULE": "controlplane.settings",
                    "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "platform")]),
                    "FLEETYARD_ALLOWED_HOSTS": "127.0.0.1,localhost", "FLEETYARD_COMPUTE_BACKEND": "ray"}
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "gunicorn"), "controlplane.wsgi:application",
             f"--bind=127.0.0.1:{self.port}", f"--workers={workers}", f"--threads={threads}", "--timeout=120",
             "--graceful-timeout=5"],
            cwd=REPO_ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.workers = workers

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200 and len(self.worker_pids()) == self.workers:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"the gateway did not start in {timeout_s:g} s: {self.log_tail()}")

    def worker_pids(self) -> list[int]:
        return children_of(self.process.pid)

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self) -> None:
        """SIGTERM the master (it stops its workers), then SIGKILL whatever is left of the group, by its id."""
        pgid = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self._log.close()


# ---------------------------------------------------------------------------------------------------- the client


@dataclass
class Outcome:
    """One request as the client saw it. kind: ok | http (a status before streaming) | stream_error (an error event
    in the stream) | broken (the connection dropped, no [DONE]) | hung (no answer in REQUEST_TIMEOUT_S)."""

    started: float
    ended: float = 0.0
    first_byte: float | None = None
    kind: str = ""
    status: int = 0
    retry_after: str | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def completion(port: int, token: str, *, max_tokens: int = 8, prompt: str = "The robot said",
               timeout_s: float = REQUEST_TIMEOUT_S) -> Outcome:
    """One streamed /v1/completions on a fresh connection (Connection: close: one request per connection)."""
    outcome = Outcome(started=time.monotonic())
    body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json", "Connection": "close"})
        response = conn.getresponse()
        outcome.first_byte = time.monotonic()
        outcome.status = response.status
        outcome.retry_after = response.getheader("Retry-After")
        if response.status != 200:
            outcome.kind = "http"
            outcome.error = response.read(500).decode(errors="replace")
            return outcome
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            text = line.decode(errors="replace").strip()
            if text == "data: [DONE]":
                done = True
                break
            if text.startswith("data: ") and '"error"' in text:
                payload = json.loads(text[len("data: "):])
                if "error" in payload:
                    outcome.kind = "stream_error"
                    outcome.error = payload["error"].get("message", "")[:300]
        if not outcome.kind:
            outcome.kind = "ok" if done else "broken"
    except TimeoutError as exc:
        outcome.kind, outcome.error = "hung", str(exc)
    except (OSError, http.client.HTTPException) as exc:
        outcome.kind, outcome.error = "broken", f"{type(exc).__name__}: {exc}"
    finally:
        outcome.ended = time.monotonic()
        conn.close()
    return outcome


class SteadyLoad:
    """`clients` threads sending completions back to back until stopped; every outcome is kept."""

    def __init__(self, port: int, token: str, *, clients: int, max_tokens: int = 8) -> None:
        self.port, self.token, self.max_tokens = port, token, max_tokens
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def _run(self, index: int) -> None:
        while not self._stop.is_set():
            outcome = completion(self.port, self.token, max_tokens=self.max_tokens, prompt=f"client {index} says")
            with self._lock:
                self.outcomes.append(outcome)

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_S + 10)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)


# ---------------------------------------------------------------------------------------------------- kills


@dataclass
class Kill:
    target: str  # "replica" | "gateway worker"
    pid: int
    probed_at: float  # when the in-flight count on the process was taken
    in_flight_probe: int  # requests on the process at probed_at (Serve's count / its connections and the accept queue)
    killed_at: float
    replaced_at: float | None = None  # a replacement runs: a new replica RUNNING, a new gunicorn worker
    others: list[int] = field(default_factory=list)


def sigkill_and_wait_dead(pid: int, timeout_s: float = 5.0) -> float:
    """SIGKILL `pid` and return when it is really gone (exited or a zombie): the moment it stopped accepting work.

    os.kill returns before a loaded host has torn the process down; a connection the dying worker accepted in between
    was started before this moment, so it counts as in flight on the killed process, not as one started after."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                state = stat.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.002)
    return time.monotonic()


def kill_replica(backend) -> Kill:
    actors = replica_actors(HANDLE)
    ongoing_by_name = {a["name"]: replica_ongoing(a["name"]) for a in actors}
    victim = max(actors, key=lambda a: ongoing_by_name[a["name"]])  # the busiest: the kill breaks streams
    probed_at = time.monotonic()
    ongoing = replica_ongoing(victim["name"])
    killed_at = sigkill_and_wait_dead(victim["pid"])
    kill = Kill("replica", victim["pid"], probed_at, ongoing, killed_at,
                others=[a["pid"] for a in actors if a is not victim])
    wait_replicas(backend, len(actors), exclude_pids=frozenset({victim["pid"]}))
    kill.replaced_at = time.monotonic()
    return kill


def kill_gateway_worker(server: GatewayServer) -> Kill:
    """SIGKILL a gunicorn worker. In flight on it: the connections it holds, and those waiting in the shared
    listening socket's accept queue, any of which it may accept before it dies (CI, 2026-11-26: a request queued
    there failed uncounted, 2 failed with 1 counted). Stopping the worker first (SIGSTOP) to count exactly was tried:
    requests then waited on the stopped worker and failed after the kill."""
    workers = server.worker_pids()
    victim = workers[0]
    probed_at = time.monotonic()
    ongoing = established_connections(victim, server.port) + accept_queue(server.port)
    killed_at = sigkill_and_wait_dead(victim)
    kill = Kill("gateway worker", victim, probed_at, ongoing, killed_at,
                others=[pid for pid in workers if pid != victim])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = server.worker_pids()
        if len(now) == len(workers) and victim not in now:
            kill.replaced_at = time.monotonic()
            break
        time.sleep(0.05)
    return kill


def kill_report(kill: Kill, outcomes: list[Outcome], *, settle_s: float) -> dict:
    """What the kill cost, from every request's outcome around it."""
    at = kill.killed_at
    in_flight = [o for o in outcomes if o.started < at < o.ended]
    failed = [o for o in outcomes if not o.ok]
    # A request the kill broke may end before `at`: the client sees its connection reset while this process is
    # still polling /proc for the death (2026-11-26 on this host: four resets 0-1 ms before `at`, all started before
    # it, counted as failures of requests started after the kill). In flight at the kill: started before the process
    # was gone, ended after the kill began (its probe, just before the signal).
    failed_in_flight = [o for o in failed if o.started < at and o.ended > kill.probed_at]
    window = [o for o in outcomes if o.started >= kill.probed_at and o.started < at]
    # ... and those waiting at the probe for their first byte: a router or listening socket may still hand them to
    # the process before it dies (CI, 2026-11-26: a replica kill failed 3 with 2 counted)
    waiting = [o for o in outcomes if o.started < kill.probed_at < o.ended
               and (o.first_byte is None or o.first_byte > kill.probed_at)]
    before = [o for o in outcomes if o.ok and at - settle_s <= o.ended < at]
    rate_before = len(before) / settle_s
    after_ok = sorted(o.ended for o in outcomes if o.ok and o.started > at)
    first_success = after_ok[0] - at if after_ok else None
    recovered = None
    for end in after_ok:  # the first moment the last second carried half the rate before the kill
        if sum(1 for e in after_ok if end - 1.0 < e <= end) >= max(1.0, rate_before * 0.5):
            recovered = end - at
            break
    return {
        "target": kill.target,
        "pid": kill.pid,
        "requests_in_flight": len(in_flight),
        # counted there, plus any started since or still waiting to be served at the probe (an upper bound)
        "in_flight_on_killed": kill.in_flight_probe + len(window) + len(waiting),
        "failed": len(failed),
        "failed_not_in_flight": len(failed) - len(failed_in_flight),
        "failed_kinds": sorted({o.kind for o in failed}),
        "failed_errors": sorted({o.error[:160] for o in failed})[:5],
        "hung": sum(1 for o in outcomes if o.kind == "hung"),
        "requests_total": len(outcomes),
        "rate_before_per_s": round(rate_before, 2),
        "first_success_after_s": None if first_success is None else round(first_success, 3),
        "throughput_recovered_s": None if recovered is None else round(recovered, 3),
        "replacement_s": None if kill.replaced_at is None else round(kill.replaced_at - at, 3),
    }


def run_kill(kill_fn, load: SteadyLoad, *, settle_s: float = 3.0, after_s: float = 10.0) -> dict:
    """Steady load for `settle_s`, the kill, then `after_s` more after the replacement; the report. The window
    after the kill is longer than a fresh gateway worker takes to connect to Ray and learn the replicas (about
    2 s on a busy 2-core host): at 4 s, CI once saw the first success at 2.1 s and the window end before the
    throughput was back, although the test allows 15 s."""
    begun = time.monotonic()
    time.sleep(settle_s)
    kill = kill_fn()
    time.sleep(after_s)
    end = time.monotonic()
    outcomes = [o for o in load.snapshot() if o.ended > begun and o.ended <= end]  # this kill's window only
    return kill_report(kill, outcomes, settle_s=settle_s)


# ---------------------------------------------------------------------------------------------------- overload


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


def overload(port: int, token: str, *, clients: int, duration_s: float, warmup_s: float, pids: dict[str, int],
             max_tokens: int = 48) -> dict:
    """`clients` threads back to back with long completions for warmup + duration; RSS of `pids` sampled."""
    stop = threading.Event()
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        while not stop.is_set():
            outcome = completion(port, token, max_tokens=max_tokens, prompt=f"overload {index}")
            with lock:
                outcomes.append(outcome)
            if outcome.kind == "http" and outcome.status in (429, 503):
                time.sleep(0.05)  # a polite client would wait Retry-After; this one only yields

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    samples: dict[str, list[float]] = {name: [] for name in pids}
    time.sleep(warmup_s)
    measure_from, measure_from_epoch = time.monotonic(), time.time()
    while time.monotonic() < measure_from + duration_s:
        for name, pid in pids.items():
            rss = rss_mib(pid)
            if rss is not None:
                samples[name].append(rss)
        time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=REQUEST_TIMEOUT_S + 10)
    measured = [o for o in outcomes if o.started >= measure_from]
    refused = [o for o in measured if o.kind == "http" and o.status in (429, 503)]
    statuses: dict[str, int] = {}
    for o in measured:
        key = str(o.status) if o.kind in ("ok", "http") else o.kind
        statuses[key] = statuses.get(key, 0) + 1
    latencies = [o.ended - o.started for o in refused]
    return {
        "clients": clients,
        "measured_from_epoch": measure_from_epoch,
        "seconds": round(time.monotonic() - started, 1),
        "measured_s": duration_s,
        "requests": len(measured),
        "statuses": statuses,
        "served": sum(1 for o in measured if o.ok),
        "refused": len(refused),
        "refused_without_retry_after": sum(1 for o in refused if not o.retry_after),
        "other_failures": sum(1 for o in measured if not o.ok) - len(refused),
        "hung": sum(1 for o in outcomes if o.kind == "hung"),
        "refusal_p50_ms": _ms(percentile(latencies, 50)),
        "refusal_p99_ms": _ms(percentile(latencies, 99)),
        "refusal_max_ms": _ms(max(latencies) if latencies else None),
        "rss_mib": {name: {"start": round(v[0], 1), "peak": round(max(v), 1), "end": round(v[-1], 1)}
                    for name, v in samples.items() if v},
    }


def recorded_refusals(since_epoch: float) -> dict:
    """The gateway's own time for its 429/503 answers since then (InferenceRequest.total_ms: from the view's start
    to the answer, so without the wait for a free gunicorn thread that the client also sees)."""
    import datetime

    from inference.models import InferenceRequest

    since = datetime.datetime.fromtimestamp(since_epoch, tz=datetime.UTC)
    values = [ms / 1000.0 for ms in InferenceRequest.objects.filter(
        created_at__gte=since, status_code__in=(429, 503)).values_list("total_ms", flat=True) if ms is not None]
    return {"recorded": len(values), "p50_ms": _ms(percentile(values, 50)), "p99_ms": _ms(percentile(values, 99)),
            "max_ms": _ms(max(values) if values else None)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


# ---------------------------------------------------------------------------------------------------- the command


def print_kill_table(kills: list[dict]) -> None:
    head = (f"{'killed':<15}{'in flight':>10}{'on killed':>10}{'failed':>8}{'beyond':>8}{'first ok s':>11}"
            f"{'recovered s':>12}{'replaced s':>11}")
    print(head)
    print("-" * len(head))
    for k in kills:
        print(f"{k['target']:<15}{k['requests_in_flight']:>10}{k['in_flight_on_killed']:>10}{k['failed']:>8}"
              f"{k['failed_not_in_flight']:>8}{_fmt(k['first_success_after_s']):>11}"
              f"{_fmt(k['throughput_recovered_s']):>12}{_fmt(k['replacement_s']):>11}")


def print_overload(result: dict) -> None:
    print(f"overload: {result['clients']} clients, {result['measured_s']:g} s measured: {result['requests']} requests "
          f"{result['statuses']}, without Retry-After {result['refused_without_retry_after']}, hung {result['hung']}")
    print(f"  refusal latency at the client:  p50 {result['refusal_p50_ms']} ms  p99 {result['refusal_p99_ms']} ms  "
          f"max {result['refusal_max_ms']} ms")
    gateway = result.get("refusal_in_gateway") or {}
    if gateway:
        print(f"  refusal time in the gateway:    p50 {gateway['p50_ms']} ms  p99 {gateway['p99_ms']} ms  "
              f"max {gateway['max_ms']} ms ({gateway['recorded']} recorded)")
    for name, rss in result["rss_mib"].items():
        print(f"  RSS {name:<18} start {rss['start']:>7.1f} MiB  peak {rss['peak']:>7.1f}  end {rss['end']:>7.1f}")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def setup_database(data_dir: Path) -> str:
    """Migrate a fresh SQLite database under `data_dir` for this process; its URL for the gateway."""
    url = f"sqlite://{data_dir / 'fleetyard.sqlite3'}"
    os.environ["FLEETYARD_DATA_DIR"] = str(data_dir)
    os.environ["FLEETYARD_DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    return url


def create_rows(model_dir: Path) -> str:
    """A team, its member's API token, its queue and the SERVING deployment; the raw token."""
    from django.contrib.auth import get_user_model

    from controlplane.cluster.services import accelerator_types_seed
    from controlplane.quotas.services import cluster_queue_create, local_queue_create
    from controlplane.tenancy.services import api_token_create, team_create
    from inference.models import Deployment

    accelerator_types_seed()
    users = get_user_model().objects
    ops = users.create_user("ops", password=None, is_staff=True)  # no password: they only hold the token
    admin = users.create_user("bench-admin", password=None)
    team = team_create(actor=ops, name="bench", admin=admin)
    cq = cluster_queue_create(actor=ops, name="shared", cohort="all", quotas=[
        {"accelerator_type": "cpu", "nominal_quota": 8}])
    queue = local_queue_create(actor=admin, team=team, name="default", cluster_queue=cq)
    Deployment.objects.create(team=team, local_queue=queue, created_by=admin, **deployment_fields(model_dir))
    _, token = api_token_create(actor=admin, team=team, user=admin, name="bench")
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clients", type=COUNT, default=6, help="steady-load client threads")
    parser.add_argument("--kills", type=OFFSET, default=2, help="kills of each kind")
    parser.add_argument("--overload-clients", type=COUNT, default=64)
    parser.add_argument("--overload-s", type=positive_float, default=30.0)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "serving_faults.json")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)

    from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
    from controlplane.compute.topology import load_topology

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fy-serving-faults-") as tmp:
        tmp_path = Path(tmp)
        db_url = setup_database(tmp_path / "data")
        model_dir = write_model(tmp_path / "model")
        token = create_rows(model_dir)
        cluster = start_local_cluster(topology=load_topology(), state_dir=tmp_path / "ray", fate_share=True)
        server = None
        try:
            from controlplane.compute.ray_backend import RayComputeBackend

            backend = RayComputeBackend(address=cluster.address, env=cluster.client_env())
            backend.deploy_service(service_spec(model_dir))
            wait_replicas(backend, 2)
            server = GatewayServer(env={**cluster.client_env(), "FLEETYARD_DATABASE_URL": db_url,
                                        "FLEETYARD_DATA_DIR": str(tmp_path / "data")},
                                   log_path=tmp_path / "gunicorn.log")
            server.wait_ready()
            kills = []
            with SteadyLoad(server.port, token, clients=args.clients) as load:
                time.sleep(3.0)  # both gunicorn workers connect to Ray on their first requests
                for _ in range(args.kills):
                    kills.append(run_kill(lambda: kill_replica(backend), load))
                    kills.append(run_kill(lambda: kill_gateway_worker(server), load))
            print_kill_table(kills)
            pids = {f"gateway worker {i}": pid for i, pid in enumerate(server.worker_pids())}
            pids.update({f"replica {i}": pid for i, pid in enumerate(replica_pids(HANDLE))})
            result = overload(server.port, token, clients=args.overload_clients, duration_s=args.overload_s,
                              warmup_s=5.0, pids=pids)
            result["refusal_in_gateway"] = recorded_refusals(result["measured_from_epoch"])
            print_overload(result)
        finally:
            if server is not None:
                server.stop()
            with contextlib.suppress(Exception):
                backend.shutdown_serving()
            import ray

            ray.shutdown()
            stop_local_cluster(state_dir=tmp_path / "ray")
    doc = {"benchmark": "serving_faults", "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "host": {"cpus": os.cpu_count()}, "clients": args.clients, "engine": ENGINE,
           "gunicorn": {"workers": GUNICORN_WORKERS, "threads": GUNICORN_THREADS},
           "kills": kills, "overload": result, "seconds": round(time.monotonic() - started, 1)}
    if not args.no_write:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    bad = (any(k["failed_not_in_flight"] or k["hung"] for k in kills) or result["hung"]
           or result["refused_without_retry_after"] or result["other_failures"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
