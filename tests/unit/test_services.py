"""Services and selectors below the API: references, tokens, transitions, node sync, demo loader."""

from __future__ import annotations

import pytest

from controlplane.cluster.models import Node
from controlplane.cluster.services import nodes_sync
from controlplane.common.errors import InvalidTransition, ValidationFailed
from controlplane.common.lifecycle import transition
from controlplane.common.references import resolve_dataset_version
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from controlplane.datasets.services import dataset_create, dataset_version_register
from controlplane.demo import load_demo
from controlplane.quotas.models import ClusterQueue, LocalQueue
from controlplane.tenancy.models import AuditEvent
from controlplane.tenancy.services import api_token_authenticate, api_token_create, api_token_revoke
from jobs.models import TrainingJob, TrainingJobEvent
from jobs.services import training_job_create, training_job_enqueue


def test_dataset_references(world):
    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="corpus")
    for _ in range(3):
        dataset_version_register(actor=alpha["admin"], dataset=dataset, uri="s3://b/k")
    team = alpha["team"]
    assert resolve_dataset_version(team=team, reference="dataset://corpus@2").version == 2
    assert resolve_dataset_version(team=team, reference="corpus@latest").version == 3
    assert resolve_dataset_version(team=team, reference="corpus").version == 3
    assert resolve_dataset_version(team=team, reference="") is None
    for bad in ("corpus@9", "other@1", "dataset://Corpus@1", "corpus@x"):
        with pytest.raises(ValidationFailed):
            resolve_dataset_version(team=team, reference=bad)
    with pytest.raises(ValidationFailed):  # another team's dataset of the same name is invisible
        resolve_dataset_version(team=world["beta"]["team"], reference="corpus@1")


def test_token_authentication_service(world):
    alpha = world["alpha"]
    token, raw = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="t")
    assert api_token_authenticate(raw=raw) == token
    assert api_token_authenticate(raw=raw + "x") is None and api_token_authenticate(raw="nope") is None
    alpha["member"].is_active = False
    alpha["member"].save()
    assert api_token_authenticate(raw=raw) is None
    api_token_revoke(actor=alpha["admin"], token=token)
    assert AuditEvent.objects.filter(action="api_token.revoke", target_id=str(token.pk)).count() == 1
    with pytest.raises(ValidationFailed, match="not a member"):
        api_token_create(actor=alpha["admin"], team=alpha["team"], user=world["beta"]["member"], name="x")


def test_transition_checks_the_table_and_records_everything(world):
    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="j", local_queue=alpha["queue"],
                              accelerator_types=["cpu"], devices_per_worker=0)
    with pytest.raises(InvalidTransition):
        transition(obj=job, machine=TrainingJob.machine, event_model=TrainingJobEvent, to="RUNNING", reason="x")
    assert TrainingJob.objects.get(pk=job.pk).state == "PENDING"
    assert training_job_enqueue(job_id=job.pk).state == "QUEUED"
    assert training_job_enqueue(job_id=job.pk).state == "QUEUED"  # idempotent: a second run changes nothing
    assert job.events.filter(to_state="QUEUED").count() == 1
    assert training_job_enqueue(job_id=999999) is None
    assert AuditEvent.objects.filter(action="trainingjob.transition", target_id=str(job.pk)).count() == 2


