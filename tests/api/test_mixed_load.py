"""Mixed load in the platform (issue 3): the scheduling cycle counts serving replicas, lets training borrow
capacity deployments reserved but do not use, and takes it back (checkpoint, then stop) when a deployment's
autoscaler wants more replicas. In-memory compute backend; the core is tested in tests/unit/test_mixed_load.py."""

from __future__ import annotations

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from controlplane.quotas.models import PriorityClass
from inference import tasks as inference_tasks
from inference import workflows
from inference.models import Deployment
from inference.selectors import replica_capacity
from inference.workflows import CPUS_PER_REPLICA
from jobs.admission import load_serving, replace_workers, run_cycle
from jobs.models import TrainingJob
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    from jobs.tasks import launch_training_job, stop_training_run

    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(inference_tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr(launch_training_job, "apply_async", lambda *args, **kwargs: None)
    stops = []
    monkeypatch.setattr(stop_training_run, "apply_async", lambda args=(), kwargs=None, **_: stops.append(args))
    fake.stops = stops
    return fake


def post(client, url, body):
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(url, body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def deploy_h100(client, model_dir) -> Deployment:
    """One replica of 8 H100 running, up to 2: it reserves the whole 16-chip H100 pool."""
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 2})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "SERVING" and deployment.accelerator_type == "nvidia-h100"
    return deployment


def job(client, name: str) -> int:
    return post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-h100"]})


def body(client, job_id):
    return client.get(f"/api/v1/training-jobs/{job_id}/").json()


def scale_out(backend, deployment: Deployment, target: int) -> Deployment:
    """Serve's autoscaler wants `target` replicas; the sync records it."""
    backend.set_service_status(deployment.compute_handle, replicas_target=target)
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.deployment_sync(deployment_id=deployment.pk, backend=backend)
    return Deployment.objects.get(pk=deployment.pk)


def test_training_borrows_reserved_idle_capacity_and_gives_it_back_when_the_deployment_scales_out(
        api, backend, model_dir):
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)
    [demand] = load_serving()
    assert (demand.replicas_running, demand.replicas_wanted, demand.reserved) == (1, 1, 16.0)

    borrower = job(client, "borrower")
    admitted = body(client, borrower)
    assert admitted["status"]["state"] == "ADMITTED"
    admission = client.get(f"/api/v1/training-jobs/{borrower}/events/").json()["results"][-1]
    assert admission["to_state"] == "ADMITTED"
    assert "on loan: training now uses 8 nvidia-h100 of the capacity deployments reserved" in admission["reason"]
    # the running replica holds the other node and counts against the queue's quota: a second job waits
    second = job(client, "second")
    assert "shared needs to borrow 8 nvidia-h100" in body(client, second)["status"]["reason"]

    deployment = scale_out(backend, deployment, 2)
    assert deployment.replicas_target == 2 and deployment.replicas_ready == 1
    with TestCase.captureOnCommitCallbacks(execute=True):
        result = run_cycle()
    assert [p.workload_id for p in result.preempted] == [str(borrower)]
    events = client.get(f"/api/v1/training-jobs/{borrower}/events/").json()["results"]
    assert events[-1]["to_state"] == "QUEUED"  # admitted, not started yet: it gives its admission back at once
    # Its queue's quota is full too (the running replica and the borrower), so it gives back the quota first, which
    # also frees the node the replica needs.
    assert f"gives back nvidia-h100 quota deployment {deployment.pk} needs within its queue's quota" \
        in events[-1]["reason"], events[-1]["reason"]
    timeline = [e.reason for e in deployment.events.order_by("id")]
    assert timeline[-1] == f"job {borrower} checkpoints and stops to give back quota this deployment needs"
    # nothing else takes the devices the new replica needs
    assert {body(client, i)["status"]["state"] for i in (borrower, second)} == {"QUEUED"}

    backend.set_service_status(deployment.compute_handle, replicas_running=2)  # Serve placed it
    scale_out(backend, deployment, 2)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert {body(client, i)["status"]["state"] for i in (borrower, second)} == {"QUEUED"}

    backend.set_service_status(deployment.compute_handle, replicas_running=1, replicas_target=1)  # scaled in
    scale_out(backend, deployment, 1)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert sorted(body(client, i)["status"]["state"] for i in (borrower, second)) == ["ADMITTED", "QUEUED"]


def test_a_running_borrower_is_asked_to_checkpoint_and_stop(api, backend, model_dir):
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)
    borrower = job(client, "borrower")
    TrainingJob.objects.filter(pk=borrower).update(state="RUNNING", compute_handle="fy-train-x")
    scale_out(backend, deployment, 2)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert TrainingJob.objects.get(pk=borrower).state == "PREEMPTED"
    assert backend.stops and backend.stops[-1][0] == borrower


def _scale_out_beside_a_job_that_never_gives_back(client, backend, model_dir) -> Deployment:
    """A 1-2 replica deployment (8 H100 each) wants its second replica while a never-preempted job holds the other
    node; three cycles run. Returns the deployment (its timeline says why the replica waits)."""
    deployment = deploy_h100(client, model_dir)
    high = job(client, "keeps-its-devices")
    never = PriorityClass.objects.create(name="never-preempted", value=1000, preemptible=False)
    TrainingJob.objects.filter(pk=high).update(state="RUNNING", compute_handle="fy-train-y", priority_class=never)
    scale_out(backend, deployment, 2)
    for _ in range(3):
        with TestCase.captureOnCommitCallbacks(execute=True):
            run_cycle()
    assert TrainingJob.objects.get(pk=high).state == "RUNNING"
    return deployment


def test_a_deployment_whose_wanted_replicas_exceed_the_quota_says_why_once(api, backend, model_dir):
    deployment = _scale_out_beside_a_job_that_never_gives_back(api("alpha", "member"), backend, model_dir)
    # the replica (8) and the job (8) use the queue's 16 nominal, and the job never gives back: quota says why
    waits = [e.reason for e in deployment.events.all() if "wait for quota" in e.reason]
    assert waits == ["1 wanted replica(s) wait for quota: shared needs to borrow 8 nvidia-h100 but its cohort "
                     "lends only 0 now"]


