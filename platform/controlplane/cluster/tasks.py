"""Beat reconciler: observe the cluster's nodes through the compute backend and record them."""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.cluster.services import nodes_sync
from controlplane.common.tasks import LIFECYCLE_TASK
from controlplane.compute.registry import get_compute_backend

log = logging.getLogger(__name__)


@shared_task(name="cluster.sync_nodes", **LIFECYCLE_TASK)
def sync_nodes() -> dict | None:
    try:
        observed = get_compute_backend().list_nodes()
    except Exception as exc:  # a reconciler never dies: log, and the next beat tries again
        log.warning("cannot observe nodes: %s", exc)
        return None
    return nodes_sync(observed=observed)
