"""Offline router simulator: the serving benchmark's requests against modelled replicas, in seconds, deterministic.

    .venv/bin/python -m benchmarks.router_sim [--requests 2000] [--rate 12] [--replicas 4] [--policies a,b]

Not a measurement: a model for comparing routing policies before spending ~20 minutes on benchmarks.serving.
The same requests as benchmarks/serving.py (benchmarks/mooncake.py's builder, same scaling and arrival times)
go to ``replicas`` modelled engines, each with ``slots`` concurrent sequences, a FIFO waiting queue and an LRU
prefix cache of ``cache_blocks`` whole blocks that behaves like inference/runtime/kv_cache.py's device tier
(match touches the path deepest first, a prompt's whole blocks are inserted at prefill, the least recently used
block is dropped with its subtree; at least one prompt token is always computed). Time model: an engine runs
iterations (admit waiting requests into free slots and prefill them, then one decode step for the batch), an
iteration costing ``iter_s + prefill_s x uncached prompt tokens + decode_s x batch`` CPU-seconds, and the host's
``cores`` are shared by the engines that are busy (an engine gets min(1, cores / busy) of a core). The router
sees each replica's ongoing requests (running + waiting) as reported at its last request (like Ray Serve's
queue-length cache), or exact with ``--exact-queues``.

Policies: "round_robin", "pow2" (two random replicas, the shorter queue), "before" (the choice rule and
settings PrefixAwareRouter used until 2026-11-25), "prefix" (``choose_replica`` as the router now calls it for
4-slot engines), and the variants named in POLICIES (``--policies all``). It also reports the hit rate of one
unbounded cache over the same (capped) prompts, the slice's ceiling, and per policy where the blocks went:
"ideal" (what that unbounded cache would hit), "anywhere" (the best any replica's cache held at arrival),
"chosen" (what the chosen replica held at arrival), "achieved" (what it held at prefill).

What it showed on lines 0-1999 at 12 req/s, 4 replicas x 4 slots, 4096 blocks (2026-11-25): ceiling 30.0% of
prompt tokens; pow2 13.4%, "before" 23.0% with 608 of 2000 requests sent to the least loaded replica by the
balance override (threshold 4 = one slot-full, checked over all replicas, so one deep queue anywhere cost the
prefix of every request: "anywhere" 10,800 blocks but "chosen" 8,661), "prefix" 28.7% (10 balance choices,
chosen 10,796 blocks). With exact queue lengths "before" already reached 28.2%: the loss came from the tight,
global threshold acting on the router's lagging view of the queues. The time model is not calibrated for
throughput (absolute tok/s and makespans are rough); use benchmarks.serving for that.
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks._args import COUNT, non_negative_float, positive_float  # noqa: E402
from benchmarks.mooncake import TRACE_PATH, BenchRequest, ScaleSpec, build_requests, read_trace  # noqa: E402
from inference.runtime.prefix_index import PrefixIndex, ReplicaLoad, RoutingChoice, choose_replica  # noqa: E402

# ---------------------------------------------------------------------------------------------------- engine


class _CNode:
    __slots__ = ("key", "parent", "children")

    def __init__(self, key, parent):
        self.key = key
        self.parent = parent
        self.children: dict = {}


class LRUBlockCache:
    """Whole blocks keyed by content in a tree; LRU over nodes, dropping a victim with its subtree."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.root = _CNode(None, None)
        self.lru: OrderedDict[_CNode, None] = OrderedDict()

    def match(self, blocks: list) -> int:
        path = []
        node = self.root
        for key in blocks:
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        self._touch(path)
        return len(path)

    def insert(self, blocks: list) -> None:
        node = self.root
        path = []
        for key in blocks:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _CNode(key, node)
                self.lru[child] = None
            path.append(child)
            node = child
        self._touch(path)
        while len(self.lru) > self.capacity:
            victim = next(iter(self.lru))
            self._drop(victim)

    def _touch(self, path) -> None:
        for node in reversed(path):
            if node in self.lru:
                self.lru.move_to_end(node)

    def _drop(self, node) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self.lru.pop(n, None)
        if node.parent is not None:
            node.parent.children.pop(node.key, None)


@dataclass
class _Seq:
    req: int
    prompt_blocks: list
    whole: int
    usable: int
    prompt_len: int
    out_left: int
    arrival: float
    first_token: float | None = None


