"""The planner core's input limits (from a QA review): model sizes bounded so every figure stays a finite float
(hidden 1e300 was an OverflowError) and the search short (2,000,000 layers took 10+ s); conflicting field names
and a top_k that cannot apply refused; and the search's speed-ups for deep models keep its decisions."""

from __future__ import annotations

import dataclasses
import random

import pytest

from controlplane.planning import DevicePool, DeviceType, Layout, ModelSpec, PlanOptions, PlanRequest, Stage, plan
from controlplane.planning import search as search_module
from controlplane.planning.cost import CostModel
from controlplane.planning.model import MODEL_FIELD_LIMITS
from controlplane.planning.presets import MODEL_PRESETS, model_spec
from controlplane.planning.validation import load_published_runs, model_for

H100 = DeviceType("nvidia-h100", {"bf16": 989, "fp8": 1979}, 80.0, 3350, 0.6)
TINY = {"layers": 1, "hidden": 8, "heads": 1, "seq_len": 8, "vocab": 8}


def h100s(nodes: int, per_node: int = 8) -> DevicePool:
    return DevicePool(H100, nodes, per_node, 450, 50)


# -- size limits --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("hidden", 1e300),  # the QA reviewer's body: a JSON float
    ("hidden", 10**160),
    ("layers", 2_000_000),
    ("heads", 10_001),
    ("seq_len", 10**9),
    ("vocab", 10**8),
    ("kv_heads", 20_000),
    ("ffn_hidden", 10**8),
    ("experts", 1_000_000),
])
def test_a_model_field_over_its_limit_is_refused_naming_the_field(field, value):
    data = {**TINY, field: value}
    with pytest.raises(ValueError, match=rf"^{field} must be at most {MODEL_FIELD_LIMITS[field]:,}, got "):
        ModelSpec.from_dict(data)


def test_the_message_of_a_huge_value_is_short():
    with pytest.raises(ValueError) as caught:
        ModelSpec.from_dict({**TINY, "hidden": 10**160})
    assert str(caught.value) == "hidden must be at most 1,000,000, got about 1e160"


def test_building_a_huge_model_directly_is_refused_too_so_plan_never_overflows():
    # Before the limits this built, and plan() raised OverflowError in infeasible_reason -> _size.
    with pytest.raises(ValueError, match="hidden must be at most"):
        ModelSpec(layers=1, hidden=10**200, heads=1, seq_len=1, vocab=1)


def test_the_limits_admit_every_preset_and_published_run_and_the_limits_themselves():
    for name in MODEL_PRESETS:
        model_spec(name)
    for run in load_published_runs()["runs"]:
        model_for(run)
    at_limits = ModelSpec(layers=1_000, hidden=1_000_000, heads=10_000, kv_heads=10_000, ffn_hidden=10_000_000,
                          seq_len=10_000_000, vocab=10_000_000, experts=100_000, top_k=100_000)
    # The largest model the limits allow plans to an answer (it cannot fit), with its sizes printed as floats.
    result = plan(PlanRequest(at_limits, 8, (h100s(1),)))
    assert not result.feasible and "TB of device memory" in result.reason


# -- conflicting names, top_k -------------------------------------------------------------------------------------


def test_two_names_of_one_field_with_different_values_are_refused():
    with pytest.raises(ValueError, match="'hidden' and 'hidden_size' both give hidden"):
        ModelSpec.from_dict({**TINY, "hidden": 128, "hidden_size": 64})
    with pytest.raises(ValueError, match="'layers' and 'n_layer' both give layers"):
        ModelSpec.from_dict({**TINY, "layers": 2, "num_hidden_layers": 2, "n_layer": 3})
    # The same value under two names (Qwen-style configs carry seq_length and max_position_embeddings) is taken.
    spec = ModelSpec.from_dict({"layers": 1, "hidden": 8, "heads": 1, "vocab": 8, "seq_length": 64,
                                "max_position_embeddings": 64.0})
    assert spec.seq_len == 64


def test_a_preset_override_under_a_hugging_face_name_replaces_the_preset_figure():
    assert model_spec("llama2-7b", {"hidden_size": 2048}).hidden == 2048
    assert model_spec("llama2-7b", {"num_hidden_layers": 4}).layers == 4


