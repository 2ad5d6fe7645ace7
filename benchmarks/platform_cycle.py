"""The platform's scheduling cycle through the database: load the snapshot, ask the core, apply the decisions.

Run from the repository root::

    .venv/bin/python -m benchmarks.platform_cycle [--sizes 1000,10000] [--pending 10000] [--cycles 4] [--seed 0]
                                                  [--postgres postgres://postgres@127.0.0.1:5432/postgres]

`benchmarks.scale` times the scheduling core alone. This times `jobs.admission.run_cycle`, the cycle the Celery
task runs (one transaction: the ClusterQueue rows locked, the jobs loaded and locked, the core, then every
admission, preemption, shrink, growth and waiting position written with its events and task outbox records), on
the same synthetic clusters (`benchmarks.scale.build_snapshot`) put into a scratch database: nodes, cluster queues
with their quotas and cohort, a team and local queue per cluster queue, a priority class per priority, running jobs
with their placements, pending jobs. Workloads of a fraction of a device (the generator's inference replicas) are
left out: a training job takes whole devices. Launching and stopping runs is not sent anywhere (the tasks are
replaced by no-ops; their outbox records are still written). After each cycle, as the runtime and users would: the
preempted runs are back in the queue, 1% of the running jobs finish. The first cycle is the scale benchmark's first
cycle; the others follow it.

The scratch database is SQLite in a temporary folder (the embedded profile), or a database created next to the one
`--postgres` names and dropped afterwards. Results go to ``benchmarks/results/platform_cycle.{json,csv}``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from benchmarks._args import COUNT, OFFSET, count_list

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
FINISH_PER_CYCLE = 0.01
PHASES = ("load", "core", "apply")


def populate(snapshot, *, now=None) -> dict[str, int]:
    """Write `snapshot` (benchmarks.scale) as platform rows; return what was written. Needs Django set up."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from controlplane.cluster.models import AcceleratorType, Node, NodePool
    from controlplane.cluster.services import accelerator_types_seed
    from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass, ResourceQuota
    from controlplane.tenancy.models import Team
    from jobs.admission import _placement_to_json
    from jobs.models import TrainingJob

    now = now or timezone.now()
    accelerator_types_seed()
    types = {a.slug: a for a in AcceleratorType.objects.all()}
    user = get_user_model().objects.create_user("bench")  # (no password: nobody logs in)
    pools = {}
    for node in snapshot.nodes:
        if node.pool not in pools:
            pools[node.pool] = NodePool.objects.create(name=node.pool, accelerator_type=types[node.accelerator_type],
                                                       devices_per_node=node.devices, simulated=True)
    Node.objects.bulk_create([
        Node(pool=pools[n.pool], name=n.name, leaf_group=n.leaf_group, capacity_devices=n.devices,
             free_devices=n.devices, capacity_cpus=64, free_cpus=64, cordoned=not n.schedulable, simulated=True,
             last_seen_at=now)
        for n in snapshot.nodes], batch_size=2000)
    local_queues = {}
    for spec in snapshot.cluster_queues:
        queue = ClusterQueue.objects.create(name=spec.name, cohort=spec.cohort or "")
        ResourceQuota.objects.bulk_create([
            ResourceQuota(cluster_queue=queue, accelerator_type=types[slug], nominal_quota=q.nominal,
                          borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit)
            for slug, q in spec.quotas.items()])
        team = Team.objects.create(name=spec.name)
        local_queues[spec.name] = LocalQueue.objects.create(team=team, name="default", cluster_queue=queue)
    priorities = {w.priority for w in snapshot.pending} | {r.workload.priority for r in snapshot.running}
    classes = {value: PriorityClass.objects.create(name=f"priority-{value}", value=value) for value in priorities}

    def job(workload, **fields) -> TrainingJob:
        local_queue = local_queues[workload.cluster_queue]
        return TrainingJob(team_id=local_queue.team_id, name=workload.id, local_queue=local_queue,
                           priority_class=classes[workload.priority], accelerator_types=list(workload.accepted_types),
                           workers_min=workload.workers_min, workers_max=workload.workers_max,
                           devices_per_worker=int(workload.devices_per_worker), created_by=user,
                           created_at=now - dt.timedelta(seconds=3600 - workload.arrival), **fields)

    whole = [r for r in snapshot.running if r.workload.devices_per_worker >= 1]
    TrainingJob.objects.bulk_create([
        job(r.workload, state="RUNNING", admitted_accelerator_type=r.accelerator_type,
            placement=_placement_to_json(r.workers), compute_handle=f"fy-train-{r.workload.id}",
            started_at=now - dt.timedelta(seconds=600), current_step=100, last_checkpoint_step=100 - i % 100)
        for i, r in enumerate(whole)], batch_size=2000)
    waiting = [w for w in snapshot.pending if w.devices_per_worker >= 1]
    TrainingJob.objects.bulk_create([job(w, state="QUEUED") for w in waiting], batch_size=2000)
    return {"nodes": len(snapshot.nodes), "running": len(whole), "pending": len(waiting),
            "left_out_fractional": len(snapshot.running) - len(whole) + len(snapshot.pending) - len(waiting)}


