"""The run workflow of training jobs against the in-memory backend: launch, sync, faults, recovery,
re-placement, shrink, preemption, drift repair, ETTR, and the run endpoints (metrics, logs, faults,
checkpoints, goodput). The real Ray runtime is exercised in tests/integration/test_training_on_ray.py."""

from __future__ import annotations

import json

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from jobs import tasks, workflows
from jobs.admission import run_cycle
from jobs.models import TrainingFault, TrainingJob, TrainingLogLine, TrainingMetric
from jobs.runtime.checkpoints import save_checkpoint
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
def past_clock(backend):
    """Simulated runs on a clock set by the test, an hour in the past: `advance(seconds)` lets their 0.1 s steps and
    1 s fault detections take their simulated time (on the real clock the steps of one observation stop at now)."""
    import time

    now = [time.time() - 3600.0]
    backend.now = lambda: now[0]

    def advance(seconds: float = 60.0) -> None:
        now[0] += seconds

    return advance


def submit(client, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 2, "workers_max": 2,
            "hyperparameters": {"steps": 100}, "checkpoint": {"interval_steps": 25}, **overrides}
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def sync(job, backend) -> TrainingJob:
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_sync(job_id=job.pk, backend=backend)
    return TrainingJob.objects.get(pk=job.pk)


def test_a_job_runs_from_admission_to_success_with_metrics_logs_and_ettr(api, backend):
    client = api("alpha", "member")
    job = submit(client)
    assert job.state == "STARTING" and job.compute_handle == f"fy-train-{job.pk}-a1"
    assert backend.list_training_handles() == [job.compute_handle]
    job = sync(job, backend)
    assert job.state == "RUNNING" and job.started_at is not None and job.current_step == 39
    assert job.observed_nodes == ["h100-pool-0", "h100-pool-1"]
    job = sync(sync(job, backend), backend)
    assert job.state == "SUCCEEDED" and job.current_step == 99 and job.last_checkpoint_step == 99
    assert backend.list_training_handles() == []  # released once its events were applied
    assert TrainingMetric.objects.filter(job=job).count() == 200  # 100 steps x 2 workers, exactly once
    body = client.get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]
    assert body["goodput"]["ettr"] == 1.0 and body["step"] == 99 and body["run_state"] == "succeeded"
    states = [e["to_state"] for e in client.get(f"/api/v1/training-jobs/{job.pk}/events/").json()["results"]]
    assert states == ["PENDING", "QUEUED", "ADMITTED", "STARTING", "RUNNING", "SUCCEEDED"]


def test_applying_the_same_events_twice_records_them_once(api, backend):
    job = submit(api("alpha", "member"))
    report = backend.observe_training(job.compute_handle, since=0)
    workflows._apply_report(job.pk, report)
    workflows._apply_report(job.pk, report)  # a retried task sees the same report
    assert TrainingMetric.objects.filter(job=job).count() == 80


def test_replayed_metrics_fill_only_the_steps_with_no_row(api, backend):
    """A resumed worker replays the metrics its checkpoint carries; the control plane keeps the ones it never got
    (under the attempt they were measured in), whether the originals came in an earlier report or the same one."""
    from controlplane.compute.base import TrainingReport

    job = submit(api("alpha", "member"))
    workflows._apply_report(job.pk, backend.observe_training(job.compute_handle, since=0))  # steps 0-39, 2 workers
    job.refresh_from_db()
    cursor = job.events_cursor

    def metric(seq, step, **extra):
        return {"seq": seq, "type": "metric", "rank": 0, "step": step, "loss": 1.0, "at": 1.0e9, **extra}

    events = ([metric(cursor + 1, 40)]  # reported by the worker that then died: arrives before its replay
              + [metric(cursor + 2 + i, step, replayed=True, attempt=7) for i, step in enumerate(range(36, 44))])
    workflows._apply_report(job.pk, TrainingReport(handle=job.compute_handle, state="running", step=43,
                                                   events=tuple(events)))
    rows = TrainingMetric.objects.filter(job=job, worker=0, step__gte=36).order_by("step")
    assert [(m.step, m.attempt) for m in rows] == [(36, 1), (37, 1), (38, 1), (39, 1), (40, 1),
                                                    (41, 7), (42, 7), (43, 7)]


def test_a_crash_restarts_in_place_and_is_accounted(api, backend, past_clock):
    client = api("alpha", "member")
    job = submit(client)
    past_clock()
    job = sync(job, backend)
    past_clock()
    backend.inject_training_fault(job.compute_handle, rank=1, fault="worker_crash")
    job = sync(job, backend)
    fault = TrainingFault.objects.get(job=job)
    assert fault.kind == "worker_crash" and fault.node == "h100-pool-1" and fault.worker == 1
    assert fault.resumed_at is not None and fault.recomputed_steps == 39 - 24
    assert job.restarts == 1 and job.state == "RUNNING"
    goodput = client.get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]["goodput"]
    assert goodput["interruptions"] == {"worker_crash": 1} and goodput["detection_s"] == pytest.approx(1.0)
    faults = client.get(f"/api/v1/training-jobs/{job.pk}/faults/").json()
    assert faults[0]["evidence"] == "simulated worker_crash" and faults[0]["detection_s"] == pytest.approx(1.0)


def test_a_lost_node_is_replaced_by_a_free_one(api, backend, world):
    client = api("alpha", "member")
    job = submit(client, workers_min=1, workers_max=1)
    job = sync(job, backend)
    lost = job.observed_nodes[0]
    backend.inject_training_fault(job.compute_handle, rank=0, fault="node_lost", node_lost=True)
    job = sync(job, backend)  # sees the fault, re-places the worker, tells the run
    assert job.state == "RECOVERING" and lost not in [w["node"] for w in job.placement]
    job = sync(job, backend)  # sees the run restarted on the new node
    assert job.state == "RUNNING"
    assert [w["node"] for w in job.placement] == job.observed_nodes and lost not in job.observed_nodes
    reasons = [e.reason for e in job.events.all()]
    assert any(r.startswith("re-placed 1 worker(s)") for r in reasons)
    assert any("node lost detected on" in r for r in reasons)


def test_a_gang_shrinks_when_its_lost_worker_cannot_be_placed_and_min_allows(api, backend, world):
    client = api("alpha", "member")
    job = sync(submit(client, workers_min=1, workers_max=2), backend)
    assert len(job.observed_nodes) == 2  # both H100 nodes: nothing left to move to
    backend.inject_training_fault(job.compute_handle, rank=1, fault="node_lost", node_lost=True)
    job = sync(sync(job, backend), backend)
    assert len(job.placement) == 1 and job.observed_nodes == ["h100-pool-0"]
    assert any("shrunk to the 1 worker(s)" in e.reason for e in job.events.all())


