"""Refining a chip's achievable fraction of peak from measured step times (planning/calibration.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning import DevicePool, DeviceType, Layout, PlanRequest, homogeneous_layout
from controlplane.planning.calibration import (
    MAX_FRACTION,
    fit_fraction,
    predicted_step_s,
    refine_fraction,
)
from controlplane.planning.presets import model_spec

H100 = DeviceType(slug="nvidia-h100", peak_tflops={"bf16": 989.0, "fp8": 1979.0}, memory_gb=80.0,
                  memory_bandwidth_gbps=3350.0, achievable_fraction=0.5)


def request_and_layout(tp: int = 2, pp: int = 1, dp: int = 4) -> tuple[PlanRequest, Layout]:
    pool = DevicePool(device=H100, nodes=1, devices_per_node=8, intra_node_gbps=450.0, inter_node_gbps=50.0)
    request = PlanRequest(model=model_spec("llama2-7b"), global_batch_size=64, pools=(pool,))
    return request, homogeneous_layout(pool, 32, dp=dp, tp=tp, pp=pp, micro_batch_size=1, recompute="selective")


def test_the_fit_reproduces_the_step_time_measured_at_a_known_fraction():
    request, layout = request_and_layout()
    measured = predicted_step_s(request, layout, "nvidia-h100", 0.31)
    fit = fit_fraction(request, layout, "nvidia-h100", measured)
    assert fit.bound == "" and fit.fraction == pytest.approx(0.31, abs=2e-4)
    assert fit.predicted_at_prior_s == pytest.approx(predicted_step_s(request, layout, "nvidia-h100", 0.5))
    assert fit.predicted_at_prior_s < measured  # slower than the prior predicted: a lower fraction


def test_the_layout_round_trips_through_its_dict():
    _, layout = request_and_layout(tp=2, pp=2, dp=2)
    assert Layout.from_dict(layout.as_dict()) == layout
    with pytest.raises(ValueError, match="stages"):
        Layout.from_dict({"dp": 1})
    with pytest.raises(ValueError, match="malformed"):
        Layout.from_dict({"stages": [{"pool": "x"}], "dp": 1, "micro_batch_size": 1})


def test_a_step_time_the_model_cannot_explain_is_clamped_and_says_why():
    request, layout = request_and_layout()
    too_fast = fit_fraction(request, layout, "nvidia-h100", 1e-6)
    assert too_fast.fraction == MAX_FRACTION and "full dense peak" in too_fast.bound
    too_slow = fit_fraction(request, layout, "nvidia-h100", 1e6)
    assert "slower than the model explains" in too_slow.bound
    with pytest.raises(ValueError, match="positive"):
        fit_fraction(request, layout, "nvidia-h100", 0.0)
    with pytest.raises(ValueError, match="no pool of nvidia-a100"):
        fit_fraction(request, layout, "nvidia-a100", 1.0)


def test_a_layout_that_cannot_run_is_refused_not_fitted():
    request, _ = request_and_layout()
    pool = request.pools[0]
    layout = homogeneous_layout(pool, 32, dp=8, tp=1, pp=1, micro_batch_size=3)  # 64 sequences are not 8 x 3 x k
    with pytest.raises(ValueError, match="not a multiple"):
        fit_fraction(request, layout, "nvidia-h100", 10.0)


def test_refinement_weighs_the_prior_as_pseudo_runs():
    assert refine_fraction(0.5, []) == 0.5
    assert refine_fraction(0.5, [0.3]) == pytest.approx((0.5 * 2 + 0.3) / 3, abs=1e-4)
    many = refine_fraction(0.5, [0.3] * 40)
    assert 0.3 < many < 0.32  # many runs outweigh the prior
    assert refine_fraction(0.5, [0.3], prior_weight=0) == 0.3
    with pytest.raises(ValueError):
        refine_fraction(0.5, [1.5])
    with pytest.raises(ValueError):
        refine_fraction(0.0, [0.3])


@settings(max_examples=30, deadline=None)
@given(fraction=st.floats(min_value=0.05, max_value=0.95), tp=st.sampled_from([1, 2, 4]))
def test_a_slower_measured_step_never_fits_a_higher_fraction(fraction, tp):
    request, layout = request_and_layout(tp=tp, dp=8 // tp)
    measured = predicted_step_s(request, layout, "nvidia-h100", fraction)
    fit = fit_fraction(request, layout, "nvidia-h100", measured)
    slower = fit_fraction(request, layout, "nvidia-h100", measured * 1.2)
    assert fit.fraction == pytest.approx(fraction, abs=1e-3)
    assert slower.fraction <= fit.fraction
