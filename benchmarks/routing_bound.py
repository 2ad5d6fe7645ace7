"""Upper bound on what prefix-aware routing can add to throughput over the default router, on a Mooncake trace.

    .venv/bin/python -m benchmarks.routing_bound [--trace PATH] [--start N] [--limit N] [--replicas 2,3,4]
        [--cache-blocks 2000,...,unbounded] [--seeds 5] [--cap-blocks N] [--json PATH] [--csv PATH]

Not a measurement of Fleetyard: arithmetic over the trace's block ids, for issue #5's "1.4x the output throughput
of the default router". Every request of the trace (any file of Mooncake's format; the whole shipped trace by
default, at its real lengths: 512-token blocks, the last one partial) is replayed in order through prefix caches,
one per replica, each unbounded or an LRU of N blocks:

* default: Ray Serve's default router (power of two choices on queue length) is blind to prefixes, so as far as
  caching goes a request's replica is a uniformly random one (mean over ``--seeds`` seeds);
* affinity: each request to the replica holding its longest cached prefix (ties: the replica given the fewest
  prompt tokens so far), what a prefix-aware router does when it never trades a prefix for load;
* pooled: one cache as large as all the replicas' together: as if no block were held twice and every request
  could use all of them. Unbounded, it is the most any router over any replicas could reuse (a router can only
  reuse what is on the replica it picks); bounded, the most under LRU, the engine's eviction.
* ceiling, every prefix reused: the default router with caches of that size against a router that reuses every
  prefix any earlier request had, whatever its memory: a loose bound for eviction policies other than LRU.

The throughput bound assumes prefill of uncached prompt tokens is *all* of the work, at a cost per token that does
not depend on how much is cached: throughput is then inversely proportional to the uncached tokens, and a router's
gain over the default is at most uncached(default) / uncached(pooled). Both assumptions favour caching: decode work
is the same under every router and only dilutes the ratio, and a request's new tokens still attend to its cached
prefix, so a cached token saves less than a computed one costs. Routing can also change how evenly replicas are
loaded, but the default router already balances queue lengths, so at saturation it leaves no replica idle.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._args import COUNT, OFFSET  # noqa: E402
from benchmarks.mooncake import TRACE_PATH, TraceRequest, read_trace  # noqa: E402
from benchmarks.scale import table  # noqa: E402

COLUMNS = [("replicas", "replicas", "d"), ("cache_blocks", "blocks per replica", ""),
           ("default_hit_rate", "default hit", ".1%"), ("affinity_hit_rate", "affinity hit", ".1%"),
           ("pooled_hit_rate", "pooled hit", ".1%"), ("hit_rate_ratio_bound", "hit ratio (pooled)", ".2f"),
           ("throughput_bound_affinity", "throughput bound, affinity", ".3f"),
           ("throughput_bound_pooled", "throughput bound, pooled", ".3f"),
           ("throughput_ceiling_every_prefix", "ceiling, every prefix reused", ".3f")]
BLOCK_TOKENS = 512  # Mooncake's block size: each hash id covers 512 prompt tokens


@dataclass(frozen=True)
class Prompt:
    """A request as the caches see it: the ids of its prefixes (one per block) and each block's tokens."""

    prefixes: tuple[int, ...]
    tokens: tuple[int, ...]
    output_tokens: int


class Outcome(NamedTuple):
    policy: str
    replicas: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prompts_of(trace: list[TraceRequest], *, cap_blocks: int | None = None) -> list[Prompt]:
    """Each request's blocks as prefix ids (a block's id stands for the chain of hash ids up to it, so two requests
    share a prefix id only if they share the whole prefix) and token counts; ``cap_blocks`` keeps the first N."""
    chain: dict[tuple[int, int], int] = {}
    prompts = []
    for request in trace:
        ids = request.hash_ids[:cap_blocks] if cap_blocks else request.hash_ids
        last = max(1, min(BLOCK_TOKENS, request.input_length - BLOCK_TOKENS * (len(request.hash_ids) - 1)))
        tokens = [BLOCK_TOKENS] * len(ids)
        if len(ids) == len(request.hash_ids):
            tokens[-1] = last
        parent, prefixes = -1, []
        for hash_id in ids:
            parent = chain.setdefault((parent, hash_id), len(chain))
            prefixes.append(parent)
        prompts.append(Prompt(tuple(prefixes), tuple(tokens), request.output_length))
    return prompts