def test_a_gang_that_cannot_shrink_waits_for_capacity(api, backend):
    job = sync(submit(api("alpha", "member")), backend)  # needs both H100 nodes
    backend.inject_training_fault(job.compute_handle, rank=1, fault="node_lost", node_lost=True)
    job = sync(job, backend)
    assert job.state == "RECOVERING" and job.recovery_exclude == ["h100-pool-1"]
    assert "waiting for capacity" in job.state_reason


def test_a_job_fails_after_max_restarts_with_the_reason(api, backend):
    job = sync(submit(api("alpha", "member"), max_restarts=1), backend)
    backend.inject_training_fault(job.compute_handle, rank=0, fault="hang")
    job = sync(job, backend)
    backend.inject_training_fault(job.compute_handle, rank=0, fault="hang")
    job = sync(job, backend)
    assert job.state == "FAILED" and "gave up after 1 restart(s)" in job.state_reason
    assert backend.list_training_handles() == []


def test_repeated_faults_on_a_node_cordon_it(api, backend):
    job = sync(submit(api("alpha", "member"), workers_min=1, workers_max=1, max_restarts=5), backend)
    node = job.observed_nodes[0]
    for _ in range(2):
        backend.inject_training_fault(job.compute_handle, rank=0, fault="worker_crash")
        job = sync(job, backend)
    assert Node.objects.get(name=node).cordoned
    job = sync(job, backend)
    assert node not in job.observed_nodes  # moved off the cordoned node
    assert any(f"node {node} cordoned after 2 faults" in e.reason for e in job.events.all())


def test_slow_node_verdicts_do_not_cordon_the_node(api, backend):
    """A slow node is advisory: two verdicts within the window cordoned it, and every gang on it shrank or moved at
    once (QA, on the demo cluster, where simulated nodes share one host's CPUs and the verdicts were noise)."""
    job = sync(submit(api("alpha", "member"), hyperparameters={"steps": 1000}), backend)  # both H100 nodes: no room
    for _ in range(3):
        backend.inject_training_fault(job.compute_handle, rank=1, fault="slow_node")
        job = sync(job, backend)
    assert TrainingFault.objects.filter(job=job, kind="slow_node").count() >= 2
    assert not Node.objects.filter(cordoned=True).exists()
    assert job.observed_nodes == ["h100-pool-0", "h100-pool-1"] and job.restarts == 0


def test_a_slow_node_is_left_when_a_free_node_can_take_its_worker(api, backend):
    job = sync(submit(api("alpha", "member"), workers_min=1, workers_max=1), backend)
    slow = job.observed_nodes[0]
    backend.inject_training_fault(job.compute_handle, rank=0, fault="slow_node")
    job = sync(sync(job, backend), backend)
    assert slow not in job.observed_nodes and job.restarts == 0
    fault = TrainingFault.objects.get(job=job)
    assert fault.advisory and fault.kind == "slow_node" and fault.node == slow


def test_a_slow_node_is_kept_when_no_node_is_free(api, backend):
    job = sync(submit(api("alpha", "member")), backend)  # both H100 nodes
    backend.inject_training_fault(job.compute_handle, rank=1, fault="slow_node")
    job = sync(sync(job, backend), backend)
    assert job.restarts == 0 and job.observed_nodes == ["h100-pool-0", "h100-pool-1"] and job.recovery_exclude == []
    assert not any("waiting for capacity" in e.reason for e in job.events.all())


def test_a_vanished_run_is_launched_again(api, backend):
    job = sync(submit(api("alpha", "member")), backend)
    backend.release_training(job.compute_handle)  # e.g. the head node restarted
    job = sync(job, backend)
    assert job.compute_handle in backend.list_training_handles()
    assert any("not found" in e.reason for e in job.events.all())


def test_an_orphan_run_is_stopped(api, backend):
    from controlplane.compute.base import TrainingLaunch

    backend.launch_training(TrainingLaunch(handle="fy-train-999-a1", job_id=999, nodes=("h100-pool-0",),
                                           accelerator_type="nvidia-h100", devices_per_worker=8, cpus_per_worker=1))
    assert workflows.reconcile_orphan_runs(backend=backend) == ["fy-train-999-a1"]
    assert backend.runs["fy-train-999-a1"].state == "stopped"  # stopped first (a final checkpoint) ...
    workflows.reconcile_orphan_runs(backend=backend)
    assert backend.list_training_handles() == []  # ... released once it has stopped


def test_a_preempted_running_job_checkpoints_requeues_and_resumes(api, backend, world):
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    victim = sync(submit(client, name="low"), backend)
    assert victim.state == "RUNNING"
    urgent = submit(client, name="urgent", priority="urgent")
    victim, urgent = TrainingJob.objects.get(pk=victim.pk), TrainingJob.objects.get(pk=urgent.pk)
    # the preemptor is admitted at once (its devices and quota held for it) but launches only after the victim
    assert victim.state == "PREEMPTED" and urgent.state == "ADMITTED" and urgent.waits_for == [victim.pk]
    # "job 5 checkpoints and stops": it read "5 checkpoint(s) and stop", the id looking like a count (QA)
    assert urgent.compute_handle == "" and urgent.state_reason.endswith(f"launches once job {victim.pk} checkpoints "
                                                                        "and stops"), urgent.state_reason
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()
    victim = TrainingJob.objects.get(pk=victim.pk)
    assert victim.state == "QUEUED" and victim.compute_handle == "" and victim.last_checkpoint_step == 39
    assert any("checkpointed at step 39" in e.reason for e in victim.events.all())
    assert TrainingJob.objects.get(pk=urgent.pk).state == "STARTING"


def test_run_endpoints_page_and_follow(api, backend):
    client = api("alpha", "member")
    job = submit(client)
    job = sync(sync(sync(job, backend), backend), backend)
    page = client.get(f"/api/v1/training-jobs/{job.pk}/metrics/?worker=1&limit=10").json()
    assert [m["step"] for m in page["results"]] == list(range(10)) and page["next_after"]
    more = client.get(f"/api/v1/training-jobs/{job.pk}/metrics/?worker=1&limit=10&after={page['next_after']}")
    assert [m["step"] for m in more.json()["results"]] == list(range(10, 20))
    TrainingLogLine.objects.create(job=job, worker=0, line="hello", recorded_at=job.created_at)
    stream = client.get(f"/api/v1/training-jobs/{job.pk}/logs/?follow=true&timeout=5")
    lines = [json.loads(line) for line in b"".join(stream.streaming_content).decode().splitlines()]
    assert stream["Content-Type"] == "application/x-ndjson" and lines[-1]["line"] == "hello"
    assert any("checkpoint saved at step 99" in line["line"] for line in lines)
    bad = client.get(f"/api/v1/training-jobs/{job.pk}/metrics/?colour=red")
    assert bad.status_code == 400 and "colour" in bad.json()
    bad = client.get(f"/api/v1/training-jobs/{job.pk}/logs/?limit=0")
    assert bad.status_code == 400 and "limit" in bad.json()


