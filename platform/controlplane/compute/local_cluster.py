"""Starts and stops a local multi-node Ray cluster on this host, one Ray node per node-pool node.

The embedded profile and the integration tests run the node pools of `deploy/node_pools.yaml` as
several Ray nodes on one machine: a head (GCS, no work) plus one `ray start --block` process per
NodeSpec, each advertising its pool's chips as custom resources (`accel:<type>`), its CPUs and its
topology labels. Chips are logical on a host without them; the work itself runs on CPU.

Everything it starts it stops by process id, never with `ray stop` (which would also kill other
people's Ray on the same host): each node runs in its own session / process group, and a stop
signals those groups plus any straggler whose command line names this cluster's private temp dir.

The cluster gets its own auth token (a file in the state dir), its own free GCS port, its own Ray
temp dir, no dashboard unless asked, small object stores, and GCS health checks tuned so that a
dead node is noticed within a few seconds. No Ray import here: it drives the `ray` CLI, so any
process (web, Celery, scripts) can call it cheaply.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from controlplane.compute.topology import NodeSpec, Topology

STATE_FILE = "ray-cluster.json"
TOKEN_FILE = "ray-auth-token"  # noqa: S105 - a file name, not a secret  # nosec B105
HEAD_NAME = "head"
HOST = "127.0.0.1"

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's minimum is 75 MiB; 7 nodes share one small host
START_TIMEOUT_S = 90.0
STOP_GRACE_S = 2.0

# GCS health checks of the raylets (Ray reads RAY_<config name> from the environment). Defaults
# notice a dead node after ~15-30 s; these after ~3-4 s, with enough slack that a busy 2-core host
# does not declare a live node dead (a node declared dead kills itself).
HEALTH_CHECK_ENV = {
    "RAY_health_check_initial_delay_ms": "2000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "3",
}


class LocalClusterError(RuntimeError):
    pass


@dataclass
class LocalCluster:
    """A running local cluster as recorded in `state_dir/ray-cluster.json`."""

    address: str  # GCS address host:port, for ray.init(address=...)
    state_dir: Path
    temp_dir: Path
    token_path: Path
    pids: dict[str, int]  # node name ("head" or NodeSpec.name) -> pid of its `ray start --block`
    start_ticks: dict[str, int] = field(default_factory=dict)  # identity check against pid reuse
    node_names: list[str] = field(default_factory=list)
    fingerprint: str = ""
    dashboard_url: str = ""
    started_at: float = 0.0
    # What `restart_node` needs to start a node again as it was: NodeSpec fields by node name, the
    # fate_share flag of the start, and how many times each node was started again (its temp sub-dir).
    node_specs: dict[str, dict] = field(default_factory=dict)
    fate_share: bool = False
    restarts: dict[str, int] = field(default_factory=dict)

    def client_env(self) -> dict[str, str]:
        """Environment another process needs to connect with ray.init(address=...)."""
        return {
            "RAY_ADDRESS": self.address,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    def node_pid(self, name: str) -> int:
        return self.pids[name]

    def node_alive(self, name: str) -> bool:
        """Whether the node's `ray start --block` process (the same one we started) still runs."""
        pid = self.pids[name]
        return _alive(pid) and _start_ticks(pid) == self.start_ticks.get(name, _start_ticks(pid))

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Fault injection: kill one node the way losing its machine does: its process group (raylet,
        agents) and every descendant at the same moment, including the Ray workers the raylet starts
        in process groups of their own (killing the group alone left them training for ~2.5 s)."""
        leader = self.pids[name]
        if leader not in _trusted_groups(self):
            return
        victims = _group_and_descendants(leader)
        _signal_group(leader, sig)
        for pid in victims:
            _signal(pid, sig)

    def restart_node(self, name: str, *, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> int:
        """Fault injection's other half: start a killed node again with the same name, labels and
        resources (under a new Ray node id, as a replaced machine gets) and, with `wait`, until it has
        registered with the GCS (`wait_node_started` waits later). Returns its new pid; a node whose
        process still runs is left alone. With `fate_share`, the node dies with the calling thread
        (PR_SET_PDEATHSIG), so call it from the thread that outlives the cluster."""
        if name == HEAD_NAME or name not in self.node_specs:
            raise LocalClusterError(f"{name!r} is not a restartable node of this cluster "
                                    f"(known: {', '.join(sorted(self.node_specs)) or 'none recorded'})")
        with _state_lock(self.state_dir):
            if self.node_alive(name):
                return self.pids[name]
            if self.pids[name] in _trusted_groups(self):  # what survived of the old incarnation goes first
                for pid in _group_and_descendants(self.pids[name]):
                    _signal(pid, signal.SIGKILL)
            self.restarts[name] = self.restarts.get(name, 0) + 1
            index = self.node_names.index(name) + 1
            log_dir = self.state_dir / "logs"
            log_path = log_dir / f"{name}.log"
            if log_path.exists():
                log_path.replace(log_dir / f"{name}.{self.restarts[name] - 1}.log")
            # A fresh temp sub-dir: the dead raylet's sockets and session files stay where they were.
            cmd = _worker_cmd(self, NodeSpec(name=name, **self.node_specs[name]),
                              self.temp_dir / f"n{index}r{self.restarts[name]}")
            _record(self, name, _spawn(cmd, _node_env(self), log_path, self.fate_share))
            _save(self)
        if wait:
            self.wait_node_started(name, timeout_s=timeout_s)
        return self.pids[name]

    def wait_node_started(self, name: str, *, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the node's `ray start` says it registered; LocalClusterError if it exits or times out."""
        _wait_started(self, name, self.state_dir / "logs", time.monotonic() + timeout_s)

    def processes(self) -> set[int]:
        """Pids of every live (non-zombie) process of this cluster; empty once it is stopped."""
        return {p for p in _cluster_processes(self) if _alive(p)}

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("state_dir", "temp_dir", "token_path"):
            data[key] = str(data[key])
        return data

    @classmethod
    def from_json(cls, data: dict) -> LocalCluster:
        return cls(address=data["address"], state_dir=Path(data["state_dir"]),
                   temp_dir=Path(data["temp_dir"]), token_path=Path(data["token_path"]),
                   pids={str(k): int(v) for k, v in data["pids"].items()},
                   start_ticks={str(k): int(v) for k, v in data.get("start_ticks", {}).items()},
                   node_names=list(data.get("node_names", [])), fingerprint=data.get("fingerprint", ""),
                   dashboard_url=data.get("dashboard_url", ""), started_at=float(data.get("started_at", 0)),
                   node_specs={str(k): dict(v) for k, v in data.get("node_specs", {}).items()},
                   fate_share=bool(data.get("fate_share", False)),
                   restarts={str(k): int(v) for k, v in data.get("restarts", {}).items()})


