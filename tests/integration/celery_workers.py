"""Starts a real Celery worker process for integration tests, on the file-system broker or Redis,
against the test database, and stops it by process group afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection
from kombu import pools as kombu_pools

from controlplane import celery_app

ROOT = Path(__file__).resolve().parents[2]
REDIS_BROKER = "redis://127.0.0.1:6379/15"  # the test workers' broker (CI's own runs use database 14)


def redis_available() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=0.5):
            return True
    except OSError:
        return False


def database_url() -> str:
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite://{params['NAME']}"
    return f"postgres://{params['USER']}:{params['PASSWORD']}@{params['HOST'] or '127.0.0.1'}:" \
           f"{params['PORT'] or 5432}/{params['NAME']}"


def reset_connections() -> None:
    """Drop pooled broker connections so the next publish uses the broker configured now."""
    if celery_app._pool is not None:
        celery_app._pool.force_close_all()
        celery_app._pool = None
    celery_app.amqp._producer_pool = None
    kombu_pools.reset()  # kombu keeps producer pools per connection URL, process-wide


@contextlib.contextmanager
def publishing_to(broker: str, options: dict | None = None):
    """This process publishes tasks to `broker` (not eagerly) until the block ends."""
    saved = {key: celery_app.conf[key] for key in ("broker_url", "broker_transport_options", "task_always_eager")}
    # Celery reads CELERY_BROKER_URL from the environment before its configuration (CI sets it).
    saved_env = os.environ.get("CELERY_BROKER_URL")
    os.environ["CELERY_BROKER_URL"] = broker
    celery_app.conf.update(broker_url=broker, broker_transport_options=options or {}, task_always_eager=False)
    reset_connections()
    try:
        yield
    finally:
        celery_app.conf.update(**saved)
        if saved_env is None:
            os.environ.pop("CELERY_BROKER_URL", None)
        else:
            os.environ["CELERY_BROKER_URL"] = saved_env
        reset_connections()


@contextlib.contextmanager
def running_worker(tmp_path: Path, broker_kind: str, *, extra_env: dict[str, str] | None = None,
                   pool: str = "solo", name: str = ""):
    """A `celery worker` process on `broker_kind` ("filesystem" or "redis"); this process publishes to it.
    `name` tells several workers on one broker apart (node name and log file)."""
    if broker_kind == "redis":
        if not redis_available():
            pytest.skip("Redis is not running on 127.0.0.1:6379 (CI starts it)")
        broker = REDIS_BROKER
        options = {}
    else:
        broker = "filesystem://"
        # The same folders the worker derives from FLEETYARD_DATA_DIR (see settings.py).
        folder = tmp_path / "broker" / "queue"
        options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
                   "processed_folder": str(tmp_path / "broker" / "processed"), "store_processed": False,
                   "control_folder": str(tmp_path / "broker" / "control")}
    env = dict(os.environ, FLEETYARD_DATABASE_URL=database_url(), CELERY_BROKER_URL=broker,
               FLEETYARD_DATA_DIR=str(tmp_path), CELERY_TASK_ALWAYS_EAGER="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "platform")]), **(extra_env or {}))
    log_path = tmp_path / f"worker{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", f"--pool={pool}", "--concurrency=1",
         "--loglevel=INFO", f"--hostname=test-{broker_kind}{name}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    if options:
        from controlplane.celery import ensure_broker_folders

        ensure_broker_folders(options)
    try:
        with publishing_to(broker, options):
            yield {"process": process, "log": log_path, "broker": broker_kind}
    finally:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
        log.close()
