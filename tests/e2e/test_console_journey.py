"""The console's main journey in a real browser: log in, submit a job, watch it run, read its logs,
deploy it, and ask the deployment a question in the playground."""

from __future__ import annotations


def test_login_lands_on_the_overview(console):
    console.login("alpha-member")
    assert console.page.locator("h1").first.inner_text().strip() != ""
    console.shot("overview")