def test_a_deployment_whose_wanted_replicas_fit_nowhere_says_why_once(api, backend, model_dir, world):
    from controlplane.quotas.models import ResourceQuota

    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=64)  # quota is no limit here: the devices are
    deployment = _scale_out_beside_a_job_that_never_gives_back(api("alpha", "member"), backend, model_dir)
    waits = [e.reason for e in deployment.events.all() if "fit nowhere" in e.reason]
    assert waits == ["1 wanted replica(s) of 8 nvidia-h100 fit nowhere, and no preemptible training holds enough "
                     "to give back"]


def test_a_cpu_deployment_holds_cores_outside_quota_and_one_not_placed_holds_nothing(api, backend, model_dir):
    """A CPU deployment's replicas are cores of the CPU pool (its server's reservation), counted against no quota
    (before 2026-11-29 the cycle left them out, and CPU training was admitted onto their cores; QA)."""
    from inference.workflows import CPUS_PER_REPLICA

    client = api("alpha", "member")
    on_cpu = post(client, "/api/v1/deployments/", {**DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}",
                                                   "accelerator_types": ["cpu"], "devices_per_replica": 1})
    waiting = post(client, "/api/v1/deployments/", {**DEPLOYMENT_BODY, "name": "later",
                                                    "model_uri": f"file://{model_dir}"})
    Deployment.objects.filter(pk=waiting).update(state="PENDING", accelerator_type="")
    assert Deployment.objects.filter(state="SERVING", accelerator_type="cpu").exists()
    [demand] = load_serving()
    assert (demand.id, demand.accelerator_type, demand.devices_per_replica, demand.cluster_queue) == (
        str(on_cpu), "cpu", CPUS_PER_REPLICA, None)


def test_a_deployment_pending_for_capacity_gets_it_back_from_training_then_deploys(api, backend, model_dir):
    """Training fills the H100 pool; a new deployment's replica fits the queue's quota once that (preemptible)
    training gives its share back, but no node has room: the cycle has the training give a node back and holds it
    for the replica, and the reconciler deploys once the node is free."""
    from controlplane.cluster.models import Node
    from inference import tasks

    client = api("alpha", "member")
    first, second = job(client, "first"), job(client, "second")
    assert {body(client, i)["status"]["state"] for i in (first, second)} == {"ADMITTED"}
    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(free_devices=0)  # the jobs hold them
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "PENDING" and deployment.state_reason.startswith("waiting for capacity"), \
        deployment.state_reason  # not "waiting for quota": the team's own preemptible training gives it back
    [demand] = load_serving()
    assert (demand.id, demand.accelerator_type, demand.replicas_wanted, demand.replicas_running) == \
        (str(deployment_id), "nvidia-h100", 1, 0)

    with TestCase.captureOnCommitCallbacks(execute=True):
        result = run_cycle()
    assert len(result.preempted) == 1 and not result.admitted
    victim = int(result.preempted[0].workload_id)
    assert f"deployment {deployment_id}" in result.preempted[0].reason
    assert body(client, victim)["status"]["state"] == "QUEUED"
    timeline = [e.reason for e in deployment.events.order_by("id")]
    assert timeline[-1].startswith(f"job {victim} checkpoints and stops to give back"), timeline[-1]
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()  # the node stays held for the replica: the victim is not admitted again
    assert body(client, victim)["status"]["state"] == "QUEUED"

    survivor = TrainingJob.objects.get(pk=({first, second} - {victim}).pop())
    assert survivor.state == "ADMITTED" and len(survivor.placement) == 1
    # Ray reports every node free (the victim stopped; the survivor's run has not reserved its node yet): the
    # replica must still not go where the survivor was placed, so the deploy waits for the victim's node only.
    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(free_devices=8)
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=8, cpus_per_replica=0.5,
                            for_deployment=deployment_id) == {"h100-pool": 1}
    # the victim's node is held for this deployment: placing any other one leaves it out
    held = Deployment.objects.get(pk=deployment_id).capacity_held
    assert len(held) == 1 and held[0][1] == 8, held
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=8, cpus_per_replica=0.5) == \
        {"h100-pool": 0}
    other = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "name": "late", "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    late = Deployment.objects.get(pk=other)
    assert late.state == "PENDING" and "waiting for capacity" in late.state_reason, late.state_reason
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_deployments()
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state in ("DEPLOYING", "SERVING") and deployment.accelerator_type == "nvidia-h100"
    assert Deployment.objects.get(pk=other).state == "PENDING"  # it did not take the node held for the first
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()  # the replica runs now (or is about to): its hold is no longer needed
    assert Deployment.objects.get(pk=deployment_id).capacity_held == []


def test_a_pending_deployment_whose_model_is_gone_makes_nobody_give_anything_back(api, backend, model_dir):
    from controlplane.cluster.models import Node

    client = api("alpha", "member")
    job(client, "first")
    Node.objects.filter(pool__accelerator_type__slug="nvidia-h100").update(free_devices=0)
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    assert Deployment.objects.get(pk=deployment_id).state_reason.startswith("waiting for capacity")
    assert len(load_serving()) == 1
    (model_dir / "model.pt").unlink()
    assert load_serving() == []
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert not run_cycle().preempted


