"""Mooncake's conversation trace: a reader, and a builder of scaled-down requests with the trace's prefix sharing.

Data: ``../shared/benchmarks/mooncake-2025/conversation_trace.jsonl`` (relative to the repository root; never
copied here), from Mooncake's FAST'25 release. One JSON object a line::

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, ..., 13]}

``timestamp`` in ms, lengths in tokens, and one hash id per 512-token block of the prompt: equal ids at the same
position are the same prefix block (an id names the whole chain of blocks up to it). 12,031 requests over ~59
minutes; with an unbounded cache 36.6% of prompt blocks are reusable (``reusable_block_fraction``).

The real prompts are ~12K tokens; a benchmark on small engines scales them down while keeping their structure
(``ScaleSpec``, ``build_requests``): every trace block becomes ``block_tokens`` token ids in 0..255 derived from
its hash id alone (blake2b), so requests that share leading hash ids share exactly the same leading tokens; the
last block is cut in proportion to how full it is in the trace; outputs are scaled and clamped; arrivals keep
the trace's spacing, multiplied by ``time_scale``.

    trace = read_trace(DATA_DIR / "conversation_trace.jsonl", limit=2000)
    requests = build_requests(trace, ScaleSpec(block_tokens=16, time_scale=0.1))
    print(describe_scaling(ScaleSpec(block_tokens=16, time_scale=0.1)))
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = REPO_ROOT.parent / "shared" / "benchmarks" / "mooncake-2025"
TRACE_PATH = DATA_DIR / "conversation_trace.jsonl"
TRACE_BLOCK_TOKENS = 512  # tokens per hash id in Mooncake's traces
PUBLISHED_REUSABLE_FRACTION = 0.366  # whole conversation trace, unbounded cache (../shared/benchmarks/README.md)
VOCAB = 256  # built prompts use token ids 0..255


# -- reading ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace, as recorded: arrival (ms), prompt and output lengths (tokens), block ids."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return len(self.hash_ids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_record(record: Any, where: str) -> TraceRequest:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: record: expected a JSON object, got {type(record).__name__}")
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in record:
            raise ValueError(f"{where}: {name}: missing")
    timestamp = record["timestamp"]
    if not (_is_int(timestamp) or isinstance(timestamp, float)):
        raise ValueError(f"{where}: timestamp: expected a number (ms), got {type(timestamp).__name__}")
    if not math.isfinite(timestamp) or timestamp < 0:
        raise ValueError(f"{where}: timestamp: must be a finite number >= 0, got {timestamp!r}")
    lengths = {}
    for name in ("input_length", "output_length"):
        value = record[name]
        if not _is_int(value):
            raise ValueError(f"{where}: {name}: expected an integer, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{where}: {name}: must be >= 0, got {value}")
        lengths[name] = value
    hash_ids = record["hash_ids"]
    if not isinstance(hash_ids, list):
        raise ValueError(f"{where}: hash_ids: expected a list of integers, got {type(hash_ids).__name__}")
    if not hash_ids:
        raise ValueError(f"{where}: hash_ids: must not be empty (a prompt has at least one block)")
    for position, hash_id in enumerate(hash_ids):
        if not _is_int(hash_id):
            raise ValueError(f"{where}: hash_ids: item {position}: expected an integer, got {type(hash_id).__name__}")
        if hash_id < 0:
            raise ValueError(f"{where}: hash_ids: item {position}: must be >= 0, got {hash_id}")
    return TraceRequest(timestamp, lengths["input_length"], lengths["output_length"], tuple(hash_ids))


def read_trace(path: str | Path, *, limit: int | None = None, start: int = 0) -> list[TraceRequest]:
    """Read a Mooncake-format JSONL trace, sorted by timestamp (stable: equal timestamps keep file order).

    Blank lines are skipped. ``start`` records (non-blank lines) are skipped unread, then at most ``limit`` are
    read (None: all), so ``limit=2000`` reads only the head of a large file. Extra fields are ignored. Any bad
    record raises ``ValueError("<path>:<line>: <field>: <reason>")`` with the 1-based line number.
    """
    if not _is_int(start) or start < 0:
        raise ValueError(f"start: must be an integer >= 0, got {start!r}")
    if limit is not None and (not _is_int(limit) or limit < 0):
        raise ValueError(f"limit: must be None or an integer >= 0, got {limit!r}")
    requests: list[TraceRequest] = []
    seen = 0
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if limit is not None and len(requests) >= limit:
                break
            text = raw.strip()
            if not text:
                continue
            seen += 1
            if seen <= start:
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: json: invalid JSON ({error.msg} at column {error.colno})") from None
            requests.append(_parse_record(record, where))
    requests.sort(key=lambda r: r.timestamp_ms)
    return requests


def reusable_block_fraction(trace: Sequence[TraceRequest]) -> float:
    """The fraction of prompt blocks whose prefix (the chain of ids up to and including it) appeared in an
    earlier request of ``trace``, in its order: the hit rate of an unbounded prefix cache. 0.0 when empty."""
    chain: dict[tuple[int, int], int] = {}  # (parent node, hash id) -> node: prefixes seen so far
    total = reusable = 0
    for request in trace:
        parent = -1
        for hash_id in request.hash_ids:
            total += 1
            node = chain.get((parent, hash_id))
            if node is None:
                node = len(chain)
                chain[(parent, hash_id)] = node
            else:
                reusable += 1
            parent = node
    return reusable / total if total else 0.0


# -- building requests ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleSpec:
    """How a trace is scaled down for a benchmark.

    block_tokens: tokens per trace block in the built prompts (the engine's KV block size keeps blocks aligned);
    trace_block_tokens: tokens per hash id in the trace (512 for Mooncake);
    output_scale, min_output_tokens, max_output_tokens: max_tokens = clamp(round(output_length * scale));
    time_scale: arrival = trace time x time_scale (0.5 replays twice as fast; 0 sends everything at once);
    max_prompt_blocks: keep at most this many leading blocks of a prompt (None: all).
    """

    block_tokens: int = 16
    trace_block_tokens: int = TRACE_BLOCK_TOKENS
    output_scale: float = 1 / 16
    max_output_tokens: int = 64
    min_output_tokens: int = 1
    time_scale: float = 1.0
    max_prompt_blocks: int | None = None

    def __post_init__(self) -> None:
        for name in ("block_tokens", "trace_block_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("min_output_tokens", "max_output_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0, got {value!r}")
        if self.max_output_tokens < self.min_output_tokens:
            raise ValueError(f"max_output_tokens: must be >= min_output_tokens ({self.min_output_tokens}), "
                             f"got {self.max_output_tokens}")
        for name in ("output_scale", "time_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        if self.max_prompt_blocks is not None and (not _is_int(self.max_prompt_blocks) or self.max_prompt_blocks < 1):
            raise ValueError(f"max_prompt_blocks: must be None or an integer >= 1, got {self.max_prompt_blocks!r}")


@dataclass(frozen=True)
class BenchRequest:
    """A request to send: when (s after the first), the prompt's token ids, the output budget, and the trace's
    ids of the blocks the prompt is made of (after ``max_prompt_blocks``)."""

    arrival_s: float
    prompt_tokens: list[int]
    max_tokens: int
    hash_ids: tuple[int, ...]


def block_tokens_for(hash_id: int, count: int) -> tuple[int, ...]:
    """``count`` token ids in 0..255 derived from ``hash_id`` alone: equal ids give equal blocks, different ids
    differ with overwhelming probability (blake2b). Shorter blocks of an id are prefixes of longer ones."""
    out = bytearray()
    counter = 0
    while len(out) < count:
        out += hashlib.blake2b(f"mooncake-block:{hash_id}:{counter}".encode(), digest_size=64).digest()
        counter += 1
    return tuple(out[:count])


def last_block_tokens(request: TraceRequest, scale: ScaleSpec) -> int:
    """Tokens of the prompt's last block: ``block_tokens`` scaled by how full the trace's last block is
    (``input_length - trace_block_tokens * (blocks - 1)``), rounded up, between 1 and ``block_tokens``."""
    in_last = request.input_length - scale.trace_block_tokens * (request.blocks - 1)
    in_last = max(0, min(in_last, scale.trace_block_tokens))
    scaled = -(-scale.block_tokens * in_last // scale.trace_block_tokens)  # exact ceiling
    return max(1, min(scaled, scale.block_tokens))


def output_tokens(output_length: int, scale: ScaleSpec) -> int:
    return max(scale.min_output_tokens, min(scale.max_output_tokens, round(output_length * scale.output_scale)))


def build_requests(trace: Sequence[TraceRequest], scale: ScaleSpec | None = None) -> list[BenchRequest]:
    """Scaled requests for ``trace``, in timestamp order (stable), arrivals relative to the earliest request."""
    scale = scale or ScaleSpec()
    if not trace:
        return []
    ordered = sorted(trace, key=lambda r: r.timestamp_ms)
    first_ms = ordered[0].timestamp_ms
    cache: dict[int, tuple[int, ...]] = {}
    requests = []
    for request in ordered:
        ids = request.hash_ids
        last_tokens = last_block_tokens(request, scale)
        if scale.max_prompt_blocks is not None and len(ids) > scale.max_prompt_blocks:
            ids = ids[:scale.max_prompt_blocks]
            last_tokens = scale.block_tokens  # the kept blocks are all whole ones
        prompt: list[int] = []
        for position, hash_id in enumerate(ids):
            block = cache.get(hash_id)
            if block is None:
                block = cache[hash_id] = block_tokens_for(hash_id, scale.block_tokens)
            prompt.extend(block if position < len(ids) - 1 else block[:last_tokens])
        arrival = (request.timestamp_ms - first_ms) / 1000.0 * scale.time_scale
        requests.append(BenchRequest(arrival, prompt, output_tokens(request.output_length, scale), tuple(ids)))
    return requests


def describe_scaling(scale: ScaleSpec | None = None) -> str:
    """One paragraph for a benchmark report: how prompt and output lengths and the arrival rate were scaled."""
    scale = scale or ScaleSpec()
    ratio = scale.trace_block_tokens / scale.block_tokens
    cap = (f" and prompts were cut to their first {scale.max_prompt_blocks} blocks"
           f" ({scale.max_prompt_blocks * scale.block_tokens} tokens)" if scale.max_prompt_blocks else "")
    if scale.time_scale == 0:
        rate = "all requests were sent at time 0 (arrival times ignored)"
    elif scale.time_scale == 1:
        rate = "arrivals keep the trace's real timing (same request rate)"
    else:
        rate = (f"arrival times were multiplied by {scale.time_scale:g}, so requests arrive "
                f"{1 / scale.time_scale:g}x as fast as in the trace")
    return (
        f"Prompts were scaled down {ratio:g}x: every {scale.trace_block_tokens}-token block of the trace (one hash id)"
        f" became {scale.block_tokens} synthetic token ids in 0..{VOCAB - 1} derived from its hash id, so requests"
        f" that share leading hash ids share exactly the same leading tokens and the trace's prefix reuse is kept;"
        f" the last block was shortened in proportion to how full it is in the trace{cap}."
        f" Output lengths were multiplied by {scale.output_scale:g} and clamped to"
        f" [{scale.min_output_tokens}, {scale.max_output_tokens}] tokens. Rate: {rate}."
    )
