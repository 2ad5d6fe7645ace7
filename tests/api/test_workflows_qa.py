"""QA of the lifecycle tasks and reconcilers (jobs/tasks.py, jobs/workflows.py, inference/tasks.py,
inference/workflows.py) against the in-memory backend: a task delivered twice or late does its work once, a
backend error does not leave a job or deployment in a live state for good, and the reconcilers repair what a
lost message would have done."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from jobs import tasks, workflows
from jobs.admission import run_cycle
from jobs.models import TrainingJob
from tests.api.test_admin import operator_client  # noqa: F401 - fixture: a superuser's admin session
from tests.conftest import JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    fake.steps_per_observe = 40
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr("jobs.api.views.get_compute_backend", lambda: fake)
    return fake


@pytest.fixture
def urgent(world):
    from controlplane.quotas.services import priority_class_create

    return priority_class_create(actor=world["ops"], name="urgent", value=1000)


def submit(client, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 2, "workers_max": 2,
            "hyperparameters": {"steps": 1000}, "checkpoint": {"interval_steps": 25}, **overrides}
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def sync(job, backend) -> TrainingJob:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_sync(job_id=job.pk, backend=backend)
    return TrainingJob.objects.get(pk=job.pk)


def _preempt(api, backend, monkeypatch):
    """A running job preempted by an urgent one; the stop messages are kept (not run) and returned."""
    stops = []
    monkeypatch.setattr(tasks.stop_training_run, "apply_async",
                        lambda args=(), kwargs=None, **_: stops.append((tuple(args), dict(kwargs or {}))))
    client = api("alpha", "member")
    victim = sync(submit(client, name="low"), backend)
    assert victim.state == "RUNNING"
    preemptor = submit(client, name="high", priority="urgent")
    victim.refresh_from_db()
    assert victim.state == "PREEMPTED" and stops == [((victim.pk,), {"checkpoint": True, "reason": "preempted"})]
    return client, victim, preemptor, stops


def test_a_preemption_stop_delivered_again_after_the_job_relaunched_leaves_the_new_run_alone(
        api, backend, urgent, monkeypatch):
    """The stop names the job, not the run: a second delivery (acks_late redelivery, an outbox resend) that came after
    the job was requeued, admitted and launched again stopped its new attempt, which was then relaunched from its
    checkpoint as a vanished run."""
    client, victim, preemptor, stops = _preempt(api, backend, monkeypatch)
    (args, kwargs), = stops
    tasks.stop_training_run(*args, **kwargs)
    victim = sync(victim, backend)
    assert victim.state == "QUEUED"
    with TestCase.captureOnCommitCallbacks(execute=True):  # the preemptor ends; the victim is admitted again
        client.post(f"/api/v1/training-jobs/{preemptor.pk}/cancel/")
        run_cycle()
    assert stops[-1] == ((preemptor.pk,), {"checkpoint": False, "reason": "cancelled"})
    with TestCase.captureOnCommitCallbacks(execute=True):  # and launched once the cancelled run has stopped
        tasks.stop_training_run(*stops[-1][0], **stops[-1][1])
    victim = sync(TrainingJob.objects.get(pk=victim.pk), backend)
    assert victim.state == "RUNNING" and victim.compute_handle == f"fy-train-{victim.pk}-a2"
    tasks.stop_training_run(*args, **kwargs)  # the same message, delivered again
    assert backend.runs[victim.compute_handle].state == "running"
    victim = sync(victim, backend)
    assert victim.state == "RUNNING" and victim.runtime_state == "running"
    assert not victim.events.filter(reason__contains="not found").exists()


def test_a_preemption_stop_delivered_twice_starts_the_pause_once(api, backend, urgent, monkeypatch):
    """The second delivery moved the pause's start to its own time: the time in between counted as neither."""
    _, victim, _, stops = _preempt(api, backend, monkeypatch)
    (args, kwargs), = stops
    tasks.stop_training_run(*args, **kwargs)
    first = TrainingJob.objects.get(pk=victim.pk).goodput["paused_since"]
    tasks.stop_training_run(*args, **kwargs)
    assert TrainingJob.objects.get(pk=victim.pk).goodput["paused_since"] == first