def test_replica_capacity_leaves_out_what_admitted_training_holds_before_ray_reports_it(api, backend):
    """A gang the scheduler placed reserves nothing in Ray until its run starts: between the two, Ray's free
    figures still show its devices (or the CPU pool's cores), and a replica must not be placed on them."""
    from controlplane.cluster.models import Node

    client = api("alpha", "member")
    Node.objects.update(free_devices=8, free_cpus=2)  # what Ray reports: nothing reserved yet
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=8, cpus_per_replica=0.25) == \
        {"h100-pool": 2}
    assert replica_capacity(accelerator_type="cpu", devices_per_replica=0, cpus_per_replica=0.25) == {"cpu-pool": 8}
    h100 = job(client, "on-h100")
    cpu = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "on-cpu", "workers_min": 1, "workers_max": 1,
                                                  "accelerator_types": ["cpu"], "devices_per_worker": 0,
                                                  "cpus_per_worker": 1})
    assert {body(client, i)["status"]["state"] for i in (h100, cpu)} == {"ADMITTED"}
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=8, cpus_per_replica=0.25) == \
        {"h100-pool": 1}
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=4, cpus_per_replica=0.25) == \
        {"h100-pool": 2}  # two of 4 devices, both on the node the job was not placed on
    assert replica_capacity(accelerator_type="cpu", devices_per_replica=0, cpus_per_replica=0.25) == {"cpu-pool": 4}
    Node.objects.filter(pool__name="cpu-pool").update(free_cpus=0.5)  # Ray lower still: Ray wins
    assert replica_capacity(accelerator_type="cpu", devices_per_replica=0, cpus_per_replica=0.25) == {"cpu-pool": 2}


def test_replica_capacity_counts_serving_and_admitted_training_on_the_same_node(api, backend, model_dir):
    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 4, "replicas_min": 1, "replicas_max": 1})
    # its one replica runs on h100-pool-0 (what the deployment sync records from Serve)
    Deployment.objects.filter(pk=deployment_id).update(replicas_ready=1, observed={"node_names": ["h100-pool-0"]})
    jobs = [post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": f"j{i}", "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-h100"], "devices_per_worker": 4})
            for i in range(3)]
    assert {body(client, j)["status"]["state"] for j in jobs} == {"ADMITTED"}
    on_node0 = [j for j in TrainingJob.objects.filter(pk__in=jobs) if j.placement[0]["node"] == "h100-pool-0"]
    assert len(on_node0) == 1  # the scheduler put one 4-device gang beside the replica

    from controlplane.cluster.models import Node
    # What Ray reports: the replica's 4 devices reserved on node 0; no training run has reserved anything yet.
    Node.objects.filter(name="h100-pool-0").update(free_devices=4)
    Node.objects.filter(name="h100-pool-1").update(free_devices=8)
    # Every H100 device is taken (4 serving + 3 x 4 training): no 4-device replica fits anywhere.
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=4, cpus_per_replica=0.5) \
        in ({}, {"h100-pool": 0})


def test_cpu_pool_capacity_counts_cpu_replicas_and_admitted_cpu_training(api, backend, model_dir):
    """The CPU pool branch has the same hole: a CPU replica's cores are out of Ray's free figure but not in
    held_units_by_node, so min(Ray free, capacity - held) forgets one of them."""
    from controlplane.cluster.models import Node
    from inference.workflows import CPUS_PER_REPLICA

    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "replicas_min": 1, "replicas_max": 1})
    node = Node.objects.get(pool__accelerator_type__slug="cpu")
    Deployment.objects.filter(pk=deployment_id).update(replicas_ready=1, observed={"node_names": [node.name]})
    cpu_job = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "on-cpu", "workers_min": 1,
                                                      "workers_max": 1, "accelerator_types": ["cpu"],
                                                      "devices_per_worker": 0, "cpus_per_worker": 1})
    assert body(client, cpu_job)["status"]["state"] == "ADMITTED"
    # Ray: the replica's cores reserved, the job's not yet
    Node.objects.filter(pk=node.pk).update(free_cpus=node.capacity_cpus - CPUS_PER_REPLICA)
    truly_free = node.capacity_cpus - CPUS_PER_REPLICA - 1
    assert replica_capacity(accelerator_type="cpu", devices_per_replica=0, cpus_per_replica=CPUS_PER_REPLICA) == \
        {node.pool.name: int(truly_free // CPUS_PER_REPLICA)}


def test_replica_capacity_leaves_out_the_cores_an_admitted_gang_reserves_on_an_accelerator_node(api, backend):
    """A worker reserves its CPU cores with its devices when its run starts: a replica's server process must not
    take the last core of a node a gang was admitted to (the gang could not reserve its bundle then)."""
    from controlplane.cluster.models import Node

    client = api("alpha", "member")
    gang = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "half", "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-h100"], "devices_per_worker": 4,
                                                   "cpus_per_worker": 0.5})
    assert body(client, gang)["status"]["state"] == "ADMITTED"
    [placed] = [worker["node"] for worker in TrainingJob.objects.get(pk=gang).placement]
    Node.objects.filter(pool__name="h100-pool").update(free_devices=8, free_cpus=1)  # Ray: nothing reserved yet
    assert Node.objects.get(name=placed).capacity_cpus == 1
    # 1-device replicas at 0.25 core: 4 on the other node (its one core), 2 beside the gang (half its core is taken)
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=1, cpus_per_replica=0.25) == \
        {"h100-pool": 6}


