"""A worker re-placed off a node never lands on the devices a deployment's replica is being deployed to, and a run
that cannot reserve the nodes of its placement is placed again rather than sent the same nodes for good (QA on Ray:
an elastic job shrunk for a new deployment moved its last worker off a cordoned node onto the node the replica was
being deployed to; both ran there, and the job stayed RECOVERING, asking for that node every 30 s, even once the
cordoned node was uncordoned). In-memory compute backend."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from inference import tasks as inference_tasks
from inference import workflows as serving
from inference.models import Deployment
from jobs import workflows
from jobs.admission import load_serving, run_cycle
from jobs.models import TrainingJob
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY

H100 = ("h100-pool-0", "h100-pool-1")


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    from jobs.tasks import launch_training_job, stop_training_run

    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(inference_tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)
    monkeypatch.setattr(stop_training_run, "apply_async", lambda *args, **kwargs: None)
    fake.placed, fake.unreservable = [], set()  # what place_training was sent; nodes a run cannot reserve
    real_place = fake.place_training

    def place_training(handle, nodes, reason=""):
        fake.placed.append(list(nodes))
        if fake.unreservable.intersection(nodes):
            _cannot_reserve(fake.runs[handle], list(nodes))
        else:
            real_place(handle, nodes, reason)

    monkeypatch.setattr(fake, "place_training", place_training)
    return fake


def _cannot_reserve(run, nodes: list[str]) -> None:
    run.nodes = list(nodes)
    reason = f"nodes {', '.join(nodes)} could not be reserved within 30.0 s"
    run.set_state("awaiting_placement", reason)
    run.event(type="placement_needed", exclude=[], nodes=list(nodes), reason=reason)


def post(client, url, body):
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(url, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def h100_job(client, name: str, *, workers_min: int = 1, workers_max: int = 1) -> TrainingJob:
    job_id = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": workers_min,
                                                     "workers_max": workers_max,
                                                     "accelerator_types": ["nvidia-h100"],
                                                     "hyperparameters": {"steps": 100000}})
    return TrainingJob.objects.get(pk=job_id)


def launch_and_sync(job: TrainingJob, backend) -> TrainingJob:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_launch(job_id=job.pk, backend=backend)
    return sync(job, backend)


def sync(job: TrainingJob, backend) -> TrainingJob:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_sync(job_id=job.pk, backend=backend)
    return TrainingJob.objects.get(pk=job.pk)


def cycle():
    with TestCase.captureOnCommitCallbacks(execute=True):
        return run_cycle()


def nodes_of(job: TrainingJob) -> list[str]:
    return [w["node"] for w in TrainingJob.objects.get(pk=job.pk).placement]


def cannot_reserve(backend, job: TrainingJob, nodes: list[str]) -> None:
    """The run was given `nodes` and could not reserve them, as the Ray supervisor reports it."""
    _cannot_reserve(backend.runs[job.compute_handle], nodes)


def test_a_worker_moved_off_a_cordoned_node_does_not_take_the_node_a_replica_is_being_deployed_to(
        api, backend, model_dir):
    """QA's steps: an elastic job runs at 2 x H100:8 (one worker per node); a 1-2 replica deployment (8 H100 each)
    makes it shrink to 1 worker, holding the node it gave back (`capacity_held`); the deployment goes DEPLOYING, and
    the next cycle cleared the hold although its replica ran nowhere yet; the job's node is cordoned, and its worker
    was re-placed onto the node the replica was being deployed to."""
    client = api("alpha", "member")
    job = h100_job(client, "elastic", workers_min=1, workers_max=2)
    job = launch_and_sync(job, backend)
    assert job.state == "RUNNING" and sorted(nodes_of(job)) == list(H100)
    Node.objects.filter(name__in=H100).update(free_devices=0)  # as Ray reports them: the job holds both
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "name": "h100-serve", "model_uri": f"file://{model_dir}",
        "accelerator_types": ["nvidia-h100"], "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 2})
    assert Deployment.objects.get(pk=deployment_id).state == "PENDING"

    result = cycle()
    assert [s.workload_id for s in result.shrunk] == [str(job.pk)]
    [[given_back, devices]] = Deployment.objects.get(pk=deployment_id).capacity_held
    assert devices == 8
    [kept] = nodes_of(job)
    assert kept != given_back
    job = sync(sync(job, backend), backend)  # the run shrinks to its placement
    assert job.observed_nodes == [kept]
    Node.objects.filter(name=given_back).update(free_devices=8)

    with TestCase.captureOnCommitCallbacks(execute=True):
        deployment = serving.deployment_deploy(deployment_id=deployment_id, backend=backend)
    assert deployment.state == "DEPLOYING"  # Serve starts its replica, which does not run yet
    backend.set_service_status(deployment.compute_handle, state="deploying", replicas_running=0, replicas_target=1)
    with TestCase.captureOnCommitCallbacks(execute=True):
        serving.deployment_sync(deployment_id=deployment_id, backend=backend)
    assert Deployment.objects.get(pk=deployment_id).replicas_ready == 0

    cycle()
    assert Deployment.objects.get(pk=deployment_id).capacity_held == [[given_back, 8.0]], \
        "the hold was cleared while the replica was being deployed"

    Node.objects.filter(name=kept).update(cordoned=True)  # under the job's last worker
    job = sync(job, backend)
    assert given_back not in nodes_of(job), \
        f"the worker moved onto {given_back}, where the deployment's replica is being deployed"
    assert nodes_of(job) == [kept] and job.state == "RUNNING"  # no room: it keeps running on the cordoned node
    assert [given_back] not in backend.placed

    # Serve says where it starts the replica: the hold follows it there (here: the same node)
    backend.set_service_status(deployment.compute_handle, starting_node_names=(given_back,))
    with TestCase.captureOnCommitCallbacks(execute=True):
        serving.deployment_sync(deployment_id=deployment_id, backend=backend)
    [demand] = load_serving()
    assert demand.starting_nodes == (given_back,)
    cycle()
    assert Deployment.objects.get(pk=deployment_id).capacity_held == [[given_back, 8.0]]

    # once it runs it is counted where Serve reports it, and the hold goes
    backend.set_service_status(deployment.compute_handle, state="running", replicas_running=1,
                               node_names=(given_back,), starting_node_names=())
    with TestCase.captureOnCommitCallbacks(execute=True):
        serving.deployment_sync(deployment_id=deployment_id, backend=backend)
    assert Deployment.objects.get(pk=deployment_id).state == "SERVING"
    cycle()
    assert Deployment.objects.get(pk=deployment_id).capacity_held == []
    job = sync(job, backend)
    assert nodes_of(job) == [kept]


def test_a_gang_is_not_admitted_onto_the_node_a_live_deployments_replica_is_being_deployed_to(
        api, backend, model_dir):
    """The hold of a replica being deployed is stored, so the next cycle's mixed load (and whatever reads it) keeps
    training off it, where the backend starts it when it says so."""
    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    Deployment.objects.filter(pk=deployment_id).update(
        state="DEPLOYING", replicas_ready=0, replicas_target=1,
        observed={"node_names": [], "starting_node_names": ["h100-pool-0"]})
    cycle()
    assert Deployment.objects.get(pk=deployment_id).capacity_held == [["h100-pool-0", 8.0]]
    job = h100_job(client, "beside")
    assert job.state == "ADMITTED" and nodes_of(job) == ["h100-pool-1"]


def test_a_run_that_cannot_reserve_a_node_a_replica_holds_is_placed_again_once_a_node_is_free(
        api, backend, model_dir):
    """QA's end state: the job's placement is h100-pool-1, where the deployment's replica runs, and its run awaits
    placement there (it could not reserve it); h100-pool-0 is cordoned. The launcher sent h100-pool-1 again every
    pass ("moving 1 worker(s) to new nodes: h100-pool-1"), even once h100-pool-0 was uncordoned and free."""
    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    Deployment.objects.filter(pk=deployment_id).update(state="SERVING", replicas_ready=1, replicas_target=1,
                                                       observed={"node_names": ["h100-pool-1"]})
    job = launch_and_sync(h100_job(client, "moved"), backend)
    assert job.state == "RUNNING" and nodes_of(job) == ["h100-pool-0"]
    # double-booked, as the old re-placement left it: placed on the replica's node, and the run cannot get it
    placement = [{**w, "node": "h100-pool-1"} for w in job.placement]
    TrainingJob.objects.filter(pk=job.pk).update(placement=placement)
    Node.objects.filter(name="h100-pool-0").update(cordoned=True)
    cannot_reserve(backend, job, ["h100-pool-1"])
    backend.placed.clear()

    for _ in range(2):
        job = sync(job, backend)
        assert backend.placed == [], f"sent the nodes it cannot reserve again: {backend.placed}"
    assert job.state == "RECOVERING"
    assert job.state_reason == (f"waiting for capacity to re-place 1 worker(s) off h100-pool-1 (h100-pool-1: "
                                f"deployment {deployment_id}'s replica)"), job.state_reason
    waits = [e.reason for e in job.events.all() if e.reason.startswith("waiting for capacity")]
    assert len(waits) == 1, waits  # said once, not every pass

    Node.objects.filter(name="h100-pool-0").update(cordoned=False)
    job = sync(job, backend)
    assert nodes_of(job) == ["h100-pool-0"] and backend.placed == [["h100-pool-0"]]
    assert any(e.reason.startswith("re-placed 1 worker(s) on h100-pool-0; leaving h100-pool-1 (h100-pool-1: "
                                   f"deployment {deployment_id}'s replica)") for e in job.events.all())
    job = sync(job, backend)
    assert job.state == "RUNNING" and job.observed_nodes == ["h100-pool-0"]


def test_a_run_that_cannot_reserve_nodes_the_control_plane_sees_free_moves_to_other_free_ones_or_tries_again(
        api, backend):
    """Something the control plane does not know holds the node: the gang moves whole to another free node; with
    none free, the same node is tried again, said once on the timeline (not "moving 1 worker(s)" every pass)."""
    client = api("alpha", "member")
    job = launch_and_sync(h100_job(client, "first"), backend)
    [node] = nodes_of(job)
    [other] = [n for n in H100 if n != node]
    cannot_reserve(backend, job, [node])
    backend.placed.clear()
    job = sync(job, backend)
    assert nodes_of(job) == [other] and backend.placed == [[other]]
    job = sync(job, backend)
    assert job.state == "RUNNING" and job.observed_nodes == [other]

    second = launch_and_sync(h100_job(client, "second"), backend)  # takes the other node
    assert nodes_of(second) == [node]
    backend.unreservable.add(other)
    cannot_reserve(backend, job, [other])
    backend.placed.clear()
    for _ in range(3):
        job = sync(job, backend)
        assert nodes_of(job) == [other]
    assert backend.placed == [[other]] * 3  # the only way to try again
    again = [e.reason for e in job.events.all() if e.reason.startswith(f"trying {other} again")]
    assert again == [f"trying {other} again: the run could not reserve them (nodes {other} could not be reserved "
                     "within 30.0 s), and no other node is free"], again
    backend.unreservable.clear()
    job = sync(sync(job, backend), backend)
    assert job.state == "RUNNING" and job.observed_nodes == [other]