def test_checkpoints_are_listed_from_storage_and_requested_on_demand(api, backend):
    client = api("alpha", "member")
    job = sync(submit(client), backend)
    directory = workflows.checkpoint_dir(job)
    save_checkpoint(directory, step=24, files={"model.pt": b"x" * 10})
    (directory / ".tmp-half-written").mkdir()
    listed = client.get(f"/api/v1/training-jobs/{job.pk}/checkpoints/").json()
    assert [(c["step"], c["size_bytes"]) for c in listed] == [(24, 10)]
    response = client.post(f"/api/v1/training-jobs/{job.pk}/checkpoints/")
    assert response.status_code == 202 and response.json() == {"requested": True, "step": 39}
    viewer = api("alpha", "viewer").post(f"/api/v1/training-jobs/{job.pk}/checkpoints/")
    assert viewer.status_code == 403
    queued = submit(client, name="second")
    refused = client.post(f"/api/v1/training-jobs/{queued.pk}/checkpoints/")
    assert refused.status_code == 409 and "state" in refused.json()


def test_goodput_overview_weighs_jobs_by_wall_time(api, backend, world, past_clock):
    client = api("alpha", "member")
    job = submit(client, workers_min=1, workers_max=1)
    past_clock()
    job = sync(job, backend)
    past_clock()
    backend.inject_training_fault(job.compute_handle, rank=0, fault="worker_crash")
    sync(job, backend)
    body = client.get("/api/v1/training-jobs/goodput/").json()
    assert body["jobs"] == 1 and 0 < body["ettr"] < 1 and body["detection_s"] == pytest.approx(1.0)
    assert api("beta", "member").get("/api/v1/training-jobs/goodput/").json()["jobs"] == 0
    from django.test import Client

    browser = Client()
    browser.force_login(world["alpha"]["member"])
    page = browser.get("/").content.decode()
    figure = f"ETTR {body['ettr'] * 100:.2f}% since first start"
    assert figure in page
    browser.force_login(world["beta"]["member"])
    assert figure not in browser.get("/").content.decode()  # nothing of alpha's


def test_run_cycle_launches_what_it_admits(api, backend):
    job = submit(api("alpha", "member"))
    assert job.state == "STARTING"
    run_cycle()  # nothing new: idempotent
    assert TrainingJob.objects.get(pk=job.pk).attempt == 1


def test_console_job_page_shows_the_run(api, backend, world):
    from django.test import Client

    job = sync(submit(api("alpha", "member"), workers_min=1, workers_max=1), backend)
    backend.inject_training_fault(job.compute_handle, rank=0, fault="worker_crash")
    job = sync(sync(job, backend), backend)
    save_checkpoint(workflows.checkpoint_dir(job), step=24, files={"model.pt": b"x" * 2048})
    TrainingLogLine.objects.create(job=job, worker=0, line="step 25 loss 3.0 <b>", recorded_at=job.created_at)
    browser = Client()
    browser.force_login(world["alpha"]["member"])
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Effective training time" in page and "Worker crash" in page and "simulated worker_crash" in page
    assert 'id="chart-loss"' in page and "2.0\xa0KB" in page  # the loss curve is drawn by ECharts in the browser
    assert "step 25 loss 3.0 &lt;b&gt;" in page  # log lines are escaped


@pytest.mark.parametrize(("hyperparameters", "message"), [
    ({"lr": -1}, "lr: must be"),
    ({"stepz": 10}, "stepz"),
    ({"steps": True}, "steps"),
    ({"d_model": 30, "n_heads": 4}, "d_model"),
])
def test_bad_hyperparameters_of_the_builtin_trainer_are_a_400_naming_them(api, backend, hyperparameters, message):
    response = api("alpha", "member").post("/api/v1/training-jobs/", {
        **JOB_BODY, "hyperparameters": hyperparameters}, format="json")
    assert response.status_code == 400 and message in str(response.json()["hyperparameters"])
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(("overrides", "field", "message"), [
    ({"hyperparameters": {"tensor_parallel": 3}}, "hyperparameters", "tensor_parallel: 3 must divide n_heads"),
    ({"hyperparameters": {"pipeline_parallel": 3, "n_layers": 2}}, "hyperparameters", "3 stages need at least 3"),
    ({"hyperparameters": {"tensor_parallel": 2, "pipeline_parallel": 2}, "workers_min": 3, "workers_max": 3},
     "hyperparameters", "must divide the gang's 3 worker"),
    ({"hyperparameters": {"tensor_parallel": 2}, "workers_min": 2, "workers_max": 4}, "workers_min", "not elastic"),
    ({"hyperparameters": {"micro_batches": 5, "batch_size": 16}}, "hyperparameters", "micro_batches: must divide"),
])
def test_a_model_parallel_layout_the_gang_cannot_run_is_a_400_naming_the_field(api, backend, overrides, field,
                                                                                message):
    response = api("alpha", "member").post("/api/v1/training-jobs/", {**JOB_BODY, **overrides}, format="json")
    assert response.status_code == 400 and message in str(response.json()[field]), response.json()
    assert not TrainingJob.objects.exists()


def test_a_model_parallel_job_is_accepted_and_its_layout_reaches_the_workers(api, backend):
    job = submit(api("alpha", "member"), workers_min=4, workers_max=4, devices_per_worker=1,
                 hyperparameters={"steps": 100, "tensor_parallel": 2, "pipeline_parallel": 2})
    launch = workflows.build_launch(job)
    assert launch.runtime["hyperparameters"]["tensor_parallel"] == 2
    assert launch.runtime["devices_per_worker"] == 1
    status = api("alpha", "member").get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]
    assert status["trainer_layout"] == {"tp": 2, "pp": 2, "dp": 1, "micro_batches": 8,
                                        "source": "set in the hyperparameters"}


def test_a_job_over_its_max_duration_fails_after_a_final_checkpoint(api, backend):
    from datetime import timedelta

    job = sync(submit(api("alpha", "member"), max_duration_seconds=60), backend)
    TrainingJob.objects.filter(pk=job.pk).update(started_at=job.started_at - timedelta(seconds=61))
    job = sync(job, backend)
    assert job.state == "FAILED" and "exceeded max_duration_seconds (60 s)" in job.state_reason
    assert backend.runs[job.compute_handle].state == "stopped"
    assert backend.runs[job.compute_handle].last_checkpoint_step >= 39
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()
    assert backend.list_training_handles() == []


