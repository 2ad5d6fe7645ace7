"""Support for the C1 kill test and benchmark (issue 8): the tasks a real Celery worker runs, the effect table
they write, and worker processes that can be SIGKILLed and restarted.

- `c1.write_effect(key)`: inserts the key into c1_effect (its primary key) in one transaction with a row in
  c1_attempt that says whether the key was already there (a duplicate the key prevented). The effect's
  idempotency is the key's, not the delivery ledger's.
- `c1.poison(key)`: notes its run in c1_attempt, then SIGKILLs its own worker process, on every delivery.

Both use the lifecycle tasks' options (acks_late, reject_on_worker_lost, the delivery ledger). Workers load
this module with `-I tests.reliability.celery_kill_support`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from celery import shared_task
from celery.signals import worker_ready
from django.db import connection, transaction

from controlplane.common.tasks import LIFECYCLE_TASK
from tests.integration.celery_workers import REDIS_BROKER, ROOT, database_url

EFFECT_TABLES = {
    "c1_effect": "CREATE TABLE c1_effect (idempotency_key VARCHAR(64) PRIMARY KEY)",
    "c1_attempt": "CREATE TABLE c1_attempt (idempotency_key VARCHAR(64) NOT NULL, duplicate INTEGER NOT NULL)",
}


@shared_task(name="c1.write_effect", **LIFECYCLE_TASK)
def write_effect(key: str, hold_s: float = 0.0) -> bool:
    """Write the effect of `key` once; returns False when it was already written (a redelivery). `hold_s` is
    spent before and after the effect's transaction (work a kill can interrupt on either side of the commit)."""
    time.sleep(hold_s)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("INSERT INTO c1_effect (idempotency_key) VALUES (%s) ON CONFLICT (idempotency_key) DO NOTHING",
                       [key])
        duplicate = cursor.rowcount == 0
        cursor.execute("INSERT INTO c1_attempt (idempotency_key, duplicate) VALUES (%s, %s)", [key, int(duplicate)])
    time.sleep(hold_s)
    return not duplicate


@shared_task(name="c1.poison", **LIFECYCLE_TASK)
def poison(key: str) -> None:
    """A message that kills whichever worker process runs it."""
    with connection.cursor() as cursor:  # autocommit: the run is recorded before the process dies
        cursor.execute("INSERT INTO c1_attempt (idempotency_key, duplicate) VALUES (%s, 0)", [key])
    os.kill(os.getpid(), signal.SIGKILL)


@worker_ready.connect
def _say_ready(**kwargs) -> None:
    """Tell the test this worker consumes now (so its kills land on a working worker, not a booting one)."""
    marker = os.environ.get("FLEETYARD_C1_READY_FILE")
    if marker:
        Path(marker).write_text("ready")


def create_effect_tables() -> None:
    drop_effect_tables()
    with connection.cursor() as cursor:
        for ddl in EFFECT_TABLES.values():
            cursor.execute(ddl)


def drop_effect_tables() -> None:
    with connection.cursor() as cursor:
        for table in EFFECT_TABLES:
            cursor.execute(f"DROP TABLE IF EXISTS {table}")


def effect_figures(keys_prefix: str = "effect-") -> dict:
    """What the workers wrote: effects, distinct keys, runs, duplicates the key prevented, poison runs."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*), COUNT(DISTINCT idempotency_key) FROM c1_effect WHERE idempotency_key LIKE %s",
                       [keys_prefix + "%"])
        effects, distinct = cursor.fetchone()
        cursor.execute("SELECT COUNT(*), COALESCE(SUM(duplicate), 0) FROM c1_attempt WHERE idempotency_key LIKE %s",
                       [keys_prefix + "%"])
        runs, duplicates = cursor.fetchone()
        cursor.execute("SELECT COUNT(*) FROM c1_attempt WHERE idempotency_key LIKE %s", ["poison-%"])
        (poison_runs,) = cursor.fetchone()
    return {"effects": effects, "distinct_keys": distinct, "effect_runs": runs, "duplicates_prevented": duplicates,
            "poison_runs": poison_runs}


def broker_settings(kind: str, tmp_path: Path) -> tuple[str, dict]:
    """The broker URL and the publisher's transport options of `kind` ("filesystem" or "redis")."""
    if kind == "redis":
        return REDIS_BROKER, {}
    broker_dir = tmp_path / "broker"  # the folders a worker derives from FLEETYARD_DATA_DIR (settings.py)
    return "filesystem://", {"data_folder_in": str(broker_dir / "queue"), "data_folder_out": str(broker_dir / "queue"),
                             "processed_folder": str(broker_dir / "processed"),
                             "control_folder": str(broker_dir / "control"),
                             "in_hand_folder": str(broker_dir / "in_hand"), "store_processed": False}


