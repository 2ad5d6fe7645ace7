"""The memory model's corrections for Llama 3 405B on H100 (issue 9), each against a hand-computed case:

- device capacity: an "80GB" H100 or A100 has 80 GiB; the planner takes what nvidia-smi reports (81559 MiB on
  the H100 80GB HBM3, 81920 MiB on the A100-SXM4-80GB), not 80e9 bytes;
- dropout: a model without dropout (Llama: meta-llama/llama3 llama/model.py has no dropout layer) stores no
  dropout masks (Korthikanti et al. Table 2 counts two of s b h bytes per layer, and 3 a s^2 b for the attention
  dropout's mask and output);
- FlashAttention keeps its fp32 softmax statistics (4 a s b / t bytes), not the s x s scores;
- fp32 gradients: 18 bytes per parameter without ZeRO, 6 + 12/DP with ZeRO-1 (Megatron-LM's
  megatron/training/theoretical_memory_usage.py);
- micro-batches in flight on stage i of the interleaved schedule: p + (p - 1 - 2 i)/v (Megatron-LM's warm-up
  2 (p - i - 1) + (v - 1) p chunks, plus the one in flight; p + (p - 1)/v on the first stage, as Megatron-LM's
  compute_activation_memory counts it).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.planning import (
    CostModel,
    DevicePool,
    DeviceType,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    homogeneous_layout,
    predict,
)
from controlplane.planning.cost import MEMORY_USABLE_FRACTION, micro_batches_in_flight
from controlplane.planning.presets import model_spec
from controlplane.planning.validation import compare, load_published_runs

MIB = 1024 * 1024
H100 = DeviceType("nvidia-h100", {"bf16": 989.0}, memory_gb=80.0, memory_bandwidth_gbps=3350.0,
                  achievable_fraction=0.6)
A100 = DeviceType("nvidia-a100", {"bf16": 312.0}, memory_gb=80.0, memory_bandwidth_gbps=2039.0,
                  achievable_fraction=0.65)
LLAMA3_405B = model_spec("llama3-405b")
DATA = load_published_runs()
LLAMA3 = {run["layout"]["gpus"]: run for run in DATA["runs"] if run["table"] == "grattafiori2024-table4"}


def h100_pool(nodes=2):
    return DevicePool(H100, nodes=nodes, devices_per_node=8, intra_node_gbps=450.0, inter_node_gbps=50.0)


# -- capacity ------------------------------------------------------------------------------------------------

def test_80gb_h100_and_a100_have_80_gib_as_the_driver_reports():
    assert H100.memory_bytes == 81559 * MIB == 85_520_809_984  # nvidia-smi: 81559MiB (80 GiB less the driver's)
    assert A100.memory_bytes == 81920 * MIB == 80 * 2**30  # nvidia-smi: 81920MiB
    # Another memory variant of the same slug, or an unknown chip, keeps GB of 1e9 bytes (the conservative reading).
    assert DeviceType("nvidia-h100", {"bf16": 989.0}, 94.0, 3900.0).memory_bytes == 94e9
    assert DeviceType("small-chip", {"bf16": 100.0}, 24.0, 600.0).memory_bytes == 24e9


def test_the_usable_limit_is_90_percent_of_the_driver_figure():
    m = ModelSpec(layers=2, hidden=256, heads=4, seq_len=128, vocab=1000)
    request = PlanRequest(m, 8, (h100_pool(1),))
    prediction = predict(request, homogeneous_layout(request.pools[0], 2, dp=8, tp=1, pp=1, micro_batch_size=1))
    assert prediction.memory_limit_gb * 1e9 == pytest.approx(0.9 * 81559 * MIB) == pytest.approx(76.97e9, abs=0.01e9)
    assert MEMORY_USABLE_FRACTION == 0.9


# -- activations per layer -----------------------------------------------------------------------------------

def test_llama3_405b_layer_activations_by_hand():
    """TP8 with sequence parallelism, micro-batch 1, FlashAttention: per layer and micro-batch, on one device,
    Q (2 s h) + K and V (2 x 2 s kv, kv = 8 heads x 128 = 1024) + the output projection's input (2 s h), the
    SwiGLU gate and up projections and their product (3 x 2 s f), the two RMSNorm inputs and the QKV and MLP
    inputs (8 s h), FlashAttention's log-sum-exp (4 a s), all / t; no dropout masks."""
    s, h, kv, f, a, t = 8192, 16384, 1024, 53248, 128, 8
    expected = (2 * s * (h + 2 * kv + h) + 6 * s * f + 8 * s * h + 4 * a * s) / t
    assert expected == 533_200_896
    cost = CostModel(PlanRequest(LLAMA3_405B, 2048, (h100_pool(),)))
    layer = cost.layer_cost(cost.request.pools[0], 8, 1, "none", True)
    assert layer.stored_bytes == expected
    # In units of s b h / t: 31.75 (Megatron-LM's estimator, blind to GQA and gating: 18 + 4 f/h = 31).
    assert expected / (s * h / t) == pytest.approx(31.75 + 4 * a / h)


