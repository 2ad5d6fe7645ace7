"""Fixtures for the security suite: one of every team-owned object, all in team beta, the API schema, and a
snapshot of every table a caller could change (to prove a refused request wrote nothing)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from drf_spectacular.generators import SchemaGenerator

from controlplane.cluster.models import Node, NodePool
from controlplane.datasets.models import Dataset, DatasetVersion
from controlplane.datasets.services import dataset_create, dataset_version_upload
from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass, ResourceQuota
from controlplane.tenancy.models import ApiToken, AuditEvent, Membership, Team
from controlplane.tenancy.services import api_token_create
from inference.models import Deployment, DeploymentRevision
from inference.services import deployment_create
from jobs.models import TrainingJob
from jobs.services import training_job_create

# Names only team beta's objects carry: a response to team alpha that contains one has leaked it.
BETA_SECRETS = ("secret-job-b7", "secret-svc-b7", "corpus-b7", "beta-token-b7")


SNAPSHOT_MODELS = (Team, Membership, ApiToken, LocalQueue, Dataset, DatasetVersion, TrainingJob, Deployment,
                   DeploymentRevision, Node, NodePool, ClusterQueue, ResourceQuota, PriorityClass)


def database_snapshot() -> dict:
    """Every row of the tables a caller could change (minus a token's last-use time, which its own use bumps)."""
    rows = {}
    for model in SNAPSHOT_MODELS:
        values = list(model.objects.order_by("pk").values())
        if model is ApiToken:
            for row in values:
                row.pop("last_used_at")
        rows[model.__name__] = values
    rows["audit_events"] = AuditEvent.objects.count()
    return rows


@pytest.fixture(scope="session")
def api_schema() -> dict:
    """The OpenAPI document the API serves, generated the same way /api/v1/schema/ does."""
    return SchemaGenerator().get_schema(request=None, public=True)


@pytest.fixture
def beta_objects(world):
    """{resource path segment: the id of one beta object}, with beta's objects created through services."""
    beta = world["beta"]
    team, admin = beta["team"], beta["admin"]
    dataset = dataset_create(actor=admin, team=team, name=BETA_SECRETS[2])
    dataset_version_upload(actor=admin, dataset=dataset, upload=SimpleUploadedFile("a.txt", b"hello"))
    job = training_job_create(actor=admin, team=team, name=BETA_SECRETS[0], local_queue=beta["queue"],
                              accelerator_types=["nvidia-h100"])
    deployment = deployment_create(actor=admin, team=team, name=BETA_SECRETS[1], local_queue=beta["queue"],
                                   accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                                   model_uri="file:///m")
    token, _ = api_token_create(actor=admin, team=team, user=admin, name=BETA_SECRETS[3])
    return {
        "teams": team.pk,
        "memberships": Membership.objects.filter(team=team, user=beta["member"]).get().pk,
        "api-tokens": token.pk,
        "audit-events": AuditEvent.objects.filter(team=team).first().pk,
        "local-queues": beta["queue"].pk,
        "datasets": dataset.pk,
        "training-jobs": job.pk,
        "deployments": deployment.pk,
    }
