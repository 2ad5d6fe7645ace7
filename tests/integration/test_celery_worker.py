"""A real Celery worker process runs the lifecycle tasks: the embedded file-system broker and Redis.

Not eager mode: the test commits a job, the task goes through the broker to a separate worker
process using the same database, and the job's row changes.
"""

from __future__ import annotations

import time

import pytest

from jobs.models import TrainingJob
from jobs.services import training_job_create
from tests.integration.celery_workers import running_worker

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture(params=["filesystem", "redis"])
def worker(request, tmp_path):
    with running_worker(tmp_path, request.param) as running:
        yield running


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
