"""Issue 8, Q3 and Q4: quota and gangs when launches fail or capacity is short, on the in-memory backend.

Q3: a launch that fails after quota was reserved gives the quota back and records the reason.
Q4: a gang of N workers where only N-1 fit starts nothing until all N fit.
"""

from __future__ import annotations

import pytest
from celery.exceptions import Retry
from django.test import TestCase

from controlplane.cluster.services import nodes_sync
from controlplane.compute.base import ObservedNode
from controlplane.compute.memory import InMemoryComputeBackend
from controlplane.compute.topology import load_topology
from jobs import tasks, workflows
from jobs.admission import run_cycle
from jobs.models import TrainingJob
from jobs.selectors import quota_usage
from jobs.services import training_job_create
from jobs.states import JobState


@pytest.fixture
def backend(monkeypatch, settings, tmp_path, demo_cluster):
    settings.DATA_DIR = tmp_path
    fake = InMemoryComputeBackend.from_topology(load_topology())
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: fake)
    return fake


def _job(world, name: str, *, workers: int, devices: int = 8) -> TrainingJob:
    alpha = world["alpha"]
    with TestCase.captureOnCommitCallbacks(execute=True):
        job = training_job_create(actor=alpha["member"], team=alpha["team"], name=name, local_queue=alpha["queue"],
                                  accelerator_types=["nvidia-h100"], workers_min=workers, workers_max=workers,
                                  devices_per_worker=devices, hyperparameters={"steps": 50})
    return TrainingJob.objects.get(pk=job.pk)


def test_q3_a_launch_that_keeps_failing_fails_the_job_and_gives_its_quota_back(world, backend, monkeypatch):
    def refuse(launch):
        raise RuntimeError("the placement group was refused")

    monkeypatch.setattr(backend, "launch_training", refuse)
    with pytest.raises((RuntimeError, Retry)):  # the launch task records the failure and asks to be retried
        _job(world, "doomed", workers=2)  # admitted and launched in the submit's own tasks: the launch fails
    job = TrainingJob.objects.get(name="doomed")
    assert job.state == JobState.STARTING
    held = quota_usage()[("shared", "nvidia-h100")]
    assert held == 16
    tries = 1
    while job.state == JobState.STARTING:
        try:
            with TestCase.captureOnCommitCallbacks(execute=True):
                job = workflows.training_job_sync(job_id=job.pk, backend=backend)  # the reconciler tries again
        except RuntimeError:
            job = TrainingJob.objects.get(pk=job.pk)
        tries += 1
        assert tries <= workflows.LAUNCH_TRIES + 1
    assert job.state == JobState.FAILED and tries == workflows.LAUNCH_TRIES
    assert "the placement group was refused" in job.state_reason and "quota is released" in job.state_reason
    failures = job.events.filter(data__launch_failed=True).count()
    assert failures == workflows.LAUNCH_TRIES
    assert quota_usage().get(("shared", "nvidia-h100"), 0) == 0
    print(f"\nQ3: {failures} failed launches recorded, then FAILED; quota held {held:g} -> 0 devices")

    monkeypatch.setattr(backend, "launch_training", InMemoryComputeBackend.launch_training.__get__(backend))
    follower = _job(world, "next", workers=2)
    assert follower.state == JobState.STARTING, "the freed quota goes to the next workload"


def test_q4_a_gang_that_does_not_fit_whole_starts_nothing_until_it_does(world, backend):
    from controlplane.quotas.models import ResourceQuota

    # Quota for 32 chips, so only capacity holds it back: the demo cluster has two 8-chip H100 nodes.
    ResourceQuota.objects.filter(cluster_queue=world["cluster_queue"], accelerator_type__slug="nvidia-h100").update(
        nominal_quota=32)
    job = _job(world, "three-nodes", workers=3)
    assert job.state == JobState.QUEUED and not job.placement and not job.compute_handle
    assert backend.list_training_handles() == []
    assert quota_usage().get(("shared", "nvidia-h100"), 0) == 0
    print(f"\nQ4: waiting because: {job.state_reason}")
    for _ in range(3):
        with TestCase.captureOnCommitCallbacks(execute=True):
            run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and backend.list_training_handles() == []

    extra = ObservedNode(node_id="n-extra", name="h100-pool-2", pool="h100-pool", accelerator_type="nvidia-h100",
                         leaf_group="lg-h100-a", alive=True, simulated=True,
                         capacity={"accel:nvidia-h100": 8, "CPU": 1}, free={"accel:nvidia-h100": 8, "CPU": 1})
    nodes_sync(observed=[*backend.list_nodes(), extra])
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()
    job.refresh_from_db()
    assert job.state in (JobState.ADMITTED, JobState.STARTING) and len(job.placement) == 3
    print(f"\nQ4: a 3 x 8 gang on 2 nodes waited ({len(job.placement)} workers placed only once a third node joined)")
