"""Validation of the cost model against published training runs (``published_runs.json``).

For each run: the request (model, global batch, a pool of the run's GPUs) and the run's own layout, the
published throughput, the planner's prediction for that same layout, and the relative error. Both the
benchmark (benchmarks/planner.py) and the tests (tests/unit/test_planner_validation.py) use this module, so
they cannot drift apart. Also the one-constant-per-chip calibration of ``achievable_fraction``.

Runs may be on different hardware: each run names its table (``data["tables"]``), each table names a block of
``data["hardware"]`` (a run may name its own ``"hardware"``), and a table with ``"calibrates": <chip>`` is
what that chip's constant is fitted on. Layout figures a paper does not give are ``null`` in the run's layout
and listed with their candidate values in its ``"unknowns"``: the comparison takes the combination the cost
model predicts fastest for the published degrees, and says which (``Comparison.resolved``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.planning.cost import CostModel, model_flops_per_token, step_flops_megatron
from controlplane.planning.model import (
    CALIBRATED_ACHIEVABLE_FRACTION,
    DEFAULT_ACHIEVABLE_FRACTION,
    DevicePool,
    DeviceType,
    Layout,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    Prediction,
    Stage,
)

PUBLISHED_RUNS = Path(__file__).with_name("published_runs.json")
UNKNOWN_FIELDS = ("micro_batch_size", "virtual_stages", "sequence_parallel")


def load_published_runs(path: str | Path = PUBLISHED_RUNS) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def table_for(data: Mapping, run: Mapping) -> Mapping:
    return data["tables"][run["table"]]


def hardware_for(data: Mapping, run: Mapping) -> Mapping:
    """The hardware block the run ran on: its own ``hardware`` (a block or the name of one), else its table's."""
    hardware = run.get("hardware") or table_for(data, run)["hardware"]
    return data["hardware"][hardware] if isinstance(hardware, str) else hardware


def device_for(hardware: Mapping, achievable_fraction: float | None = None) -> DeviceType:
    """The chip of a hardware block: its 16-bit dense peak as the block gives it (the one the papers' MFU uses),
    memory and memory bandwidth from ``accelerator_facts``; the fraction defaults to the committed calibration."""
    from controlplane.cluster.accelerator_facts import facts_by_slug

    fact = facts_by_slug()[hardware["device"]]
    if achievable_fraction is None:
        achievable_fraction = CALIBRATED_ACHIEVABLE_FRACTION.get(hardware["device"], DEFAULT_ACHIEVABLE_FRACTION)
    return DeviceType(slug=fact["slug"], peak_tflops={"bf16": float(hardware["peak_tflops_16bit"])},
                      memory_gb=fact["memory_gb"], memory_bandwidth_gbps=fact["memory_bandwidth_gbps"],
                      achievable_fraction=achievable_fraction)


def run_device(data: Mapping, run: Mapping, achievable_fraction: float | None = None) -> DeviceType:
    return device_for(hardware_for(data, run), achievable_fraction)


def model_for(run: Mapping) -> ModelSpec:
    return ModelSpec.from_dict({**run["model"], "name": run["name"]})


