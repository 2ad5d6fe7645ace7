"""The training job pages of the console (Django test client): list filters and live region, the submit
page (form, YAML, clone, viewers), and a job's page (actions, charts and logs hooks, ETTR, faults)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from controlplane.cluster.services import node_pool_create
from controlplane.quotas.services import local_queue_create
from controlplane.tenancy.models import Role
from controlplane.tenancy.services import membership_set
from jobs.models import TrainingFault, TrainingJob, TrainingLogLine
from jobs.services import training_job_cancel, training_job_create


def session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_job(team_world, name: str, types=("nvidia-h100",), **extra) -> TrainingJob:
    return training_job_create(actor=team_world["admin"], team=team_world["team"], name=name,
                               local_queue=team_world["queue"], accelerator_types=list(types), **extra)


# ------------------------------------------------------------------------------------------------ list

def test_list_has_a_submit_button_and_a_live_table(world):
    alpha = world["alpha"]
    make_job(alpha, "train-lm")
    html = session(alpha["member"]).get("/jobs/?q=train").content.decode()
    assert 'href="/jobs/new/"' in html and "Submit a job" in html
    assert 'id="jobs-live"' in html and 'hx-trigger="every 3s"' in html
    assert 'hx-get="/jobs/?q=train"' in html and 'hx-select="#jobs-live"' in html
    assert "train-lm" in html


def test_empty_list_says_what_to_do(world):
    html = session(world["alpha"]["member"]).get("/jobs/").content.decode()
    assert "No training jobs yet" in html
    assert html.count('href="/jobs/new/"') == 2  # the header's button and the empty state's call to action


def test_filters_by_name_queue_and_accelerator_type(world):
    alpha = world["alpha"]
    local_queue_create(actor=alpha["admin"], team=alpha["team"], name="urgent", cluster_queue=world["cluster_queue"])
    make_job(alpha, "lm-h100")
    make_job(alpha, "lm-a100", types=("nvidia-a100",))
    urgent = training_job_create(actor=alpha["admin"], team=alpha["team"], name="lm-urgent",
                                 local_queue=alpha["team"].local_queues.get(name="urgent"),
                                 accelerator_types=["cpu"], devices_per_worker=0)
    client = session(alpha["member"])

    def names(query):
        html = client.get(f"/jobs/{query}").content.decode()
        return {name for name in ("lm-h100", "lm-a100", "lm-urgent") if f">{name}</a>" in html}

    assert names("") == {"lm-h100", "lm-a100", "lm-urgent"}
    assert names("?q=A100") == {"lm-a100"}  # case-insensitive
    assert names("?queue=urgent") == {"lm-urgent"}
    assert names("?accelerator=nvidia-a100") == {"lm-a100"}
    assert names("?accelerator=nvidia-h100&q=lm") == {"lm-h100"}
    assert names("?accelerator=bogus") == {"lm-h100", "lm-a100", "lm-urgent"}  # unknown: ignored
    training_job_cancel(actor=alpha["admin"], job=urgent)
    assert names("?state=CANCELLED&queue=urgent") == {"lm-urgent"}
    assert names("?state=CANCELLED&queue=default") == set()
    html = client.get("/jobs/?state=CANCELLED&queue=default").content.decode()
    assert "match these filters" in html
    # the state pills keep the other filters; counts are those of the filtered jobs
    html = client.get("/jobs/?queue=urgent").content.decode()
    assert 'href="/jobs/?state=CANCELLED&amp;queue=urgent"' in html
    html = client.get("/jobs/?q=zzz").content.decode()
    assert "No job matches these filters" in html


def test_pagination_keeps_the_filters(world, monkeypatch):
    from frontend import job_views

    monkeypatch.setattr(job_views, "JOBS_PER_PAGE", 2)
    alpha = world["alpha"]
    for i in range(5):
        make_job(alpha, f"sweep-{i}")
    html = session(alpha["member"]).get("/jobs/?q=sweep&state=PENDING").content.decode()
    assert "page 1 of 3" in html
    assert 'href="?q=sweep&amp;state=PENDING&amp;page=2"' in html


def test_list_never_shows_another_teams_jobs_or_queues(world):
    alpha, beta = world["alpha"], world["beta"]
    local_queue_create(actor=beta["admin"], team=beta["team"], name="beta-secret-queue",
                       cluster_queue=world["cluster_queue"])
    make_job(alpha, "alpha-job")
    make_job(beta, "beta-hidden-job")
    client = session(alpha["member"])
    for url in ["/jobs/", "/jobs/?q=beta", "/jobs/?queue=default", "/jobs/?queue=beta-secret-queue"]:
        html = client.get(url).content.decode()
        assert "beta-hidden-job" not in html
        assert '<option value="beta-secret-queue"' not in html  # never offered as a filter


def test_list_escapes_the_search_box(world):
    html = session(world["alpha"]["member"]).get('/jobs/?q="><script>x</script>').content.decode()
    assert "<script>x</script>" not in html
    assert "&quot;&gt;&lt;script&gt;x&lt;/script&gt;" in html


# ---------------------------------------------------------------------------------------------- submit

def test_submit_page_offers_the_teams_queues_and_the_types_they_have_quota_for(world, accel):
    node_pool_create(actor=world["ops"], name="h100-pool", accelerator_type=accel["nvidia-h100"],
                     devices_per_node=8, simulated=True)
    page = session(world["alpha"]["member"]).get("/jobs/new/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-api="/api/v1/training-jobs/"' in html and 'data-redirect="/jobs/{id}/"' in html
    assert 'data-spec-api="/api/v1/specs/apply/"' in html and "data-dry-run" in html
    assert '<option value="default" data-team="alpha" data-key="alpha/default"' in html
    for slug in ("nvidia-h100", "nvidia-a100", "cpu"):  # the shared cluster queue's quotas
        assert f'value="{slug}"' in html
    assert 'value="kunlun-p800"' not in html  # no quota for it
    assert "SIMULATED" in html  # the h100 pool is simulated
    assert 'name="team"' not in html  # one team: the API picks it
    assert 'name="checkpoint.interval_steps"' in html and 'data-type="json"' in html
    assert "standard (500)" in html  # the priority class
    assert "/static/frontend/pages/jobs.js" in html and "/static/frontend/css/jobs.css" in html
    assert "<script>" not in html.replace('<script type="application/json"', "")  # no inline code
    assert "viewer" not in html


def test_a_user_in_several_teams_picks_the_team(world):
    alpha, beta = world["alpha"], world["beta"]
    membership_set(actor=beta["admin"], team=beta["team"], username="alpha-member", role=Role.VIEWER)
    html = session(alpha["member"]).get("/jobs/new/").content.decode()
    assert 'name="team"' in html
    assert 'data-key="alpha/default"' in html and 'data-key="beta/default"' in html
    assert "beta (viewer)" in html and "You are a viewer in beta" in html


def test_a_viewer_is_told_they_cannot_submit(world):
    html = session(world["alpha"]["viewer"]).get("/jobs/new/").content.decode()
    assert "You can look but not submit" in html and "403" in html


def test_clone_prefills_the_form_but_not_the_secrets(world):
    alpha = world["alpha"]
    job = make_job(alpha, "orig", types=("nvidia-a100", "nvidia-h100"), workers_min=2, workers_max=3,
                   devices_per_worker=4, hyperparameters={"steps": 77}, envs={"MODE": "<b>x</b>"},
                   secret_envs={"HF_TOKEN": "top-secret-value"}, checkpoint_interval_steps=11,
                   priority_class=world["priority"])
    html = session(alpha["member"]).get(f"/jobs/new/?clone={job.pk}").content.decode()
    assert 'value="orig-clone"' in html
    assert "Cloned from" in html and "Secrets are not copied" in html and "HF_TOKEN" in html
    assert "top-secret-value" not in html
    assert 'value="nvidia-a100" checked' in html and 'value="nvidia-h100" checked' in html
    assert html.index('value="nvidia-a100"') < html.index('value="nvidia-h100"')  # preference order kept
    assert 'value="cpu" checked' not in html
    assert 'name="workers_min" type="number" min="1" data-type="int" value="2"' in html
    assert 'value="3"' in html and 'value="11"' in html and "&quot;steps&quot;: 77" in html
    assert '<option value="standard" selected' in html
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>x</b>" not in html


def test_clone_of_another_teams_job_is_a_404(world):
    theirs = make_job(world["beta"], "beta-job")
    client = session(world["alpha"]["member"])
    assert client.get(f"/jobs/new/?clone={theirs.pk}").status_code == 404
    assert client.get("/jobs/new/?clone=abc").status_code == 404


def test_yaml_tab_starts_from_an_example_or_the_clones_spec(world):
    alpha = world["alpha"]
    client = session(alpha["member"])
    html = client.get("/jobs/new/?tab=yaml").content.decode()
    assert 'id="panel-form" class="card" role="tabpanel" aria-labelledby="tab-form" hidden' in html
    assert "queue: default" in html and "accelerators: cpu" in html
    job = make_job(alpha, "from-yaml")
    TrainingJob.objects.filter(pk=job.pk).update(spec_yaml="name: from-yaml\n# <hand written>\n")
    html = client.get(f"/jobs/new/?clone={job.pk}&tab=yaml").content.decode()
    assert "# &lt;hand written&gt;" in html


def test_submit_page_for_a_user_without_teams(django_user_model, db):
    loner = django_user_model.objects.create_user("loner", password="pw-123456789")
    html = session(loner).get("/jobs/new/").content.decode()
    assert "You are not in any team yet" in html


# ------------------------------------------------------------------------------------------- job page

def test_live_job_page_polls_and_offers_cancel_and_clone(world):
    alpha = world["alpha"]
    job = make_job(alpha, "live-one")
    html = session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-head"' in html and 'data-state="PENDING"' in html
    assert 'hx-trigger="every 3s"' in html
    assert 'hx-select-oob="#job-status,#job-run,#job-recovery,#job-timeline"' in html
    assert f'data-api="/api/v1/training-jobs/{job.pk}/cancel/"' in html
    assert f'href="/jobs/new/?clone={job.pk}"' in html
    assert "/retry/" not in html
    assert 'id="chart-loss"' in html and 'id="chart-throughput"' in html and 'id="job-logs"' in html
    assert f'data-api="/api/v1/training-jobs/{job.pk}/"' in html
    assert "echarts-6.1.0.min.js" in html and "/static/frontend/pages/jobs.js" in html
    assert "No log lines yet" in html and "has not started yet" in html
    assert "<svg" not in html  # charts are ECharts, drawn in the browser


def test_ended_job_page_stops_polling_and_offers_retry(world):
    alpha = world["alpha"]
    job = make_job(alpha, "ended")
    training_job_cancel(actor=alpha["admin"], job=job)
    html = session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-state="CANCELLED"' in html and 'data-live="false"' in html
    assert 'hx-trigger="every 3s"' not in html
    assert f'data-api="/api/v1/training-jobs/{job.pk}/retry/"' in html and 'data-redirect="/jobs/{id}/"' in html
    assert "/cancel/" not in html


def test_viewers_get_no_action_buttons(world):
    alpha = world["alpha"]
    job = make_job(alpha, "look-only")
    html = session(alpha["viewer"]).get(f"/jobs/{job.pk}/").content.decode()
    assert "Read-only" in html and "/cancel/" not in html and "?clone=" not in html


def test_job_page_shows_ettr_checkpoint_faults_and_the_latest_logs(world):
    alpha = world["alpha"]
    job = make_job(alpha, "ran", workers_min=2)
    now = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(state="RUNNING", started_at=now - timedelta(seconds=100),
                                                 attempt=2, restarts=1, last_checkpoint_step=40, current_step=55,
                                                 admitted_accelerator_type="nvidia-h100")
    TrainingFault.objects.create(job=job, kind="worker_crash", node="h100-pool-1", worker=1, step=52,
                                 evidence="exit code 137 <oom>", occurred_at=now - timedelta(seconds=30),
                                 detected_at=now - timedelta(seconds=28), resumed_at=now - timedelta(seconds=20),
                                 recomputed_steps=12)
    lines = [TrainingLogLine.objects.create(job=job, worker=w, line=f"step {i} <ok>", recorded_at=now)
             for i in range(3) for w in (0, 1)]
    html = session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode()
    assert "Effective training time" in html and "data-ettr" in html
    assert "1 <span class=\"unit\">of 3 allowed</span>" in html
    assert "step 40" in html
    assert "Worker crash" in html and "exit code 137 &lt;oom&gt;" in html and "2.0 s" in html and "8.0 s" in html
    assert "12 steps redone" in html
    assert f'data-after="{lines[-1].pk}"' in html
    assert '<span class="log-worker">[1]</span> step 2 &lt;ok&gt;' in html
    assert '<option value="1">worker 1</option>' in html


def test_another_teams_job_page_is_a_404(world):
    theirs = make_job(world["beta"], "beta-job")
    assert session(world["alpha"]["member"]).get(f"/jobs/{theirs.pk}/").status_code == 404


@pytest.mark.parametrize("url", ["/jobs/new/", "/jobs/new/?tab=yaml"])
def test_anonymous_users_are_sent_to_login(client, db, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"].startswith("/login/?next=")


def test_the_forms_defaults_are_accepted_on_every_offered_type(world, demo_cluster):
    """The form prefilled 1 CPU per worker, and on the demo cluster every accelerator node has 0.125 core per device,
    so submitting it as given was refused ("may reserve at most 0.125"). Unset, a worker gets its node's share."""
    import re

    from rest_framework.test import APIClient

    html = session(world["alpha"]["member"]).get("/jobs/new/").content.decode()
    body = {"name": "formjob", "queue": "default", "trainer": "builtin-transformer-lm",
            "hyperparameters": {"steps": 10}}
    for field, kind, value in re.findall(r'<input id="f-[^"]*" name="([a-z_.]+)" type="number"[^>]*data-type="(\w+)" '
                                         r'value="([^"]*)"', html):
        if value != "":  # console.js leaves empty optional fields out
            target, _, key = field.partition(".")
            number = int(value) if kind == "int" else float(value)
            if key:
                body.setdefault(target, {})[key] = number
            else:
                body[field] = number
    assert body["workers_min"] == 1 and body["checkpoint"]["interval_steps"] == 100  # the form was read
    client = APIClient()
    client.force_login(world["alpha"]["member"])
    for slug in ("nvidia-h100", "nvidia-a100"):
        response = client.post("/api/v1/training-jobs/", {**body, "name": f"formjob-{slug}",
                                                          "accelerator_types": [slug]}, format="json")
        assert response.status_code == 201, response.json()
