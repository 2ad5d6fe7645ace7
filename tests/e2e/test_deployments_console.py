"""The deployments pages in a real browser: create a deployment through the form (a bad form first), watch it
reach SERVING by itself, ask it something in the playground, scale it, update its SLA, delete it."""

from __future__ import annotations

import re

from inference.models import Deployment, InferenceRequest
from inference.services import deployment_create
from jobs.models import TrainingJob
from jobs.runtime.checkpoints import save_checkpoint
from jobs.services import training_job_create
from jobs.workflows import checkpoint_dir
from tests.conftest import write_model_folder


def top(console):
    console.page.evaluate("window.scrollTo(0, 0)")


def test_create_serve_play_scale_update_delete(console, tmp_path):
    page = console.page
    model_dir = write_model_folder(tmp_path)
    console.login("alpha-member")

    console.open("/deployments/")
    assert "No deployments yet" in page.locator("main").inner_text()
    page.get_by_role("link", name="Create a deployment").click()
    page.wait_for_url(re.compile(r".*/deployments/new/$"))

    # A bad form: no accelerator type, then a relative model path; each reason shows under its field.
    page.fill("#dep-name", "chat-e2e")
    page.check("#src-uri")
    page.fill("#dep-uri", "models/lm")
    page.click("button:has-text('Create deployment')")
    error = page.locator(".accel-field + .field-error")
    error.wait_for()
    assert "at least 1" in error.inner_text()
    page.check("#accel-nvidia-a100")
    page.fill("#dep-devices", "0.5")
    page.fill("#dep-ttft", "400")
    page.fill("#dep-tpot", "40")
    page.click("button:has-text('Create deployment')")
    uri_error = page.locator("#dep-uri ~ .field-error, [data-source='uri'] + .field-error").first
    uri_error.wait_for()
    assert "absolute path" in uri_error.inner_text()
    assert page.locator("#dep-uri").get_attribute("aria-invalid") == "true"
    top(console)
    console.shot("deployments-new")

    page.fill("#dep-uri", f"file://{model_dir}")
    page.click("button:has-text('Create deployment')")
    page.wait_for_url(re.compile(r".*/deployments/\d+/$"))
    deployment = Deployment.objects.get(name="chat-e2e")
    assert deployment.sla_ttft_p95_ms == 400 and deployment.devices_per_replica == 0.5

    # It reaches SERVING by itself: the page polls while beat's sync runs.
    console.wait_for_text("#deployment-state", r"SERVING")
    assert "a100-pool" in page.locator("#deployment-placement").inner_text()
    assert "SIMULATED" in page.locator("#deployment-placement").inner_text()
    page.locator("#chart-ttft[data-chart-ready]").wait_for()
    console.shot("deployments-detail")

    # The playground streams the echo model's answer, then says what it measured.
    page.fill("#pg-prompt", "Hello there")
    page.fill("#pg-max", "24")
    page.click("#pg-send")
    page.locator("#pg-stats").wait_for()
    answer = page.locator("#pg-text").inner_text()
    assert answer.startswith("user: Hello there"), answer
    stats = page.locator("#pg-stats").inner_text()
    assert "TTFT (replica)" in stats and re.search(r"Output tokens\s+24", stats), stats
    assert "done (length)" in page.locator("#pg-status").inner_text()
    assert InferenceRequest.objects.filter(deployment=deployment, status_code=200).count() == 1
    console.wait_for_text("#measured-requests", r"^1$", tick=False)
    top(console)
    console.shot("deployments-playground")

    # Scale: a new revision, rolled out while it serves.
    page.click("#scale-panel > summary")
    page.fill("#scale-min", "2")
    page.fill("#scale-max", "3")
    page.click("button:has-text('Apply scale')")
    page.locator(".message.success").first.wait_for()
    assert "Revision r2 submitted" in page.locator(".message.success").first.inner_text()
    assert page.locator("#scale-min").input_value() == "2"  # the forms start from the new spec
    console.wait_for_text("#deployment-replicas", r"^2\b")
    console.wait_for_text("#deployment-state", r"SERVING")

    # Update the SLA: revision r3 shows, UPDATING then SERVING.
    page.click("#update-panel > summary")
    page.fill("#upd-ttft", "900")
    console.shot("deployments-update")
    page.click("button:has-text('Submit new revision')")
    console.wait_for_text("#deployment-state", r"UPDATING|SERVING", tick=False)
    console.wait_for_text("#revisions-table", r"r3", tick=False)
    assert "changed sla_ttft_p95_ms" in page.locator("#revisions-table").inner_text()
    console.wait_for_text("#deployment-state", r"SERVING")
    console.wait_for_text("#sla-ttft", r"900")
    assert Deployment.objects.get(pk=deployment.pk).revision == 3

    # The list shows it serving, with its SLA and where it runs.
    console.open("/deployments/")
    row = page.locator('tr[data-deployment="chat-e2e"]')
    assert re.search(r"SERVING", row.inner_text()) and "900 ms / 40 ms" in row.inner_text()
    assert "SIMULATED" in row.inner_text()
    console.shot("deployments-list")
    row.get_by_role("link", name="chat-e2e").click()
    page.wait_for_url(re.compile(r".*/deployments/\d+/$"))

    # Delete: confirm, back to the list where it shows as DELETED.
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Delete')")
    page.wait_for_url(re.compile(r".*/deployments/$"))
    row = page.locator('tr[data-deployment="chat-e2e"]')
    assert "DELETED" in row.inner_text()
    assert "1" in page.locator('.filter[data-state="DELETED"]').inner_text()