def test_an_elastic_job_grows_when_capacity_frees(api, backend, world):
    client = api("alpha", "member")
    blocker = sync(submit(client, name="blocker", workers_min=1, workers_max=1), backend)
    elastic = sync(submit(client, name="elastic", workers_min=1, workers_max=2), backend)
    assert len(elastic.observed_nodes) == 1  # admitted at its minimum: one H100 node is taken
    with TestCase.captureOnCommitCallbacks(execute=True):
        client.post(f"/api/v1/training-jobs/{blocker.pk}/cancel/")  # frees a node; the cycle grows
    elastic = TrainingJob.objects.get(pk=elastic.pk)
    assert len(elastic.placement) == 2
    elastic = sync(sync(elastic, backend), backend)
    assert sorted(elastic.observed_nodes) == ["h100-pool-0", "h100-pool-1"]
    assert any("growing from 1 to 2 worker(s)" in e.reason for e in elastic.events.all())


def test_cordoning_a_node_under_a_running_gang_moves_it_off_after_a_checkpoint(api, backend, world):
    from controlplane.cluster.services import node_set_cordoned

    job = sync(submit(api("alpha", "member"), workers_min=1, workers_max=1,
                      hyperparameters={"steps": 1000}, checkpoint={"interval_steps": 500}), backend)
    node = job.observed_nodes[0]
    node_set_cordoned(actor=world["ops"], node=Node.objects.get(name=node), cordoned=True, reason="maintenance")
    job = sync(sync(job, backend), backend)
    assert node not in job.observed_nodes and job.state == "RUNNING"
    assert job.last_checkpoint_step == 79  # checkpointed at its current step before moving (not at 499)
    assert any(f"leaving {node}" in e.reason for e in job.events.all())


def test_parallelism_auto_stores_the_plan_sizes_the_gang_and_drops_types_that_cannot_run(api, backend, world):
    from django.test import Client

    client = api("alpha", "member")
    job = submit(client, accelerator_types=["nvidia-h100", "nvidia-a100"], workers_min=1, workers_max=2,
                 parallelism={"mode": "auto", "model": "llama2-13b", "global_batch_size": 64})
    plan = job.parallel_plan
    assert set(plan["by_type"]) == {"nvidia-h100", "nvidia-a100"} and plan["devices"] == 16
    h100 = plan["by_type"]["nvidia-h100"]
    assert h100["dp"] * h100["tp"] * h100["pp"] == 16 and h100["memory_gb"] <= h100["memory_limit_gb"]
    # all of the gang for a model-parallel layout; else no fewer workers than the layout fits device memory on
    fewest = max(p.get("fewest_devices", 16) for p in plan["by_type"].values())
    assert job.workers_max == 2 and job.workers_min == (2 if plan["model_parallel"] else -(-fewest // 8)), plan
    body = client.get(f"/api/v1/training-jobs/{job.pk}/").json()
    assert body["spec"]["parallelism"]["model"] == "llama2-13b" and body["status"]["parallel_plan"]["by_type"]
    launch = workflows.build_launch(TrainingJob.objects.get(pk=job.pk))
    assert launch.runtime["parallel_plan"]["accelerator_type"] == launch.accelerator_type
    # the built-in trainer's layout at worker granularity: the plan's pipeline stages on whole workers of 8 devices
    # (a tensor group inside a worker stays in it), or data parallel with the reason
    layout = body["status"]["trainer_layout"]
    assert layout["tp"] * layout["pp"] * layout["dp"] == job.workers_max
    assert layout["source"].startswith(("the parallel plan for", "data parallel only:")), layout
    browser = Client()
    browser.force_login(world["alpha"]["member"])
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Parallel plan" in page and 'id="trainer-layout"' in page


def test_parallelism_auto_sizes_the_gang_to_the_devices_the_best_layout_uses(api, backend, world):
    from django.test import Client

    client = api("alpha", "member")
    # a global batch of 4 splits over at most 4 data-parallel ranks: the best layout uses 16 of the 24 devices
    job = submit(client, accelerator_types=["nvidia-h100"], workers_min=3, workers_max=3,
                 parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 4})
    plan = job.parallel_plan
    h100 = plan["by_type"]["nvidia-h100"]
    assert h100["layout_devices"] == h100["dp"] * h100["tp"] * h100["pp"] == 16 and plan["devices"] == 16
    assert (job.workers_min, job.workers_max) == (2, 2)
    assert plan["sized_by_plan"] == ("the best layouts use at most 16 of the 24 devices asked for: the gang is "
                                     "2 x 8 devices")
    browser = Client()  # the job page says why the gang shrank (QA: it showed only the 24 devices asked for)
    browser.force_login(world["alpha"]["member"])
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    assert "Gang sized by the plan: the best layouts use at most 16 of the 24 devices" in page
    whole = submit(client, name="whole", accelerator_types=["nvidia-h100"], workers_min=1, workers_max=2,
                   parallelism={"mode": "auto", "model": "llama2-13b", "global_batch_size": 64})
    assert "sized_by_plan" not in whole.parallel_plan and whole.workers_max == 2


def test_parallelism_auto_refuses_what_no_accepted_type_can_run(api, backend):
    client = api("alpha", "member")
    too_big = client.post("/api/v1/training-jobs/", {
        **JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 1, "workers_max": 1,
        "parallelism": {"mode": "auto", "model": "gpt3-175b", "global_batch_size": 64}}, format="json")
    assert too_big.status_code == 400 and "device memory" in too_big.json()["parallelism"][0]
    bad = client.post("/api/v1/training-jobs/", {
        **JOB_BODY, "parallelism": {"mode": "auto", "model": {"layerz": 2}, "global_batch_size": 8}}, format="json")
    assert bad.status_code == 400 and "layerz" in bad.json()["parallelism"][0]
    typo = client.post("/api/v1/training-jobs/", {
        **JOB_BODY, "parallelism": {"mode": "auto", "model": "llama2-7b", "batch": 8}}, format="json")
    assert typo.status_code == 400 and "batch" in typo.json()["parallelism"][0]
    assert not TrainingJob.objects.exists()


# Found by QA (2026-11-28): shrinks of running elastic jobs through the platform's cycle.

def _devices(job) -> set[tuple[str, int]]:
    return {(w["node"], int(i)) for w in job.placement for i, _ in w["taken"]}


def test_a_preemptor_waits_for_a_running_elastic_victim_to_checkpoint_and_shrink(api, backend, world):
    """It was launched at once onto devices the elastic run still used, saying its victim had not started."""
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", workers_min=1, workers_max=2,
                          hyperparameters={"steps": 1000}), backend)
    assert elastic.state == "RUNNING" and len(elastic.placement) == 2
    urgent = submit(client, name="urgent", workers_min=1, workers_max=1, priority="urgent")
    elastic = TrainingJob.objects.get(pk=elastic.pk)
    assert len(elastic.placement) == 1 and urgent.state == "ADMITTED" and urgent.waits_for == [elastic.pk]
    assert urgent.state_reason.endswith(f"launches once job {elastic.pk} checkpoints and shrinks"), urgent.state_reason
    assert "admitted (1 x 8 nvidia-h100 held)" in urgent.state_reason  # it read "1 x nvidia-h100": one device?
    assert not urgent.compute_handle
    elastic = sync(elastic, backend)  # the run is told to checkpoint and shrink
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    elastic = sync(elastic, backend)  # ... and reports one worker
    assert elastic.observed_nodes == [w["node"] for w in elastic.placement]
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    urgent = TrainingJob.objects.get(pk=urgent.pk)
    assert urgent.state == "STARTING"
    assert not set(backend.runs[urgent.compute_handle].nodes) & set(backend.runs[elastic.compute_handle].nodes)


