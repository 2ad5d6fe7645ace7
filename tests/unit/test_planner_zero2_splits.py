"""The planner's ZeRO-2 option (gradients sharded over data parallel, reduce-scattered per micro-batch) and
its uneven pipeline splits (pipeline depths that do not divide the layers; Megatron-LM's and Llama 3's
first and last stage one layer fewer), against hand-computed cases."""

from __future__ import annotations

import pytest

from controlplane.planning import (
    CostModel,
    DevicePool,
    DeviceType,
    Layout,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    Stage,
    homogeneous_layout,
    plan,
    predict,
)
from controlplane.planning.cost import COLLECTIVE_LATENCY_S, LINK_EFFICIENCY, ring_allreduce_s
from controlplane.planning.search import stage_splits

A100 = DeviceType("nvidia-a100", {"bf16": 312.0}, memory_gb=80.0, memory_bandwidth_gbps=2039.0,
                  achievable_fraction=0.65)
GPT_1_7B = ModelSpec(layers=24, hidden=2304, heads=24, seq_len=2048, vocab=51200)
NO_FLASH = PlanOptions(flash_attention=False)


def a100_pool(nodes=1):
    return DevicePool(A100, nodes=nodes, devices_per_node=8, intra_node_gbps=300.0, inter_node_gbps=25.0)


# -- ZeRO-2 -------------------------------------------------------------------------------------------------------

def test_zero2_memory_by_hand():
    """ZeRO-2 keeps 4/dp bytes of fp32 gradient per parameter, plus one layer's unsharded gradients (the layer
    whose backward pass produced them, before their reduce-scatter), and 12/dp bytes of Adam state."""
    s, b, h, a, L, v, t, dp = 2048, 2, 2304, 24, 24, 51200, 2, 4
    request = PlanRequest(GPT_1_7B, 64, (a100_pool(),), NO_FLASH)
    layout = homogeneous_layout(request.pools[0], L, dp=dp, tp=t, pp=1, micro_batch_size=b, recompute="full",
                                zero=True, shard_gradients=True)
    prediction = predict(request, layout)
    full_layer = s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t
    activations = L * 2 * s * b * h + full_layer + 2 * s * b * h + 4 * s * b * v / t
    m = GPT_1_7B
    layer_params = (m.attention_parameters() + m.mlp_parameters()) / t + 4 * h
    params = L * layer_params + v * h / t + s * h + 2 * h
    grads = 4 * (params / dp + layer_params)
    states = 2 * params + grads + 12 * params / dp
    assert prediction.memory_gb * 1e9 == pytest.approx(states + activations, rel=1e-12)
    assert prediction.memory_breakdown["gradients"] * 1e9 == pytest.approx(grads, rel=1e-12)
    zero1 = predict(request, homogeneous_layout(request.pools[0], L, dp=dp, tp=t, pp=1, micro_batch_size=b,
                                                recompute="full", zero=True))
    assert zero1.memory_gb - prediction.memory_gb == pytest.approx((4 * params - grads) / 1e9, rel=1e-9)


def test_zero2_reduce_scatters_every_micro_batch_by_hand():
    """TP8 fills a node, so DP4 over 4 nodes runs on the 25 GB/s links: a reduce-scatter of the stage's
    gradient bytes B per micro-batch, (n-1)/n B / bandwidth each, and one all-gather of the weights (same bytes)."""
    request = PlanRequest(GPT_1_7B, 64, (a100_pool(4),), NO_FLASH)
    pool = request.pools[0]
    cost = CostModel(request)
    micro = 8
    args = dict(dp=4, mbs=2, micro=micro, recompute="none", sequence_parallel=True, ep=1, virtual_stages=1)
    z2 = cost.stage_figures(pool, 8, 24, 0, 1, zero=2, **args)
    z1 = cost.stage_figures(pool, 8, 24, 0, 1, zero=1, **args)
    # The collectives move 16-bit gradients of the whole stage (2 bytes per parameter; kept as fp32, 4 bytes).
    gradient_bytes = z1.grads / 2
    scatter = 3 / 4 * gradient_bytes / (25e9 * LINK_EFFICIENCY) + COLLECTIVE_LATENCY_S
    assert z2.sync_s == pytest.approx((micro + 1) * scatter, rel=1e-12)
    expected = (micro - 1) * max(0.0, scatter - z2.bwd_s) + max(0.0, 2 * scatter - z2.bwd_s)
    assert z2.sync_exposed_s == pytest.approx(expected, rel=1e-12)
    # ZeRO-1's all-reduce moves the bytes of one reduce-scatter + one all-gather, once per step.
    assert z1.sync_s == pytest.approx(ring_allreduce_s(gradient_bytes, 4, 25.0), rel=1e-12)
    assert z1.sync_s == pytest.approx(2 * scatter - COLLECTIVE_LATENCY_S, rel=1e-12)
    # Per-micro-batch reduce-scatters cost time: never faster than ZeRO-1, same compute.
    l1 = homogeneous_layout(pool, 24, dp=4, tp=8, pp=1, micro_batch_size=2, sequence_parallel=True, zero=True)
    l2 = homogeneous_layout(pool, 24, dp=4, tp=8, pp=1, micro_batch_size=2, sequence_parallel=True, zero=True,
                            shard_gradients=True)
    p1, p2 = predict(request, l1), predict(request, l2)
    assert p2.step_time_s >= p1.step_time_s
    assert p2.breakdown["dp_comm_total"] == pytest.approx(z2.sync_s)


