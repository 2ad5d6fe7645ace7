"""The SDK against the real Django app over HTTP (live_server): spec apply with plan, typed jobs,
pagination, log streaming to the job's end, wait helpers, cancel, typed errors, dataset upload."""

from __future__ import annotations

import threading

import pytest

from controlplane.cluster.models import Node
from fleetyard import Client
from fleetyard.errors import AuthenticationError, BadRequest, ConfigError, Conflict, NotFound, TimeoutExpired
from jobs.admission import type_preference
from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db(transaction=True)

JOB = """\
name: {name}
queue: default
workers: 2
resources:
  accelerators: H100:8
  any_of: [A100:8]
hyperparameters: {{steps: 100}}
checkpoint: {{interval_steps: 25}}
"""


def test_dry_run_plans_without_creating(live):
    client = Client(live.url, live.token)
    result = client.apply_spec(JOB.format(name="plan-only"), dry_run=True)
    assert result["dry_run"] is True and result["object"] is None
    plan = result["plan"]
    assert [o["accelerator_type"] for o in plan["options"]] == ["nvidia-h100", "nvidia-a100"]
    # the scheduling cycle's order: cheapest per unit of work (H100 does ~3x the work of an A100 for 1.4x the price)
    ranked = type_preference(workload_class="builtin_lm", accepted=["nvidia-h100", "nvidia-a100"])
    assert ranked[0].accelerator_type == "nvidia-h100"
    assert plan["chosen"]["accelerator_type"] == "nvidia-h100"
    assert plan["chosen"]["reason"] == f"{ranked[0].reason}; it has room now"
    assert plan["chosen"]["cost_per_hour_usd"] == pytest.approx(3.99 * 16)
    assert plan["queue"]["position"] == 1 and plan["queue"]["cluster_queue"] == "shared"
    assert not TrainingJob.objects.exists()


def test_the_plan_falls_back_like_the_scheduler_when_the_best_type_is_full(live):
    Node.objects.filter(pool__name="h100-pool").update(cordoned=True)
    plan = Client(live.url, live.token).apply_spec(JOB.format(name="fallback"), dry_run=True)["plan"]
    assert plan["chosen"]["accelerator_type"] == "nvidia-a100" and plan["chosen"]["fits_now"]
    assert plan["chosen"]["reason"].startswith("nvidia-h100 would be cheapest per unit of work but has no room now")


def test_a_job_runs_and_its_logs_stream_to_the_end(live):
    client = Client(live.url, live.token)
    result = client.apply_spec(JOB.format(name="streamed"))
    job_id = result["object"]["id"]
    assert TrainingJob.objects.get(pk=job_id).spec_yaml.startswith("name: streamed")
    assert client.training_job(job_id).state in ("STARTING", "RUNNING", "ADMITTED")
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(client.logs(job_id, follow=True)))
    reader.start()
    live.sync_until_done("streamed")
    reader.join(timeout=60)
    assert not reader.is_alive()
    stored = list(client.logs(job_id))
    assert stored and [line.id for line in lines] == [line.id for line in stored]
    job = client.wait_for_job(job_id, timeout=5)
    assert job.state == "SUCCEEDED" and job.is_terminal
    assert [j.id for j in client.training_jobs(state="SUCCEEDED")] == [job_id]


def test_cancel_wait_and_typed_errors(live):
    client = Client(live.url, live.token)
    job_id = client.apply_spec(JOB.format(name="to-cancel"))["object"]["id"]
    with pytest.raises(TimeoutExpired):
        client.wait_for_job(job_id, timeout=0.2, poll=0.1)
    assert client.cancel_training_job(job_id, reason="not needed").state == "CANCELLED"
    with pytest.raises(Conflict):
        client.cancel_training_job(job_id)
    with pytest.raises(NotFound):
        client.training_job(999999)
    with pytest.raises(AuthenticationError):
        Client(live.url, "fy_wrong").me()
    with pytest.raises(ConfigError):
        Client(url=live.url, token="")


def test_spec_mistakes_found_by_the_server_name_the_line(live):
    client = Client(live.url, live.token)
    text = "name: bad\nqueue: default\nresources:\n  accelerators: P800:8\nhyperparameters: {steps: 10}\n"
    with pytest.raises(BadRequest) as info:
        client.apply_spec(text, filename="bad.yaml")
    assert info.value.body["spec"][0].startswith(
        "bad.yaml:4: resources.accelerators: queue default (cluster queue shared) has no quota for kunlun-p800")
    with pytest.raises(BadRequest) as info:
        client.apply_spec("name: x\nqueue: nope\nresources: {accelerators: H100}\n")
    assert info.value.body["spec"][0].startswith("spec.yaml:2: queue: team alpha has no queue named 'nope'")


def test_pagination_follows_next_links(live):
    client = Client(live.url, live.token)
    for i in range(3):
        client.apply_spec(JOB.format(name=f"page-{i}").replace("workers: 2", "workers: 1"), dry_run=False)
    jobs = list(client.training_jobs(page_size=1, ordering="name"))
    assert [j.name for j in jobs] == ["page-0", "page-1", "page-2"]


def test_upload_reports_progress(live, tmp_path):
    client = Client(live.url, live.token)
    data = tmp_path / "corpus.txt"
    data.write_bytes(b"once upon a time\n" * 200_000)  # 3.4 MB: several chunks
    seen = []
    dataset = client.create_dataset("stories")
    version = client.upload_dataset_version(dataset["id"], data, progress=lambda sent, total: seen.append(sent))
    assert version["size_bytes"] == data.stat().st_size and version["version"] == 1
    assert len(seen) >= 3 and seen[-1] == data.stat().st_size


def test_secret_values_reach_the_workers_but_never_the_api(live):
    client = Client(live.url, live.token)
    spec = JOB.format(name="with-secret") + "envs: {MODE: offline}\nsecrets: [HF_TOKEN]\n"
    result = client.apply_spec(spec, secrets={"HF_TOKEN": "hf_top_secret_value"})
    job_id = result["object"]["id"]
    assert result["object"]["spec"]["secrets"] == ["HF_TOKEN"]
    assert result["object"]["spec"]["envs"] == {"MODE": "offline"}
    fetched = client.request("GET", f"training-jobs/{job_id}/").text
    events = client.request("GET", f"training-jobs/{job_id}/events/").text
    audit = client.request("GET", "audit-events/").text
    assert all("hf_top_secret_value" not in text for text in (str(result), fetched, events, audit))
    job = TrainingJob.objects.get(pk=job_id)
    launched = live.backend.runs[job.compute_handle].launch.runtime["envs"]
    assert launched == {"MODE": "offline", "HF_TOKEN": "hf_top_secret_value"}
    with pytest.raises(BadRequest, match="HF_TOKEN"):  # a named secret without its value is refused
        client.apply_spec(JOB.format(name="no-value") + "secrets: [HF_TOKEN]\n")
