"""Real step times refine the scheduler's efficiency matrix (issue 3, jobs/efficiency.py): a class measured on real
nodes is ranked by what it measured, not by the chip-TFLOPS prior; simulated runs never count."""

from __future__ import annotations

import datetime as dt

from django.test import TestCase
from django.utils import timezone

from controlplane.cluster.models import Node, NodePool
from jobs.admission import efficiency_matrix, type_preference
from jobs.efficiency import job_workload_class, measured_throughputs, workload_class_of
from jobs.models import TrainingJob, TrainingMetric
from tests.conftest import JOB_BODY

ENTRYPOINT = "python train.py --model big"


def submit(client, **overrides) -> TrainingJob:
    body = {**JOB_BODY, "workers_min": 1, "workers_max": 1, "trainer": "entrypoint", "entrypoint": ENTRYPOINT,
            **overrides}
    with TestCase.captureOnCommitCallbacks(execute=False):
        response = client.post("/api/v1/training-jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def ran(job: TrainingJob, accelerator_type: str, node: str, *, step_s: float, steps: int = 12) -> None:
    """The record a finished run leaves: its type, node and one metric row per step (steps 0-2 are warm-up)."""
    TrainingJob.objects.filter(pk=job.pk).update(state="SUCCEEDED", admitted_accelerator_type=accelerator_type,
                                                 placement=[{"node": node, "taken": [[0, 1.0]]}],
                                                 observed_nodes=[node])
    now = timezone.now()
    TrainingMetric.objects.bulk_create([
        TrainingMetric(job=job, step=step, worker=0, recorded_at=now + dt.timedelta(seconds=step),
                       step_time_s=step_s * 4 if step < 3 else step_s) for step in range(steps)])


def make_real(*pools: str) -> None:
    NodePool.objects.filter(name__in=pools).update(simulated=False)
    Node.objects.filter(pool__name__in=pools).update(simulated=False)


def test_workload_classes_group_jobs_that_do_the_same_work_per_step():
    same = workload_class_of(trainer="entrypoint", entrypoint=f"  {ENTRYPOINT} ")
    assert same == workload_class_of(trainer="entrypoint", entrypoint=ENTRYPOINT)
    assert same != workload_class_of(trainer="entrypoint", entrypoint="python other.py")
    small = workload_class_of(trainer="builtin-transformer-lm", hyperparameters={"batch_size": 8})
    assert small.startswith("builtin_lm:") and small != workload_class_of(trainer="builtin-transformer-lm",
                                                                          hyperparameters={"batch_size": 16})


def test_the_builtin_class_is_parsed_once_per_set_of_hyperparameters(monkeypatch):
    """The scheduling cycle asks every waiting job's class in every cycle; parsing and checking the model shape each
    time was a quarter of loading the snapshot. Equal hyperparameters (keys in any order) share one parse; an invalid
    set is still the plain class; a value JSON cannot hold is parsed as it is."""
    from jobs.runtime import lm_config

    parsed = []
    original = lm_config.TrainHyperparameters.from_dict
    monkeypatch.setattr(lm_config.TrainHyperparameters, "from_dict",
                        classmethod(lambda cls, data: parsed.append(dict(data)) or original.__func__(cls, data)))
    first = workload_class_of(trainer="builtin-transformer-lm", hyperparameters={"batch_size": 24, "context": 48})
    again = workload_class_of(trainer="builtin-transformer-lm", hyperparameters={"context": 48, "batch_size": 24})
    assert first == again and first.startswith("builtin_lm:") and len(parsed) <= 1
    assert workload_class_of(trainer="builtin-transformer-lm", hyperparameters={"batch_size": -5}) == "builtin_lm"
    assert workload_class_of(trainer="builtin-transformer-lm", hyperparameters={"x": {1, 2}}).startswith("builtin_lm")


def test_measured_step_times_on_real_nodes_decide_the_type_choice(api, demo_cluster):
    client = api("alpha", "member")
    workload_class = job_workload_class(submit(client, name="probe"))
    prior = type_preference(workload_class=workload_class, accepted=["nvidia-h100", "nvidia-a100"])
    assert all("prior from chip TFLOPS" in choice.reason for choice in prior)
    # measured: this program's step is 8x faster on the H100 pool than on the A100 pool
    make_real("h100-pool", "a100-pool")
    ran(submit(client, name="on-h100"), "nvidia-h100", "h100-pool-0", step_s=0.25)
    ran(submit(client, name="on-a100"), "nvidia-a100", "a100-pool-0", step_s=2.0)
    observed = {(o.accelerator_type, round(o.units_per_second, 4)) for o in measured_throughputs()}
    assert observed == {("nvidia-h100", 0.5), ("nvidia-a100", 0.0625)}  # 1 / (step time x 8 devices)
    choices = type_preference(workload_class=workload_class, accepted=["nvidia-a100", "nvidia-h100"])
    assert [c.accelerator_type for c in choices] == ["nvidia-h100", "nvidia-a100"]
    assert not any("prior" in c.reason for c in choices)
    assert efficiency_matrix().source(workload_class, "nvidia-h100") == "measured"
    # another program is still ranked by the priors
    other = workload_class_of(trainer="entrypoint", entrypoint="python other.py")
    assert efficiency_matrix().source(other, "nvidia-h100") == "prior"


def test_runs_on_simulated_chips_or_with_too_few_steps_do_not_count(api, demo_cluster):
    client = api("alpha", "member")
    ran(submit(client, name="simulated"), "nvidia-h100", "h100-pool-0", step_s=0.25)  # the demo pools are simulated
    make_real("a100-pool")
    ran(submit(client, name="short"), "nvidia-a100", "a100-pool-0", step_s=0.5, steps=6)  # 3 rows after warm-up
    assert measured_throughputs() == []


def test_the_cycle_reads_observations_again_when_a_measured_job_changes(api, demo_cluster, monkeypatch):
    from jobs import efficiency

    reads = []
    real = efficiency.measured_throughputs
    monkeypatch.setattr(efficiency, "measured_throughputs", lambda: reads.append(1) or real())
    efficiency._cache.clear()
    client = api("alpha", "member")
    make_real("h100-pool")
    assert efficiency.cached_measured_throughputs() == [] and efficiency.cached_measured_throughputs() == []
    assert len(reads) == 1  # unchanged: read once
    ran(submit(client, name="on-h100"), "nvidia-h100", "h100-pool-0", step_s=0.25)
    assert [o.accelerator_type for o in efficiency.cached_measured_throughputs()] == ["nvidia-h100"]
    assert len(reads) == 2