@dataclass
class Replica:
    rid: str
    slots: int
    cache: LRUBlockCache
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    busy_until: float | None = None  # end of the iteration in flight
    reported_queue: int = 0

    @property
    def ongoing(self) -> int:
        return len(self.waiting) + len(self.running)


@dataclass
class SimConfig:
    replicas: int = 4
    slots: int = 4
    cache_blocks: int = 4096
    block: int = 16
    cores: float = 2.0
    iter_s: float = 0.004
    prefill_s: float = 0.00032
    decode_s: float = 0.004
    attn_s: float = 0.0
    exact_queues: bool = False
    seed: int = 0


# ---------------------------------------------------------------------------------------------------- policies


class Policy:
    name = "base"

    def __init__(self, cfg: SimConfig, rids: list[str]) -> None:
        self.cfg = cfg
        self.rids = rids
        self.rng = random.Random(cfg.seed)
        self.reasons: dict[str, int] = {}

    def choose(self, tokens: list[int], loads: list[ReplicaLoad]) -> str:
        raise NotImplementedError

    def routed(self, rid: str, tokens: list[int]) -> None:
        pass


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self, cfg, rids):
        super().__init__(cfg, rids)
        self.turn = 0

    def choose(self, tokens, loads):
        rid = self.rids[self.turn % len(self.rids)]
        self.turn += 1
        return rid


class Pow2(Policy):
    name = "pow2"

    def choose(self, tokens, loads):
        a, b = self.rng.sample(loads, 2)
        return min((a, b), key=lambda x: (x.queue_len, self.rng.random())).replica_id


def choose_before(loads, matched, prompt_blocks, *, imbalance_threshold, min_match_ratio, blocks_held):
    """The choice rule before 2026-11-25, kept here for comparison: any imbalance above the threshold (max minus
    min queue) sent the request to the least loaded replica, whatever the others held."""
    def got(rid):
        return max(0, min(int(matched.get(rid, 0)), prompt_blocks))
    eligible = [c for c in loads if not c.full] or list(loads)
    queues = [c.queue_len for c in eligible]
    if max(queues) - min(queues) > imbalance_threshold:
        best = min(eligible, key=lambda c: (c.queue_len, -got(c.replica_id), c.replica_id))
        return RoutingChoice(best.replica_id, got(best.replica_id), "balance")
    longest = max(got(c.replica_id) for c in eligible)
    if longest > 0 and longest / prompt_blocks >= min_match_ratio:
        best = min(eligible, key=lambda c: (-got(c.replica_id), c.queue_len, blocks_held.get(c.replica_id, 0),
                                            c.replica_id))
        return RoutingChoice(best.replica_id, got(best.replica_id), "prefix")
    best = min(eligible, key=lambda c: (c.queue_len, blocks_held.get(c.replica_id, 0), c.replica_id))
    return RoutingChoice(best.replica_id, got(best.replica_id), "least_loaded")