def test_cpu_replica_on_an_accelerator_node_is_counted(api, backend, model_dir):
    from controlplane.cluster.models import Node
    from inference.workflows import CPUS_PER_REPLICA

    client = api("alpha", "member")
    gang = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "half", "workers_min": 1, "workers_max": 1,
                                                   "accelerator_types": ["nvidia-h100"], "devices_per_worker": 4,
                                                   "cpus_per_worker": 0.5})
    assert body(client, gang)["status"]["state"] == "ADMITTED"
    [placed] = [w["node"] for w in TrainingJob.objects.get(pk=gang).placement]
    cpu_dep = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "replicas_min": 1, "replicas_max": 1})
    # the unpinned CPU replica landed on the accelerator node the gang was admitted to
    Deployment.objects.filter(pk=cpu_dep).update(pool="", replicas_ready=1, observed={"node_names": [placed]})
    Node.objects.filter(pool__name="h100-pool").exclude(name=placed).update(free_cpus=0)
    # Ray: the CPU replica's 0.25 core reserved, the gang's core not yet (its run has not started)
    Node.objects.filter(name=placed).update(capacity_cpus=2, free_cpus=2 - CPUS_PER_REPLICA, free_devices=8)
    Node.objects.filter(name=placed).update(capacity_cpus=1.5, free_cpus=1.5 - CPUS_PER_REPLICA)
    truly_free = 1.5 - 0.5 - CPUS_PER_REPLICA  # 0.75 core -> 3 replicas of 0.25 (the 4 free devices would take 4)
    assert replica_capacity(accelerator_type="nvidia-h100", devices_per_replica=1,
                            cpus_per_replica=CPUS_PER_REPLICA) == {"h100-pool": int(truly_free / CPUS_PER_REPLICA)}


def test_serves_autoscaler_is_capped_at_what_the_queues_quota_takes_and_uncapped_when_it_takes_all_again(
        api, backend, model_dir):
    from controlplane.quotas.models import ResourceQuota

    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)  # 1 replica of 8 running, up to 2
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit is None  # shared's 16 take both replicas
    assert backend.services[deployment.compute_handle].replicas_max == 2

    quota = ResourceQuota.objects.get(cluster_queue__name="shared", accelerator_type__slug="nvidia-h100")
    quota.nominal_quota = 8
    quota.save()
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit == 1
    timeline = [e.reason for e in deployment.events.order_by("id")]
    assert timeline[-1].startswith("quota: at most 1 of its 2 replicas now (shared"), timeline[-1]
    status = client.get(f"/api/v1/deployments/{deployment.pk}/").json()["status"]
    assert status["replicas_limit"] == 1
    deployment = scale_out(backend, deployment, 1)  # the sync caps Serve's autoscaler at the limit
    spec = backend.services[deployment.compute_handle]
    assert (spec.replicas_min, spec.replicas_max) == (1, 1)
    assert deployment.autoscaling["max_replicas"] == 1
    assert "its cluster queue's quota takes 1 of 2 now" in deployment.events.order_by("id").last().reason

    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()  # nothing changed: no new event
    assert [e.reason for e in deployment.events.order_by("id")][-1].startswith("autoscaling: replicas 1-1")

    quota.nominal_quota = 16
    quota.save()
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit is None
    assert [e.reason for e in deployment.events.order_by("id")][-1] == "quota: all 2 replicas allowed again"
    deployment = scale_out(backend, deployment, 1)
    assert backend.services[deployment.compute_handle].replicas_max == 2


def test_a_deployment_borrowing_a_lenders_quota_scales_in_when_the_lenders_job_waits_for_it(
        api, backend, model_dir, world):
    """Borrowed quota goes back to its lender: the lender's waiting job lowers the borrowing deployment's replica
    limit, Serve scales in, and the job is admitted once the replica is gone."""
    from controlplane.quotas.models import ResourceQuota
    from controlplane.quotas.services import cluster_queue_create, local_queue_create

    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=8)
    lender = cluster_queue_create(actor=world["ops"], name="lender", cohort="all", quotas=[
        {"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
    local_queue_create(actor=world["beta"]["admin"], team=world["beta"]["team"], name="lend", cluster_queue=lender)
    alpha = api("alpha", "member")
    deployment = deploy_h100(alpha, model_dir)  # shared: 1 replica of 8, up to 2
    deployment = scale_out(backend, deployment, 2)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit is None  # its second replica borrows lender's idle 8
    backend.set_service_status(deployment.compute_handle, replicas_running=2)
    deployment = scale_out(backend, deployment, 2)

    beta = api("beta", "member")
    waiting = post(beta, "/api/v1/training-jobs/", {**JOB_BODY, "name": "lenders-job", "queue": "lend",
                                                    "workers_min": 1, "workers_max": 1,
                                                    "accelerator_types": ["nvidia-h100"]})
    assert body(beta, waiting)["status"]["state"] == "QUEUED"
    deployment.refresh_from_db()
    assert deployment.replicas_limit == 1
    reason = deployment.events.order_by("id").last().reason
    assert reason.startswith("quota: at most 1 of its 2 replicas now (") and \
        "gives back borrowed quota that waiting work of lender needs within its nominal quota" in reason, reason
    deployment = scale_out(backend, deployment, 2)  # the sync: Serve's maximum is 1 now
    assert backend.services[deployment.compute_handle].replicas_max == 1
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    status = body(beta, waiting)["status"]  # the replica still runs: its devices and quota
    assert status["state"] == "QUEUED", status
    assert "lender's idle nvidia-h100 quota is lent to its cohort" in status["reason"], status["reason"]

    backend.set_service_status(deployment.compute_handle, replicas_running=1, replicas_target=1)  # Serve scaled in
    deployment = scale_out(backend, deployment, 1)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert body(beta, waiting)["status"]["state"] == "ADMITTED"
    deployment.refresh_from_db()
    assert deployment.replicas_limit == 1  # the lender's 8 are in use now: nothing left to borrow


def test_a_limit_the_cycle_no_longer_sets_is_lifted(api, backend, model_dir):
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)
    Deployment.objects.filter(pk=deployment.pk).update(accelerator_type="cpu", replicas_limit=1)  # moved to CPU
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit is None
    assert deployment.events.order_by("id").last().reason == "quota: all 2 replicas allowed again"


def test_a_replicas_server_reserves_the_cores_its_devices_come_with(api, backend, model_dir):
    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 1, "replicas_min": 1, "replicas_max": 2})
    spec = backend.services[Deployment.objects.get(pk=deployment_id).compute_handle]
    assert spec.cpus_per_replica == 0.125  # the demo's 1 core per 8 devices, not 0.25: a worker's share stays free


