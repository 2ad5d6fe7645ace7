"""Issue 8, C1: acks_late, reject_on_worker_lost and prefetch 1 lose nothing and double nothing when workers
are SIGKILLed, and a message that keeps killing its worker is dead-lettered instead of looping.

Two real Celery workers (prefork, one pool process each) run effect tasks that write one row per
idempotency key; the test SIGKILLs a whole worker (main and pool process) at random moments and starts it
again, on the broker of the run: the file-system broker on SQLite (CI pass 1) and Redis on PostgreSQL
(CI pass 2). One poison message SIGKILLs its pool process on every delivery: after
FLEETYARD_TASK_MAX_WORKER_LOSSES losses it is dead-lettered (the delivery ledger), acknowledged, and never
runs again, while every other task is done. Prints the figures; benchmarks/celery_kill.py runs the full
2,000 tasks x 10 kills.

FLEETYARD_C1_TASKS / FLEETYARD_C1_KILLS set the size (default 250 tasks, 3 kills: under a minute).
"""

from __future__ import annotations

import json
import os

import pytest
from django.conf import settings as django_settings

from controlplane.common.models import DeliveryState, TaskDelivery
from tests.integration.celery_workers import redis_available
from tests.reliability.celery_kill_support import create_effect_tables, drop_effect_tables, run_kill_scenario

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

TASKS = int(os.environ.get("FLEETYARD_C1_TASKS", "250"))
KILLS = int(os.environ.get("FLEETYARD_C1_KILLS", "3"))


def broker_kind() -> str:
    """The suite's broker of this run: Redis when CELERY_BROKER_URL says so (CI pass 2), else the file system."""
    return "redis" if os.environ.get("CELERY_BROKER_URL", "").startswith("redis") else "filesystem"


@pytest.fixture
def effect_tables():
    create_effect_tables()
    yield
    drop_effect_tables()


def test_killed_workers_lose_and_double_nothing_and_a_poison_message_is_dead_lettered(effect_tables, tmp_path):
    kind = broker_kind()
    if kind == "redis" and not redis_available():
        pytest.skip("Redis is not running on 127.0.0.1:6379 (CI starts it)")
    figures = run_kill_scenario(kind=kind, tmp_path=tmp_path, tasks=TASKS, kills=KILLS)
    print(f"\nC1 ({figures['broker']}, {figures['database']}): {figures['tasks']} tasks, {figures['kills']} kill -9 of "
          f"a worker, {figures['effects']} effects ({figures['missing']} missing), "
          f"{figures['duplicates_prevented']} duplicates prevented by the key, {figures['redeliveries']} redeliveries "
          f"after a lost worker; poison {figures['poison_state']} after {figures['poison_runs']} runs / "
          f"{figures['poison_deliveries']} deliveries; drained in {figures['drained_s']} s")
    print(json.dumps({key: value for key, value in figures.items() if key != "kill_log"}))

    assert figures["kills"] == KILLS
    assert figures["effects"] == TASKS and figures["distinct_keys"] == TASKS and figures["missing"] == 0
    # Every run past the first of a key found its effect already there, and said so.
    assert figures["effect_runs"] - figures["duplicates_prevented"] == TASKS
    assert figures["effect_tasks_dead_lettered"] == 0
    limit = django_settings.FLEETYARD_TASK_MAX_WORKER_LOSSES
    assert figures["poison_state"] == DeliveryState.DEAD_LETTERED, figures["poison_reason"]
    assert figures["poison_worker_losses"] == limit
    assert 1 <= figures["poison_runs"] <= limit  # it ran at most `limit` times, then never again
    poison = TaskDelivery.objects.get(task_name="c1.poison")
    assert poison.args == ["poison-1"] and poison.finished_at is not None and "dead-lettered" in poison.reason
    # Nothing is left running: every effect task finished, every redelivered one says DONE.
    assert not TaskDelivery.objects.filter(task_name="c1.write_effect").exclude(state=DeliveryState.DONE).exists()
