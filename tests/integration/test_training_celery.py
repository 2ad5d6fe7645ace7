"""The training lifecycle as it runs in production: Celery worker processes (not eager tasks) admit,
launch and sync a real Ray run; the worker is SIGKILLed mid-run and a new one picks the job up where
the database says it is. The run itself lives in Ray and never notices; every metric is recorded
exactly once (the sync's cursor commits with the rows it applied)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.test import TestCase

from controlplane.cluster.services import node_pool_create, nodes_sync
from jobs.models import TrainingJob, TrainingMetric
from jobs.tasks import sync_training_jobs
from tests.integration.celery_workers import running_worker

pytestmark = [pytest.mark.ray, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def wait_for(predicate, worker, timeout: float, message: str):
    deadline = time.monotonic() + timeout
    while True:
        sync_training_jobs.delay()  # what beat does every FLEETYARD_TRAINING_SYNC_SECONDS
        job = predicate()
        if job:
            return job
        assert worker["process"].poll() is None, worker["log"].read_text()[-3000:]
        assert time.monotonic() < deadline, f"{message}\n{worker['log'].read_text()[-3000:]}"
        time.sleep(1.0)


def test_lifecycle_survives_a_killed_celery_worker(ray_cluster, ray_backend, topology, world, accel, api,
                                                   settings, tmp_path):
    settings.DATA_DIR = tmp_path
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    nodes_sync(observed=ray_backend.list_nodes())
    env = {"FLEETYARD_COMPUTE_BACKEND": "ray", **ray_cluster.client_env()}
    client = api("alpha", "member")
    body = {"name": "lm", "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 2,
            "workers_max": 2, "devices_per_worker": 8, "checkpoint": {"interval_steps": 10},
            "hyperparameters": {"steps": 60, "step_sleep_s": 0.1}}

    def running_past_step_15():
        job = TrainingJob.objects.get()
        return job if job.state == "RUNNING" and job.current_step >= 15 else None

    def finished():
        job = TrainingJob.objects.get()
        return job if job.is_terminal else None

    with running_worker(tmp_path, "filesystem", extra_env=env, pool="prefork") as worker:
        with TestCase.captureOnCommitCallbacks(execute=True):
            assert client.post("/api/v1/training-jobs/", body, format="json").status_code == 201
        wait_for(running_past_step_15, worker, 90, "the job never got past step 15")
        os.killpg(worker["process"].pid, signal.SIGKILL)  # the worker dies mid-workflow
        worker["process"].wait(10)
    step_at_kill = TrainingJob.objects.get().current_step
    with running_worker(tmp_path, "filesystem", extra_env=env, pool="prefork") as worker:
        job = wait_for(finished, worker, 120, "the job did not finish after the new worker started")
    assert job.state == "SUCCEEDED" and job.current_step == 59, job.state_reason
    assert step_at_kill < 59
    assert TrainingMetric.objects.filter(job=job).count() == 120  # 60 steps x 2 workers, none lost or doubled
    assert job.compute_handle not in ray_backend.list_training_handles()
