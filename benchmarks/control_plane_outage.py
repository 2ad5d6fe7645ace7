"""Control-plane outage benchmark (issue 8, C3): web, Celery worker and beat SIGKILLed together during training.

The control plane runs as production starts it (`controlplane.launcher`): a Celery worker (prefork, 2
processes), Celery beat (the reconcilers) and the web server (gunicorn), as separate processes on one shared
database (the embedded SQLite file in WAL mode, so the same run works in CI's pass 1 with Ray) and the
file-system broker, against a local multi-node Ray cluster. Through the REST API it submits two training jobs
(h100: 2 workers, a100: 1 worker) and a third (a100: 1 worker, long), lets them run, then SIGKILLs the process
groups of web, worker and beat at the same moment, waits 0 / 20 / 60 s while training goes on in Ray (the gang
supervisors are detached actors; it peeks at their step without acknowledging any event), starts the three
again and at once cancels the third job. Then it lets the two jobs finish and compares:

- the job list (GET /api/v1/training-jobs/) has exactly the three jobs, once each, as before the outage;
- each job's metrics (GET .../metrics/) are exactly steps 0..N-1 once per worker: no gaps, no duplicates;
  its state and step are what the run reported (SUCCEEDED at step N-1, the last checkpoint at step N-1);
- the cancelled job is CANCELLED, its run is gone from Ray and its quota is free (how long that took);
- after the end, Ray holds no placement group, training actor or resource.

    .venv/bin/python benchmarks/control_plane_outage.py [--outages 0,20,60] [--json PATH] [--no-write]

The test variant (20 s) is tests/integration/test_control_plane_outage.py. Accelerators are SIMULATED; the
work runs on this host's CPUs. Run it under `flock /tmp/fleetyard-ray.lock` on a shared host.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform as std_platform
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks.churn import cluster_leftovers, duplicate_count, format_table, is_clean  # noqa: E402

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
STEP_SLEEP_S = 0.1
# Steps of the two measured jobs: long enough to be mid-run during the outage and the restart.
STEPS_BASE, STEPS_PER_OUTAGE_S = 250, 6


def steps_for(outage_s: float) -> int:
    return int(STEPS_BASE + STEPS_PER_OUTAGE_S * outage_s)


# ---------------------------------------------------------------------------------------------
# pure checks


def step_grid_problems(rows: Sequence[tuple[int, int]], *, steps: int, workers: int) -> dict:
    """(step, worker) rows against the full grid 0..steps-1 x 0..workers-1: what is missing or doubled."""
    counts = Counter(rows)
    expected = {(step, worker) for step in range(steps) for worker in range(workers)}
    return {"rows": len(rows), "expected": len(expected),
            "missing": sorted(expected - set(counts))[:20],
            "duplicates": sorted(k for k, n in counts.items() if n > 1)[:20],
            "unexpected": sorted(set(counts) - expected)[:20]}


def grid_ok(problems: dict) -> bool:
    return problems["rows"] == problems["expected"] and not (problems["missing"] or problems["duplicates"]
                                                             or problems["unexpected"])


# ---------------------------------------------------------------------------------------------
# the API, over HTTP


class Api:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    def call(self, method: str, path: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - http to our own server
            self.base_url + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own server  # nosec B310
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw[:500].decode(errors="replace")

    def ok(self, method: str, path: str, body: dict | None = None) -> Any:
        status, data = self.call(method, path, body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {data}")
        return data

    def jobs(self) -> list[dict]:
        return self.ok("GET", "/api/v1/training-jobs/?page_size=500&ordering=id")["results"]

    def job(self, job_id: int) -> dict:
        return self.ok("GET", f"/api/v1/training-jobs/{job_id}/")

    def metrics(self, job_id: int) -> list[dict]:
        rows, after = [], None
        while True:
            page = self.ok("GET", f"/api/v1/training-jobs/{job_id}/metrics/?limit=10000"
                                  + (f"&after={after}" if after is not None else ""))
            rows += page["results"]
            if not page["results"]:
                return rows
            after = page["next_after"]


# ---------------------------------------------------------------------------------------------
# the control plane's processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    from django.db import connection

    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite://{params['NAME']}"
    return f"postgres://{params['USER']}:{params['PASSWORD']}@{params['HOST'] or '127.0.0.1'}:" \
           f"{params['PORT'] or 5432}/{params['NAME']}"


class ControlPlaneProcesses:
    """Web (gunicorn), Celery worker and Celery beat, started as `controlplane.launcher` starts them, on the
    database this process uses and the file-system broker under the data folder."""

    def __init__(self, *, ray_env: dict[str, str], log_dir: Path, port: int | None = None) -> None:
        from django.conf import settings

        self.port = port or free_port()
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        data_dir = Path(settings.DATA_DIR)
        self.extra = {"FLEETYARD_DATABASE_URL": database_url(), "FLEETYARD_COMPUTE_BACKEND": "ray",
                      "CELERY_BROKER_URL": "filesystem://", "CELERY_TASK_ALWAYS_EAGER": "false",
                      "FLEETYARD_TRAINING_SYNC_SECONDS": "1", "FLEETYARD_SCHEDULING_SECONDS": "3",
                      "FLEETYARD_NODE_SYNC_SECONDS": "5", "FLEETYARD_MODEL_DIRS": str(data_dir / "models"),
                      **ray_env}
        self.data_dir = data_dir
        self.children: list = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 90.0) -> float:
        """Start the three; returns the seconds until the web server answered /healthz."""
        from controlplane.launcher import child_env, spawn, wait_for_http

        started = time.monotonic()
        env = child_env(self.extra)
        bin_dir = Path(sys.executable).parent
        self.children = [
            spawn("worker", [str(bin_dir / "celery"), "-A", "controlplane", "worker", "--loglevel=INFO",
                             "--concurrency=2", "--hostname=outage-worker@%h"], env, self.log_dir),
            spawn("beat", [str(bin_dir / "celery"), "-A", "controlplane", "beat", "--loglevel=INFO",
                           f"--schedule={self.data_dir / 'celerybeat-schedule'}"], env, self.log_dir),
            spawn("web", [str(bin_dir / "gunicorn"), "controlplane.wsgi:application", f"--bind=127.0.0.1:{self.port}",
                          "--workers=1", "--threads=8", "--timeout=120"], env, self.log_dir),
        ]
        if not wait_for_http(self.base_url + "/healthz", timeout, self.children[-1]):
            raise RuntimeError(f"the web server did not start: {self.tail('web')}")
        return round(time.monotonic() - started, 2)

    def kill(self) -> None:
        """SIGKILL every process group of the three at the same moment (a host losing power)."""
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.process.pid, signal.SIGKILL)
        for child in self.children:
            child.process.wait(10)

    def stop(self) -> None:
        from controlplane.launcher import stop_children

        stop_children(list(reversed(self.children)))

    def alive(self) -> dict[str, bool]:
        return {child.name: child.process.poll() is None for child in self.children}

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""


# ---------------------------------------------------------------------------------------------
# the scenario


def job_body(name: str, accelerator_type: str, *, workers: int, steps: int) -> dict:
    return {"name": name, "queue": "default", "accelerator_types": [accelerator_type], "workers_min": workers,
            "workers_max": workers, "devices_per_worker": 8, "checkpoint": {"interval_steps": 25, "keep_last": 2},
            "hyperparameters": {"steps": steps, "step_sleep_s": STEP_SLEEP_S}}


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, processes=None, interval=0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if processes is not None and not all(processes.alive().values()):
            raise RuntimeError(f"{what}: a control-plane process died {processes.alive()}\n"
                               f"{processes.tail('worker')}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s: {what}")
        time.sleep(interval)


def run_peek(backend, handle: str) -> dict:
    """The run's state and step as Ray has them, acknowledging nothing (since=0 keeps every event)."""
    report = backend.observe_training(handle, since=0)
    return {"state": report.state, "step": report.step}


