"""Step times measured on real hardware refine the planner's achievable fraction (issue 9, jobs/calibration.py):
the plan endpoint and `parallelism: auto` use the refined figure and say where it comes from; runs on simulated
chips, the built-in trainer and runs with too few steps do not count."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import TestCase
from django.utils import timezone

from controlplane.cluster.models import Node, NodePool
from controlplane.planning import DevicePool, Layout, PlanRequest
from controlplane.planning.calibration import predicted_step_s
from controlplane.planning.model import (
    CALIBRATED_ACHIEVABLE_FRACTION,
    DEFAULT_ACHIEVABLE_FRACTION,
    device_type_from_facts,
)
from controlplane.planning.presets import model_spec
from jobs.calibration import measured_fractions
from jobs.models import TrainingJob, TrainingMetric
from tests.conftest import JOB_BODY

PLAN = {"mode": "auto", "model": "llama2-7b", "global_batch_size": 64}
PRIOR = CALIBRATED_ACHIEVABLE_FRACTION["nvidia-h100"]  # fitted on Llama 3 Table 4 (published_runs.json)
PUBLISHED = "calibrated on published nvidia-h100 training runs"


def submit(client, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "accelerator_types": ["nvidia-h100"], "workers_min": 1, "workers_max": 1,
            "trainer": "entrypoint", "entrypoint": "python train.py", "parallelism": PLAN, **overrides}
    with TestCase.captureOnCommitCallbacks(execute=False):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def step_time_at(job: TrainingJob, accel, fraction: float) -> float:
    """What the cost model predicts for the job's stored layout at `fraction`: the run 'measured' this."""
    plan = job.parallel_plan["by_type"]["nvidia-h100"]
    device = device_type_from_facts({"slug": "nvidia-h100", "bf16_dense_tflops": accel.bf16_dense_tflops,
                                     "fp8_dense_tflops": accel.fp8_dense_tflops, "memory_gb": accel.memory_gb,
                                     "memory_bandwidth_gbps": accel.memory_bandwidth_gbps})
    shape = plan["pool"]
    pool = DevicePool(device=device, nodes=1, devices_per_node=shape["devices_per_node"],
                      intra_node_gbps=shape["intra_node_gbps"], inter_node_gbps=shape["inter_node_gbps"])
    request = PlanRequest(model=model_spec("llama2-7b"), global_batch_size=64, pools=(pool,))
    return predicted_step_s(request, Layout.from_dict(plan["layout"]), "nvidia-h100", fraction)


def ran(job: TrainingJob, *, nodes: list[str], step_s: float, steps: int = 12) -> None:
    """The run's record as the sync leaves it: its nodes and one metric row per step (steps 0-2 are warm-up)."""
    TrainingJob.objects.filter(pk=job.pk).update(observed_nodes=nodes, admitted_accelerator_type="nvidia-h100")
    now = timezone.now()
    TrainingMetric.objects.bulk_create([
        TrainingMetric(job=job, step=step, worker=0, recorded_at=now + dt.timedelta(seconds=step),
                       step_time_s=step_s * 5 if step < 3 else step_s * (1 + 0.01 * (step % 3 - 1)))
        for step in range(steps)])


@pytest.fixture
def real_h100(demo_cluster):
    """The demo's h100 pool as real hardware (its nodes not simulated); the a100 pool stays simulated."""
    NodePool.objects.filter(name="h100-pool").update(simulated=False)
    Node.objects.filter(pool__name="h100-pool").update(simulated=False)


