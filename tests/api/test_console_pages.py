"""Console pages of the overview, cluster, queues, datasets and team areas, through Django's test client:
what they show from the database, empty states, team isolation, staff-only controls and escaping."""

from __future__ import annotations

import json
import re

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from controlplane.cluster.models import Node
from controlplane.cluster.services import node_set_cordoned
from controlplane.datasets.services import dataset_create, dataset_version_register, dataset_version_upload
from controlplane.tenancy.services import api_token_create, api_token_revoke
from jobs.models import TrainingJob
from jobs.services import training_job_create, training_job_enqueue
from jobs.tasks import run_scheduling_cycle
from tests.api.conftest import small_cluster


@pytest.fixture
def cluster(world, accel):
    """A simulated H100 pool (2 nodes, 4 of 16 devices in use) and a real CPU pool (1 of 4 CPUs in use)."""
    small_cluster(world, accel, h100_free_on_first=4)


def session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def json_block(html: str, element_id: str):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html, re.S)
    assert match, f"no json_script block {element_id}"
    return json.loads(match.group(1))


def make_job(team_world, name: str, **extra) -> TrainingJob:
    """A submitted job, enqueued as the enqueue task would (the test's transaction runs no on_commit work)."""
    job = training_job_create(actor=team_world["admin"], team=team_world["team"], name=name,
                              local_queue=team_world["queue"], accelerator_types=["nvidia-h100"], **extra)
    training_job_enqueue(job_id=job.pk)
    return job


# -- overview ----------------------------------------------------------------------------------------------

def test_overview_shows_utilization_cost_and_charts(world, cluster):
    html = session(world["alpha"]["member"]).get("/").content.decode()
    data = json_block(html, "overview-utilization-data")
    pools = {row["name"]: row for row in data["pools"]}
    assert pools["h100-pool"]["used"] == 4 and pools["h100-pool"]["capacity"] == 16
    assert pools["h100-pool"]["percent"] == 25.0 and pools["h100-pool"]["simulated"] is True
    assert pools["cpu-pool"]["unit"] == "CPUs" and pools["cpu-pool"]["used"] == 1
    assert {row["name"] for row in data["types"]} == {"nvidia-h100", "cpu"}
    assert 'data-chart="util-pools"' in html and 'data-chart="util-types"' in html
    assert "echarts-6.1.0.min.js" in html and "pages/overview.js" in html
    # 4 H100 x the seeded price + 1 vCPU x $0.0504, priced as the real chip even though simulated.
    from controlplane.cluster.models import AcceleratorType
    h100 = float(AcceleratorType.objects.get(slug="nvidia-h100").price_per_hour_usd)
    assert f"${4 * h100 + 0.0504:.2f}" in html
    assert "priced as the real chip type" in html
    assert "4 of 16 devices" in html and "25%" in html
    assert 'hx-trigger="every 3s"' in html and 'hx-select="#overview-live"' in html


def test_overview_queue_depth_running_jobs_and_ettr(world, cluster):
    alpha = world["alpha"]
    make_job(alpha, "runs-now", devices_per_worker=8)
    make_job(alpha, "too-big", workers_min=3, workers_max=3, devices_per_worker=8)
    run_scheduling_cycle()
    html = session(alpha["member"]).get("/").content.decode()
    assert re.search(r'<td>shared</td><td class="num warn-text">1</td>', html)
    running = html[html.index('id="running-jobs"'):html.index('id="serving-deployments"')]
    assert "runs-now" in running and "too-big" not in running and "ADMITTED" in running
    assert "no job of your teams has started yet" in html  # nothing has run, so no ETTR to show
    assert "No deployment of your teams is serving" in html


def test_overview_hides_other_teams_work(world, cluster):
    make_job(world["beta"], "beta-secret-run", devices_per_worker=8)
    run_scheduling_cycle()
    html = session(world["alpha"]["member"]).get("/").content.decode()
    assert "beta-secret-run" not in html
    assert "No training job of your teams is running" in html


def test_overview_empty_cluster(django_user_model, db):
    loner = django_user_model.objects.create_user("loner", password="pw-123456789")
    html = session(loner).get("/").content.decode()
    assert "nothing to measure" in html
    assert "No cluster queues exist yet" in html
    assert 'data-chart="util-pools"' not in html


# -- cluster -----------------------------------------------------------------------------------------------

def test_cluster_heatmap_has_a_cell_per_node(world, cluster):
    html = session(world["alpha"]["member"]).get("/cluster/").content.decode()
    data = json_block(html, "cluster-heatmap-data")
    assert data["pools"] == ["cpu-pool", "h100-pool"] and data["columns"] == 2
    cells = {cell["name"]: cell for cell in data["cells"]}
    assert cells["h100-pool-0"]["percent"] == 50.0 and cells["h100-pool-0"]["y"] == 1
    assert cells["h100-pool-1"]["x"] == 1 and cells["h100-pool-1"]["percent"] == 0.0
    assert cells["cpu-pool-0"]["unit"] == "CPUs" and cells["cpu-pool-0"]["percent"] == 25.0
    assert cells["h100-pool-0"]["simulated"] is True and cells["cpu-pool-0"]["simulated"] is False
    assert 'data-chart="node-heatmap"' in html and 'hx-trigger="every 3s, refresh"' in html