def run_outage(*, backend, api: Api, processes: ControlPlaneProcesses, outage_s: float,
               log: Callable[[str], None] = print) -> dict:
    """One outage of `outage_s` seconds; returns the measurements and the checks (see the module doc)."""
    from jobs.models import TrainingJob, TrainingLogLine
    from jobs.selectors import quota_usage

    steps = steps_for(outage_s)
    result: dict[str, Any] = {"outage_s": outage_s, "steps": steps}
    result["first_start_s"] = processes.start()
    try:
        bodies = {"h100": job_body(f"outage{int(outage_s)}-h100", "nvidia-h100", workers=2, steps=steps),
                  "a100": job_body(f"outage{int(outage_s)}-a100", "nvidia-a100", workers=1, steps=steps),
                  "cancel": job_body(f"outage{int(outage_s)}-cancel", "nvidia-a100", workers=1, steps=100000)}
        ids = {key: api.ok("POST", "/api/v1/training-jobs/", body)["id"] for key, body in bodies.items()}
        measured = [ids["h100"], ids["a100"]]
        log(f"  submitted jobs {ids}")

        def all_running_past_step_10():
            jobs = {j["id"]: j["status"] for j in api.jobs()}
            return all(jobs[i]["state"] == "RUNNING" for i in ids.values()) and \
                all(jobs[i]["step"] >= 10 for i in measured) and jobs
        before = wait_until(all_running_past_step_10, timeout=180, what="the three jobs running", processes=processes)
        list_before = [(j["id"], j["name"], j["spec"]["accelerator_types"]) for j in api.jobs()]
        handles = {key: before[i]["compute_handle"] for key, i in ids.items()}

        processes.kill()
        killed_at = time.monotonic()
        steps_at_kill = {key: run_peek(backend, handles[key])["step"] for key in ("h100", "a100")}
        db_steps_at_kill = dict(TrainingJob.objects.filter(pk__in=measured).values_list("pk", "current_step"))
        log(f"  web, worker and beat SIGKILLed; runs at steps {steps_at_kill}; outage {outage_s:g} s")
        time.sleep(max(0.0, outage_s - (time.monotonic() - killed_at)))
        steps_at_restart = {key: run_peek(backend, handles[key]) for key in ("h100", "a100")}
        result["run_steps_during_outage"] = {k: steps_at_restart[k]["step"] - steps_at_kill[k] for k in steps_at_kill}
        result["db_frozen_during_outage"] = dict(TrainingJob.objects.filter(pk__in=measured)
                                                 .values_list("pk", "current_step")) == db_steps_at_kill
        result["restart_s"] = processes.start()
        result["outage_measured_s"] = round(time.monotonic() - killed_at, 1)

        # Cancel right after the restart: the job ends at once, its run goes, its quota is free.
        cancel_at = time.monotonic()
        cancelled = api.ok("POST", f"/api/v1/training-jobs/{ids['cancel']}/cancel/", {})
        result["cancel_state"] = cancelled["status"]["state"]
        wait_until(lambda: handles["cancel"] not in backend.list_training_handles(), timeout=60,
                   what="the cancelled job's run to leave Ray", processes=processes)
        result["cancel_run_gone_s"] = round(time.monotonic() - cancel_at, 2)
        a100_use = quota_usage().get(("shared", "nvidia-a100"))
        result["a100_quota_after_cancel"] = a100_use

        caught_up_at = {}

        def caught_up():
            for job in api.jobs():
                if job["id"] in measured and job["id"] not in caught_up_at and \
                        job["status"]["step"] >= max(steps_at_restart[k]["step"] for k in steps_at_restart
                                                     if ids[k] == job["id"]):
                    caught_up_at[job["id"]] = time.monotonic()
            return len(caught_up_at) == len(measured)
        wait_until(caught_up, timeout=120, what="the sync to catch up with the runs", processes=processes)
        result["catch_up_s"] = round(max(caught_up_at.values()) - (killed_at + result["outage_measured_s"]), 2)

        def finished():
            jobs = {j["id"]: j for j in api.jobs()}
            return all(jobs[i]["status"]["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for i in measured) and jobs
        after = wait_until(finished, timeout=steps * STEP_SLEEP_S * 4 + 120, what="the jobs to finish",
                           processes=processes)
        list_after = [(j["id"], j["name"], j["spec"]["accelerator_types"]) for j in api.jobs()]
        result["job_list_identical"] = list_before == list_after and len({j[0] for j in list_after}) == len(list_after)
        result["jobs"] = {}
        for key, job_id in ids.items():
            job = after[job_id]["status"]
            entry = {"id": job_id, "state": job["state"], "step": job["step"], "restarts": job["restarts"],
                     "attempt": job["attempt"], "last_checkpoint_step": job["last_checkpoint_step"]}
            if key != "cancel":
                workers = bodies[key]["workers_min"]
                rows = [(m["step"], m["worker"]) for m in api.metrics(job_id)]
                entry["metrics"] = step_grid_problems(rows, steps=steps, workers=workers)
                checkpoints = [c["step"] for c in api.ok("GET", f"/api/v1/training-jobs/{job_id}/checkpoints/")]
                entry["checkpoint_steps"] = checkpoints
                entry["log_duplicates"] = duplicate_count(TrainingLogLine.objects.filter(job_id=job_id).values_list(
                    "attempt", "worker", "line", "recorded_at"))
            result["jobs"][key] = entry
        freed_at = time.monotonic()
        leftovers = wait_until(lambda: (lambda left: left if is_clean(left) else None)(cluster_leftovers(backend)),
                               timeout=60, what="Ray to hold nothing", processes=processes) or {}
        result["freed_s"] = round(time.monotonic() - freed_at, 2)
        result["leftovers"] = leftovers
        result["quota_after"] = {f"{q}/{t}": v for (q, t), v in quota_usage().items() if v}
    finally:
        processes.stop()
    result["checks"] = checks(result)
    return result


def checks(result: dict) -> dict[str, bool]:
    jobs = result.get("jobs", {})
    steps = result["steps"]
    measured = [jobs[k] for k in ("h100", "a100") if k in jobs]
    return {
        "training went on during the outage": bool(result.get("run_steps_during_outage"))
        and (result["outage_s"] == 0 or all(v > 0 for v in result["run_steps_during_outage"].values())),
        "job list identical": bool(result.get("job_list_identical")),
        "jobs SUCCEEDED at step N-1, no restart": len(measured) == 2 and all(
            j["state"] == "SUCCEEDED" and j["step"] == steps - 1 and j["restarts"] == 0 for j in measured),
        "metrics: steps 0..N-1 once per worker": len(measured) == 2 and all(grid_ok(j["metrics"]) for j in measured),
        "state and step as the run reported (last checkpoint N-1)": len(measured) == 2 and all(
            j["last_checkpoint_step"] == steps - 1 and j["checkpoint_steps"][-1:] == [steps - 1] for j in measured),
        "no log line twice": len(measured) == 2 and all(j["log_duplicates"] == 0 for j in measured),
        "cancel after restart: CANCELLED, run gone, quota free": result.get("cancel_state") == "CANCELLED"
        and jobs.get("cancel", {}).get("state") == "CANCELLED" and result.get("cancel_run_gone_s") is not None
        and (result.get("a100_quota_after_cancel") or 0) <= 8,
        "Ray holds nothing afterwards": result.get("freed_s") is not None and not result.get("quota_after"),
    }


def format_report(results: Sequence[dict]) -> str:
    rows = []
    for r in results:
        jobs = r.get("jobs", {})
        rows.append((f"{r['outage_s']:g}", r["steps"], r.get("outage_measured_s"), r.get("restart_s"),
                     r.get("catch_up_s"), json.dumps(r.get("run_steps_during_outage")),
                     " / ".join(f"{jobs[k]['metrics']['rows']} rows, {len(jobs[k]['metrics']['missing'])} gaps, "
                                f"{len(jobs[k]['metrics']['duplicates'])} dup" for k in ("h100", "a100") if k in jobs),
                     r.get("cancel_run_gone_s"), r.get("freed_s"), "yes" if all(r["checks"].values()) else "NO"))
    table = format_table(("outage s", "steps", "down s", "restart s", "catch-up s", "run steps while down",
                          "metrics h100 / a100", "cancel: run gone s", "freed s", "all checks"), rows)
    failed = [f"  {r['outage_s']:g} s: {name}" for r in results for name, ok in r["checks"].items() if not ok]
    return table + ("\n\nfailed checks:\n" + "\n".join(failed) if failed else "")


# ---------------------------------------------------------------------------------------------
# the command: its own database, data folder and Ray cluster


def setup_django(work: Path) -> None:
    os.environ["FLEETYARD_DATA_DIR"] = str(work / "data")
    os.environ.pop("FLEETYARD_DATABASE_URL", None)  # the embedded SQLite file, shared with the processes
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def build_world(topology) -> str:
    """Pools, the 'shared' cluster queue (h100 16, a100 16), team alpha with a member; returns the member's token."""
    from django.contrib.auth import get_user_model

    from controlplane.cluster.services import accelerator_types_seed, node_pool_create
    from controlplane.quotas.services import cluster_queue_create, local_queue_create
    from controlplane.tenancy.models import Role
    from controlplane.tenancy.services import api_token_create, membership_set, team_create

    accel = {a.slug: a for a in accelerator_types_seed()}
    users = get_user_model().objects
    ops = users.create_user("ops", password=os.urandom(12).hex(), is_staff=True)
    for pool in topology.pools:
        node_pool_create(actor=ops, name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node or int(pool.cpus_per_node), simulated=pool.simulated)
    queue = cluster_queue_create(actor=ops, name="shared", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 16},
        {"accelerator_type": "nvidia-a100", "nominal_quota": 16}])
    admin = users.create_user("alpha-admin", password=os.urandom(12).hex())
    team = team_create(actor=ops, name="alpha", admin=admin)
    member = users.create_user("alpha-member", password=os.urandom(12).hex())
    membership_set(actor=admin, team=team, username=member.username, role=Role.MEMBER)
    local_queue_create(actor=admin, team=team, name="default", cluster_queue=queue)
    _, raw = api_token_create(actor=member, team=team, user=member, name="outage")
    return raw


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outages", default="0,20,60", help="outage lengths in seconds, comma separated")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "control_plane_outage.json")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    outages = [float(x) for x in args.outages.split(",") if x.strip()]

    def log(line: str) -> None:
        print(line, flush=True)

    work = Path(tempfile.mkdtemp(prefix="fy-outage-"))
    setup_django(work)
    from controlplane.cluster.services import nodes_sync
    from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
    from controlplane.compute.ray_backend import RayComputeBackend
    from controlplane.compute.topology import load_topology

    topology = load_topology()
    token = build_world(topology)
    state_dir = work / "cluster"
    cluster = start_local_cluster(topology=topology, state_dir=state_dir, fate_share=True)
    log(f"cluster up: head + {', '.join(cluster.node_names)}")
    results = []
    try:
        backend = RayComputeBackend(address=cluster.address, env=cluster.client_env())
        nodes_sync(observed=backend.list_nodes())
        for outage in outages:
            log(f"outage of {outage:g} s")
            processes = ControlPlaneProcesses(ray_env={"RAY_ADDRESS": cluster.address, **cluster.client_env()},
                                              log_dir=work / f"logs-{int(outage)}")
            try:
                results.append(run_outage(backend=backend, api=Api(processes.base_url, token), processes=processes,
                                          outage_s=outage, log=log))
            except Exception as exc:  # the table says which outage failed and why
                results.append({"outage_s": outage, "steps": steps_for(outage), "error": f"{type(exc).__name__}: "
                                f"{exc}"[:2000], "checks": {"ran to the end": False}})
                log(f"  failed: {exc}")
    finally:
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        stop_local_cluster(state_dir=state_dir)
        shutil.rmtree(work, ignore_errors=True)  # its database, data folder and logs
    log("")
    log(format_report(results))
    if not args.no_write:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "benchmark": "control plane (web, worker, beat) SIGKILLed during training (issue 8, C3)",
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": f"{os.cpu_count()} CPU cores, {std_platform.machine()}, simulated accelerators, local Ray cluster, "
                    "SQLite (WAL) shared by web, worker and beat, file-system broker",
            "command": "benchmarks/control_plane_outage.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "results": results}, indent=2, default=str) + "\n")
        log(f"\nwrote {args.json}")
    return 0 if all(all(r["checks"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
