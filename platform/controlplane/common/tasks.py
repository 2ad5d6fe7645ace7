"""Options every lifecycle task shares (ack after the work, re-queue if the worker dies, bounded retries,
a delivery ledger that dead-letters a message which keeps killing its worker), and how services hand
work to Celery once their transaction commits."""

from __future__ import annotations

import logging

from celery import Task
from celery.exceptions import Ignore, Retry
from django.db import transaction
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


def dispatch(task, *args, **kwargs) -> bool:
    """Send a task now. A broker that cannot be reached is logged, not raised: the write that asked for the
    task is already committed, and the beat's reconcilers pick up what was not dispatched (a PENDING job is
    enqueued, an ADMITTED one launched, a PENDING deployment deployed, an orphan run stopped)."""
    try:
        task.apply_async(args=args, kwargs=kwargs, retry=True, retry_policy=PUBLISH_RETRY)
    except (OperationalError, ConnectionError, OSError) as exc:
        log.warning("could not send %s%s to the broker (%s); the reconciler will pick it up", task.name, args, exc)
        return False
    return True


def dispatch_on_commit(task, *args, **kwargs) -> None:
    """Send a task once the current transaction commits; nothing is sent if it rolls back."""
    transaction.on_commit(lambda: dispatch(task, *args, **kwargs))
