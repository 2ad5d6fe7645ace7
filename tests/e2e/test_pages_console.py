"""Browser tests of the overview, cluster, queues, datasets and team pages: charts draw, a staff user
cordons a node and sees it without a reload, a waiting job says why, dataset versions are registered and
uploaded (with field errors), and a team admin adds a member and creates and revokes an API token."""

from __future__ import annotations

import re

from controlplane.cluster.tasks import sync_nodes
from controlplane.datasets.services import dataset_create
from jobs.services import training_job_create

READY = '[data-chart-ready="true"]'


def shot(console, name: str):
    """A screenshot from the top of the page (the sticky top bar otherwise lands mid-page)."""
    console.page.evaluate("window.scrollTo(0, 0)")
    console.shot(name)


def submit_job(console, team: str, name: str, **extra):
    """A job of `team` submitted through the service (the eager Celery of the tests enqueues it at commit)."""
    world = console.world[team]
    return training_job_create(actor=world["admin"], team=world["team"], name=name, local_queue=world["queue"],
                               accelerator_types=["nvidia-h100"], **extra)


def test_overview_draws_utilization_and_prices_what_runs(console):
    submit_job(console, "alpha", "overview-run", devices_per_worker=8)
    console.tick()
    sync_nodes()
    console.login("alpha-member")
    page = console.open("/")
    page.wait_for_selector(f'[data-chart="util-pools"]{READY}')
    page.wait_for_selector(f'[data-chart="util-types"]{READY}')
    console.wait_for_text("#running-jobs", r"overview-run")
    assert "8 of" in page.locator('[data-stat="utilization"]').inner_text()
    cost = page.locator('[data-stat="cost"] .stat-value').inner_text()
    assert re.match(r"\$\d+\.\d\d", cost) and cost != "$0.00", cost
    assert "SIMULATED" in page.locator("#cost-table").inner_text()
    assert "priced as the real chip type" in page.locator("main").inner_text()
    assert page.locator("#queue-depth").inner_text().count("shared") == 1
    # The live region refreshes in place and redraws its charts.
    page.evaluate("window.__stayed = true")
    page.wait_for_event("requestfinished", predicate=lambda request: request.headers.get("hx-request") == "true",
                        timeout=10_000)
    page.wait_for_selector(f'[data-chart="util-pools"]{READY}')
    assert page.evaluate("window.__stayed") is True
    shot(console, "pages-overview")


def test_staff_cordons_a_node_and_sees_it_without_reload(console):
    submit_job(console, "alpha", "heatmap-run", workers_min=3, workers_max=3, devices_per_worker=4)
    console.tick()
    console.login("ops", "pw-ops-123456")
    page = console.open("/cluster/")
    page.wait_for_selector(f'[data-chart="node-heatmap"]{READY}')
    page.evaluate("window.__stayed = true")
    row = page.locator('tr[data-node="h100-pool-0"]')
    assert row.locator(".cordon-state").inner_text().strip() == "no"
    row.get_by_role("button", name="Cordon").click()
    page.wait_for_function(
        "document.querySelector('tr[data-node=\"h100-pool-0\"] .cordon-state').innerText.includes('CORDONED')")
    assert page.evaluate("window.__stayed") is True  # no reload happened
    assert "is cordoned" in page.locator(".messages").inner_text()
    page.locator('tr[data-node="h100-pool-0"]').get_by_role("button", name="Uncordon").wait_for()
    page.wait_for_selector(f'[data-chart="node-heatmap"]{READY}')
    shot(console, "pages-cluster")
    page.locator('tr[data-node="h100-pool-0"]').get_by_role("button", name="Uncordon").click()
    page.wait_for_function(
        "!document.querySelector('tr[data-node=\"h100-pool-0\"] .cordon-state').innerText.includes('CORDONED')")


def test_members_get_no_cordon_buttons(console):
    console.login("alpha-member")
    page = console.open("/cluster/")
    page.wait_for_selector(f'[data-chart="node-heatmap"]{READY}')
    assert page.get_by_role("button", name="Cordon").count() == 0
    assert "Operators (staff) can cordon" in page.locator("main").inner_text()


def test_queues_page_says_why_a_job_waits(console):
    submit_job(console, "alpha", "queue-holder", workers_min=2, workers_max=2, devices_per_worker=8)
    submit_job(console, "alpha", "queue-waiter", devices_per_worker=8)
    console.tick()
    console.login("alpha-member")
    page = console.open("/queues/")
    page.wait_for_selector(f'[data-chart="quota"]{READY}')
    text = console.wait_for_text("#waiting-jobs", r"queue-waiter")
    assert "queue-holder" not in text
    reason = page.locator("#waiting-jobs .wait-reason").first.inner_text()
    assert "position 1 in cluster queue shared" in reason, reason
    assert "16 × nvidia-h100" in page.locator("#team-usage").inner_text()
    shot(console, "pages-queues")


