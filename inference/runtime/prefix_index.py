"""The prefix-aware router's index and choice policy: pure Python, deterministic, no Ray, no torch, no Django.

A Ray Serve request router (running in the caller's process) keeps one ``PrefixIndex`` of what each replica
has probably cached, and for every request calls::

    matched = index.match(prompt_tokens)                   # {replica_id: leading whole blocks it holds}
    choice = choose_replica(loads, matched, index.prompt_blocks(prompt_tokens),
                            imbalance_threshold=8, min_match_ratio=0.1, imbalance_ratio=1.5,
                            blocks_held={r.replica_id: index.blocks_held(r.replica_id) for r in loads})
    index.insert(choice.replica_id, prompt_tokens)         # the chosen replica will now cache that prefix

The index is *approximate* (as in SGLang's cache-aware router, llm-d and Ray's PrefixCacheAffinityRouter): it
records what the router sent where, not what the engines really kept, and bounds each replica to
``max_blocks_per_replica`` blocks with least-recently-used eviction, which roughly follows the engines' own
LRU prefix caches.

Structure: a radix tree over token *blocks* (``block_size`` consecutive token ids; a trailing partial block
never counts). Each child is keyed by the tuple of its block's tokens, so a node stands for one whole-block
prefix. A node records which replicas hold that prefix and the logical time (a counter, never the wall clock)
at which each last used it. Per replica the held nodes are always prefix-closed (holding a prefix means
holding all its shorter prefixes), and an ordered dict keeps them in least-recently-used order with every
node before its ancestors, so the first entry is always a leaf for that replica: eviction pops it in O(1),
and a node shared with other replicas is only dropped for the evicted one. A node no replica holds is cut
from the tree. ``match`` and ``insert`` cost O(prompt blocks x replicas holding them); nothing is O(total).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PrefixIndex", "ReplicaLoad", "RoutingChoice", "choose_replica", "REASONS"]

REASONS = ("prefix", "balance", "least_loaded")


class _Node:
    """One whole-block prefix: the last block's tokens, its parent, children by block, holders -> last use."""

    __slots__ = ("key", "parent", "children", "replicas")

    def __init__(self, key: tuple[int, ...] | None, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], _Node] = {}
        self.replicas: dict[str, int] = {}  # replica id -> logical time of its last use of this prefix


