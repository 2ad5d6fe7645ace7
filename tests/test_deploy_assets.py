"""The deployment assets agree with platform/deploy/node_pools.yaml and use the production profile.

compose.yaml is read through `docker compose config --format json` when the Compose v2 plugin is
installed, so what is checked is what Docker would run; without it the same assertions run on the
file itself (YAML anchors resolved, ${VAR:-default} interpolated like Compose does) and only the
Docker-specific check is skipped. No database, no Ray cluster.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from controlplane.compute.topology import (
    ACCEL_RESOURCE_PREFIX,
    LABEL_ACCELERATOR,
    LABEL_LEAF_GROUP,
    LABEL_NODE,
    LABEL_POOL,
    LABEL_SIMULATED,
    PoolSpec,
    load_topology,
)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "platform" / "deploy" / "Dockerfile"
KUBERAY_FILE = ROOT / "platform" / "deploy" / "kuberay" / "raycluster.yaml"

CONTROL_PLANE_SERVICES = ("web", "worker", "beat")
ONE_SHOT_SERVICES = ("migrate",)
# A value for the one variable compose.yaml deliberately leaves without a default.
TEST_SECRET = "test-only-secret-key"


def compose_env() -> dict[str, str]:
    return {**os.environ, "FLEETYARD_SECRET_KEY": TEST_SECRET}


def docker_compose_available() -> str | None:
    """None when `docker compose` (v2) works here, else why not."""
    if shutil.which("docker") is None:
        return "the docker binary is not installed"
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "the Docker Compose v2 plugin (`docker compose`) is not installed"
    return None


def compose_validator() -> list[str] | None:
    """The command that validates compose.yaml here: `docker compose` (v2), else Debian's `docker-compose`."""
    if docker_compose_available() is None:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR-default}, ${VAR:-default} and $$ (enough for our compose.yaml)."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, colon, default = match.group(1), match.group(2), match.group(3)
        value = env.get(name)
        if default is None:
            return value or ""
        if value is None or (colon and value == ""):
            return default
        return value

    assert "${" not in _INTERPOLATION.sub("", text), "compose.yaml uses an interpolation form we do not parse"
    return _INTERPOLATION.sub(substitute, text)


def normalise_service(service: dict) -> dict:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    service["environment"] = {key: str(value) for key, value in environment.items()}
    depends_on = service.get("depends_on") or {}
    if isinstance(depends_on, list):
        depends_on = {name: {"condition": "service_started"} for name in depends_on}
    service["depends_on"] = depends_on
    return service


@cache
def compose_config() -> dict:
    if docker_compose_available() is None:
        result = subprocess.run(
            ["docker", "compose", "-f", str(COMPOSE_FILE), "config", "--format", "json"],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
            env=compose_env(),
        )
        assert result.returncode == 0, f"docker compose config failed:\n{result.stderr}"
        config = json.loads(result.stdout)
    else:
        config = yaml.safe_load(interpolate(COMPOSE_FILE.read_text(), compose_env()))
    for service in config["services"].values():
        normalise_service(service)
    return config


def services() -> dict[str, dict]:
    return compose_config()["services"]


def command_args(service: dict) -> list[str]:
    command = service.get("command")
    assert command, "service has no command"
    return shlex.split(command) if isinstance(command, str) else [str(arg) for arg in command]


def flag_values(args: list[str]) -> dict[str, str]:
    """`--key=value` arguments of a command line (bare flags map to "")."""
    values = {}
    for arg in args:
        if arg.startswith("--"):
            key, _, value = arg[2:].partition("=")
            values[key] = value
    return values


def parse_labels(text: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in text.split(",") if pair)


def expected_labels(pool: PoolSpec) -> dict[str, str]:
    """The labels every node of the pool shares: the per-node name is left out, and the leaf group
    is the pool's first (replicas of one service / worker group cannot differ in arguments)."""
    labels = dict(pool.node_specs()[0].labels)
    labels.pop(LABEL_NODE)
    assert labels[LABEL_LEAF_GROUP] == pool.leaf_groups[0]
    return labels


def expected_resources(pool: PoolSpec) -> dict[str, float]:
    return pool.node_specs()[0].resources


def pools() -> tuple[PoolSpec, ...]:
    return load_topology().pools


# ---------------------------------------------------------------------------------- compose.yaml


