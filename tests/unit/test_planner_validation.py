"""The planner's cost model against published training runs (published_runs.json): for each verified run,
the predicted throughput of the run's own layout is within 15% of the published figure; the data carries its
sources; the planner's own choice is at least as fast as the published layout by its own model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.planning import CALIBRATED_ACHIEVABLE_FRACTION, PlanOptions, plan
from controlplane.planning.validation import calibrate, compare, load_published_runs

TOLERANCE = 0.15
DATA = load_published_runs()
RUNS = DATA["runs"]
VERIFIED = [run for run in RUNS if run["verified"]]


def test_the_data_names_its_sources():
    assert "Narayanan" in DATA["sources"]["table1"] and "2104.04473" in DATA["sources"]["table1"]
    assert "run_table_1.sh" in DATA["sources"]["table1_layout"]
    assert DATA["hardware"]["device"] == "nvidia-a100"
    assert len([r for r in RUNS if r["table"] == "narayanan2021-table1"]) == 10
    for run in RUNS:
        assert isinstance(run["verified"], bool) and run["verification"]


@pytest.mark.parametrize("run", [r for r in RUNS if "parameters_billion" in r], ids=lambda r: r["id"])
def test_parameter_counts_match_the_table(run):
    comparison = compare(DATA, run)
    assert comparison.request.model.parameters() / 1e9 == pytest.approx(run["parameters_billion"], abs=0.06)


@pytest.mark.parametrize("run", VERIFIED, ids=lambda r: r["id"])
def test_published_layout_predicted_within_tolerance(run):
    comparison = compare(DATA, run)
    assert abs(comparison.error) <= TOLERANCE, (
        f"{run['id']}: predicted {comparison.predicted_tflops:.1f} vs published {comparison.published_tflops:.1f} "
        f"TFLOPS per GPU ({100 * comparison.error:+.1f}%)")
    assert comparison.prediction.fits, f"{run['id']} ran on real GPUs, so its layout must fit the memory model"


def test_the_calibrated_constant_is_the_table1_fit():
    table1 = [r for r in VERIFIED if r["table"] == "narayanan2021-table1"]
    assert calibrate(DATA, table1) == pytest.approx(CALIBRATED_ACHIEVABLE_FRACTION["nvidia-a100"], abs=0.01)


@pytest.mark.parametrize("run", [r for r in VERIFIED if r["table"] == "korthikanti2022-table5"],
                         ids=lambda r: r["id"])
def test_planner_choice_at_least_as_fast_as_the_published_layout(run):
    comparison = compare(DATA, run)
    spec = run["layout"]
    options = PlanOptions(flash_attention=False, allow_zero=spec["zero"], allow_sequence_parallel=spec[
        "sequence_parallel"], allow_selective_recompute=spec["recompute"] == "selective")
    result = plan(replace(comparison.request, options=options))
    assert result.best.step_time_s <= comparison.prediction.step_time_s * (1 + 1e-9)
