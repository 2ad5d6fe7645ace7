"""The platform's scheduling cycle at scale: what it asks the database does not grow with the waiting jobs."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.admission import run_cycle
from jobs.models import TrainingJob


@pytest.fixture(autouse=True)
def admission_only(monkeypatch):
    from jobs.tasks import launch_training_job

    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)


def waiting_jobs(world, count: int, start: int = 0, devices: int = 8) -> list[TrainingJob]:
    team, queue = world["alpha"]["team"], world["alpha"]["queue"]
    return TrainingJob.objects.bulk_create([
        TrainingJob(team=team, name=f"w{i}", local_queue=queue, accelerator_types=["nvidia-h100"], workers_min=1,
                    workers_max=1, devices_per_worker=devices, state="QUEUED", created_by=world["alpha"]["member"])
        for i in range(start, start + count)])


def cycle_queries() -> int:
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        run_cycle()
    return len(queries)


def test_a_cycle_asks_the_database_the_same_whatever_the_number_of_waiting_jobs(demo_cluster, world):
    """The 2 H100 nodes take 2 of the 8-device jobs; the others wait, each with its position. When the head is
    admitted every position behind it changes: before, one UPDATE per waiting job (10,000 waiting, 10,000 queries
    in one cycle)."""
    counts = {}
    for total in (40, 120):
        TrainingJob.objects.all().delete()
        waiting_jobs(world, total)
        cycle_queries()  # the first cycle admits two and writes every position
        TrainingJob.objects.filter(state="ADMITTED").update(state="SUCCEEDED", placement=[],
                                                            admitted_accelerator_type="")
        counts[total] = cycle_queries()  # two more admitted: every waiting job moves up two places
        positions = sorted(TrainingJob.objects.filter(state="QUEUED").values_list("queue_position", flat=True))
        assert positions == list(range(1, total - 3))
        assert TrainingJob.objects.filter(state="QUEUED", state_reason__startswith="position ").count() == total - 4
    assert counts[120] - counts[40] < 10, counts  # (61 and 141 before)


def test_a_waiting_job_whose_id_needs_64_bits_gets_its_position(demo_cluster, world):
    """Ids are bigint: the positions UPDATE cast them to INTEGER, which PostgreSQL keeps to 32 bits (integer out of
    range, and the whole cycle failed). Found by review."""
    first, second = waiting_jobs(world, 2)
    big = TrainingJob.objects.create(id=2**31 + 5, team=first.team, name="big", local_queue=first.local_queue,
                                     accelerator_types=["nvidia-h100"], workers_min=1, workers_max=1,
                                     devices_per_worker=8, state="QUEUED", created_by=first.created_by)
    cycle_queries()
    big.refresh_from_db()
    assert big.state == "QUEUED" and big.queue_position == 1 and big.state_reason.startswith("position 1 in ")
    assert {first.state for first in TrainingJob.objects.filter(pk__in=[first.pk, second.pk])} == {"ADMITTED"}


def test_reasons_with_quotes_percent_signs_and_unicode_are_written_as_they_are(demo_cluster, world, monkeypatch):
    from controlplane.scheduling.model import Wait
    from jobs import admission

    jobs = waiting_jobs(world, 3)
    reasons = ["it's 100% \"quoted\" -- %s %(x)s", "ünïcödé ✓ 数字", "x" * 5000]
    real = admission._schedule_with_serving

    def scheduled(snapshot):
        result = real(snapshot)
        result.admitted.clear()
        pairs = enumerate(zip(jobs, reasons, strict=True))
        result.waiting[:] = [Wait(str(job.pk), i + 1, reason) for i, (job, reason) in pairs]
        return result

    monkeypatch.setattr(admission, "_schedule_with_serving", scheduled)
    cycle_queries()
    written = dict(TrainingJob.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "state_reason"))
    for job, reason in zip(jobs, reasons, strict=True):
        assert written[job.pk] == f"position {reasons.index(reason) + 1} in cluster queue shared: {reason}"


def test_a_cycle_writes_its_admissions_together(demo_cluster, world):
    """4 or 16 one-device jobs admitted onto the 16 H100 devices: about the same statements (before, about 7 per
    admission: the job's row, locked again and saved, its event, its audit record, its launch's outbox record)."""
    counts = {}
    for total in (4, 16):
        TrainingJob.objects.all().delete()
        waiting_jobs(world, total, devices=1)
        counts[total] = cycle_queries()
        assert TrainingJob.objects.filter(state="ADMITTED").count() == total
        assert all(job.events.filter(to_state="ADMITTED").count() == 1 for job in TrainingJob.objects.all())
    assert counts[16] - counts[4] < 6, counts


def test_a_running_elastic_job_grown_by_the_cycle_gets_its_workers_and_an_event(demo_cluster, world):
    from controlplane.cluster.models import Node
    from controlplane.tenancy.models import AuditEvent

    [job] = waiting_jobs(world, 1, devices=1)
    node = Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").order_by("name").first().name
    TrainingJob.objects.filter(pk=job.pk).update(
        state="RUNNING", workers_max=4, admitted_accelerator_type="nvidia-h100", compute_handle="fy-train-x",
        placement=[{"node": node, "taken": [[0, 1.0]]}])
    cycle_queries()
    job.refresh_from_db()
    assert len(job.placement) == 4 and job.state == "RUNNING"
    [event] = job.events.filter(reason__startswith="grown to 4 workers")
    assert event.data == {"workers": 4} and event.from_state == event.to_state == "RUNNING"
    assert AuditEvent.objects.filter(target_id=str(job.pk), data__reason=event.reason).exists()