def test_dropout_masks_are_counted_only_for_a_model_with_dropout():
    gpt = ModelSpec(layers=4, hidden=1024, heads=16, seq_len=2048, vocab=51200)
    no_dropout = replace(gpt, dropout=False)
    s, h, a, t, b = 2048, 1024, 16, 2, 1
    pools = (DevicePool(A100, 1, 8, 300.0, 25.0),)
    for flash in (True, False):
        for sp in (False, True):
            with_masks = CostModel(PlanRequest(gpt, 8, pools, PlanOptions(flash_attention=flash)))
            without = CostModel(PlanRequest(no_dropout, 8, pools, PlanOptions(flash_attention=flash)))
            diff = (with_masks.layer_cost(pools[0], t, b, "none", sp).stored_bytes
                    - without.layer_cost(pools[0], t, b, "none", sp).stored_bytes)
            masks = 2 * s * b * h / (t if sp else 1)  # two 1-byte masks of s b h
            attention_dropout = 0 if flash else 3 * a * s * s * b / t  # its mask (1 byte) and output (2 bytes)
            assert diff == masks + attention_dropout


def test_flash_attention_keeps_only_the_softmax_statistics():
    gpt = ModelSpec(layers=4, hidden=1024, heads=16, seq_len=2048, vocab=51200)
    s, a, t = 2048, 16, 2
    pools = (DevicePool(A100, 1, 8, 300.0, 25.0),)
    flash = CostModel(PlanRequest(gpt, 8, pools, PlanOptions(flash_attention=True)))
    plain = CostModel(PlanRequest(gpt, 8, pools, PlanOptions(flash_attention=False)))
    assert (plain.layer_cost(pools[0], t, 1, "none", True).stored_bytes
            - flash.layer_cost(pools[0], t, 1, "none", True).stored_bytes) == 5 * a * s * s / t - 4 * a * s / t


def test_llama_presets_and_the_published_rows_have_no_dropout():
    for name in ("llama2-70b", "llama3-8b", "llama3-405b", "mixtral-8x7b"):
        assert model_spec(name).dropout is False
    assert model_spec("gpt3-175b").dropout is True
    assert all(run["model"]["dropout"] is False for run in LLAMA3.values())


# -- micro-batches in flight ---------------------------------------------------------------------------------

@pytest.mark.parametrize("p,v", [(4, 2), (8, 3), (16, 8), (16, 2)])
def test_interleaved_in_flight_is_megatrons_warm_up_plus_one(p, v):
    for i in range(p):
        warm_up = 2 * (p - i - 1) + (v - 1) * p  # Megatron-LM forward_backward_pipelining_with_interleaving
        assert micro_batches_in_flight(p, i, v, 10**6) == pytest.approx((warm_up + 1) / v)
    # The first stage: Megatron-LM's compute_activation_memory, p x (1 + (p - 1)/(p v)).
    assert micro_batches_in_flight(p, 0, v, 10**6) == pytest.approx(p * (1 + (p - 1) / (p * v)))


def test_in_flight_without_interleaving_and_the_micro_batch_cap():
    assert [micro_batches_in_flight(4, i, 1, 100) for i in range(4)] == [4, 3, 2, 1]
    assert micro_batches_in_flight(16, 1, 8, 16) == 16  # all 16 micro-batches run forward first
    assert micro_batches_in_flight(16, 1, 8, 32) == 16 + 13 / 8


# -- Meta's layout -------------------------------------------------------------------------------------------

def test_meta_layouts_memory_by_hand():
    """TP8 PP16 (7/8x14/7 layers), V = 8, micro-batch 1, sequence parallel, ZeRO-2: the fullest device is on an
    8-layer stage next to the first: 8 layers x its micro-batches in flight x 533,200,896 bytes of activations."""
    per_layer = 533_200_896
    # 8,192 GPUs: DP64, 32 micro-batches: the second stage holds 16 + 13/8 of them.
    wide = compare(DATA, LLAMA3[8192]).prediction
    assert wide.memory_breakdown["activations"] * 1e9 == pytest.approx(8 * (16 + 13 / 8) * per_layer)
    assert wide.memory_gb == pytest.approx(83.95, abs=0.01) and not wide.fits
    # 16,384 GPUs: DP128, 16 micro-batches: all of them in flight on the stages that would hold more.
    narrow = compare(DATA, LLAMA3[16384]).prediction
    assert narrow.memory_breakdown["activations"] * 1e9 == pytest.approx(8 * 16 * per_layer)
    assert narrow.memory_gb == pytest.approx(76.62, abs=0.01) and narrow.fits
    assert narrow.memory_limit_gb == pytest.approx(76.97, abs=0.01)
