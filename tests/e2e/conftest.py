"""Browser tests of the console: the real Django app over HTTP (pytest-django's live_server) on the
in-memory compute backend, driven by Debian's headless Chromium through Playwright.

Playwright cannot download its own browser here, so it launches /usr/bin/chromium (FLEETYARD_CHROMIUM
overrides). Without that browser the tests skip, unless FLEETYARD_REQUIRE_BROWSER=1 (set by .ci/run,
which installs it) makes that a failure. Every page a test visits is saved as a PNG under
var/console-screenshots/ (FLEETYARD_SCREENSHOT_DIR overrides) so a person can look at them.

The tests play Celery beat's part themselves (`console.tick()`: sync the jobs' runs and the
deployments) from the test thread, between browser waits, so nothing else writes the database.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import pytest
from django.db import close_old_connections

from controlplane.compute.registry import get_compute_backend
from inference.models import Deployment
from inference.tasks import sync_deployments
from jobs.tasks import run_scheduling_cycle, sync_training_jobs

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("FLEETYARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"]
SCREENSHOTS = Path(os.environ.get("FLEETYARD_SCREENSHOT_DIR", ROOT / "var" / "console-screenshots"))
PASSWORD = "pw-123456789"  # tests/conftest.py's world gives every team user this password


def _browser_or_skip():
    required = os.environ.get("FLEETYARD_REQUIRE_BROWSER") == "1"
    problem = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem, sync_playwright = "the playwright package is not installed", None
    if problem is None and not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        problem = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if problem:
        if required:
            pytest.fail(f"browser tests are required (FLEETYARD_REQUIRE_BROWSER=1) but {problem}")
        pytest.skip(problem)
    return sync_playwright


@pytest.fixture(scope="session")
def browser():
    sync_playwright = _browser_or_skip()
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the tests make between
    # browser steps are still plain synchronous calls, so Django's async guard is told so.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


# Chromium logs every non-2xx fetch as a console error. A 4xx or 503 from the API or the playground is an
# answer the page shows the user (field errors, "not serving yet"); only a static file failing is a bug.
_REFUSAL = re.compile(r"Failed to load resource: the server responded with a status of (4\d\d|503)\b")


def _expected_refusal(msg) -> bool:
    url = (msg.location or {}).get("url", "")
    return bool(_REFUSAL.search(msg.text)) and "/static/" not in url


class Console:
    """One signed-in browser page on the live server, plus the beat's work and screenshots."""

    def __init__(self, page, url: str, backend, world):
        self.page = page
        self.url = url.rstrip("/")
        self.backend = backend
        self.world = world
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("console", lambda msg: self.errors.append(f"console {msg.type}: {msg.text}")
                if msg.type == "error" and not _expected_refusal(msg) else None)

    def open(self, path: str):
        self.page.goto(self.url + path)
        self.page.wait_for_load_state("networkidle")
        return self.page

    def login(self, username: str, password: str = PASSWORD):
        self.open("/login/")
        self.page.fill('input[name="username"]', username)
        self.page.fill('input[name="password"]', password)
        self.page.click('button[type="submit"]')
        self.page.wait_for_url(re.compile(r".*/$"))

    def shot(self, name: str) -> Path:
        """Save a full-page screenshot of what the browser shows now."""
        path = SCREENSHOTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def tick(self):
        """Beat's work once: a scheduling cycle, then sync the jobs' runs and the deployments."""
        close_old_connections()
        run_scheduling_cycle()
        sync_training_jobs()
        sync_deployments()

    def wait_for_text(self, selector: str, pattern: str, *, timeout: float = 60, tick: bool = True):
        """Tick until `selector`'s text matches `pattern` (the page updates itself; nothing reloads)."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        text = ""
        while time.monotonic() < deadline:
            if tick:
                self.tick()
            locator = self.page.locator(selector)
            if locator.count():
                text = locator.first.inner_text()
                if regex.search(text):
                    return text
            self.page.wait_for_timeout(400)
        raise AssertionError(f"{selector!r} never matched {pattern!r} in {timeout} s; last text: {text!r}")


@pytest.fixture
def console(browser, live_server, world, demo_cluster, settings, tmp_path):
    """console.login(user) / open(path) / shot(name) / tick() on the demo cluster (memory backend)."""
    settings.DATA_DIR = tmp_path
    backend = get_compute_backend()
    steps_before = backend.steps_per_observe
    backend.steps_per_observe = 10
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    console = Console(page, live_server.url, backend, world)
    try:
        yield console
    finally:
        context.close()
        backend.steps_per_observe = steps_before
        for handle in list(backend.list_service_handles()):
            if Deployment.objects.filter(compute_handle=handle).exists():
                backend.delete_service(handle)
    assert not console.errors, console.errors


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.browser)
