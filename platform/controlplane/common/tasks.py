"""Options every lifecycle task shares (ack after the work, re-queue if the worker dies, bounded retries,
a delivery ledger that dead-letters a message which keeps killing its worker), and how services hand
work to Celery once their transaction commits."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import timedelta

from celery import Task, shared_task
from celery.exceptions import Ignore, Retry
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)


class LifecycleTask(Task):
    """Runs each delivery from a worker through the delivery ledger (controlplane.common.deliveries): counted
    and committed before the work, its end recorded after; a message whose worker was lost too often is
    dead-lettered and acknowledged without running. Eager runs and plain function calls go straight to the
    body (no broker delivery to count)."""

    def __call__(self, *args, **kwargs):
        request = self.request_stack.top
        if request is None or request.id is None or request.task != self.name:
            return super().__call__(*args, **kwargs)  # called as a function (maybe inside another task)
        if request.is_eager:
            return self.run(*args, **kwargs)
        from controlplane.common import deliveries

        attempt = request.retries or 0
        verdict = deliveries.delivery_begin(task_id=request.id, attempt=attempt, task_name=self.name, args=args,
                                            kwargs=kwargs, worker=request.hostname or "")
        if not verdict.run:
            return None  # returning acknowledges the message (acks_late): the dead letter is final
        try:
            result = self.run(*args, **kwargs)  # the worker's tracer has already pushed this request
        except Retry:
            deliveries.delivery_finish(task_id=request.id, attempt=attempt, outcome=deliveries.RETRIED)
            raise
        except Ignore:
            deliveries.delivery_finish(task_id=request.id, attempt=attempt, outcome=deliveries.DONE)
            raise
        except Exception as exc:
            deliveries.delivery_finish(task_id=request.id, attempt=attempt, outcome=deliveries.FAILED,
                                       reason=f"{type(exc).__name__}: {exc}")
            raise
        deliveries.delivery_finish(task_id=request.id, attempt=attempt, outcome=deliveries.DONE)
        return result


LIFECYCLE_TASK = {"base": LifecycleTask, "acks_late": True, "reject_on_worker_lost": True, "ignore_result": True,
                  "max_retries": 5, "retry_backoff": True, "retry_backoff_max": 60}
# Publishing waits at most about a second for a broker that is down; the request does not hang on it.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.3, "interval_max": 0.5}
MAX_SENDS = 5  # an outbox message sent this often stays there for an operator (admin: Task outbox), logged


def _send(task, args, kwargs, task_id: str | None = None) -> bool:
    try:
        task.apply_async(args=args, kwargs=kwargs, task_id=task_id, retry=True, retry_policy=PUBLISH_RETRY)
    except (OperationalError, ConnectionError, OSError) as exc:
        log.warning("could not send %s%s to the broker (%s); it is sent again later", task.name, args, exc)
        return False
    return True


def dispatch(task, *args, **kwargs) -> bool:
    """Send a task now, through the outbox: a broker that cannot be reached is logged, not raised (the write
    that asked for the task is already committed), and a message no worker takes is sent again by the beat's
    `common.resend_undelivered`; the reconcilers still repair state a lost message would have changed (a PENDING
    job is enqueued, an ADMITTED one launched, a PENDING deployment deployed, an orphan run stopped)."""
    return _send_recorded(task, args, kwargs, _record(task, args, kwargs))


def dispatch_on_commit(task, *args, **kwargs) -> None:
    """Send a task once the current transaction commits; nothing is sent if it rolls back. Its outbox record is
    written in the transaction, so it commits (and rolls back) with the change that asked for the task."""
    task_id = _record(task, args, kwargs)
    transaction.on_commit(lambda: _send_recorded(task, args, kwargs, task_id))


def dispatch_many_on_commit(task, calls: Sequence[tuple[tuple, dict]]) -> None:
    """`dispatch_on_commit` for many calls of one task, each (args, kwargs): their outbox records written in one
    statement, all sent once the transaction commits and marked sent together."""
    if not all(_outboxed(task, args, kwargs) for args, kwargs in calls):
        for args, kwargs in calls:
            dispatch_on_commit(task, *args, **kwargs)
        return
    if not calls:
        return
    from controlplane.common.models import TaskOutbox

    ids = [str(uuid.uuid4()) for _ in calls]
    TaskOutbox.objects.bulk_create([_outbox_row(task, task_id, args, kwargs)
                                    for task_id, (args, kwargs) in zip(ids, calls, strict=True)], batch_size=500)

    def send_all() -> None:
        _mark_sent([task_id for task_id, (args, kwargs) in zip(ids, calls, strict=True)
                    if _send(task, args, kwargs, task_id)])

    transaction.on_commit(send_all)


def _outboxed(task, args, kwargs) -> bool:
    """Whether a call gets an outbox record: not eager runs (they run here and now, nothing to deliver or lose) nor
    reconciler passes without arguments (the beat sends them again anyway, and a backlog of passes is not sent
    twice)."""
    return not task.app.conf.task_always_eager and bool(args or kwargs)


def _outbox_row(task, task_id: str, args, kwargs):
    from controlplane.common.deliveries import json_values
    from controlplane.common.models import TaskOutbox

    return TaskOutbox(task_id=task_id, task_name=task.name, args=json_values(list(args)),
                      kwargs=json_values(dict(kwargs)))


def _record(task, args, kwargs) -> str | None:
    """The outbox record's task id, or None for a call that stays out of the outbox (_outboxed)."""
    if not _outboxed(task, args, kwargs):
        return None
    task_id = str(uuid.uuid4())
    _outbox_row(task, task_id, args, kwargs).save(force_insert=True)
    return task_id


