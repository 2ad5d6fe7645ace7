"""Validation of the cost model against published training runs (``published_runs.json``).

For each run: the request (model, global batch, a pool of the run's GPUs) and the run's own layout, the
published throughput, the planner's prediction for that same layout, and the relative error. Both the
benchmark (benchmarks/planner.py) and the tests (tests/unit/test_planner_validation.py) use this module, so
they cannot drift apart. Also the one-constant-per-chip calibration of ``achievable_fraction``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from controlplane.planning.cost import CostModel, homogeneous_layout, step_flops_megatron
from controlplane.planning.model import (
    CALIBRATED_ACHIEVABLE_FRACTION,
    DevicePool,
    DeviceType,
    Layout,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    Prediction,
)

PUBLISHED_RUNS = Path(__file__).with_name("published_runs.json")


def load_published_runs(path: str | Path = PUBLISHED_RUNS) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def device_for(data: Mapping, achievable_fraction: float | None = None) -> DeviceType:
    """The runs' chip, from the JSON's hardware block (A100 80GB: 312 TFLOPS 16-bit, 2,039 GB/s HBM)."""
    hardware = data["hardware"]
    from controlplane.cluster.accelerator_facts import facts_by_slug

    fact = facts_by_slug()[hardware["device"]]
    if achievable_fraction is None:
        achievable_fraction = CALIBRATED_ACHIEVABLE_FRACTION.get(hardware["device"], 0.5)
    return DeviceType(slug=fact["slug"], peak_tflops={"bf16": float(hardware["peak_tflops_16bit"])},
                      memory_gb=fact["memory_gb"], memory_bandwidth_gbps=fact["memory_bandwidth_gbps"],
                      achievable_fraction=achievable_fraction)


def model_for(run: Mapping) -> ModelSpec:
    return ModelSpec.from_dict({**run["model"], "name": run["name"]})


def request_for(data: Mapping, run: Mapping, device: DeviceType, options: PlanOptions | None = None) -> PlanRequest:
    hardware, layout = data["hardware"], run["layout"]
    per_node = hardware["devices_per_node"]
    pool = DevicePool(device=device, nodes=max(1, -(-layout["gpus"] // per_node)), devices_per_node=per_node,
                      intra_node_gbps=hardware["intra_node_gbps"], inter_node_gbps=hardware["inter_node_gbps"])
    if options is None:
        options = PlanOptions(flash_attention=data["common"].get("flash_attention", True))
    return PlanRequest(model=model_for(run), global_batch_size=layout["global_batch_size"], pools=(pool,),
                       options=options)


def layout_for(request: PlanRequest, run: Mapping) -> Layout:
    spec = run["layout"]
    return homogeneous_layout(request.pools[0], request.model.layers, spec["dp"], spec["tp"], spec["pp"],
                              spec["micro_batch_size"], recompute=spec["recompute"], zero=spec.get("zero", False),
                              virtual_stages=spec.get("virtual_stages", 1),
                              sequence_parallel=spec.get("sequence_parallel", False))


def counted_flops(run: Mapping, model: ModelSpec) -> float:
    """FLOPs per iteration as the run's paper counted them, so throughputs compare like with like."""
    batch = run["layout"]["global_batch_size"]
    if run["flops_counted"] == "megatron_eq3":
        return step_flops_megatron(model, batch)
    b, s, layers, h, v = batch, model.seq_len, model.layers, model.hidden, model.vocab
    return 72 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))


def published_tflops(run: Mapping, model: ModelSpec) -> float:
    published = run["published"]
    if "tflops_per_gpu" in published:
        return float(published["tflops_per_gpu"])
    return counted_flops(run, model) / published["step_time_s"] / run["layout"]["gpus"] / 1e12


@dataclass(frozen=True)
class Comparison:
    run: Mapping
    request: PlanRequest
    prediction: Prediction
    published_tflops: float
    predicted_tflops: float  # the paper's FLOP count over the predicted step time

    @property
    def error(self) -> float:
        """Predicted / published - 1 (positive: the model is optimistic)."""
        return self.predicted_tflops / self.published_tflops - 1


def compare(data: Mapping, run: Mapping, device: DeviceType | None = None) -> Comparison:
    device = device or device_for(data)
    request = request_for(data, run, device)
    layout = layout_for(request, run)
    cost = CostModel(request)
    problem = cost.problem(layout)
    if problem:
        raise ValueError(f"{run['id']}: {problem}")
    prediction = cost.evaluate(layout)
    model = request.model
    predicted = counted_flops(run, model) / prediction.step_time_s / run["layout"]["gpus"] / 1e12
    return Comparison(run, request, prediction, published_tflops(run, model), predicted)


def compare_all(data: Mapping, runs: Iterable[Mapping] | None = None, device: DeviceType | None = None
                ) -> list[Comparison]:
    return [compare(data, run, device) for run in (data["runs"] if runs is None else runs)]


def calibrate(data: Mapping, runs: Iterable[Mapping]) -> float:
    """The one ``achievable_fraction`` for the data's chip that minimises the squared relative throughput
    error over ``runs`` (golden-section search on (0.2, 1.0]; the error is unimodal in the fraction)."""
    runs = list(runs)
    base = device_for(data)

    def loss(fraction: float) -> float:
        device = replace(base, achievable_fraction=fraction)
        return sum(c.error ** 2 for c in compare_all(data, runs, device))

    lo, hi = 0.2, 1.0
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(40):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = loss(b)
    return round((lo + hi) / 2, 4)