def test_register_and_upload_dataset_versions(console):
    console.login("alpha-member")
    page = console.open("/datasets/")
    page.fill("#ds-name", "web-corpus")
    page.fill("#ds-description", "crawled pages")
    page.get_by_role("button", name="Create dataset").click()
    card = page.locator('section[data-dataset="web-corpus"]')
    card.wait_for()
    assert "No versions yet" in card.inner_text()

    register = card.locator('form[data-form="register"]')
    register.locator('input[name="uri"]').fill("ftp://mirror/corpus.tar")
    register.get_by_role("button", name="Register version").click()
    error = register.locator(".field-error")
    error.wait_for()
    assert "not a supported URI" in error.inner_text()
    register.locator('input[name="uri"]').fill("s3://datasets/web-corpus/v1/")
    register.locator('select[name="format"]').select_option("parquet")
    register.get_by_role("button", name="Register version").click()
    page.locator('section[data-dataset="web-corpus"] table.versions').wait_for()
    card = page.locator('section[data-dataset="web-corpus"]')
    assert "dataset://web-corpus@1" in card.inner_text() and "s3://datasets/web-corpus/v1/" in card.inner_text()

    card.get_by_text("Add a version to web-corpus").click()  # folded once the dataset has versions
    upload = card.locator('form[data-form="upload"]')
    upload.get_by_role("button", name="Upload version").click()  # no file chosen yet
    assert "choose a file" in upload.locator(".field-error").inner_text()
    upload.locator('input[name="file"]').set_input_files(
        files=[{"name": "sample.jsonl", "mimeType": "application/jsonl", "buffer": b'{"text": "hello"}\n'}])
    upload.locator('select[name="format"]').select_option("jsonl")
    upload.get_by_role("button", name="Upload version").click()
    page.get_by_text("dataset://web-corpus@2").wait_for()
    row = page.locator("table.versions tr", has_text="dataset://web-corpus@2")
    assert "UPLOADED" in row.inner_text() and "18\xa0bytes" in row.inner_text()
    shot(console, "pages-datasets")


def test_viewer_sees_datasets_but_cannot_add(console):
    world = console.world["alpha"]
    dataset_create(actor=world["admin"], team=world["team"], name="shared-corpus")
    console.login("alpha-viewer")
    page = console.open("/datasets/")
    assert "shared-corpus" in page.locator("main").inner_text()
    assert "You are a viewer in alpha" in page.locator("#viewer-note").inner_text()
    assert page.locator("form[data-api]").count() == 0


def test_team_admin_adds_a_member_and_manages_a_token(console):
    console.login("alpha-admin")
    page = console.open("/team/")
    team = page.locator('section[data-team="alpha"]')

    # The last admin cannot step down: the API's reason shows.
    own = team.locator('tr[data-member="alpha-admin"]')
    own.locator('select[name="role"]').select_option("member")
    own.get_by_role("button", name="Save").click()
    own.locator(".field-error").wait_for()
    assert "must keep at least one admin" in own.locator(".field-error").inner_text()

    add = team.locator("form.add-member")
    add.locator('input[name="username"]').fill("nobody-here")
    add.get_by_role("button", name="Add member").click()
    add.locator(".field-error").wait_for()
    assert "no user named" in add.locator(".field-error").inner_text()
    add.locator('input[name="username"]').fill("beta-viewer")
    add.locator('select[name="role"]').select_option("viewer")
    add.get_by_role("button", name="Add member").click()
    page.locator('section[data-team="alpha"] tr[data-member="beta-viewer"]').wait_for()
    assert "VIEWER" in page.locator('section[data-team="alpha"] tr[data-member="beta-viewer"]').inner_text()

    team = page.locator('section[data-team="alpha"]')
    form = team.locator("form.create-token")
    form.locator('input[name="name"]').fill("laptop-cli")
    form.get_by_role("button", name="Create token").click()
    secret = form.locator(".secret-value")
    secret.wait_for()
    raw = secret.inner_text().strip()
    assert len(raw) > 30
    assert "shown only once" in form.locator(".secret-box").inner_text()
    page.locator('tr[data-token="laptop-cli"]').wait_for()  # the list refreshed in place
    assert "ACTIVE" in page.locator('tr[data-token="laptop-cli"]').inner_text()
    form.get_by_role("button", name="Copy").click()
    shot(console, "pages-team")

    page.reload()
    page.wait_for_load_state("networkidle")
    assert raw not in page.content()
    assert page.locator(".secret-box").first.is_hidden()

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('tr[data-token="laptop-cli"]').get_by_role("button", name="Revoke").click()
    page.wait_for_function(
        "document.querySelector('tr[data-token=\"laptop-cli\"] .token-status').innerText.includes('REVOKED')")
    assert page.locator('tr[data-token="laptop-cli"]').get_by_role("button", name="Revoke").count() == 0


def test_every_page_fits_a_phone_screen(console):
    """At 390 px (a phone held upright) no page scrolls sideways: the top bar wraps onto rows and wide tables scroll
    inside their card. Before, the top bar's nine links kept their one 52 px row and widened every page to ~1,100 px
    (left for a later stop in stop 25's note)."""
    job = submit_job(console, "alpha", "phone-run", devices_per_worker=8)
    submit_job(console, "alpha", "phone-waiter", workers_min=4, workers_max=4, devices_per_worker=8)
    console.tick()
    console.page.set_viewport_size({"width": 390, "height": 844})
    console.login("alpha-admin")
    too_wide = {}
    for path in ("/", "/cluster/", "/queues/", "/datasets/", "/jobs/", "/jobs/new/", f"/jobs/{job.pk}/",
                 "/deployments/", "/deployments/new/", "/plan/", "/team/"):
        page = console.open(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 390:
            too_wide[path] = width
            shot(console, "phone" + path.replace("/", "-").rstrip("-"))
    assert not too_wide, f"pages wider than the 390 px screen (scroll width in px): {too_wide}"
    shot(console, "phone-team")
