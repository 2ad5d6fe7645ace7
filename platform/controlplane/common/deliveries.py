"""Counts each delivery of a lifecycle task message in the database, so a message that keeps killing its
worker ends dead-lettered instead of looping (acks_late + reject_on_worker_lost re-queue it after every
loss, forever).

Each delivery is recorded in its own committed transaction before the work starts. A delivery that finds
the previous one still RUNNING knows that worker was lost; after FLEETYARD_TASK_MAX_WORKER_LOSSES losses in
a row the message is recorded as DEAD_LETTERED (name, arguments, deliveries, reason, time), acknowledged
and not run again. Operators see dead letters in the admin (Task deliveries).

This ledger does not make effects idempotent: a task may still run twice (killed after its effect
committed, before the ack). Each task's effect carries its own guard (a unique key or a state check in
the effect's transaction).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.common.models import DeliveryState, TaskDelivery, TaskOutbox

log = logging.getLogger(__name__)

# Outcomes a finished delivery reports.
DONE, RETRIED, FAILED = DeliveryState.DONE, DeliveryState.RETRIED, DeliveryState.FAILED


@dataclass(frozen=True)
class DeliveryVerdict:
    run: bool
    deliveries: int
    worker_losses: int


def max_worker_losses() -> int:
    return int(getattr(settings, "FLEETYARD_TASK_MAX_WORKER_LOSSES", 3))


def json_values(value):
    """Arguments as JSON (ids, strings, flags); anything else as its text."""
    return json.loads(json.dumps(value, default=str))


def delivery_begin(*, task_id: str, attempt: int, task_name: str, args, kwargs, worker: str = "") -> DeliveryVerdict:
    """Record that a worker took this message; say whether to run it. Commits before returning."""
    now = timezone.now()
    with transaction.atomic():
        TaskOutbox.objects.filter(task_id=task_id).delete()  # a worker has it: the outbox need not send it again
        row, created = TaskDelivery.objects.select_for_update().get_or_create(
            task_id=task_id, attempt=attempt,
            defaults={"task_name": task_name, "args": json_values(list(args)), "kwargs": json_values(dict(kwargs)),
                      "deliveries": 1, "worker": worker[:255], "first_delivered_at": now,
                      "last_delivered_at": now},
        )
        if created:
            return DeliveryVerdict(run=True, deliveries=1, worker_losses=0)
        lost = row.state == DeliveryState.RUNNING  # the previous delivery never finished: its worker died
        row.deliveries += 1
        row.worker_losses = row.worker_losses + 1 if lost else 0
        row.last_delivered_at = now
        row.worker = worker[:255]
        if row.state == DeliveryState.DEAD_LETTERED:
            row.save(update_fields=["deliveries", "last_delivered_at", "worker"])
            return DeliveryVerdict(run=False, deliveries=row.deliveries, worker_losses=row.worker_losses)
        if row.worker_losses >= max_worker_losses():
            row.state = DeliveryState.DEAD_LETTERED
            row.finished_at = now
            row.reason = (f"its worker was lost on {row.worker_losses} deliveries in a row (limit "
                          f"{max_worker_losses()}); dead-lettered, not run again")
            row.save()
            log.error("dead-lettered %s[%s] %s: %s", task_name, task_id, row.args, row.reason)
            return DeliveryVerdict(run=False, deliveries=row.deliveries, worker_losses=row.worker_losses)
        row.state = DeliveryState.RUNNING
        row.finished_at = None
        row.save()
        if lost:
            log.warning("%s[%s] redelivered after its worker was lost (%s in a row)", task_name, task_id,
                        row.worker_losses)
        return DeliveryVerdict(run=True, deliveries=row.deliveries, worker_losses=row.worker_losses)


def delivery_finish(*, task_id: str, attempt: int, outcome: str, reason: str = "") -> None:
    """Record how a delivery ended. A first delivery that went well leaves no row; the rest keep theirs."""
    with transaction.atomic():
        row = TaskDelivery.objects.select_for_update().filter(task_id=task_id, attempt=attempt).first()
        if row is None:
            return
        if outcome in (DONE, RETRIED) and row.deliveries == 1:
            row.delete()
            return
        row.state = outcome
        row.reason = reason[:2000]
        row.finished_at = timezone.now()
        row.save(update_fields=["state", "reason", "finished_at"])


def dead_letters():
    """Selector: dead-lettered task messages, newest first."""
    return TaskDelivery.objects.filter(state=DeliveryState.DEAD_LETTERED).order_by("-finished_at", "-id")