def after_cycle(rng: random.Random) -> None:
    """What happens between two cycles: preempted runs are back in the queue (the runtime requeues them once they
    checkpointed), and FINISH_PER_CYCLE of the running jobs finish."""
    from jobs.models import TrainingJob

    TrainingJob.objects.filter(state="PREEMPTED").update(state="QUEUED", placement=[], admitted_accelerator_type="",
                                                         compute_handle="")
    running = list(TrainingJob.objects.filter(state="RUNNING").values_list("pk", flat=True))
    done = rng.sample(running, int(len(running) * FINISH_PER_CYCLE))
    TrainingJob.objects.filter(pk__in=done).update(state="SUCCEEDED", placement=[], admitted_accelerator_type="")


class counter:
    """A database execute wrapper that counts the statements run through it."""

    def __init__(self):
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        self.count += 1
        return execute(sql, params, many, context)


def measure_cycles(cycles: int, seed: int) -> list[dict]:
    """`cycles` timed runs of run_cycle (in a transaction, as the Celery task), each with its phases."""
    from django.db import connection, transaction

    from jobs import admission, tasks

    spent: dict[str, float] = {}

    def timed(name, function):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
        return run

    real_load, real_schedule = admission.load_snapshot, admission._schedule_with_serving
    senders = [(task, task.apply_async) for task in (tasks.launch_training_job, tasks.stop_training_run)]
    admission.load_snapshot = timed("load", real_load)
    admission._schedule_with_serving = timed("core", real_schedule)
    for task, _ in senders:
        task.apply_async = lambda *args, **kwargs: None
    rng = random.Random(f"platform-cycle-{seed}")
    rows = []
    try:
        for number in range(cycles):
            spent.clear()
            queries = counter()
            with connection.execute_wrapper(queries):
                start = time.perf_counter()
                with transaction.atomic():
                    result = admission.run_cycle()
                total = time.perf_counter() - start
            rows.append({"cycle": number, "total_ms": round(total * 1000, 1),
                         "load_ms": round(spent["load"] * 1000, 1), "core_ms": round(spent["core"] * 1000, 1),
                         "apply_ms": round((total - spent["load"] - spent["core"]) * 1000, 1),
                         "queries": queries.count, "admitted": len(result.admitted),
                         "preempted_or_shrunk": len(result.preempted) + len(result.shrunk),
                         "waiting": len(result.waiting)})
            after_cycle(rng)
    finally:
        admission.load_snapshot, admission._schedule_with_serving = real_load, real_schedule
        for task, send in senders:
            task.apply_async = send
    return rows


def summarize(accelerators: int, written: dict, rows: list[dict]) -> dict:
    following = rows[1:] or rows
    return {"accelerators": accelerators, **written, "cycles": len(rows),
            "first_ms": rows[0]["total_ms"], "first_load_ms": rows[0]["load_ms"], "first_core_ms": rows[0]["core_ms"],
            "first_apply_ms": rows[0]["apply_ms"], "first_queries": rows[0]["queries"],
            "first_admitted": rows[0]["admitted"], "first_preempted_or_shrunk": rows[0]["preempted_or_shrunk"],
            "following_median_ms": round(statistics.median(r["total_ms"] for r in following), 1),
            "following_max_ms": max(r["total_ms"] for r in following), "per_cycle": rows}


