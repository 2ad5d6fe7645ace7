"""Parallel-strategy planner (issue 9): choose DP / TP / PP (and EP) per chip type from a cost model.

A pure core: standard library only, no Django, no Ray, deterministic. ``plan(request)`` searches the
layouts and returns the best with ranked alternatives; ``predict(request, layout)`` evaluates one layout.
The cost model is documented in ``cost.py``, the search in ``search.py``; ``published_runs.json`` holds the
published training runs it is validated against (benchmarks/planner.py, tests/unit/test_planner*.py).
"""

from controlplane.planning.cost import CostModel, homogeneous_layout, predict, step_flops_megatron
from controlplane.planning.model import (
    CALIBRATED_ACHIEVABLE_FRACTION,
    DEFAULT_ACHIEVABLE_FRACTION,
    DevicePool,
    DeviceType,
    Layout,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    PlanResult,
    Prediction,
    Stage,
    device_type_from_facts,
)
from controlplane.planning.search import balance_layers, plan

__all__ = [
    "CALIBRATED_ACHIEVABLE_FRACTION",
    "DEFAULT_ACHIEVABLE_FRACTION",
    "CostModel",
    "DevicePool",
    "DeviceType",
    "Layout",
    "ModelSpec",
    "PlanOptions",
    "PlanRequest",
    "PlanResult",
    "Prediction",
    "Stage",
    "balance_layers",
    "device_type_from_facts",
    "homogeneous_layout",
    "plan",
    "predict",
    "step_flops_megatron",
]