def test_shrinking_workers_with_equal_placements_releases_only_as_many(api, backend, world):
    """Two half-core workers on one core have equal placements: releasing one released both (a set difference),
    the job was left with no placement, never shrank its run, and the cycle admitted others onto its cores."""
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", accelerator_types=["cpu"], devices_per_worker=0,
                          cpus_per_worker=0.5, workers_min=1, workers_max=4, hyperparameters={"steps": 1000}),
                   backend)
    assert elastic.state == "RUNNING" and len(elastic.placement) == 4
    submit(client, name="urgent", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=1, workers_min=1,
           workers_max=1, priority="urgent")
    elastic = TrainingJob.objects.get(pk=elastic.pk)
    shrunk = [e for e in elastic.events.order_by("id") if e.reason.startswith("shrunk to")][-1]
    # the 1-core preemptor needs two of the four half-core workers' room: the job keeps 2 (as few released as make
    # room; it went to its minimum of 1 before 2026-11-29)
    assert len(elastic.placement) == shrunk.data["workers"] == 2, (elastic.placement, shrunk.data)
    elastic = sync(elastic, backend)
    assert len(backend.runs[elastic.compute_handle].nodes) == 2  # the run was told to shrink


def test_elastic_growth_does_not_take_devices_a_preempted_run_still_holds(api, backend, world, monkeypatch):
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    monkeypatch.setattr(tasks.stop_training_run, "apply_async", lambda *a, **k: None)  # it takes its time to stop
    client = api("alpha", "member")
    victim = sync(submit(client, name="low", workers_min=1, workers_max=1, hyperparameters={"steps": 1000}),
                  backend)
    elastic = sync(submit(client, name="elastic", priority="standard", devices_per_worker=4, workers_min=1,
                          workers_max=3, hyperparameters={"steps": 1000}), backend)
    assert len(elastic.placement) == 2
    submit(client, name="urgent", priority="urgent", devices_per_worker=4, workers_min=1, workers_max=1)
    victim = TrainingJob.objects.get(pk=victim.pk)
    assert victim.state == "PREEMPTED"
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()  # the next beat, while the victim still checkpoints
    elastic = TrainingJob.objects.get(pk=elastic.pk)
    assert not _devices(elastic) & _devices(victim) and len(elastic.placement) == 2


def test_a_cpu_run_still_shrinking_keeps_the_other_cpus_of_its_node(api, backend, world):
    """A run that has not yet shed a worker on a CPU node holds every CPU there outside its placement: CPU nodes were
    read by their device count (0), so nothing on them was held and the cycle could give the shed worker's CPUs away."""
    from jobs.admission import _devices_still_in_use

    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", accelerator_types=["cpu"], devices_per_worker=0,
                          cpus_per_worker=0.5, workers_min=1, workers_max=2, hyperparameters={"steps": 1000}),
                   backend)
    assert elastic.state == "RUNNING" and len(elastic.placement) == 2
    node = Node.objects.get(name=elastic.placement[0]["node"])
    assert node.capacity_cpus > 1 and not node.capacity_devices
    kept = elastic.placement[:1]  # shrunk to one worker; the run still reports both
    TrainingJob.objects.filter(pk=elastic.pk).update(placement=kept,
                                                     observed_nodes=[w["node"] for w in elastic.placement])
    busy = _devices_still_in_use([], [])
    own = {(w["node"], int(i)) for w in kept for i, share in w["taken"] if share >= 1}  # a half core is shared
    expected = {(node.name, i) for i in range(int(node.capacity_cpus))} - own
    assert expected and {key for key, job in busy.items() if job == elastic.pk} == expected


def test_a_job_admitted_onto_devices_a_run_shrunk_earlier_still_holds_says_it_waits_for_the_shrink(api, backend):
    """The reason said the run would "checkpoint and stop" when it was shrinking, not stopping (it had been shrunk in
    an earlier cycle and still had its extra worker)."""
    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", accelerator_types=["nvidia-h100"], workers_min=1, workers_max=2,
                          hyperparameters={"steps": 1000}), backend)
    assert elastic.state == "RUNNING" and len(elastic.placement) == 2
    TrainingJob.objects.filter(pk=elastic.pk).update(placement=elastic.placement[:1],
                                                     observed_nodes=[w["node"] for w in elastic.placement])
    later = submit(client, name="later", accelerator_types=["nvidia-h100"], workers_min=1, workers_max=1)
    assert later.state == "ADMITTED" and later.waits_for == [elastic.pk], (later.state, later.state_reason)
    assert later.state_reason.endswith(f"launches once job {elastic.pk} checkpoints and shrinks"), later.state_reason


def test_a_job_does_not_take_the_share_of_a_core_a_shrinking_run_still_uses(api, backend, world):
    """Two 0.5-core workers shared core 0; after a shrink the kept one is on core 0 and the shed one still runs there.
    Core 0 counted as the run's own, so a new 0.5-core job went onto its other half and launched at once (review)."""
    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", accelerator_types=["cpu"], devices_per_worker=0,
                          cpus_per_worker=0.5, workers_min=1, workers_max=2, hyperparameters={"steps": 1000}),
                   backend)
    assert {index for w in elastic.placement for index, _ in w["taken"]} == {0}  # both on core 0
    TrainingJob.objects.filter(pk=elastic.pk).update(placement=elastic.placement[:1],
                                                     observed_nodes=[w["node"] for w in elastic.placement])
    later = submit(client, name="later", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=0.5,
                   workers_min=1, workers_max=1)
    taken = {(w["node"], index) for w in later.placement for index, _ in w["taken"]}
    shared = (elastic.placement[0]["node"], 0)
    assert shared not in taken or later.waits_for == [elastic.pk], (later.placement, later.waits_for)
    assert not later.compute_handle or shared not in taken