def test_playground_says_clearly_when_the_model_is_not_serving(console):
    alpha = console.world["alpha"]
    # 3 replicas x 8 devices always running is 24 A100s on a 16-device quota: it waits, PENDING, for good.
    # (One 64-device replica, as before, is now refused at create: no node could hold it.)
    waiting = deployment_create(actor=alpha["admin"], team=alpha["team"], name="no-room",
                                local_queue=alpha["queue"], accelerator_types=["nvidia-a100"],
                                sla_ttft_p95_ms=500, sla_tpot_p95_ms=50, model_uri="file:///nowhere",
                                devices_per_replica=8, replicas_min=3, replicas_max=3)
    console.login("alpha-member")
    console.open(f"/deployments/{waiting.pk}/")
    assert "PENDING" in console.page.locator("#deployment-state").inner_text()
    assert "answers once SERVING" in console.page.locator("#playground-not-ready").inner_text()
    console.page.fill("#pg-prompt", "anyone there?")
    console.page.click("#pg-send")
    error = console.page.locator("#pg-error")
    error.wait_for()
    assert "503 · Not serving" in error.inner_text() and "not serving yet" in error.inner_text()
    assert console.page.locator("#pg-send").is_enabled()


def test_deploy_a_finished_job_from_its_link(console):
    """The jobs page links to /deployments/new/?job=<id>: the job and its accelerator types come preselected."""
    alpha = console.world["alpha"]
    job = training_job_create(actor=alpha["admin"], team=alpha["team"], name="trained-lm",
                              local_queue=alpha["queue"], accelerator_types=["nvidia-h100"])
    info = save_checkpoint(checkpoint_dir(job), step=50, files={"config.json": b"{}", "model.pt": b"w" * 64})
    TrainingJob.objects.filter(pk=job.pk).update(state="SUCCEEDED", last_checkpoint_step=50)
    console.login("alpha-member")
    page = console.open(f"/deployments/new/?job={job.pk}")
    assert page.locator("#src-job").is_checked() and page.locator("#dep-uri").is_disabled()
    assert "checkpoint at step 50" in page.locator("#dep-job option:checked").inner_text()
    assert page.locator("#accel-nvidia-h100").is_checked()
    page.fill("#dep-name", "from-job")
    page.click("button:has-text('Create deployment')")
    page.wait_for_url(re.compile(r".*/deployments/\d+/$"))
    console.wait_for_text("#deployment-state", r"SERVING")
    assert "trained-lm" in page.locator("#deployment-history").inner_text()
    assert Deployment.objects.get(name="from-job").model_dir == str(info.path)
