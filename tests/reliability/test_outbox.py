"""Issue 8, C1/C2: the task outbox. A service's task message is recorded in its transaction; a worker taking it
deletes the record; what no worker took is sent again, same task id. Found by C1 on Redis: BRPOP hands a message
to the worker before the worker records it as unacknowledged, so a worker killed in between lost it for good
(249 of 250 effects); kombu cannot restore what it never recorded.
"""

from __future__ import annotations

import time
from datetime import timedelta
from unittest import mock

import pytest
from django.test import TestCase
from django.utils import timezone

from controlplane import celery_app
from controlplane.common import deliveries
from controlplane.common.models import TaskOutbox
from controlplane.common.tasks import MAX_SENDS, dispatch, resend_undelivered
from jobs import tasks
from jobs.models import TrainingJob
from jobs.services import training_job_create
from jobs.states import JobState
from tests.integration.celery_workers import publishing_to, running_worker


@pytest.fixture
def not_eager():
    """Tasks published as in a deployment (the test settings run them eagerly)."""
    saved = celery_app.conf.task_always_eager
    celery_app.conf.update(task_always_eager=False)
    yield
    celery_app.conf.update(task_always_eager=saved)


@pytest.fixture
def sent(monkeypatch, not_eager):
    """Messages the broker accepted (apply_async patched)."""
    calls = []
    monkeypatch.setattr(tasks.launch_training_job, "apply_async", lambda **kw: calls.append(kw))
    return calls


def age(seconds: float) -> None:
    TaskOutbox.objects.update(created_at=timezone.now() - timedelta(seconds=seconds),
                              sent_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_a_message_is_recorded_with_the_id_it_is_sent_under_and_a_worker_taking_it_clears_it(sent):
    assert dispatch(tasks.launch_training_job, 7)
    row = TaskOutbox.objects.get()
    assert (row.task_name, row.args, row.sends) == ("jobs.launch_training_job", [7], 1)
    assert sent[0]["task_id"] == row.task_id and sent[0]["args"] == (7,)
    deliveries.delivery_begin(task_id=row.task_id, attempt=0, task_name=row.task_name, args=[7], kwargs={})
    assert not TaskOutbox.objects.exists()


@pytest.mark.django_db
def test_what_no_worker_took_is_sent_again_with_the_same_id_less_often_each_time(sent):
    dispatch(tasks.launch_training_job, 7)
    task_id = TaskOutbox.objects.get().task_id
    assert resend_undelivered(older_than_s=60) == 0  # just sent: it may still be on its way
    age(61)
    assert resend_undelivered(older_than_s=60) == 1
    assert [call["task_id"] for call in sent] == [task_id, task_id]
    assert TaskOutbox.objects.get().sends == 2
    TaskOutbox.objects.update(sent_at=timezone.now() - timedelta(seconds=61))
    assert resend_undelivered(older_than_s=60) == 0  # the second resend waits twice as long
    TaskOutbox.objects.update(sent_at=timezone.now() - timedelta(seconds=121))
    assert resend_undelivered(older_than_s=60) == 1
    TaskOutbox.objects.update(sends=MAX_SENDS, sent_at=timezone.now() - timedelta(days=1))
    assert resend_undelivered(older_than_s=60) == 0  # given up: left for an operator in the admin
    assert TaskOutbox.objects.count() == 1


@pytest.mark.django_db
def test_a_message_the_broker_refused_is_sent_once_it_is_back(monkeypatch, not_eager):
    with mock.patch.object(tasks.launch_training_job, "apply_async", side_effect=OSError("connection refused")):
        assert not dispatch(tasks.launch_training_job, 9)
    row = TaskOutbox.objects.get()
    assert row.sent_at is None and row.sends == 0
    calls = []
    monkeypatch.setattr(tasks.launch_training_job, "apply_async", lambda **kw: calls.append(kw))
    age(301)
    TaskOutbox.objects.update(sent_at=None)
    assert resend_undelivered(older_than_s=300) == 1 and calls[0]["task_id"] == row.task_id


@pytest.mark.django_db
def test_reconciler_passes_and_eager_runs_stay_out_of_the_outbox(sent, monkeypatch):
    monkeypatch.setattr(tasks.run_scheduling_cycle, "apply_async", lambda **kw: None)
    dispatch(tasks.run_scheduling_cycle)  # no arguments: the beat sends it again anyway
    celery_app.conf.update(task_always_eager=True)  # the fixture restores it
    dispatch(tasks.launch_training_job, 7)
    assert not TaskOutbox.objects.exists()


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_message_redis_lost_is_sent_again_and_the_job_is_queued(world, tmp_path):
    from tests.integration.celery_workers import REDIS_BROKER, redis_available

    if not redis_available():
        pytest.skip("Redis is not running on 127.0.0.1:6379 (CI starts it)")
    import redis

    broker = redis.Redis.from_url(REDIS_BROKER)
    broker.flushdb()
    with publishing_to(REDIS_BROKER):
        alpha = world["alpha"]
        with TestCase.captureOnCommitCallbacks(execute=True):
            job = training_job_create(actor=alpha["member"], team=alpha["team"], name="lost-message",
                                      local_queue=alpha["queue"], accelerator_types=["cpu"])
        assert broker.llen("celery") == 1
        broker.delete("celery")  # what a worker killed between BRPOP and recording the message leaves
        with running_worker(tmp_path, "redis"):
            time.sleep(2.0)
            assert TrainingJob.objects.get(pk=job.pk).state == JobState.PENDING  # nothing to consume
            age(301)
            assert resend_undelivered(older_than_s=300) == 1
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and TrainingJob.objects.get(pk=job.pk).state == JobState.PENDING:
                time.sleep(0.3)
    assert TrainingJob.objects.get(pk=job.pk).state != JobState.PENDING
    assert not TaskOutbox.objects.exists()  # the worker took it


@pytest.mark.django_db(transaction=True)
def test_the_record_commits_and_rolls_back_with_the_change_that_asked_for_the_task(sent):
    from django.db import transaction

    from controlplane.common.tasks import dispatch_on_commit

    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch_on_commit(tasks.launch_training_job, 1)
        assert TaskOutbox.objects.count() == 1  # written in the transaction, before anything is sent
        raise RuntimeError("the request failed after the write")
    assert not TaskOutbox.objects.exists() and sent == []
    with transaction.atomic():
        dispatch_on_commit(tasks.launch_training_job, 2)
        assert sent == []
    row = TaskOutbox.objects.get()
    assert [call["task_id"] for call in sent] == [row.task_id] and row.sends == 1