def test_a_run_shrunk_again_while_still_leaving_a_node_keeps_that_node_held(api, backend, world):
    """A run shrunk in this cycle was left out of the still-shrinking check, so the devices of a node it was still
    leaving from an earlier shrink were not held (review)."""
    from controlplane.scheduling.placement import WorkerPlacement
    from jobs.admission import _devices_still_in_use

    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", accelerator_types=["nvidia-h100"], devices_per_worker=4,
                          workers_min=1, workers_max=4, hyperparameters={"steps": 1000}), backend)
    workers = elastic.placement
    assert len(workers) == 4 and len({w["node"] for w in workers}) == 2
    first, second = sorted({w["node"] for w in workers})
    kept = [w for w in workers if w["node"] == first] + [w for w in workers if w["node"] == second][:1]
    TrainingJob.objects.filter(pk=elastic.pk).update(placement=kept, observed_nodes=[w["node"] for w in workers])
    elastic = TrainingJob.objects.get(pk=elastic.pk)  # shrunk before to 3; now it gives one worker on `first` back
    released = (WorkerPlacement(kept[0]["node"], tuple((int(i), float(s)) for i, s in kept[0]["taken"])),)
    busy = _devices_still_in_use([], [(elastic, released)])
    leaving = {(second, int(i)) for w in workers if w["node"] == second and w not in kept for i, _ in w["taken"]}
    assert leaving and all(busy.get(key) == elastic.pk for key in leaving), busy


def test_an_elastic_auto_job_starts_no_narrower_than_its_layout_fits_device_memory(api, backend, world):
    """QA (2026-11-28): an elastic job (1..8 workers x 1 H100) planned at 8 devices as DP8 with ZeRO-1 was admitted on
    1 H100, where the same layout needs 121 GB of 80. Its minimum is now the fewest workers the layout fits."""
    from django.test import Client

    from controlplane.cluster.plans import plan_estimate

    client = api("alpha", "member")
    job = submit(client, name="elastic-auto", accelerator_types=["nvidia-h100"], devices_per_worker=1, workers_min=1,
                 workers_max=8, parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 8})
    h100 = job.parallel_plan["by_type"]["nvidia-h100"]
    assert (h100["dp"], h100["tp"], h100["pp"]) == (8, 1, 1) and not job.parallel_plan["model_parallel"]
    fewest = h100["fewest_devices"]
    assert (job.workers_min, job.workers_max) == (fewest, 8), (fewest, job.workers_min)
    assert job.parallel_plan["min_workers_by_plan"] == (
        f"the best layouts need at least {fewest} devices to fit device memory: the gang starts at {fewest} "
        "workers, not 1")
    # one H100 holds no layout at all (the planner's own answer); two hold DP2 with ZeRO-2, full recompute
    one = plan_estimate(model="llama2-7b", global_batch_size=8, devices=[{"accelerator_type": "nvidia-h100",
                                                                         "count": 1}])
    assert fewest == 2 and not one["feasible"] and "needs at least 121 GB" in one["reason"], one["reason"]
    admitted = client.get(f"/api/v1/training-jobs/{job.pk}/").json()
    assert admitted["status"]["state"] in ("ADMITTED", "STARTING"), admitted["status"]
    assert len(TrainingJob.objects.get(pk=job.pk).placement) >= fewest
    browser = Client()
    browser.force_login(world["alpha"]["member"])
    assert "Smallest gang set by the plan" in browser.get(f"/jobs/{job.pk}/").content.decode()


def _auto_gang(model, batch: int, workers: int, per_worker: int):
    from jobs.planning import gang_size_from_plan, plan_job_parallelism

    plan = plan_job_parallelism(parallelism={"mode": "auto", "model": model, "global_batch_size": batch},
                                accelerator_types=["nvidia-h100"], workers=workers, devices_per_worker=per_worker)
    return plan, gang_size_from_plan(plan, workers_min=1, workers_max=workers, devices_per_worker=per_worker)


def test_the_plans_minimum_gang_counts_widths_that_are_not_whole_nodes(demo_cluster):
    """A review found widths over one node that are not whole nodes skipped (16 workers x 3 H100: 9, 12, ... never
    tried), so a gang that fits on 3 workers was told to start at 8. Such widths are planned one worker per node."""
    plan, (workers_min, _) = _auto_gang({"preset": "llama2-13b", "layers": 48}, 144, 16, 3)
    assert not plan["model_parallel"]
    assert workers_min <= 3 and plan["by_type"]["nvidia-h100"]["fewest_devices"] <= 9, plan.get("min_workers_by_plan")


def test_the_plans_minimum_gang_is_about_memory_not_how_the_batch_splits(demo_cluster):
    """A review found a batch of 509 (prime) reported as needing 509 devices "to fit device memory": every narrower
    width failed because 509 does not split over it. Memory is the question; the batch is rounded up for it."""
    _, (even, _) = _auto_gang("llama2-7b", 510, 512, 1)
    plan, (odd, workers_max) = _auto_gang("llama2-7b", 509, 512, 1)
    assert even == odd == 2 and workers_max == 509, (even, odd, workers_max, plan.get("min_workers_by_plan"))


def test_tensor_parallelism_stays_inside_a_worker_when_workers_are_smaller_than_a_node(demo_cluster):
    """2 x 4 H100 (one node's worth) was planned as one node of 8, and QA saw TP8 chosen while the scheduler put the
    two workers on two nodes. TP now stays inside a worker's 4 devices; whole-node workers may still use TP8."""
    plan, _ = _auto_gang("llama2-7b", 1, 2, 4)
    assert plan["by_type"]["nvidia-h100"]["tp"] <= 4, plan["by_type"]["nvidia-h100"]["description"]
    # a TP degree divides a worker's devices: TP4 across two 6-device workers (a review), TP2 across 3-device ones
    for model, batch, workers, per_worker in (("llama2-70b", 64, 4, 6), ("llama2-13b", 8, 2, 3)):
        plan, _ = _auto_gang(model, batch, workers, per_worker)
        summary = plan["by_type"]["nvidia-h100"]
        assert per_worker % summary["tp"] == 0, (per_worker, summary["description"])
    plan, _ = _auto_gang("llama2-70b", 1, 4, 8)
    assert plan["by_type"]["nvidia-h100"]["tp"] == 8, plan["by_type"]["nvidia-h100"]["description"]


def test_a_type_whose_pool_has_no_link_figures_says_what_the_operator_sets(demo_cluster, world, accel):
    """QA: a job accepting L40S was refused with "devices[0]: ...; give intra_node_gbps and inter_node_gbps", fields a
    job's parallelism block does not have."""
    from controlplane.cluster.services import node_pool_create
    from jobs.planning import plan_job_parallelism

    node_pool_create(actor=world["ops"], name="l40s-pool", accelerator_type=accel["nvidia-l40s"], devices_per_node=8,
                     simulated=True)
    plan = plan_job_parallelism(parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 64},
                                accelerator_types=["nvidia-h100", "nvidia-l40s"], workers=2, devices_per_worker=8)
    why = plan["cannot_run"]["nvidia-l40s"]
    assert why.startswith("node pool 'l40s-pool' has no link bandwidth to plan with (") and why.endswith(
        "an operator sets intra_node_gbps and inter_node_gbps on the pool"), why
    assert "devices[0]" not in why and set(plan["by_type"]) == {"nvidia-h100"}
    # one worker is one node: no bandwidth between nodes needed (L40S has an assumed one inside a node; a review)
    one = plan_job_parallelism(parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 64},
                               accelerator_types=["nvidia-l40s"], workers=1, devices_per_worker=8)
    assert set(one["by_type"]) == {"nvidia-l40s"}, one["cannot_run"]


