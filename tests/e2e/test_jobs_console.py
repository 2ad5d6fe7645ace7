"""The training job pages in a real browser: submit by form (with field errors) and by YAML (with a
dry-run plan and line-numbered errors), watch a job run to the end on its page (state, logs, charts,
ETTR) without reloading, cancel, retry and clone, filter the list, and what a viewer sees."""

from __future__ import annotations

import re

from jobs.models import TrainingJob
from jobs.services import training_job_create

GOOD_YAML = """name: yaml-cpu-job
queue: default
workers: 1
resources:
  accelerators: cpu
  cpus: 1
hyperparameters:
  steps: 50
"""

BAD_YAML = """name: yaml-bad-job
queue: default
workers: 1
resources:
  accelerators: H900:8
"""


def tick_until(console, job_id: int, state: str, limit: int = 60) -> None:
    for _ in range(limit):
        console.tick()
        if TrainingJob.objects.get(pk=job_id).state == state:
            return
    raise AssertionError(f"job {job_id} never reached {state}: {TrainingJob.objects.get(pk=job_id).state}")


def leave(console) -> None:
    """End the test cleanly: leave the page and cancel what still runs, so every log stream the server
    follows ends (with its job) before the test database goes away."""
    from jobs.services import training_job_cancel

    console.page.goto("about:blank")
    for job in TrainingJob.objects.exclude(state__in=TrainingJob.terminal_state_values()):
        training_job_cancel(actor=console.world["ops"], job=job, reason="test over")
    console.page.wait_for_timeout(1000)


def job_id_from_url(page) -> int:
    return int(re.search(r"/jobs/(\d+)/$", page.url).group(1))


