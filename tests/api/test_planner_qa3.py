"""A third QA pass over the parallel-strategy planner as users reach it (POST /api/v1/plans/, `parallelism: auto`).
Each test fails on the code before its fix."""

from __future__ import annotations

from jobs.models import TrainingJob
from jobs.states import JobState
from tests.conftest import JOB_BODY

JOBS = "/api/v1/training-jobs/"


def _planned_job(client, name, *, workers_min, workers_max, devices_per_worker, model="llama2-7b", batch=4):
    body = {**JOB_BODY, "name": name, "accelerator_types": ["nvidia-h100"], "workers_min": workers_min,
            "workers_max": workers_max, "devices_per_worker": devices_per_worker, "hyperparameters": {"steps": 10},
            "parallelism": {"mode": "auto", "model": model, "global_batch_size": batch}}
    response = client.post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def test_a_gang_the_plan_narrows_keeps_the_plan_of_that_gang_and_a_retry_plans_the_same(api, demo_cluster):
    """1-6 workers x 2 H100 (12 devices, planned as six 2-device nodes) got DP1 x TP2 x PP4, which uses 8, so the gang
    became 4 workers; but 4 x 2 devices are planned as one node of 8, where the best layout is another (DP4 x TP2): the
    job kept a layout planned for 12 devices on another node shape than its gang's, and its retry (same spec, the sized
    gang) got a different plan. The plan is now made again at the width it sized the gang to."""
    client = api("alpha", "member")
    job = _planned_job(client, "narrowed", workers_min=1, workers_max=6, devices_per_worker=2)
    plan = job.parallel_plan
    assert (job.workers_min, job.workers_max) == (4, 4)
    assert plan["devices"] == job.workers_max * job.devices_per_worker == 8, plan["devices"]
    assert plan["sized_by_plan"].startswith("the best layouts use at most 8 of the 12 devices asked for"), plan
    same_gang = _planned_job(client, "same-gang", workers_min=4, workers_max=4, devices_per_worker=2)
    layouts = {slug: summary["layout"] for slug, summary in plan["by_type"].items()}
    assert layouts == {slug: summary["layout"] for slug, summary in same_gang.parallel_plan["by_type"].items()}
    assert plan["by_type"]["nvidia-h100"]["pool"] == same_gang.parallel_plan["by_type"]["nvidia-h100"]["pool"]

    TrainingJob.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    retried = client.post(f"{JOBS}{job.pk}/retry/", format="json")
    assert retried.status_code == 201, retried.json()
    retry = TrainingJob.objects.get(pk=retried.json()["id"])
    assert (retry.workers_min, retry.workers_max) == (job.workers_min, job.workers_max)
    assert {slug: summary["layout"] for slug, summary in retry.parallel_plan["by_type"].items()} == layouts
