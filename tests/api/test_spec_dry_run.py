"""A dry run (`specs/apply?dry_run=1`) refuses what the apply would refuse, and writes and sends nothing. It checked
only the spec's fields and the plan, so it answered "fits now: yes" for specs the apply then refused (QA)."""
from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.common.models import TaskOutbox
from controlplane.tenancy.models import AuditEvent
from inference.models import Deployment
from jobs.models import TrainingJob

JOB = """\
name: dry
queue: default
resources:
  accelerators: H100:8
hyperparameters: {steps: 100}
"""
SERVICE = """\
kind: service
name: dry-svc
queue: default
service:
  checkpoint: job:99999
  sla: {ttft_p95: 500ms, tpot_p95: 50ms}
resources:
  accelerators: A100:1
"""


def apply(client, spec: str, dry_run: bool = True):
    with TestCase.captureOnCommitCallbacks(execute=True) as sent:
        response = client.post(f"/api/v1/specs/apply/?dry_run={int(dry_run)}", {"spec": spec}, format="json")
    assert not dry_run or not sent, sent
    return response


@pytest.mark.parametrize(("spec", "field", "says"), [
    (JOB + "dataset: dataset://nope@1\n", "dataset", "not found"),
    (JOB.replace("{steps: 100}", "{stepz: 100}"), "hyperparameters", "stepz"),
    (JOB.replace("{steps: 100}", "{steps: -5}"), "hyperparameters", "steps"),
    (SERVICE, "service.checkpoint", "99999"),
])
def test_a_dry_run_refuses_what_the_apply_refuses_and_writes_nothing(api, demo_cluster, spec, field, says):
    client = api("alpha", "member")
    audit = AuditEvent.objects.count()
    applied = apply(client, spec, dry_run=False)
    assert applied.status_code == 400, applied.json()
    dry = apply(client, spec)
    assert dry.status_code == 400, dry.json()
    assert dry.json()["spec"] == applied.json()["spec"]
    assert any(says in line for line in dry.json()["spec"]), dry.json()
    assert any(issue["field"].startswith(field.split(".")[0]) for issue in dry.json()["errors"]), dry.json()
    assert not TrainingJob.objects.exists() and not Deployment.objects.exists()
    assert AuditEvent.objects.count() == audit and not TaskOutbox.objects.exists()


def test_a_dry_run_of_a_good_spec_plans_and_writes_nothing(api, demo_cluster):
    client = api("alpha", "member")
    audit = AuditEvent.objects.count()
    dry = apply(client, JOB)
    assert dry.status_code == 200 and dry.json()["dry_run"] is True and dry.json()["object"] is None
    assert dry.json()["plan"]["chosen"]["accelerator_type"] == "nvidia-h100"
    assert not TrainingJob.objects.exists() and AuditEvent.objects.count() == audit
    assert not TaskOutbox.objects.exists()
    assert apply(client, JOB, dry_run=False).status_code == 201  # and the apply takes it
    assert TrainingJob.objects.count() == 1


def test_devices_of_a_gang_admitted_since_the_last_node_report_are_not_free(api, demo_cluster):
    """The nodes' free figures come from the cluster's last report (every 10 s); a gang admitted since has reserved
    nothing there yet. The plan counted its devices free and said "fits now" for a job the cycle then queued behind
    it."""
    from controlplane.cluster.models import Node
    from controlplane.quotas.models import ResourceQuota

    ResourceQuota.objects.filter(accelerator_type__slug="nvidia-h100").update(nominal_quota=32)  # quota is no limit
    client = api("alpha", "member")
    first = apply(client, JOB.replace("name: dry", "name: first").replace("resources:", "workers: 2\nresources:"),
                  dry_run=False)
    assert first.status_code == 201
    assert TrainingJob.objects.get(name="first").state in ("ADMITTED", "STARTING")  # its cycle ran on commit
    assert set(Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").values_list("free_devices", flat=True)) \
        == {8.0}  # as last reported: before the gang's run reserved them
    plan = apply(client, JOB).json()["plan"]
    h100 = plan["options"][0]
    assert (h100["free_units"], h100["placeable_members"], h100["fits_now"]) == (0.0, 0, False), h100
    assert h100["why_not"] == "not enough free nvidia-h100: 1 x 8 needed, 0 fit now"


def test_a_cpu_deployments_plan_counts_the_cores_a_replica_reserves(api, demo_cluster, tmp_path, settings):
    """The plan said "needs 1 CPU cores" (its device count) for replicas that reserve 0.25 core each (QA)."""
    from inference.workflows import CPUS_PER_REPLICA

    spec = ("kind: service\nname: cpu-svc\nqueue: default\nresources:\n  accelerators: cpu\nservice:\n"
            "  model: file:///m\n  replicas: {min: 2, max: 2}\n  sla: {ttft_p95: 500ms, tpot_p95: 50ms}\n")
    response = apply(api("alpha", "member"), spec)
    assert response.status_code == 200, response.json()
    [cpu] = response.json()["plan"]["options"]
    assert cpu["accelerator_type"] == "cpu" and cpu["units"] == 2 * CPUS_PER_REPLICA, cpu


@pytest.mark.parametrize(("query", "field"), [
    ("dryrun=1", "dryrun"),
    ("dry-run=1", "dry-run"),
    ("dry_run=1&dry_run=0", "dry_run"),
    ("dry_run=0&dry_run=1", "dry_run"),
])
def test_a_mistyped_or_repeated_dry_run_applies_nothing(api, demo_cluster, query, field):
    """Found by QA: unknown query parameters were ignored and a repeated dry_run took its last value, so
    `?dryrun=1` and `?dry_run=1&dry_run=0` created the job. Now each is a 400 naming the parameter."""
    client = api("alpha", "member")
    audit = AuditEvent.objects.count()
    with TestCase.captureOnCommitCallbacks(execute=True) as sent:
        response = client.post(f"/api/v1/specs/apply/?{query}", {"spec": JOB}, format="json")
    assert response.status_code == 400, response.json()
    assert field in response.json(), response.json()
    assert not TrainingJob.objects.exists() and AuditEvent.objects.count() == audit and not sent
    assert client.post("/api/v1/specs/apply/?dry_run=true&format=json", {"spec": JOB},
                       format="json").status_code == 200