def test_a_new_deployment_is_capped_at_its_quota_from_the_first_deploy(api, backend, model_dir):
    """Before, replicas_limit was set by the next scheduling cycle only: until then Serve's autoscaler could scale a
    new deployment to replicas_max past its queue's quota."""
    from controlplane.quotas.models import ResourceQuota

    ResourceQuota.objects.filter(cluster_queue__name="shared", accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=8)
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)  # 1-2 replicas of 8; the quota takes one (no cohort to borrow from)
    assert deployment.replicas_limit == 1
    assert backend.services[deployment.compute_handle].replicas_max == 1
    assert deployment.autoscaling["max_replicas"] == 1
    deploying = deployment.events.get(to_state="DEPLOYING").reason
    assert "1-2 replica(s) (its cluster queue's quota takes 1 now)" in deploying, deploying
    events = deployment.events.count()
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    deployment.refresh_from_db()
    assert deployment.replicas_limit == 1 and deployment.events.count() == events  # the cycle agrees: no new event


def test_a_new_deployment_the_quota_takes_whole_has_no_limit(api, backend, model_dir):
    deployment = deploy_h100(api("alpha", "member"), model_dir)  # shared's 16 take both replicas
    assert deployment.replicas_limit is None
    assert backend.services[deployment.compute_handle].replicas_max == 2
    assert "quota takes" not in deployment.events.get(to_state="DEPLOYING").reason


def test_a_revision_is_capped_at_what_the_quota_takes_when_it_is_applied(api, backend, model_dir):
    """From a review: only a revision that moved a deployment to another type had its limit recomputed; one raising
    replicas_max on the same type ran uncapped until the next scheduling cycle."""
    from controlplane.quotas.models import ResourceQuota

    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)  # 1-2 replicas of 8 H100; shared's 16 take both
    assert deployment.replicas_limit is None
    ResourceQuota.objects.filter(cluster_queue__name="shared", accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=24)  # 3 replicas' worth
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.patch(f"/api/v1/deployments/{deployment.pk}/", {"replicas_max": 4}, format="json")
    assert response.status_code == 200, response.json()
    deployment.refresh_from_db()
    assert (deployment.revision, deployment.replicas_limit) == (2, 3)
    assert backend.services[deployment.compute_handle].replicas_max == 3
    update = deployment.events.filter(reason__startswith="rolling update").last().reason
    assert update == "rolling update to revision 2 on nvidia-h100 (its cluster queue's quota takes 3 now)", update


def test_placing_a_deployment_locks_the_cluster_queues_first(api, backend, model_dir):
    """Deploying decides against quotas like the scheduling cycle does, so it takes the same locks, in the same
    order (the cluster queues, then the deployment row): a cycle between the deploy's read and its write would
    otherwise lift the new limit, and two deploys could share the same headroom (from a review)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = api("alpha", "member")
    with CaptureQueriesContext(connection) as queries, TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/deployments/", {
            **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
            "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 2}, format="json")
    assert response.status_code == 201, response.json()
    statements = [q["sql"] for q in queries.captured_queries]
    locks = [i for i, sql in enumerate(statements)
             if sql.startswith('SELECT "quotas_clusterqueue"."id" AS "id" FROM "quotas_clusterqueue"')]
    assert locks, "the cluster queues were not locked"
    # The deploy's first statement after the lock reads (locks) the deployment row.
    following = statements[locks[0] + 1]
    assert following.startswith('SELECT "inference_deployment"."id"') and '"inference_deployment"."id" =' in following
    if connection.features.has_select_for_update:  # PostgreSQL (CI's second pass): the rows are locked
        assert statements[locks[0]].endswith("FOR UPDATE") and "FOR UPDATE" in following


# Found by a QA pass over mixed load (2026-11-28).

def test_raising_replicas_min_past_the_quota_is_refused_and_changes_nothing(api, backend, model_dir):
    """A scale to 2-2 on a quota of one 8-device replica was applied: the note said "its cluster queue's quota takes
    2 now", Serve ran 16 devices on a quota of 8, and training in the queue waited for quota the deployment overran."""
    from controlplane.quotas.models import ResourceQuota

    ResourceQuota.objects.filter(cluster_queue__name="shared", accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=8)
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(f"/api/v1/deployments/{deployment.pk}/scale/", {"replicas_min": 2, "replicas_max": 2},
                               format="json")
    assert response.status_code == 400, response.json()
    assert "2 replica(s) of 8 device(s) at all times" in response.json()["replicas_min"][0], response.json()
    after = Deployment.objects.get(pk=deployment.pk)
    assert (after.replicas_min, after.replicas_max, after.revision) == (1, 2, deployment.revision)
    with TestCase.captureOnCommitCallbacks(execute=True):  # within the quota it is applied
        response = client.post(f"/api/v1/deployments/{deployment.pk}/scale/", {"replicas_min": 1, "replicas_max": 3},
                               format="json")
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("devices, accepted", [(0.5, True), (1, True), (2, True), (2.5, False), (1.5, False)])
def test_a_replica_takes_a_fraction_of_one_device_or_whole_devices(api, backend, model_dir, devices, accepted):
    """2.5 devices per replica was accepted; mixed load held round(2.5) = 2 per replica, so the cycle admitted
    training onto devices the replicas used."""
    client = api("alpha", "member")
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/deployments/", {
            **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
            "devices_per_replica": devices, "replicas_min": 1, "replicas_max": 1}, format="json")
    assert (response.status_code == 201) == accepted, response.json()
    if not accepted:
        assert "give a fraction of one device (up to 1) or a whole number" in response.json()["devices_per_replica"][0]


