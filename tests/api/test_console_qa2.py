"""The console with each role and odd input, second QA pass (2026-12-07). Each test failed on the code before its
fix."""

from __future__ import annotations

import html as html_lib
import json
import re

from controlplane.common.lifecycle import record_event
from inference.models import DeploymentEvent
from jobs.models import TrainingJob, TrainingJobEvent
from tests.api.test_console_deployments import make_deployment
from tests.api.test_console_qa import make_job, session


def event_data_shown(page: str) -> list[dict]:
    """The JSON of every timeline event's "data" block on a console page."""
    return [json.loads(html_lib.unescape(text)) for text in
            re.findall(r"<summary>data</summary><pre class=\"code\">(.*?)</pre>", page, re.S)]


def test_the_timeline_data_hides_another_teams_ids_as_the_api_does(world):
    """A job's or a deployment's timeline showed each event's data as stored: the scheduler's `for` (the preemptor)
    and `waits_for` (the victims) named another team's job by id, which the API's events endpoint and every reason
    hide (null there). The console shows the data as the API does; the team's own ids stay."""
    alpha, beta = world["alpha"], world["beta"]
    for i in range(3):  # ids that differ from any count on the page
        make_job(beta, f"filler-{i}")
    theirs, mine = make_job(beta, "theirs"), make_job(alpha, "mine")
    record_event(obj=mine, event_model=TrainingJobEvent, from_state="QUEUED", to_state="PREEMPTED", reason="preempted",
                 system="scheduler", data={"for": theirs.pk, "waits_for": [theirs.pk, mine.pk]})
    deployment = make_deployment(alpha, "chat")
    record_event(obj=deployment, event_model=DeploymentEvent, from_state="SERVING", to_state="SERVING",
                 reason="shrunk", system="scheduler", data={"for": theirs.pk})
    client = session(alpha["viewer"])
    api = client.get(f"/api/v1/training-jobs/{mine.pk}/events/").json()["results"]
    assert [e["data"] for e in api if e["data"]] == [{"for": None, "waits_for": [None, mine.pk]}]

    assert event_data_shown(client.get(f"/jobs/{mine.pk}/").content.decode()) == [
        {"for": None, "waits_for": [None, mine.pk]}]
    assert {"for": None} in event_data_shown(client.get(f"/deployments/{deployment.pk}/").content.decode())