def test_a_preempted_run_whose_stop_was_lost_is_stopped_by_the_sync(api, backend, urgent, monkeypatch):
    """The stop message was lost (or its retries ran out while the backend was unreachable): the run kept training,
    the job stayed PREEMPTED and the preemptor, admitted onto its devices, waited for good; the sync never asked again.
    """
    from datetime import timedelta

    from django.utils import timezone

    _, victim, preemptor, stops = _preempt(api, backend, monkeypatch)
    stops.clear()  # never delivered
    victim = sync(victim, backend)
    assert victim.state == "PREEMPTED" and backend.runs[victim.compute_handle].state == "running"  # within the grace
    TrainingJob.objects.filter(pk=victim.pk).update(
        state_changed_at=timezone.now() - timedelta(minutes=5))
    asked = []
    with monkeypatch.context() as slow:  # it takes two passes to stop
        slow.setattr(backend, "stop_training", lambda handle, **kwargs: asked.append((handle, kwargs)))
        for _ in range(2):
            victim = sync(victim, backend)
    assert asked == [(victim.compute_handle, {"checkpoint": True, "reason": "preempted"})] * 2
    assert victim.events.filter(reason__contains="asking it again to checkpoint and stop").count() == 1  # said once
    victim = sync(victim, backend)
    victim = sync(victim, backend)  # it stopped: requeued
    assert victim.state == "QUEUED" and victim.compute_handle == ""
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert TrainingJob.objects.get(pk=preemptor.pk).state == "STARTING"


# ------------------------------------------------------------------------------------------ deployments

@pytest.fixture
def serving_backend(monkeypatch, settings, tmp_path, demo_cluster):
    from inference import tasks as inference_tasks

    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(inference_tasks, "get_compute_backend", lambda: fake)
    return fake


def _create_deployment(client, model_dir):
    from tests.conftest import DEPLOYMENT_BODY

    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/deployments/", {**DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}"},
                               format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _sync_deployments() -> dict:
    from inference import tasks as inference_tasks

    with TestCase.captureOnCommitCallbacks(execute=True):
        return inference_tasks.sync_deployments()


def test_a_deployment_the_backend_refuses_to_deploy_fails_with_the_reason(api, serving_backend, model_dir,
                                                                         monkeypatch):
    """Ray Serve refused the application on every try: the deployment stayed DEPLOYING for good, holding its quota and
    devices, with a "not found; deploying again" event every pass and the backend's reason nowhere."""
    from inference import tasks as inference_tasks
    from inference.models import Deployment

    monkeypatch.setattr(inference_tasks.deploy_deployment, "apply_async", lambda *a, **k: None)  # the sync deploys
    deployment_id = _create_deployment(api("alpha", "member"), model_dir)

    def refuse(spec):
        raise RuntimeError("the application's config is invalid")

    monkeypatch.setattr(serving_backend, "deploy_service", refuse)
    for _ in range(8):
        _sync_deployments()
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "FAILED", (deployment.state, deployment.state_reason)
    assert "RuntimeError: the application's config is invalid" in deployment.state_reason
    assert deployment.events.filter(data__deploy_failed=True).count() == 5
    assert deployment.events.filter(reason__contains="not found").count() <= 1
    assert deployment.replicas_limit is None and deployment.capacity_held == []
    assert serving_backend.list_service_handles() == []


def test_a_serving_deployment_whose_redeploy_fails_keeps_trying_and_serves_again(api, serving_backend, model_dir,
                                                                               monkeypatch):
    """Only a deployment that never served fails: a serving one whose service vanished is DEGRADED and deployed again
    each pass (one event a pass, with the reason) until the backend takes it, then SERVING again."""
    from inference.models import Deployment

    deployment_id = _create_deployment(api("alpha", "member"), model_dir)
    assert Deployment.objects.get(pk=deployment_id).state == "SERVING"
    serving_backend.delete_service(f"fy-serve-{deployment_id}")
    with monkeypatch.context() as down:
        down.setattr(serving_backend, "deploy_service", lambda spec: (_ for _ in ()).throw(ConnectionError("down")))
        for _ in range(7):
            _sync_deployments()
    deployment = Deployment.objects.get(pk=deployment_id)
    # it serves nothing meanwhile: DEGRADED with the reason (it stayed SERVING), SERVING again once deployed
    assert deployment.state == "DEGRADED" and "deploying it again failed (ConnectionError: down)" in \
        deployment.state_reason, deployment.state_reason
    assert deployment.events.filter(data__deploy_failed=True).count() == 7
    assert deployment.events.filter(reason__contains="not found").count() == 1
    _sync_deployments()
    _sync_deployments()
    assert serving_backend.list_service_handles() == [f"fy-serve-{deployment_id}"]
    assert Deployment.objects.get(pk=deployment_id).state == "SERVING"