def test_zero2_needs_zero_and_is_described():
    request = PlanRequest(GPT_1_7B, 64, (a100_pool(),), NO_FLASH)
    bad = homogeneous_layout(request.pools[0], 24, dp=4, tp=2, pp=1, micro_batch_size=1, shard_gradients=True)
    with pytest.raises(ValueError, match="ZeRO-2"):
        predict(request, bad)
    good = homogeneous_layout(request.pools[0], 24, dp=4, tp=2, pp=1, micro_batch_size=1, zero=True,
                              shard_gradients=True)
    assert "ZeRO-2" in good.describe()
    assert Layout.from_dict(good.as_dict()) == good


# -- uneven stages ------------------------------------------------------------------------------------------------

def test_stage_splits_by_hand():
    # Llama 3 405B: 126 layers on 16 stages; the even split is already Meta's 7, 8 x 14, 7.
    assert stage_splits(126, 16) == [(7,) + (8,) * 14 + (7,)]
    # Divisible: equal stages, and Megatron's one-fewer-at-the-ends (98 slots on 8 stages: 13, 13 in the middle).
    assert stage_splits(96, 8) == [(12,) * 8, (11, 12, 12, 12, 12, 13, 13, 11)]
    assert stage_splits(10, 3) == [(3, 4, 3)]
    assert stage_splits(5, 2) == [(2, 3)]
    assert stage_splits(4, 5) == []
    for layers in (24, 80, 96, 126):
        for pp in range(1, layers + 1):
            for split in stage_splits(layers, pp):
                assert len(split) == pp and sum(split) == layers and min(split) >= 1
            even = stage_splits(layers, pp)[0]
            assert max(even) - min(even) <= 1


def test_uneven_stages_cost_what_their_widest_stage_costs():
    request = PlanRequest(GPT_1_7B, 64, (a100_pool(),), NO_FLASH)
    cost = CostModel(request)
    layout = Layout(dp=1, stages=(Stage("nvidia-a100", 1, 7), Stage("nvidia-a100", 1, 9), Stage("nvidia-a100", 1, 8)),
                    micro_batch_size=1)
    assert cost.problem(layout) is None
    prediction = cost.evaluate(layout)
    figs = [cost.stage_figures(request.pools[0], 1, n, i, 3, 1, 1, 64, "none", False, 0, 1, 1)
            for i, n in enumerate((7, 9, 8))]
    t_max = max(f.time_s for f in figs)
    assert prediction.breakdown["bubble"] == pytest.approx(sum(f.time_s for f in figs) - t_max, rel=1e-12)
    assert prediction.memory_gb == pytest.approx(max(f.memory for f in figs) / 1e9, rel=1e-12)


def test_search_tries_pipeline_depths_that_do_not_divide_the_layers():
    """5 layers of ~200 MB of state each on 4 one-device nodes of 0.9 GB usable: PP1 cannot hold the model and
    PP5 (the only other divisor of 5) needs 5 devices, so only an uneven split (PP2, 3 or 4) can run."""
    chip = DeviceType("small", {"bf16": 100.0}, memory_gb=1.0, memory_bandwidth_gbps=1000.0)
    model = ModelSpec(layers=5, hidden=1024, heads=16, seq_len=128, vocab=1000)
    pool = DevicePool(chip, nodes=4, devices_per_node=1, intra_node_gbps=100.0, inter_node_gbps=10.0)
    result = plan(PlanRequest(model, 4, (pool,), PlanOptions(allow_recompute=False)))
    assert result.feasible, result.reason
    assert result.best.layout.pp in (2, 3, 4)
    for prediction in (result.best, *result.alternatives):
        assert sum(s.layers for s in prediction.layout.stages) == 5
        assert prediction.memory_gb <= prediction.memory_limit_gb
