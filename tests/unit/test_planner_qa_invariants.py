"""QA of the planner core: properties of every answer under hypothesis over small odd models and pools (memory within
the limit, tokens/s and MFU by their definitions, the best the fastest listed, the reason naming the right layouts,
more bandwidth never slower, determinism), and regressions of the bugs they found. Each regression fails on the code
before its fix."""

from __future__ import annotations

from dataclasses import replace

from controlplane.cluster.accelerator_facts import facts_by_slug
from controlplane.planning import DevicePool, ModelSpec, PlanRequest, device_type_from_facts, plan

H100 = device_type_from_facts(facts_by_slug()["nvidia-h100"])


# -- regressions ----------------------------------------------------------------------------------------------------


def test_the_runner_up_named_without_alternatives_is_the_true_runner_up():
    """With max_alternatives 0 (as the compare rows plan each type) the search kept one shape, so its pruning
    threshold fell to the best's time and the runner-up the reason named was whatever shape was stored before:
    Llama-2 7B on 32 H100 said "10.7% faster than the next best (DP16 x TP1 x PP2 ...)" where the next best is 6.4%
    slower (DP16 x TP2 x PP1 ...)."""
    from controlplane.planning.presets import model_spec

    request = PlanRequest(model_spec("llama2-7b"), 256, (DevicePool(H100, 4, 8, 450.0, 50.0),))
    listed = plan(request)
    alone = plan(replace(request, options=replace(request.options, max_alternatives=0)))
    assert alone.alternatives == () and listed.alternatives
    assert alone.best.layout == listed.best.layout
    runner_up = listed.reason.split("; ")[1].split(" tried, ")[1]  # (the count of layouts tried differs)
    assert runner_up.startswith("6.4% faster than the next best (DP16 x TP2 x PP1 "), runner_up
    assert runner_up in alone.reason
    assert listed.alternatives[0].layout.describe() in alone.reason


def test_a_plan_with_no_alternative_does_not_say_it_is_the_only_layout_that_fits():
    """One layer on one H100 at global batch 8: micro-batches 1, 2, 4 and 8 all fit (the search keeps one layout per
    DP x TP x PP shape), yet the reason said "the only layout of 8 tried that fits"."""
    from controlplane.planning import CostModel, Layout, Stage

    request = PlanRequest(ModelSpec(layers=1, hidden=512, heads=8, seq_len=512, vocab=1000), 8,
                          (DevicePool(H100, 1, 1, 450.0, 50.0),))
    result = plan(request)
    assert result.alternatives == ()
    cost = CostModel(request)
    fitting = [mbs for mbs in (1, 2, 4, 8)
               if cost.evaluate(Layout(dp=1, stages=(Stage(H100.slug, 1, 1),), micro_batch_size=mbs)).fits]
    assert len(fitting) == 4
    assert "the only layout" not in result.reason
    assert "the only DP x TP x PP shape that fits of " in result.reason
