"""A real Celery worker process runs the lifecycle tasks: the embedded file-system broker and Redis.

Not eager mode: the test commits a job, the task goes through the broker to a separate worker
process using the same database, and the job's row changes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from kombu import pools as kombu_pools

from controlplane import celery_app
from jobs.models import TrainingJob
from jobs.services import training_job_create

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


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


@pytest.fixture(params=["filesystem", "redis"])
def worker(request, tmp_path):
    """Start `celery worker` as its own process group on the chosen broker; stop it by pid afterwards."""
    if request.param == "redis":
        if not redis_available():
            pytest.skip("Redis is not running on 127.0.0.1:6379 (CI starts it)")
        broker = "redis://127.0.0.1:6379/15"
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
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "platform")]))
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--pool=solo", "--loglevel=INFO",
         f"--hostname=test-{request.param}@%h"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    saved = {key: celery_app.conf[key] for key in ("broker_url", "broker_transport_options", "task_always_eager")}
    celery_app.conf.update(broker_url=broker, broker_transport_options=options, task_always_eager=False)
    if options:
        from controlplane.celery import ensure_broker_folders

        ensure_broker_folders(options)
    reset_connections()
    try:
        yield {"process": process, "log": tmp_path / "worker.log", "broker": request.param}
    finally:
        celery_app.conf.update(**saved)
        reset_connections()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        log.close()


def reset_connections() -> None:
    """Drop pooled broker connections so the next publish uses the broker configured now."""
    if celery_app._pool is not None:
        celery_app._pool.force_close_all()
        celery_app._pool = None
    celery_app.amqp._producer_pool = None
    kombu_pools.reset()  # kombu keeps producer pools per connection URL, process-wide


def wait_for_state(job_id: int, state: str, worker, timeout: float = 45.0) -> TrainingJob:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = TrainingJob.objects.get(pk=job_id)
        if job.state == state:
            return job
        assert worker["process"].poll() is None, worker["log"].read_text()[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"job stayed {job.state}; worker log:\n{worker['log'].read_text()[-3000:]}")


def test_worker_process_moves_a_committed_job_to_queued(world, worker):
    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="via-broker",
                              local_queue=alpha["queue"], accelerator_types=["cpu"], devices_per_worker=0)
    # The service enqueued on commit; no eager execution happened in this process.
    assert TrainingJob.objects.get(pk=job.pk).state == "PENDING"
    job = wait_for_state(job.pk, "QUEUED", worker)
    assert job.events.filter(to_state="QUEUED", actor_label="system:queue").count() == 1
    assert f"test-{worker['broker']}" in worker["log"].read_text()
