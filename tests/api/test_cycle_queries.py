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


def waiting_jobs(world, count: int, start: int = 0) -> list[TrainingJob]:
    team, queue = world["alpha"]["team"], world["alpha"]["queue"]
    return TrainingJob.objects.bulk_create([
        TrainingJob(team=team, name=f"w{i}", local_queue=queue, accelerator_types=["nvidia-h100"], workers_min=1,
                    workers_max=1, devices_per_worker=8, state="QUEUED", created_by=world["alpha"]["member"])
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
