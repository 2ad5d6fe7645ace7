"""Locking under real concurrency, on PostgreSQL (CI sets FLEETYARD_DATABASE_URL=postgres://...).

Each test races several threads, each with its own database connection, through one service and
checks that the row locks let exactly the right number win.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from controlplane.common.errors import ConflictError
from controlplane.datasets.services import dataset_create, dataset_version_register
from controlplane.tenancy.models import Membership, Role
from controlplane.tenancy.services import membership_set
from jobs.models import TrainingJob
from jobs.services import training_job_cancel, training_job_create

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _needs_postgres():
    if connection.vendor != "postgresql":
        pytest.skip("row-locking tests run on PostgreSQL (set FLEETYARD_DATABASE_URL=postgres://...)")


def race(count: int, action) -> list:
    """Run action(i) in `count` threads released together; return each result or exception."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(index: int) -> None:
        try:
            barrier.wait(10)
            results[index] = action(index)
        except Exception as exc:  # collected and asserted on by the caller
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_concurrent_versions_get_distinct_gapless_numbers(world):
    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="racy")
    results = race(8, lambda i: dataset_version_register(actor=alpha["member"], dataset=dataset,
                                                          uri=f"s3://bucket/racy/{i}").version)
    assert sorted(results) == list(range(1, 9)), results


def test_concurrent_cancels_transition_once(world):
    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="c", local_queue=alpha["queue"],
                              accelerator_types=["cpu"], devices_per_worker=0)
    results = race(6, lambda i: training_job_cancel(actor=alpha["member"], job=job).state)
    wins = [r for r in results if r == "CANCELLED"]
    assert len(wins) == 1 and all(isinstance(r, ConflictError) for r in results if r != "CANCELLED"), results
    assert TrainingJob.objects.get(pk=job.pk).events.filter(to_state="CANCELLED").count() == 1


def test_two_admins_demoting_each_other_keep_one_admin(world):
    alpha = world["alpha"]
    membership_set(actor=alpha["admin"], team=alpha["team"], username=alpha["member"].username, role=Role.ADMIN)
    admins = [alpha["admin"], alpha["member"]]
    results = race(2, lambda i: membership_set(actor=admins[i], team=alpha["team"],
                                               username=admins[i].username, role=Role.VIEWER).role)
    assert [str(r) for r in results if not isinstance(r, Exception)] == ["viewer"], results
    assert [type(r) for r in results if isinstance(r, Exception)] == [ConflictError], results
    assert Membership.objects.filter(team=alpha["team"], role=Role.ADMIN).count() == 1
