"""Issue 8, Q2: a preemptor keeps what its victims give back. No third workload takes the quota or the devices
while the victims checkpoint and stop, each victim is preempted exactly once, and the preemptor starts on
the devices it was promised as soon as they are free.

The case that used to fail is a reclaim inside a cohort (found by reading the Q1 soak's churn: most of its
preemptions took back admissions that had not started). Team beta's queue lends nothing and borrows
everything; beta's job V runs on alpha's idle quota and beta's job W waits behind it. Alpha's job P reclaims
the quota and V is preempted. Before the fix P only waited, with nothing recorded: in the next cycle W (older
than P) took the freed quota and devices, P then reclaimed them from W, and so on."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from controlplane.quotas.services import cluster_queue_create, local_queue_create, priority_class_create
from jobs import tasks, workflows
from jobs.admission import run_cycle
from jobs.models import TrainingJob, TrainingJobEvent
from jobs.selectors import quota_usage
from tests.conftest import JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    fake.steps_per_observe = 10
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr("jobs.api.views.get_compute_backend", lambda: fake)
    return fake


@pytest.fixture
def cohort(world):
    """cq-alpha owns all 16 H100 of the cluster; cq-beta owns none and may borrow them all."""
    ops = world["ops"]
    alpha = cluster_queue_create(actor=ops, name="cq-alpha", cohort="hold", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 16}])
    beta = cluster_queue_create(actor=ops, name="cq-beta", cohort="hold", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 0, "borrowing_limit": 16}])
    for team, cq in (("alpha", alpha), ("beta", beta)):
        local_queue_create(actor=world[team]["admin"], team=world[team]["team"], name="hold", cluster_queue=cq)
    return {"alpha": alpha, "beta": beta}


def submit(client, name, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "name": name, "queue": "hold", "accelerator_types": ["nvidia-h100"], "workers_min": 2,
            "workers_max": 2, "hyperparameters": {"steps": 200}, "checkpoint": {"interval_steps": 25}, **overrides}
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def sync(job, backend) -> TrainingJob:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_sync(job_id=job.pk, backend=backend)
    return TrainingJob.objects.get(pk=job.pk)


def cycle() -> None:
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()


def fresh(*jobs) -> list[TrainingJob]:
    return [TrainingJob.objects.get(pk=job.pk) for job in jobs]


def held_by(queue) -> dict:
    return {key: value for key, value in quota_usage().items() if key[0] == queue.name}


def preemptions_of(job) -> int:
    return TrainingJobEvent.objects.filter(subject=job, reason__startswith="preempted for").count()


def test_no_third_workload_takes_the_quota_while_the_preemptor_waits(api, backend, cohort):
    beta, alpha = api("beta", "member"), api("alpha", "member")
    victim = sync(submit(beta, "victim"), backend)
    assert victim.state == "RUNNING" and victim.admitted_accelerator_type == "nvidia-h100"
    third = submit(beta, "third")  # older than the preemptor, and it fits as soon as the victim's devices free
    assert third.state == "QUEUED"
    preemptor = submit(alpha, "preemptor")
    victim, third, preemptor = fresh(victim, third, preemptor)
    assert victim.state == "PREEMPTED" and "borrowed quota reclaimed" in victim.state_reason
    # The preemptor is admitted at once on the victim's devices and holds them; it is not started yet.
    assert preemptor.state == "ADMITTED" and preemptor.waits_for == [victim.pk]
    assert preemptor.compute_handle == "" and backend.list_training_handles() == [victim.compute_handle]
    assert sorted(w["node"] for w in preemptor.placement) == ["h100-pool-0", "h100-pool-1"]
    held = held_by(cohort["alpha"])

    for _ in range(5):  # cycles while the victim checkpoints: nothing moves
        cycle()
        third, preemptor = fresh(third, preemptor)
        assert third.state == "QUEUED" and preemptor.state == "ADMITTED" and preemptor.compute_handle == ""
        assert held_by(cohort["alpha"]) == held and held_by(cohort["beta"]) == {}

    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()  # the victim's run reports it checkpointed and stopped
    victim, third, preemptor = fresh(victim, third, preemptor)
    assert victim.state == "QUEUED" and victim.compute_handle == ""
    assert preemptor.state == "STARTING" and preemptor.waits_for == []
    assert backend.list_training_handles() == [preemptor.compute_handle]
    assert third.state == "QUEUED"
    for _ in range(3):
        cycle()
    victim, third, preemptor = fresh(victim, third, preemptor)
    assert (victim.state, third.state) == ("QUEUED", "QUEUED")
    assert preemptions_of(victim) == 1 and preemptions_of(third) == 0  # exactly once; the third never admitted
    assert not TrainingJobEvent.objects.filter(subject=third, to_state="ADMITTED").exists()
    print(f"\nQ2: victim preempted {preemptions_of(victim)} time(s); third workload admitted "
          f"{TrainingJobEvent.objects.filter(subject=third, to_state='ADMITTED').count()} time(s) during 8 cycles; "
          f"preemptor started on {sorted(w['node'] for w in preemptor.placement)}")


def test_a_waiting_preemptor_that_is_cancelled_gives_the_held_quota_back(api, backend, cohort):
    beta, alpha = api("beta", "member"), api("alpha", "member")
    victim = sync(submit(beta, "victim"), backend)
    preemptor = submit(alpha, "preemptor")
    assert fresh(preemptor)[0].state == "ADMITTED"
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert alpha.post(f"/api/v1/training-jobs/{preemptor.pk}/cancel/").status_code == 200
    assert held_by(cohort["alpha"]) == {}
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()
    cycle()
    victim, preemptor = fresh(victim, preemptor)
    assert preemptor.state == "CANCELLED" and preemptor.compute_handle == ""
    assert victim.state == "STARTING" and preemptions_of(victim) == 1  # back on the devices nobody else wants


def test_a_waiting_preemptor_preempted_in_turn_releases_its_hold_and_never_launches(api, backend, cohort, world):
    priority_class_create(actor=world["ops"], name="urgent", value=10_000)
    beta, alpha = api("beta", "member"), api("alpha", "member")
    victim = sync(submit(beta, "victim"), backend)
    preemptor = submit(alpha, "preemptor")
    urgent = submit(alpha, "urgent", priority="urgent")
    victim, preemptor, urgent = fresh(victim, preemptor, urgent)
    # the waiting preemptor had not started: it gives its admission back at once and the urgent job holds it
    assert preemptor.state == "QUEUED" and preemptor.waits_for == [] and preemptor.placement == []
    assert urgent.state == "ADMITTED" and urgent.compute_handle == "" and urgent.waits_for == [victim.pk]
    assert victim.state == "PREEMPTED" and preemptions_of(victim) == 1
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()
    victim, preemptor, urgent = fresh(victim, preemptor, urgent)
    assert urgent.state == "STARTING" and preemptor.state == "QUEUED" and preemptor.compute_handle == ""
    assert backend.list_training_handles() == [urgent.compute_handle]
