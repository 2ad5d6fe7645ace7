"""Options every lifecycle task shares (ack after the work, re-queue if the worker dies, bounded retries),
and how services hand work to Celery once their transaction commits."""

from __future__ import annotations

import logging

from django.db import transaction
from kombu.exceptions import OperationalError

log = logging.getLogger(__name__)

LIFECYCLE_TASK = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True, "max_retries": 5,
                  "retry_backoff": True, "retry_backoff_max": 60}
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
