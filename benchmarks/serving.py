"""Serving benchmark: Mooncake's conversation trace against LLM replicas on Ray Serve, three routers, one run.

    .venv/bin/python -m benchmarks.serving [--requests 1000] [--replicas 2] [--rate 6] [--skip-tiers]
                                           [--trace PATH] [--json PATH] [--csv PATH] [--no-write]

What it does (everything measured in this run, on this host):
1. reads a slice of ../shared/benchmarks/mooncake-2025/conversation_trace.jsonl (any file of that format) and
   scales it down (benchmarks/mooncake.py: every 512-token block id becomes a fixed 16-token block, outputs
   1/16, arrivals compressed to `--rate` requests/s on average, prompts capped at `--max-prompt-blocks`);
2. writes a model checkpoint of the built-in transformer with random weights (seeded: this measures serving,
   not text quality) and starts a local multi-node Ray cluster (node_pools.yaml; the accelerators are
   SIMULATED: replicas take one `accel:nvidia-a100` each on the simulated a100 pool and compute on this
   host's CPU);
3. for each router (round robin, Ray Serve's default power-of-two-choices, Fleetyard's prefix-aware) deploys
   the same service through the compute backend (same replicas, engine and cache), replays the same requests
   at the same arrival times, measures client-side TTFT and engine TPOT, then deletes the service;
4. repeats the prefix-aware run with a small per-replica device cache, once with the host-DRAM and disk tiers
   and once without, to show what the lower tiers add.

Tables go to stdout; JSON and CSV to benchmarks/results/serving.{json,csv}. Exit status 1 when a run
lost requests (errors are counted in the tables).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET, positive_float  # noqa: E402
from benchmarks.mooncake import (  # noqa: E402
    TRACE_PATH,
    BenchRequest,
    ScaleSpec,
    TraceRequest,
    build_requests,
    describe_scaling,
    read_trace,
    reusable_block_fraction,
)

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
ROUTERS = ("round_robin", "pow2", "prefix")
ROUTER_LABELS = {"round_robin": "round robin", "pow2": "Ray Serve default (pow-2)", "prefix": "prefix-aware"}
TARGET_HIT_RATIO = 1.9  # SGLang: 3.8x hit rate / 1.9x throughput over round robin; issue 5 asks 1.9x hit rate
TARGET_THROUGHPUT_RATIO = 1.4
MODEL_SHAPE = {"context": 1024, "d_model": 192, "n_heads": 4, "n_layers": 4, "d_ff": 768}


@dataclass
class RunResult:
    name: str
    router: str
    engine: dict
    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    hit_blocks_by_tier: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)
    replicas_used: dict[str, int] = field(default_factory=dict)
    makespan_s: float = 0.0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name, "router": self.router, "engine": self.engine, "requests": self.requests,
            "errors": self.errors, "error_samples": self.error_samples[:5], "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "cache_hit_rate": round(self.hit_rate, 4),
            "hit_blocks_by_tier": self.hit_blocks_by_tier, "output_tokens": self.output_tokens,
            "makespan_s": round(self.makespan_s, 3), "output_tokens_per_s": round(self.output_tps, 2),
            "ttft_p50_ms": _ms(_pct(self.ttft_s, 50)), "ttft_p90_ms": _ms(_pct(self.ttft_s, 90)),
            "ttft_p95_ms": _ms(_pct(self.ttft_s, 95)), "ttft_p99_ms": _ms(_pct(self.ttft_s, 99)),
            "tpot_p50_ms": _ms(_pct(self.tpot_s, 50)), "tpot_p90_ms": _ms(_pct(self.tpot_s, 90)),
            "tpot_p95_ms": _ms(_pct(self.tpot_s, 95)), "queue_p90_ms": _ms(_pct(self.queue_s, 90)),
            "replicas_used": self.replicas_used,
        }


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


# ---------------------------------------------------------------------------------------------------- setup


def write_model(directory: Path, seed: int = 0) -> Path:
    """A checkpoint directory (model.pt + config.json) of the built-in LM with random weights."""
    from jobs.runtime.lm import write_random_model_dir

    return write_random_model_dir(directory, MODEL_SHAPE, seed=seed, note="random weights for the serving benchmark")


def load_slice(path: Path, *, start: int, limit: int, tag: str = "serving") -> list[TraceRequest] | None:
    """The trace lines the benchmark replays, or None after saying on stderr why there are none."""
    if not path.exists():
        print(f"[{tag}] trace not found: {path}", file=sys.stderr)
        return None
    try:
        trace = read_trace(path, limit=limit, start=start)
    except ValueError as exc:
        print(f"[{tag}] {exc}", file=sys.stderr)
        return None
    if not trace:
        print(f"[{tag}] no requests in {path} from line {start}", file=sys.stderr)
        return None
    return trace


def trace_span_s(trace: list[TraceRequest]) -> float:
    return max(1e-3, (trace[-1].timestamp_ms - trace[0].timestamp_ms) / 1000)


def scale_for_rate(trace: list[TraceRequest], rate: float, args: argparse.Namespace) -> ScaleSpec:
    """The scaling of `add_workload_args`'s options, arrivals compressed to `rate` requests/s on average."""
    time_scale = (len(trace) / rate) / trace_span_s(trace)
    return ScaleSpec(block_tokens=args.block_tokens, output_scale=1 / 16, max_output_tokens=args.max_output_tokens,
                     time_scale=time_scale, max_prompt_blocks=args.max_prompt_blocks)


