"""Properties of the planner under hypothesis: a plan never exceeds device memory and never splits TP across
nodes; more bandwidth never predicts a slower step; more devices of the same type never predict lower
throughput for the best plan; the same request always gives the same plan."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.planning import (
    CostModel,
    DevicePool,
    DeviceType,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    plan,
)

DEVICES = [
    DeviceType("nvidia-a100", {"bf16": 312.0}, 80.0, 2039.0, 0.65),
    DeviceType("nvidia-h100", {"bf16": 989.5, "fp8": 1979.0}, 80.0, 3350.0, 0.5),
    DeviceType("small-chip", {"bf16": 100.0}, 24.0, 600.0, 0.4),
]

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def models(draw):
    heads = draw(st.sampled_from([4, 8, 16, 32, 48, 64]))
    head_dim = draw(st.sampled_from([64, 128]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, heads) if heads % h == 0]))
    moe = draw(st.booleans()) and draw(st.booleans())
    return ModelSpec(
        layers=draw(st.integers(1, 64)),
        hidden=heads * head_dim,
        heads=heads,
        kv_heads=kv,
        ffn_hidden=heads * head_dim * draw(st.sampled_from([2, 3, 4])),
        seq_len=draw(st.sampled_from([512, 1024, 2048, 4096])),
        vocab=draw(st.sampled_from([1000, 32000, 51200])),
        experts=8 if moe else 0,
        top_k=2,
        gated_mlp=draw(st.booleans()),
    )


@st.composite
def pools(draw, name=""):
    device = draw(st.sampled_from(DEVICES))
    return DevicePool(device, nodes=draw(st.integers(1, 8)), devices_per_node=draw(st.sampled_from([1, 2, 4, 8])),
                      intra_node_gbps=draw(st.sampled_from([64.0, 300.0, 450.0])),
                      inter_node_gbps=draw(st.sampled_from([12.5, 25.0, 50.0])), name=name or device.slug)


@st.composite
def requests(draw, heterogeneous=False):
    model = draw(models())
    batch = draw(st.sampled_from([8, 16, 32, 64, 96, 128, 256]))
    options = PlanOptions(flash_attention=draw(st.booleans()), allow_heterogeneous=heterogeneous,
                          max_alternatives=3, max_micro_batch=8)
    pool_list = (draw(pools(name="a")),)
    if heterogeneous:
        pool_list += (draw(pools(name="b")),)
    return PlanRequest(model, batch, pool_list, options)


def _scaled(request: PlanRequest, factor: float) -> PlanRequest:
    faster = tuple(replace(p, intra_node_gbps=p.intra_node_gbps * factor, inter_node_gbps=p.inter_node_gbps * factor)
                   for p in request.pools)
    return replace(request, pools=faster)


@SETTINGS
@given(requests(heterogeneous=True))
def test_plans_fit_in_memory_and_keep_tp_inside_a_node(request):
    result = plan(request)
    if not result.feasible:
        assert result.reason
        return
    cost = CostModel(request)
    for prediction in (result.best, *result.alternatives):
        assert prediction.memory_gb <= prediction.memory_limit_gb + 1e-9
        used, limit, _ = cost.memory(prediction.layout)
        assert used <= limit
        assert cost.problem(prediction.layout) is None
        for stage in prediction.layout.stages:
            pool = request.pool(stage.pool)
            assert stage.tp <= pool.devices_per_node and pool.devices_per_node % stage.tp == 0
        for name, count in prediction.layout.devices_by_pool().items():
            assert count <= request.pool(name).devices
        assert prediction.step_time_s > 0 and 0 < prediction.mfu <= 1


@SETTINGS
@given(requests(heterogeneous=True), st.sampled_from([1.5, 2.0, 10.0]))
def test_more_bandwidth_never_predicts_slower(request, factor):
    result = plan(request)
    if not result.feasible:
        return
    faster_request = _scaled(request, factor)
    faster_cost = CostModel(faster_request)
    for prediction in (result.best, *result.alternatives):
        assert faster_cost.evaluate(prediction.layout).step_time_s <= prediction.step_time_s + 1e-12
    assert plan(faster_request).best.step_time_s <= result.best.step_time_s + 1e-12


@SETTINGS
@given(requests(), st.integers(1, 4))
def test_more_devices_never_predicts_lower_throughput(request, extra_nodes):
    small = plan(request)
    pool = request.pools[0]
    bigger = replace(request, pools=(replace(pool, nodes=pool.nodes + extra_nodes),))
    large = plan(bigger)
    if small.feasible:
        assert large.feasible
        assert large.best.tokens_per_s >= small.best.tokens_per_s * (1 - 1e-12)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(requests(heterogeneous=True))
def test_same_request_same_plan(request):
    first, second = plan(request), plan(request)
    assert first.reason.split("; ")[0] == second.reason.split("; ")[0]
    assert (first.best.layout if first.best else None) == (second.best.layout if second.best else None)


@SETTINGS
@given(requests(heterogeneous=True), st.sampled_from([1, 2, 3, 4, 6]))
def test_tensor_parallel_groups_stay_inside_a_worker_and_the_cost_model_refuses_others(request, within):
    """PlanOptions.tensor_parallel_within (a training job's workers smaller than a node): every TP degree divides a
    worker's devices, so no group spans two workers (a cap of 6 let TP4 span two 6-device workers; a review)."""
    inside = replace(request, options=replace(request.options, tensor_parallel_within=within))
    result = plan(inside)
    if result.feasible:
        for prediction in (result.best, *result.alternatives):
            assert all(within % stage.tp == 0 for stage in prediction.layout.stages)
    free = plan(request)
    if free.feasible and any(within % stage.tp for stage in free.best.layout.stages):
        assert "does not stay inside a worker's" in CostModel(inside).problem(free.best.layout)
