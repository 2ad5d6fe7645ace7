"""The demo setup: chips, the node pools of deploy/node_pools.yaml, queues, teams and a demo login.

Idempotent: a second run changes nothing but refreshes chip facts. The demo password is random,
made once per installation and kept (owner-only) in the data folder, never in the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from controlplane.cluster.models import AcceleratorType, NodePool
from controlplane.cluster.services import accelerator_types_seed, node_pool_create
from controlplane.common.secret_file import read_or_create_secret, write_secret
from controlplane.compute.topology import Topology, load_topology
from controlplane.quotas.models import ClusterQueue, LocalQueue, PriorityClass
from controlplane.quotas.services import cluster_queue_create, local_queue_create, priority_class_create
from controlplane.tenancy.models import Membership, Role, Team
from controlplane.tenancy.services import membership_set, team_create

DEMO_USERNAME = "demo"
PRIORITY_CLASSES = [("batch-low", 100, "best-effort batch work, preempted first"),
                    ("standard", 500, "the default for jobs and deployments"),
                    ("production-high", 1000, "production inference and deadline training")]


@dataclass(frozen=True)
class DemoLogin:
    username: str
    password: str


def demo_password_file() -> Path:
    return Path(settings.DATA_DIR) / "demo_password"


def _demo_password() -> str:
    """The demo user's password: the first 20 characters of a secret made once, and the file then holds exactly
    those (it held the whole 67-character secret, which did not log in, while the README points users to it)."""
    path = demo_password_file()
    password = read_or_create_secret(path)[:20]
    if path.read_text() != password:
        write_secret(path, password)
    return password


@transaction.atomic
def load_demo(*, topology: Topology | None = None) -> DemoLogin:
    topology = topology or load_topology()
    accelerator_types_seed()
    password = _demo_password()
    user_model = get_user_model()
    demo = user_model.objects.filter(username=DEMO_USERNAME).first()
    if demo is None:
        demo = user_model.objects.create_user(DEMO_USERNAME, password=password, is_staff=True,
                                              is_superuser=True, email="demo@fleetyard.local")
    elif not demo.check_password(password):
        demo.set_password(password)
        demo.save(update_fields=["password"])
    types = {accel.slug: accel for accel in AcceleratorType.objects.all()}
    totals: dict[str, float] = {}
    for pool in topology.pools:
        if not NodePool.objects.filter(name=pool.name).exists():
            node_pool_create(actor=demo, name=pool.name, accelerator_type=types[pool.accelerator_type],
                             devices_per_node=pool.devices_per_node or int(pool.cpus_per_node),
                             simulated=pool.simulated,
                             description=("SIMULATED: logical chips advertised by Ray nodes on a CPU host"
                                          if pool.simulated else "CPU workers on this host"))
        amount = pool.nodes * (pool.devices_per_node if pool.accelerator_type != "cpu" else pool.cpus_per_node)
        totals[pool.accelerator_type] = totals.get(pool.accelerator_type, 0) + amount
    for name, value, description in PRIORITY_CLASSES:
        if not PriorityClass.objects.filter(name=name).exists():
            priority_class_create(actor=demo, name=name, value=value, description=description)
    # Two ClusterQueues split the cluster in one cohort, so idle quota is lent between them.
    for queue_name, share in (("research", 0.5), ("production", 0.5)):
        if not ClusterQueue.objects.filter(name=queue_name).exists():
            cluster_queue_create(actor=demo, name=queue_name, cohort="all-teams",
                                 description=f"{int(share * 100)}% of every pool, lends idle quota",
                                 quotas=[{"accelerator_type": slug, "nominal_quota": total * share,
                                          "borrowing_limit": None, "lending_limit": None}
                                         for slug, total in totals.items()])
    for team_name, queue_name in (("vision", "research"), ("nlp", "production")):
        team = Team.objects.filter(name=team_name).first() or team_create(
            actor=demo, name=team_name, display_name=f"{team_name.upper()} team", admin=demo)
        if not Membership.objects.filter(team=team, user=demo).exists():
            membership_set(actor=demo, team=team, username=demo.username, role=Role.ADMIN)
        if not LocalQueue.objects.filter(team=team, name="default").exists():
            local_queue_create(actor=demo, team=team, name="default",
                               cluster_queue=ClusterQueue.objects.get(name=queue_name))
        _demo_corpus(actor=demo, team=team)
    return DemoLogin(username=DEMO_USERNAME, password=password)


def _demo_corpus(*, actor, team: Team) -> None:
    """The built-in trainer's text corpus as a dataset of the team (generated here: no download)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from controlplane.datasets.models import Dataset, DatasetFormat
    from controlplane.datasets.services import dataset_create, dataset_version_upload
    from jobs.runtime.corpus import CORPUS_NAME, corpus_bytes

    dataset = Dataset.objects.filter(team=team, name=CORPUS_NAME).first()
    if dataset is None:
        dataset = dataset_create(actor=actor, team=team, name=CORPUS_NAME,
                                 description="Generated short tales (a probabilistic grammar, seed 0) for the "
                                             "built-in transformer language model")
    if not dataset.versions.exists():
        dataset_version_upload(actor=actor, dataset=dataset, fmt=DatasetFormat.TEXT,
                               upload=SimpleUploadedFile(f"{CORPUS_NAME}.txt", corpus_bytes(0, 20000)),
                               description="20,000 sentences, seed 0")