def test_cordon_buttons_are_for_staff_only(world, cluster):
    node = Node.objects.get(name="h100-pool-0")
    member = session(world["alpha"]["admin"]).get("/cluster/").content.decode()
    assert f"/api/v1/nodes/{node.pk}/cordon/" not in member and ">Cordon<" not in member
    assert "Operators (staff) can cordon" in member
    staff = session(world["ops"]).get("/cluster/").content.decode()
    assert f'data-api="/api/v1/nodes/{node.pk}/cordon/"' in staff
    node_set_cordoned(actor=world["ops"], node=node, cordoned=True)
    staff = session(world["ops"]).get("/cluster/").content.decode()
    assert f'data-api="/api/v1/nodes/{node.pk}/uncordon/"' in staff
    assert json_block(staff, "cluster-heatmap-data")["cells"][1]["cordoned"] is True


def test_cluster_node_strings_are_escaped(world, cluster):
    Node.objects.filter(name="h100-pool-1").update(labels={"note": "<script>alert(1)</script>"})
    html = session(world["alpha"]["member"]).get("/cluster/").content.decode()
    assert "<script>alert(1)</script>" not in html
    assert "note=&lt;script&gt;alert(1)&lt;/script&gt;" in html


# -- queues ------------------------------------------------------------------------------------------------

def test_queues_show_usage_against_quota_and_why_jobs_wait(world, cluster):
    alpha = world["alpha"]
    make_job(alpha, "holds-eight", devices_per_worker=8)
    make_job(alpha, "waits-for-room", workers_min=3, workers_max=3, devices_per_worker=8)
    run_scheduling_cycle()
    waiting = TrainingJob.objects.get(name="waits-for-room")
    assert waiting.state == "QUEUED" and waiting.state_reason
    html = session(alpha["member"]).get("/queues/").content.decode()
    rows = json_block(html, "queues-quota-data")
    h100 = next(row for row in rows if row["type"] == "nvidia-h100")
    assert h100 == {"queue": "shared", "type": "nvidia-h100", "unit": "devices", "used": 8.0, "serving": 0.0,
                    "nominal": 16.0, "limit": None, "borrowing_limit": None, "cohort": "all"}
    assert "no cap: may borrow all idle quota" in html
    pending = html[html.index('id="waiting-jobs"'):]
    assert "waits-for-room" in pending and "holds-eight" not in pending
    assert waiting.state_reason.split(":")[0] in pending  # "position 1 in cluster queue shared"
    team = html[html.index('id="team-usage"'):html.index('id="waiting-jobs"')]
    assert "8 × nvidia-h100" in team


def test_queues_hide_other_teams_jobs_and_queues(world, cluster):
    make_job(world["beta"], "beta-waiting-job", workers_min=5, workers_max=5, devices_per_worker=8)
    run_scheduling_cycle()
    html = session(world["alpha"]["member"]).get("/queues/").content.decode()
    assert "beta-waiting-job" not in html
    assert "Nothing is waiting" in html
    team = html[html.index('id="team-usage"'):html.index('id="waiting-jobs"')]
    assert "alpha" in team and "beta" not in team


def test_queues_borrowing_cap_and_no_cohort(world, accel):
    from controlplane.quotas.services import cluster_queue_create

    cluster_queue_create(actor=world["ops"], name="solo", cohort="", quotas=[
        {"accelerator_type": "nvidia-a100", "nominal_quota": 4}])
    cluster_queue_create(actor=world["ops"], name="lender", cohort="all", quotas=[
        {"accelerator_type": "nvidia-a100", "nominal_quota": 4, "borrowing_limit": 2}])
    rows = json_block(session(world["alpha"]["member"]).get("/queues/").content.decode(), "queues-quota-data")
    limits = {row["queue"]: row["limit"] for row in rows if row["type"] == "nvidia-a100"}
    assert limits == {"solo": 4.0, "lender": 6.0, "shared": None}


# -- datasets ----------------------------------------------------------------------------------------------

def test_datasets_forms_for_members_and_read_only_for_viewers(world):
    alpha = world["alpha"]
    corpus = dataset_create(actor=alpha["admin"], team=alpha["team"], name="corpus")
    member = session(alpha["member"]).get("/datasets/").content.decode()
    assert 'data-api="/api/v1/datasets/"' in member
    assert f'data-api="/api/v1/datasets/{corpus.pk}/versions/"' in member and "data-multipart" in member
    assert "Register a URI or upload a file below" in member
    # The hint offered file:// URIs, which the API refuses since the SSRF review (found by QA).
    assert "http(s), file or hf" not in member and "not file://" in member
    viewer = session(alpha["viewer"]).get("/datasets/").content.decode()
    assert "corpus" in viewer
    assert "data-api=" not in viewer.split("<main", 1)[1]
    assert "You are a viewer in <strong>alpha</strong>" in viewer