class PrefixIndex:
    """Which replica probably caches which whole-block prompt prefix, bounded per replica with LRU eviction."""

    def __init__(self, block_size: int, max_blocks_per_replica: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be an integer >= 1, got {block_size!r}")
        if (isinstance(max_blocks_per_replica, bool) or not isinstance(max_blocks_per_replica, int)
                or max_blocks_per_replica < 1):
            raise ValueError(f"max_blocks_per_replica: must be an integer >= 1, got {max_blocks_per_replica!r}")
        self.block_size = block_size
        self.max_blocks_per_replica = max_blocks_per_replica
        self._root = _Node(None, None)
        # Per replica: its held nodes, least recently used first, every node before its ancestors.
        self._lru: dict[str, OrderedDict[_Node, None]] = {}
        self._clock = 0
        self._nodes = 0
        self.evictions = 0  # blocks evicted for capacity since creation (all replicas)

    # -- reading --------------------------------------------------------------------------------------------

    def prompt_blocks(self, tokens: Sequence[int]) -> int:
        """How many whole blocks ``tokens`` has (a trailing partial block does not count)."""
        return len(tokens) // self.block_size

    def _blocks(self, tokens: Sequence[int], limit: int | None = None) -> Iterable[tuple[int, ...]]:
        count = self.prompt_blocks(tokens)
        if limit is not None:
            count = min(count, limit)
        size = self.block_size
        for start in range(0, count * size, size):
            yield tuple(tokens[start:start + size])

    def match(self, tokens: Sequence[int]) -> dict[str, int]:
        """For every replica that holds at least one block, the number of leading whole blocks of ``tokens``
        it holds (0 when none). Reading does not touch LRU times: only ``insert`` does."""
        matched = dict.fromkeys(self._lru, 0)
        node = self._root
        for depth, block in enumerate(self._blocks(tokens), start=1):
            child = node.children.get(block)
            if child is None:
                break
            for replica in child.replicas:
                matched[replica] = depth
            node = child
        return matched

    def blocks_held(self, replica: str) -> int:
        """How many blocks (tree nodes) ``replica`` holds; 0 for an unknown replica."""
        held = self._lru.get(replica)
        return len(held) if held is not None else 0

    def replicas(self) -> list[str]:
        """Replicas holding at least one block, sorted."""
        return sorted(self._lru)

    def last_used(self, replica: str, tokens: Sequence[int]) -> int | None:
        """The logical time at which ``replica`` last used the whole-block prefix of ``tokens`` (None if it
        does not hold all of it, or the prefix is empty)."""
        node = self._root
        for block in self._blocks(tokens):
            node = node.children.get(block)
            if node is None:
                return None
        return node.replicas.get(replica) if node is not self._root else None

    @property
    def node_count(self) -> int:
        """Tree nodes (distinct whole-block prefixes held by at least one replica)."""
        return self._nodes

    @property
    def total_blocks(self) -> int:
        """Sum of ``blocks_held`` over all replicas (a prefix shared by k replicas counts k times)."""
        return sum(len(held) for held in self._lru.values())

    # -- writing --------------------------------------------------------------------------------------------

    def insert(self, replica: str, tokens: Sequence[int]) -> int:
        """Record that ``replica`` now caches the whole-block prefix of ``tokens`` and mark it most recently
        used; then evict the replica's least recently used leaves while it holds more than the bound. A
        prefix longer than the bound is cut to its first ``max_blocks_per_replica`` blocks (the rest would
        be evicted at once anyway). Returns the number of blocks of the prompt now recorded for it."""
        if not isinstance(replica, str) or not replica:
            raise ValueError(f"replica: must be a non-empty string, got {replica!r}")
        path: list[_Node] = []
        node = self._root
        for block in self._blocks(tokens, self.max_blocks_per_replica):
            child = node.children.get(block)
            if child is None:
                child = _Node(block, node)
                node.children[block] = child
                self._nodes += 1
            path.append(child)
            node = child
        if not path:
            return 0
        self._clock += 1
        now = self._clock
        held = self._lru.setdefault(replica, OrderedDict())
        # Leaf first, root last: every node ends up after all its held descendants.
        for child in reversed(path):
            child.replicas[replica] = now
            if child in held:
                held.move_to_end(child)
            else:
                held[child] = None
        while len(held) > self.max_blocks_per_replica:
            victim, _ = held.popitem(last=False)
            self._drop(victim, replica)
            self.evictions += 1
        return len(path)

    def remove_replica(self, replica: str) -> int:
        """Forget everything ``replica`` held (it died or was scaled away); returns the blocks dropped."""
        held = self._lru.pop(replica, None)
        if held is None:
            return 0
        for node in held:  # descendants come before their ancestors, so each node is a leaf when dropped
            self._drop(node, replica)
        return len(held)

    def retain_replicas(self, replica_ids: Iterable[str]) -> list[str]:
        """Forget every replica not in ``replica_ids`` (the live set); returns the removed ids, sorted."""
        keep = set(replica_ids)
        gone = sorted(replica for replica in self._lru if replica not in keep)
        for replica in gone:
            self.remove_replica(replica)
        return gone

    def clear(self) -> None:
        self._root = _Node(None, None)
        self._lru.clear()
        self._nodes = 0

    def _drop(self, node: _Node, replica: str) -> None:
        del node.replicas[replica]
        # Prefix closure: a node nobody holds has no held descendants, and they were dropped before it.
        if not node.replicas and not node.children and node.parent is not None:
            del node.parent.children[node.key]
            node.parent = None
            self._nodes -= 1


# -- choice policy ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplicaLoad:
    """A candidate replica: requests queued or running on it, and how many it accepts before refusing."""

    replica_id: str
    queue_len: int
    capacity: int

    def __post_init__(self) -> None:
        if not isinstance(self.replica_id, str) or not self.replica_id:
            raise ValueError(f"replica_id: must be a non-empty string, got {self.replica_id!r}")
        if isinstance(self.queue_len, bool) or not isinstance(self.queue_len, int) or self.queue_len < 0:
            raise ValueError(f"queue_len: must be an integer >= 0, got {self.queue_len!r}")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"capacity: must be an integer >= 1, got {self.capacity!r}")

    @property
    def full(self) -> bool:
        return self.queue_len >= self.capacity