def _send_recorded(task, args, kwargs, task_id: str | None) -> bool:
    sent = _send(task, args, kwargs, task_id)
    if sent and task_id is not None:
        _mark_sent([task_id])
    return sent


def _mark_sent(task_ids: list[str]) -> None:
    """The outbox records of these sent messages: sent now (kept until a worker takes the message)."""
    from controlplane.common.models import TaskOutbox

    for start in range(0, len(task_ids), 500):
        TaskOutbox.objects.filter(task_id__in=task_ids[start:start + 500], sent_at__isnull=True).update(
            sent_at=timezone.now(), sends=F("sends") + 1)


def resend_undelivered(*, older_than_s: float, limit: int = 500) -> int:
    """Send again (same task id) the outbox messages no worker has taken for `older_than_s` seconds since they
    were last sent (or never sent: the broker was down). A message sent twice that both arrive runs through the
    delivery ledger like any redelivery, and each task's effect has its own guard. Returns how many were sent."""
    from celery import current_app

    from controlplane.common.models import TaskOutbox

    now = timezone.now()
    cutoff = now - timedelta(seconds=older_than_s)
    due = list(TaskOutbox.objects.filter(created_at__lte=cutoff, sends__lt=MAX_SENDS)
               .filter(Q(sent_at__isnull=True) | Q(sent_at__lte=cutoff)).order_by("created_at")[:limit])
    sent = 0
    for row in due:
        if row.sent_at is not None and row.sent_at > now - timedelta(seconds=older_than_s * 2 ** (row.sends - 1)):
            continue  # each send waits twice as long as the one before: a long queue is not flooded with copies
        task = current_app.tasks.get(row.task_name)
        if task is None:
            log.error("outbox message %s[%s] names no registered task; left for an operator", row.task_name,
                      row.task_id)
            continue
        if _send(task, tuple(row.args), dict(row.kwargs), row.task_id):
            TaskOutbox.objects.filter(pk=row.pk).update(sent_at=timezone.now(), sends=F("sends") + 1)
            log.warning("sent %s[%s] again: no worker took it within %g s", row.task_name, row.task_id,
                        older_than_s)
            sent += 1
    return sent


@shared_task(name="common.resend_undelivered", **LIFECYCLE_TASK)
def resend_undelivered_task() -> int:
    """Beat: send again what no worker took within FLEETYARD_OUTBOX_RESEND_SECONDS."""
    from django.conf import settings

    return resend_undelivered(older_than_s=float(settings.FLEETYARD_OUTBOX_RESEND_SECONDS))