# ------------------------------------------------------------------------------------------ odd data

def test_a_placement_edited_in_the_admin_does_not_stop_every_scheduling_cycle(api, backend,
                                                                            operator_client):  # noqa: F811
    """The admin's job page edited the scheduler's and the reconciler's fields: a placement saved there without a
    worker's devices ([{"node": ...}]) made every scheduling cycle raise KeyError, so no job of any team was admitted
    again (and the training sync, which runs a cycle after queueing a stale job, failed with it). Like a node's observed
    fields, they are read-only there."""
    from tests.api.test_admin import _post_change

    client = api("alpha", "member")
    running = sync(submit(client, name="running"), backend)
    placement = running.placement
    _post_change(operator_client, TrainingJob, running.pk, placement='[{"node": "h100-pool-0"}]',
                 observed_nodes='["nowhere"]', waits_for="[1, 2]", admitted_accelerator_type="cpu")
    running.refresh_from_db()
    assert running.placement == placement and running.observed_nodes == ["h100-pool-0", "h100-pool-1"]
    assert running.waits_for == [] and running.admitted_accelerator_type == "nvidia-h100"
    other = submit(client, name="other", accelerator_types=["nvidia-a100"], workers_min=1, workers_max=1)
    assert other.state == "STARTING", (other.state, other.state_reason)


def test_one_failing_sweep_does_not_skip_the_rest_of_the_training_sync(api, backend, monkeypatch):
    """QA (2026-11-29): the PENDING sweep's inline scheduling cycle raising skipped the launch sweep and the orphan
    runs for that pass (and a broker down for one launch skipped the launches after it)."""
    from datetime import timedelta

    from django.utils import timezone

    first, second = submit(api("alpha", "member")), submit(api("alpha", "member"), name="second")
    long_ago = timezone.now() - timedelta(hours=1)
    TrainingJob.objects.filter(pk=first.pk).update(state="PENDING", state_changed_at=long_ago)
    TrainingJob.objects.filter(pk=second.pk).update(state="ADMITTED", state_changed_at=long_ago)

    def cycle_fails():
        raise RuntimeError("the cycle failed")

    launched, orphan_passes = [], []
    monkeypatch.setattr(tasks, "run_scheduling_cycle", cycle_fails)
    monkeypatch.setattr(tasks.launch_training_job, "delay", lambda job_id: launched.append(job_id))
    monkeypatch.setattr(workflows, "reconcile_orphan_runs", lambda backend: orphan_passes.append(1) or [])
    outcome = tasks.sync_training_jobs()
    assert launched == [second.pk] and orphan_passes == [1], (launched, orphan_passes)
    assert outcome["failed"] == 1 and outcome["pending_queued"] == 1, outcome


def test_one_orphan_run_the_backend_cannot_observe_does_not_keep_the_others(backend, monkeypatch):
    from controlplane.compute.base import RUN_TERMINAL_STATES, TrainingReport

    released = []
    monkeypatch.setattr(backend, "list_training_handles", lambda: ["broken", "done"])

    def observe(handle, since):
        if handle == "broken":
            raise ConnectionError("the backend did not answer")
        return TrainingReport(handle=handle, state=sorted(RUN_TERMINAL_STATES)[0])

    monkeypatch.setattr(backend, "observe_training", observe)
    monkeypatch.setattr(backend, "release_training", released.append)
    assert workflows.reconcile_orphan_runs(backend=backend) == ["broken", "done"]
    assert released == ["done"]


def test_one_orphan_service_the_backend_cannot_delete_does_not_keep_the_others(backend, monkeypatch):
    from inference import workflows as serving

    broken, gone = f"{serving.SERVICE_PREFIX}broken", f"{serving.SERVICE_PREFIX}gone"
    deleted = []

    def delete(handle):
        if handle == broken:
            raise ConnectionError("the backend did not answer")
        deleted.append(handle)

    monkeypatch.setattr(backend, "list_service_handles", lambda: [broken, gone])
    monkeypatch.setattr(backend, "delete_service", delete)
    assert serving.reconcile_orphan_services(backend=backend) == [broken, gone]
    assert deleted == [gone]