def test_compose_validates_with_docker_compose():
    command = compose_validator()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed (.ci/run installs the latter)")
    result = subprocess.run(
        [*command, "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=compose_env(),
    )
    assert result.returncode == 0, result.stderr


def test_compose_has_the_whole_topology():
    expected = {"postgres", "redis", "migrate", "web", "worker", "beat", "ray-head"}
    expected |= {f"ray-worker-{pool.name}" for pool in pools()}
    names = set(services())
    assert expected <= names, f"missing services: {sorted(expected - names)}"
    ray_workers = {name for name in names if name.startswith("ray-worker-")}
    assert ray_workers == {f"ray-worker-{pool.name}" for pool in pools()}, "a ray-worker service has no pool"
    assert services()["postgres"]["image"].startswith("postgres:15")
    assert services()["redis"]["image"].startswith("redis:7")


@pytest.mark.parametrize("pool", pools(), ids=lambda pool: pool.name)
def test_compose_ray_worker_matches_pool(pool: PoolSpec):
    service = services()[f"ray-worker-{pool.name}"]
    assert service["deploy"]["replicas"] == pool.nodes
    args = command_args(service)
    assert args[:2] == ["ray", "start"]
    flags = flag_values(args)
    assert flags["address"] == "ray-head:6379"
    assert "block" in flags
    # `ray start --num-cpus` is an int option: fractional pool sizes round up.
    assert int(flags["num-cpus"]) == math.ceil(pool.cpus_per_node)
    resources = json.loads(flags["resources"]) if "resources" in flags else {}
    assert resources == expected_resources(pool)
    assert parse_labels(flags["labels"]) == expected_labels(pool)
    assert service["depends_on"]["ray-head"]["condition"] == "service_healthy"


def test_compose_ray_head():
    head = services()["ray-head"]
    flags = flag_values(command_args(head))
    assert "head" in flags and "block" in flags
    assert flags["port"] == "6379"
    assert float(flags["num-cpus"]) == load_topology().head_cpus
    assert flags["ray-client-server-port"] == "10001"


@pytest.mark.parametrize("name", CONTROL_PLANE_SERVICES + ONE_SHOT_SERVICES)
def test_compose_control_plane_uses_production_profile(name: str):
    env = services()[name]["environment"]
    database = urlparse(env["FLEETYARD_DATABASE_URL"])
    assert database.scheme in {"postgres", "postgresql"} and database.hostname == "postgres"
    broker = urlparse(env["CELERY_BROKER_URL"])
    assert broker.scheme == "redis" and broker.hostname == "redis"
    ray_address = env["RAY_ADDRESS"]
    # Not a Ray node itself, the control plane reaches the head through the Ray Client server.
    assert urlparse(ray_address).scheme == "ray" and urlparse(ray_address).hostname == "ray-head"
    assert env["FLEETYARD_COMPUTE_BACKEND"] == "ray"
    assert env["FLEETYARD_EMBEDDED"] == "false"
    assert env["FLEETYARD_SECRET_KEY"] == TEST_SECRET, "the secret must come from the environment"


def test_compose_secret_has_no_default():
    text = COMPOSE_FILE.read_text()
    assert "${FLEETYARD_SECRET_KEY}" in text
    assert not re.search(r"\$\{FLEETYARD_SECRET_KEY:?[-?=+]", text), "no default secret may ship"


@pytest.mark.parametrize("name", CONTROL_PLANE_SERVICES)
def test_compose_control_plane_waits_for_migrations(name: str):
    depends_on = services()[name]["depends_on"]
    assert depends_on["migrate"]["condition"] == "service_completed_successfully"
    assert depends_on["postgres"]["condition"] == "service_healthy"
    assert depends_on["redis"]["condition"] == "service_healthy"


def test_compose_control_plane_commands():
    migrate = command_args(services()["migrate"])
    assert "manage.py" in migrate and "migrate" in migrate
    assert command_args(services()["web"])[0] == "gunicorn"
    assert "controlplane.wsgi:application" in command_args(services()["web"])
    assert command_args(services()["worker"])[:4] == ["celery", "-A", "controlplane", "worker"]
    assert command_args(services()["beat"])[:4] == ["celery", "-A", "controlplane", "beat"]


def test_compose_control_plane_shares_one_image():
    images = {services()[name]["image"] for name in CONTROL_PLANE_SERVICES + ONE_SHOT_SERVICES}
    images |= {service["image"] for name, service in services().items() if name.startswith("ray-")}
    assert len(images) == 1, images
    for name in CONTROL_PLANE_SERVICES:
        build = services()[name]["build"]
        assert Path(build["dockerfile"]).name == "Dockerfile"
        assert Path(build["dockerfile"]).parent.name == "deploy"


def test_every_long_running_service_has_a_healthcheck():
    for name, service in services().items():
        if name in ONE_SHOT_SERVICES:
            continue
        healthcheck = service.get("healthcheck")
        assert healthcheck and not healthcheck.get("disable"), f"{name} has no healthcheck"
        assert healthcheck["test"][0] in {"CMD", "CMD-SHELL"}, name
    checks = {
        name: " ".join(service["healthcheck"]["test"])
        for name, service in services().items()
        if name not in ONE_SHOT_SERVICES
    }
    assert "pg_isready" in checks["postgres"]
    assert "redis-cli" in checks["redis"] and "ping" in checks["redis"]
    assert "/healthz" in checks["web"]
    assert "inspect ping" in checks["worker"]


def test_compose_volumes_for_database_and_storage():
    config = compose_config()
    postgres_mounts = [str(volume) for volume in services()["postgres"].get("volumes", [])]
    assert any("/var/lib/postgresql/data" in mount for mount in postgres_mounts)
    storage_dir = services()["web"]["environment"]["FLEETYARD_STORAGE_DIR"]
    for name in (*CONTROL_PLANE_SERVICES[:2], "ray-head", *(f"ray-worker-{p.name}" for p in pools())):
        mounts = services()[name].get("volumes", [])
        targets = [
            mount["target"] if isinstance(mount, dict) else str(mount).split(":")[1] for mount in mounts
        ]
        assert storage_dir in targets, f"{name} does not mount the shared storage"
    assert {"pgdata", "storage"} <= set(config.get("volumes", {}))


# ------------------------------------------------------------------------- KubeRay RayCluster


def raycluster() -> dict:
    documents = [doc for doc in yaml.safe_load_all(KUBERAY_FILE.read_text()) if doc]
    clusters = [doc for doc in documents if doc.get("kind") == "RayCluster"]
    assert len(clusters) == 1
    return clusters[0]


def test_kuberay_cluster_shape():
    cluster = raycluster()
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["rayVersion"].startswith("2.60")
    head = cluster["spec"]["headGroupSpec"]["rayStartParams"]
    assert float(head["num-cpus"]) == load_topology().head_cpus
    groups = {group["groupName"] for group in cluster["spec"]["workerGroupSpecs"]}
    assert groups == {pool.name for pool in pools()}


@pytest.mark.parametrize("pool", pools(), ids=lambda pool: pool.name)
def test_kuberay_worker_group_matches_pool(pool: PoolSpec):
    groups = {group["groupName"]: group for group in raycluster()["spec"]["workerGroupSpecs"]}
    group = groups[pool.name]
    assert group["replicas"] == pool.nodes
    assert group["minReplicas"] <= pool.nodes <= group["maxReplicas"]
    params = group["rayStartParams"]
    assert all(isinstance(value, str) for value in params.values()), "rayStartParams values are strings"
    assert int(params["num-cpus"]) == math.ceil(pool.cpus_per_node)
    # KubeRay pastes `--resources=<value>` into a bash command line: undo the shell quoting.
    resources = json.loads(shlex.split(params["resources"])[0]) if "resources" in params else {}
    assert resources == expected_resources(pool)
    assert parse_labels(params["labels"]) == expected_labels(pool)
    image = group["template"]["spec"]["containers"][0]["image"]
    assert image == raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]


