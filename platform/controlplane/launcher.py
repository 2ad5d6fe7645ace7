"""Starts the whole embedded platform on one machine and stops everything it started.

`manage.py up` (called by scripts/up): migrate, load the demo setup, start (or reuse) the local
multi-node Ray cluster of deploy/node_pools.yaml, then a Celery worker, Celery beat and the web
server as separate processes. Ctrl-C (or SIGTERM) stops them by process group, then the Ray
cluster by process id. Any child that dies takes the rest down with a message saying which.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.management import call_command

from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
from controlplane.compute.topology import load_topology
from controlplane.demo import load_demo

ROOT = Path(settings.ROOT_DIR)


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log_path: Path


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    paths = [str(ROOT), str(ROOT / "platform")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["FLEETYARD_DATA_DIR"] = str(settings.DATA_DIR)
    env.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    return env


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the launcher dies, even by SIGKILL, so nothing is orphaned."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: Ctrl-C still stops everything through stop_children
        pass


PR_SET_PDEATHSIG = 1


def spawn(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Child:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
    process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
    return Child(name=name, process=process, log_path=log_path)


def stop_children(children: list[Child], timeout: float = 15.0) -> None:
    """SIGTERM each leader (a warm shutdown: Celery and gunicorn stop their own pools), then sweep
    each process group with SIGKILL so nothing it spawned outlives it."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for child in children:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            child.process.wait(remaining)
        except subprocess.TimeoutExpired:
            _signal_group(child.process.pid, signal.SIGKILL)
            child.process.wait(5)
        # The group may hold grandchildren (Celery's pool processes) that outlive the leader.
        _signal_group(child.process.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def wait_for_http(url: str, timeout: float, child: Child) -> bool:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - our own local URL  # nosec B310
                if response.status < 500:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def port_refusal(host: str, port: int) -> str:
    """Why the web server could not listen on host:port, or "": checked before anything starts (before, a port in
    use migrated, started the worker and beat, and after 15 s said only "the web server did not start")."""
    import socket

    if not 1 <= port <= 65535:
        return f"--port must be between 1 and 65535, not {port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"--host {host!r} is not an address of this machine ({exc.strerror or exc})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: TIME_WAIT does not count
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use by another program; choose another with --port"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return ""


def hold_data_folder(data_dir: Path):
    """Lock the data folder for this run: the open lock file (keep it open while running; the lock goes with the
    process, however it ends), or a string saying why not. Before, a second `up` on the same folder started a second
    worker and beat on the same database and Ray state and removed the first run's processes.json when it stopped."""
    import fcntl

    lock = open(data_dir / "up.lock", "a+")  # noqa: SIM115 (held for the whole run)
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        return (f"Fleetyard is already running from {data_dir} (launcher pid {holder}): stop it first (Ctrl-C where it "
                "runs), or start this one with another FLEETYARD_DATA_DIR")
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def run(*, host: str, port: int, with_ray: bool) -> int:
    data_dir = Path(settings.DATA_DIR)
    log_dir = data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    say = lambda text: print(f"[fleetyard] {text}", flush=True)  # noqa: E731

    refusal = port_refusal(host, port)
    held = refusal or hold_data_folder(data_dir)
    if isinstance(held, str):
        say(held)
        return 2
    say(f"data folder: {data_dir}")
    call_command("migrate", interactive=False, verbosity=0)
    call_command("collectstatic", interactive=False, verbosity=0)
    login = load_demo()
    say("database migrated; demo setup loaded")

    extra = {"FLEETYARD_COMPUTE_BACKEND": "memory"}
    ray_state = data_dir / "ray"
    if with_ray:
        topology = load_topology()
        say(f"starting the local Ray cluster: head + {len(topology.node_specs())} nodes "
            f"({', '.join(f'{p.nodes}x {p.accelerator_type}' for p in topology.pools)}); "
            "accelerators are SIMULATED on this CPU host")
        cluster = start_local_cluster(topology=topology, state_dir=ray_state, fate_share=True)
        extra = {"FLEETYARD_COMPUTE_BACKEND": "ray", "RAY_ADDRESS": cluster.address, **cluster.client_env()}
        say(f"Ray cluster at {cluster.address}")
    env = child_env(extra)
    bin_dir = Path(sys.executable).parent
    children: list[Child] = []
    stopping = {"flag": False}

    def request_stop(signum, frame):
        stopping["flag"] = True

    pid_file = data_dir / "processes.json"  # what this run started, by pid (each leads its own group)
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        children.append(spawn("worker", [str(bin_dir / "celery"), "-A", "controlplane", "worker",
                                         "--loglevel=INFO", "--concurrency=2", "--hostname=worker@%h"],
                              env, log_dir))
        children.append(spawn("beat", [str(bin_dir / "celery"), "-A", "controlplane", "beat", "--loglevel=INFO",
                                       f"--schedule={data_dir / 'celerybeat-schedule'}"], env, log_dir))
        # Threads, not processes: a console tab following a job's logs or a playground answer holds one
        # thread for the length of its stream, and the pages' polling must not wait behind them.
        children.append(spawn("web", [str(bin_dir / "gunicorn"), "controlplane.wsgi:application",
                                      f"--bind={host}:{port}", "--workers=2", "--threads=16", "--timeout=120",
                                      "--access-logfile=-"], env, log_dir))
        pid_file.write_text(json.dumps({child.name: child.process.pid for child in children}))
        url = f"http://{host}:{port}/"
        if not wait_for_http(url + "healthz", 60, children[-1]):
            say(f"the web server did not start; see {children[-1].log_path}")
            return 1
        say(f"worker, beat and web started (logs in {log_dir})")
        say(f"console:  {url}")
        say(f"API:      {url}api/v1/   (OpenAPI docs: {url}api/v1/docs/)")
        say(f"login:    {login.username} / {login.password}")
        say("press Ctrl-C to stop everything")
        while not stopping["flag"]:
            for child in children:
                if child.process.poll() is not None:
                    say(f"{child.name} exited with code {child.process.returncode}; see {child.log_path}")
                    stopping["flag"] = True
                    code = 1
            time.sleep(0.5)
    finally:
        say("stopping web, beat and worker ...")
        stop_children(list(reversed(children)))
        pid_file.unlink(missing_ok=True)
        if with_ray:
            say("stopping the Ray cluster ...")
            stop_local_cluster(state_dir=ray_state)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        say("stopped")
    return code