def router_engine(args: argparse.Namespace) -> dict:
    """The engine of the router runs: `--slots` slots, a device cache big enough to never evict, no lower tiers."""
    return {"slots": args.slots, "block_size": args.block_tokens, "device_cache_blocks": 4096,
            "host_cache_blocks": 0, "disk_cache_blocks": 0, "max_waiting": 64, "torch_threads": 1}


@contextlib.contextmanager
def bench_cluster(tag: str = "serving") -> Iterator[tuple[Any, Path]]:
    """A random-weights checkpoint and a local Ray cluster (simulated accelerators); yields (backend, model dir)
    and stops the cluster on the way out, whatever happened."""
    from controlplane.compute.local_cluster import start_local_cluster, stop_local_cluster
    from controlplane.compute.ray_backend import RayComputeBackend
    from controlplane.compute.topology import load_topology

    with tempfile.TemporaryDirectory(prefix="fy-serving-bench-") as tmp:
        model_dir = write_model(Path(tmp) / "model")
        state_dir = Path(tmp) / "ray"
        started = time.monotonic()
        cluster = start_local_cluster(topology=load_topology(), state_dir=state_dir, fate_share=True)
        print(f"[{tag}] local Ray cluster up in {time.monotonic() - started:.0f} s (accelerators SIMULATED)")
        try:
            yield RayComputeBackend(address=cluster.address, env=cluster.client_env()), model_dir
        finally:
            import ray

            ray.shutdown()
            stop_local_cluster(state_dir=state_dir)


def service_spec(*, handle: str, model_dir: Path, replicas: int, engine: dict, router: str):
    from controlplane.compute.base import ServiceSpec

    slots = engine["slots"]
    return ServiceSpec(handle=handle, deployment_id=0, revision=1, model_dir=str(model_dir),
                       accelerator_type="nvidia-a100", pool="a100-pool", devices_per_replica=1.0,
                       replicas_min=replicas, replicas_max=replicas, target_ongoing_requests=float(slots),
                       max_ongoing_requests=slots + engine["max_waiting"], max_queued_requests=-1,
                       cpus_per_replica=0.1, engine=engine, router=router)


def wait_for(backend, handle: str, state: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = backend.observe_service(handle)
        if status.state == state:
            return
        if status.state == "unhealthy":
            raise RuntimeError(f"{handle}: {status.message}")
        time.sleep(0.5)
    raise TimeoutError(f"{handle} did not reach {state} within {timeout_s:.0f} s")


# ---------------------------------------------------------------------------------------------------- replay


def replay(backend, handle: str, requests: list[BenchRequest], result: RunResult) -> RunResult:
    """Sends every request at its arrival time (open loop) and records what comes back."""
    lock = threading.Lock()

    def one(request: BenchRequest, sent_at: float) -> None:
        body = {"prompt_tokens": request.prompt_tokens, "max_tokens": request.max_tokens, "ignore_eos": True}
        try:
            first_at = None
            done = None
            for event in backend.stream_completion(handle, body, timeout_s=300.0):
                if event["type"] == "token" and first_at is None:
                    first_at = time.monotonic()
                elif event["type"] == "done":
                    done = event
            if done is None:
                raise RuntimeError("stream ended without a done event")
        except Exception as exc:
            with lock:
                result.errors += 1
                result.error_samples.append(f"{type(exc).__name__}: {exc}"[:300])
            return
        metrics = done["metrics"]
        with lock:
            result.prompt_tokens += metrics["prompt_tokens"]
            result.cached_tokens += metrics["cached_tokens"]
            result.output_tokens += metrics["output_tokens"]
            for tier, n in (metrics.get("cached_blocks_by_tier") or {}).items():
                result.hit_blocks_by_tier[tier] = result.hit_blocks_by_tier.get(tier, 0) + n
            result.ttft_s.append((first_at or time.monotonic()) - sent_at)
            if metrics.get("tpot_s") is not None:
                result.tpot_s.append(metrics["tpot_s"])
            result.queue_s.append(metrics["queue_s"])
            result.replicas_used[metrics["replica"]] = result.replicas_used.get(metrics["replica"], 0) + 1

    result.requests = len(requests)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=256) as pool:
        futures = []
        for request in requests:
            delay = started + request.arrival_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, request, time.monotonic()))
        concurrent.futures.wait(futures)
    result.makespan_s = time.monotonic() - started
    return result


