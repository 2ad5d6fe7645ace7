"""Browser test of the Planner page: a preset on the demo's SIMULATED H100 pool plus hypothetical A100s gives the
best layout, its alternatives, why it wins and each type alone; a mistake is shown under its field; a model nothing
can hold says why, in the page."""

from __future__ import annotations


def test_plan_a_mix_then_see_field_errors_and_an_infeasible_answer(console):
    console.login("alpha-member")
    page = console.open("/plan/")
    page.select_option("#p-preset", "llama2-7b")
    page.fill("#p-batch", "64")
    page.uncheck('[data-plan-pool="a100-pool"]')  # checked first: at most two pools or device groups when mixing
    page.check('[data-plan-pool="h100-pool"]')
    page.select_option(".plan-devices >> nth=0 >> [data-plan-device-type]", "nvidia-a100")
    page.fill(".plan-devices >> nth=0 >> [data-plan-device-count]", "16")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector("[data-plan-layouts]")
    layouts = page.inner_text("[data-plan-layouts]")
    assert "best" in layouts and "DP" in layouts
    assert "Why:" in page.inner_text("[data-plan-why]")
    result = page.inner_text("#plan-result")
    assert "h100-pool" in result and "SIMULATED" in result and "hypothetical" in result
    assert "Predicted by the planner's cost model, not measured." in result
    compare = page.inner_text("[data-plan-compare]")
    assert "nvidia-a100" in compare and "nvidia-h100" in compare
    console.page.evaluate("window.scrollTo(0, 0)")
    console.shot("plan-mix")

    page.fill("#p-batch", "0")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".field-error")
    assert "global_batch_size" in page.inner_text("#plan-form") or "greater than or equal to 1" in page.inner_text(
        "#plan-form .field-error")
    assert page.is_hidden("#plan-result")

    page.fill("#p-batch", "64")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector("[data-plan-layouts]")
    page.select_option("#p-preset", "custom")
    page.fill("#p-custom", "{not json")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".field-error")
    assert "not valid JSON" in page.inner_text("[data-plan-custom] + .field-error")  # under the fields typed
    assert page.is_hidden("#plan-result")  # the last answer (Llama-2 7B) no longer stands beside the error

    page.select_option("#p-preset", "llama2-7b")
    page.fill("#p-batch", "8.5")  # parseInt read it as 8 (and "1e2" as 1) and planned that
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".field-error")
    assert "integer" in page.inner_text("#plan-form .field-error").lower()
    page.fill("#p-batch", "8")
    page.select_option(".plan-devices >> nth=0 >> [data-plan-device-type]", "")
    page.click("#plan-form button[type=submit]")  # a device row with a count but no type
    page.wait_for_selector(".plan-devices + .field-error")
    assert "choose an accelerator type" in page.inner_text(".plan-devices + .field-error")

    page.select_option("#p-preset", "llama3-405b")
    page.uncheck('[data-plan-pool="h100-pool"]')
    page.select_option(".plan-devices >> nth=0 >> [data-plan-device-type]", "nvidia-h100")
    page.fill(".plan-devices >> nth=0 >> [data-plan-device-count]", "1")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector("[data-plan-infeasible]")
    assert "needs at least" in page.inner_text("[data-plan-infeasible]")
    assert console.errors == []


def test_an_api_error_about_one_device_row_shows_under_that_row(console):
    """The API's per-entry errors ({"devices": [{"count": [...]}]}) show under the row they are about, not in the
    form's top box as "devices: count: ..." (before; left for a later stop in stop 25's note). Row 2 is sent as the
    first entry when row 1 is empty, so the error must go by the row the entry came from, not by its index."""
    console.login("alpha-member")
    page = console.open("/plan/")
    page.select_option("#p-preset", "llama2-7b")
    page.fill("#p-batch", "64")
    page.select_option(".plan-devices >> nth=0 >> [data-plan-device-type]", "")
    page.fill(".plan-devices >> nth=0 >> [data-plan-device-count]", "")
    page.select_option(".plan-devices >> nth=1 >> [data-plan-device-type]", "nvidia-a100")
    page.fill(".plan-devices >> nth=1 >> [data-plan-device-count]", "2000000")  # the API takes at most 1,000,000
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".plan-devices + .field-error")
    errors = page.locator(".plan-devices + .field-error")
    assert errors.count() == 1
    text = errors.first.inner_text()
    assert "count" in text and "less than or equal to 1000000" in text, text
    second_row = page.locator(".plan-devices").nth(1)
    assert second_row.evaluate("row => row.nextElementSibling.classList.contains('field-error')")
    assert page.is_hidden("#plan-form .form-errors") or "count" not in page.inner_text("#plan-form .form-errors")
    assert page.is_hidden("#plan-result")


def test_the_services_errors_about_a_row_show_under_that_row(console):
    """"devices[0]: 12 devices is neither whole nodes ..." (the service's words, its index counting the entries sent)
    showed beside the fieldset; "pools[N]" likewise, N counting checked pools only (found by QA)."""
    console.login("alpha-member")
    page = console.open("/plan/")
    page.select_option("#p-preset", "llama2-7b")
    page.fill("#p-batch", "64")
    page.select_option(".plan-devices >> nth=1 >> [data-plan-device-type]", "nvidia-h100")
    page.fill(".plan-devices >> nth=1 >> [data-plan-device-count]", "12")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".plan-devices + .field-error")
    second_row = page.locator(".plan-devices").nth(1)
    assert second_row.evaluate("row => row.nextElementSibling.classList.contains('field-error')")
    text = page.inner_text(".plan-devices + .field-error")
    assert text.startswith("12 devices is neither whole nodes of 8"), text

    page.select_option(".plan-devices >> nth=1 >> [data-plan-device-type]", "")
    page.fill(".plan-devices >> nth=1 >> [data-plan-device-count]", "")
    for box in page.locator("[data-plan-pool]:checked").all():
        box.uncheck()
    page.check('[data-plan-pool="h100-pool"]')
    page.fill('[data-plan-pool-devices="h100-pool"]', "12")
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector(".plan-pool .field-error")
    pool_row = page.locator(".plan-pool", has=page.locator('[data-plan-pool="h100-pool"]'))
    assert "12 devices" in pool_row.locator(".field-error").inner_text()
    assert page.locator("fieldset[name=pools] + .field-error").count() == 0
