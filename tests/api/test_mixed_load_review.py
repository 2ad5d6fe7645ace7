"""Review of mixed load in the platform (commit 780eb27: deployments PENDING for capacity join the cycle).
In-memory backend, as tests/api/test_mixed_load.py."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from controlplane.quotas.models import PriorityClass, ResourceQuota
from inference import tasks as inference_tasks
from inference.models import Deployment
from jobs.admission import load_serving, run_cycle
from jobs.models import TrainingJob
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    from jobs.tasks import launch_training_job, stop_training_run

    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(inference_tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)
    monkeypatch.setattr(stop_training_run, "apply_async", lambda *args, **kwargs: None)
    return fake


def post(client, url, body):
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(url, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def job(client, name: str) -> int:
    return post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-h100"]})


def test_a_pending_deployment_that_cannot_get_all_its_replicas_makes_nobody_give_anything_back(
        api, backend, model_dir, world):
    """The H100 pool is two nodes of 8: one runs preemptible training, the other training that is never preempted.
    A new deployment needs 2 replicas of 8 (replicas_min 2) to deploy, so it cannot deploy while that job runs. Its
    first replica still had the preemptible job give its node back (and held the node every cycle after, so the job
    could not come back), for a deployment that stays PENDING."""
    from controlplane.cluster.models import Node

    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=64)  # quota is no limit here: the devices are
    client = api("alpha", "member")
    loser, keeper = job(client, "preemptible"), job(client, "never-preempted")
    never = PriorityClass.objects.create(name="never-preempted", value=1000, preemptible=False)
    TrainingJob.objects.filter(pk=keeper).update(state="RUNNING", compute_handle="fy-train-k", priority_class=never)
    TrainingJob.objects.filter(pk=loser).update(state="RUNNING", compute_handle="fy-train-l")
    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(free_devices=0)  # the jobs hold them
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 2, "replicas_max": 2})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "PENDING" and deployment.state_reason.startswith("waiting for capacity")
    assert [d.replicas_wanted for d in load_serving()] == [2]

    with TestCase.captureOnCommitCallbacks(execute=True):
        result = run_cycle()
    assert not result.preempted and not result.shrunk, result.preempted
    assert TrainingJob.objects.get(pk=loser).state == "RUNNING"


def a100_job(client, name: str) -> int:
    return post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-a100"]})


def test_a_pending_deployment_gets_capacity_back_on_the_type_it_can_run_on(api, backend, model_dir):
    """The deployment accepts H100 then A100. Every H100 node is cordoned; preemptible training fills the A100
    pool. It waits for capacity, and only the A100 training could give it some. The demand went to H100 (its quota
    passes first), where no node can take a replica, so no training gave anything back: starved by training."""
    from controlplane.cluster.models import Node

    client = api("alpha", "member")
    jobs = [a100_job(client, "first"), a100_job(client, "second")]
    assert {TrainingJob.objects.get(pk=i).state for i in jobs} == {"ADMITTED"}
    Node.objects.filter(pool__accelerator_type__slug="nvidia-a100").update(free_devices=0)  # the jobs hold them
    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(cordoned=True)
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100", "nvidia-a100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "PENDING" and deployment.state_reason.startswith("waiting for capacity"), \
        deployment.state_reason
    assert [d.accelerator_type for d in load_serving()] == ["nvidia-a100"]  # not nvidia-h100: nowhere to run
    with TestCase.captureOnCommitCallbacks(execute=True):
        result = run_cycle()
    assert len(result.preempted) == 1 and result.preempted[0].workload_id in {str(i) for i in jobs}, result
