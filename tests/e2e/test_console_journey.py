"""The console's main journey in a real browser, as the issue states it: log in, submit a job, watch it run,
open its logs, create a deployment from it, and send a prompt in the playground, all without reloading.

The in-memory compute backend runs the job's steps but writes no weights, so once the job has ended the
test saves a checkpoint in the job's checkpoint folder (what the Ray runtime writes), and the serving
backend answers with its echo model. Both are labelled simulated in the README."""

from __future__ import annotations

import re

from jobs.models import TrainingJob
from jobs.runtime.checkpoints import save_checkpoint
from jobs.workflows import checkpoint_dir


def test_log_in_submit_watch_logs_deploy_and_ask(console):
    page = console.page
    console.open("/login/")
    console.shot("journey-0-login")
    console.login("alpha-member")
    assert page.locator("h1").first.inner_text().strip() == "Overview"
    console.shot("journey-1-overview")

    # Submit a small CPU job through the form.
    page.click("nav >> text=Training jobs")
    page.wait_for_url(re.compile(r".*/jobs/$"))
    page.goto(console.url + "/jobs/new/")
    page.fill("#f-name", "journey-lm")
    page.check("#f-type-cpu")
    page.fill("#f-workers-min", "1")
    page.fill("#f-workers-max", "1")
    page.fill("#f-cpus", "1")
    page.fill("#f-hyper", '{"steps": 120}')
    page.fill("#f-ckpt-interval", "40")
    page.click('#job-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = TrainingJob.objects.get(name="journey-lm")

    # Watch it run: the page updates itself while beat's work runs; the logs panel follows the stream.
    console.wait_for_text("#job-head", r"RUNNING|SUCCEEDED")
    console.wait_for_text("#job-logs", r"checkpoint saved at step 39")
    page.wait_for_selector("#chart-loss[data-chart-ready] canvas")
    console.shot("journey-2-job-running")
    console.wait_for_text("#job-head", r"SUCCEEDED", timeout=120)
    console.wait_for_text("#job-logs", r"checkpoint saved at step 119", tick=False)

    # The weights the Ray runtime would have written; then the job page offers to deploy them.
    save_checkpoint(checkpoint_dir(job), step=119, files={"config.json": b"{}", "model.pt": b"w" * 64})
    TrainingJob.objects.filter(pk=job.pk).update(last_checkpoint_step=119)
    page.reload()
    page.click("#job-head a:has-text('Deploy')")
    page.wait_for_url(re.compile(rf".*/deployments/new/\?job={job.pk}$"))
    assert page.locator("#src-job").is_checked()
    page.fill("#dep-name", "journey-chat")
    page.check("#accel-cpu")
    page.fill("#dep-devices", "1")
    page.click("button:has-text('Create deployment')")
    page.wait_for_selector(".field-error, .form-errors:not([hidden]), #deployment-state", timeout=15_000)
    errors = page.locator(".field-error, .form-errors:not([hidden])").all_inner_texts()
    assert not errors, errors
    page.wait_for_url(re.compile(r".*/deployments/\d+/$"))
    console.wait_for_text("#deployment-state", r"SERVING")
    console.shot("journey-3-deployment")

    # Ask it something: the answer streams into the playground.
    page.fill("#pg-prompt", "What did you learn?")
    page.fill("#pg-max", "16")
    page.click("#pg-send")
    page.locator("#pg-stats").wait_for()
    assert page.locator("#pg-text").inner_text().startswith("user: What did")  # the echo model repeats the chat
    assert re.search(r"Output tokens\s+16", page.locator("#pg-stats").inner_text())
    console.shot("journey-4-playground")