# ---------------------------------------------------------------------------- Ray's own syntax


def all_label_strings() -> list[str]:
    strings = [
        flag_values(command_args(service))["labels"]
        for name, service in services().items()
        if name.startswith("ray-worker-")
    ]
    strings += [group["rayStartParams"]["labels"] for group in raycluster()["spec"]["workerGroupSpecs"]]
    return strings


def test_labels_and_resources_parse_with_ray():
    label_utils = pytest.importorskip("ray._private.label_utils", reason="Ray's label parser moved")
    for text in all_label_strings():
        labels = label_utils.parse_node_labels_string(text)
        assert labels[LABEL_POOL] and labels[LABEL_ACCELERATOR] and labels[LABEL_SIMULATED]
    for pool in pools():
        for name in expected_resources(pool):
            assert name.startswith(ACCEL_RESOURCE_PREFIX)


# ------------------------------------------------------------------------------------ Dockerfile


def test_dockerfile_builds_the_runtime_image():
    assert DOCKERFILE.is_file()
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r"PYTHONPATH=/app:/app/platform\b", text)
    assert "pyproject.toml" in text
    assert re.search(r"^USER (?!root\b)\S+", text, re.MULTILINE), "the image must not run as root"
    cmd = [line for line in text.splitlines() if line.startswith("CMD ")]
    assert cmd and "gunicorn" in cmd[-1] and "controlplane.wsgi:application" in cmd[-1]
