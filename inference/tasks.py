"""Celery tasks of the deployment lifecycle: thin, idempotent, ids in, state in the database row."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.common.tasks import LIFECYCLE_TASK
from controlplane.compute.registry import get_compute_backend
from inference.models import Deployment

log = logging.getLogger(__name__)


@shared_task(name="inference.tear_down_deployment", bind=True, **LIFECYCLE_TASK)
def tear_down_deployment(self, deployment_id: int) -> str | None:
    deployment = Deployment.objects.filter(pk=deployment_id).only("compute_handle").first()
    if deployment is None or not deployment.compute_handle:
        return None
    try:
        return get_compute_backend().stop_gang(deployment.compute_handle).state
    except Exception as exc:
        log.warning("tearing down %s failed: %s", deployment.compute_handle, exc)
        raise self.retry(exc=exc) from exc
