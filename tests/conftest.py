"""Shared fixtures: an isolated data folder, a demo-like world of two teams, and API clients."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from controlplane import celery_app
from controlplane.cluster.services import accelerator_types_seed, node_pool_create, nodes_sync
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from controlplane.quotas.services import cluster_queue_create, local_queue_create, priority_class_create
from controlplane.tenancy.models import Role
from controlplane.tenancy.services import api_token_create, membership_set, team_create
from inference.services import _model_dir_missing as _MODEL_DIR_MISSING
from tests.families import family_of


def pytest_configure(config):
    from django.conf import settings

    # Real hashing costs ~0.3 s a user; tests need correctness, not brute-force resistance.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup (scripts/test) keeps each family of tests/families.py on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FamilyScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return family_of(nodeid)

    return FamilyScheduling(config, log)


@pytest.fixture(autouse=True)
def _isolated_storage(settings, tmp_path, monkeypatch):
    settings.MEDIA_ROOT = tmp_path / "storage"
    # Most tests name made-up model folders (file:///m); tests/security/test_model_paths.py checks the
    # real restriction to FLEETYARD_MODEL_DIRS, and tests that ask for `model_dirs_checked` the check at create
    # that the folder exists and holds config.json + model.pt (the deploy still checks it in every test).
    settings.FLEETYARD_MODEL_DIRS = ["/"]
    from inference import services as inference_services

    monkeypatch.setattr(inference_services, "_model_dir_missing", lambda path: "")
    # Unit and API tests run tasks in-process; tests/integration starts real workers instead.
    celery_app.conf.task_always_eager = True
    yield
    # The process-wide in-memory backend outlives the test, but its training runs are named by job id and
    # the next test's ids start at 1 again: drop them, so no test finds another's run under its job's name.
    from controlplane.compute.registry import get_compute_backend

    if get_compute_backend.cache_info().currsize and hasattr(get_compute_backend(), "runs"):
        backend = get_compute_backend()
        for handle in backend.list_training_handles():
            backend.release_training(handle)


@pytest.fixture
def model_dirs_checked(monkeypatch):
    """A deployment's model_uri must name a model folder that exists with config.json + model.pt, as outside tests."""
    from inference import services as inference_services

    monkeypatch.setattr(inference_services, "_model_dir_missing", _MODEL_DIR_MISSING)


@pytest.fixture
def accel(db):
    return {accel.slug: accel for accel in accelerator_types_seed()}


@pytest.fixture
def world(db, accel):
    """Two teams (alpha, beta), each with an admin, member and viewer, a queue and a priority class."""
    users = get_user_model().objects
    ops = users.create_user("ops", password="pw-ops-123456", is_staff=True)
    cq = cluster_queue_create(actor=ops, name="shared", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 16},
        {"accelerator_type": "nvidia-a100", "nominal_quota": 16},
        {"accelerator_type": "cpu", "nominal_quota": 8},
    ])
    priority = priority_class_create(actor=ops, name="standard", value=500)
    result = {"ops": ops, "cluster_queue": cq, "priority": priority}
    for team_name in ("alpha", "beta"):
        admin = users.create_user(f"{team_name}-admin", password="pw-123456789")
        team = team_create(actor=ops, name=team_name, admin=admin)
        member = users.create_user(f"{team_name}-member", password="pw-123456789")
        viewer = users.create_user(f"{team_name}-viewer", password="pw-123456789")
        membership_set(actor=admin, team=team, username=member.username, role=Role.MEMBER)
        membership_set(actor=admin, team=team, username=viewer.username, role=Role.VIEWER)
        queue = local_queue_create(actor=admin, team=team, name="default", cluster_queue=cq)
        result[team_name] = {"team": team, "admin": admin, "member": member, "viewer": viewer, "queue": queue}
    return result


def client_for(user, team=None) -> APIClient:
    """An API client authenticated with a fresh team token of `user` (or a session if team is None)."""
    client = APIClient()
    if team is None:
        client.force_login(user)
    else:
        _, raw = api_token_create(actor=user, team=team, user=user, name="test")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def api(world):
    """api(team_name, role) -> token-authenticated client; api("ops") -> a staff session."""

    def make(team_name: str, role: str = "member") -> APIClient:
        if team_name == "ops":
            return client_for(world["ops"])
        return client_for(world[team_name][role], world[team_name]["team"])

    return make


JOB_BODY = {
    "name": "train-lm",
    "queue": "default",
    "accelerator_types": ["nvidia-h100", "nvidia-a100"],
    "workers_min": 2,
    "workers_max": 4,
    "devices_per_worker": 8,
}

DEPLOYMENT_BODY = {
    "name": "chat",
    "queue": "default",
    "model_uri": "file:///checkpoints/lm/step-100",
    "accelerator_types": ["nvidia-a100"],
    "devices_per_replica": 0.5,
    "replicas_min": 1,
    "replicas_max": 3,
    "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50},
}


@pytest.fixture
def demo_cluster(world, accel):
    """The demo topology's pools and nodes (2x8 h100, 2x8 a100, 1x8 p800, a CPU node), all healthy."""
    topology = load_topology()
    for pool in topology.pools:
        node_pool_create(actor=world["ops"], name=pool.name, accelerator_type=accel[pool.accelerator_type],
                         devices_per_node=pool.devices_per_node, simulated=pool.simulated)
    nodes_sync(observed=InMemoryComputeBackend.from_topology(topology).list_nodes())
    return topology


def write_model_folder(tmp_path):
    """A model folder as a deployment's model_uri names it (the in-memory backend does not read its contents)."""
    import json

    path = tmp_path / "models" / "lm"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"vocab_size": 256}))
    (path / "model.pt").write_bytes(b"weights")
    return path
