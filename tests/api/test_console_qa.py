"""The console as each role uses it, with odd input (found by a QA pass of the console, 2026-11-29). Each test failed
on the code before its fix."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from jobs.models import TrainingJob
from jobs.services import training_job_create


def session(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def make_job(team_world, name: str, **extra) -> TrainingJob:
    return training_job_create(actor=team_world["admin"], team=team_world["team"], name=name,
                               local_queue=team_world["queue"], **{"accelerator_types": ["nvidia-h100"], **extra})


@pytest.mark.parametrize("value", ["²", "¹²", "٣"])
def test_ids_in_the_query_string_that_are_not_ascii_digits_are_unknown_ids(world, value):
    """/jobs/new/?clone=² and /deployments/new/?job=² were a 500 (ValueError: "²".isdigit() is true, int("²")
    raises); "٣" (an Arabic-Indic 3) opened job 3. Now they are an unknown id: a 404 for the clone, the "not one of
    your teams' jobs" note on the deployment form."""
    alpha = world["alpha"]
    for i in range(3):
        job = make_job(alpha, f"trained-{i}")
    TrainingJob.objects.filter(team=alpha["team"]).update(state="SUCCEEDED", last_checkpoint_step=10)
    client = session(alpha["member"])
    assert client.get(f"/jobs/new/?clone={job.pk}").status_code == 200
    assert client.get(f"/jobs/new/?clone={value}").status_code == 404
    page = client.get(f"/deployments/new/?job={value}")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"Training job {value} is not one of your teams" in html
    assert " selected>" not in html.split('id="dep-job"')[1].split("</select>")[0]


def test_a_nul_in_the_job_search_is_dropped_not_a_500(world):
    """/jobs/?q=a%00b was a 500 on PostgreSQL ("PostgreSQL text fields cannot contain NUL (0x00) bytes"), the
    database the compose stack runs; on SQLite the NUL was echoed into the search box. It is dropped now."""
    make_job(world["alpha"], "ab-job")
    make_job(world["alpha"], "other")
    response = session(world["alpha"]["member"]).get("/jobs/?q=a%00b")
    assert response.status_code == 200
    html = response.content.decode()
    assert "\x00" not in html
    assert 'name="q" value="ab"' in html and "ab-job" in html and ">other<" not in html


