"""The planner's cost model against published training runs (published_runs.json): for each verified run,
the predicted throughput of the run's own layout is within 15% of the published figure; the data carries its
sources; each calibrated chip's committed constant is the fit on its tables; the planner's own choice is at
least as fast as the published layout by its own model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.planning import CALIBRATED_ACHIEVABLE_FRACTION, PlanOptions, plan
from controlplane.planning.cost import CostModel
from controlplane.planning.validation import (
    calibrate,
    calibrated_chips,
    calibration_runs,
    compare,
    hardware_for,
    leave_one_out,
    load_published_runs,
    run_device,
)

TOLERANCE = 0.15
DATA = load_published_runs()
RUNS = DATA["runs"]
VERIFIED = [run for run in RUNS if run["verified"]]
LLAMA3 = [run for run in RUNS if run["table"] == "grattafiori2024-table4"]


def test_the_data_names_its_sources():
    assert "Narayanan" in DATA["sources"]["table1"] and "2104.04473" in DATA["sources"]["table1"]
    assert "run_table_1.sh" in DATA["sources"]["table1_layout"]
    assert "2407.21783" in DATA["sources"]["llama3_table4"] and len(DATA["sources"]["llama3_table4_figures"]) >= 2
    assert len([r for r in RUNS if r["table"] == "narayanan2021-table1"]) == 10
    for run in RUNS:
        assert isinstance(run["verified"], bool) and run["verification"]
        assert run["table"] in DATA["tables"]


def test_each_table_names_its_hardware():
    chips = {name: hardware_for(DATA, run)["device"] for run in RUNS for name in [run["table"]]}
    assert chips == {"narayanan2021-table1": "nvidia-a100", "korthikanti2022-table5": "nvidia-a100",
                     "grattafiori2024-table4": "nvidia-h100"}
    h100 = DATA["hardware"][DATA["tables"]["grattafiori2024-table4"]["hardware"]]
    assert (h100["peak_tflops_16bit"], h100["devices_per_node"], h100["inter_node_gbps"]) == (989, 8, 50)
    assert run_device(DATA, LLAMA3[0]).peak("bf16") == 989.0


def test_the_llama3_rows_are_table4_as_published():
    assert [(r["layout"]["gpus"], r["layout"]["tp"], r["layout"]["cp"], r["layout"]["pp"], r["layout"]["dp"],
             r["layout"]["batch_size_per_dp"], r["published"]["tflops_per_gpu"], r["published"]["percent_of_peak"])
            for r in LLAMA3] == [(8192, 8, 1, 16, 64, 32, 430, 43), (16384, 8, 1, 16, 128, 16, 400, 41)]
    for run in LLAMA3:
        layout = run["layout"]
        assert layout["global_batch_size"] * run["model"]["seq_len"] == 16_777_216  # "16M tokens per batch"
        assert layout["tp"] * layout["cp"] * layout["pp"] * layout["dp"] == layout["gpus"]
        assert layout["stage_layers"] == [7] + [8] * 14 + [7] and layout["recompute"] == "none"
        assert set(run["unknowns"]) >= {"micro_batch_size", "virtual_stages", "sequence_parallel", "rule"}
    excluded = DATA["tables"]["grattafiori2024-table4"]["excluded_rows"]
    assert [(row["cp"], row["seq_len"]) for row in excluded] == [(16, 131072)] and "context parallelism" in excluded[
        0]["why"]


@pytest.mark.parametrize("run", [r for r in RUNS if "parameters_billion" in r], ids=lambda r: r["id"])
def test_parameter_counts_match_the_table(run):
    comparison = compare(DATA, run)
    assert comparison.request.model.parameters() / 1e9 == pytest.approx(
        run["parameters_billion"], abs=run.get("parameters_tolerance_billion", 0.06))


@pytest.mark.parametrize("run", VERIFIED, ids=lambda r: r["id"])
def test_published_layout_predicted_within_tolerance(run):
    comparison = compare(DATA, run)
    assert abs(comparison.error) <= TOLERANCE, (
        f"{run['id']}: predicted {comparison.predicted_tflops:.1f} vs published {comparison.published_tflops:.1f} "
        f"TFLOPS per GPU ({100 * comparison.error:+.1f}%)")
    # A run on real GPUs fitted; where the memory model says otherwise the data says so and why.
    assert comparison.prediction.fits == run.get("memory_model_fits", True), run.get("memory_note")


def test_unknown_layout_figures_resolve_to_the_fastest_combination():
    run = LLAMA3[0]
    comparison = compare(DATA, run)
    assert comparison.resolved == {"micro_batch_size": 1, "virtual_stages": 8, "sequence_parallel": True}
    layout = comparison.prediction.layout
    assert [s.layers for s in layout.stages] == run["layout"]["stage_layers"] and layout.zero
    cost = CostModel(comparison.request)
    for mbs in (1, 2):
        for v in (1, 2, 4):
            other = replace(layout, micro_batch_size=mbs, virtual_stages=v)
            if cost.problem(other) is None:
                assert cost.evaluate(other).step_time_s >= comparison.prediction.step_time_s
    # Without the interleaved schedule the published layout would be far slower than Meta measured.
    assert cost.evaluate(replace(layout, virtual_stages=1)).step_time_s > 1.2 * comparison.prediction.step_time_s


def test_llama3_uneven_stages_may_interleave_but_other_uneven_splits_may_not():
    comparison = compare(DATA, LLAMA3[0])
    cost, layout = CostModel(comparison.request), comparison.prediction.layout
    assert cost.problem(replace(layout, virtual_stages=8)) is None
    stages = layout.stages
    shifted = (replace(stages[0], layers=8),) + stages[1:-1] + (replace(stages[-1], layers=6),)
    assert "virtual stages" in cost.problem(replace(layout, stages=shifted, virtual_stages=8))


@pytest.mark.parametrize("chip", ["nvidia-a100", "nvidia-h100"])
def test_the_committed_constant_is_the_fit_on_its_tables(chip):
    assert chip in calibrated_chips(DATA)
    runs = calibration_runs(DATA, chip)
    assert runs and all(hardware_for(DATA, r)["device"] == chip for r in runs)
    assert calibrate(DATA, runs) == pytest.approx(CALIBRATED_ACHIEVABLE_FRACTION[chip], abs=0.01)


def test_h100_calibration_is_on_the_two_llama3_rows_and_holds_out_of_sample():
    runs = calibration_runs(DATA, "nvidia-h100")
    assert [r["id"] for r in runs] == [r["id"] for r in LLAMA3]
    for run_id, held_out in leave_one_out(DATA, runs).items():
        assert abs(held_out["error"]) <= TOLERANCE, run_id
        assert held_out["fraction"] == pytest.approx(CALIBRATED_ACHIEVABLE_FRACTION["nvidia-h100"], abs=0.03)


def test_calibration_refuses_runs_on_two_chips():
    with pytest.raises(ValueError, match="one chip"):
        calibrate(DATA, [RUNS[0], LLAMA3[0]])


def test_at_the_old_default_the_h100_rows_were_predicted_slow():
    """The 0.5 used before the calibration under-predicted both Llama 3 rows; the fit moves them to within 2%."""
    for run in LLAMA3:
        before = compare(DATA, run, run_device(DATA, run, 0.5)).error
        after = compare(DATA, run).error
        assert before < -0.1 and abs(after) < 0.02


@pytest.mark.parametrize("run", [r for r in VERIFIED if r["table"] == "korthikanti2022-table5"],
                         ids=lambda r: r["id"])
def test_planner_choice_at_least_as_fast_as_the_published_layout(run):
    comparison = compare(DATA, run)
    spec = run["layout"]
    options = PlanOptions(flash_attention=False, allow_zero=spec["zero"], allow_sequence_parallel=spec[
        "sequence_parallel"], allow_selective_recompute=spec["recompute"] == "selective")
    result = plan(replace(comparison.request, options=options))
    assert result.best.step_time_s <= comparison.prediction.step_time_s * (1 + 1e-9)


def test_the_llama3_405b_preset_is_the_model_of_the_published_rows():
    from dataclasses import asdict

    from controlplane.planning.presets import MODEL_PRESETS, model_spec
    from controlplane.planning.validation import model_for

    preset, published = asdict(model_spec("llama3-405b")), asdict(model_for(LLAMA3[0]))
    assert {k: v for k, v in preset.items() if k != "name"} == {k: v for k, v in published.items() if k != "name"}
    assert "2407.21783" in MODEL_PRESETS["llama3-405b"]["source"]
    assert model_spec("llama3-405b").parameters() / 1e9 == pytest.approx(405.85, abs=0.01)
