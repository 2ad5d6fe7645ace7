"""The server-rendered console: login, every page, team isolation, timelines and escaping."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from controlplane.datasets.services import dataset_create, dataset_version_upload
from inference.services import deployment_create
from jobs.models import TrainingJob
from jobs.services import training_job_cancel, training_job_create
from tests.api.conftest import small_cluster

PAGES = ["/", "/cluster/", "/queues/", "/datasets/", "/jobs/", "/deployments/"]


@pytest.fixture
def cluster(world, accel):
    """A simulated H100 pool with two nodes (one cordoned) and a real CPU pool with one node."""
    small_cluster(world, accel, h100_free_on_first=6)


def session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_job(team_world, name: str, **extra) -> TrainingJob:
    return training_job_create(actor=team_world["admin"], team=team_world["team"], name=name,
                               local_queue=team_world["queue"], accelerator_types=["nvidia-h100"], **extra)


@pytest.mark.django_db
@pytest.mark.parametrize("url", PAGES + ["/jobs/1/", "/deployments/1/"])
def test_anonymous_is_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


def test_login_page_and_real_password(world):
    client = Client()
    page = client.get("/login/")
    assert page.status_code == 200
    assert b'name="password"' in page.content and b"csrfmiddlewaretoken" in page.content

    wrong = client.post("/login/", {"username": "alpha-member", "password": "not-it"})
    assert wrong.status_code == 200
    assert b"correct username and password" in wrong.content

    right = client.post("/login/", {"username": "alpha-member", "password": "pw-123456789"})
    assert right.status_code == 302 and right["Location"] == "/"
    overview = client.get("/")
    assert overview.status_code == 200
    assert b"alpha-member" in overview.content


def test_logout_is_a_post_form(world):
    client = session(world["alpha"]["member"])
    page = client.get("/").content.decode()
    assert 'action="/logout/"' in page and 'method="post"' in page
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("url", PAGES)
def test_every_page_renders_for_a_member(world, cluster, url):
    alpha = world["alpha"]
    make_job(alpha, "train-lm")
    deployment_create(actor=alpha["admin"], team=alpha["team"], name="chat", local_queue=alpha["queue"],
                      accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                      model_uri="file:///m")
    response = session(alpha["member"]).get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Fleetyard" in html and "/static/frontend/console.css" in html
    assert "/api/v1/docs/" in html
    assert "/admin/" not in html  # members are not staff


def test_pages_render_empty_for_a_user_without_teams(django_user_model, db):
    loner = django_user_model.objects.create_user("loner", password="pw-123456789")
    client = session(loner)
    for url in PAGES:
        assert client.get(url).status_code == 200
    assert "No training jobs yet" in client.get("/jobs/").content.decode()
    assert "No node pools are registered yet" in client.get("/").content.decode()


def test_staff_see_the_admin_link(world):
    assert 'href="/admin/"' in session(world["ops"]).get("/").content.decode()


def test_simulated_pools_are_badged(world, cluster):
    client = session(world["alpha"]["member"])
    overview = client.get("/").content.decode()
    assert "SIMULATED" in overview
    assert "logical chips" in overview
    assert "h100-pool" in overview and "2 / 2" in overview and "14 / 16" in overview
    page = client.get("/cluster/").content.decode()
    assert page.count("SIMULATED") >= 3  # the pool and both of its nodes
    assert "h100-pool-1" in page and "lg-h100-a" in page and "fleetyard/pool=h100-pool" in page
    assert "989.5" in page and "Sources and notes for nvidia-h100" in page


def test_cordoned_and_unreachable_nodes_show(world, cluster):
    from controlplane.cluster.models import Node
    from controlplane.cluster.services import node_set_cordoned

    node_set_cordoned(actor=world["ops"], node=Node.objects.get(name="h100-pool-0"), cordoned=True)
    Node.objects.filter(name="h100-pool-1").update(health="unreachable")
    page = session(world["alpha"]["member"]).get("/cluster/").content.decode()
    assert "CORDONED" in page and "Unreachable" in page


def test_queues_page(world):
    page = session(world["alpha"]["member"]).get("/queues/").content.decode()
    assert "shared" in page and "all" in page and "nvidia-h100" in page
    assert "unlimited" in page  # no borrowing limit
    assert "standard" in page  # priority class
    assert "default" in page  # alpha's local queue


def test_datasets_page_lists_only_own_teams(world):
    alpha, beta = world["alpha"], world["beta"]
    mine = dataset_create(actor=alpha["admin"], team=alpha["team"], name="corpus")
    dataset_version_upload(actor=alpha["admin"], dataset=mine, upload=SimpleUploadedFile("a.txt", b"hello"))
    dataset_create(actor=beta["admin"], team=beta["team"], name="beta-private-corpus")
    page = session(alpha["member"]).get("/datasets/").content.decode()
    assert "dataset://corpus@1" in page and "UPLOADED" in page
    assert "2cf24dba5fb0" in page  # sha256("hello") prefix
    assert "beta-private-corpus" not in page


def test_other_teams_jobs_are_invisible(world):
    alpha, beta = world["alpha"], world["beta"]
    mine = make_job(alpha, "alpha-visible-job")
    theirs = make_job(beta, "beta-hidden-job")
    client = session(alpha["member"])
    assert client.get(f"/jobs/{mine.pk}/").status_code == 200
    assert client.get(f"/jobs/{theirs.pk}/").status_code == 404
    assert client.get("/jobs/999999/").status_code == 404
    for url in ["/", "/jobs/", f"/jobs/?state={theirs.state}"]:
        html = client.get(url).content.decode()
        assert "alpha-visible-job" in html
        assert "beta-hidden-job" not in html


def test_other_teams_deployments_are_invisible(world):
    alpha, beta = world["alpha"], world["beta"]
    common = {"accelerator_types": ["nvidia-a100"], "sla_ttft_p95_ms": 450, "sla_tpot_p95_ms": 40,
              "model_uri": "file:///m"}
    mine = deployment_create(actor=alpha["admin"], team=alpha["team"], name="alpha-chat",
                             local_queue=alpha["queue"], **common)
    theirs = deployment_create(actor=beta["admin"], team=beta["team"], name="beta-secret-chat",
                               local_queue=beta["queue"], **common)
    client = session(alpha["member"])
    detail = client.get(f"/deployments/{mine.pk}/")
    assert detail.status_code == 200
    html = detail.content.decode()
    assert "450" in html and "r1" in html and "created" in html
    assert client.get(f"/deployments/{theirs.pk}/").status_code == 404
    listing = client.get("/deployments/").content.decode()
    assert "alpha-chat" in listing and "beta-secret-chat" not in listing


def test_job_events_appear_on_its_timeline(world):
    alpha = world["alpha"]
    job = make_job(alpha, "train-lm")
    training_job_cancel(actor=alpha["admin"], job=job, reason="wrong learning rate, resubmitting")
    html = session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode()
    assert "Timeline" in html
    assert "submitted" in html
    assert "wrong learning rate, resubmitting" in html
    assert "CANCELLED" in html and "alpha-admin" in html


def test_state_filter(world):
    alpha = world["alpha"]
    make_job(alpha, "still-waiting")
    cancelled = make_job(alpha, "given-up")
    training_job_cancel(actor=alpha["admin"], job=cancelled)
    client = session(alpha["member"])
    html = client.get("/jobs/?state=CANCELLED").content.decode()
    assert "given-up" in html and "still-waiting" not in html
    html = client.get("/jobs/?state=cancelled").content.decode()  # case-insensitive
    assert "given-up" in html and "still-waiting" not in html
    html = client.get("/jobs/?state=<bogus>").content.decode()  # unknown state: show all, echo nothing
    assert "given-up" in html and "still-waiting" in html and "<bogus>" not in html


def test_user_strings_are_escaped(world):
    alpha = world["alpha"]
    evil = '<script>alert("x")</script>'
    job = make_job(alpha, "escaper", trainer="entrypoint", entrypoint=f"python train.py {evil}")
    # (a job stored before an entrypoint's hyperparameters were refused may hold any JSON)
    TrainingJob.objects.filter(pk=job.pk).update(hyperparameters={"note": "<img src=x onerror=alert(1)>"})
    job.refresh_from_db()
    training_job_cancel(actor=alpha["admin"], job=job, reason=f"stopped because {evil}")
    html = session(alpha["member"]).get(f"/jobs/{job.pk}/").content.decode()
    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_deployment_page_shows_what_the_gateway_measured(world):
    from inference.models import InferenceRequest

    alpha = world["alpha"]
    deployment = deployment_create(actor=alpha["admin"], team=alpha["team"], name="measured-chat",
                                   local_queue=alpha["queue"], accelerator_types=["nvidia-a100"],
                                   sla_ttft_p95_ms=450, sla_tpot_p95_ms=40, model_uri="file:///m")
    client = session(alpha["member"])
    empty = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "No requests in the last 15 minutes" in empty and '"model": "measured-chat"' in empty
    for i in range(4):
        InferenceRequest.objects.create(deployment=deployment, endpoint="completions", status_code=200,
                                        prompt_tokens=100, cached_tokens=25, output_tokens=10,
                                        ttft_ms=100.0 + i, tpot_ms=12.5, queue_ms=1.0)
    InferenceRequest.objects.create(deployment=deployment, endpoint="completions", status_code=429)
    html = client.get(f"/deployments/{deployment.pk}/").content.decode()
    assert "4 of 5 requests served" in html and "1× 429" in html
    assert "25 <span class=\"unit\">%</span>" in html  # 100 of 400 prompt tokens reused
    assert "103 <span class=\"unit\">ms</span>" in html  # TTFT p95 of 100..103
