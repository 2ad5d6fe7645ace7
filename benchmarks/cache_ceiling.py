"""The most prefix caching can raise serving throughput on a trace slice, measured: one engine, no cache vs all.

    .venv/bin/python -m benchmarks.cache_ceiling [--start 0] [--requests 1000] [--slots 4] [--trace PATH]
                                                 [--json PATH] [--no-write]

Why: issue 5 asks prefix-aware routing for 1.4x the output throughput of Ray Serve's default router. A router
can only save work by finding cached prefixes, so its gain is bounded by what a perfect cache saves. This runs
the serving engine (inference/runtime/engine.py, the one every replica runs) in this process, with the serving
benchmarks' model, slice and scaling (benchmarks/serving.py: 16-token blocks, outputs 1/16, prompts cut to 40
blocks), twice over the same requests, all queued at once so the engine is saturated:
- "no cache": every prefix-cache tier off, so every prompt token is computed;
- "unbounded cache": one device cache big enough to never evict, shared by all requests: the best hit rate any
  set of replicas and any router could reach (no replica can reuse a prefix no earlier request computed).
The throughput ratio of the two is the most caching can give on this slice and host, at saturation; a router's
gain over a baseline that itself reuses some prefixes is smaller still. It also reports how the engine's busy
time splits between prefill and decode. Weights are random (seeded): this measures serving work, not text.
Runs on the CPU; nothing is simulated here but the trace's token ids (derived from its block hashes).
Results go to benchmarks/results/cache_ceiling.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET  # noqa: E402
from benchmarks.mooncake import BenchRequest, ScaleSpec, build_requests, describe_scaling  # noqa: E402
from benchmarks.serving import MODEL_SHAPE, RESULTS_DIR, TRACE_PATH, load_slice  # noqa: E402

CONFIGS = {"no cache": 0, "unbounded cache": 10_000_000}  # device cache blocks; lower tiers off in both


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE_PATH)
    parser.add_argument("--start", type=OFFSET, default=0, help="first trace line (0-based)")
    parser.add_argument("--requests", type=COUNT, default=1000)
    parser.add_argument("--block-tokens", type=COUNT, default=16)
    parser.add_argument("--max-prompt-blocks", type=COUNT, default=40)
    parser.add_argument("--max-output-tokens", type=COUNT, default=32)
    parser.add_argument("--slots", type=COUNT, default=4)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    window = MODEL_SHAPE["context"] - 1  # the longest prompt the engine accepts
    if args.block_tokens * args.max_prompt_blocks > window:
        longest = args.block_tokens * args.max_prompt_blocks
        parser.error(f"--block-tokens x --max-prompt-blocks: prompts of up to {longest} tokens; the model accepts at "
                     f"most {window}")
    from inference.runtime.engine_config import EngineConfig

    try:  # the engine's own limits (slots, block size, queue length), checked before the model is built
        EngineConfig.from_dict({"slots": args.slots, "block_size": args.block_tokens, "max_waiting": args.requests})
    except ValueError as exc:
        parser.error(f"{exc} (from --slots, --block-tokens or --requests)")
    return args


def run_engine(model, requests: list[BenchRequest], *, slots: int, block_size: int, device_blocks: int,
               cache_dir: str) -> dict[str, Any]:
    """Queue every request at once on a fresh engine; wait for all; what it served and how long it took."""
    from inference.runtime.engine import GenerationRequest, LLMEngine
    from inference.runtime.engine_config import EngineConfig

    config = EngineConfig.from_dict({"slots": slots, "block_size": block_size, "device_cache_blocks": device_blocks,
                                     "host_cache_blocks": 0, "disk_cache_blocks": 0,
                                     "max_waiting": len(requests), "torch_threads": 1})
    engine = LLMEngine(model, config, replica=f"ceiling-{device_blocks}", cache_dir=cache_dir)
    busy = {"prefill": 0.0, "decode": 0.0}
    for phase in busy:  # time the engine's two kinds of work (its own methods, wrapped on this instance)
        engine.__dict__[f"_{phase}"] = _timed(getattr(engine, f"_{phase}"), busy, phase)
    done = threading.Semaphore(0)
    errors: list[str] = []

    def emit(event: dict) -> None:
        if event["type"] == "error":
            errors.append(str(event.get("message")))
        if event["type"] in ("done", "error"):
            done.release()

    engine.start()
    try:
        started = time.perf_counter()
        for request in requests:
            engine.submit(GenerationRequest(prompt_tokens=list(request.prompt_tokens), max_tokens=request.max_tokens),
                          emit)
        for _ in requests:
            if not done.acquire(timeout=600):
                raise TimeoutError("the engine did not finish every request within 10 minutes of the last")
        elapsed = time.perf_counter() - started
        stats = engine.stats()
    finally:
        engine.stop()
    prompt, cached, output = stats["prompt_tokens"], stats["cached_tokens"], stats["output_tokens"]
    work = busy["prefill"] + busy["decode"]
    return {"device_cache_blocks": device_blocks, "requests": len(requests), "errors": len(errors),
            "prompt_tokens": prompt, "cached_tokens": cached, "output_tokens": output,
            "hit_rate": round(cached / prompt, 4) if prompt else None, "makespan_s": round(elapsed, 2),
            "output_tokens_per_s": round(output / elapsed, 2) if elapsed else None,
            "prefill_s": round(busy["prefill"], 2), "decode_s": round(busy["decode"], 2),
            "prefill_share": round(busy["prefill"] / work, 4) if work else None}


def _timed(method, busy: dict[str, float], phase: str):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            busy[phase] += time.perf_counter() - start
    return timed


def ceiling_table(runs: dict[str, dict]) -> list[dict]:
    """One row per run, and the throughput ratio of each to the no-cache run."""
    base = runs["no cache"]["output_tokens_per_s"]
    return [{"config": name, **run, "throughput_vs_no_cache": round(run["output_tokens_per_s"] / base, 3)
             if base and run["output_tokens_per_s"] else None} for name, run in runs.items()]


COLUMNS = (("config", "config"), ("hit_rate", "hit rate"), ("prompt_tokens", "prompt tok"),
           ("cached_tokens", "cached tok"), ("output_tokens", "output tok"), ("makespan_s", "makespan s"),
           ("output_tokens_per_s", "out tok/s"), ("prefill_share", "prefill share of busy time"),
           ("throughput_vs_no_cache", "vs no cache"), ("errors", "errors"))


def format_table(rows: list[dict]) -> str:
    cells = [[str(row.get(key)) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title) in enumerate(COLUMNS)]
    lines = ["  ".join(title.ljust(w) for (_, title), w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from jobs.runtime.lm import LMConfig, build_model

    args = parse_args(argv)
    trace = load_slice(args.trace, start=args.start, limit=args.requests, tag="cache-ceiling")
    if trace is None:
        return 2
    scale = ScaleSpec(block_tokens=args.block_tokens, output_scale=1 / 16, max_output_tokens=args.max_output_tokens,
                      time_scale=0, max_prompt_blocks=args.max_prompt_blocks)
    requests = build_requests(trace, scale)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(LMConfig.from_dict(MODEL_SHAPE), seed=0).eval()
    print(f"[cache-ceiling] {len(requests)} requests from {args.trace} (lines {args.start}.."
          f"{args.start + len(trace) - 1}), {args.slots} slots, all queued at once", flush=True)
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fy-cache-ceiling-") as cache_dir:
        for name, blocks in CONFIGS.items():
            runs[name] = run_engine(model, requests, slots=args.slots, block_size=args.block_tokens,
                                    device_blocks=blocks, cache_dir=cache_dir)
            print(f"[cache-ceiling] {name}: {runs[name]}", flush=True)
    rows = ceiling_table(runs)
    print("\nThe most prefix caching can raise throughput on this slice (one engine, saturated; no router can "
          "reuse more than the unbounded cache)")
    print(format_table(rows))
    report = {"benchmark": "cache_ceiling", "date": dt.datetime.now(dt.UTC).date().isoformat(),
              "command": " ".join(["python", "-m", "benchmarks.cache_ceiling", *(sys.argv[1:] if argv is None
                                                                                 else argv)]),
              "host": f"{platform.node()}: {os.cpu_count()} CPU cores; the engine runs on the CPU",
              "trace": str(args.trace), "trace_lines": [args.start, args.start + len(trace) - 1],
              "scaling": describe_scaling(scale), "model": {**MODEL_SHAPE, "weights": "random (seed 0)"},
              "slots": args.slots, "rows": rows}
    if not args.no_write:
        path = args.json or RESULTS_DIR / "cache_ceiling.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        print(f"\n[cache-ceiling] wrote {path}")
    return 1 if any(run["errors"] for run in runs.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