def test_replicas_no_node_could_hold_are_refused_and_a_deleted_deployment_has_no_limit(api, backend, model_dir):
    """QA (2026-11-28): devices_per_replica 16 on 8-device H100 nodes was applied (Serve could never place a replica,
    mixed load could not count the running ones), and a deleted deployment kept showing its last replica limit."""
    from controlplane.quotas.models import ResourceQuota

    client = api("alpha", "member")
    with TestCase.captureOnCommitCallbacks(execute=True):
        refused = client.post("/api/v1/deployments/", {
            **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
            "devices_per_replica": 16, "replicas_min": 1, "replicas_max": 1}, format="json")
    assert refused.status_code == 400
    assert "the largest nvidia-h100 node has 8 devices" in refused.json()["devices_per_replica"][0]
    ResourceQuota.objects.filter(cluster_queue__name="shared", accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=8)
    deployment = deploy_h100(client, model_dir)
    with TestCase.captureOnCommitCallbacks(execute=True):
        patched = client.patch(f"/api/v1/deployments/{deployment.pk}/", {"devices_per_replica": 16}, format="json")
    assert patched.status_code == 400 and "could hold one replica" in patched.json()["devices_per_replica"][0]
    assert Deployment.objects.get(pk=deployment.pk).replicas_limit == 1  # its quota takes one of its two replicas
    Deployment.objects.filter(pk=deployment.pk).update(capacity_held=[["h100-pool-1", 8.0]])  # as a cycle stores it
    assert client.get(f"/api/v1/deployments/{deployment.pk}/").json()["status"]["capacity_held"] == \
        [["h100-pool-1", 8.0]]
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.delete(f"/api/v1/deployments/{deployment.pk}/").status_code in (200, 202, 204)
    status = client.get(f"/api/v1/deployments/{deployment.pk}/").json()["status"]
    assert status["state"] == "DELETED" and status["replicas_limit"] is None and status["capacity_held"] == []



def test_a_pending_deployment_asks_the_type_whose_training_can_give_back(api, backend, model_dir):
    """QA (2026-11-28): a deployment accepting A100 and H100 asked only for A100s, which non-preemptible training
    held, while preemptible training filled the H100s: nobody ever gave anything back and it waited for good."""
    from controlplane.cluster.models import Node
    from controlplane.quotas.models import ResourceQuota

    ResourceQuota.objects.filter(cluster_queue__name="shared").update(nominal_quota=64)
    PriorityClass.objects.create(name="pinned", value=1000, preemptible=False)
    client = api("alpha", "member")
    jobs = {}
    for name, slug, priority in (("a0", "nvidia-a100", "pinned"), ("a1", "nvidia-a100", "pinned"),
                                 ("h0", "nvidia-h100", ""), ("h1", "nvidia-h100", "")):
        jobs[name] = post(client, "/api/v1/training-jobs/", {
            **JOB_BODY, "name": name, "workers_min": 1, "workers_max": 1, "accelerator_types": [slug],
            **({"priority": priority} if priority else {})})
    TrainingJob.objects.filter(pk__in=jobs.values()).update(state="RUNNING", compute_handle="fy-run")
    Node.objects.filter(pool__accelerator_type__slug__in=["nvidia-a100", "nvidia-h100"]).update(free_devices=0)
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-a100", "nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    assert Deployment.objects.get(pk=deployment_id).state == "PENDING"
    demand = next(d for d in load_serving() if d.id == str(deployment_id))
    assert demand.accelerator_type == "nvidia-h100"
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    states = {name: TrainingJob.objects.get(pk=pk).state for name, pk in jobs.items()}
    assert states["a0"] == states["a1"] == "RUNNING" and "PREEMPTED" in (states["h0"], states["h1"]), states



@pytest.mark.parametrize("queue", ["same", "other"])
def test_non_preemptible_training_is_kept_off_capacity_a_deployment_reserved(api, backend, model_dir, world, queue):
    """QA (2026-11-28): a non-preemptible job was admitted onto the H100s a deployment reserved but did not use, with
    the reason "on loan ... given back when they scale out"; it could never give them back, so the deployment never
    scaled out ("fit nowhere, and no preemptible training holds enough to give back"). Both for a job of another
    queue of the cohort and for one of the deployment's own queue."""
    from controlplane.quotas.models import ResourceQuota
    from controlplane.quotas.services import cluster_queue_create, local_queue_create

    PriorityClass.objects.create(name="pinned", value=1000, preemptible=False)
    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=16 if queue == "same" else 8)
    submit_as, queue_name = api("alpha", "member"), None
    if queue == "other":
        other = cluster_queue_create(actor=world["ops"], name="other", cohort="all", quotas=[
            {"accelerator_type": "nvidia-h100", "nominal_quota": 8}])
        local_queue_create(actor=world["beta"]["admin"], team=world["beta"]["team"], name="mine", cluster_queue=other)
        submit_as, queue_name = api("beta", "member"), "mine"
    deployment = deploy_h100(api("alpha", "member"), model_dir)  # 1 of 2 replicas x 8 H100 on the 16-H100 pool
    pinned = post(submit_as, "/api/v1/training-jobs/", {
        **JOB_BODY, "name": "pinned", "workers_min": 1, "workers_max": 1, "accelerator_types": ["nvidia-h100"],
        "priority": "pinned", **({"queue": queue_name} if queue_name else {})})
    status = body(submit_as, pinned)["status"]
    assert status["state"] == "QUEUED", status
    assert "beyond the 0 that serving deployments have not reserved" in status["reason"], status["reason"]

    deployment = scale_out(backend, deployment, 2)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    assert not [e.reason for e in deployment.events.all() if "fit nowhere" in e.reason]
    assert TrainingJob.objects.get(pk=pinned).state == "QUEUED"