def test_a_long_timeline_shows_its_latest_events_not_every_one(world):
    """A job's and a deployment's page listed every event and revision, and re-rendered them every 3 s while live: an
    elastic job with 5,000 events (each grow and shrink is one) made a 3.6 MB page that took about 2 s. The pages
    show the latest 100 in time order, say how many there are and link the API's paged list."""
    from inference.models import DeploymentRevision

    alpha = world["alpha"]
    job = make_job(alpha, "busy")
    TrainingJobEvent.objects.bulk_create([
        TrainingJobEvent(subject=job, from_state="RUNNING", to_state="RUNNING", reason=f"resize number {i}",
                         actor_label="system:launcher") for i in range(1, 301)])
    client = session(alpha["viewer"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    shown = [int(n) for n in re.findall(r'<div class="timeline-reason">resize number (\d+)</div>', page)]
    assert shown == list(range(201, 301)), shown[:3]
    assert "The latest 100 of 301 events" in page
    assert f'<a href="/api/v1/training-jobs/{job.pk}/events/">the API lists them all</a>' in page
    small = make_job(alpha, "small")
    assert "The latest" not in client.get(f"/jobs/{small.pk}/").content.decode()

    deployment = make_deployment(alpha, "chat")
    DeploymentEvent.objects.bulk_create([
        DeploymentEvent(subject=deployment, from_state="SERVING", to_state="SERVING", reason=f"scaled number {i}",
                        actor_label="system:autoscaler") for i in range(1, 151)])
    DeploymentRevision.objects.bulk_create([
        DeploymentRevision(deployment=deployment, number=n, spec={}, reason=f"revision number {n}")
        for n in range(2, 131)])
    page = client.get(f"/deployments/{deployment.pk}/").content.decode()
    shown = [int(n) for n in re.findall(r'<div class="timeline-reason">scaled number (\d+)</div>', page)]
    assert shown == list(range(51, 151)), shown[:3]
    assert "The latest 100 of 151 events" in page and "The latest 100 of 130 revisions" in page
    revisions = [int(n) for n in re.findall(r'<tr data-revision="(\d+)">', page)]
    assert revisions == list(range(130, 30, -1)), revisions[:3]


def test_the_queues_page_lists_the_first_waiting_jobs_not_every_one(world):
    """The Queues page's "Pending workloads" listed every waiting job of the user's teams, each with its reason, and
    re-rendered them every 3 s: a backlog of thousands made every refresh as long. It lists the first 100 in queue
    order, says how many wait and links the jobs page's paged list of QUEUED jobs."""
    alpha = world["alpha"]
    jobs = TrainingJob.objects.bulk_create([  # (130 submissions in a minute would pass the team's rate limit)
        TrainingJob(team=alpha["team"], name=f"wait-{i}", local_queue=alpha["queue"], accelerator_types=["nvidia-h100"],
                    state="QUEUED", queue_position=i) for i in range(1, 131)])
    page = session(alpha["viewer"]).get("/queues/").content.decode()
    listed = re.findall(r'>wait-(\d+)</a>', page.split('id="waiting-jobs"')[1])
    assert listed == [str(i) for i in range(1, 101)], listed[-3:]
    assert "The first 100 of 130 waiting jobs" in page and 'href="/jobs/?state=QUEUED"' in page
    TrainingJob.objects.filter(pk__in=[job.pk for job in jobs[5:]]).update(state="CANCELLED")
    page = session(alpha["viewer"]).get("/queues/").content.decode()
    assert "The first" not in page and len(re.findall(r'>wait-(\d+)</a>', page)) == 5


def test_the_deployments_list_is_paged_like_the_jobs_list(world):
    """The Deployments page listed every deployment of the user's teams, deleted ones included (they stay listed), and
    re-rendered them all every 3 s. It shows 50 a page, newest first, with the jobs list's pager, which keeps the state
    filter; a page number that is not one is the first or the last page, as on the jobs list."""
    from datetime import timedelta

    from inference.models import Deployment

    alpha = world["alpha"]
    base = make_deployment(alpha, "base")
    Deployment.objects.bulk_create([  # (bulk: 120 creations in a minute would pass the team's rate limit)
        Deployment(team=alpha["team"], name=f"dep-{i:03d}", local_queue=alpha["queue"], model_uri="file:///m",
                   accelerator_types=["nvidia-a100"], sla_ttft_p95_ms=500, sla_tpot_p95_ms=50,
                   state="DELETED" if i % 2 else "PENDING", created_at=base.created_at + timedelta(seconds=i))
        for i in range(1, 120)])
    client = session(alpha["viewer"])

    def names(url):
        page = client.get(url)
        assert page.status_code == 200
        html = page.content.decode()
        return re.findall(r">(dep-\d+|base)</a>", html), html

    first, html = names("/deployments/")
    assert len(first) == 50 and first[0] == "dep-119" and "page 1 of 3" in html
    assert 'href="?page=2"' in html
    last, html = names("/deployments/?page=3")
    assert last[-1] == "base" and len(last) == 20
    assert names("/deployments/?page=99")[0] == last and names("/deployments/?page=x")[0] == first
    deleted, html = names("/deployments/?state=deleted&page=2")
    assert len(deleted) == 10 and 'href="?state=DELETED&amp;page=1"' in html


def test_the_datasets_page_is_paged_and_shows_each_datasets_latest_versions(world, django_assert_max_num_queries):
    """The Datasets page listed every dataset of the user's teams with every version of each (one dataset registered
    nightly for years made one page of thousands of rows). It shows 50 datasets a page with the jobs list's pager, and
    each dataset's latest 20 versions, saying how many there are, with a link to the API's paged list of them all."""
    from controlplane.datasets.models import Dataset, DatasetVersion

    alpha = world["alpha"]
    datasets = Dataset.objects.bulk_create([Dataset(team=alpha["team"], name=f"ds-{i:02d}") for i in range(55)])
    big = datasets[0]
    DatasetVersion.objects.bulk_create([DatasetVersion(dataset=big, version=v, uri=f"s3://b/{v}/")
                                        for v in range(1, 26)])
    DatasetVersion.objects.create(dataset=datasets[1], version=1, uri="s3://b/one/")
    client = session(alpha["viewer"])
    with django_assert_max_num_queries(20):
        html = client.get("/datasets/").content.decode()
    assert re.findall(r'data-dataset="(ds-\d+)"', html) == [f"ds-{i:02d}" for i in range(50)]
    assert "page 1 of 2" in html and 'href="?page=2"' in html
    card = html.split('data-dataset="ds-00"')[1].split("</section>")[0]
    assert re.findall(r"dataset://ds-00@(\d+)<", card) == [str(v) for v in range(25, 5, -1)]
    assert "The latest 20 of 25 versions" in card and f'href="/api/v1/datasets/{big.pk}/versions/"' in card
    one = html.split('data-dataset="ds-01"')[1].split("</section>")[0]
    assert "dataset://ds-01@1<" in one and "The latest" not in one
    second = client.get("/datasets/?page=2").content.decode()
    assert re.findall(r'data-dataset="(ds-\d+)"', second) == [f"ds-{i:02d}" for i in range(50, 55)]
    assert 'href="?page=1"' in second and "Previous" in second
    listed = client.get(f"/api/v1/datasets/{big.pk}/versions/").json()  # every version, from the link
    assert listed["count"] == 25


def test_the_team_page_shows_each_teams_latest_tokens(world):
    """The Team page listed every API token an admin may see, revoked ones included, however many. It shows each team's
    latest 50, newest first, saying how many there are, with a link to the API's list of the team's tokens."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.tenancy.models import ApiToken

    alpha = world["alpha"]
    start = timezone.now() - timedelta(days=1)
    ApiToken.objects.bulk_create([
        ApiToken(team=alpha["team"], user=alpha["member"] if i % 2 else alpha["admin"], name=f"tok-{i:02d}",
                 prefix=f"p{i:02d}", token_hash=f"{i:064d}", created_at=start + timedelta(minutes=i),
                 revoked_at=start if i % 3 == 0 else None)
        for i in range(60)])
    ApiToken.objects.create(team=world["beta"]["team"], user=world["beta"]["admin"], name="beta-tok", prefix="pb",
                            token_hash="b" * 64)
    html = session(alpha["admin"]).get("/team/").content.decode()
    listed = re.findall(r'data-token="(tok-\d+)"', html)
    assert listed == [f"tok-{i:02d}" for i in range(59, 9, -1)], listed[-3:]
    assert "The latest 50 of 60 tokens" in html and 'href="/api/v1/api-tokens/?team__name=alpha"' in html
    everything = session(alpha["admin"]).get("/api/v1/api-tokens/?team__name=alpha&page_size=100").json()
    assert everything["count"] == 60
    # a member sees only their own (30), the latest 50 of them: all
    html = session(alpha["member"]).get("/team/").content.decode()
    assert len(re.findall(r'data-token="(tok-\d+)"', html)) == 30 and "The latest" not in html
