"""Writing a cycle's decisions together: common.bulk.write_fields, lifecycle.transition_many and
tasks.dispatch_many_on_commit (the scheduling cycle uses them; CI runs this file on SQLite and PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connection, transaction
from django.test import TestCase
from django.utils import timezone

from controlplane.common.bulk import write_fields
from controlplane.common.errors import InvalidTransition
from controlplane.common.lifecycle import transition_many
from controlplane.common.tasks import dispatch_many_on_commit
from controlplane.tenancy.models import AuditEvent
from jobs.models import TrainingJob, TrainingJobEvent


def jobs(world, count: int, **fields) -> list[TrainingJob]:
    team, queue = world["alpha"]["team"], world["alpha"]["queue"]
    return TrainingJob.objects.bulk_create([
        TrainingJob(team=team, name=f"j{i}", local_queue=queue, accelerator_types=["nvidia-h100"], workers_min=1,
                    workers_max=1, devices_per_worker=8, created_by=world["alpha"]["member"], **fields)
        for i in range(count)])


def test_write_fields_writes_each_rows_own_values_of_every_type(world, monkeypatch):
    monkeypatch.setattr("controlplane.common.bulk.BATCH", 4)  # several statements
    rows = jobs(world, 9, state="QUEUED")
    rows.append(TrainingJob.objects.create(id=2**31 + 7, team=rows[0].team, name="big", local_queue=rows[0].local_queue,
                                           accelerator_types=["nvidia-h100"], created_by=rows[0].created_by))
    when = timezone.now().replace(microsecond=0) - dt.timedelta(hours=1)
    for i, job in enumerate(rows):
        job.placement = [{"node": f"n{i}", "taken": [[0, 1.0]]}] if i % 2 else []  # JSON, and an empty one
        job.queue_position = None if i == 3 else i  # NULL
        job.state_reason = f"it's {i}% \"odd\" ✓ %s"
        job.state_changed_at = when + dt.timedelta(seconds=i)
    with transaction.atomic():
        write_fields(rows, ["placement", "queue_position", "state_reason", "state_changed_at"])
    for i, job in enumerate(rows):
        fresh = TrainingJob.objects.get(pk=job.pk)
        assert fresh.placement == job.placement and fresh.queue_position == job.queue_position
        assert fresh.state_reason == job.state_reason and fresh.state_changed_at == job.state_changed_at, i
    write_fields([], ["placement"])  # nothing to write: no statement


def test_transition_many_writes_states_events_and_audit_records_or_nothing(world):
    rows = jobs(world, 3, state="QUEUED")
    for job in rows:
        job.queue_position = None
    with transaction.atomic():
        transition_many([(job, f"admitted {job.name}", {"n": i}) for i, job in enumerate(rows)],
                        machine=TrainingJob.machine, event_model=TrainingJobEvent, to="ADMITTED", system="scheduler",
                        fields=["queue_position"])
    for i, job in enumerate(rows):
        fresh = TrainingJob.objects.get(pk=job.pk)
        assert (fresh.state, fresh.state_reason, fresh.queue_position) == ("ADMITTED", f"admitted {job.name}", None)
        [event] = TrainingJobEvent.objects.filter(subject=job)
        assert (event.from_state, event.to_state, event.actor_label, event.data) == (
            "QUEUED", "ADMITTED", "system:scheduler", {"n": i})
        [audit] = AuditEvent.objects.filter(target_id=str(job.pk), action="trainingjob.transition")
        assert audit.data == {"from": "QUEUED", "to": "ADMITTED", "reason": f"admitted {job.name}"}
    finished = jobs(world, 1, state="SUCCEEDED")
    with pytest.raises(InvalidTransition), transaction.atomic():  # one forbidden: nothing written
        transition_many([(rows[0], "x", {}), (finished[0], "y", {})], machine=TrainingJob.machine,
                        event_model=TrainingJobEvent, to="RUNNING", system="scheduler")
    assert TrainingJob.objects.get(pk=rows[0].pk).state == "ADMITTED"
    assert TrainingJobEvent.objects.count() == 3


def test_dispatch_many_on_commit_records_every_call_and_sends_them_after_the_commit(world, monkeypatch):
    from controlplane.common.models import TaskOutbox
    from jobs.tasks import launch_training_job, stop_training_run

    sent = []
    monkeypatch.setattr(stop_training_run, "apply_async", lambda **kw: sent.append((kw["args"], kw["kwargs"])))
    conf = stop_training_run.app.conf
    eager, conf.task_always_eager = conf.task_always_eager, False  # (the tests run tasks eagerly)
    try:
        with TestCase.captureOnCommitCallbacks(execute=True), transaction.atomic():
            dispatch_many_on_commit(stop_training_run, [((1,), {"checkpoint": True}), ((2,), {"checkpoint": False})])
            dispatch_many_on_commit(launch_training_job, [])
            assert TaskOutbox.objects.count() == 2 and sent == []
    finally:
        conf.task_always_eager = eager
    assert sorted(sent) == [((1,), {"checkpoint": True}), ((2,), {"checkpoint": False})]
    assert TaskOutbox.objects.filter(sent_at__isnull=False).count() == 2  # sent, kept until a worker takes them
    assert connection.vendor in ("sqlite", "postgresql")


def test_write_fields_refuses_a_string_too_long_for_its_column_instead_of_cutting_it(world):
    """On PostgreSQL a CAST to varchar(n) cuts silently; the value is cast to text so the column refuses it, as the
    ORM's UPDATE does (SQLite does not enforce lengths, for either). Found by review."""
    from django.db import DataError

    [job] = jobs(world, 1, state="QUEUED")
    job.admitted_accelerator_type = "x" * 70  # the column holds 63
    if connection.vendor == "postgresql":
        with pytest.raises(DataError), transaction.atomic():
            write_fields([job], ["admitted_accelerator_type"])
        assert TrainingJob.objects.get(pk=job.pk).admitted_accelerator_type == ""
    else:
        write_fields([job], ["admitted_accelerator_type"])
        assert TrainingJob.objects.get(pk=job.pk).admitted_accelerator_type == "x" * 70
