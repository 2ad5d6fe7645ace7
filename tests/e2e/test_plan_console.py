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