def test_a_type_the_planner_cannot_model_is_dropped_in_its_own_words(demo_cluster):
    """cannot_run read "devices[0]: kunlun-p800: ...", the index of a list the job never sent (QA); the CLI's plan
    now prints why a type was dropped."""
    import io

    from rich.console import Console

    from fleetyard.cli import _Cli
    from jobs.planning import plan_job_parallelism

    plan = plan_job_parallelism(parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 64},
                                accelerator_types=["nvidia-h100", "kunlun-p800"], workers=1, devices_per_worker=8)
    why = plan["cannot_run"]["kunlun-p800"]
    assert why.startswith("kunlun-p800: no published bf16_dense_tflops"), why
    cli = _Cli.__new__(_Cli)
    cli.out = Console(file=io.StringIO(), width=200, emoji=False)
    cli._print_plan({"plan": {"name": "j", "kind": "training_job", "options": [], "notes": [],
                              "parallel_plan_cannot_run": plan["cannot_run"]}})
    assert "Cannot run the model on kunlun-p800: kunlun-p800: no published" in cli.out.file.getvalue()


def test_an_elastic_run_gives_back_the_worker_on_the_node_a_preemptor_needs(api, backend, world):
    """Its first worker sat on the only node that could be freed for a whole-node preemptor: the run was stopped and
    requeued (a shrink gave back its last workers, on the other node). Now it gives back that worker and runs on."""
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    first = sync(submit(client, name="first", priority="urgent", devices_per_worker=4, workers_min=1, workers_max=1,
                        hyperparameters={"steps": 1000}), backend)
    elastic = sync(submit(client, name="elastic", devices_per_worker=4, workers_min=1, workers_max=2,
                          hyperparameters={"steps": 1000}), backend)
    second = sync(submit(client, name="second", priority="urgent", devices_per_worker=4, workers_min=1,
                         workers_max=1, hyperparameters={"steps": 1000}), backend)
    assert [w["node"] for w in elastic.placement] == ["h100-pool-0", "h100-pool-1"]  # beside first, then second
    assert [w["node"] for w in first.placement + second.placement] == ["h100-pool-0", "h100-pool-1"]
    with TestCase.captureOnCommitCallbacks(execute=True):
        assert client.post(f"/api/v1/training-jobs/{first.pk}/cancel/").status_code == 200
    first = sync(first, backend)
    assert first.state == "CANCELLED"
    # a whole h100 node: only h100-pool-0 can be freed (second, as urgent, keeps its half of h100-pool-1)
    urgent = submit(client, name="urgent", priority="urgent", devices_per_worker=8, workers_min=1, workers_max=1)
    elastic = TrainingJob.objects.get(pk=elastic.pk)
    assert elastic.state == "RUNNING", elastic.state_reason
    assert elastic.placement == [{"node": "h100-pool-1", "taken": [[i, 1.0] for i in range(4)]}]
    assert urgent.state == "ADMITTED" and urgent.waits_for == [elastic.pk], urgent.state_reason
    # the preemptor named as a job (it read "shrunk to 1 workers for 4 (lower priority)"; QA)
    assert elastic.events.filter(reason=f"shrunk to 1 workers for job {urgent.pk} (lower priority)").exists()
    assert [w["node"] for w in urgent.placement] == ["h100-pool-0"]
    elastic = sync(elastic, backend)  # the run is told to checkpoint and shrink onto the worker it keeps
    assert backend.runs[elastic.compute_handle].nodes == ["h100-pool-1"]
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    elastic = sync(elastic, backend)
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    urgent = TrainingJob.objects.get(pk=urgent.pk)
    assert urgent.state == "STARTING" and backend.runs[urgent.compute_handle].nodes == ["h100-pool-0"]


def test_the_in_memory_backend_stamps_true_times(api, backend):
    """Under scripts/up --no-ray a job created at 11:42 showed started_at 10:42, its logs and metrics recorded at
    10:42, and goodput wall_s 3602 s for a 2-second job: the simulated runs' clock started an hour in the past (so
    that their 0.1 s steps never ran ahead of real time). Now it starts at the backend's now and never runs past it."""
    from django.utils import timezone

    before = timezone.now()
    job = submit(api("alpha", "member"))
    job = sync(sync(sync(job, backend), backend), backend)
    after = timezone.now()
    assert job.state == "SUCCEEDED"
    assert before <= job.started_at <= after, (before, job.started_at, after)
    for model in (TrainingMetric, TrainingLogLine):
        times = list(model.objects.filter(job=job).values_list("recorded_at", flat=True))
        assert times and before <= min(times) and max(times) <= after, (model, min(times), max(times))
    goodput = api("alpha", "member").get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]["goodput"]
    assert 0 <= goodput["wall_s"] <= (after - before).total_seconds() + 1e-3, goodput


def test_the_in_memory_backends_clock_can_be_set(api, backend):
    """Tests may fix the backend's now: a run's simulated steps (0.1 s each) then stop at it, and a later now lets
    them move on (the clock never goes back)."""
    now = [1_000_000.0]
    backend.now = lambda: now[0]
    job = submit(api("alpha", "member"))
    report = backend.observe_training(job.compute_handle, since=0)
    assert {event["at"] for event in report.events} == {1_000_000.0}
    now[0] += 2.0
    report = backend.observe_training(job.compute_handle, since=report.events[-1]["seq"])
    steps = [event["at"] for event in report.events if event["type"] == "metric" and event["rank"] == 0]
    assert steps[0] == pytest.approx(1_000_000.1) and steps[-1] == pytest.approx(1_000_002.0)
    assert steps == sorted(steps)


def test_a_nul_character_in_a_runs_output_is_replaced_and_the_report_still_applies(api, backend):
    """A user's entrypoint may print a NUL (`printf 'a\\0b'`), and the line, a fault's evidence or the reason it fails
    for carry it as is: PostgreSQL refuses NUL in text and jsonb, so the report failed to apply on every sync and the
    job's cursor, logs, metrics and state stayed where they were for good (QA; a 0 byte read back as U+FFFD)."""
    from controlplane.compute.base import TrainingReport

    job = sync(submit(api("alpha", "member"), trainer="entrypoint", entrypoint="python train.py",
                      hyperparameters={}), backend)
    cursor = job.events_cursor
    events = (
        {"seq": cursor + 1, "type": "log", "rank": 0, "line": "loss\x00 3.2", "at": 1.0e9},
        {"seq": cursor + 2, "type": "fault", "kind": "worker_crash", "rank": 0, "node": "h100-pool-0", "step": 3,
         "evidence": "worker failed: bad\x00byte", "data": {"tail\x00": ["x\x00"]}, "at": 1.0e9,
         "occurred_at": 1.0e9, "detected_at": 1.0e9},
        {"seq": cursor + 3, "type": "state", "state": "failed", "reason": "exit\x00 1", "at": 1.0e9},
    )
    workflows._apply_report(job.pk, TrainingReport(handle=job.compute_handle, state="failed", step=3, events=events))
    job.refresh_from_db()
    assert job.events_cursor == cursor + 3
    assert job.state == "FAILED" and job.state_reason == "training failed: exit\ufffd 1"
    assert TrainingLogLine.objects.filter(job=job).order_by("id").last().line == "loss\ufffd 3.2"
    fault = TrainingFault.objects.get(job=job)
    assert fault.evidence == "worker failed: bad\ufffdbyte" and fault.data == {"tail\ufffd": ["x\ufffd"]}


