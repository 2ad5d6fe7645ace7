"""The console under mixed load (found by a QA pass, 2026-11-29): what the pages say about held capacity, CPU
workloads (cores, not devices) and the dry run's reasons, checked against the REST API and the scheduler's own
numbers. Each test failed on the code before."""

from __future__ import annotations

import re

from django.test import Client, TestCase

from controlplane.cluster.models import Node
from inference.models import Deployment
from jobs.admission import run_cycle
from jobs.models import TrainingJob
from tests.api import test_mixed_load
from tests.api.test_mixed_load import deploy_h100, post
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY

backend = test_mixed_load.backend  # the fixture: the in-memory backend the mixed-load tests drive


def browser(world) -> Client:
    client = Client()
    client.force_login(world["alpha"]["member"])
    return client


def cycle():
    with TestCase.captureOnCommitCallbacks(execute=True):
        run_cycle()


def held_text(html: str) -> str:
    match = re.search(r'id="deployment-held">(.*?)</div>', html, re.S)
    assert match, "no #deployment-held on the page"
    return re.sub(r"<[^>]+>", "", match.group(1))


def cpu_job(client, name, workers=2, cpus=1.0):
    return post(client, "/api/v1/training-jobs/", {**JOB_BODY, "name": name, "workers_min": workers,
                                                   "workers_max": workers, "accelerator_types": ["cpu"],
                                                   "devices_per_worker": 0, "cpus_per_worker": cpus})


def test_capacity_held_for_a_cpu_deployment_is_shown_in_cores_as_the_api_has_it(api, backend, model_dir, world):
    """A CPU deployment waits for cores preemptible CPU training gives back; the cycle holds 0.25 core for it
    (API: status.capacity_held == [["cpu-pool-0", 0.25]]). The page said "cpu-pool-0 (0.3 devices)": rounded by
    `floatformat` to one decimal and in devices, although CPU replicas take cores and no device."""
    client = api("alpha", "member")
    gang = cpu_job(client, "fills-the-node")
    TrainingJob.objects.filter(pk=gang).update(state="RUNNING", compute_handle="fy-train-cpu")
    Node.objects.filter(pool__accelerator_type__slug="cpu").update(free_cpus=0)
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "name": "held-cpu", "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "replicas_min": 1, "replicas_max": 1})
    cycle()
    held = client.get(f"/api/v1/deployments/{deployment_id}/").json()["status"]["capacity_held"]
    assert held == [["cpu-pool-0", 0.25]], held
    text = held_text(browser(world).get(f"/deployments/{deployment_id}/").content.decode())
    assert "0.25" in text and "core" in text and "device" not in text, text


def test_fractional_capacity_held_shows_the_apis_number(api, backend, model_dir, world):
    """A deployment of 0.125-device replicas: the cycle holds 0.125 of a device; the page said "(0.1 devices)"."""
    client = api("alpha", "member")
    deployment = deploy_h100(client, model_dir)
    Deployment.objects.filter(pk=deployment.pk).update(capacity_held=[["h100-pool-1", 0.125]])
    assert client.get(f"/api/v1/deployments/{deployment.pk}/").json()["status"]["capacity_held"] == \
        [["h100-pool-1", 0.125]]
    text = held_text(browser(world).get(f"/deployments/{deployment.pk}/").content.decode())
    assert "0.125" in text, text


def test_a_cpu_deployments_replicas_are_not_described_as_devices(api, backend, model_dir, world):
    """A CPU replica takes 0.25 core (CPUS_PER_REPLICA) and no device, whatever devices_per_replica says (the state
    reason of a waiting one says "1 replica(s) of 0.25 CPU each"); the page said "bounds 1–3 × 1 device" and
    "Replicas 1–3 × 1 device"."""
    client = api("alpha", "member")
    deployment_id = post(client, "/api/v1/deployments/", {
        **DEPLOYMENT_BODY, "name": "cpu-chat", "model_uri": f"file://{model_dir}", "accelerator_types": ["cpu"],
        "devices_per_replica": 1})
    assert Deployment.objects.get(pk=deployment_id).accelerator_type == "cpu"
    html = browser(world).get(f"/deployments/{deployment_id}/").content.decode()
    bounds = re.search(r"bounds [^<]*", html).group(0)
    replicas = re.search(r"<dt>Replicas</dt><dd>([^<]*)", html).group(1)
    assert "device" not in bounds and "device" not in replicas, (bounds, replicas)


def test_queues_page_says_what_a_waiting_cpu_job_asks_for(api, backend, world):
    """Pending workloads, "Asks for": a CPU job of 3 workers x 1 core read "3 × 0 of cpu" (devices_per_worker); the
    jobs list says "3 × 1 CPU"."""
    client = api("alpha", "member")
    waiting = cpu_job(client, "cpu-waits", workers=3, cpus=1.0)  # the 2-core CPU node never holds it
    cycle()
    assert TrainingJob.objects.get(pk=waiting).state == "QUEUED"
    html = browser(world).get("/queues/").content.decode()
    row = re.search(rf'<a href="/jobs/{waiting}/">cpu-waits</a>.*?</tr>', html, re.S).group(0)
    asks = re.sub(r"<[^>]+>", "", re.findall(r'<td class="small">(.*?)</td>', row, re.S)[0])
    assert "× 0 " not in asks and "1 CPU" in asks, asks


def test_overview_says_how_big_a_running_cpu_jobs_workers_are(api, backend, world):
    """Overview, running training jobs: a 2 x 0.5-core CPU job read "2 × 0" (devices_per_worker)."""
    client = api("alpha", "member")
    job_id = cpu_job(client, "cpu-runs", workers=2, cpus=0.5)
    assert TrainingJob.objects.get(pk=job_id).state == "ADMITTED"
    html = browser(world).get("/").content.decode()
    row = re.search(r'cpu-runs</a>.*?</tr>', html, re.S).group(0)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert "2 × 0" not in cells and any("0.5" in c for c in cells), cells


def test_a_cpu_jobs_wait_reason_counts_cores_not_devices(api, backend, world):
    """The wait reason the job page, the queues page and status.reason show for a CPU gang no CPU node can hold read
    "cpu nodes can never hold it: its 1 schedulable nodes (the largest with 2 devices) would hold at most 2 workers
    of 1 ...": the CPU node has 2 cores and no device."""
    client = api("alpha", "member")
    waiting = cpu_job(client, "cpu-waits", workers=3, cpus=1.0)
    cycle()
    reason = client.get(f"/api/v1/training-jobs/{waiting}/").json()["status"]["reason"]
    assert "can never hold it" in reason, reason
    assert "devices" not in reason, reason
