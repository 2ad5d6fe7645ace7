"""S3 (issue 8): roles. Every write operation of the OpenAPI schema is classified by the role it needs
(operator = staff, team admin, member, viewer); every caller below that role gets 403 with a valid body,
and the database is unchanged. A write operation nobody classified fails the test, so a new endpoint has
to say who may call it.

Preempting another team's work has no endpoint: preemption is the scheduler's decision from priorities,
and a workload's priority class is chosen at submit (members) from classes only operators create.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from controlplane.cluster.models import Node
from controlplane.cluster.services import node_pool_create, nodes_sync
from controlplane.compute.base import ObservedNode
from controlplane.tenancy.models import Membership
from controlplane.tenancy.services import api_token_create
from inference.services import deployment_create
from jobs.services import training_job_create
from tests.security.conftest import database_snapshot

RANK = {"viewer": 0, "member": 1, "admin": 2, "staff": 3}
CALLERS = ("viewer", "member", "admin")  # alpha's roles; "staff" is the operator `ops`

# (method, path template) -> the least role that may call it.
REQUIRED = {
    ("post", "/api/v1/teams/"): "staff",
    ("post", "/api/v1/cluster-queues/"): "staff",
    ("patch", "/api/v1/cluster-queues/{name}/"): "staff",
    ("post", "/api/v1/node-pools/"): "staff",
    ("post", "/api/v1/nodes/{id}/cordon/"): "staff",
    ("post", "/api/v1/nodes/{id}/uncordon/"): "staff",
    ("post", "/api/v1/priority-classes/"): "staff",
    ("post", "/api/v1/local-queues/"): "admin",
    ("post", "/api/v1/memberships/"): "admin",
    ("patch", "/api/v1/memberships/{id}/"): "admin",
    ("delete", "/api/v1/memberships/{id}/"): "admin",
    ("post", "/api/v1/datasets/"): "member",
    ("delete", "/api/v1/datasets/{id}/"): "member",
    ("post", "/api/v1/datasets/{id}/versions/"): "member",
    ("post", "/api/v1/training-jobs/"): "member",
    ("delete", "/api/v1/training-jobs/{id}/"): "member",
    ("post", "/api/v1/training-jobs/{id}/cancel/"): "member",
    ("post", "/api/v1/training-jobs/{id}/checkpoints/"): "member",
    ("post", "/api/v1/training-jobs/{id}/retry/"): "member",
    ("post", "/api/v1/deployments/"): "member",
    ("patch", "/api/v1/deployments/{id}/"): "member",
    ("delete", "/api/v1/deployments/{id}/"): "member",
    ("post", "/api/v1/deployments/{id}/scale/"): "member",
    ("post", "/api/v1/specs/apply/"): "member",
    # Anyone in a team: their own tokens (others' tokens are not even visible: tests/security/test_bola_matrix.py),
    # and plans, which write nothing.
    ("post", "/api/v1/api-tokens/"): "viewer",
    ("post", "/api/v1/api-tokens/{id}/revoke/"): "viewer",
    ("delete", "/api/v1/api-tokens/{id}/"): "viewer",
    ("post", "/api/v1/plans/"): "viewer",
}

JOB_SPEC = "kind: training_job\nname: from-spec\nqueue: default\nresources: {accelerators: cpu}\n"


@pytest.fixture
def alpha_objects(world, accel):
    """One alpha object per kind an operation acts on, and a valid body for every operation."""
    alpha, ops = world["alpha"], world["ops"]
    node_pool_create(actor=ops, name="cpu-pool", accelerator_type=accel["cpu"], devices_per_node=0, simulated=False)
    nodes_sync(observed=[ObservedNode(node_id="n1", name="cpu-pool-0", pool="cpu-pool", accelerator_type="cpu",
                                      leaf_group="lg", alive=True, simulated=False, capacity={"CPU": 4},
                                      free={"CPU": 4})])
    job = training_job_create(actor=alpha["admin"], team=alpha["team"], name="job", local_queue=alpha["queue"],
                              accelerator_types=["cpu"])
    deployment = deployment_create(actor=alpha["admin"], team=alpha["team"], name="svc", local_queue=alpha["queue"],
                                   accelerator_types=["cpu"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                                   model_uri="file:///m")
    from controlplane.datasets.services import dataset_create

    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="corpus")
    ids = {"id": None, "name": "shared"}
    objects = {
        "nodes": Node.objects.get().pk, "memberships": Membership.objects.get(team=alpha["team"],
                                                                               user=alpha["member"]).pk,
        "datasets": dataset.pk, "training-jobs": job.pk, "deployments": deployment.pk,
    }
    bodies = {
        ("post", "/api/v1/teams/"): {"name": "gamma"},
        ("post", "/api/v1/cluster-queues/"): {"name": "extra", "quotas": [{"accelerator_type": "cpu",
                                                                           "nominal_quota": 1}]},
        ("patch", "/api/v1/cluster-queues/{name}/"): {"quotas": [{"accelerator_type": "cpu", "nominal_quota": 999}]},
        ("post", "/api/v1/node-pools/"): {"name": "new-pool", "accelerator_type": "cpu", "devices_per_node": 0,
                                          "simulated": False},
        ("post", "/api/v1/priority-classes/"): {"name": "vip", "value": 100000},
        ("post", "/api/v1/local-queues/"): {"name": "second", "cluster_queue": "shared"},
        ("post", "/api/v1/memberships/"): {"username": "beta-member", "role": "member"},
        ("patch", "/api/v1/memberships/{id}/"): {"role": "admin"},
        ("post", "/api/v1/datasets/"): {"name": "another"},
        ("post", "/api/v1/datasets/{id}/versions/"): {"uri": "s3://bucket/key"},
        ("post", "/api/v1/training-jobs/"): {"name": "new-job", "queue": "default", "accelerator_types": ["cpu"]},
        ("post", "/api/v1/training-jobs/{id}/cancel/"): {"reason": "test"},
        ("post", "/api/v1/deployments/"): {"name": "new-svc", "queue": "default", "accelerator_types": ["cpu"],
                                           "model_uri": "file:///m",
                                           "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}},
        ("patch", "/api/v1/deployments/{id}/"): {"replicas_max": 3},
        ("post", "/api/v1/deployments/{id}/scale/"): {"replicas_min": 1, "replicas_max": 2},
        ("post", "/api/v1/specs/apply/"): {"spec": JOB_SPEC},
        ("post", "/api/v1/plans/"): {},
    }
    return ids, objects, bodies


def _write_operations(schema: dict) -> list[tuple[str, str]]:
    return [(method, path) for path, ops in schema["paths"].items() for method in ops
            if method in {"post", "put", "patch", "delete"}]


def test_every_write_operation_is_classified(api_schema):
    unclassified = sorted(set(_write_operations(api_schema)) - set(REQUIRED))
    assert not unclassified, f"say which role these need in REQUIRED: {unclassified}"


def _url(path: str, objects: dict) -> str:
    resource = path.split("/")[3]
    if "{name}" in path:
        return path.replace("{name}", "shared")
    return path.replace("{id}", str(objects.get(resource, 0)))


def _client(world, role: str) -> Client:
    user = world["alpha"][role]
    _, raw = api_token_create(actor=user, team=world["alpha"]["team"], user=user, name=f"s3-{role}")
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}")


def test_callers_below_the_needed_role_get_403_and_change_nothing(world, alpha_objects, api_schema):
    _, objects, bodies = alpha_objects
    clients = {role: _client(world, role) for role in CALLERS}
    before = database_snapshot()
    checked = []
    for method, path in _write_operations(api_schema):
        needed = REQUIRED[(method, path)]
        for role in CALLERS:
            if RANK[role] >= RANK[needed]:
                continue
            body = bodies.get((method, path))
            kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
            response = getattr(clients[role], method)(_url(path, objects), **kwargs)
            checked.append((role, method.upper(), path, response.status_code))
    wrong = [c for c in checked if c[3] != 403]
    print(f"\nrole matrix: {len(checked)} calls below the needed role; {len(checked) - len(wrong)} answered 403")
    assert not wrong, wrong
    assert len(checked) >= 40, checked
    assert database_snapshot() == before, "a refused call changed the database"


def test_the_needed_role_is_enough(world, alpha_objects, api_schema):
    """The other half: with the role REQUIRED names, the same calls are not refused (so 403 above means the role)."""
    _, objects, bodies = alpha_objects
    ops = Client()
    ops.force_login(world["ops"])
    clients = {"staff": ops, **{role: _client(world, role) for role in CALLERS}}
    refused = []
    for method, path in _write_operations(api_schema):
        if method == "delete" or path.endswith(("/revoke/", "/checkpoints/")):
            continue  # destructive or needs a live run; their refusals are covered above
        body = bodies.get((method, path))
        kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
        response = getattr(clients[REQUIRED[(method, path)]], method)(_url(path, objects), **kwargs)
        if response.status_code in (401, 403):
            refused.append((method, path, response.status_code, response.content[:200]))
    assert not refused, refused