def test_a_checkpoint_request_for_a_run_that_vanished_is_a_409_not_a_500(api, backend):
    """A job still RUNNING in the database whose run is gone (the sync relaunches it on its next pass): the backend's
    LookupError went up as a 500, and nothing said to ask again."""
    from controlplane.tenancy.models import AuditEvent

    client = api("alpha", "member")
    job = sync(submit(client), backend)
    assert job.state == "RUNNING"
    backend.release_training(job.compute_handle)
    response = client.post(f"/api/v1/training-jobs/{job.pk}/checkpoints/", format="json")
    assert response.status_code == 409, response.content[:300]
    assert "run is not there now" in response.json()["state"][0]
    assert not AuditEvent.objects.filter(action="training_job.checkpoint").exists()


def test_a_held_preemptor_whose_node_is_cordoned_is_placed_again_not_launched_there(api, backend, world):
    """A preemptor holding its admission while its victim stopped was launched, once the victim had gone, onto the
    node an operator had cordoned meanwhile (new work where none may go), to be moved off it after a checkpoint. Its
    admission is now withdrawn and the cycle places it again."""
    from controlplane.cluster.services import node_set_cordoned
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    for name in ("a", "b"):
        sync(submit(client, name=name, workers_min=1, workers_max=1, hyperparameters={"steps": 1000}), backend)
    urgent = submit(client, name="urgent", workers_min=1, workers_max=1, priority="urgent")
    assert urgent.state == "ADMITTED" and urgent.waits_for
    node = urgent.placement[0]["node"]
    node_set_cordoned(actor=world["ops"], node=Node.objects.get(name=node), cordoned=True, reason="maintenance")
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    urgent = TrainingJob.objects.get(pk=urgent.pk)
    assert node not in [w["node"] for w in urgent.placement], urgent.placement
    assert any(e.reason == f"admission withdrawn before it launched: {node} is cordoned or not healthy; waiting to "
               "be admitted again" for e in urgent.events.all())
    for _ in range(2):
        with TestCase.captureOnCommitCallbacks(execute=True):
            tasks.sync_training_jobs()
    urgent = TrainingJob.objects.get(pk=urgent.pk)
    assert urgent.state in ("STARTING", "RUNNING") and node not in backend.runs[urgent.compute_handle].nodes


def test_a_held_preemptors_reason_still_says_its_victim_shrinks_after_the_launch_sweep(api, backend, world):
    """The sync pass retries the launch of every job ADMITTED for over 30 s; for a preemptor whose elastic victim was
    still shrinking it rewrote the reason to "admitted; launches once job 1 checkpoints and stops" (the victim runs
    on, smaller, and the size held was dropped)."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    elastic = sync(submit(client, name="elastic", workers_min=1, workers_max=2,
                          hyperparameters={"steps": 1000}), backend)
    urgent = submit(client, name="urgent", workers_min=1, workers_max=1, priority="urgent")
    expected = f"admitted (1 x 8 nvidia-h100 held); launches once job {elastic.pk} checkpoints and shrinks"
    assert urgent.state_reason == expected
    TrainingJob.objects.filter(pk=urgent.pk).update(state_changed_at=timezone.now() - timedelta(minutes=5))
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()  # tells the run to shrink, and retries the stale launch: still shrinking
    urgent = TrainingJob.objects.get(pk=urgent.pk)
    assert urgent.state == "ADMITTED" and urgent.state_reason == expected, urgent.state_reason


def test_a_cancelled_runs_devices_go_to_the_next_job_only_once_its_run_has_stopped(api, backend):
    """Cancelling a running job moved it to CANCELLED and queued its stop and a cycle: a cycle that ran before the stop
    (a busy broker, a stop being retried) launched the next job onto devices the cancelled run still held. Now it is
    admitted onto them and held until the stop has released the run (noticed at stop 30)."""
    from jobs.services import training_job_cancel

    client = api("alpha", "member")
    running = sync(submit(client, name="first"), backend)
    assert running.state == "RUNNING" and running.compute_handle in backend.list_training_handles()
    waiting = submit(client, name="second")
    assert waiting.state == "QUEUED"
    with TestCase.captureOnCommitCallbacks(execute=False) as queued:  # the stop and the cycle wait in the broker
        training_job_cancel(actor=running.created_by, job=running, reason="not needed")
    assert len(queued) == 2
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()  # the cycle runs first
    waiting = TrainingJob.objects.get(pk=waiting.pk)
    assert waiting.state == "ADMITTED" and waiting.waits_for == [running.pk], (waiting.state, waiting.state_reason)
    assert waiting.compute_handle == "" and waiting.state_reason.endswith(
        f"launches once job {running.pk} (cancelled) has stopped"), waiting.state_reason
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_launch(job_id=waiting.pk, backend=backend)  # the sweep's retry: still held
    assert TrainingJob.objects.get(pk=waiting.pk).state == "ADMITTED"
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.stop_training_run(running.pk, checkpoint=False, reason="cancelled")  # then the stop
    cancelled = TrainingJob.objects.get(pk=running.pk)
    assert cancelled.runtime_state == "stopped" and running.compute_handle not in backend.list_training_handles()
    assert TrainingJob.objects.get(pk=waiting.pk).state == "STARTING"  # the stop's cycle launched it


def test_a_cancelled_runs_stop_that_never_got_through_is_released_by_the_orphan_reconciler(api, backend):
    from jobs.admission import victims_still_stopping
    from jobs.services import training_job_cancel

    running = sync(submit(api("alpha", "member"), name="first"), backend)
    with TestCase.captureOnCommitCallbacks(execute=False):
        training_job_cancel(actor=running.created_by, job=running)
    assert victims_still_stopping([running.pk]) == [running.pk]
    workflows.reconcile_orphan_runs(backend=backend)  # stops it ...
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.reconcile_orphan_runs(backend=backend)  # ... and releases it once stopped
    assert TrainingJob.objects.get(pk=running.pk).runtime_state == "stopped"
    assert victims_still_stopping([running.pk]) == []
