"""Refine a chip's ``achievable_fraction`` from step times measured on real hardware (issue 9).

The cost model's compute time is matrix FLOPs / (dense peak x ``achievable_fraction``); everything else in a
step (memory-bound work, collectives, the pipeline bubble) does not depend on the fraction. So the predicted
step time of a fixed layout falls strictly as the fraction rises, and one measured step time gives the
fraction at which the model predicts exactly that: ``fit_fraction`` finds it by bisection.

``refine_fraction`` blends the fits of several runs with the prior (the published calibration or the
default) as ``prior_weight`` pseudo-runs, so one odd run moves the figure only part of the way, and many
runs outweigh the prior. Pure: no Django, no Ray; the platform feeds it runs in ``jobs/calibration.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from controlplane.planning.cost import CostModel
from controlplane.planning.model import Layout, PlanRequest

# The fraction is searched in this range; a measured step outside what it can explain is reported, not fitted.
MIN_FRACTION, MAX_FRACTION = 0.01, 1.0
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True)
class FractionFit:
    """The fraction at which the model predicts ``measured_step_s`` for the layout. ``bound`` is "" when the
    fit is exact, else why it was clamped (the run was faster than the full peak allows, or slower than
    ``MIN_FRACTION`` explains); a clamped fit is not used to refine."""

    fraction: float
    measured_step_s: float
    predicted_at_prior_s: float
    bound: str = ""


def _with_fraction(request: PlanRequest, slug: str, fraction: float) -> PlanRequest:
    pools = tuple(replace(p, device=replace(p.device, achievable_fraction=fraction)) if p.device.slug == slug else p
                  for p in request.pools)
    return replace(request, pools=pools)


def predicted_step_s(request: PlanRequest, layout: Layout, slug: str, fraction: float) -> float:
    return CostModel(_with_fraction(request, slug, fraction)).evaluate(layout).step_time_s


def fit_fraction(request: PlanRequest, layout: Layout, slug: str, measured_step_s: float,
                 *, tolerance: float = 1e-4) -> FractionFit:
    """The ``achievable_fraction`` of chip ``slug`` that makes the cost model predict ``measured_step_s`` for
    ``layout``. ValueError when the layout cannot run on the request's pools or the step time is not positive."""
    if not measured_step_s > 0:
        raise ValueError(f"a measured step time must be positive, got {measured_step_s!r}")
    if not any(p.device.slug == slug for p in request.pools):
        raise ValueError(f"no pool of {slug} in the request")
    problem = CostModel(request).problem(layout)
    if problem:
        raise ValueError(problem)
    prior = next(p.device.achievable_fraction for p in request.pools if p.device.slug == slug)
    at_prior = predicted_step_s(request, layout, slug, prior)
    fastest = predicted_step_s(request, layout, slug, MAX_FRACTION)
    if measured_step_s <= fastest:
        return FractionFit(MAX_FRACTION, measured_step_s, at_prior,
                           f"{measured_step_s:.4g} s is at or below the {fastest:.4g} s the model predicts at the "
                           f"full dense peak")
    slowest = predicted_step_s(request, layout, slug, MIN_FRACTION)
    if measured_step_s >= slowest:
        return FractionFit(MIN_FRACTION, measured_step_s, at_prior,
                           f"{measured_step_s:.4g} s is slower than the model explains even at {MIN_FRACTION:g} "
                           f"of the peak ({slowest:.4g} s)")
    lo, hi = MIN_FRACTION, MAX_FRACTION  # predicted(lo) > measured > predicted(hi)
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if predicted_step_s(request, layout, slug, mid) > measured_step_s:
            lo = mid
        else:
            hi = mid
    return FractionFit(round((lo + hi) / 2, 4), measured_step_s, at_prior)


def refine_fraction(prior: float, fits: Sequence[float], *, prior_weight: float = PRIOR_WEIGHT) -> float:
    """The prior counted as ``prior_weight`` runs, averaged with each run's fitted fraction."""
    if not 0 < prior <= 1:
        raise ValueError(f"prior must be in (0, 1], got {prior!r}")
    if prior_weight < 0:
        raise ValueError(f"prior_weight must be >= 0, got {prior_weight!r}")
    if not fits:
        return prior
    if any(not 0 < f <= 1 for f in fits):
        raise ValueError(f"fitted fractions must be in (0, 1], got {list(fits)!r}")
    return round((prior * prior_weight + sum(fits)) / (prior_weight + len(fits)), 4)
