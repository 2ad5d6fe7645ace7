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