# ---------------------------------------------------------------------------------------------
# public API


def start_local_cluster(*, topology: Topology, state_dir: Path, port: int | None = None,
                        include_dashboard: bool = False, fate_share: bool = False,
                        timeout_s: float = START_TIMEOUT_S) -> LocalCluster:
    """Start the head and one Ray node per NodeSpec; reuse the recorded cluster if it is healthy.

    A recorded cluster that is half dead or was started from another topology is stopped first.
    The nodes outlive the calling process (scripts/up), unless `fate_share` (tests): then the
    kernel sends them SIGTERM when the calling thread dies, even if it is SIGKILLed.
    Concurrent calls on one state dir are serialised by a lock file.
    """
    state_dir = Path(state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    with _state_lock(state_dir):
        return _start_locked(topology=topology, state_dir=state_dir, port=port,
                             include_dashboard=include_dashboard, fate_share=fate_share, timeout_s=timeout_s)


def _start_locked(*, topology: Topology, state_dir: Path, port: int | None, include_dashboard: bool,
                  fate_share: bool, timeout_s: float) -> LocalCluster:
    specs = topology.node_specs()
    fingerprint = _fingerprint(topology)
    running = load_running_cluster(state_dir=state_dir)
    if running is not None and running.fingerprint == fingerprint:
        return running
    _stop_locked(state_dir)

    token_path = state_dir / TOKEN_FILE
    _write_private(token_path, secrets.token_hex(32))
    # Short on purpose: Ray puts unix sockets under it (108-byte path limit). One sub-dir per node:
    # nodes sharing a temp dir race for socket names when they start at the same time.
    temp_dir = Path(tempfile.mkdtemp(prefix="fy-ray-", dir="/tmp"))  # noqa: S108 - mkdtemp: private, unique  # nosec B108
    log_dir = state_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    gcs_port = port or _free_port()
    cluster = LocalCluster(address=f"{HOST}:{gcs_port}", state_dir=state_dir, temp_dir=temp_dir,
                           token_path=token_path, pids={}, node_names=[s.name for s in specs],
                           fingerprint=fingerprint, started_at=time.time(), fate_share=fate_share,
                           node_specs={s.name: {"pool": s.pool, "num_cpus": s.num_cpus, "resources": dict(s.resources),
                                                "labels": dict(s.labels)} for s in specs})
    env = _node_env(cluster)
    try:
        dash_port = _free_port()
        head_cmd = _ray_cmd() + [
            "start", "--head", "--block", f"--port={gcs_port}", f"--temp-dir={temp_dir / 'n0'}",
            f"--num-cpus={node_cpus(topology.head_cpus)}", f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats", f"--ray-client-server-port={_free_port()}",
            "--dashboard-agent-listen-port=0", f"--dashboard-port={dash_port}",
            f"--include-dashboard={'true' if include_dashboard else 'false'}",
        ]
        if include_dashboard:
            head_cmd.append("--dashboard-host=127.0.0.1")
            cluster.dashboard_url = f"http://{HOST}:{dash_port}"
        _record(cluster, HEAD_NAME, _spawn(head_cmd, env, log_dir / f"{HEAD_NAME}.log", fate_share))
        _save(cluster)  # record early: a failed start is still stopped by pid
        deadline = time.monotonic() + timeout_s
        head_log = _wait_started(cluster, HEAD_NAME, log_dir, deadline)
        # Ray advertises the host's routable IP, even when asked for 127.0.0.1.
        match = re.search(r"ray start --address='([^']+)'", _strip_ansi(head_log))
        if match:
            cluster.address = match.group(1)

        for index, spec in enumerate(specs, start=1):
            cmd = _worker_cmd(cluster, spec, temp_dir / f"n{index}")
            pid = _spawn(cmd, env, log_dir / f"{spec.name}.log", fate_share)
            _record(cluster, spec.name, pid)
        _save(cluster)
        for spec in specs:
            _wait_started(cluster, spec.name, log_dir, deadline)
    except BaseException:
        _save(cluster)
        _stop_locked(state_dir)
        raise
    return cluster


def stop_local_cluster(*, state_dir: Path) -> bool:
    """Stop every process the recorded cluster started, by pid. True if a cluster was recorded."""
    if not (Path(state_dir) / STATE_FILE).exists():
        return False
    with _state_lock(Path(state_dir)):
        return _stop_locked(Path(state_dir))


def _stop_locked(state_dir: Path) -> bool:
    state_path = Path(state_dir) / STATE_FILE
    cluster = _load_state(Path(state_dir))
    if cluster is None:
        return False
    groups = _trusted_groups(cluster)
    targets = _cluster_processes(cluster)
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(_alive(p) for p in targets):
        time.sleep(0.1)
    # Kill whatever is left, including processes started while we waited.
    for _ in range(3):
        left = {p for p in _cluster_processes(cluster) if _alive(p)}
        if not left:
            break
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        for pid in left:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.2)
    left = {p for p in _cluster_processes(cluster) if _alive(p)}
    if left:
        raise LocalClusterError(f"Ray processes survived SIGKILL: {sorted(left)}")
    if cluster.temp_dir.name.startswith("fy-ray-"):
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    state_path.unlink(missing_ok=True)
    return True


