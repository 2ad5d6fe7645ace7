"""Parallel-strategy planner benchmark: the cost model against published training runs, mixed-chip plans,
and the search time.

Run from the repository root::

    .venv/bin/python benchmarks/planner.py [--json PATH] [--csv PATH] [--no-write] [--repeat N]

1. Published runs (``platform/controlplane/planning/published_runs.json``: Table 1 of Narayanan et al.,
   SC'21, and Table 5 of Korthikanti et al. 2022 on A100 80GB DGX nodes; Table 4 of the Llama 3 paper,
   Grattafiori et al. 2024, Llama 3 405B on 8,192 and 16,384 H100 80GB). For each run: its layout and
   published throughput; the planner's prediction for that same layout and the error; the planner's own
   choice for the same model, batch and GPUs (all features, and only the features the run had), with its
   predicted throughput and speed-up by its own model. Throughput is "TFLOPS per GPU" counted the way the
   paper counts (Table 1: Eq. 3 hardware FLOPs with recomputation; Table 5: model FLOPs; Llama 3: model
   FLOPs, PaLM's 6N + 12LHQT), over the step time, so published and predicted compare like with like. Layout
   figures a paper does not give (Llama 3: micro-batch size, interleaving depth V, sequence parallelism) are
   resolved to the combination the cost model predicts fastest for the published TP/PP/DP, and printed.
   Then the calibration, per chip: the one ``achievable_fraction`` fitted on the chip's calibration table
   (A100: Table 1; H100: Llama 3 Table 4), each row predicted by a fraction fitted on the others
   (leave-one-out), Table 5 as rows the A100 constant never saw, and for H100 how the fit moves if V were
   fixed instead of chosen.
2. Mixed chips: the planner's heterogeneous plan on H100 + A100 pools against the best plan on either
   chip type alone, each chip at its calibrated ``achievable_fraction`` (A100 0.65 from SC'21 Table 1,
   H100 0.6 from Llama 3 Table 4).
3. Search time for 1,024-device requests (homogeneous and mixed), median of ``--repeat`` runs.

Results go to ``benchmarks/results/planner.{json,csv}`` unless ``--json``/``--csv`` say otherwise.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):  # controlplane's source root; benchmarks
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT  # noqa: E402
from controlplane.cluster.accelerator_facts import facts_by_slug  # noqa: E402
from controlplane.planning import (  # noqa: E402
    CALIBRATED_ACHIEVABLE_FRACTION,
    DevicePool,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    device_type_from_facts,
    plan,
)
from controlplane.planning.validation import (  # noqa: E402
    calibrate,
    calibrated_chips,
    calibration_runs,
    compare,
    counted_flops,
    hardware_for,
    leave_one_out,
    load_published_runs,
    run_device,
    table_for,
)

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
TOLERANCE = 0.15

# DGX H100: NVLink 4 900 GB/s per GPU both ways = 450 GB/s each way; one 400 Gb/s NDR port per GPU = 50 GB/s.
H100_LINKS = {"devices_per_node": 8, "intra_node_gbps": 450.0, "inter_node_gbps": 50.0}
# DGX A100: NVLink 3 600 GB/s both ways = 300 GB/s each way; one 200 Gb/s HDR port per GPU = 25 GB/s.
A100_LINKS = {"devices_per_node": 8, "intra_node_gbps": 300.0, "inter_node_gbps": 25.0}
# L40S: PCIe Gen4 x16 = 32 GB/s each way (cluster/link_defaults.py); ASSUMED 200 Gb/s per GPU between nodes, as the
# A100 nodes (L40S servers ship with 25 to 400 Gb/s per node; only the three-pool timing case uses it).
L40S_LINKS = {"devices_per_node": 8, "intra_node_gbps": 32.0, "inter_node_gbps": 25.0}

GPT3_175B = ModelSpec(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=51200, name="GPT-3 175B")
LLAMA2_70B = ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, seq_len=4096, vocab=32000,
                       gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False, dropout=False,
                       name="Llama-2 70B")
MIXED_CASES = [
    # (model, global batch, H100 nodes, A100 nodes)
    (GPT3_175B, 1536, 32, 32),
    (GPT3_175B, 1536, 16, 48),
    (LLAMA2_70B, 512, 16, 32),
]
# The deepest model the planner accepts (1,000 layers), of small layers: every pipeline depth up to 1,000 is a
# candidate, and all but the shallow ones must be ruled out by their step-time bounds (1.2 s and 1.7 s before they
# counted the sends and the bubble; QA, 2026-12-07).
DEEP_1000 = ModelSpec(layers=1000, hidden=512, heads=8, seq_len=2048, vocab=32000, name="1,000 layers x 512")
# A mixture of experts of DeepSeek-V3's size (61 layers, hidden 7168, 256 experts of FFN 2048, top 8; 687B parameters
# here: its shared expert, dense first layers and MLA attention are not modelled): mixed pipelines run EP 1, so most
# of them cannot hold it (2.6 s before the mixed search checked that before balancing; 2026-12-07).
MOE_256 = ModelSpec(layers=61, hidden=7168, heads=128, ffn_hidden=2048, experts=256, top_k=8, seq_len=4096,
                    vocab=129280, gated_mlp=True, bias=False, tied_embeddings=False, learned_positions=False,
                    dropout=False, name="256-expert MoE, 61 layers")
TIMING_CASES = [
    ("1,024 x H100, GPT-3 175B", GPT3_175B, 1536, 128, 0),
    ("512 x H100 + 512 x A100, GPT-3 175B", GPT3_175B, 1536, 64, 64),
    ("1,024 x A100, Llama-2 70B", LLAMA2_70B, 1024, 0, 128),
    ("1,024 x H100, 1,000 layers x hidden 512", DEEP_1000, 1024, 128, 0),
    ("512 x H100 + 512 x A100, 1,000 layers x 512", DEEP_1000, 1024, 64, 64),
    ("344 H100 + 344 A100 + 336 L40S, GPT-3 175B", GPT3_175B, 1536, 43, 43, 42),
    ("344 H100 + 344 A100 + 336 L40S, 256-exp MoE", MOE_256, 1536, 43, 43, 42),
]


def layout_text(spec: dict) -> str:
    """A layout in one line; a figure the paper does not give shows as "?"."""
    def known(name, default=None):
        value = spec.get(name, default)
        return "?" if value is None else value

    text = f"TP{spec['tp']} PP{spec['pp']} DP{spec['dp']} mb{known('micro_batch_size')}"
    if spec.get("virtual_stages", 1) is None or spec.get("virtual_stages", 1) > 1:
        text += f" v{known('virtual_stages')}"
    text += {"full": " full-rc", "selective": " sel-rc", "norms": " norm-rc", "none": ""}[spec["recompute"]]
    if spec.get("sequence_parallel") is None:
        text += " SP?"
    elif spec.get("sequence_parallel"):
        text += " SP"
    return text


def chosen_text(layout) -> str:
    spec = layout.as_dict()
    text = layout_text(spec)
    if spec["zero"]:
        text += " ZeRO2" if spec.get("shard_gradients") else " ZeRO1"
    return text


# -- 1. published runs ---------------------------------------------------------------------------------------

def run_features(data: dict, run: dict) -> PlanOptions:
    """Only what the run's software had: its recompute mode (or none), ZeRO and sequence parallelism if used
    (or not known), its attention kernel."""
    spec = run["layout"]
    return PlanOptions(flash_attention=table_for(data, run).get("flash_attention", True),
                       allow_zero=spec.get("zero", False),
                       allow_sequence_parallel=spec.get("sequence_parallel", False) is not False,
                       allow_selective_recompute=spec["recompute"] == "selective",
                       allow_norm_recompute=spec["recompute"] == "norms",  # no published run recomputes only norms
                       allow_recompute=spec["recompute"] != "none")


def published_rows(data: dict) -> list[dict]:
    rows = []
    for run in data["runs"]:
        comparison = compare(data, run)
        model = comparison.request.model
        gpus = run["layout"]["gpus"]
        flops = counted_flops(run, model)
        flash = table_for(data, run).get("flash_attention", True)
        own = plan(replace(comparison.request, options=PlanOptions(flash_attention=flash)))
        same = plan(replace(comparison.request, options=run_features(data, run)))
        row = {
            "id": run["id"], "table": run["table"], "verified": run["verified"],
            "chip": hardware_for(data, run)["device"],
            "params_b": round(model.parameters() / 1e9, 1), "gpus": gpus,
            "published_layout": layout_text(run["layout"]),
            "resolved_unknowns": dict(comparison.resolved),
            "compared_layout": chosen_text(comparison.prediction.layout),
            "memory_model_fits": comparison.prediction.fits,
            "published_tflops": round(comparison.published_tflops, 1),
            "predicted_tflops": round(comparison.predicted_tflops, 1),
            "error_pct": round(100 * comparison.error, 1),
            "predicted_step_s": round(comparison.prediction.step_time_s, 3),
            "predicted_memory_gb": round(comparison.prediction.memory_gb, 1),
            "memory_limit_gb": round(comparison.prediction.memory_limit_gb, 1),
        }
        for key, result in (("chosen", own), ("chosen_run_features", same)):
            if result.best is None:
                row.update({f"{key}_layout": "infeasible", f"{key}_tflops": None, f"{key}_speedup": None})
                continue
            best = result.best
            row.update({
                f"{key}_layout": chosen_text(best.layout),
                f"{key}_tflops": round(flops / best.step_time_s / gpus / 1e12, 1),
                f"{key}_speedup": round(comparison.prediction.step_time_s / best.step_time_s, 3),
            })
        row["search_s"] = round(own.search_time_s, 3)
        rows.append(row)
    return rows


def calibration(data: dict) -> list[dict]:
    """Per calibrated chip: the fit on its table, the constant in use, leave-one-out, and (where a run's layout
    has unknown figures) the fit with each value of V fixed instead of chosen."""
    out = []
    for chip in calibrated_chips(data):
        runs = calibration_runs(data, chip)
        loo = {run_id: {"fraction": v["fraction"], "error_pct": round(100 * v["error"], 1)}
               for run_id, v in leave_one_out(data, runs).items()}
        fitted = calibrate(data, runs)
        at_fit = {run["id"]: round(100 * compare(data, run, run_device(data, run, fitted)).error, 1) for run in runs}
        entry = {"chip": chip, "tables": sorted({r["table"] for r in runs}), "runs": len(runs),
                 "fitted": fitted, "in_use": CALIBRATED_ACHIEVABLE_FRACTION.get(chip),
                 "error_pct_at_fit": at_fit, "leave_one_out": loo}
        choices = sorted({v for run in runs for v in run.get("unknowns", {}).get("virtual_stages", [])})
        if choices:
            entry["fitted_with_v_fixed"] = {
                v: calibrate(data, [{**run, "unknowns": {**run["unknowns"], "virtual_stages": [v]}} for run in runs])
                for v in choices}
        out.append(entry)
    return out


# -- 2. mixed chips ------------------------------------------------------------------------------------------

def mixed_rows() -> list[dict]:
    facts = facts_by_slug()
    h100 = device_type_from_facts(facts["nvidia-h100"])
    a100 = device_type_from_facts(facts["nvidia-a100"])
    rows = []
    for model, batch, h_nodes, a_nodes in MIXED_CASES:
        pools = (DevicePool(h100, h_nodes, **H100_LINKS), DevicePool(a100, a_nodes, **A100_LINKS))
        mixed = plan(PlanRequest(model, batch, pools))
        singles = {pool.name: plan(PlanRequest(model, batch, (pool,))) for pool in pools}
        best_single_name, best_single = max(
            ((name, r) for name, r in singles.items() if r.best is not None),
            key=lambda item: item[1].best.tokens_per_s, default=(None, None))
        row = {"model": model.name, "global_batch": batch,
               "pools": f"{h_nodes * 8} x H100 + {a_nodes * 8} x A100"}
        for name, result in singles.items():
            row[f"{name}_only_tokens_s"] = round(result.best.tokens_per_s) if result.best else None
            row[f"{name}_only_layout"] = result.best.layout.describe() if result.best else result.reason
        if mixed.best is not None:
            row["plan_tokens_s"] = round(mixed.best.tokens_per_s)
            row["plan_layout"] = mixed.best.layout.describe()
            row["plan_heterogeneous"] = mixed.best.layout.heterogeneous
            row["plan_devices"] = mixed.best.layout.devices
        if mixed.best and best_single:
            row["speedup_vs_best_single"] = round(mixed.best.tokens_per_s / best_single.best.tokens_per_s, 3)
            row["best_single"] = best_single_name
            total = sum(r.best.tokens_per_s for r in singles.values() if r.best)
            row["efficiency_vs_sum_of_singles"] = round(mixed.best.tokens_per_s / total, 3)
        rows.append(row)
    return rows


# -- 3. timing -----------------------------------------------------------------------------------------------

def timing_rows(repeat: int) -> list[dict]:
    facts = facts_by_slug()
    h100 = device_type_from_facts(facts["nvidia-h100"])
    a100 = device_type_from_facts(facts["nvidia-a100"])
    rows = []
    l40s = device_type_from_facts(facts["nvidia-l40s"])
    for label, model, batch, h_nodes, a_nodes, *rest in TIMING_CASES:
        pools = []
        if h_nodes:
            pools.append(DevicePool(h100, h_nodes, **H100_LINKS))
        if a_nodes:
            pools.append(DevicePool(a100, a_nodes, **A100_LINKS))
        if rest:
            pools.append(DevicePool(l40s, rest[0], **L40S_LINKS))
        request = PlanRequest(model, batch, tuple(pools))
        times, result = [], None
        for _ in range(repeat):
            started = time.perf_counter()
            result = plan(request)
            times.append(time.perf_counter() - started)
        rows.append({"case": label, "devices": sum(p.devices for p in pools),
                     "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                     "candidates": result.candidates_evaluated,
                     "best": result.best.layout.describe() if result.best else result.reason})
    return rows


# -- output --------------------------------------------------------------------------------------------------

def _fmt(value, width, digits=1):
    if value is None:
        return "-".rjust(width)
    if isinstance(value, float):
        return f"{value:{width}.{digits}f}"
    return str(value).rjust(width)


def format_report(rows, cal, mixed, timing) -> str:
    out = []
    out.append("1. Published runs (A100 80GB on DGX A100; H100 80GB on Meta's Grand Teton): TFLOPS per GPU as each "
               "paper counts them")
    header = (f"{'run':<44} {'chip':<5} {'params':>7} {'GPUs':>5}  {'published layout':<30} {'pub':>6} {'pred':>6} "
              f"{'err%':>6} "
              f"{'mem GB':>6}  {'planner choice (all features)':<38} {'TF/GPU':>6} {'x':>5}  "
              f"{'choice (run features)':<30} {'TF/GPU':>6} {'x':>5}")
    out.append(header)
    out.append("-" * len(header))
    for r in rows:
        flag = "" if r["verified"] else " *"
        out.append(
            f"{r['id'] + flag:<44} {r['chip'].removeprefix('nvidia-'):<5} {r['params_b']:>6.1f}B {r['gpus']:>5}  "
            f"{r['published_layout']:<30} "
            f"{r['published_tflops']:>6.1f} {r['predicted_tflops']:>6.1f} {r['error_pct']:>+6.1f} "
            f"{r['predicted_memory_gb']:>6.1f}  {r['chosen_layout']:<38} {_fmt(r['chosen_tflops'], 6)} "
            f"{_fmt(r['chosen_speedup'], 5, 3)}  {r['chosen_run_features_layout']:<30} "
            f"{_fmt(r['chosen_run_features_tflops'], 6)} {_fmt(r['chosen_run_features_speedup'], 5, 3)}")
    for r in rows:
        if r["resolved_unknowns"]:
            out.append(f"  {r['id']}: not published {', '.join(f'{k}={v}' for k, v in r['resolved_unknowns'].items())}"
                       f" (the cost model's fastest for the published TP/PP/DP) -> compared as {r['compared_layout']}, "
                       "stages of 7/8x14/7 layers")
        if not r["memory_model_fits"]:
            out.append(f"  {r['id']}: the memory model puts the fullest device at {r['predicted_memory_gb']:.1f} GB, "
                       f"over the {r['memory_limit_gb']:.1f} GB it allows; the run fitted on real GPUs "
                       "(published_runs.json memory_note says why)")
    verified = [r for r in rows if r["verified"]]
    errors = [abs(r["error_pct"]) for r in verified]
    within = sum(e <= 100 * TOLERANCE for e in errors)
    out.append(f"verified rows: {len(verified)}; within {100 * TOLERANCE:.0f}%: {within}; mean |error| "
               f"{statistics.mean(errors):.1f}%, max {max(errors):.1f}%   (* = not verified: shown, not counted)")
    for table in sorted({r["table"] for r in verified}):
        errs = [abs(r["error_pct"]) for r in verified if r["table"] == table]
        out.append(f"  {table}: mean |error| {statistics.mean(errs):.1f}%, max {max(errs):.1f}% over {len(errs)} rows")
    faster = [r for r in rows if r["chosen_speedup"] is not None and r["chosen_speedup"] >= 1 - 1e-9]
    out.append(f"planner's own choice at least as fast as the published layout (by its model): {len(faster)} of "
               f"{len(rows)}")
    for r in rows:
        if r not in faster:
            out.append(f"  not on {r['id']}: x{_fmt(r['chosen_speedup'], 0, 3).strip()} ({r['chosen_layout']})")
    out.append("")
    for c in cal:
        out.append(f"Calibration, {c['chip']}: one achievable_fraction, in use {c['in_use']}, least-squares fit on "
                   f"{', '.join(c['tables'])} ({c['runs']} rows) {c['fitted']}; error at the fit "
                   + ", ".join(f"{k.rsplit('-', 1)[-1]} {v:+.1f}%" for k, v in c["error_pct_at_fit"].items()))
        out.append("  leave-one-out (fraction fitted on the other rows -> error on this row): "
                   + ", ".join(f"{k.rsplit('-', 1)[-1]} {v['fraction']:.3f}->{v['error_pct']:+.1f}%"
                               for k, v in c["leave_one_out"].items()))
        if "fitted_with_v_fixed" in c:
            out.append("  fit if the interleaving depth V were fixed instead of chosen (1.0 = the model cannot "
                       "reach the published throughput even at the full peak): "
                       + ", ".join(f"V={v} {f:.3f}" for v, f in c["fitted_with_v_fixed"].items()))
    out.append("  Table 5 rows are out of sample for nvidia-a100: its constant was fitted on Table 1 only.")
    out.append("")
    out.append("2. Mixed chips: the planner's plan on both pools vs the best plan on one chip type "
               f"(achievable_fraction H100 {CALIBRATED_ACHIEVABLE_FRACTION['nvidia-h100']} from Llama 3 Table 4, "
               f"A100 {CALIBRATED_ACHIEVABLE_FRACTION['nvidia-a100']} from SC'21 Table 1)")
    for m in mixed:
        out.append(f"  {m['model']}, batch {m['global_batch']}, {m['pools']}:")
        out.append(f"    plan:        {m.get('plan_tokens_s', 0):>10,} tokens/s  {m.get('plan_layout', '-')}")
        for chip, label in (("nvidia-h100", "H100 only:  "), ("nvidia-a100", "A100 only:  ")):
            out.append(f"    {label} {m[f'{chip}_only_tokens_s'] or 0:>10,} tokens/s  {m[f'{chip}_only_layout']}")
        if "speedup_vs_best_single" in m:
            out.append(f"    plan / best single type ({m['best_single']}): x{m['speedup_vs_best_single']:.3f}; "
                       "plan / (H100-only + A100-only run side by side): "
                       f"{100 * m['efficiency_vs_sum_of_singles']:.1f}%")
    out.append("")
    out.append(f"3. Search time on this machine ({os.cpu_count()} CPU cores, one process)")
    for t in timing:
        out.append(f"  {t['case']:<44} median {t['median_s']:.3f} s, max {t['max_s']:.3f} s, "
                   f"{t['candidates']} layouts tried -> {t['best']}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/planner.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "planner.json")
    parser.add_argument("--csv", type=Path, default=RESULTS_DIR / "planner.csv")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--repeat", type=COUNT, default=5, help="timing repetitions (median reported)")
    args = parser.parse_args(argv)

    data = load_published_runs()
    rows = published_rows(data)
    cal = calibration(data)
    mixed = mixed_rows()
    timing = timing_rows(max(1, args.repeat))
    report = format_report(rows, cal, mixed, timing)
    print(report)
    if args.no_write:
        return 0
    payload = {
        "benchmark": "parallel-strategy planner vs published runs (issue 9)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "tolerance": TOLERANCE,
        "sources": data["sources"],
        "hardware": data["hardware"],
        "tables": data["tables"],
        "published_runs": rows,
        "calibration": cal,
        "mixed_chips": mixed,
        "timing": timing,
        "cpu_count": os.cpu_count(),
        "report": report,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["date", *rows[0].keys()])
        writer.writeheader()
        for row in rows:
            writer.writerow({"date": payload["date"], **row})
    print(f"\nwrote {args.json} and {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
