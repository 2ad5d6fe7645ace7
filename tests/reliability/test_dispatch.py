"""Issue 8, C2: work handed to Celery is not lost when the broker or the worker is down, and a rolled-back
transaction hands over nothing.

- The broker down at submit: the API still answers 201 (the job is committed, PENDING), the failed
  publish is logged, and the beat's reconciler queues the job once it is overdue, without the broker.
- No worker running at submit: the message waits in the broker and the job is queued once a worker starts.
- A transaction that rolls back publishes nothing; one that commits publishes once.
"""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from controlplane import celery_app
from jobs import tasks
from jobs.models import TrainingJob
from jobs.services import training_job_create
from jobs.states import JobState
from tests.conftest import JOB_BODY, client_for
from tests.integration.celery_workers import publishing_to, running_worker


@pytest.fixture
def dead_broker():
    """Celery publishing to a broker address where nothing listens (as if Redis were down)."""
    with publishing_to("redis://127.0.0.1:1/0"):
        yield


def test_a_job_submitted_while_the_broker_is_down_is_queued_by_the_reconciler(world, demo_cluster, dead_broker,
                                                                              caplog):
    client = client_for(world["alpha"]["member"], world["alpha"]["team"])
    started = time.monotonic()
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", {**JOB_BODY, "name": "while-down"}, format="json")
    answered_s = time.monotonic() - started
    assert response.status_code == 201, response.content
    job = TrainingJob.objects.get(pk=response.json()["id"])
    assert job.state == JobState.PENDING
    assert any("could not send jobs.enqueue_training_job" in r.getMessage() for r in caplog.records)

    # The broker is back (here: tasks run in-process again), and beat's sync comes round after the grace.
    celery_app.conf.task_always_eager = True  # publishing_to puts the publisher back as it was afterwards
    assert tasks.sync_training_jobs()["pending_queued"] == 0  # not overdue yet: the message may still arrive
    TrainingJob.objects.filter(pk=job.pk).update(state_changed_at=timezone.now() - timedelta(minutes=1))
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert tasks.sync_training_jobs()["pending_queued"] == 1
    job.refresh_from_db()
    assert job.state not in (JobState.PENDING, JobState.FAILED), job.state
    assert job.events.filter(to_state=JobState.QUEUED).count() == 1
    print(f"\nC2: submit with the broker down answered 201 in {answered_s:.2f} s; the reconciler queued the job "
          f"(now {job.state})")


def test_a_rolled_back_transaction_dispatches_nothing(world, caplog):
    alpha = world["alpha"]
    sent = []
    with mock.patch.object(tasks.enqueue_training_job, "apply_async", side_effect=lambda **kw: sent.append(kw)), \
            TestCase.captureOnCommitCallbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            training_job_create(actor=alpha["member"], team=alpha["team"], name="rolled-back",
                                local_queue=alpha["queue"], accelerator_types=["cpu"])
            raise RuntimeError("the request failed after the write")
        kept = training_job_create(actor=alpha["member"], team=alpha["team"], name="kept",
                                   local_queue=alpha["queue"], accelerator_types=["cpu"])
    assert not TrainingJob.objects.filter(name="rolled-back").exists()
    assert [call["args"] for call in sent] == [(kept.pk,)]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_job_submitted_while_no_worker_runs_is_queued_once_one_starts(world, tmp_path, settings):
    from tests.integration.celery_workers import REDIS_BROKER, redis_available

    if not redis_available():
        pytest.skip("Redis is not running on 127.0.0.1:6379 (CI starts it)")
    import redis

    redis.Redis.from_url(REDIS_BROKER).flushdb()
    with publishing_to(REDIS_BROKER):
        alpha = world["alpha"]
        job = training_job_create(actor=alpha["member"], team=alpha["team"], name="no-worker-yet",
                                  local_queue=alpha["queue"], accelerator_types=["cpu"])
        time.sleep(1.0)
        assert TrainingJob.objects.get(pk=job.pk).state == JobState.PENDING  # nobody consumed it
    with running_worker(tmp_path, "redis"):
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and TrainingJob.objects.get(pk=job.pk).state == JobState.PENDING:
            time.sleep(0.3)
    assert TrainingJob.objects.get(pk=job.pk).state != JobState.PENDING