def request_for(data: Mapping, run: Mapping, device: DeviceType, options: PlanOptions | None = None) -> PlanRequest:
    hardware, layout = hardware_for(data, run), run["layout"]
    per_node = hardware["devices_per_node"]
    pool = DevicePool(device=device, nodes=max(1, -(-layout["gpus"] // per_node)), devices_per_node=per_node,
                      intra_node_gbps=hardware["intra_node_gbps"], inter_node_gbps=hardware["inter_node_gbps"])
    if options is None:
        options = PlanOptions(flash_attention=table_for(data, run).get("flash_attention", True))
    return PlanRequest(model=model_for(run), global_batch_size=layout["global_batch_size"], pools=(pool,),
                       options=options)


def stage_layers(run: Mapping, layers: int) -> list[int]:
    """Layers per pipeline stage: the run's ``stage_layers`` when the paper gives an uneven split, else equal."""
    spec = run["layout"]
    if spec.get("stage_layers"):
        split = list(spec["stage_layers"])
        if len(split) != spec["pp"] or sum(split) != layers:
            raise ValueError(f"{run['id']}: stage_layers {split} is not {spec['pp']} stages of {layers} layers")
        return split
    if layers % spec["pp"]:
        raise ValueError(f"{run['id']}: {layers} layers do not split evenly into {spec['pp']} stages")
    return [layers // spec["pp"]] * spec["pp"]


def layout_candidates(request: PlanRequest, run: Mapping) -> list[tuple[dict, Layout]]:
    """The run's layout, or one per combination of its unknown figures: [(the values chosen, layout)]."""
    spec, unknowns = run["layout"], run.get("unknowns", {})
    pool = request.pools[0].name
    stages = tuple(Stage(pool, spec["tp"], n) for n in stage_layers(run, request.model.layers))
    missing = [name for name in UNKNOWN_FIELDS if name in spec and spec[name] is None]
    for name in missing:
        if not unknowns.get(name):
            raise ValueError(f"{run['id']}: {name} is unknown but the run lists no candidates for it")
    defaults = {"micro_batch_size": spec.get("micro_batch_size"), "virtual_stages": spec.get("virtual_stages") or 1,
                "sequence_parallel": bool(spec.get("sequence_parallel"))}
    candidates = []
    for values in itertools.product(*(unknowns[name] for name in missing)):
        chosen = dict(zip(missing, values, strict=True))
        figures = {**defaults, **chosen}
        layout = Layout(dp=spec["dp"], stages=stages, micro_batch_size=figures["micro_batch_size"],
                        recompute=spec["recompute"], zero=spec.get("zero", False),
                        virtual_stages=figures["virtual_stages"], sequence_parallel=figures["sequence_parallel"],
                        shard_gradients=bool(spec.get("shard_gradients", False)))
        candidates.append((chosen, layout))
    return candidates


def counted_flops(run: Mapping, model: ModelSpec) -> float:
    """FLOPs per iteration as the run's paper counted them, so throughputs compare like with like."""
    batch = run["layout"]["global_batch_size"]
    if run["flops_counted"] == "megatron_eq3":
        return step_flops_megatron(model, batch)
    if run["flops_counted"] == "palm_model":
        return batch * model.seq_len * model_flops_per_token(model)
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
    resolved: Mapping = field(default_factory=dict)  # the unknown figures the comparison chose, {} when none

    @property
    def error(self) -> float:
        """Predicted / published - 1 (positive: the model is optimistic)."""
        return self.predicted_tflops / self.published_tflops - 1


def compare(data: Mapping, run: Mapping, device: DeviceType | None = None) -> Comparison:
    device = device or run_device(data, run)
    request = request_for(data, run, device)
    cost = CostModel(request)
    best = None
    problems = []
    for chosen, layout in layout_candidates(request, run):
        problem = cost.problem(layout)
        if problem:
            problems.append(problem)
            continue
        prediction = cost.evaluate(layout)
        if best is None or prediction.step_time_s < best[1].step_time_s:
            best = (chosen, prediction)
    if best is None:
        raise ValueError(f"{run['id']}: {problems[0]}")
    chosen, prediction = best
    model = request.model
    predicted = counted_flops(run, model) / prediction.step_time_s / run["layout"]["gpus"] / 1e12
    return Comparison(run, request, prediction, published_tflops(run, model), predicted, chosen)


def compare_all(data: Mapping, runs: Iterable[Mapping] | None = None, device: DeviceType | None = None
                ) -> list[Comparison]:
    return [compare(data, run, device) for run in (data["runs"] if runs is None else runs)]


def calibration_runs(data: Mapping, chip: str) -> list[Mapping]:
    """The verified runs of the tables that calibrate ``chip`` (``"calibrates": chip``)."""
    return [run for run in data["runs"] if run["verified"] and table_for(data, run).get("calibrates") == chip
            and hardware_for(data, run)["device"] == chip]


def calibrated_chips(data: Mapping) -> list[str]:
    return sorted({table["calibrates"] for table in data["tables"].values() if table.get("calibrates")})


def calibrate(data: Mapping, runs: Iterable[Mapping]) -> float:
    """The one ``achievable_fraction`` for the runs' chip that minimises the squared relative throughput
    error over ``runs`` (golden-section search on (0.2, 1.0]; the error is unimodal in the fraction). The runs
    must all be on one chip; each keeps its own hardware block (peak, links)."""
    runs = list(runs)
    chips = {hardware_for(data, run)["device"] for run in runs}
    if len(chips) != 1:
        raise ValueError(f"calibrate needs runs on one chip, got {sorted(chips) or 'none'}")

    def loss(fraction: float) -> float:
        return sum(compare(data, run, run_device(data, run, fraction)).error ** 2 for run in runs)

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


def leave_one_out(data: Mapping, runs: Iterable[Mapping]) -> dict[str, dict]:
    """{run id: {"fraction": fitted on the other runs, "error": this run's error at that fraction}}."""
    runs = list(runs)
    out = {}
    for run in runs:
        fraction = calibrate(data, [r for r in runs if r is not run])
        out[run["id"]] = {"fraction": fraction, "error": compare(data, run, run_device(data, run, fraction)).error}
    return out