def test_nodes_sync_is_idempotent_and_marks_lost_nodes(world, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    load_demo()
    backend = InMemoryComputeBackend.from_topology(load_topology())
    first = nodes_sync(observed=backend.list_nodes())
    assert first["observed"] == 6 and first["unknown_pool"] == 0
    assert Node.objects.count() == 6
    nodes_sync(observed=backend.list_nodes())
    assert Node.objects.count() == 6
    remaining = [node for node in backend.list_nodes() if node.name != "h100-pool-1"]
    assert nodes_sync(observed=remaining)["lost"] == 1
    lost = Node.objects.get(name="h100-pool-1")
    assert (lost.health, lost.free_devices, lost.capacity_devices) == ("unreachable", 0.0, 8.0)
    assert AuditEvent.objects.filter(action="node.discover").count() == 6
    assert AuditEvent.objects.filter(action="node.unreachable", actor_label="system:reconciler").count() == 1
    nodes_sync(observed=backend.list_nodes())  # it comes back
    assert AuditEvent.objects.filter(action="node.healthy", target_id=str(lost.pk)).count() == 1


def test_demo_loader_is_idempotent(db, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    first = load_demo()
    counts = (ClusterQueue.objects.count(), LocalQueue.objects.count(), AuditEvent.objects.count())
    second = load_demo()
    assert first == second
    assert counts == (ClusterQueue.objects.count(), LocalQueue.objects.count(), AuditEvent.objects.count())
    from django.contrib.auth import authenticate

    assert authenticate(username=first.username, password=first.password) is not None
    from controlplane.datasets.models import DatasetVersion

    corpora = DatasetVersion.objects.filter(dataset__name="fleetyard-tiny-tales")
    assert corpora.count() == 2  # one per demo team, uploaded once
    corpus = corpora.first()
    assert corpus.uploaded and corpus.format == "text" and corpus.size_bytes > 500_000


def test_the_demo_password_file_holds_the_password_that_logs_in(db, settings, tmp_path):
    """It held a 67-character secret of which the first 20 characters were the password; the README points users to
    the file. An install made before keeps its password, and its file is rewritten to hold just that."""
    import os

    from django.contrib.auth import authenticate

    settings.DATA_DIR = tmp_path
    (tmp_path / "demo_password").write_text("x" * 20 + "y" * 47)  # as earlier versions made it
    login = load_demo()
    assert login.password == "x" * 20 == (tmp_path / "demo_password").read_text()
    assert os.stat(tmp_path / "demo_password").st_mode & 0o077 == 0
    assert authenticate(username=login.username, password=(tmp_path / "demo_password").read_text()) is not None
    (tmp_path / "demo_password").unlink()
    fresh = load_demo()  # a new install
    assert fresh.password == (tmp_path / "demo_password").read_text() and len(fresh.password) == 20


def _team_lookups(queries) -> list[str]:
    """Statements that read the team row alone: the audit record's name lookup, or a submission lock."""
    return [q["sql"] for q in queries if q["sql"].startswith('SELECT "tenancy_team"."')
            and 'FROM "tenancy_team" WHERE "tenancy_team"."id" =' in q["sql"]]


def test_a_transition_reads_its_team_with_its_lock(world, django_assert_num_queries):
    """audit_event read the team's name in a query of its own for every single transition (given only the team's
    id): the lock's query reads it now. Lock, update, event, audit record: 4 queries (5 before)."""
    from controlplane.common.lifecycle import record_event

    alpha = world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="j", local_queue=alpha["queue"],
                              accelerator_types=["cpu"], devices_per_worker=0)
    fresh = TrainingJob.objects.get(pk=job.pk)  # its team not loaded
    with django_assert_num_queries(4) as captured:
        transition(obj=fresh, machine=TrainingJob.machine, event_model=TrainingJobEvent, to="QUEUED", reason="x",
                   system="test")
    assert not _team_lookups(captured.captured_queries)
    event = AuditEvent.objects.filter(action="trainingjob.transition", target_id=str(job.pk)).latest("id")
    assert (event.team_id, event.team_name, event.data["to"]) == (alpha["team"].pk, "alpha", "QUEUED")
    # an event recorded for an object whose team is loaded: its name is not read again (2 queries, 3 before)
    loaded = TrainingJob.objects.select_related("team").get(pk=job.pk)
    with django_assert_num_queries(2):
        record_event(obj=loaded, event_model=TrainingJobEvent, from_state="QUEUED", to_state="QUEUED", reason="y",
                     system="test")
    assert AuditEvent.objects.latest("id").team_name == "alpha"
    # and one whose team is not loaded still names it
    record_event(obj=TrainingJob.objects.get(pk=job.pk), event_model=TrainingJobEvent, from_state="QUEUED",
                 to_state="QUEUED", reason="z", system="test")
    assert AuditEvent.objects.latest("id").team_name == "alpha"


def test_a_deployment_create_locks_its_team_once(world, settings, django_assert_num_queries):
    """deployment_create locks the team row (its live name is checked under it), and submission_rate_check locked it
    again when a rate limit is set: one lock now (and the deployment's first event names its team without a query).
    """
    from inference.models import Deployment
    from inference.services import deployment_create

    settings.FLEETYARD_MAX_SUBMISSIONS_PER_TEAM_PER_MINUTE = 5
    alpha = world["alpha"]
    with django_assert_num_queries(22) as captured:
        deployment_create(actor=alpha["admin"], team=alpha["team"], name="chat", local_queue=alpha["queue"],
                          accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=450, sla_tpot_p95_ms=40,
                          model_uri="file:///models/lm")
    assert len(_team_lookups(captured.captured_queries)) == 1, _team_lookups(captured.captured_queries)
    assert Deployment.objects.filter(team=alpha["team"], name="chat").exists()
    assert set(AuditEvent.objects.filter(target_type="inference.deployment").values_list("team_name", flat=True)) \
        == {"alpha"}
