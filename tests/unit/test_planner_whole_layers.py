"""The mixed search's step-time bound in whole layers (``search._whole_layer_time``): the least common time per
micro-batch at which stages holding whole layers, at least one each, hold the model; checked against every integer
split, and the search that uses it against the search without bounds."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.cluster.accelerator_facts import facts_by_slug
from controlplane.planning import DevicePool, ModelSpec, PlanOptions, PlanRequest, device_type_from_facts, plan
from controlplane.planning.search import _could_hold, _whole_layer_time


def _every_split_slowest(stages: list[tuple[float, float]], layers: int) -> float:
    """min over every split of ``layers`` into whole layers, at least one per stage, of the slowest stage's time."""
    best = float("inf")
    for split in itertools.product(range(1, layers + 1), repeat=len(stages)):
        if sum(split) == layers:
            best = min(best, max(fixed + n * per_layer for n, (per_layer, fixed) in zip(split, stages, strict=True)))
    return best


def test_whole_layers_by_hand():
    # two equal stages, three layers: one of them runs two (1.5 each would do in fractions)
    assert _whole_layer_time([(2, 1.0, 0.0)], 3, 1.5) == 2.0
    # a stage twice as fast takes two of three layers: both finish at 2
    assert _whole_layer_time([(1, 1.0, 0.0), (1, 2.0, 0.0)], 3, 2.0) == 2.0
    # a stage whose fixed time is past the continuous optimum still runs one layer
    assert _whole_layer_time([(1, 1.0, 0.0), (1, 1.0, 5.0)], 2, 1.0) == 6.0


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 2), st.sampled_from([0.5, 1.0, 1.3, 2.0, 3.7]),
                          st.sampled_from([0.0, 0.1, 0.25, 1.0, 4.0])), min_size=1, max_size=2),
       st.integers(0, 5))
def test_whole_layers_is_the_best_integer_split(groups, extra):
    stages = [(per_layer, fixed) for count, per_layer, fixed in groups for _ in range(count)]
    layers = len(stages) + extra
    # the continuous optimum, as the search's bound gives it: sum (T - f) / c = L
    start = (layers + sum(f / c for c, f in stages)) / sum(1 / c for c, _ in stages)
    assert abs(_whole_layer_time(groups, layers, start) - _every_split_slowest(stages, layers)) < 1e-9


def test_three_pools_skip_pipelines_whose_whole_layers_cannot_rank():
    """Many stages for few layers (the three-pool 1,024-device GPT-3 of the planner benchmark puts 96 layers on up to
    70 stages): the continuous common time let through pipelines whose stages, holding whole layers, cannot share
    it; 70% of those the search balanced lost (15,577 layouts and 3.8 s on a slow day, 6,456 and 1.0 s with the
    whole-layer bound). Here 149 layouts before, 108 now; the plan is that of the search without bounds."""
    from tests.unit.test_planner_norm_recompute import _reference_plan

    facts = facts_by_slug()
    h100, a100, l40s = (device_type_from_facts(facts[slug]) for slug in ("nvidia-h100", "nvidia-a100", "nvidia-l40s"))
    model = ModelSpec(layers=12, hidden=1024, heads=8, seq_len=1024, vocab=8000, dropout=False)
    pools = (DevicePool(h100, 2, 8, 450.0, 50.0), DevicePool(a100, 2, 8, 300.0, 25.0),
             DevicePool(l40s, 2, 8, 32.0, 25.0))
    request = PlanRequest(model, 32, pools, PlanOptions(max_alternatives=3))
    bounded, reference = plan(request), _reference_plan(request)
    assert (bounded.best.layout, round(bounded.best.step_time_s, 9)) == (reference.best.layout,
                                                                        round(reference.best.step_time_s, 9))
    assert bounded.candidates_evaluated < 130, bounded.candidates_evaluated


def test_could_hold_by_hand():
    # (usable, state per layer, stored per micro-batch in flight): 100 bytes, 10 + 10 per micro-batch
    part = (100.0, 10.0, 10.0)
    # two stages at the end of a pipeline: 2 and 1 micro-batches in flight, caps 3 + 5 = 8 layers
    assert _could_hold([part], [2], 8, micro=64)
    assert not _could_hold([part], [2], 9, micro=64)
    # nine stages: the first holds 9 micro-batches in flight, one layer just fits (10 + 9 x 10 = 100 bytes); with ten
    # stages the first cannot hold one layer
    assert _could_hold([part], [9], 9, micro=64)
    assert not _could_hold([part], [10], 10, micro=64)
    # no more in flight than the step has micro-batches
    assert _could_hold([part], [10], 10, micro=4)


def test_mixed_pipelines_that_cannot_hold_the_model_are_skipped_before_balancing():
    """A mixture of experts over three pools (mixed pipelines run EP 1, so each stage holds every expert of its
    layers): most mixed pipelines cannot hold the model in any order on any rung, and each was balanced, rung by
    rung, in every order of the pools (a DeepSeek-V3-sized model on 344 H100 + 344 A100 + 336 L40S: 2.6 s; 1.1 s with
    the memory check, same plan). Here 16,619 layouts before, 1,759 now; the same plan and alternatives as without
    the check."""
    import controlplane.planning.search as planner_search

    facts = facts_by_slug()
    h100, a100, l40s = (device_type_from_facts(facts[slug]) for slug in ("nvidia-h100", "nvidia-a100", "nvidia-l40s"))
    model = ModelSpec(layers=16, hidden=4096, heads=16, ffn_hidden=4096, experts=128, top_k=4, seq_len=2048,
                      vocab=32000, dropout=False)
    pools = (DevicePool(h100, 1, 8, 450.0, 50.0), DevicePool(a100, 1, 8, 300.0, 25.0),
             DevicePool(l40s, 1, 8, 32.0, 25.0))
    request = PlanRequest(model, 32, pools, PlanOptions(max_alternatives=3))
    checked = plan(request)
    original = planner_search._could_hold
    planner_search._could_hold = lambda *args: True
    try:
        unchecked = plan(request)
    finally:
        planner_search._could_hold = original
    assert checked.best.layout.heterogeneous
    assert [(p.layout, round(p.step_time_s, 9)) for p in (checked.best, *checked.alternatives)] == [
        (p.layout, round(p.step_time_s, 9)) for p in (unchecked.best, *unchecked.alternatives)]
    assert checked.candidates_evaluated < 5000 < unchecked.candidates_evaluated