def test_the_deployment_form_names_the_team_of_a_member_who_is_a_viewer_elsewhere(world, model_dir):
    """A member of alpha who is a viewer in beta may create deployments only in alpha, so the form showed no team
    field, and the API refused what it sent: 400 {"team": ["name the team (you belong to several)"]}, under a field
    the form does not have. The form now names its one team (a hidden field) and the API creates the deployment."""
    from controlplane.tenancy.models import Role
    from controlplane.tenancy.services import membership_set
    from inference.models import Deployment

    alpha, beta = world["alpha"], world["beta"]
    membership_set(actor=beta["admin"], team=beta["team"], username=alpha["member"].username, role=Role.VIEWER)
    client = session(alpha["member"])
    html = client.get("/deployments/new/").content.decode()
    assert 'id="dep-team"' not in html  # one team to choose from: no select
    assert '<input type="hidden" name="team" value="alpha">' in html
    body = {"team": "alpha", "name": "from-form", "queue": "default", "model_uri": f"file://{model_dir}",
            "accelerator_types": ["cpu"], "devices_per_replica": 1, "replicas_min": 1, "replicas_max": 1,
            "sla": {"ttft_p95_ms": 500, "tpot_p95_ms": 50}}  # what console.js sends from the form's fields
    response = client.post("/api/v1/deployments/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert Deployment.objects.get(name="from-form").team == alpha["team"]


def test_a_cpu_jobs_page_says_its_workers_cores_not_zero_devices(world):
    """Job page, Spec, Workers: a CPU job of 2 workers x 0.5 core read "2 × 0 devices, 0.5 CPU each" (its
    devices_per_worker is 0); the jobs list says "2 × 0.5 CPU". A job on devices still says both."""
    alpha = world["alpha"]
    cpu = make_job(alpha, "cpu-job", accelerator_types=["cpu"], devices_per_worker=0, cpus_per_worker=0.5,
                   workers_min=2, workers_max=2)
    gpu = make_job(alpha, "gpu-job", devices_per_worker=2, cpus_per_worker=4)
    client = session(alpha["member"])

    def workers(job):
        html = client.get(f"/jobs/{job.pk}/").content.decode()
        return re.search(r"<dt>Workers</dt><dd>([^<]*)</dd>", html).group(1)

    assert workers(cpu) == "2 × 0.5 CPU each"
    assert workers(gpu) == "1 × 2 devices, 4 CPU each"


def test_the_overview_badges_work_running_on_simulated_chips(world, accel):
    """The overview's "Running training jobs", "Serving deployments" and "Latest training jobs" tables named the
    type a job or deployment runs on with no SIMULATED badge (the overview did not pass the simulated types its
    job table checks), while the jobs and deployments pages badge the same rows. Work on a real pool stays
    unbadged."""
    from inference.models import Deployment
    from inference.services import deployment_create
    from tests.api.conftest import small_cluster

    small_cluster(world, accel, h100_free_on_first=6)  # h100-pool is SIMULATED, cpu-pool is real
    alpha = world["alpha"]
    on_sim = make_job(alpha, "sim-job")
    on_cpu = make_job(alpha, "cpu-job", accelerator_types=["cpu"], devices_per_worker=0)
    TrainingJob.objects.filter(pk=on_sim.pk).update(
        state="RUNNING", admitted_accelerator_type="nvidia-h100", placement=[{"node": "h100-pool-0", "taken": []}])
    TrainingJob.objects.filter(pk=on_cpu.pk).update(
        state="RUNNING", admitted_accelerator_type="cpu", placement=[{"node": "cpu-pool-0", "taken": []}])
    for name, slug in (("sim-chat", "nvidia-h100"), ("cpu-chat", "cpu")):
        deployment = deployment_create(actor=alpha["admin"], team=alpha["team"], name=name, local_queue=alpha["queue"],
                                       accelerator_types=[slug], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                                       model_uri="file:///m")
        Deployment.objects.filter(pk=deployment.pk).update(state="SERVING", accelerator_type=slug)
    html = session(alpha["member"]).get("/").content.decode()

    def rows(name):
        return re.findall(rf">{name}</a>.*?</tr>", html, re.S)

    assert len(rows("sim-job")) == 2 and all("SIMULATED" in row for row in rows("sim-job"))  # running + latest
    assert len(rows("cpu-job")) == 2 and not any("SIMULATED" in row for row in rows("cpu-job"))
    assert "SIMULATED" in rows("sim-chat")[0] and "SIMULATED" not in rows("cpu-chat")[0]


def test_the_cluster_page_counts_devices_per_node_in_words_that_fit(world, accel):
    """Cluster page, each pool's heading: the CPU pool read "cpu · 0 devices per node" (a CPU pool has no device;
    its nodes count cores) and a pool of one-device nodes "1 devices per node"."""
    from controlplane.cluster.services import node_pool_create
    from tests.api.conftest import small_cluster

    small_cluster(world, accel, h100_free_on_first=8)
    node_pool_create(actor=world["ops"], name="a100-small", accelerator_type=accel["nvidia-a100"], devices_per_node=1,
                     simulated=True)
    html = session(world["alpha"]["member"]).get("/cluster/").content.decode()
    heads = {name: re.sub(r"\s+", " ", text) for name, text in
             re.findall(r'<section class="card" id="pool-([\w-]+)">\s*<h2>.*?<span class="muted small">(.*?)</span>',
                        html, re.S)}
    assert heads == {"h100-pool": "nvidia-h100 · 8 devices per node", "cpu-pool": "cpu · counted in CPU cores",
                     "a100-small": "nvidia-a100 · 1 device per node"}, heads


def test_the_job_page_says_1_step_not_1_steps(world):
    """Job page with a checkpoint every step and a fault that redid one step: "every 1 steps, keep last 3", "none
    yet: one is written every 1 steps", "(1 steps)" and "(1 steps redone)"."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import TrainingFault

    alpha = world["alpha"]
    job = make_job(alpha, "every-step", checkpoint_interval_steps=1)
    now = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(state="RUNNING", started_at=now - timedelta(seconds=100), attempt=2,
                                                 restarts=1, current_step=5, admitted_accelerator_type="nvidia-h100")
    TrainingFault.objects.create(job=job, kind="worker_crash", node="h100-pool-1", worker=0, step=4, evidence="exit",
                                 occurred_at=now - timedelta(seconds=30), detected_at=now - timedelta(seconds=28),
                                 resumed_at=now - timedelta(seconds=20), recomputed_steps=1)
    html = re.sub(r"\s+", " ", session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode())
    assert "every 1 step, keep last 3" in html
    assert "one is written every 1 step<" in html
    assert "(1 step redone)" in html
    assert not re.search(r"\b1 steps\b", html), re.findall(r".{40}\b1 steps\b.{10}", html)


@pytest.mark.parametrize("role_in_alpha", ["viewer", "member"])
def test_the_yaml_tabs_example_spec_is_accepted_for_a_user_of_several_teams(world, role_in_alpha):
    """The YAML tab starts from an example spec. For a user of several teams it named no team, so "Plan (dry run)"
    of the untouched example answered 400 "team: name the team (you belong to several)"; and it used the first
    queue in team order, a queue of a team where the user may be only a viewer. It now names a team the user may
    submit to, with that team's queue."""
    import html as html_lib
    import json

    from controlplane.tenancy.models import Role
    from controlplane.tenancy.services import membership_set

    alpha, beta = world["alpha"], world["beta"]
    membership_set(actor=alpha["admin"], team=alpha["team"], username=beta["member"].username,
                   role=Role(role_in_alpha))
    client = session(beta["member"])
    page = client.get("/jobs/new/?tab=yaml").content.decode()
    spec = html_lib.unescape(re.search(r'<textarea id="f-spec"[^>]*>(.*?)</textarea>', page, re.S).group(1))
    assert f"team: {'alpha' if role_in_alpha == 'member' else 'beta'}\n" in spec, spec
    response = client.post("/api/v1/specs/apply/?dry_run=1", json.dumps({"spec": spec}),
                           content_type="application/json")
    assert response.status_code == 200, response.content


def test_the_deployment_page_says_1_token_and_1_ongoing_request(world):
    """QA (2026-11-29): the Measured card read "1 tokens in 15 min" and Autoscaling "1 ongoing request(s)"."""
    from inference.models import Deployment, InferenceRequest
    from tests.api.test_console_deployments import make_deployment

    alpha = world["alpha"]
    deployment = make_deployment(alpha, "tiny")
    Deployment.objects.filter(pk=deployment.pk).update(
        autoscaling={"target_ongoing_requests": 1, "min_replicas": 1, "max_replicas": 1, "reason": "test"})
    InferenceRequest.objects.create(deployment=deployment, endpoint="/v1/completions", status_code=200,
                                    prompt_tokens=3, output_tokens=1, ttft_ms=10.0, tpot_ms=5.0)
    html = session(alpha["member"]).get(f"/deployments/{deployment.pk}/").content.decode()
    assert "1 token in 15 min" in html and "target 1 ongoing request per replica" in html, html
    InferenceRequest.objects.create(deployment=deployment, endpoint="/v1/completions", status_code=200,
                                    prompt_tokens=3, output_tokens=2, ttft_ms=10.0, tpot_ms=5.0)
    assert "3 tokens in 15 min" in session(alpha["member"]).get(f"/deployments/{deployment.pk}/").content.decode()
