"""Celery tasks of the deployment lifecycle: thin, idempotent, ids in, state in the database row.

deploy (deploy_deployment) -> rolling updates (apply_deployment_revision) -> observe, autoscale, repair
(sync_deployments, beat every FLEETYARD_SERVING_SYNC_SECONDS) -> tear down (tear_down_deployment).
The sync is also the reconciler: it retries PENDING deployments waiting for capacity, redeploys a
service that vanished and deletes services that no live deployment owns.
"""

from __future__ import annotations

import logging

from celery import shared_task

from controlplane.common.tasks import LIFECYCLE_TASK
from controlplane.compute.registry import get_compute_backend
from inference import workflows
from inference.models import Deployment
from inference.states import DeploymentState

log = logging.getLogger(__name__)


@shared_task(name="inference.deploy_deployment", bind=True, **LIFECYCLE_TASK)
def deploy_deployment(self, deployment_id: int) -> str | None:
    backend = get_compute_backend()
    try:
        deployment = workflows.deployment_deploy(deployment_id=deployment_id, backend=backend)
        if deployment is not None and deployment.state == DeploymentState.DEPLOYING:
            deployment = workflows.deployment_sync(deployment_id=deployment_id, backend=backend)
    except Exception as exc:  # the backend may be briefly unreachable; the sync redeploys as well
        log.warning("deploying deployment %s failed: %s", deployment_id, exc)
        raise self.retry(exc=exc) from exc
    return deployment.state if deployment else None


@shared_task(name="inference.apply_deployment_revision", bind=True, **LIFECYCLE_TASK)
def apply_deployment_revision(self, deployment_id: int) -> str | None:
    backend = get_compute_backend()
    try:
        deployment = workflows.deployment_apply_revision(deployment_id=deployment_id, backend=backend)
        if deployment is not None and deployment.state in workflows.LIVE_STATES:
            deployment = workflows.deployment_sync(deployment_id=deployment_id, backend=backend)
    except Exception as exc:
        log.warning("applying the revision of deployment %s failed: %s", deployment_id, exc)
        raise self.retry(exc=exc) from exc
    return deployment.state if deployment else None


@shared_task(name="inference.sync_deployments", **LIFECYCLE_TASK)
def sync_deployments() -> dict:
    """Observe every live service, steer autoscaling, retry waiting deployments, repair drift both ways."""
    backend = get_compute_backend()
    synced, failed, deployed = 0, 0, 0
    for deployment_id in Deployment.objects.filter(state=DeploymentState.PENDING).values_list("pk", flat=True):
        try:
            deployment = workflows.deployment_deploy(deployment_id=deployment_id, backend=backend)
            deployed += int(deployment is not None and deployment.state == DeploymentState.DEPLOYING)
        except Exception:  # one deployment's trouble must not stop the others; the next pass retries
            log.exception("deploying deployment %s failed", deployment_id)
            failed += 1
    for deployment_id in Deployment.objects.filter(state__in=workflows.LIVE_STATES).exclude(compute_handle="") \
            .values_list("pk", flat=True):
        try:
            workflows.deployment_sync(deployment_id=deployment_id, backend=backend)
            synced += 1
        except Exception:
            log.exception("syncing deployment %s failed", deployment_id)
            failed += 1
    orphans = workflows.reconcile_orphan_services(backend=backend)
    return {"synced": synced, "deployed": deployed, "failed": failed, "orphans_deleted": len(orphans)}


@shared_task(name="inference.tear_down_deployment", bind=True, **LIFECYCLE_TASK)
def tear_down_deployment(self, deployment_id: int) -> str | None:
    try:
        return workflows.deployment_tear_down(deployment_id=deployment_id, backend=get_compute_backend())
    except Exception as exc:  # the orphan pass of the sync deletes it as well
        log.warning("tearing down deployment %s failed: %s", deployment_id, exc)
        raise self.retry(exc=exc) from exc
