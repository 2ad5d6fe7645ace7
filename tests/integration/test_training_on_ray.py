"""Training jobs on the real multi-node local Ray cluster, submitted through the REST API.

The control plane's tasks run in this process (Celery eager); the runs are real: a gang supervisor
on the head node, one TrainingWorker per placement-group bundle pinned to the scheduler's nodes,
torch.distributed (gloo) data parallelism, checkpoints on disk. Faults are injected for real: a
worker hangs, a worker slows down, a Ray node is killed (SIGKILL of its whole process group).

This module kills a100-pool-1 in its last test; it is the last module to use the session cluster.
"""

from __future__ import annotations

import sys
import time

import pytest

from jobs import tasks
from jobs.models import TrainingFault, TrainingJob, TrainingMetric

pytestmark = [pytest.mark.ray, pytest.mark.django_db(transaction=True)]

BODY = {"name": "lm", "queue": "default", "workers_min": 2, "workers_max": 2, "devices_per_worker": 8,
        "checkpoint": {"interval_steps": 10, "keep_last": 2}, "max_restarts": 3}


@pytest.fixture
def platform(ray_backend, pools_from_ray, monkeypatch):
    """The demo pools in the database, nodes as Ray reports them, tasks talking to the real cluster."""
    monkeypatch.setattr(tasks, "get_compute_backend", lambda: ray_backend)
    yield ray_backend
    for handle in ray_backend.list_training_handles():  # nothing may outlive a test
        ray_backend.stop_training(handle, checkpoint=False)
        ray_backend.release_training(handle)


def submit(api, **overrides) -> TrainingJob:
    response = api("alpha", "member").post("/api/v1/training-jobs/", {**BODY, **overrides}, format="json")
    assert response.status_code == 201, response.json()
    return TrainingJob.objects.get(pk=response.json()["id"])