@pytest.mark.parametrize(("experts", "top_k"), [(1, 2), (0, 7), (0, 2)])
def test_top_k_without_a_mixture_of_experts_is_refused(experts, top_k):
    with pytest.raises(ValueError, match=rf"top_k \({top_k}\)"):
        ModelSpec.from_dict({**TINY, "experts": experts, "top_k": top_k})


def test_top_k_over_the_experts_is_refused_and_a_dense_override_of_a_moe_preset_drops_its_top_k():
    with pytest.raises(ValueError, match=r"top_k \(8\) must not exceed experts \(4\)"):
        ModelSpec.from_dict({**TINY, "experts": 4, "top_k": 8})
    with pytest.raises(ValueError, match=r"top_k \(2\) must not exceed experts \(1\)"):
        ModelSpec(layers=1, hidden=8, heads=1, seq_len=8, vocab=8, experts=1, top_k=2)
    assert ModelSpec.from_dict({**TINY, "experts": 4, "top_k": 4}).top_k == 4
    dense = model_spec("mixtral-8x7b", {"experts": 0})
    assert (dense.experts, dense.top_k, dense.is_moe) == (0, 1, False)
    with pytest.raises(ValueError, match="top_k"):
        model_spec("mixtral-8x7b", {"experts": 0, "top_k": 2})


# -- the search's speed-ups keep its decisions ------------------------------------------------------------------


def test_ranked_is_the_head_of_the_full_ranking_even_with_tied_step_times():
    request = PlanRequest(model_spec("llama2-7b"), 64, (h100s(4),), PlanOptions(max_alternatives=20))
    search = search_module._Search(request)
    search.homogeneous(request.pools[0])
    predictions = list(search.best_per_shape.values())
    assert len(predictions) > 10
    rng = random.Random(7)
    tied = [dataclasses.replace(p, step_time_s=predictions[0].step_time_s) if rng.random() < 0.4 else p
            for p in predictions]
    for group in (predictions, tied):
        full = sorted(group, key=search_module._rank_key)
        for keep in (1, 2, 3, 6, len(group), len(group) + 3):
            assert search_module._ranked(list(group), keep) == full[:max(keep, 2)]
        for a, b in zip(group, group[1:], strict=False):
            assert search_module._ranks_before(a, b) == (search_module._rank_key(a) < search_module._rank_key(b))


def test_evaluate_of_shared_stage_tuples_matches_fresh_ones():
    # CostModel remembers the stages tuple it walked last; evaluating layouts that share it, or another tuple in
    # between, gives what a fresh cost model gives.
    request = PlanRequest(ModelSpec(layers=30, hidden=64, heads=4, seq_len=64, vocab=100), 8, (h100s(2),))
    cost = CostModel(request)
    name = request.pools[0].name
    shared = tuple(Stage(name, 1, n) for n in (4, 5, 5, 5, 5, 6))
    for stages, mbs in ((shared, 1), (shared, 2), (tuple(Stage(name, 1, 5) for _ in range(6)), 1), (shared, 4)):
        layout = Layout(dp=2, stages=stages, micro_batch_size=mbs)
        copy = Layout(dp=2, stages=tuple(Stage(name, 1, s.layers) for s in stages), micro_batch_size=mbs)
        assert cost.evaluate(layout) == CostModel(request).evaluate(copy)
        assert cost.evaluate(layout).model_tflops_per_device > 0


def test_a_deep_model_builds_each_distinct_stage_once_and_ranks_without_walking_every_layout(monkeypatch):
    # 1,000 layers on 128 H100s: the search tries depths up to 128 with several splits each. It used to build a new
    # Stage for every stage of every split (hundreds of thousands) and two stage-walking rank keys per layout it
    # evaluated; now Stages are shared per layer count and keys are built only for step-time ties.
    made = {"stages": 0, "keys": 0}
    original_init = Stage.__post_init__
    original_key = search_module._rank_key

    def counting_init(self):
        made["stages"] += 1
        original_init(self)

    def counting_key(prediction):
        made["keys"] += 1
        return original_key(prediction)

    monkeypatch.setattr(Stage, "__post_init__", counting_init)
    monkeypatch.setattr(search_module, "_rank_key", counting_key)
    model = ModelSpec(layers=1000, hidden=2048, heads=16, seq_len=2048, vocab=32000)
    result = plan(PlanRequest(model, 1024, (h100s(16),)))
    assert result.feasible
    assert made["stages"] < 2_000, made
    assert made["keys"] < 100, made  # (it evaluates about 600 layouts: two keys each before)