def test_datasets_list_versions_newest_first_and_isolated(world):
    alpha, beta = world["alpha"], world["beta"]
    corpus = dataset_create(actor=alpha["admin"], team=alpha["team"], name="corpus", description="web text")
    dataset_version_upload(actor=alpha["admin"], dataset=corpus, upload=SimpleUploadedFile("a.txt", b"hello"))
    dataset_version_register(actor=alpha["admin"], dataset=corpus, uri="s3://bucket/corpus/v2/",
                             description="<b>cleaned</b>")
    theirs = dataset_create(actor=beta["admin"], team=beta["team"], name="beta-private-corpus")
    html = session(alpha["member"]).get("/datasets/").content.decode()
    assert html.index("dataset://corpus@2") < html.index("dataset://corpus@1")
    assert "REGISTERED" in html and "s3://bucket/corpus/v2/" in html and "UPLOADED" in html
    assert "&lt;b&gt;cleaned&lt;/b&gt;" in html and "<b>cleaned</b>" not in html
    assert "beta-private-corpus" not in html and f"/api/v1/datasets/{theirs.pk}/" not in html


def test_datasets_empty_states(world, django_user_model):
    assert "Create one above" in session(world["alpha"]["member"]).get("/datasets/").content.decode()
    assert "A team member creates one" in session(world["alpha"]["viewer"]).get("/datasets/").content.decode()
    loner = django_user_model.objects.create_user("loner", password="pw-123456789")
    assert "Join a team first" in session(loner).get("/datasets/").content.decode()


# -- team settings -----------------------------------------------------------------------------------------

def test_team_page_admin_controls(world):
    alpha = world["alpha"]
    html = session(alpha["admin"]).get("/team/").content.decode()
    for username in ("alpha-admin", "alpha-member", "alpha-viewer"):
        assert f'data-member="{username}"' in html
    assert 'data-api="/api/v1/memberships/"' in html and "Add member" in html
    assert 'data-method="PATCH"' in html and 'data-method="DELETE"' in html
    assert "the last admin cannot be removed or demoted" in html
    assert "beta-member" not in html


def test_team_page_members_cannot_manage_members_but_can_create_tokens(world):
    html = session(world["alpha"]["member"]).get("/team/").content.decode()
    assert 'data-member="alpha-viewer"' in html
    assert 'data-api="/api/v1/memberships/"' not in html and 'data-method="DELETE"' not in html
    assert "Only the team's admins add members" in html
    assert 'data-api="/api/v1/api-tokens/"' in html and "shown only once" in html


def test_team_page_tokens_are_listed_as_the_api_lists_them(world):
    alpha = world["alpha"]
    mine, raw = api_token_create(actor=alpha["member"], team=alpha["team"], user=alpha["member"], name="member-cli")
    other, _ = api_token_create(actor=alpha["viewer"], team=alpha["team"], user=alpha["viewer"], name="viewer-cli")
    api_token_revoke(actor=alpha["viewer"], token=other)
    member = session(alpha["member"]).get("/team/").content.decode()
    assert 'data-token="member-cli"' in member and "viewer-cli" not in member
    assert raw not in member and mine.prefix in member  # the secret is never rendered, only its prefix
    assert f"/api/v1/api-tokens/{mine.pk}/revoke/" in member and "ACTIVE" in member
    admin = session(alpha["admin"]).get("/team/").content.decode()
    assert 'data-token="member-cli"' in admin and 'data-token="viewer-cli"' in admin and "REVOKED" in admin
    assert f"/api/v1/api-tokens/{other.pk}/revoke/" not in admin  # already revoked
    beta = session(world["beta"]["admin"]).get("/team/").content.decode()
    assert "member-cli" not in beta


def test_team_page_without_a_team(django_user_model, db):
    loner = django_user_model.objects.create_user("loner", password="pw-123456789")
    html = session(loner).get("/team/").content.decode()
    assert "You are not a member of any team yet" in html and "loner" in html


def test_queues_count_serving_replicas_in_the_quota_usage(world, cluster):
    from inference.models import Deployment

    alpha = world["alpha"]
    make_job(alpha, "holds-eight", devices_per_worker=8)
    run_scheduling_cycle()
    Deployment.objects.create(team=alpha["team"], name="chat", local_queue=alpha["queue"], state="SERVING",
                              accelerator_types=["nvidia-h100"], accelerator_type="nvidia-h100",
                              devices_per_replica=4, replicas_min=1, replicas_max=2, replicas_ready=2,
                              sla_ttft_p95_ms=500, sla_tpot_p95_ms=100)
    html = session(alpha["member"]).get("/queues/").content.decode()
    h100 = next(row for row in json_block(html, "queues-quota-data") if row["type"] == "nvidia-h100")
    assert (h100["used"], h100["serving"]) == (16.0, 8.0)  # 8 training + 2 replicas x 4
    assert "(8 serving)" in html