def drive(job: TrainingJob, *, until, timeout: float = 120.0, on_tick=None) -> TrainingJob:
    """Run the control plane's sync (the beat task) every half second until `until(job)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        tasks.sync_training_jobs()
        job = TrainingJob.objects.get(pk=job.pk)
        if on_tick is not None:
            on_tick(job)
        if until(job):
            return job
        assert not job.is_terminal or until(job), f"job ended {job.state}: {job.state_reason}"
        assert time.monotonic() < deadline, f"timed out in {job.state} ({job.runtime_state}): {job.state_reason}"
        time.sleep(0.5)


def test_a_job_submitted_through_the_api_trains_to_completion_on_ray(api, platform, world):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from controlplane.datasets.services import dataset_create, dataset_version_upload
    from jobs.runtime.corpus import corpus_bytes

    alpha = world["alpha"]
    dataset = dataset_create(actor=alpha["admin"], team=alpha["team"], name="tales")
    dataset_version_upload(actor=alpha["admin"], dataset=dataset, fmt="text",
                           upload=SimpleUploadedFile("tales.txt", corpus_bytes(7, 3000)))
    job = submit(api, accelerator_types=["nvidia-h100"], dataset="dataset://tales@1",
                 hyperparameters={"steps": 40, "step_sleep_s": 0.02})
    assert job.dataset_version.dataset.name == "tales"
    assert job.state == "STARTING" and job.compute_handle in platform.list_training_handles()
    job = drive(job, until=lambda j: j.is_terminal)
    assert job.state == "SUCCEEDED", job.state_reason
    assert job.current_step == 39 and job.last_checkpoint_step == 39
    assert job.observed_nodes == ["h100-pool-0", "h100-pool-1"]
    assert job.compute_handle not in platform.list_training_handles()  # released
    metrics = TrainingMetric.objects.filter(job=job)
    assert metrics.count() == 80  # 40 steps x 2 workers, each exactly once
    losses = [m.loss for m in metrics.filter(worker=0).order_by("step")]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5  # the model learns
    client = api("alpha", "member")
    checkpoints = client.get(f"/api/v1/training-jobs/{job.pk}/checkpoints/").json()
    assert [c["step"] for c in checkpoints] == [29, 39]  # keep_last=2
    logs = client.get(f"/api/v1/training-jobs/{job.pk}/logs/?limit=1000").json()["results"]
    assert any("step 25 loss" in line["line"] for line in logs)
    assert any("bytes of text from" in line["line"] and "tales.txt" in line["line"] for line in logs)
    assert client.get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]["goodput"]["ettr"] == 1.0


def test_a_slow_worker_and_a_hung_worker_are_detected_and_handled(api, platform):
    job = submit(api, accelerator_types=["nvidia-h100"], hyperparameters={"steps": 90, "step_sleep_s": 0.05})
    injected: dict[str, float] = {}

    def inject(current: TrainingJob) -> None:
        if current.state != "RUNNING":
            return
        if "slow" not in injected and current.current_step >= 15:
            platform.inject_training_fault(current.compute_handle, rank=1, fault="slow", factor=4.0)
            injected["slow"] = time.time()
        elif "hang" not in injected and current.current_step >= 45 and \
                TrainingFault.objects.filter(job=current, kind="slow_node").exists():
            platform.inject_training_fault(current.compute_handle, rank=1, fault="hang")
            injected["hang"] = time.time()

    job = drive(job, until=lambda j: j.is_terminal, timeout=180, on_tick=inject)
    assert job.state == "SUCCEEDED" and job.current_step == 89, job.state_reason
    slow = TrainingFault.objects.get(job=job, kind="slow_node")
    assert slow.advisory and slow.node == "h100-pool-1" and slow.worker == 1
    assert "peers' median" in slow.evidence
    hang = TrainingFault.objects.get(job=job, kind="hang")
    assert hang.node == "h100-pool-1" and hang.worker == 1 and "no step progress" in hang.evidence
    assert hang.detected_at.timestamp() - injected["hang"] < 30  # target: a hang within 30 s
    assert hang.resumed_at is not None and hang.restart_s < 20
    assert job.restarts == 1


def test_a_crashed_worker_and_a_nan_loss_restart_the_gang_from_its_checkpoint(api, platform):
    job = submit(api, name="faulty", accelerator_types=["nvidia-h100"],
                 hyperparameters={"steps": 60, "step_sleep_s": 0.05})
    injected: dict[str, int] = {}

    def inject(current: TrainingJob) -> None:
        if current.state != "RUNNING":
            return
        if "crash" not in injected and current.current_step >= 15:
            platform.inject_training_fault(current.compute_handle, rank=1, fault="crash")
            injected["crash"] = current.current_step
        elif "nan" not in injected and current.restarts == 1 and current.current_step >= 35:
            platform.inject_training_fault(current.compute_handle, rank=0, fault="nan")
            injected["nan"] = current.current_step

    job = drive(job, until=lambda j: j.is_terminal, timeout=180, on_tick=inject)
    assert job.state == "SUCCEEDED" and job.current_step == 59 and job.restarts == 2, job.state_reason
    crash, nan = TrainingFault.objects.filter(job=job).order_by("id")
    assert (crash.kind, crash.node, crash.worker) == ("worker_crash", "h100-pool-1", 1)
    assert (nan.kind, nan.worker) == ("bad_loss", 0) and "nan" in nan.evidence.lower()
    # Checkpoints every 10 steps, written in the background: at most one interval plus the steps taken
    # while the newest was still being written is redone, never the run from the start.
    assert crash.resumed_at and nan.resumed_at and crash.recomputed_steps < 20 and nan.recomputed_steps < 20
    assert TrainingMetric.objects.filter(job=job, attempt=job.attempt, step=59).count() == 2


def test_a_run_that_vanished_is_relaunched_from_its_checkpoint(api, platform):
    job = submit(api, name="drift", accelerator_types=["nvidia-h100"],
                 hyperparameters={"steps": 50, "step_sleep_s": 0.05})
    lost: dict[str, int] = {}

    def vanish(current: TrainingJob) -> None:
        if not lost and current.state == "RUNNING" and current.last_checkpoint_step >= 19:
            platform.release_training(current.compute_handle)  # as if the head node had restarted
            lost["checkpoint"] = current.last_checkpoint_step

    job = drive(job, until=lambda j: j.is_terminal, timeout=180, on_tick=vanish)
    assert job.state == "SUCCEEDED" and job.current_step == 49, job.state_reason
    assert any("not found" in e.reason and "launching it again" in e.reason for e in job.events.all())
    resumed = [int(line.line.rsplit(" ", 1)[1])
               for line in job.log_lines.filter(line__contains="resumed from checkpoint step")]
    assert resumed and min(resumed) >= lost["checkpoint"]  # not from scratch


def test_a_user_entrypoint_runs_on_the_cpu_pool_and_a_failing_one_gives_up(api, platform, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, sys, time\n"
        "assert os.environ['WORLD_SIZE'] == '1' and os.environ['FLEETYARD_CHECKPOINT_DIR']\n"
        "for step in range(12):\n"
        "    print(f'fleetyard: step={step} loss={5 - step * 0.25}', flush=True)\n"
        "    time.sleep(0.05)\n"
        "print('done', os.environ['GREETING'])\n"
        "sys.exit(int(os.environ.get('EXIT_CODE', '0')))\n")
    common = {"accelerator_types": ["cpu"], "workers_min": 1, "workers_max": 1, "devices_per_worker": 0,
              "cpus_per_worker": 1, "trainer": "entrypoint", "entrypoint": f"{sys.executable} train.py",
              "working_dir": str(tmp_path)}
    job = submit(api, name="script", envs={"GREETING": "hello"}, **common)
    job = drive(job, until=lambda j: j.is_terminal)
    assert job.state == "SUCCEEDED" and job.current_step == 11, job.state_reason
    assert job.observed_nodes == ["cpu-pool-0"]
    lines = [line.line for line in job.log_lines.all()]
    assert "done hello" in lines and "fleetyard: step=11 loss=2.25" in lines
    assert [m.loss for m in job.metrics.order_by("step")][-1] == 2.25
    failing = submit(api, name="failing", envs={"GREETING": "x", "EXIT_CODE": "3"}, max_restarts=1, **common)
    failing = drive(failing, until=lambda j: j.is_terminal)
    assert failing.state == "FAILED" and "gave up after 1 restart(s)" in failing.state_reason
    assert "entrypoint exited with code 3" in failing.state_reason


def test_a_tensor_and_pipeline_parallel_job_trains_recovers_and_leaves_a_servable_checkpoint(api, platform):
    """tp 2 x pp 2 over 4 workers (2 per H100 node): a crash restarts the gang from a checkpoint written in the
    single-process format, which the layout resumes from and serving loads as it is."""
    from jobs.runtime import checkpoints, lm
    from jobs.workflows import checkpoint_dir

    job = submit(api, name="mp", accelerator_types=["nvidia-h100"], workers_min=4, workers_max=4,
                 devices_per_worker=4, cpus_per_worker=0.5,
                 hyperparameters={"steps": 40, "step_sleep_s": 0.02, "tensor_parallel": 2, "pipeline_parallel": 2,
                                  "n_layers": 4})
    injected: dict[str, int] = {}

    def inject(current: TrainingJob) -> None:
        if current.state == "RUNNING" and "crash" not in injected and current.current_step >= 15:
            platform.inject_training_fault(current.compute_handle, rank=3, fault="crash")
            injected["crash"] = current.current_step

    job = drive(job, until=lambda j: j.is_terminal, timeout=240, on_tick=inject)
    assert job.state == "SUCCEEDED" and job.current_step == 39 and job.restarts == 1, job.state_reason
    fault = TrainingFault.objects.get(job=job)
    assert fault.kind == "worker_crash" and fault.worker == 3 and fault.recomputed_steps < 20
    logs = [line["line"] for line in api("alpha", "member").get(
        f"/api/v1/training-jobs/{job.pk}/logs/?limit=2000").json()["results"]]
    assert any("tensor parallel 2 x pipeline parallel 2 x data parallel 1 over 4 worker(s)" in line
               and "stage 1 (layers 2-3)" in line for line in logs)
    assert sum("resumed from checkpoint step" in line for line in logs) == 4  # every rank, after the crash
    info, files = checkpoints.load_latest(checkpoint_dir(job))
    assert info.step == 39
    model, tokenizer, config = lm.load_model_for_inference(files)  # the single-process format
    assert config.n_layers == 4 and lm.generate(model, tokenizer, "Once", max_new_tokens=4)
    losses = [m.loss for m in TrainingMetric.objects.filter(job=job, worker=0).order_by("step", "-attempt")]
    assert losses[-1] < 0.8 * losses[0]  # it learns


def test_a_killed_node_is_detected_and_the_job_recovers_to_the_same_final_step(api, platform, ray_cluster):
    job = submit(api, name="elastic", accelerator_types=["nvidia-a100"], workers_min=1, workers_max=2,
                 hyperparameters={"steps": 70, "step_sleep_s": 0.05})
    killed: dict[str, float] = {}

    def kill(current: TrainingJob) -> None:
        if not killed and current.state == "RUNNING" and current.current_step >= 25:
            ray_cluster.kill_node("a100-pool-1")
            killed["at"] = time.time()

    job = drive(job, until=lambda j: j.is_terminal, timeout=180, on_tick=kill)
    assert job.state == "SUCCEEDED" and job.current_step == 69, job.state_reason
    fault = TrainingFault.objects.get(job=job)
    assert fault.kind == "node_lost" and fault.node == "a100-pool-1"
    assert fault.detected_at.timestamp() - killed["at"] < 5  # target: node loss within 5 s
    assert fault.restart_s is not None and fault.restart_s < 20  # resumed within 20 s of detection
    assert job.observed_nodes == ["a100-pool-0"] and len(job.placement) == 1  # shrunk: no spare A100 node
    reasons = [e.reason for e in job.events.all()]
    assert any(r.startswith("shrunk to the 1 worker(s)") for r in reasons)
    summary = api("alpha", "member").get(f"/api/v1/training-jobs/{job.pk}/").json()["status"]["goodput"]
    assert summary["interruptions"] == {"node_lost": 1} and 0 < summary["ettr"] < 1