def test_a_non_preemptible_admission_beside_a_loan_promises_no_give_back(api, backend, model_dir, world):
    """The "on loan ... given back" note is for preemptible training only: a non-preemptible job admitted on capacity
    no deployment reserved (4 of the 16 H100s, while preemptible training borrows from the reservation) says nothing
    of a loan, even on a type with one."""
    from controlplane.quotas.models import ResourceQuota

    PriorityClass.objects.create(name="pinned", value=1000, preemptible=False)
    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=64)
    client = api("alpha", "member")
    post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 4, "replicas_min": 1, "replicas_max": 3})  # reserves 12 of 16: 4 are not reserved
    borrower = job(client, "borrower")  # 8 H100: 4 of them on loan
    events = client.get(f"/api/v1/training-jobs/{borrower}/events/").json()["results"]
    assert "on loan" in events[-1]["reason"], events[-1]["reason"]
    pinned = post(client, "/api/v1/training-jobs/", {
        **JOB_BODY, "name": "pinned", "workers_min": 1, "workers_max": 1, "accelerator_types": ["nvidia-h100"],
        "devices_per_worker": 4, "priority": "pinned"})
    events = client.get(f"/api/v1/training-jobs/{pinned}/events/").json()["results"]
    assert events[-1]["to_state"] == "ADMITTED" and "on loan" not in events[-1]["reason"], events[-1]["reason"]


def test_the_dry_run_says_a_non_preemptible_job_would_not_fit_on_reserved_capacity(api, backend, model_dir, world):
    """The spec's dry run checks what the cycle checks: a non-preemptible job is kept off the capacity deployments
    reserved (a preemptible one may use it on loan)."""
    from controlplane.quotas.models import ResourceQuota

    PriorityClass.objects.create(name="pinned", value=1000, preemptible=False)
    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100") \
        .update(nominal_quota=64)
    client = api("alpha", "member")
    deploy_h100(client, model_dir)  # reserves all 16 H100, runs on 8
    spec = ("name: next\nqueue: default\npriority: {priority}\nworkers: 1\nresources:\n  accelerators: H100:8\n"
            "hyperparameters: {{steps: 100}}\n")
    plans = {priority: client.post("/api/v1/specs/apply/?dry_run=1", {"spec": spec.format(priority=priority)},
                                   format="json").json()["plan"]["options"][0] for priority in ("pinned", "standard")}
    assert not plans["pinned"]["fits_now"], plans["pinned"]
    assert plans["pinned"]["why_not"].startswith("non-preemptible workloads would use 8 nvidia-h100, beyond the 0 "
                                                 "that serving deployments have not reserved"), plans["pinned"]
    # (a rule, not a shortage: it said "quota left 56 < 8 (...)"; found by a review)
    assert plans["standard"]["fits_now"], plans["standard"]


# ---- from a QA pass (2026-11-29): CPU serving replicas and CPU training share the CPU node's cores (the cycle left
# CPU replicas out); a replica on a cordoned node is not reserved twice; a running gang's workers moved off a node do
# not land on a replica's devices or a stopping run's.

def cpu_job(client, name, workers=2, cpus=1.0):
    return post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": workers,
                                                   "workers_max": workers, "accelerator_types": ["cpu"],
                                                   "devices_per_worker": 0, "cpus_per_worker": cpus})


def test_cpu_training_is_not_admitted_onto_cores_a_running_cpu_replica_uses(api, backend, model_dir):
    """The CPU node has 2 cores. A CPU deployment's replica runs there (0.25 core, as the sync records it from Serve).
    A gang of 2 x 1 core needs the whole node: admitting it over-commits the node (2.25 cores on 2) and its placement
    group cannot be reserved in Ray while the replica runs. The cycle must leave it waiting."""
    client = api("alpha", "member")
    node = Node.objects.get(pool__accelerator_type__slug="cpu")
    assert node.capacity_cpus == 2
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "replicas_min": 1, "replicas_max": 1})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.accelerator_type == "cpu" and deployment.state in ("DEPLOYING", "SERVING")
    Deployment.objects.filter(pk=deployment_id).update(state="SERVING", replicas_ready=1,
                                                       observed={"node_names": [node.name]})
    Node.objects.filter(pk=node.pk).update(free_cpus=node.capacity_cpus - CPUS_PER_REPLICA)  # Ray: replica reserved

    gang = cpu_job(client, "two-cores")
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    job = TrainingJob.objects.get(pk=gang)
    held = sum(float(s) for w in job.placement for _, s in w["taken"])
    assert job.state == "QUEUED", (
        f"admitted onto {held:g} cores of {node.name} beside a running CPU replica "
        f"({held + CPUS_PER_REPLICA:g} of {node.capacity_cpus:g} cores)")


def test_a_cpu_deployment_waiting_for_cores_gets_them_back_from_preemptible_cpu_training(api, backend, model_dir):
    """Preemptible CPU training fills the CPU node (2 x 1 core, running). A one-replica CPU deployment (0.25 core)
    is PENDING "waiting for capacity". On accelerators the cycle has preemptible training give a node back for it
    ("A new deployment is not starved by training"); on the CPU pool `pending_serving` skips it (`slug != "cpu"`,
    `devices_per_replica__gt=0`), so nothing is ever given back and the deployment waits as long as training runs."""
    client = api("alpha", "member")
    gang = cpu_job(client, "fills-the-node")
    assert TrainingJob.objects.get(pk=gang).state == "ADMITTED"
    TrainingJob.objects.filter(pk=gang).update(state="RUNNING", compute_handle="fy-train-cpu")
    Node.objects.filter(pool__accelerator_type__slug="cpu").update(free_cpus=0)  # Ray: the gang reserved both
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "replicas_min": 1, "replicas_max": 1})
    deployment = Deployment.objects.get(pk=deployment_id)
    assert deployment.state == "PENDING" and deployment.state_reason.startswith("waiting for capacity"), \
        deployment.state_reason
    for _ in range(3):
        with TestCase.captureOnCommitCallbacks(execute=True):
            run_cycle()
    assert TrainingJob.objects.get(pk=gang).state != "RUNNING", \
        "the preemptible CPU gang gave nothing back; the CPU deployment waits for capacity for good"


