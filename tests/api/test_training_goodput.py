"""ETTR accounting of training runs against the in-memory backend (whose runs report what the Ray supervisor
reports): a relaunch on new nodes (shrink, grow, move) is lost time, a job waiting for nodes is not productive
while it waits, and a job cancelled while queued after a preemption keeps its paused time (QA on Ray)."""

from __future__ import annotations

import time

import pytest
from django.test import TestCase

from controlplane.cluster.models import Node
from controlplane.compute.memory import RELAUNCH_S, InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from jobs import tasks, workflows
from jobs.models import TrainingJob
from tests.conftest import JOB_BODY


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    fake.steps_per_observe = 40
    # Simulated time on a clock an hour back that each sync moves on by a minute, so that the runs' 0.1 s steps, 1 s
    # detections and 5 s relaunches take their simulated time (on the real clock they stop at now).
    fake.test_now = [time.time() - 3600.0]
    fake.now = lambda: fake.test_now[0]
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: fake)
    monkeypatch.setattr("jobs.api.views.get_compute_backend", lambda: fake)
    return fake


def submit(client, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 2, "workers_max": 2,
            "hyperparameters": {"steps": 1000}, "checkpoint": {"interval_steps": 25}, **overrides}
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def sync(job, backend) -> TrainingJob:
    backend.test_now[0] += 60.0
    with TestCase.captureOnCommitCallbacks(execute=True):
        workflows.training_job_sync(job_id=job.pk, backend=backend)
    return TrainingJob.objects.get(pk=job.pk)


def goodput(client, job) -> dict:
    return client.get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]["goodput"]


def test_a_move_off_a_cordoned_node_is_lost_restart_time_not_productive(api, backend, world):
    from controlplane.cluster.services import node_set_cordoned

    client = api("alpha", "member")
    job = sync(submit(client, workers_min=1, workers_max=1), backend)
    node = job.observed_nodes[0]
    node_set_cordoned(actor=world["ops"], node=Node.objects.get(name=node), cordoned=True, reason="maintenance")
    job = sync(job, backend)  # asks the run to move: it checkpoints, stops and relaunches
    job = sync(job, backend)  # trains on the new node
    assert node not in job.observed_nodes and job.state == "RUNNING"
    body = goodput(client, job)
    assert body["interruptions"] == {"resize": 1}
    # from the stop until the first step on the new node; no detection (no fault), nothing redone (checkpointed)
    assert body["restart_s"] == pytest.approx(RELAUNCH_S + 0.1) and body["detection_s"] == 0.0
    assert body["recompute_s"] == 0.0 and body["ettr"] < 1.0
    assert body["productive_s"] == pytest.approx(body["wall_s"] - RELAUNCH_S - 0.1)
    assert job.restarts == 0  # a planned move is not a fault: it does not count toward max_restarts


def test_a_gang_growing_onto_freed_capacity_is_accounted_as_a_resize(api, backend, world):
    client = api("alpha", "member")
    blocker = sync(submit(client, name="blocker", workers_min=1, workers_max=1), backend)
    elastic = sync(submit(client, name="elastic", workers_min=1, workers_max=2), backend)
    with TestCase.captureOnCommitCallbacks(execute=True):
        client.post(f"/api/v1/training-jobs/{blocker.pk}/cancel/")  # frees a node; the cycle grows the gang
    elastic = sync(sync(TrainingJob.objects.get(pk=elastic.pk), backend), backend)
    assert len(elastic.observed_nodes) == 2
    body = goodput(client, elastic)
    assert body["interruptions"] == {"resize": 1} and body["restart_s"] == pytest.approx(RELAUNCH_S + 0.1)


def test_a_job_waiting_for_nodes_is_not_productive_while_it_waits(api, backend):
    client = api("alpha", "member")
    job = sync(submit(client), backend)  # needs both H100 nodes: 40 steps of 0.1 s
    backend.inject_training_fault(job.compute_handle, rank=1, fault="node_lost", node_lost=True)
    job = sync(job, backend)
    assert job.state == "RECOVERING" and "waiting for capacity" in job.state_reason
    body = goodput(client, job)
    # trained 4 s, then lost its node (detected 1 s later); everything since is lost until it trains again
    assert body["productive_s"] == pytest.approx(4.0, abs=1e-3) and body["detection_s"] == pytest.approx(1.0)
    assert body["restart_s"] == pytest.approx(body["wall_s"] - 5.0, abs=1e-3)
    assert body["interruptions"] == {"node_lost": 1} and body["ettr"] < 0.01
    assert goodput(client, job)["restart_s"] > body["restart_s"]  # and it keeps growing while it waits
    with TestCase.captureOnCommitCallbacks(execute=True):
        client.post(f"/api/v1/training-jobs/{job.pk}/cancel/")
    job = TrainingJob.objects.get(pk=job.pk)
    ended = goodput(client, job)  # cancelled while waiting: lost until the end
    assert job.state == "CANCELLED" and ended["productive_s"] == pytest.approx(4.0, abs=1e-3)
    assert ended["wall_s"] == pytest.approx(job.finished_at.timestamp() - job.started_at.timestamp())