class Cache:
    """A replica's prefix cache over prefix ids: unbounded, or an LRU of ``capacity`` blocks (a block used by a
    request, cached or computed, becomes the most recent; the least recent goes first)."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def prefix_blocks(self, prompt: Prompt) -> int:
        count = 0
        for prefix in prompt.prefixes:
            if prefix not in self.blocks:
                break
            count += 1
        return count

    def serve(self, prompt: Prompt) -> int:
        """Cached tokens of the prompt's longest cached prefix (at least one token is always computed); then every
        block of the prompt is cached."""
        count = self.prefix_blocks(prompt)
        cached = min(sum(prompt.tokens[:count]), sum(prompt.tokens) - 1)
        blocks = self.blocks
        for prefix in prompt.prefixes:
            blocks[prefix] = None
            blocks.move_to_end(prefix)
        if self.capacity is not None:
            while len(blocks) > self.capacity:
                blocks.popitem(last=False)
        return cached


def replay(prompts: list[Prompt], policy: str, replicas: int, *, capacity: int | None = None,
           seed: int = 0) -> Outcome:
    """Every prompt in order through ``replicas`` caches of ``capacity`` blocks each (None: unbounded).

    "default": a uniformly random replica (a prefix-blind router, as far as caching goes); "affinity": the replica
    with the longest cached prefix, ties to the one given the fewest prompt tokens so far; "pooled": one cache of
    ``replicas x capacity`` blocks (as if the replicas' caches held no block twice and every request could use all
    of them: the most any router could reuse with that much memory, under LRU)."""
    if policy == "pooled":
        return replay(prompts, "default", 1, capacity=None if capacity is None else capacity * replicas)._replace(
            policy="pooled", replicas=replicas)
    rng = random.Random(seed)
    caches = [Cache(capacity) for _ in range(replicas)]
    given = [0] * replicas
    total = cached = 0
    for prompt in prompts:
        if policy == "default":
            chosen = rng.randrange(replicas)
        elif policy == "affinity":
            chosen = min(range(replicas), key=lambda r: (-caches[r].prefix_blocks(prompt), given[r], r))
        else:
            raise ValueError(f"unknown policy {policy!r}")
        tokens = sum(prompt.tokens)
        total += tokens
        given[chosen] += tokens
        cached += caches[chosen].serve(prompt)
    return Outcome(policy, replicas, total, cached)


def bound_rows(prompts: list[Prompt], replica_counts: list[int], seeds: int,
               capacities: list[int | None]) -> list[dict]:
    """Per replica count and cache size: the default router's hit rate (mean over seeds), affinity's and the pooled
    cache's, and the throughput bounds uncached(default) / uncached(affinity or pooled)."""
    rows = []
    everything = replay(prompts, "pooled", 1)  # unbounded: every prefix any earlier request had
    for replicas in replica_counts:
        for capacity in capacities:
            runs = [replay(prompts, "default", replicas, capacity=capacity, seed=seed) for seed in range(seeds)]
            default_uncached = sum(run.uncached_tokens for run in runs) / len(runs)
            default_hit = sum(run.hit_rate for run in runs) / len(runs)
            affinity = replay(prompts, "affinity", replicas, capacity=capacity)
            pooled = replay(prompts, "pooled", replicas, capacity=capacity)
            rows.append({
                "replicas": replicas,
                "cache_blocks": "unbounded" if capacity is None else capacity,
                "default_hit_rate": default_hit,
                "affinity_hit_rate": affinity.hit_rate,
                "pooled_hit_rate": pooled.hit_rate,
                "hit_rate_ratio_bound": pooled.hit_rate / default_hit if default_hit else float("inf"),
                "throughput_bound_affinity": default_uncached / affinity.uncached_tokens,
                "throughput_bound_pooled": default_uncached / pooled.uncached_tokens,
                "throughput_ceiling_every_prefix": default_uncached / everything.uncached_tokens,
            })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(TRACE_PATH), help="a Mooncake-format JSONL file")
    parser.add_argument("--start", type=OFFSET, default=0, help="records to skip first")
    parser.add_argument("--limit", type=COUNT, default=None, help="records to read (default: all)")
    parser.add_argument("--replicas", default="2,3,4", help="comma-separated replica counts")
    parser.add_argument("--seeds", type=COUNT, default=5, help="seeds for the default router's random choice")
    parser.add_argument("--cache-blocks", default="2000,4000,8000,16000,32000,unbounded",
                        help="comma-separated cache sizes per replica, in blocks, or 'unbounded'")
    parser.add_argument("--cap-blocks", type=COUNT, default=None,
                        help="keep each prompt's first N blocks (the serving benchmarks cap at 40)")
    parser.add_argument("--json", default=None, help="write the rows and settings here")
    parser.add_argument("--csv", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    try:
        replica_counts = [int(part) for part in args.replicas.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--replicas: expected comma-separated integers, got {args.replicas!r}")
    if not replica_counts or min(replica_counts) < 1:
        parser.error("--replicas: every count must be >= 1")
    try:
        capacities = [None if part.strip() == "unbounded" else int(part)
                      for part in args.cache_blocks.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--cache-blocks: expected comma-separated integers or 'unbounded', got {args.cache_blocks!r}")
    if not capacities or any(c is not None and c < 1 for c in capacities):
        parser.error("--cache-blocks: every size must be >= 1 (or 'unbounded')")
    if args.seeds < 1:
        parser.error("--seeds: must be >= 1")
    if args.cap_blocks is not None and args.cap_blocks < 1:
        parser.error("--cap-blocks: must be >= 1")
    try:
        trace = read_trace(args.trace, limit=args.limit, start=args.start)
    except (OSError, ValueError) as error:
        print(f"routing_bound: {error}", file=sys.stderr)
        return 2
    if not trace:
        print("routing_bound: the trace has no requests in that range", file=sys.stderr)
        return 2
    prompts = prompts_of(trace, cap_blocks=args.cap_blocks)
    rows = bound_rows(prompts, replica_counts, args.seeds, capacities)
    print(f"{len(prompts)} requests of {args.trace} (start {args.start}), "
          f"{sum(sum(p.tokens) for p in prompts):,} prompt tokens in {BLOCK_TOKENS}-token blocks; "
          f"prefill of uncached tokens taken as all of the work (throughput bound = uncached tokens of the default "
          f"router / of affinity or of the pooled cache):")
    print(table(rows, COLUMNS))
    settings = {"trace": args.trace, "start": args.start, "limit": args.limit, "requests": len(prompts),
                "seeds": args.seeds, "cache_blocks": args.cache_blocks, "cap_blocks": args.cap_blocks,
                "block_tokens": BLOCK_TOKENS,
                "date": datetime.now(UTC).isoformat(timespec="seconds")}
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["Cache", "Outcome", "Prompt", "bound_rows", "prompts_of", "replay"]
