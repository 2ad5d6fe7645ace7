"""Time to first token for 16K-token prompts on the serving engine: cold, and with the prefix in each cache tier.

    .venv/bin/python -m benchmarks.long_prompt [--prompt-tokens 16384] [--suffix-tokens 64] [--reps 5]
                                               [--output-tokens 8] [--block-size 16] [--filler-tokens 1024]
                                               [--threads 1] [--verify-reps 1] [--json PATH] [--csv PATH]
                                               [--no-write]

Why: Baige's published bar is "first token under 0.5 s for 16K-token prompts" (../shared/DESIGN.md). This runs
the engine every replica runs (inference/runtime/engine.py, with its three-tier prefix cache, kv_cache.py) in
this process, no Ray, one request at a time (so TTFT is the engine's own per-request measure: prefill plus cache
work, no queueing), and times the first token of a long prompt in five cases:
- "cold": a 16,384-token prompt nothing of which is cached (a full prefill);
- "device": a follow-up (the same 16,384 tokens plus a new 64-token suffix, like a chat turn) while the first
  turn's KV blocks are in the device tier;
- "host": the same after other requests pushed those blocks out of the device tier to host DRAM, loaded back;
- "disk": pushed further, to the local-disk tier (one file per block), written out, loaded back; the files were
  just written, so the OS page cache may still hold them;
- "disk, not in page cache": the same after each block file was fsynced and the kernel asked to drop its pages
  (posix_fadvise DONTNEED), so loading them reads the disk.
The pushing is done by the engine's own LRU: "filler" requests (distinct random prompts of --filler-tokens tokens,
one output token each) fill the device tier (and then host DRAM) until the first turn's blocks have moved down;
the engine reports where each hit was found, and a case whose blocks were not all found in its tier is flagged.
Each repetition uses a fresh engine and fresh random prompts. For the first --verify-reps repetitions, every
follow-up prompt is run again on an engine with every cache tier off, and its greedy output must equal the cached
run's (the cache must not change what is computed).

The model is the built-in LM with the serving benchmarks' shape (4 layers, d_model 192; benchmarks/serving.py)
and random weights (seeded): this measures serving work, not text. Its window is set in the model's own config
(LMConfig.context: positions are a learned table of that many rows) to the longest request plus its output.
On this machine there is no accelerator: everything runs on the CPU (--threads intra-op threads), the "device"
and host-DRAM tiers are both host memory (a move between them copies nothing, kv_cache.py) and the disk tier is
real file I/O. A small random-weight model on a CPU is not Baige's hardware or model; the cold figure in
particular says nothing about a 16K prefill of a production model on an accelerator.
Results go to benchmarks/results/long_prompt.json and .csv.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
for _path in (str(REPO_ROOT / "platform"), str(REPO_ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from benchmarks._args import COUNT, OFFSET  # noqa: E402
from benchmarks.serving import MODEL_SHAPE, RESULTS_DIR  # noqa: E402

TARGET_TTFT_S = 0.5  # Baige: first token under 0.5 s for 16K-token prompts
CASES = ("cold", "device", "host", "disk", "disk, not in page cache")
CASE_TITLES = {
    "cold": "cold: nothing cached (full prefill)",
    "device": "prefix in the device tier",
    "host": "prefix evicted to host DRAM, loaded back",
    "disk": "prefix evicted to disk, loaded back (page cache)",
    "disk, not in page cache": "prefix evicted to disk, loaded back (read from disk)",
}
EXPECTED_TIER = {"device": "device", "host": "host", "disk": "disk", "disk, not in page cache": "disk"}
REQUEST_TIMEOUT_S = 900.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from jobs.runtime.lm_config import MAX_MODEL_CONTEXT

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-tokens", type=COUNT, default=16_384, help="the long prompt (the first turn)")
    parser.add_argument("--suffix-tokens", type=COUNT, default=64, help="new tokens of each follow-up")
    parser.add_argument("--output-tokens", type=COUNT, default=8, help="greedy tokens per measured request")
    parser.add_argument("--reps", type=COUNT, default=5)
    parser.add_argument("--block-size", type=COUNT, default=16, help="tokens per KV block (the engine's default)")
    parser.add_argument("--filler-tokens", type=COUNT, default=1024, help="tokens per request that pushes blocks down")
    parser.add_argument("--threads", type=COUNT, default=1, help="the engine's torch_threads (1: as replicas run here)")
    parser.add_argument("--verify-reps", type=OFFSET, default=1,
                        help="repetitions whose follow-ups are rerun with the cache off and compared")
    parser.add_argument("--seed", type=OFFSET, default=0)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "long_prompt.json")
    parser.add_argument("--csv", type=Path, default=RESULTS_DIR / "long_prompt.csv")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.prompt_tokens < args.block_size or args.filler_tokens < args.block_size:
        parser.error("--prompt-tokens and --filler-tokens must be at least --block-size (whole blocks are cached)")
    window = window_for(args.prompt_tokens, args.suffix_tokens, args.output_tokens)
    if window > MAX_MODEL_CONTEXT:
        parser.error(f"--prompt-tokens + --suffix-tokens + --output-tokens = {window}: the model's window can be at "
                     f"most {MAX_MODEL_CONTEXT}")
    from inference.runtime.engine_config import EngineConfig

    try:  # the engine's own limits, checked before the model is built
        EngineConfig.from_dict({"block_size": args.block_size, "torch_threads": args.threads})
    except ValueError as exc:
        parser.error(f"{exc} (from --block-size or --threads)")
    return args


def window_for(prompt_tokens: int, suffix_tokens: int, output_tokens: int) -> int:
    """The model window the longest request needs: a follow-up's prompt plus its output."""
    return prompt_tokens + suffix_tokens + output_tokens