def run_one(backend, *, name: str, router: str, engine: dict, replicas: int, model_dir: Path,
            requests: list[BenchRequest]) -> RunResult:
    handle = f"fy-bench-{name}"
    backend.deploy_service(service_spec(handle=handle, model_dir=model_dir, replicas=replicas, engine=engine,
                                        router=router))
    try:
        wait_for(backend, handle, "running")
        status = backend.observe_service(handle)
        if status.replicas_running != replicas:
            raise RuntimeError(f"{handle}: {status.replicas_running} of {replicas} replicas running")
        result = RunResult(name=name, router=router, engine=engine)
        print(f"[serving] {name}: {replicas} replicas running; replaying {len(requests)} requests", flush=True)
        return replay(backend, handle, requests, result)
    finally:
        backend.delete_service(handle)
        wait_for(backend, handle, "not_found", timeout_s=60)


# ---------------------------------------------------------------------------------------------------- report


def print_table(title: str, rows: list[dict], columns: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    if not rows:  # e.g. --skip-routers: the routers' table has no run (a crash here lost a whole run's results)
        print("  (no runs)")
        return
    widths = [max(len(label), *(len(_fmt(row.get(key))) for row in rows)) for key, label in columns]
    print("  ".join(label.ljust(w) for (_, label), w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(_fmt(row.get(key)).ljust(w) for (key, _), w in zip(columns, widths, strict=True)))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


ROUTER_COLUMNS = [("name", "run"), ("requests", "requests"), ("errors", "errors"),
                  ("cache_hit_rate", "hit rate"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "p90"),
                  ("ttft_p99_ms", "p99"), ("tpot_p50_ms", "TPOT p50 ms"), ("tpot_p90_ms", "p90"),
                  ("output_tokens_per_s", "out tok/s"), ("makespan_s", "makespan s"), ("replicas_used", "per replica")]
TIER_COLUMNS = [("name", "run"), ("errors", "errors"), ("cache_hit_rate", "hit rate"),
                ("hit_blocks_by_tier", "hit blocks by tier"), ("ttft_p50_ms", "TTFT p50 ms"), ("ttft_p90_ms", "p90"),
                ("output_tokens_per_s", "out tok/s")]


def compare(runs: dict[str, dict]) -> list[dict]:
    """Prefix-aware against each baseline: hit-rate and throughput ratios, against the issue's targets."""
    rows = []
    prefix = runs.get("prefix")
    for baseline in ("pow2", "round_robin"):
        base = runs.get(baseline)
        if not prefix or not base:
            continue
        hit = prefix["cache_hit_rate"] / base["cache_hit_rate"] if base["cache_hit_rate"] else None
        tps = prefix["output_tokens_per_s"] / base["output_tokens_per_s"] if base["output_tokens_per_s"] else None
        rows.append({"baseline": ROUTER_LABELS[baseline], "hit_rate_ratio": hit, "throughput_ratio": tps,
                     "ttft_p90_ratio": (prefix["ttft_p90_ms"] / base["ttft_p90_ms"]) if base["ttft_p90_ms"] else None,
                     "hit_target": f">= {TARGET_HIT_RATIO}x: " + ("met" if hit and hit >= TARGET_HIT_RATIO
                                                                  else "MISSED"),
                     "throughput_target": f">= {TARGET_THROUGHPUT_RATIO}x: " + (
                         "met" if tps and tps >= TARGET_THROUGHPUT_RATIO else "MISSED")})
    return rows


# ---------------------------------------------------------------------------------------------------- main


def add_workload_args(parser: argparse.ArgumentParser, *, rate: bool = True) -> None:
    """The options that choose the trace slice, its scaling, the replicas and their engine (shared with
    benchmarks/serving_sla.py, which sweeps the rate instead of taking `--rate`)."""
    parser.add_argument("--trace", type=Path, default=TRACE_PATH)
    parser.add_argument("--start", type=OFFSET, default=0, help="first trace line (0-based)")
    parser.add_argument("--requests", type=COUNT, default=1000)
    parser.add_argument("--replicas", type=int, default=2, choices=(2, 3, 4))
    if rate:
        parser.add_argument("--rate", type=positive_float, default=6.0,
                            help="mean requests/s after compressing the trace")
    parser.add_argument("--block-tokens", type=COUNT, default=16)
    parser.add_argument("--max-prompt-blocks", type=COUNT, default=40)
    parser.add_argument("--max-output-tokens", type=COUNT, default=32)
    parser.add_argument("--slots", type=COUNT, default=4)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_args(parser)
    parser.add_argument("--small-cache-blocks", type=COUNT, default=48)
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--skip-tiers", action="store_true")
    parser.add_argument("--skip-routers", action="store_true", help="only the cache-tier runs")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--csv", type=Path)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    for router in args.routers.split(","):
        if router not in ROUTERS:
            parser.error(f"--routers: unknown router {router!r} (choose from {', '.join(ROUTERS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trace = load_slice(args.trace, start=args.start, limit=args.requests)
    if trace is None:
        return 2
    span_s = trace_span_s(trace)
    scale = scale_for_rate(trace, args.rate, args)
    requests = build_requests(trace, scale)
    reusable = reusable_block_fraction(trace)
    print(f"[serving] {len(requests)} requests from {args.trace} (lines {args.start}..{args.start + len(trace) - 1}, "
          f"{span_s:.0f} s of trace); unbounded-cache reusable blocks in this slice: {reusable:.1%}")
    print(f"[serving] scaling: {describe_scaling(scale)}")
    print(f"[serving] prompts: mean {statistics.mean(len(r.prompt_tokens) for r in requests):.0f} tokens; "
          f"outputs: mean {statistics.mean(r.max_tokens for r in requests):.1f} tokens")

    big = router_engine(args)
    small_tiered = {**big, "device_cache_blocks": args.small_cache_blocks, "host_cache_blocks": 1024,
                    "disk_cache_blocks": 8192}
    small_device_only = {**big, "device_cache_blocks": args.small_cache_blocks}
    runs: dict[str, dict] = {}
    tier_runs: dict[str, dict] = {}
    with bench_cluster() as (backend, model_dir):
        for router in [] if args.skip_routers else args.routers.split(","):
            result = run_one(backend, name=router, router=router, engine=big, replicas=args.replicas,
                             model_dir=model_dir, requests=requests)
            runs[router] = result.summary()
        if not args.skip_tiers:
            for name, engine in (("small-device-only", small_device_only), ("small-3-tier", small_tiered)):
                result = run_one(backend, name=name, router="prefix", engine=engine, replicas=args.replicas,
                                 model_dir=model_dir, requests=requests)
                tier_runs[name] = result.summary()

    print_table(f"Routers ({args.replicas} replicas, {args.slots} slots each, cache 4096 device blocks)",
                list(runs.values()), ROUTER_COLUMNS)
    comparison = compare(runs)
    if comparison:
        print_table("Prefix-aware vs baselines (same run)", comparison,
                    [("baseline", "baseline"), ("hit_rate_ratio", "hit-rate x"), ("throughput_ratio", "out tok/s x"),
                     ("ttft_p90_ratio", "TTFT p90 x"), ("hit_target", "hit target"),
                     ("throughput_target", "throughput target")])
    if tier_runs:
        print_table(f"Cache tiers (prefix-aware, {args.small_cache_blocks} device blocks per replica; "
                    f"3-tier adds 1024 host-DRAM + 8192 disk blocks)", list(tier_runs.values()), TIER_COLUMNS)
    report = {
        "benchmark": "serving", "date": dt.datetime.now(dt.UTC).date().isoformat(),
        "host": f"{os.cpu_count()} CPU cores; accelerators SIMULATED (replicas compute on CPU)",
        "trace": str(args.trace), "trace_lines": [args.start, args.start + len(trace) - 1],
        "reusable_block_fraction_unbounded": round(reusable, 4), "scaling": describe_scaling(scale),
        "model": {**MODEL_SHAPE, "weights": "random (seed 0)"}, "replicas": args.replicas, "rate_rps": args.rate,
        "routers": runs, "comparison": comparison, "tiers": tier_runs,
    }
    if not args.no_write:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        json_path = args.json or RESULTS_DIR / "serving.json"
        csv_path = args.csv or RESULTS_DIR / "serving.csv"
        json_path.write_text(json.dumps(report, indent=2, default=str))
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=[key for key, _ in ROUTER_COLUMNS] + ["group"],
                                    extrasaction="ignore")
            writer.writeheader()
            for group, rows in (("routers", runs), ("tiers", tier_runs)):
                for row in rows.values():
                    writer.writerow({**{k: _fmt(v) if isinstance(v, dict) else v for k, v in row.items()},
                                     "group": group})
        print(f"\n[serving] wrote {json_path} and {csv_path}")
    lost = sum(r["errors"] for r in [*runs.values(), *tier_runs.values()])
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["RunResult", "asdict", "compare", "main", "replay", "service_spec", "write_model"]