def h100_plan(client) -> dict:
    response = client.post("/api/v1/plans/", {"model": "llama2-7b", "global_batch_size": 64,
                                              "devices": [{"accelerator_type": "nvidia-h100", "count": 8}]},
                           format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def test_a_real_run_refines_the_fraction_the_planner_uses_and_says_so(api, accel, real_h100):
    client = api("alpha", "member")
    before = h100_plan(client)
    assert before["pools"][0]["achievable_fraction"] == PRIOR
    assert before["pools"][0]["achievable_fraction_source"] == PUBLISHED

    job = submit(client)
    plan = job.parallel_plan["by_type"]["nvidia-h100"]
    assert plan["achievable_fraction"] == PRIOR and plan["layout"]["stages"]
    ran(job, nodes=["h100-pool-0"], step_s=step_time_at(job, accel["nvidia-h100"], 0.3))

    found = measured_fractions()["nvidia-h100"]
    assert [run["job"] for run in found.runs] == [job.pk] and found.runs[0]["step_rows"] == 9  # warm-up left out
    assert found.runs[0]["fitted"] == pytest.approx(0.3, abs=2e-3)
    expected = (PRIOR * 2 + 0.3) / 3  # the published calibration counts as two runs
    assert found.fraction == pytest.approx(expected, abs=2e-3)

    after = h100_plan(client)
    pool = after["pools"][0]
    assert pool["achievable_fraction"] == pytest.approx(expected, abs=2e-3)
    source = pool["achievable_fraction_source"]
    assert f"jobs {job.pk}" in source and "real nvidia-h100" in source and f"prior {PRIOR:g}" in source
    assert any("refined from the step times" in note for note in after["assumptions"])
    assert after["best"]["step_time_s"] > before["best"]["step_time_s"]  # slower than the published calibration
    # A job planned now is planned with the refined figure.
    assert submit(client, name="next").parallel_plan["by_type"]["nvidia-h100"]["achievable_fraction"] == \
        pytest.approx(expected, abs=2e-3)


def test_simulated_chips_the_built_in_trainer_and_short_runs_do_not_count(api, accel, real_h100):
    client = api("alpha", "member")
    simulated = submit(client, name="on-simulated")
    ran(simulated, nodes=["a100-pool-0"], step_s=step_time_at(simulated, accel["nvidia-h100"], 0.2))
    short = submit(client, name="short")
    ran(short, nodes=["h100-pool-1"], step_s=step_time_at(short, accel["nvidia-h100"], 0.2), steps=6)
    builtin = submit(client, name="builtin", trainer="builtin-transformer-lm", entrypoint="",
                     hyperparameters={"steps": 10})
    ran(builtin, nodes=["h100-pool-0"], step_s=step_time_at(builtin, accel["nvidia-h100"], 0.2))
    old_plan = submit(client, name="old-plan")  # planned before plans kept their layout
    TrainingJob.objects.filter(pk=old_plan.pk).update(parallel_plan={
        **old_plan.parallel_plan, "by_type": {"nvidia-h100": {
            k: v for k, v in old_plan.parallel_plan["by_type"]["nvidia-h100"].items() if k != "layout"}}})
    ran(old_plan, nodes=["h100-pool-0"], step_s=1.0)

    found = measured_fractions()["nvidia-h100"]
    assert found.runs == [] and found.fraction == PRIOR
    why = {entry["job"]: entry["why"] for entry in found.skipped}
    assert "simulated" in why[simulated.pk]
    assert "3 step time(s) after warm-up" in why[short.pk]
    assert "kept their layout" in why[old_plan.pk]
    assert builtin.pk not in why  # the built-in trainer is not read at all
    pool = h100_plan(client)["pools"][0]
    assert pool["achievable_fraction"] == PRIOR
    assert pool["achievable_fraction_source"] == PUBLISHED


def test_a_run_at_another_width_than_its_layout_is_skipped_not_fitted(api, accel, real_h100):
    """An elastic data-parallel job (1-8 x 1 H100, planned DP8) that ran at 2 workers was fitted against the DP8
    layout: a fraction of 0.10 on chips at 0.6, which then slowed every H100 plan by 40% (found by QA). Its step
    times are not the layout's, so it is skipped with the reason; a run at the planned width counts."""
    from jobs.models import TrainingJobEvent

    client = api("alpha", "member")
    narrow = submit(client, name="narrow", workers_min=1, workers_max=8, devices_per_worker=1)
    assert narrow.parallel_plan["by_type"]["nvidia-h100"]["dp"] == 8
    TrainingJobEvent.objects.create(subject=narrow, from_state="QUEUED", to_state="ADMITTED", reason="admitted",
                                    actor_label="scheduler", data={"workers": 2})
    ran(narrow, nodes=["h100-pool-0"], step_s=step_time_at(narrow, accel["nvidia-h100"], 0.6) * 4)
    wide = submit(client, name="wide", workers_min=1, workers_max=8, devices_per_worker=1)
    TrainingJobEvent.objects.create(subject=wide, from_state="QUEUED", to_state="ADMITTED", reason="admitted",
                                    actor_label="scheduler", data={"workers": 8})
    ran(wide, nodes=["h100-pool-0"], step_s=step_time_at(wide, accel["nvidia-h100"], 0.6))
    found = measured_fractions()["nvidia-h100"]
    assert [run["job"] for run in found.runs] == [wide.pk]
    assert found.runs[0]["fitted"] == pytest.approx(0.6, abs=2e-3)
    why = {entry["job"]: entry["why"] for entry in found.skipped}
    assert why[narrow.pk] == "ran on 2 worker(s) at times, not the 8 its plan's layout is sized for"


def test_a_layout_that_does_not_fill_its_last_worker_still_counts(api, accel, real_h100):
    """DP3 x TP2 (6 devices) of a 1 x 8 H100 job runs on its one worker: counted (a review found the first width
    check comparing devices, 8 against 6, and skipping every such run); a resize to another width is not."""
    from jobs.models import TrainingJobEvent

    client = api("alpha", "member")
    job = submit(client, name="six", parallelism={"mode": "auto", "model": "llama2-7b", "global_batch_size": 3})
    plan = job.parallel_plan["by_type"]["nvidia-h100"]
    assert plan["layout_devices"] < 8, plan["description"]
    TrainingJobEvent.objects.create(subject=job, from_state="QUEUED", to_state="ADMITTED", reason="admitted",
                                    actor_label="scheduler", data={"workers": 1})
    ran(job, nodes=["h100-pool-0"], step_s=step_time_at(job, accel["nvidia-h100"], 0.6))
    assert [run["job"] for run in measured_fractions()["nvidia-h100"].runs] == [job.pk]
    TrainingJobEvent.objects.create(subject=job, from_state="RUNNING", to_state="RUNNING", reason="grown to 2 workers",
                                    actor_label="scheduler", data={"workers": 2})
    assert measured_fractions()["nvidia-h100"].runs == []


def test_a_run_the_model_cannot_explain_is_reported_not_fitted(api, accel, real_h100):
    client = api("alpha", "member")
    job = submit(client)
    ran(job, nodes=["h100-pool-0"], step_s=1e-6)  # faster than the chip's full peak allows
    found = measured_fractions()["nvidia-h100"]
    assert found.runs == [] and "full dense peak" in found.skipped[0]["why"]


def test_h100_says_it_is_calibrated_and_a_chip_without_published_runs_says_assumed(api, accel, real_h100):
    client = api("alpha", "member")
    response = client.post("/api/v1/plans/", {"model": "llama2-7b", "global_batch_size": 64, "devices": [
        {"accelerator_type": "nvidia-h100", "count": 8}, {"accelerator_type": "nvidia-h200", "count": 8}]},
        format="json")
    assert response.status_code == 200, response.json()
    pools = {pool["accelerator_type"]: pool for pool in response.json()["pools"]}
    assert pools["nvidia-h100"]["achievable_fraction"] == PRIOR
    assert pools["nvidia-h100"]["achievable_fraction_source"] == PUBLISHED
    assert pools["nvidia-h200"]["achievable_fraction"] == DEFAULT_ACHIEVABLE_FRACTION
    assert "assumed" in pools["nvidia-h200"]["achievable_fraction_source"]