def test_submit_by_form_and_watch_the_job_run_to_the_end(console):
    page = console.page
    console.login("alpha-member")
    console.open("/jobs/")
    assert "No training jobs yet" in page.locator("#jobs-live").inner_text()
    page.locator(".jobs-empty a", has_text="Submit a job").click()
    page.wait_for_url(re.compile(r".*/jobs/new/$"))

    # A mistake the API's serializer catches (an empty name) shows under the field.
    page.fill("#f-name", "")
    page.check("#f-type-nvidia-h100")
    page.click('#job-form button[type="submit"]')
    error = page.locator("#job-form .field-error").first
    error.wait_for()
    assert "may not be blank" in error.inner_text()
    assert page.get_attribute("#f-name", "aria-invalid") == "true"

    # One the service catches (fewer max workers than min) too, under its own field.
    page.fill("#f-name", "tiny-lm")
    page.fill("#f-workers-min", "3")
    page.fill("#f-workers-max", "2")
    page.click('#job-form button[type="submit"]')
    page.locator("#f-workers-max + .field-error, .field:has(#f-workers-max) + .field-error").first.wait_for()
    assert "must be at least workers_min (3)" in page.locator("#job-form").inner_text()
    page.evaluate("window.scrollTo(0, 0)")
    console.shot("jobs-new-form")

    # Two workers of 8 simulated H100s each: the demo cluster's two h100 nodes take one each.
    page.fill("#f-workers-min", "2")
    page.fill("#f-workers-max", "2")
    page.fill("#f-devices", "8")
    page.fill("#f-hyper", '{"steps": 300}')
    page.fill("#f-ckpt-interval", "30")
    assert page.locator(".type-option:has(#f-type-nvidia-h100) .badge-sim").count() == 1
    page.click('#job-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job_id = job_id_from_url(page)
    assert page.locator("h1").inner_text().startswith("tiny-lm")

    # The page follows the job by itself: state, logs, charts.
    tick_until(console, job_id, "RUNNING")
    console.wait_for_text("#job-head", r"RUNNING", tick=False)
    console.wait_for_text("#job-logs", r"checkpoint saved at step 29")
    page.wait_for_selector("#chart-loss[data-chart-ready] canvas")
    page.wait_for_selector("#chart-throughput[data-chart-ready] canvas")
    assert "SIMULATED" in page.locator("#job-status").inner_text()
    assert "Cancel" in page.locator("#job-head .job-actions").inner_text()
    console.shot("jobs-detail-running")

    # The worker filter: checkpoint lines come from worker 0 only.
    page.select_option("#logs-worker", "1")
    page.locator("#logs-empty").wait_for(state="visible")
    page.select_option("#logs-worker", "0")
    console.wait_for_text("#job-logs", r"\[0\] checkpoint saved", tick=False)
    page.select_option("#logs-worker", "")

    console.wait_for_text("#job-head", r"SUCCEEDED", timeout=120)
    console.wait_for_text("#job-logs", r"checkpoint saved at step 299", tick=False)
    console.wait_for_text("#job-run", r"\d+\.\d%", tick=False)  # ETTR
    console.wait_for_text("#job-timeline", r"SUCCEEDED", tick=False)
    actions = page.locator("#job-head .job-actions").inner_text()
    assert "Retry" in actions and "Cancel" not in actions
    assert page.locator("#chart-loss canvas").count() >= 1
    console.shot("jobs-detail-succeeded")

    # The list shows it, and filters by name.
    console.open("/jobs/?q=tiny")
    assert "tiny-lm" in page.locator("#jobs-live").inner_text()


def test_cancel_retry_and_clone(console):
    page = console.page
    page.on("dialog", lambda dialog: dialog.accept())
    alpha = console.world["alpha"]
    job = training_job_create(actor=alpha["member"], team=alpha["team"], name="to-cancel",
                              local_queue=alpha["queue"], accelerator_types=["nvidia-a100"], devices_per_worker=8,
                              workers_min=1, hyperparameters={"steps": 40}, secret_envs={"HF_TOKEN": "hunter2"})
    console.login("alpha-member")
    console.open(f"/jobs/{job.pk}/")
    page.click("#job-head button:has-text('Cancel')")
    console.wait_for_text("#job-head", r"CANCELLED", tick=False)
    assert "cancelled by alpha-member" in page.locator("#job-timeline").inner_text()

    page.click("#job-head button:has-text('Retry')")
    page.wait_for_url(lambda url: re.search(r"/jobs/\d+/$", url) and not url.endswith(f"/jobs/{job.pk}/"))
    retry_id = job_id_from_url(page)
    assert retry_id != job.pk
    assert page.locator("h1").inner_text().startswith("to-cancel-retry-1")
    console.wait_for_text("#job-timeline", rf"retry of job {job.pk}", tick=False)
    assert TrainingJob.objects.get(pk=retry_id).secret_envs == {"HF_TOKEN": "hunter2"}

    page.click("#job-head a:has-text('Clone')")
    page.wait_for_url(re.compile(rf".*/jobs/new/\?clone={retry_id}$"))
    assert page.input_value("#f-name") == "to-cancel-retry-1-clone"
    assert page.is_checked("#f-type-nvidia-a100") and not page.is_checked("#f-type-nvidia-h100")
    assert page.input_value("#f-devices") == "8"
    note = page.locator(".jobs-clone-note").inner_text()
    assert "Secrets are not copied" in note and "HF_TOKEN" in note and "hunter2" not in page.content()
    page.fill("#f-name", "cloned-job")
    page.click('#job-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    clone = TrainingJob.objects.get(pk=job_id_from_url(page))
    assert clone.name == "cloned-job" and clone.devices_per_worker == 8 and clone.secret_envs == {}
    assert clone.hyperparameters == {"steps": 40}
    leave(console)


def test_submit_a_yaml_spec_with_a_plan_first(console):
    page = console.page
    console.login("alpha-member")
    console.open("/jobs/new/")
    page.click("#tab-yaml")
    assert page.locator("#panel-form").is_hidden()

    page.fill("#f-spec", BAD_YAML)
    page.click("#spec-form button:has-text('Submit spec')")
    problems = page.locator(".spec-errors")
    problems.wait_for()
    text = problems.inner_text()
    assert "spec.yaml:5: resources.accelerators:" in text and "H900" in text
    assert page.get_attribute("#f-spec", "aria-invalid") == "true"
    assert not TrainingJob.objects.exists()

    page.fill("#f-spec", GOOD_YAML)
    page.click("#spec-form button:has-text('Plan (dry run)')")
    plan = page.locator("#spec-plan")
    plan.wait_for()
    assert page.locator(".spec-errors").is_hidden()
    text = plan.inner_text()
    assert "dry run: nothing was created" in text
    assert page.locator("[data-plan-chosen]").inner_text() == "cpu"
    assert "position 1 in cluster queue shared" in text and "$" in text and "Why" in text
    assert not TrainingJob.objects.exists()
    console.shot("jobs-new-yaml")

    page.click("#spec-form button:has-text('Submit spec')")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = TrainingJob.objects.get(pk=job_id_from_url(page))
    assert job.name == "yaml-cpu-job" and job.accelerator_types == ["cpu"]
    assert "Submitted spec (YAML)" in page.content()
    leave(console)


def test_the_list_filters_and_updates_by_itself(console):
    page = console.page
    alpha = console.world["alpha"]
    for name, types in (("lm-small", ["cpu"]), ("lm-large", ["nvidia-h100"]), ("lm-medium", ["nvidia-a100"])):
        training_job_create(actor=alpha["admin"], team=alpha["team"], name=name, local_queue=alpha["queue"],
                            accelerator_types=types, devices_per_worker=0 if types == ["cpu"] else 8)
    console.login("alpha-member")
    console.open("/jobs/")
    page.select_option("#jobs-accelerator", "nvidia-h100")
    page.click(".jobs-filter-form button[type='submit']")
    page.wait_for_url(re.compile(r".*accelerator=nvidia-h100.*"))
    table = page.locator("#jobs-live").inner_text()
    assert "lm-large" in table and "lm-small" not in table and "lm-medium" not in table

    console.open("/jobs/")
    console.tick()  # QUEUED -> ADMITTED/RUNNING shows without a reload
    training_job_create(actor=alpha["admin"], team=alpha["team"], name="lm-arrives-later",
                        local_queue=alpha["queue"], accelerator_types=["cpu"], devices_per_worker=0)
    console.wait_for_text("#jobs-live", r"lm-arrives-later", tick=False)
    console.wait_for_text("#jobs-live", r"RUNNING")
    console.shot("jobs-list")


def test_a_viewer_sees_that_they_cannot_submit(console):
    page = console.page
    console.login("alpha-viewer")
    console.open("/jobs/new/")
    assert "You can look but not submit" in page.locator(".alert").inner_text()
    page.fill("#f-name", "viewer-job")
    page.check("#f-type-cpu")
    page.fill("#f-devices", "0")
    page.click('#job-form button[type="submit"]')
    box = page.locator("#job-form .form-errors")
    box.wait_for(state="visible")
    assert "member role" in box.inner_text()
    assert not TrainingJob.objects.exists()


def test_an_entrypoint_job_from_the_form_sends_no_hyperparameters(console):
    """The form prefills the built-in trainer's {"steps": N}; a command's job does not take them (the API refuses
    hyperparameters nothing would pass on), so choosing the entrypoint trainer hides and leaves them out."""
    page = console.page
    console.login("alpha-member")
    console.open("/jobs/new/")
    assert page.is_visible("#f-hyper")
    page.select_option("#f-trainer", "entrypoint")
    assert not page.is_visible("#f-hyper") and page.is_disabled("#f-hyper")
    page.fill("#f-name", "own-program")
    page.fill("#f-entrypoint", "python -c 'print(1)'")
    page.check("#f-type-nvidia-h100")
    page.click('#job-form button[type="submit"]')
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = TrainingJob.objects.get(pk=job_id_from_url(page))
    assert (job.trainer, job.hyperparameters) == ("entrypoint", {})
    leave(console)
