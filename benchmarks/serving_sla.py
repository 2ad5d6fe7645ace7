"""Serving benchmark, SLA sweep: each router's goodput (output tok/s while its latency SLA holds) over a rate grid.

    .venv/bin/python -m benchmarks.serving_sla [--requests 1000] [--replicas 4] [--rates 6,8,...,40,48]
                                               [--routers pow2,prefix] [--slas 1000:150,2000:150,4000:150]
                                               [--trace PATH] [--start N] [--json PATH] [--csv PATH] [--no-write]

Issue 5 compares routers "at equal SLA", not at equal offered load: at a rate one router keeps up with, the
faster router cannot show more throughput than the arrivals give it. So this sweeps the offered rate:

1. builds the requests exactly as benchmarks/serving.py does (same trace slice, same scaling; only the arrival
   compression changes with the rate) and starts ONE local Ray cluster for the whole sweep (accelerators
   SIMULATED, replicas compute on this host's CPU);
2. for each rate of `--rates` (ascending) runs every router of `--routers` back to back at that rate, with
   serving.py's `run_one` (same replicas and engine as serving.py's router runs), so drift in the host's load
   touches every router alike; the routers' order alternates from one rate to the next (first rate: as given,
   next: reversed, ...), so no router always runs right after the other. Each run records serving.py's summary
   and the host's 1-minute load average (os.getloadavg) just before and just after it;
3. for each SLA of `--slas` (TTFT p95 and TPOT p95 bounds, in ms, fixed before the sweep) and each router:
   goodput = the highest output tok/s among the rates whose run met the SLA with zero errors (`sla_goodput`),
   and prefix-aware's goodput over each baseline's, against issue 5's 1.4x.

Tables go to stdout; JSON and CSV to benchmarks/results/serving_sla.{json,csv} (the JSON is rewritten after
every run, marked "complete": false until the sweep ends). Exit status 1 when a run lost requests.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.mooncake import build_requests, describe_scaling, reusable_block_fraction
from benchmarks.serving import (
    MODEL_SHAPE,
    RESULTS_DIR,
    ROUTER_LABELS,
    ROUTERS,
    TARGET_THROUGHPUT_RATIO,
    RunResult,
    _fmt,
    add_workload_args,
    bench_cluster,
    load_slice,
    print_table,
    router_engine,
    run_one,
    scale_for_rate,
    trace_span_s,
)

DEFAULT_RATES = "6,8,10,12,14,16,20,24,28,32,36,40,48"  # up to past saturation (about 600 tok/s, 2026-11-25)
DEFAULT_ROUTERS = "pow2,prefix"
DEFAULT_SLAS = "1000:150,2000:150,4000:150"
CANDIDATE = "prefix"


@dataclass(frozen=True)
class SLA:
    ttft_p95_ms: float
    tpot_p95_ms: float

    @property
    def label(self) -> str:
        return f"TTFT p95 <= {self.ttft_p95_ms:g} ms, TPOT p95 <= {self.tpot_p95_ms:g} ms"

    def met_by(self, run: dict) -> bool:
        """Zero errors, and both p95s measured and within bounds (a run without a measured p95 cannot show it met)."""
        ttft, tpot = run.get("ttft_p95_ms"), run.get("tpot_p95_ms")
        return (run.get("errors", 0) == 0 and ttft is not None and tpot is not None
                and ttft <= self.ttft_p95_ms and tpot <= self.tpot_p95_ms)


# ---------------------------------------------------------------------------------------------------- the pure part


def sla_goodput(runs: list[dict], slas: list[SLA], routers: list[str], candidate: str = CANDIDATE) -> list[dict]:
    """One row per SLA: each router's goodput and the rate it came from, and the candidate's ratio to each other router.

    `runs` are run summaries with at least "router", "rate_rps", "errors", "ttft_p95_ms", "tpot_p95_ms" and
    "output_tokens_per_s". A router's goodput under an SLA is the highest output tok/s among its runs that met
    the SLA (`SLA.met_by`: zero errors, both p95s within bounds), None when none did. The ratio is
    candidate / baseline goodput, None unless both met the SLA at some rate. `<router>_at_top_rate` says the
    goodput came from the grid's highest rate that router ran: it might sustain more, so a ratio involving it
    is a bound, not a measurement (a lower bound when it is the candidate's, an upper bound when the baseline's).
    """
    rows = []
    for sla in slas:
        row: dict[str, Any] = {"sla": sla.label, "sla_ttft_p95_ms": sla.ttft_p95_ms, "sla_tpot_p95_ms": sla.tpot_p95_ms}
        for router in routers:
            mine = [run for run in runs if run["router"] == router]
            met = [run for run in mine if sla.met_by(run)]
            best = max(met, key=lambda run: run["output_tokens_per_s"], default=None)
            row[f"{router}_goodput"] = best["output_tokens_per_s"] if best else None
            row[f"{router}_rate"] = best["rate_rps"] if best else None
            row[f"{router}_rates_met"] = sorted(run["rate_rps"] for run in met)
            row[f"{router}_at_top_rate"] = bool(best) and best["rate_rps"] == max(run["rate_rps"] for run in mine)
        if candidate in routers:
            for baseline in routers:
                if baseline == candidate:
                    continue
                cand, base = row[f"{candidate}_goodput"], row[f"{baseline}_goodput"]
                ratio = cand / base if cand is not None and base else None
                row[f"ratio_vs_{baseline}"] = ratio
                row[f"target_vs_{baseline}"] = _verdict(ratio, cand, base, row[f"{candidate}_at_top_rate"],
                                                        row[f"{baseline}_at_top_rate"])
        rows.append(row)
    return rows


def unbounded_hit_rate(requests, block_tokens: int) -> float:
    """The token hit rate of an unbounded prefix cache shared by all replicas, over these prompts in arrival order:
    the share of prompt tokens in full blocks whose whole prefix (this block and every one before it) was in an
    earlier prompt. No router and no cache size can reuse more. 0.0 when there are no prompt tokens."""
    chain: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent node, block) -> node: prefixes seen so far
    total = hits = 0
    for request in sorted(requests, key=lambda r: r.arrival_s):
        tokens = request.prompt_tokens
        total += len(tokens)
        parent = -1
        for end in range(block_tokens, len(tokens) + 1, block_tokens):
            key = (parent, tuple(tokens[end - block_tokens:end]))
            node = chain.get(key)
            if node is None:
                node = chain[key] = len(chain)
            else:
                hits += block_tokens
            parent = node
    return hits / total if total else 0.0


def caching_gain_ceiling(baseline_hit_rate: float | None, best_hit_rate: float) -> float | None:
    """The most a router can raise throughput over a baseline by caching alone: as if prefill were all the work and
    the candidate reused every reusable token (`best_hit_rate`, from `unbounded_hit_rate`), work falls from
    (1 - baseline hit rate) to (1 - best) of the prompt tokens. Decode work, the same under both, only lowers it."""
    if baseline_hit_rate is None or best_hit_rate >= 1.0:
        return None
    return (1.0 - baseline_hit_rate) / (1.0 - best_hit_rate)


def add_ceilings(rows: list[dict], runs: list[dict], routers: list[str], best_hit_rate: float,
                 candidate: str = CANDIDATE) -> None:
    """Per SLA row and baseline, `ceiling_vs_<baseline>`: `caching_gain_ceiling` from the baseline's measured hit
    rate in the run its goodput came from (None when it met the SLA at no rate)."""
    for row in rows:
        for baseline in routers:
            if baseline == candidate:
                continue
            run = next((r for r in runs if r["router"] == baseline and r["rate_rps"] == row[f"{baseline}_rate"]
                        and r["output_tokens_per_s"] == row[f"{baseline}_goodput"]), None)
            row[f"ceiling_vs_{baseline}"] = (caching_gain_ceiling(run.get("cache_hit_rate"), best_hit_rate)
                                             if run else None)


def _verdict(ratio: float | None, cand: float | None, base: float | None, cand_top: bool, base_top: bool) -> str:
    target = f">= {TARGET_THROUGHPUT_RATIO}x: "
    if cand is None and base is None:
        return target + "undetermined (neither router met the SLA at any rate)"
    if cand is None:
        return target + "MISSED (prefix-aware met the SLA at no rate)"
    if base is None:
        return target + "undetermined (baseline met the SLA at no rate: no finite ratio)"
    met = ratio is not None and ratio >= TARGET_THROUGHPUT_RATIO
    verdict = "met" if met else "MISSED"
    if cand_top and not met:
        verdict += " (prefix-aware's best is the grid's top rate: it may sustain more)"
    elif base_top and met:
        verdict += " (baseline's best is the grid's top rate: it may sustain more)"
    return target + verdict


# ---------------------------------------------------------------------------------------------------- arguments


def _parse_rates(text: str) -> list[float]:
    rates = []
    for part in text.split(","):
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"{part.strip()!r} is not a number") from None
        if not rate > 0 or rate == float("inf"):
            raise ValueError(f"{part.strip()!r} is not a positive finite rate")
        rates.append(rate)
    if len(set(rates)) != len(rates):
        raise ValueError("a rate is listed twice")
    return sorted(rates)


def _parse_slas(text: str) -> list[SLA]:
    slas = []
    for part in text.split(","):
        bounds = part.split(":")
        if len(bounds) != 2:
            raise ValueError(f"{part.strip()!r} is not TTFT_MS:TPOT_MS")
        try:
            ttft, tpot = float(bounds[0]), float(bounds[1])
        except ValueError:
            raise ValueError(f"{part.strip()!r}: the bounds must be numbers (ms)") from None
        if not (0 < ttft < float("inf") and 0 < tpot < float("inf")):
            raise ValueError(f"{part.strip()!r}: the bounds must be positive and finite")
        slas.append(SLA(ttft, tpot))
    if len(set(slas)) != len(slas):
        raise ValueError("an SLA is listed twice")
    return slas


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(parser, rate=False)
    parser.set_defaults(replicas=4)
    parser.add_argument("--rates", default=DEFAULT_RATES, help="offered requests/s, comma-separated")
    parser.add_argument("--routers", default=DEFAULT_ROUTERS, help=f"comma-separated, of {', '.join(ROUTERS)}")
    parser.add_argument("--slas", default=DEFAULT_SLAS,
                        help="comma-separated TTFT_P95_MS:TPOT_P95_MS bounds, fixed before the sweep")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    try:
        args.rate_grid = _parse_rates(args.rates)
    except ValueError as exc:
        parser.error(f"--rates: {exc} (expected positive numbers, e.g. {DEFAULT_RATES})")
    try:
        args.sla_list = _parse_slas(args.slas)
    except ValueError as exc:
        parser.error(f"--slas: {exc} (expected e.g. {DEFAULT_SLAS})")
    args.router_list = args.routers.split(",")
    for router in args.router_list:
        if router not in ROUTERS:
            parser.error(f"--routers: unknown router {router!r} (choose from {', '.join(ROUTERS)})")
    if len(set(args.router_list)) != len(args.router_list):
        parser.error("--routers: a router is listed twice")
    return args


# ---------------------------------------------------------------------------------------------------- main


RUN_COLUMNS = [("router", "router"), ("rate_rps", "rate"), ("requests", "requests"), ("errors", "errors"),
               ("cache_hit_rate", "hit rate"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "p90"),
               ("ttft_p95_ms", "p95"), ("ttft_p99_ms", "p99"), ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p95_ms", "p95"),
               ("output_tokens_per_s", "out tok/s"), ("makespan_s", "makespan s"), ("load1_before", "load1 before"),
               ("load1_after", "load1 after")]


def sla_columns(routers: list[str]) -> list[tuple[str, str]]:
    columns = [("sla", "SLA")]
    for router in routers:
        columns += [(f"{router}_goodput", f"{router} goodput tok/s"), (f"{router}_rate", "at rate")]
    for router in routers:
        if router != CANDIDATE and CANDIDATE in routers:
            columns += [(f"ratio_vs_{router}", f"prefix/{router}"), (f"target_vs_{router}", "target"),
                        (f"ceiling_vs_{router}", "caching ceiling")]
    return columns


def _sweep_order(routers: list[str], index: int) -> list[str]:
    return list(routers) if index % 2 == 0 else list(reversed(routers))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trace = load_slice(args.trace, start=args.start, limit=args.requests, tag="serving-sla")
    if trace is None:
        return 2
    span_s = trace_span_s(trace)
    scales = {rate: scale_for_rate(trace, rate, args) for rate in args.rate_grid}
    requests_by_rate = {rate: build_requests(trace, scale) for rate, scale in scales.items()}
    reusable = reusable_block_fraction(trace)
    first = requests_by_rate[args.rate_grid[0]]
    best_hit = unbounded_hit_rate(first, args.block_tokens)
    print(f"[serving-sla] {len(first)} requests from {args.trace} (lines {args.start}..{args.start + len(trace) - 1}, "
          f"{span_s:.0f} s of trace); unbounded-cache reusable blocks in this slice: {reusable:.1%}")
    print(f"[serving-sla] prompts: mean {statistics.mean(len(r.prompt_tokens) for r in first):.0f} tokens; "
          f"outputs: mean {statistics.mean(r.max_tokens for r in first):.1f} tokens")
    print(f"[serving-sla] an unbounded shared prefix cache would reuse {best_hit:.1%} of the prompt tokens: no router "
          f"can beat that hit rate", flush=True)
    print(f"[serving-sla] rates {args.rate_grid} req/s x routers {args.router_list}; SLAs: "
          + "; ".join(sla.label for sla in args.sla_list), flush=True)

    engine = router_engine(args)
    started_at = dt.datetime.now(dt.UTC)
    runs: list[dict] = []
    report: dict[str, Any] = {
        "benchmark": "serving_sla", "date": started_at.date().isoformat(),
        "started_utc": started_at.isoformat(timespec="seconds"), "finished_utc": None, "complete": False,
        "command": " ".join([Path(sys.executable).name, "-m", "benchmarks.serving_sla", *(sys.argv[1:] if argv is None
                                                                                           else argv)]),
        "host": f"{platform.node()}: {os.cpu_count()} CPU cores; accelerators SIMULATED (replicas compute on CPU)",
        "trace": str(args.trace), "trace_lines": [args.start, args.start + len(trace) - 1],
        "reusable_block_fraction_unbounded": round(reusable, 4),
        "prompt_token_hit_rate_unbounded": round(best_hit, 4),
        "scaling": describe_scaling(scales[args.rate_grid[0]]).split(" Rate:")[0]
        + " Rate: arrival times were compressed so that the slice arrives at each grid rate on average"
        " (scaling_by_rate gives the factor for each).",
        "scaling_by_rate": {f"{rate:g}": describe_scaling(scale) for rate, scale in scales.items()},
        "model": {**MODEL_SHAPE, "weights": "random (seed 0)"}, "replicas": args.replicas, "engine": engine,
        "grid": {"rates_rps": args.rate_grid, "routers": args.router_list,
                 "order": "per rate, ascending; routers back to back, order alternating from rate to rate"},
        "slas": [{"ttft_p95_ms": s.ttft_p95_ms, "tpot_p95_ms": s.tpot_p95_ms} for s in args.sla_list],
        "runs": runs, "sla_table": [],
    }
    json_path = args.json or RESULTS_DIR / "serving_sla.json"
    csv_path = args.csv or RESULTS_DIR / "serving_sla.csv"

    with bench_cluster(tag="serving-sla") as (backend, model_dir):
        for index, rate in enumerate(args.rate_grid):
            for router in _sweep_order(args.router_list, index):
                name = f"{router}-{rate:g}rps".replace(".", "p").replace("_", "-")
                load_before = os.getloadavg()[0]
                began = dt.datetime.now(dt.UTC)
                try:
                    result = run_one(backend, name=name, router=router, engine=engine, replicas=args.replicas,
                                     model_dir=model_dir, requests=requests_by_rate[rate])
                except Exception as exc:  # a failed deploy loses the run, not the sweep
                    result = RunResult(name=name, router=router, engine=engine,
                                       requests=len(requests_by_rate[rate]), errors=len(requests_by_rate[rate]),
                                       error_samples=[f"run failed: {type(exc).__name__}: {exc}"[:300]])
                summary = {**result.summary(), "rate_rps": rate, "started_utc": began.isoformat(timespec="seconds"),
                           "load1_before": round(load_before, 2), "load1_after": round(os.getloadavg()[0], 2)}
                runs.append(summary)
                print("[serving-sla] " + ", ".join(f"{label}={_fmt(summary.get(key))}" for key, label in RUN_COLUMNS),
                      flush=True)
                if not args.no_write:
                    _write_json(json_path, report)

    report["sla_table"] = sla_goodput(runs, args.sla_list, args.router_list)
    add_ceilings(report["sla_table"], runs, args.router_list, best_hit)
    report["finished_utc"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    report["complete"] = True
    print_table(f"Runs ({args.replicas} replicas, {args.slots} slots each, cache 4096 device blocks; "
                f"load1 = host 1-minute load average, {os.cpu_count()} CPU cores)", runs, RUN_COLUMNS)
    print_table(f"Goodput under each SLA (highest out tok/s among the rates whose run met it with zero errors; "
                f"target prefix-aware >= {TARGET_THROUGHPUT_RATIO}x {ROUTER_LABELS.get('pow2')}; caching ceiling = "
                f"the most any router could gain over the baseline by caching, from the baseline's hit rate and the "
                f"{best_hit:.1%} an unbounded cache reuses)",
                report["sla_table"], sla_columns(args.router_list))
    if not args.no_write:
        _write_json(json_path, report)
        _write_csv(csv_path, runs, report["sla_table"], args.router_list)
        print(f"\n[serving-sla] wrote {json_path} and {csv_path}")
    return 1 if any(run["errors"] for run in runs) else 0


def _write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str))


def _write_csv(path: Path, runs: list[dict], sla_table: list[dict], routers: list[str]) -> None:
    """Runs, then the SLA table, in one file; "group" says which (each group fills its own columns)."""
    run_keys = [key for key, _ in RUN_COLUMNS] + ["replicas_used", "started_utc"]
    sla_keys = [key for key, _ in sla_columns(routers)]
    sla_keys += [k for row in sla_table for k in row if k not in sla_keys and k not in run_keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["group", *run_keys, *dict.fromkeys(sla_keys)],
                                extrasaction="ignore")
        writer.writeheader()
        for group, rows in (("run", runs), ("sla", sla_table)):
            for row in rows:
                writer.writerow({"group": group, **{k: _fmt(v) if isinstance(v, dict | list) else v
                                                    for k, v in row.items()}})


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"[serving-sla] done in {time.monotonic() - start:.0f} s, exit {code}")
    raise SystemExit(code)


__all__ = ["SLA", "main", "parse_args", "sla_goodput"]