def tier_sizes(prompt_tokens: int, suffix_tokens: int, block_size: int, filler_tokens: int) -> dict[str, int]:
    """Cache tiers (in blocks) that hold exactly what each case needs: the device tier one follow-up's blocks,
    host DRAM that plus one filler request's worth (fillers arrive whole), the disk tier everything a repetition
    pushes down. And how many filler requests push a conversation out of the device tier (the least recently used
    blocks go first), and then out of host DRAM (everything older in host DRAM goes first)."""
    conversation = (prompt_tokens + suffix_tokens) // block_size
    filler = filler_tokens // block_size
    host = conversation + filler
    return {"device": conversation, "host": host, "disk": 8 * (conversation + host),
            # the device tier then evicts the conversation and less than one filler request more: host DRAM holds it
            "fillers_to_host": math.ceil(conversation / filler),
            "fillers_to_disk": math.ceil((conversation + host) / filler) + 1}


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def drop_page_cache(directory: Path) -> int:
    """Writes every block file out and asks the kernel to drop its cached pages; how many files (0: unsupported)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    count = 0
    for path in directory.glob("*.kv"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def start_engine(model, config, **kwargs):
    """A started engine that also records every token it generates (`engine.generated_ids`): its stream leaves out
    tokens that do not complete a character yet, and the comparison with the cache off needs every one."""
    from inference.runtime.engine import LLMEngine

    engine = LLMEngine(model, config, **kwargs)
    generated: list[int] = []
    accept = engine._accept_token

    def recording(seq, token: int) -> None:
        generated.append(token)
        accept(seq, token)

    engine.__dict__["_accept_token"] = recording  # this instance only, as benchmarks/cache_ceiling.py times it
    engine.generated_ids = generated
    return engine.start()


def _serve(engine, prompt: list[int], max_tokens: int) -> dict:
    """One request, alone on the engine: its measured metrics and its output."""
    from inference.runtime.engine import GenerationRequest

    before = len(engine.generated_ids)
    events = list(engine.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens),
                                  timeout_s=REQUEST_TIMEOUT_S))
    last = events[-1]
    if last["type"] != "done":
        raise RuntimeError(f"the engine failed a request: {last}")
    text = "".join(e["text"] for e in events if e["type"] == "token")
    return {**last["metrics"], "output_text": text, "output_token_ids": engine.generated_ids[before:]}


def measure(model, *, prompt_tokens: int, suffix_tokens: int, output_tokens: int, reps: int, block_size: int,
            filler_tokens: int, threads: int, verify_reps: int, cache_root: str | None = None, seed: int = 0,
            progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Every case, `reps` times, each repetition on a fresh engine; the samples and the verification runs."""
    from inference.runtime.engine_config import EngineConfig

    if model.config.context < window_for(prompt_tokens, suffix_tokens, output_tokens):
        raise ValueError(f"the model's window ({model.config.context}) is shorter than the longest request "
                         f"({window_for(prompt_tokens, suffix_tokens, output_tokens)})")
    sizes = tier_sizes(prompt_tokens, suffix_tokens, block_size, filler_tokens)
    settings = {"slots": 1, "block_size": block_size, "device_cache_blocks": sizes["device"],
                "host_cache_blocks": sizes["host"], "disk_cache_blocks": sizes["disk"], "max_waiting": 4,
                "torch_threads": threads}
    config = EngineConfig.from_dict(settings)
    samples: list[dict] = []
    verification: list[dict] = []
    rng = random.Random(seed)
    for rep in range(reps):
        first_turn = random_tokens(rng, prompt_tokens)
        follow_ups = {case: first_turn + random_tokens(rng, suffix_tokens) for case in CASES[1:]}
        with tempfile.TemporaryDirectory(prefix="fy-long-prompt-", dir=cache_root) as cache_dir:
            engine = start_engine(model, config, replica=f"long-prompt-{rep}", cache_dir=cache_dir)
            try:
                samples += _one_repetition(engine, rep, first_turn, follow_ups, sizes=sizes, rng=rng,
                                           output_tokens=output_tokens, filler_tokens=filler_tokens,
                                           cached_blocks=prompt_tokens // block_size, progress=progress)
            finally:
                engine.stop()
        if rep < verify_reps:
            off = EngineConfig.from_dict({**settings, "device_cache_blocks": 0, "host_cache_blocks": 0,
                                          "disk_cache_blocks": 0})
            reference = start_engine(model, off, replica=f"long-prompt-reference-{rep}")
            try:
                for case, prompt in follow_ups.items():
                    cold = _serve(reference, prompt, output_tokens)
                    cached = next(s for s in samples if s["rep"] == rep and s["case"] == case)
                    same = cold["output_token_ids"] == cached["output_token_ids"]
                    verification.append({"rep": rep, "case": case, "prompt_tokens": cold["prompt_tokens"],
                                         "cold_ttft_s": cold["ttft_s"], "cached_ttft_s": cached["ttft_s"],
                                         "same_output": same})
                    progress(f"rep {rep}: {case} follow-up with the cache off: TTFT {cold['ttft_s'] * 1000:.1f} ms, "
                             f"output {'identical' if same else 'DIFFERENT'}")
            finally:
                reference.stop()
    return {"engine": config.to_dict(), "tiers": sizes, "samples": samples, "verification": verification}


def _one_repetition(engine, rep: int, first_turn: list[int], follow_ups: dict[str, list[int]], *,
                    sizes: dict[str, int], rng: random.Random, output_tokens: int, filler_tokens: int,
                    cached_blocks: int, progress: Callable[[str], None]) -> list[dict]:
    """The five cases in order on one fresh engine: the first turn (cold), then a follow-up with its blocks on the
    device tier, then pushed to host DRAM, to disk, and to disk with the page cache dropped."""
    samples: list[dict] = []

    def push_down(n: int) -> None:
        for _ in range(n):
            _serve(engine, random_tokens(rng, filler_tokens), 1)

    def record(case: str, prompt: list[int], **extra) -> None:
        engine.cache.flush()  # no disk write of earlier work runs during the measured request
        sample = {"case": case, "rep": rep, **_serve(engine, prompt, output_tokens), **extra}
        expected = EXPECTED_TIER.get(case)
        found = sample["cached_blocks_by_tier"]
        sample["as_expected"] = (sample["cached_tokens"] == 0 if expected is None
                                 else found.get(expected, 0) == cached_blocks == sum(found.values()))
        if extra.get("page_cache_dropped_files") == 0:
            sample["as_expected"] = False  # nothing was dropped: this is the page-cache case again
        samples.append(sample)
        progress(f"rep {rep}: {case}: TTFT {sample['ttft_s'] * 1000:.1f} ms, {sample['cached_tokens']} of "
                 f"{sample['prompt_tokens']} prompt tokens cached (found in {found})"
                 + ("" if sample["as_expected"] else "  ** NOT AS EXPECTED **"))

    record("cold", first_turn)
    record("device", follow_ups["device"])
    push_down(sizes["fillers_to_host"])
    record("host", follow_ups["host"])
    push_down(sizes["fillers_to_disk"])
    record("disk", follow_ups["disk"])
    push_down(sizes["fillers_to_disk"])
    engine.cache.flush()
    dropped = drop_page_cache(Path(engine.cache.disk_dir))
    record("disk, not in page cache", follow_ups["disk, not in page cache"], page_cache_dropped_files=dropped)
    return samples


def summarize(samples: list[dict], *, target_s: float = TARGET_TTFT_S) -> list[dict]:
    """One row per case: TTFT p50 and max over the repetitions, computed tokens per second, the target."""
    rows = []
    for case in CASES:
        runs = [s for s in samples if s["case"] == case]
        if not runs:
            continue
        ttfts = [s["ttft_s"] for s in runs]
        p50, worst = statistics.median(ttfts), max(ttfts)
        computed = statistics.median_low(s["prompt_tokens"] - s["cached_tokens"] for s in runs)
        found: dict[str, int] = {}
        for s in runs:
            for tier, n in s["cached_blocks_by_tier"].items():
                found[tier] = found.get(tier, 0) + n
        verdict = "yes" if worst < target_s else ("p50 only" if p50 < target_s else "no")
        rows.append({
            "case": case, "description": CASE_TITLES[case], "runs": len(runs),
            "prompt_tokens": runs[0]["prompt_tokens"], "cached_tokens_p50": statistics.median_low(
                s["cached_tokens"] for s in runs),
            "found_in": ", ".join(f"{tier} {n // len(runs)}" for tier, n in found.items() if n) or "-",
            "ttft_p50_s": round(p50, 4), "ttft_max_s": round(worst, 4),
            "computed_tokens_per_s_p50": round(computed / p50, 1) if p50 else None,
            "meets_target": verdict, "as_expected": all(s["as_expected"] for s in runs)})
    return rows


COLUMNS = (("case", "case"), ("prompt_tokens", "prompt tok"), ("cached_tokens_p50", "cached tok"),
           ("found_in", "blocks found in (per run)"), ("ttft_p50_s", "TTFT p50 s"), ("ttft_max_s", "TTFT max s"),
           ("computed_tokens_per_s_p50", "computed tok/s"), ("meets_target", "< 0.5 s"),
           ("as_expected", "as expected"))


def format_table(rows: list[dict]) -> str:
    cells = [[str(row.get(key)) for key, _ in COLUMNS] for row in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) for i, (_, title) in enumerate(COLUMNS)]
    lines = ["  ".join(title.ljust(w) for (_, title), w in zip(COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def describe_host(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{platform.node()}: {os.cpu_count()} CPU cores ({cpu}), no accelerator; the engine runs on the CPU "
            f"with {threads} thread(s); the 'device' and host-DRAM tiers are both host memory, the disk tier is "
            f"files on the local disk")


def write_results(report: dict, json_path: Path, csv_path: Path) -> None:
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    keys = [key for key, _ in COLUMNS] + ["description", "runs"]
    with open(csv_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(report["rows"])


def main(argv: list[str] | None = None) -> int:
    import torch

    from jobs.runtime.lm import LMConfig, build_model

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = {**MODEL_SHAPE, "context": window_for(args.prompt_tokens, args.suffix_tokens, args.output_tokens)}
    model = build_model(LMConfig.from_dict(shape), seed=args.seed).eval()
    params = sum(p.numel() for p in model.parameters())
    host = describe_host(args.threads)
    load_start = list(os.getloadavg())
    print(f"[long-prompt] model: built-in LM, {shape['n_layers']} layers, d_model {shape['d_model']}, "
          f"{shape['n_heads']} heads, window {shape['context']} tokens, {params / 1e6:.2f}M parameters, random "
          f"weights (seed {args.seed})\n[long-prompt] host: {host}; load average {load_start}", flush=True)
    started = time.perf_counter()
    result = measure(model, prompt_tokens=args.prompt_tokens, suffix_tokens=args.suffix_tokens,
                     output_tokens=args.output_tokens, reps=args.reps, block_size=args.block_size,
                     filler_tokens=args.filler_tokens, threads=args.threads, verify_reps=args.verify_reps,
                     seed=args.seed, progress=lambda line: print(f"[long-prompt] {line}", flush=True))
    rows = summarize(result["samples"])
    print(f"\nTime to first token, {args.prompt_tokens:,}-token prompt (follow-ups: + {args.suffix_tokens} new "
          f"tokens), {args.reps} runs per case; target {TARGET_TTFT_S} s (Baige). Built-in LM "
          f"{shape['n_layers']} layers x d_model {shape['d_model']}, random weights, on {os.cpu_count()} CPU cores "
          f"({args.threads} thread(s)), no accelerator: not comparable to Baige's hardware or models.")
    print(format_table(rows))
    same = [v["same_output"] for v in result["verification"]]
    if same:
        print(f"Greedy output of each cached follow-up vs the same prompt with the cache off: "
              f"{sum(same)} of {len(same)} identical")
    report = {"benchmark": "long_prompt", "date": dt.datetime.now(dt.UTC).date().isoformat(),
              "command": " ".join(["python", "-m", "benchmarks.long_prompt", *(sys.argv[1:] if argv is None
                                                                                 else argv)]),
              "host": host, "load_average_at_start": load_start, "load_average_at_end": list(os.getloadavg()),
              "elapsed_s": round(time.perf_counter() - started, 1), "target_ttft_s": TARGET_TTFT_S,
              "model": {**shape, "parameters": params, "weights": f"random (seed {args.seed})"},
              "prompt_tokens": args.prompt_tokens, "suffix_tokens": args.suffix_tokens,
              "output_tokens": args.output_tokens, "reps": args.reps, "filler_tokens": args.filler_tokens,
              "engine": result["engine"], "tiers": result["tiers"], "rows": rows,
              "verification": result["verification"],
              "samples": [{k: v for k, v in s.items() if k not in ("output_text", "output_token_ids")}
                          for s in result["samples"]]}
    if not args.no_write:
        write_results(report, args.json, args.csv)
        print(f"\n[long-prompt] wrote {args.json} and {args.csv}")
    ok = all(row["as_expected"] for row in rows) and all(same)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