def test_a_job_that_waited_for_a_node_and_resumed_counts_the_wait_once(api, backend, world):
    client = api("alpha", "member")
    job = sync(submit(client, workers_min=1, workers_max=1), backend)
    backend.inject_training_fault(job.compute_handle, rank=0, fault="node_lost", node_lost=True)
    job = sync(job, backend)  # re-placed on the free H100 node
    waiting = goodput(client, job)
    job = sync(sync(job, backend), backend)
    assert job.state == "RUNNING"
    body = goodput(client, job)
    assert body["interruptions"] == {"node_lost": 1} and body["detection_s"] == pytest.approx(1.0)
    assert 0 < body["restart_s"] < waiting["restart_s"] and "recovering" not in job.goodput


def test_cancelling_a_job_queued_after_a_preemption_keeps_its_paused_time(api, backend, world):
    from controlplane.quotas.services import priority_class_create

    priority_class_create(actor=world["ops"], name="urgent", value=1000)
    client = api("alpha", "member")
    victim = sync(submit(client, name="low"), backend)
    submit(client, name="urgent", priority="urgent")
    with TestCase.captureOnCommitCallbacks(execute=True):
        tasks.sync_training_jobs()
    victim = TrainingJob.objects.get(pk=victim.pk)
    assert victim.state == "QUEUED" and victim.goodput.get("paused_since")
    victim.goodput = {**victim.goodput, "paused_since": victim.goodput["paused_since"] - 30.0}  # preempted 30 s ago
    victim.save(update_fields=["goodput"])
    before = goodput(client, victim)
    assert before["pauses"] == {"preempted": 1} and before["paused_s"] >= 30.0
    with TestCase.captureOnCommitCallbacks(execute=True):
        response = client.post(f"/api/v1/training-jobs/{victim.pk}/cancel/")
    assert response.status_code == 200, response.json()
    victim = TrainingJob.objects.get(pk=victim.pk)
    after = goodput(client, victim)
    assert victim.state == "CANCELLED" and after["pauses"] == {"preempted": 1}
    # paused from the preemption until the cancel; productive only until the preemption
    assert after["paused_s"] >= before["paused_s"] and after["productive_s"] == pytest.approx(before["productive_s"])
    assert after["paused_s"] == pytest.approx(victim.finished_at.timestamp() - victim.goodput["paused_since"])
    overview = client.get("/api/v1/training-jobs/goodput/").json()
    row = next(r for r in overview["per_job"] if r["id"] == victim.pk)
    assert row["paused_s"] == pytest.approx(after["paused_s"]) and row["ettr"] == pytest.approx(after["ettr"])


def test_a_fault_during_a_relaunch_on_new_nodes_counts_both(api, backend, world):
    from controlplane.cluster.services import node_set_cordoned

    client = api("alpha", "member")
    job = sync(submit(client, workers_min=1, workers_max=1, max_restarts=5), backend)
    node_set_cordoned(actor=world["ops"], node=Node.objects.get(name=job.observed_nodes[0]), cordoned=True,
                      reason="maintenance")
    job = sync(job, backend)  # the move is under way ...
    backend.inject_training_fault(job.compute_handle, rank=0, fault="worker_crash")  # ... and crashes first
    job = sync(job, backend)
    body = goodput(client, job)
    assert body["interruptions"] == {"resize": 1, "worker_crash": 1}
    assert body["restart_s"] == pytest.approx(RELAUNCH_S + 0.1) and body["detection_s"] == pytest.approx(1.0)


def test_a_recovery_the_run_never_reports_ends_when_the_run_trains_again(api, backend):
    """A run launched again after its supervisor vanished knows nothing of the recovery it was in: the recovery ends
    when the job was running again, and stops counting at its first new step."""
    from controlplane.compute.base import TrainingReport

    client = api("alpha", "member")
    job = sync(submit(client), backend)
    t = job.started_at.timestamp() + 10.0
    events = [{"type": "fault", "kind": "hang", "rank": 0, "node": job.observed_nodes[0], "occurred_at": t,
               "detected_at": t + 2.0, "evidence": "no progress", "step": 39},
              {"type": "state", "state": "recovering", "at": t + 2.5},
              {"type": "state", "state": "running", "at": t + 7.0}]
    events = [{**e, "seq": job.events_cursor + i + 1} for i, e in enumerate(events)]
    workflows._apply_report(job.pk, TrainingReport(handle=job.compute_handle, state="running", step=39,
                                                   events=tuple(events)))
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.goodput["recovering"]["until"] == t + 7.0
    body = goodput(client, job)
    assert body["detection_s"] == pytest.approx(2.0) and body["restart_s"] == pytest.approx(5.0)
    metric = {"type": "metric", "rank": 0, "step": 40, "loss": 1.0, "at": t + 8.0, "seq": job.events_cursor + 1}
    workflows._apply_report(job.pk, TrainingReport(handle=job.compute_handle, state="running", step=40,
                                                   events=(metric,)))
    job = TrainingJob.objects.get(pk=job.pk)
    assert "recovering" not in job.goodput and goodput(client, job)["interruptions"] == {"hang": 1}
    assert goodput(client, job)["restart_s"] == pytest.approx(5.0)