class KillableWorker:
    """One `celery worker` (prefork, one pool process) that loads this module; killed with SIGKILL on its
    whole process group and started again."""

    def __init__(self, name: str, kind: str, tmp_path: Path, *, visibility_s: int = 2):
        self.name, self.kind, self.tmp_path = name, kind, tmp_path
        broker, _ = broker_settings(kind, tmp_path)
        self.env = dict(os.environ, FLEETYARD_DATABASE_URL=database_url(), CELERY_BROKER_URL=broker,
                        FLEETYARD_DATA_DIR=str(tmp_path), CELERY_TASK_ALWAYS_EAGER="false",
                        FLEETYARD_BROKER_VISIBILITY_SECONDS=str(visibility_s), FLEETYARD_BROKER_RESTORE_SECONDS="1",
                        FLEETYARD_LOG_LEVEL="WARNING",
                        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "platform")]))
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.log_path = tmp_path / f"worker-{name}.log"

    @property
    def ready_file(self) -> Path:
        return self.tmp_path / f"ready-{self.name}-{self.starts}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            assert self.process.poll() is None, f"worker {self.name} exited:\n{self.log_tail()}"
            assert time.monotonic() < deadline, f"worker {self.name} not ready after {timeout} s:\n{self.log_tail()}"
            time.sleep(0.05)

    def start(self) -> None:
        self.starts += 1
        self.env["FLEETYARD_C1_READY_FILE"] = str(self.ready_file)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-I",
                 "tests.reliability.celery_kill_support", "--pool=prefork", "--concurrency=1",
                 "--loglevel=" + os.environ.get("FLEETYARD_C1_WORKER_LOG", "WARNING"),
                 "--without-gossip", "--without-mingle", f"--hostname=c1-{self.name}-{self.starts}@%h"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def kill9(self) -> None:
        """SIGKILL the worker and its pool process (the whole process group), as an OOM kill or a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(15)
        self.kill9()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def run_kill_scenario(*, kind: str, tmp_path: Path, tasks: int, kills: int, workers: int = 2, hold_s: float = 0.02,
                      kill_after_ready_s: tuple[float, float] = (0.2, 2.0), drain_timeout_s: float = 90.0,
                      seed: int = 8, resend_after_s: float = 15.0) -> dict:
    """Publish `tasks` effect tasks and one poison message, SIGKILL a worker `kills` times at random moments
    once it consumes (starting it again each time, workers in turn), wait until every effect is written and
    the poison message is dead-lettered, and return the figures. The caller has created the effect tables."""
    import random

    from controlplane.common.models import DeliveryState, TaskDelivery
    from controlplane.common.tasks import dispatch, resend_undelivered
    from tests.integration.celery_workers import publishing_to

    rng = random.Random(seed)
    broker, options = broker_settings(kind, tmp_path)
    if kind == "redis":
        import redis

        redis.Redis.from_url(REDIS_BROKER).flushdb()
    pool = [KillableWorker(str(index), kind, tmp_path) for index in range(workers)]
    started = time.monotonic()
    kill_log: list[dict] = []
    try:
        with publishing_to(broker, options):
            if options:
                from controlplane.celery import ensure_broker_folders

                ensure_broker_folders(options)
            for worker in pool:
                worker.start()
            for index in range(tasks):  # through the outbox, as the platform's services send their tasks
                dispatch(write_effect, f"effect-{index:05d}", hold_s)
                if index == tasks // 4:
                    dispatch(poison, "poison-1")
            published_s = time.monotonic() - started
            for kill in range(kills):
                victim = pool[kill % len(pool)]
                victim.wait_ready()
                time.sleep(rng.uniform(*kill_after_ready_s))
                done_before = effect_figures()["effects"]
                victim.kill9()
                kill_log.append({"at_s": round(time.monotonic() - started, 2), "worker": victim.name,
                                 "effects_before": done_before})
                victim.start()
            kills_done_s = time.monotonic() - started
            deadline = time.monotonic() + drain_timeout_s
            resent, next_sweep = 0, 0.0
            while True:
                if time.monotonic() >= next_sweep:  # the beat's outbox sweep (no beat runs here)
                    resent += resend_undelivered(older_than_s=resend_after_s)
                    next_sweep = time.monotonic() + 1.0
                figures = effect_figures()
                poison_row = TaskDelivery.objects.filter(task_name="c1.poison").first()
                dead = poison_row is not None and poison_row.state == DeliveryState.DEAD_LETTERED
                if figures["effects"] >= tasks and dead:
                    break
                if time.monotonic() > deadline:
                    logs = "\n".join(f"--- worker {w.name}\n{w.log_tail()}" for w in pool)
                    raise AssertionError(f"not drained after {drain_timeout_s} s: {figures}, poison: "
                                         f"{poison_row}\n{logs}")
                for worker in pool:
                    if worker.process.poll() is not None:  # only the poison's own kill may take a worker down
                        worker.start()
                time.sleep(0.2)
            drained_s = time.monotonic() - started
            time.sleep(3.0)  # long enough for a looping message to come round again
            poison_row.refresh_from_db()
            settled = effect_figures()
    finally:
        for worker in pool:
            worker.stop()
    ledger = TaskDelivery.objects.filter(task_name="c1.write_effect")
    return {
        "broker": kind, "database": connection.vendor, "tasks": tasks, "workers": workers, "kills": len(kill_log),
        **settled,
        "missing": tasks - settled["effects"],
        "resent_from_outbox": resent,  # messages no worker took within resend_after_s, sent again
        "redelivered_messages": ledger.filter(deliveries__gt=1).count(),
        "redeliveries": sum(row.deliveries - 1 for row in ledger),
        "effect_tasks_dead_lettered": ledger.filter(state=DeliveryState.DEAD_LETTERED).count(),
        "poison_state": poison_row.state, "poison_deliveries": poison_row.deliveries,
        "poison_worker_losses": poison_row.worker_losses, "poison_reason": poison_row.reason,
        "published_s": round(published_s, 2), "kills_done_s": round(kills_done_s, 2),
        "drained_s": round(drained_s, 2), "kill_log": kill_log,
    }