class Prefix(Policy):
    """choose_replica (or ``rule``) with keyword settings."""

    def __init__(self, cfg, rids, name="prefix", rule=choose_replica, **kwargs):
        super().__init__(cfg, rids)
        self.name = name
        self.rule = rule
        self.kwargs = kwargs
        self.index = PrefixIndex(block_size=cfg.block, max_blocks_per_replica=cfg.cache_blocks)

    def choose(self, tokens, loads):
        matched = self.index.match(tokens)
        blocks = max(1, len(tokens) // self.cfg.block)
        choice = self.rule(loads, matched, blocks,
                                blocks_held={x.replica_id: self.index.blocks_held(x.replica_id) for x in loads},
                                **self.kwargs)
        self.reasons[choice.reason] = self.reasons.get(choice.reason, 0) + 1
        return choice.replica_id

    def routed(self, rid, tokens):
        self.index.insert(rid, tokens)


# ---------------------------------------------------------------------------------------------------- simulation


def ceiling(requests: list[BenchRequest], block: int) -> float:
    """Cached prompt tokens / prompt tokens with one unbounded cache, same 'compute at least one token' rule."""
    cache: set = set()
    hit = total = 0
    for r in requests:
        n = len(r.prompt_tokens)
        total += n
        usable = (n - 1) // block
        chain = []
        got = 0
        for j in range(n // block):
            chain.append(r.hash_ids[j])
            key = tuple(chain)
            if key in cache and got == j and j < usable:
                got += 1
            cache.add(key)
        hit += got * block
    return hit / total


def _peek(cache: LRUBlockCache, blocks: list) -> int:
    node, got = cache.root, 0
    for key in blocks:
        node = node.children.get(key)
        if node is None:
            break
        got += 1
    return got


def simulate(requests: list[BenchRequest], policy: Policy, cfg: SimConfig) -> dict:
    reps = {rid: Replica(rid, cfg.slots, LRUBlockCache(cfg.cache_blocks)) for rid in policy.rids}
    events: list = []  # (time, order, kind, payload)
    order = 0
    for i, r in enumerate(requests):
        heapq.heappush(events, (r.arrival_s, order, "arrive", i))
        order += 1
    prompt_tokens = cached_tokens = out_tokens = 0
    ttfts: list[float] = []
    finish = 0.0
    per_replica = dict.fromkeys(reps, 0)
    seen: set = set()  # every whole-block prefix seen so far (an unbounded cache shared by all)
    loss = {"ideal": 0, "anywhere": 0, "chosen": 0}  # blocks: unbounded hit, best engine now, chosen engine now

    def busy_count() -> int:
        return sum(1 for rep in reps.values() if rep.busy_until is not None)

    def start_iteration(rep: Replica, now: float) -> None:
        nonlocal order, prompt_tokens, cached_tokens
        cost = cfg.iter_s
        while rep.waiting and len(rep.running) < rep.slots:
            seq = rep.waiting.pop(0)
            hit = rep.cache.match(seq.prompt_blocks[:seq.usable])
            rep.cache.insert(seq.prompt_blocks[:seq.whole])
            prompt_tokens += seq.prompt_len
            cached_tokens += hit * cfg.block
            new = seq.prompt_len - hit * cfg.block
            cost += cfg.prefill_s * new + cfg.attn_s * new * (hit * cfg.block + new / 2)
            rep.running.append(seq)
        cost += cfg.decode_s * len(rep.running)
        share = min(1.0, cfg.cores / max(1, busy_count() + 1))
        rep.busy_until = now + cost / share
        heapq.heappush(events, (rep.busy_until, order, "iter", rep.rid))
        order += 1

    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            r = requests[payload]
            loads = [ReplicaLoad(rid, rep.ongoing if cfg.exact_queues else rep.reported_queue, cfg.slots + 64)
                     for rid, rep in reps.items()]
            rid = policy.choose(r.prompt_tokens, loads)
            n = len(r.prompt_tokens)
            usable = (n - 1) // cfg.block
            chain = [tuple(r.hash_ids[:j + 1]) for j in range(n // cfg.block)]
            ideal = 0
            while ideal < usable and chain[ideal] in seen:
                ideal += 1
            seen.update(chain)
            now_match = {x: _peek(reps[x].cache, chain[:usable]) for x in reps}
            loss["ideal"] += ideal
            loss["anywhere"] += max(now_match.values())
            loss["chosen"] += now_match[rid]
            policy.routed(rid, r.prompt_tokens)
            rep = reps[rid]
            per_replica[rid] += 1
            n = len(r.prompt_tokens)
            rep.waiting.append(_Seq(payload, [tuple(r.hash_ids[:j + 1]) for j in range(n // cfg.block)],
                                    n // cfg.block, (n - 1) // cfg.block, n, r.max_tokens, now))
            rep.reported_queue = rep.ongoing
            if rep.busy_until is None:
                start_iteration(rep, now)
        else:
            rep = reps[payload]
            rep.busy_until = None
            still = []
            for seq in rep.running:
                if seq.first_token is None:
                    seq.first_token = now
                    ttfts.append(now - seq.arrival)
                seq.out_left -= 1
                out_tokens += 1
                if seq.out_left > 0:
                    still.append(seq)
                else:
                    finish = max(finish, now)
            rep.running = still
            if rep.waiting or rep.running:
                start_iteration(rep, now)
    ttfts.sort()
    return {"policy": policy.name, "hit_rate": cached_tokens / prompt_tokens, "out_tps": out_tokens / finish,
            "makespan_s": finish, "ttft_p50_s": ttfts[len(ttfts) // 2], "ttft_p90_s": ttfts[int(len(ttfts) * 0.9)],
            "per_replica": per_replica, "reasons": policy.reasons,
            "blocks": {**loss, "achieved": cached_tokens // cfg.block}}


def _variant(name, rule=choose_replica, **kwargs):
    return lambda cfg, rids: Prefix(cfg, rids, name, rule, **kwargs)


POLICIES = {
    "round_robin": lambda cfg, rids: RoundRobin(cfg, rids),
    "pow2": lambda cfg, rids: Pow2(cfg, rids),
    # the rule and settings PrefixAwareRouter used before this change (threshold 4 = slots)
    "before": _variant("before", choose_before, imbalance_threshold=4, min_match_ratio=0.1),
    # what PrefixAwareRouter uses now with 4-slot engines (imbalance_threshold = 2 x slots)
    "prefix": _variant("prefix", imbalance_threshold=8, min_match_ratio=0.1, imbalance_ratio=1.5),
    **{f"before_thr{t}": _variant(f"before_thr{t}", choose_before, imbalance_threshold=t, min_match_ratio=0.1)
       for t in (8, 16)},
    **{f"filter_thr{t}": _variant(f"filter_thr{t}", imbalance_threshold=t, min_match_ratio=0.1) for t in (4, 8, 16)},
    **{f"filter_thr{t}_rel{r}": _variant(f"filter_thr{t}_rel{r}", imbalance_threshold=t, min_match_ratio=0.1,
                                         imbalance_ratio=r) for t in (4, 8) for r in (1.25, 1.5)},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=TRACE_PATH)
    parser.add_argument("--requests", type=COUNT, default=2000)
    parser.add_argument("--rate", type=positive_float, default=12.0)
    parser.add_argument("--replicas", type=COUNT, default=4)
    parser.add_argument("--slots", type=COUNT, default=4)
    parser.add_argument("--cache-blocks", type=COUNT, default=4096)
    parser.add_argument("--max-prompt-blocks", type=COUNT, default=40)
    parser.add_argument("--exact-queues", action="store_true")
    parser.add_argument("--cores", type=positive_float, default=SimConfig.cores)
    parser.add_argument("--prefill-s", type=non_negative_float, default=SimConfig.prefill_s,
                        help="CPU-s per uncached token")
    parser.add_argument("--decode-s", type=non_negative_float, default=SimConfig.decode_s,
                        help="CPU-s per sequence per step")
    parser.add_argument("--attn-s", type=non_negative_float, default=SimConfig.attn_s,
                        help="CPU-s per uncached token per token of context (attention)")
    parser.add_argument("--iter-s", type=non_negative_float, default=SimConfig.iter_s,
                        help="CPU-s per engine iteration")
    parser.add_argument("--policies", default="round_robin,pow2,before,prefix", help="comma-separated, or 'all'")
    args = parser.parse_args(argv)
    trace = read_trace(args.trace, limit=args.requests)
    span_s = max(1e-3, (trace[-1].timestamp_ms - trace[0].timestamp_ms) / 1000)
    scale = ScaleSpec(block_tokens=16, output_scale=1 / 16, max_output_tokens=32,
                      time_scale=(len(trace) / args.rate) / span_s, max_prompt_blocks=args.max_prompt_blocks)
    requests = build_requests(trace, scale)
    cfg = SimConfig(replicas=args.replicas, slots=args.slots, cache_blocks=args.cache_blocks,
                    exact_queues=args.exact_queues, cores=args.cores, prefill_s=args.prefill_s,
                    decode_s=args.decode_s, iter_s=args.iter_s, attn_s=args.attn_s)
    rids = [f"r{i}" for i in range(args.replicas)]
    print(f"{len(requests)} requests, {args.rate} req/s; unbounded-cache ceiling (tokens, capped prompts): "
          f"{ceiling(requests, cfg.block):.1%}; arrivals end at {requests[-1].arrival_s:.0f} s; "
          f"rate-limited output tok/s <= {sum(r.max_tokens for r in requests) / requests[-1].arrival_s:.1f}")
    results = {}
    for name in (list(POLICIES) if args.policies == "all" else args.policies.split(",")):
        res = simulate(requests, POLICIES[name](cfg, rids), cfg)
        results[name] = res
        print(f"{name:22s} hit {res['hit_rate']:6.1%}  out tok/s {res['out_tps']:6.1f}"
              f"  makespan {res['makespan_s']:6.1f} s  TTFT p50 {res['ttft_p50_s']:6.2f} s"
              f" p90 {res['ttft_p90_s']:6.2f} s  {res['per_replica']} {res['reasons']}"
              f"\n{'':22s} blocks: {res['blocks']}")
    if "pow2" in results:
        base = results["pow2"]
        for name, res in results.items():
            if name != "pow2":
                print(f"{name:22s} vs pow2: hit x{res['hit_rate'] / base['hit_rate']:.2f}, "
                      f"tok/s x{res['out_tps'] / base['out_tps']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