def load_running_cluster(*, state_dir: Path) -> LocalCluster | None:
    """The recorded cluster if all its node processes are alive and its GCS answers, else None."""
    cluster = _load_state(Path(state_dir))
    if cluster is None or not cluster.pids:
        return None
    if not all(cluster.node_alive(name) for name in cluster.pids):
        return None
    if set(cluster.pids) != {HEAD_NAME, *cluster.node_names}:
        return None
    host, _, port = cluster.address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            pass
    except OSError:
        return None
    return cluster


# ---------------------------------------------------------------------------------------------
# commands and environment


def _ray_cmd() -> list[str]:
    ray_bin = Path(sys.executable).with_name("ray")
    if ray_bin.exists():
        return [str(ray_bin)]
    found = shutil.which("ray")
    if not found:
        raise LocalClusterError("the `ray` command is not installed next to this Python")
    return [found]


def _node_env(cluster: LocalCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS")}
    env.update(HEALTH_CHECK_ENV)
    env.update({
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(cluster.token_path),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _worker_cmd(cluster: LocalCluster, spec: NodeSpec, temp_dir: Path) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in spec.labels.items())
    return _ray_cmd() + [
        "start", "--block", f"--address={cluster.address}", f"--temp-dir={temp_dir}",
        f"--num-cpus={node_cpus(spec.num_cpus)}", f"--resources={json.dumps(spec.resources)}",
        f"--labels={labels}", f"--object-store-memory={OBJECT_STORE_BYTES}", "--disable-usage-stats",
        "--dashboard-agent-listen-port=0", "--include-log-monitor=false",
    ]


def node_cpus(value: float) -> int:
    """CPUs a Ray node advertises for a NodeSpec's num_cpus.

    Ray 2.60 refuses fractional node resources ("Resource quantities must all be whole numbers"), so
    a fractional `cpus_per_node` is rounded up: the CPUs are logical and the host is shared anyway.
    """
    return math.ceil(value)


def _spawn(cmd: list[str], env: dict[str, str], log_path: Path, fate_share: bool) -> int:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                preexec_fn=_die_with_parent if fate_share else None)
    return proc.pid


def _die_with_parent() -> None:
    """In the child before exec: ask the kernel for SIGTERM when the parent thread dies (Linux)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


@contextlib.contextmanager
def _state_lock(state_dir: Path):
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "ray-cluster.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _record(cluster: LocalCluster, name: str, pid: int) -> None:
    cluster.pids[name] = pid
    cluster.start_ticks[name] = _start_ticks(pid)


def _wait_started(cluster: LocalCluster, name: str, log_dir: Path, deadline: float) -> str:
    """`ray start --block` prints "Ray runtime started." once its node is registered with GCS."""
    pid = cluster.pids[name]
    log_path = log_dir / f"{name}.log"
    while True:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if "Ray runtime started" in text:
            return text
        if not _alive(pid):
            raise LocalClusterError(f"Ray node {name} exited during start; see {log_path}:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            raise LocalClusterError(f"Ray node {name} did not start in time; see {log_path}")
        time.sleep(0.2)


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _fingerprint(topology: Topology) -> str:
    parts = [topology.cluster_name, str(topology.head_cpus)]
    for spec in topology.node_specs():
        parts.append(json.dumps([spec.name, spec.num_cpus, spec.resources, spec.labels], sort_keys=True))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# state file


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _save(cluster: LocalCluster) -> None:
    _write_private(cluster.state_dir / STATE_FILE, json.dumps(cluster.to_json(), indent=2))


def _load_state(state_dir: Path) -> LocalCluster | None:
    try:
        return LocalCluster.from_json(json.loads((state_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ---------------------------------------------------------------------------------------------
# processes (Linux /proc; no psutil in the control plane)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _start_ticks(pid: int) -> int:
    """Process start time in clock ticks since boot (field 22 of /proc/<pid>/stat); 0 if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(raw[raw.rfind(")") + 2:].split()[19])


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap our own exited children so they do not linger as zombies
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _group_and_descendants(pgid: int) -> set[int]:
    """Every live process in the group `pgid` and every descendant of one (whatever its group)."""
    parents: dict[int, int] = {}
    found: set[int] = set()
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is None:
            continue
        parents[pid] = stat[1]
        if stat[2] == pgid:
            found.add(pid)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    return found


def _trusted_groups(cluster: LocalCluster) -> set[int]:
    """Process groups (= leader pids) still ours: the leader is the process we started, or it is
    gone (Linux does not hand out a pid again while a process group still uses it as its id)."""
    trusted = set()
    for name, pid in cluster.pids.items():
        ticks = _start_ticks(pid)
        if ticks == 0 or ticks == cluster.start_ticks.get(name, ticks):
            trusted.add(pid)
    return trusted


def _cluster_processes(cluster: LocalCluster) -> set[int]:
    """Our node processes, their process groups and descendants, and anything naming our temp dir."""
    leader_set = _trusted_groups(cluster)
    marker = str(cluster.temp_dir).encode()
    parents: dict[int, int] = {}
    found: set[int] = set()
    for pid in _all_pids():
        stat = _proc_stat(pid)
        if stat is None:
            continue
        parents[pid] = stat[1]
        if pid in leader_set or stat[2] in leader_set:
            found.add(pid)
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            found.add(pid)
    # descendants of what we found (workers re-grouped by the raylet, for example)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                changed = True
    found.discard(os.getpid())
    return found


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
