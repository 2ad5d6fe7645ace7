"""Layer-norm recomputation in the planner (issue 9): Megatron-core's ``--recompute-granularity selective
--recompute-modules layernorm`` drops the outputs of a layer's two norms (the QKV and first-MLP inputs) and
rebuilds them from the norms' inputs, which stay stored, before the backward pass. By hand: what it saves and
what it costs, where it sits on the search's ladder, and what it changes on Meta's 8,192-GPU Llama 3 layout.
Also: the search's step-time bounds and its skipping of slower rungs change no plan (against a search without them)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.planning import (
    CostModel,
    DevicePool,
    DeviceType,
    Layout,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    homogeneous_layout,
    plan,
)
from controlplane.planning import search as planner_search
from controlplane.planning.cost import ACTIVATION_TRAFFIC, GB, MEMORY_USABLE_FRACTION
from controlplane.planning.model import RECOMPUTE_MODES, Stage
from controlplane.planning.presets import model_spec
from controlplane.planning.search import _feature_ladder, _ladder_note
from controlplane.planning.validation import compare, load_published_runs, model_for, request_for, run_device
from tests.unit.test_planner_properties import requests

H100 = DeviceType("nvidia-h100", {"bf16": 989.0}, memory_gb=80.0, memory_bandwidth_gbps=3350.0,
                  achievable_fraction=0.6)
LLAMA3_405B = model_spec("llama3-405b")
DATA = load_published_runs()
META_8192 = next(run for run in DATA["runs"] if run["id"] == "llama3-405b-table4-8192gpu")
PER_LAYER = 533_200_896  # Llama 3 405B, TP8, SP, micro-batch 1, FlashAttention (test_planner_memory_model)


def pool(nodes=2):
    return DevicePool(H100, nodes=nodes, devices_per_node=8, intra_node_gbps=450.0, inter_node_gbps=50.0)


class _Unbounded(planner_search._Search):
    """The search without its step-time bounds: every layout is balanced and evaluated."""

    threshold = property(lambda self: math.inf, lambda self, value: None)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_norm_recompute_drops_the_two_norm_outputs_and_reads_and_writes_them_again(sequence_parallel):
    s, h, t = 8192, 16384, 8
    cost = CostModel(PlanRequest(LLAMA3_405B, 2048, (pool(),)))
    none = cost.layer_cost(cost.request.pools[0], t, 1, "none", sequence_parallel)
    norms = cost.layer_cost(cost.request.pools[0], t, 1, "norms", sequence_parallel)
    outputs = 2 * 2 * s * h / (t if sequence_parallel else 1)  # two norm outputs of 2 bytes per token and unit
    assert none.stored_bytes - norms.stored_bytes == outputs
    if sequence_parallel:
        assert norms.stored_bytes == PER_LAYER - 67_108_864
    # Memory-bound: written once and read once more, at the chip's bandwidth; no matrix FLOPs again.
    assert norms.recompute_s == pytest.approx(ACTIVATION_TRAFFIC * outputs / (3350.0 * GB))
    assert norms.recompute_flops == 0 and none.recompute_s == 0
    assert (norms.fwd_s, norms.bwd_s, norms.tp_comm_s) == (none.fwd_s, none.bwd_s, none.tp_comm_s)
    assert norms.working_bytes == none.working_bytes


def test_norm_recompute_fits_metas_8192_gpu_layout_by_hand():
    """The compared layout (TP8 PP16, 7/8x14/7 layers, V = 8, micro-batch 1, SP, ZeRO-2) needs 83.95 GB on the
    second stage without recomputation; with the norms recomputed its 8 layers x (16 + 13/8) micro-batches
    keep 466,092,032 bytes each instead of 533,200,896: 9.46 GB less, under the 76.97 GB limit."""
    plain = compare(DATA, META_8192).prediction
    request = request_for(DATA, META_8192, run_device(DATA, META_8192))
    norms = CostModel(request).evaluate(Layout.from_dict({**plain.layout.as_dict(), "recompute": "norms"}))
    saved = 8 * (16 + 13 / 8) * 67_108_864
    assert norms.memory_breakdown["activations"] * 1e9 == pytest.approx(8 * (16 + 13 / 8) * (PER_LAYER - 67_108_864))
    assert norms.memory_gb == pytest.approx(plain.memory_gb - saved / 1e9) and norms.memory_gb < 74.5
    assert norms.fits and not plain.fits
    # It costs the norms' memory traffic: about 0.1% of the step.
    assert 1.0 < norms.step_time_s / plain.step_time_s < 1.002


def test_the_planner_chooses_metas_8192_gpu_layout_with_the_norms_recomputed():
    request = request_for(DATA, META_8192, run_device(DATA, META_8192))
    best = plan(request).best
    layout = best.layout
    assert (layout.dp, layout.tp, layout.pp, layout.virtual_stages, layout.micro_batch_size) == (64, 8, 16, 8, 1)
    assert [s.layers for s in layout.stages] == [7] + [8] * 14 + [7]
    assert layout.recompute == "norms" and layout.sequence_parallel and layout.shard_gradients
    assert best.fits
    published_layout = compare(DATA, META_8192).prediction  # faster by the model, but over its memory limit
    assert 0.998 < published_layout.step_time_s / best.step_time_s < 1.0
    assert best.reason.endswith("layer-norm recompute because without recomputation it would need 84 GB per device; "
                                "gradients sharded (ZeRO-2) because with ZeRO-1 it would need 85 GB per device.")
    assert model_for(META_8192).layers == 126


def test_the_ladder_puts_norm_recompute_right_after_none():
    flash = PlanRequest(LLAMA3_405B, 64, (pool(),))
    assert [rung[0] for rung in _feature_ladder(flash, 8, 4)] == ["none", "norms", "full"]
    plain = PlanRequest(LLAMA3_405B, 64, (pool(),), PlanOptions(flash_attention=False))
    assert [rung[0] for rung in _feature_ladder(plain, 8, 4)] == ["none", "norms", "selective", "full"]
    no_selective = PlanRequest(LLAMA3_405B, 64, (pool(),), PlanOptions(allow_selective_recompute=False))
    assert [rung[0] for rung in _feature_ladder(no_selective, 8, 4)] == ["none", "norms", "full"]
    # Norms fused into the next linear layer (Transformer Engine) cannot be recomputed on their own.
    fused = PlanRequest(LLAMA3_405B, 64, (pool(),), PlanOptions(allow_norm_recompute=False))
    assert [rung[0] for rung in _feature_ladder(fused, 8, 4)] == ["none", "full"]
    fused_plain = PlanRequest(LLAMA3_405B, 64, (pool(),), PlanOptions(allow_norm_recompute=False,
                                                                       flash_attention=False))
    assert [rung[0] for rung in _feature_ladder(fused_plain, 8, 4)] == ["none", "selective", "full"]
    no_recompute = PlanRequest(LLAMA3_405B, 64, (pool(),), PlanOptions(allow_recompute=False))
    assert [rung[0] for rung in _feature_ladder(no_recompute, 8, 4)] == ["none"]


def test_norm_recompute_round_trips_and_is_described():
    layout = Layout.from_dict({"dp": 2, "micro_batch_size": 1, "recompute": "norms",
                               "stages": [{"pool": "nvidia-h100", "tp": 8, "layers": 4}]})
    assert layout.recompute == "norms" and Layout.from_dict(layout.as_dict()) == layout
    assert layout.describe() == "DP2 x TP8 x PP1 on nvidia-h100 (micro-batch 1, layer-norm recompute)"
    with pytest.raises(ValueError, match="recompute must be one of none, norms, selective, full"):
        Layout.from_dict({**layout.as_dict(), "recompute": "layernorm"})


def test_the_ladder_note_names_what_each_lighter_rung_would_have_needed():
    assert _ladder_note([], ("none", True, 1)) == ""
    # Only ZeRO-2 was needed: no word about recomputation.
    assert _ladder_note([("none", True, 1, 90.4)], ("none", True, 2)) == (
        "gradients sharded (ZeRO-2) because with ZeRO-1 it would need 90 GB per device")
    assert _ladder_note([("none", True, 1, 95.0), ("none", True, 2, 84.0), ("norms", True, 1, 85.0)],
                        ("norms", True, 2)) == (
        "layer-norm recompute because without recomputation it would need 84 GB per device; "
        "gradients sharded (ZeRO-2) because with ZeRO-1 it would need 85 GB per device")
    assert _ladder_note([("none", True, 0, None), ("norms", True, 0, 120.2)], ("full", True, 0)) == (
        "full recompute because with layer-norm recompute it would need 120 GB per device")
    assert _ladder_note([("none", False, 0, None)], ("full", False, 0)) == (
        "full recompute because without recomputation its layers do not fit in memory")
    # Without recomputation it fits with ZeRO-2 (tried first), but more slowly than with the norms recomputed.
    assert _ladder_note([("none", True, 1, 79.4)], ("norms", True, 1), [("none", True, 2)]) == (
        "layer-norm recompute because without recomputation it would need 79 GB per device with ZeRO-1, and with "
        "ZeRO-2 it is slower")
    # Without FlashAttention, the attention core may be the cheaper thing to recompute.
    assert _ladder_note([("none", False, 0, 90.0)], ("selective", False, 0), [("norms", False, 0)]) == (
        "selective recompute because without recomputation it would need 90 GB per device; layer-norm recompute "
        "fits too, and is slower")


def test_selective_is_tried_where_norms_fits_and_wins_when_faster():
    """Without FlashAttention or SP and with short sequences, recomputing the attention core costs less than
    recomputing the norms (2 a s^2 b / t bytes of scores and their FLOPs against 8 s b h of norm traffic), and
    both fit: the search must not stop at the norms rung (a review found it did)."""
    model = ModelSpec(layers=48, hidden=8192, heads=64, seq_len=1024, vocab=32000, gated_mlp=True,
                      ffn_hidden=28672, dropout=False)
    request = PlanRequest(model, 256, (pool(nodes=4),), PlanOptions(flash_attention=False,
                                                                    allow_sequence_parallel=False))
    cost = CostModel(request)
    search = _Unbounded(request)  # every shape kept
    search.homogeneous(request.pools[0])
    chosen = search.best_per_shape[(((request.pools[0].name, 8),), 1, 4)]
    assert chosen.layout.recompute == "selective" and chosen.fits
    norms = cost.evaluate(replace(chosen.layout, recompute="norms"))
    assert norms.fits and norms.step_time_s > chosen.step_time_s
    assert "layer-norm recompute fits too, and is slower" in chosen.reason


def test_a_layout_that_fits_only_without_full_recomputation_is_found():
    """Full recomputation keeps one whole layer's activations while it recomputes: on a 1-layer model with one
    micro-batch that is more than it saves. A device that holds the layer without recomputation must get a plan
    (before, the search checked the full-recompute rung first and called the request infeasible)."""
    model = ModelSpec(layers=1, hidden=4096, heads=32, seq_len=4096, vocab=32000, dropout=False)
    big = DevicePool(DeviceType("chip", {"bf16": 100.0}, 80.0, 1000.0, 0.5), nodes=1, devices_per_node=1,
                     intra_node_gbps=100.0, inter_node_gbps=10.0)
    probe = CostModel(PlanRequest(model, 1, (big,)))
    one = homogeneous_layout(big, 1, 1, 1, 1, 1)
    none = probe.evaluate(one).memory_gb
    full = probe.evaluate(replace(one, recompute="full")).memory_gb
    assert none < full
    limit_gb = (none + full) / 2  # usable: between the two
    small = replace(big, device=replace(big.device, memory_gb=limit_gb / MEMORY_USABLE_FRACTION))  # x 1e9 bytes
    result = plan(PlanRequest(model, 1, (small,)))
    assert result.best is not None, result.reason
    assert result.best.layout.recompute == "none" and result.best.fits


def _reference_plan(request: PlanRequest):
    """plan() with neither the search's step-time bounds nor its skipping of rungs a fitting rung is never slower
    than: every rung of every layout tried, every fitting one evaluated."""
    original, dominated = planner_search._Search, planner_search._dominated
    planner_search._Search, planner_search._dominated = _Unbounded, lambda rung, fitted: False
    try:
        return plan(request)
    finally:
        planner_search._Search, planner_search._dominated = original, dominated


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests(heterogeneous=True))
def test_the_search_skips_only_what_cannot_rank_or_cannot_be_faster(planned):
    """Against the search with neither its step-time bounds nor the skipping of rungs a fitting rung is never
    slower than (every rung of every layout tried, every fitting one evaluated)."""
    bounded = plan(planned)
    unbounded = _reference_plan(planned)
    shown = [bounded.best, *bounded.alternatives] if bounded.best else []
    reference = [unbounded.best, *unbounded.alternatives] if unbounded.best else []
    assert [(p.layout, round(p.step_time_s, 9)) for p in shown] == [
        (p.layout, round(p.step_time_s, 9)) for p in reference]


# -- against every layout, evaluated one by one ---------------------------------------------------------------

@st.composite
def tight_requests(draw):
    """A small model on one pool, and the memory of a device chosen so that only the few leanest layouts fit."""
    heads = draw(st.sampled_from([8, 16, 32]))
    model = ModelSpec(layers=draw(st.integers(1, 4)), hidden=heads * 128, heads=heads,
                      seq_len=draw(st.sampled_from([1024, 4096])), vocab=draw(st.sampled_from([1000, 32000])),
                      dropout=draw(st.booleans()), gated_mlp=draw(st.booleans()))
    chip = DeviceType("chip", {"bf16": 400.0}, 80.0, 2000.0, 0.5)
    roomy = DevicePool(chip, nodes=draw(st.sampled_from([1, 2, 4])), devices_per_node=draw(st.sampled_from([1, 2, 4])),
                       intra_node_gbps=300.0, inter_node_gbps=25.0)
    options = PlanOptions(flash_attention=draw(st.booleans()), allow_interleave=False, allow_heterogeneous=False,
                          max_micro_batch=4)
    batch = draw(st.sampled_from([2, 4, 8]))
    layouts = _every_layout(PlanRequest(model, batch, (roomy,), options))
    probe = CostModel(PlanRequest(model, batch, (roomy,), options))
    needs = sorted(probe.memory(layout)[0] for layout in layouts)
    rank = draw(st.integers(0, 5))
    usable = needs[min(rank, len(needs) - 1)] * (1 + 1e-6)
    tight = replace(roomy, device=replace(chip, memory_gb=usable / MEMORY_USABLE_FRACTION / 1e9))
    return PlanRequest(model, batch, (tight,), options)


def _every_layout(request: PlanRequest) -> list[Layout]:
    """Every homogeneous layout the search may try (no interleaving), with every recomputation and ZeRO level."""
    model, pool = request.model, request.pools[0]
    flash = request.options.flash_attention
    layouts = []
    for tp in planner_search._tensor_degrees(request, pool):
        for pp in range(1, model.layers + 1):
            for split in planner_search.stage_splits(model.layers, pp):
                for dp in planner_search.divisors(request.global_batch_size):
                    if dp * tp * pp > pool.devices:
                        continue
                    for mbs in planner_search.divisors(request.global_batch_size // dp):
                        if mbs > request.options.max_micro_batch:
                            break
                        for recompute in RECOMPUTE_MODES:
                            if recompute == "selective" and flash:
                                continue
                            for zero in ((0,) if dp == 1 else (1, 2)):
                                layouts.append(Layout(dp=dp, stages=tuple(Stage(pool.name, tp, n) for n in split),
                                                      micro_batch_size=mbs, recompute=recompute, zero=bool(zero),
                                                      shard_gradients=zero == 2, sequence_parallel=tp > 1))
    cost = CostModel(request)
    return [layout for layout in layouts if not cost.problem(layout)]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tight_requests())
def test_the_plan_is_the_fastest_layout_that_fits_of_all_evaluated_one_by_one(request):
    """An independent reference for the search's pruning, ladder and memory pre-checks: every layout evaluated by
    the cost model. (A review found the search calling requests infeasible that had layouts fitting with ZeRO-1 or
    without full recomputation, whose one working layer or one unsharded layer of ZeRO-2 gradients can need more
    than they save.)"""
    cost = CostModel(request)
    fitting = [p for p in (cost.evaluate(layout) for layout in _every_layout(request)) if p.fits]
    result = plan(request)
    if not fitting:
        assert result.best is None
        return
    assert result.best is not None, result.reason
    assert result.best.step_time_s == pytest.approx(min(p.step_time_s for p in fitting), rel=1e-9)


def test_a_mixed_pipeline_whose_layers_memory_held_back_tries_the_rungs_that_save_memory():
    """Llama 2 70B on 128 H100 + 256 A100 (the planner benchmark's third mixed case): without recomputation memory
    caps the H100 stage's layers; with the norms recomputed it takes more of them and the step is faster. Before,
    the mixed search stopped at the first rung that fit; the plan must be the reference search's."""
    from controlplane.cluster.accelerator_facts import facts_by_slug
    from controlplane.planning.model import device_type_from_facts
    from controlplane.planning.presets import model_spec as preset

    facts = facts_by_slug()
    pools = (DevicePool(device_type_from_facts(facts["nvidia-h100"]), 16, 8, 450.0, 50.0),
             DevicePool(device_type_from_facts(facts["nvidia-a100"]), 32, 8, 300.0, 25.0))
    request = PlanRequest(preset("llama2-70b"), 512, pools)
    best = plan(request).best
    reference = _reference_plan(request).best
    assert best.layout == reference.layout and best.step_time_s == pytest.approx(reference.step_time_s, rel=1e-12)
    assert best.layout.heterogeneous and best.layout.recompute == "norms"