COLUMNS = (("accelerators", "accelerators", "d"), ("running", "running", "d"), ("pending", "pending", "d"),
           ("first_ms", "first ms", ".0f"), ("first_load_ms", "load", ".0f"), ("first_core_ms", "core", ".0f"),
           ("first_apply_ms", "apply", ".0f"), ("first_queries", "queries", "d"), ("first_admitted", "admitted", "d"),
           ("first_preempted_or_shrunk", "preempt+shrink", "d"), ("following_median_ms", "next median ms", ".0f"),
           ("following_max_ms", "next max ms", ".0f"))


def table(rows: list[dict]) -> str:
    from benchmarks.scale import table as aligned

    return aligned(rows, COLUMNS)


def run_size(accelerators: int, pending: int, cycles: int, seed: int) -> dict:
    """One size on a fresh scratch database (the current Django connection's): populate, then measure."""
    from django.core.management import call_command

    from benchmarks.scale import build_snapshot

    call_command("migrate", verbosity=0)
    written = populate(build_snapshot(accelerators, pending, seed))
    return summarize(accelerators, written, measure_cycles(cycles, seed))


def _scratch_postgres(url: str, name: str, *, create: bool) -> str:
    import psycopg

    parsed = urlparse(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunparse(parsed._replace(path=f"/{name}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=count_list, default="1000,10000",
                        help="accelerators per cluster, comma-separated")
    parser.add_argument("--pending", type=OFFSET, default=10_000)
    parser.add_argument("--cycles", type=COUNT, default=4, help="the first cycle and the ones that follow it")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--postgres", default="", help="a PostgreSQL URL; a scratch database is made next to it")
    parser.add_argument("--out", default=str(RESULTS_DIR / "platform_cycle"), help="output path without extension")
    args = parser.parse_args(argv)
    sizes = args.sizes
    rows = []
    for size in sizes:  # a fresh process per size: Django's settings are read once, at set-up
        with tempfile.TemporaryDirectory(prefix="fy-platform-cycle-") as folder:
            out = Path(folder) / "row.json"
            env = dict(os.environ, FLEETYARD_DATA_DIR=folder, FLEETYARD_COMPUTE_BACKEND="memory",
                       PYTHONPATH=f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'platform'}")
            scratch = f"fy_platform_cycle_{os.getpid()}"
            if args.postgres:
                env["FLEETYARD_DATABASE_URL"] = _scratch_postgres(args.postgres, scratch, create=True)
            else:
                env.pop("FLEETYARD_DATABASE_URL", None)
            started = time.perf_counter()
            try:
                code = _child(env, size, args, out)
            finally:
                if args.postgres:
                    _scratch_postgres(args.postgres, scratch, create=False)
            if code:
                print(f"the run at {size:,} accelerators failed (exit {code})", file=sys.stderr)
                return code
            rows.append(json.loads(out.read_text()))
            print(f"  {size:,} accelerators: {args.cycles} cycles in {time.perf_counter() - started:.1f} s",
                  flush=True)
    database = "PostgreSQL" if args.postgres else "SQLite"
    print(f"platform scheduling cycle on {database} (times in ms; the first cycle split into loading the snapshot, "
          "the core and applying its decisions):")
    print(table(rows))
    payload = {"benchmark": "platform_cycle", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
               "database": database,
               "parameters": {"sizes": sizes, "pending": args.pending, "cycles": args.cycles, "seed": args.seed,
                              "finish_per_cycle": FINISH_PER_CYCLE},
               "results": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1))
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        writer = csv.writer(fh)
        keys = [key for key in rows[0] if key != "per_cycle"]
        writer.writerow(["date", "database", *keys])
        for row in rows:
            writer.writerow([payload["date"], database, *(row[key] for key in keys)])
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.csv')}")
    return 0


def _child(env: dict, size: int, args, out: Path) -> int:
    import subprocess

    code = ("import json, sys, django; django.setup(); from benchmarks.platform_cycle import run_size; "
            f"row = run_size({size}, {args.pending}, {args.cycles}, {args.seed}); "
            f"open({str(out)!r}, 'w').write(json.dumps(row))")
    env = dict(env, DJANGO_SETTINGS_MODULE="controlplane.settings")
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO_ROOT, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