def test_a_replica_on_a_cordoned_node_does_not_reserve_the_other_nodes_too(api, backend, model_dir):
    """A 1-1 deployment (8 H100) reserves 8 H100, and its one replica runs on h100-pool-0. The operator cordons
    h100-pool-0 (the replica keeps running there; no new work comes). `non_preemptible_caps` takes the schedulable
    capacity (8: h100-pool-1 only) less the whole reservation (8) = 0, although the reservation is already met by the
    replica on the cordoned node: a non-preemptible job is kept off the idle h100-pool-1 ("beyond the 0 that serving
    deployments have not reserved"), and stays so for as long as the node is cordoned."""
    PriorityClass.objects.create(name="pinned", value=1000, preemptible=False)
    client = api("alpha", "member")
    dep = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    Deployment.objects.filter(pk=dep).update(state="SERVING", replicas_ready=1, replicas_target=1,
                                             observed={"node_names": ["h100-pool-0"]})
    Node.objects.filter(name="h100-pool-0").update(cordoned=True)
    job = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "pinned", "workers_min": 1, "workers_max": 1,
                                                  "accelerator_types": ["nvidia-h100"], "priority": "pinned"})
    state = TrainingJob.objects.get(pk=job)
    assert state.state == "ADMITTED", state.state_reason


def test_workers_moved_off_a_cordoned_node_do_not_land_on_a_running_replicas_devices(api, backend, model_dir):
    """A 1-replica deployment (8 H100) runs on one H100 node, a 1 x 8 H100 job on the other. The operator cordons
    the job's node: `replace_workers` (the launcher's reconcile) re-places the worker from `load_snapshot()` alone,
    which has no serving replicas in it, so it moves the worker onto the 8 devices the replica uses (16 of 8 on that
    node). It should find no room and leave the gang where it is (it keeps running on the cordoned node)."""
    client = api("alpha", "member")
    dep = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "model_uri": f"file://{model_dir}", "accelerator_types": ["nvidia-h100"],
        "devices_per_replica": 8, "replicas_min": 1, "replicas_max": 1})
    Deployment.objects.filter(pk=dep).update(state="SERVING", replicas_ready=1, replicas_target=1,
                                             observed={"node_names": ["h100-pool-0"]})
    job = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "beside", "workers_min": 1, "workers_max": 1,
                                                  "accelerator_types": ["nvidia-h100"]})
    placed = TrainingJob.objects.get(pk=job)
    assert placed.state == "ADMITTED" and [w["node"] for w in placed.placement] == ["h100-pool-1"]
    TrainingJob.objects.filter(pk=job).update(state="RUNNING", compute_handle="fy-train-x",
                                              observed_nodes=["h100-pool-1"])
    Node.objects.filter(name="h100-pool-1").update(cordoned=True)

    with TestCase.captureOnCommitCallbacks(execute=True):
        replace_workers(job_id=job, exclude=["h100-pool-1"])
    nodes = [w["node"] for w in TrainingJob.objects.get(pk=job).placement]
    assert "h100-pool-0" not in nodes, f"worker moved onto h100-pool-0, whose 8 devices the replica uses: {nodes}"


def test_workers_moved_off_a_cordoned_node_do_not_land_on_a_preempted_run_still_stopping(api, backend):
    """Same root cause, without serving: the cycle keeps new work off the devices of a PREEMPTED run that has not
    stopped yet (`_devices_still_in_use`), `replace_workers` does not (PREEMPTED is not in load_snapshot)."""
    client = api("alpha", "member")
    body = {**JOB_BODY, "workers_min": 1, "workers_max": 1, "accelerator_types": ["nvidia-h100"]}
    stopping, moved = post(client, "/api/v1/training-jobs/", {**body, "name": "a"}), \
        post(client, "/api/v1/training-jobs/", {**body, "name": "b"})
    [old] = [w["node"] for w in TrainingJob.objects.get(pk=stopping).placement]
    [node] = [w["node"] for w in TrainingJob.objects.get(pk=moved).placement]
    TrainingJob.objects.filter(pk=stopping).update(state="PREEMPTED", compute_handle="fy-a")  # checkpointing
    TrainingJob.objects.filter(pk=moved).update(state="RUNNING", compute_handle="fy-b", observed_nodes=[node])
    Node.objects.filter(name=node).update(cordoned=True)
    with TestCase.captureOnCommitCallbacks(execute=True):
        replace_workers(job_id=moved, exclude=[node])
    nodes = [w["node"] for w in TrainingJob.objects.get(pk=moved).placement]
    assert old not in nodes, f"worker moved onto {old}, whose devices the stopping run {stopping} still holds"


@pytest.mark.django_db(transaction=True)
def test_replace_workers_is_its_own_transaction(api, backend, monkeypatch):
    """A review (2026-11-29): `@transaction.atomic` slid onto a helper above `replace_workers`, which the launcher
    calls outside any transaction; on PostgreSQL its SELECT ... FOR UPDATE then raised, and no gang was ever moved
    off a cordoned node. (The `db` fixture's own transaction hid it; this test has none.)"""
    from django.db import connection

    import jobs.admission as admission

    client = api("alpha", "member")
    job = post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": "moves", "workers_min": 1, "workers_max": 1,
                                                  "accelerator_types": ["nvidia-h100"]})
    [node] = [w["node"] for w in TrainingJob.objects.get(pk=job).placement]
    TrainingJob.objects.filter(pk=job).update(state="RUNNING", compute_handle="fy-train-x", observed_nodes=[node])
    Node.objects.filter(name=node).update(cordoned=True)
    locked_in = []
    real_lock = admission.lock_cluster_queues
    monkeypatch.setattr(admission, "lock_cluster_queues",
                        lambda: (locked_in.append(connection.in_atomic_block), real_lock())[1])
    assert not connection.in_atomic_block  # as in the launcher's sync task
    moved = replace_workers(job_id=job, exclude=[node])
    assert locked_in == [True]
    assert moved is not None and node not in [w["node"] for w in moved.placement]