@dataclass(frozen=True)
class RoutingChoice:
    """The chosen replica, how many leading prompt blocks it holds, and why: "prefix" (longest cached
    prefix), "balance" (load too uneven, least loaded taken) or "least_loaded" (no useful prefix anywhere)."""

    replica_id: str
    matched_blocks: int
    reason: str


def choose_replica(
    candidates: Sequence[ReplicaLoad],
    matched: Mapping[str, int],
    prompt_blocks: int,
    *,
    imbalance_threshold: int,
    min_match_ratio: float,
    blocks_held: Mapping[str, int] | None = None,
    imbalance_ratio: float | None = None,
) -> RoutingChoice:
    """Pick a replica for one request: the longest cached prefix among the replicas whose load is close enough to
    the lightest (SGLang's cache-aware rule, applied per replica as a filter, as llm-d's scheduler does).

    1. Eligible: candidates with ``queue_len < capacity``; if every candidate is full, all of them.
    2. Admissible: eligible replicas whose ``queue_len`` exceeds the lightest eligible one's by at most
       ``imbalance_threshold``, or (when ``imbalance_ratio`` is given) is at most ``imbalance_ratio`` times it,
       so that under a heavy load a deep queue is judged relative to the others. No request ever goes to a
       replica that is not admissible: the imbalance the policy can create is bounded.
    3. If the best match among admissible replicas is at least one block and ``best / prompt_blocks >=
       min_match_ratio``: the longest match there; ties: lower queue, then fewer blocks held, then id. Reason
       "prefix", or "balance" when a replica left out in 2 holds a longer match.
    4. Else the least loaded admissible replica; ties: most matched blocks, then fewest blocks held (spreads new
       prefixes), then id. Reason "balance" when a replica left out in 2 holds a useful match (one that would
       have passed 3), else "least_loaded".

    ``matched`` maps replica id -> leading blocks held (``PrefixIndex.match``; missing ids count 0, values are
    capped at ``prompt_blocks``); ``blocks_held`` maps replica id -> ``PrefixIndex.blocks_held`` (missing: 0).
    """
    if not candidates:
        raise ValueError("candidates: must not be empty")
    ids = [c.replica_id for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError(f"candidates: duplicate replica ids in {sorted(ids)}")
    if isinstance(prompt_blocks, bool) or not isinstance(prompt_blocks, int) or prompt_blocks < 0:
        raise ValueError(f"prompt_blocks: must be an integer >= 0, got {prompt_blocks!r}")
    if isinstance(imbalance_threshold, bool) or not isinstance(imbalance_threshold, int) or imbalance_threshold < 0:
        raise ValueError(f"imbalance_threshold: must be an integer >= 0, got {imbalance_threshold!r}")
    if not 0.0 <= min_match_ratio <= 1.0:
        raise ValueError(f"min_match_ratio: must be in [0, 1], got {min_match_ratio!r}")
    if imbalance_ratio is not None and (isinstance(imbalance_ratio, bool)
                                        or not isinstance(imbalance_ratio, int | float)
                                        or not 1.0 <= imbalance_ratio < float("inf")):
        raise ValueError(f"imbalance_ratio: must be None or a finite number >= 1, got {imbalance_ratio!r}")
    held = blocks_held or {}

    def got(replica_id: str) -> int:
        return max(0, min(int(matched.get(replica_id, 0)), prompt_blocks))

    def useful(blocks: int) -> bool:
        return blocks > 0 and blocks / prompt_blocks >= min_match_ratio

    eligible = [c for c in candidates if not c.full] or list(candidates)
    lightest = min(c.queue_len for c in eligible)
    admissible = [c for c in eligible if c.queue_len - lightest <= imbalance_threshold
                  or (imbalance_ratio is not None and c.queue_len <= imbalance_ratio * lightest)]
    longest_anywhere = max(got(c.replica_id) for c in eligible)
    longest = max(got(c.replica_id) for c in admissible)
    if useful(longest):
        best = min(admissible, key=lambda c: (-got(c.replica_id), c.queue_len, held.get(c.replica_id, 0),
                                              c.replica_id))
        return RoutingChoice(best.replica_id, got(best.replica_id),
                             "prefix" if longest == longest_anywhere else "balance")
    best = min(admissible, key=lambda c: (c.queue_len, -got(c.replica_id), held.get(c.replica_id, 0), c.replica_id))
    return RoutingChoice(best.replica_id, got(best.replica_id),
                         "balance" if useful(longest_anywhere) else "least_loaded")
