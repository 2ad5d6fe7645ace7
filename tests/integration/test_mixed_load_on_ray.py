"""Mixed load on the real local Ray cluster (issue 3): a training job borrows the H100 node a deployment reserved
but does not use; when the deployment needs a second replica, the scheduling cycle asks the job to checkpoint and
stop, its placement group goes, and Ray Serve places the replica on the node it gave back.

The control plane's tasks run in this process (Celery eager); Serve's autoscaler wanting a second replica is
what `deploy_service` with `replicas_min=2` (same revision, so no rollout) tells Serve here.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from jobs.runtime.lm import write_random_model_dir

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]

SHAPE = {"context": 256, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}


@pytest.fixture
def platform(ray_backend, pools_from_ray, monkeypatch):
    from inference import tasks as inference_tasks
    from jobs import tasks as job_tasks

    for module in (job_tasks, inference_tasks):
        monkeypatch.setattr(module, "get_compute_backend", lambda: ray_backend)
    yield ray_backend
    ray_backend.shutdown_serving()  # nothing may outlive a test
    for handle in ray_backend.list_training_handles():
        ray_backend.stop_training(handle, checkpoint=False)
        ray_backend.release_training(handle)


def tick(backend):
    """One beat of the control plane: observe nodes and deployments, schedule, sync training runs."""
    from controlplane.cluster.services import nodes_sync
    from inference.tasks import sync_deployments
    from jobs.tasks import run_scheduling_cycle, sync_training_jobs

    nodes_sync(observed=backend.list_nodes())
    sync_deployments()
    run_scheduling_cycle()
    sync_training_jobs()


def wait_for(backend, fetch, until, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        tick(backend)
        obj = fetch()
        if until(obj):
            return obj
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {obj.state} {obj.state_reason}"
        time.sleep(0.5)


def test_a_borrowing_job_checkpoints_and_gives_its_node_back_to_a_scaling_deployment(api, platform, tmp_path):
    from inference.models import Deployment
    from inference.workflows import autoscaling_for, build_spec
    from jobs.models import TrainingJob

    client = api("alpha", "member")
    model = write_random_model_dir(tmp_path / "model", SHAPE, seed=3)
    response = client.post("/api/v1/deployments/", {
        "name": "chat", "queue": "default", "model_uri": str(model), "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 2, "sla": {"ttft_p95_ms": 5000,
                                                                                "tpot_p95_ms": 1000},
        "engine": {"slots": 2, "block_size": 8}}, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    deployment = wait_for(platform, lambda: Deployment.objects.get(pk=pk),
                          lambda d: d.state == "SERVING" and d.observed.get("node_names"), 120, "the deployment")
    [serving_node] = deployment.observed["node_names"]

    response = client.post("/api/v1/training-jobs/", {
        "name": "borrower", "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 1,
        "workers_max": 1, "devices_per_worker": 8, "checkpoint": {"interval_steps": 1000, "keep_last": 2},
        "hyperparameters": {"steps": 100000, "step_sleep_s": 0.05}}, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    job = wait_for(platform, lambda: TrainingJob.objects.get(pk=job_id),
                   lambda j: j.state == "RUNNING" and j.current_step >= 5, 120, "the job to train")
    assert job.observed_nodes and job.observed_nodes[0] != serving_node  # on the node the deployment reserved
    admitted = job.events.filter(to_state="ADMITTED").last()
    assert "on loan: training now uses 8 nvidia-h100" in admitted.reason

    asked = time.monotonic()
    spec = build_spec(deployment, autoscaling_for(deployment))
    platform.deploy_service(dataclasses.replace(spec, replicas_min=2))  # the deployment now wants 2 replicas
    deployment = wait_for(platform, lambda: Deployment.objects.get(pk=pk), lambda d: d.replicas_ready == 2, 180,
                          "the second replica")
    placed = time.monotonic() - asked
    job = TrainingJob.objects.get(pk=job_id)
    assert job.state in ("PREEMPTED", "QUEUED"), job.state
    assert sorted(deployment.observed["node_names"]) == ["h100-pool-0", "h100-pool-1"]
    preempted = job.events.filter(to_state="PREEMPTED").last()
    # the running replica and the borrower fill the shared queue's quota: the borrower gives the quota back (and with
    # it the node the second replica lands on)
    assert preempted and f"gives back nvidia-h100 quota deployment {pk} needs" in preempted.reason, preempted.reason
    assert job.last_checkpoint_step is not None and job.last_checkpoint_step >= 5  # it checkpointed before stopping
    job = wait_for(platform, lambda: TrainingJob.objects.get(pk=job_id), lambda j: j.state == "QUEUED", 60,
                   "the requeue")
    # both replicas (16 chips) use the shared queue's whole nominal quota: the job waits for quota (and devices)
    assert "shared needs to borrow 8 nvidia-h100" in job.state_reason
    print(f"\nmixed load on Ray: the second replica ran {placed:.1f} s after the deployment asked for it; the job "
          f"checkpointed at step {job.last_checkpoint_step} and waits in the queue")
    assert client.post(f"/api/v1/training-jobs/{job_id}/cancel/").status_code in (200, 202)
    assert client.delete(f"/api/v1/deployments/{pk}/").status_code == 204


def test_a_new_deployment_gets_a_node_back_from_training_that_fills_the_pool(api, platform, tmp_path):
    """Two jobs fill the H100 pool (2 nodes x 8 SIMULATED chips) in the team's queue; a one-replica deployment fits
    the queue's quota once that preemptible training gives its share back, but no node has room: it waits for
    capacity, the cycle asks one job to checkpoint and stop, and the reconciler deploys onto the node it gave back."""
    from inference.models import Deployment
    from jobs.models import TrainingJob

    client = api("alpha", "member")
    jobs = []
    for name in ("first", "second"):
        response = client.post("/api/v1/training-jobs/", {
            "name": name, "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 1,
            "workers_max": 1, "devices_per_worker": 8, "checkpoint": {"interval_steps": 1000, "keep_last": 2},
            "hyperparameters": {"steps": 100000, "step_sleep_s": 0.05}}, format="json")
        assert response.status_code == 201, response.json()
        jobs.append(response.json()["id"])
    for job_id in jobs:
        wait_for(platform, lambda job_id=job_id: TrainingJob.objects.get(pk=job_id),
                 lambda j: j.state == "RUNNING" and j.current_step >= 3, 120, "the jobs to train")

    model = write_random_model_dir(tmp_path / "model", SHAPE, seed=4)
    asked = time.monotonic()
    response = client.post("/api/v1/deployments/", {
        "name": "late", "queue": "default", "model_uri": str(model), "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1, "sla": {"ttft_p95_ms": 5000,
                                                                                "tpot_p95_ms": 1000},
        "engine": {"slots": 2, "block_size": 8}}, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    assert Deployment.objects.get(pk=pk).state_reason.startswith("waiting for capacity")
    deployment = wait_for(platform, lambda: Deployment.objects.get(pk=pk),
                          lambda d: d.state == "SERVING" and d.replicas_ready == 1, 180, "the deployment to serve")
    assert deployment.accelerator_type == "nvidia-h100"
    served = time.monotonic() - asked
    states = sorted(TrainingJob.objects.get(pk=job_id).state for job_id in jobs)
    assert states[0] in ("PREEMPTED", "QUEUED") and states[1] == "RUNNING", states
    stopped = next(j for j in TrainingJob.objects.filter(pk__in=jobs) if j.state != "RUNNING")
    assert f"deployment {pk}" in stopped.events.filter(to_state="PREEMPTED").last().reason
    assert stopped.last_checkpoint_step is not None and stopped.last_checkpoint_step >= 3
    print(f"\nmixed load on Ray: a new deployment served {served:.1f} s after it was created, on the node job "
          f"{stopped.pk} gave back (checkpointed at step {stopped.last_checkpoint_step})")
    for job_id in jobs:
        assert client.post(f"/api/v1/training-jobs/{job_id}/cancel/").status_code in (200, 202)
    assert client.delete(f"/api/v1/deployments/{pk}/").status_code == 204


def test_a_deployment_borrowing_a_lenders_quota_scales_in_on_serve_and_the_lenders_job_runs(
        api, platform, tmp_path, world):
    """shared (8 H100) runs a 1-2 replica deployment (8 SIMULATED chips each) at 2 replicas, the second on quota
    borrowed from `lender` (8 H100, same cohort). When lender's job waits for its nominal quota, the cycle lowers the
    deployment's replica limit to 1, the sync caps Serve there, Serve stops a replica, and the job runs."""
    from controlplane.quotas.models import ResourceQuota
    from controlplane.quotas.services import cluster_queue_create, local_queue_create
    from inference.models import Deployment
    from inference.workflows import autoscaling_for, build_spec
    from jobs.models import TrainingJob

    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=8)
    lender = cluster_queue_create(actor=world["ops"], name="lender", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    local_queue_create(actor=world["beta"]["admin"], team=world["beta"]["team"], name="lend", cluster_queue=lender)
    alpha = api("alpha", "member")
    model = write_random_model_dir(tmp_path / "model", SHAPE, seed=5)
    response = alpha.post("/api/v1/deployments/", {
        "name": "chat", "queue": "default", "model_uri": str(model), "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 2, "sla": {"ttft_p95_ms": 5000,
                                                                                "tpot_p95_ms": 1000},
        "engine": {"slots": 2, "block_size": 8}}, format="json")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    deployment = wait_for(platform, lambda: Deployment.objects.get(pk=pk),
                          lambda d: d.state == "SERVING" and d.replicas_ready == 1, 120, "the deployment")
    spec = build_spec(deployment, autoscaling_for(deployment))
    platform.deploy_service(dataclasses.replace(spec, replicas_min=2))  # Serve's autoscaler wants 2 replicas
    deployment = wait_for(platform, lambda: Deployment.objects.get(pk=pk), lambda d: d.replicas_ready == 2, 120,
                          "the second replica")
    assert deployment.replicas_limit is None  # lender's 8 are idle: the second replica borrows them

    beta = api("beta", "member")
    asked = time.monotonic()
    response = beta.post("/api/v1/training-jobs/", {
        "name": "lenders-job", "queue": "lend", "accelerator_types": ["nvidia-h100"], "workers_min": 1,
        "workers_max": 1, "devices_per_worker": 8, "checkpoint": {"interval_steps": 1000, "keep_last": 2},
        "hyperparameters": {"steps": 100000, "step_sleep_s": 0.05}}, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    job = wait_for(platform, lambda: TrainingJob.objects.get(pk=job_id),
                   lambda j: j.state == "RUNNING" and j.current_step >= 1, 180, "the lender's job to run")
    ran = time.monotonic() - asked
    deployment = Deployment.objects.get(pk=pk)
    assert deployment.replicas_limit == 1 and deployment.replicas_ready == 1
    assert any("gives back borrowed quota that waiting work of lender needs" in e.reason
               for e in deployment.events.all())
    assert deployment.autoscaling["max_replicas"] == 1
    print(f"\nmixed load on Ray: the lender's job ran {ran:.1f} s after it was submitted, once Serve had stopped the "
          f"replica on borrowed quota (job on {job.observed_nodes})")
    assert beta.post(f"/api/v1/training-jobs/{job_id}/cancel/").status_code in (200, 202)
    assert alpha.delete(f"/api/v1/deployments/{pk}/").status_code == 204


def test_two_workers_of_four_devices_share_a_demo_node_and_run(api, platform):
    """Each 8-chip SIMULATED node has one core: unset, a 4-device worker reserves half of it, so the gang placed on
    one node can be reserved (at 1 core each it waited for placement for ever)."""
    from jobs.models import TrainingJob

    client = api("alpha", "member")
    response = client.post("/api/v1/training-jobs/", {
        "name": "packed", "queue": "default", "accelerator_types": ["nvidia-h100"], "workers_min": 2,
        "workers_max": 2, "devices_per_worker": 4, "checkpoint": {"interval_steps": 1000, "keep_last": 2},
        "hyperparameters": {"steps": 100000, "step_sleep_s": 0.05}}, format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    job = wait_for(platform, lambda: TrainingJob.objects.get(pk=job_id),
                   lambda j: j.state == "RUNNING" and j.current_step >= 2, 120, "the packed gang to train")
    assert job.cpus_per_worker == 0.5
    assert len({worker["node"] for worker in job.placement}) == 1 and len(job.placement) == 2
    assert client.post(f"/api/v1/training-jobs/{job_id}/cancel/").status_code in (200, 202)
