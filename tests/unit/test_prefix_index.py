"""The prefix-aware router's index and choice policy (inference/runtime/prefix_index.py): whole-block matching,
sharing across replicas, per-replica LRU eviction, replica removal, the three routing reasons, and a
property test of random insert/match/remove sequences against a brute-force reference."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.runtime.prefix_index import PrefixIndex, ReplicaLoad, RoutingChoice, choose_replica

BS = 4


def blocks(*ids: int) -> list[int]:
    """A prompt made of whole blocks, block ``i`` being BS copies of token ``i``."""
    return [token for i in ids for token in [i] * BS]


# -- index ------------------------------------------------------------------------------------------------------

def test_empty_index_matches_nothing():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    assert index.match(blocks(1, 2)) == {}
    assert index.blocks_held("a") == 0
    assert index.node_count == 0


def test_partial_blocks_are_ignored():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    assert index.insert("a", blocks(1, 2) + [3, 3, 3]) == 2  # 3 trailing tokens: not a whole block
    assert index.blocks_held("a") == 2
    assert index.match(blocks(1, 2) + [3, 3, 3]) == {"a": 2}
    assert index.match(blocks(1, 2, 3)) == {"a": 2}
    assert index.match(blocks(1) + [2, 2, 2]) == {"a": 1}  # the second block is incomplete
    assert index.match([1, 1, 1]) == {"a": 0}
    assert index.insert("b", [1, 1, 1]) == 0  # nothing whole to record
    assert index.replicas() == ["a"]


def test_match_stops_at_first_differing_block():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    index.insert("a", blocks(1, 2, 3, 4))
    assert index.match(blocks(1, 2, 9, 4)) == {"a": 2}
    assert index.match(blocks(9, 2, 3, 4)) == {"a": 0}
    # A block differing in one token is a different block.
    assert index.match(blocks(1) + [2, 2, 2, 7]) == {"a": 1}


def test_shared_prefix_across_replicas():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    index.insert("a", blocks(1, 2, 3))
    index.insert("b", blocks(1, 2, 5, 6))
    index.insert("c", blocks(7))
    assert index.match(blocks(1, 2, 3, 4)) == {"a": 3, "b": 2, "c": 0}
    assert index.match(blocks(1, 2, 5, 6, 8)) == {"a": 2, "b": 4, "c": 0}
    assert index.node_count == 6  # 1, 1-2, 1-2-3, 1-2-5, 1-2-5-6, 7
    assert index.total_blocks == 3 + 4 + 1
    assert index.blocks_held("b") == 4


def test_reinsert_is_idempotent_and_extends():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    index.insert("a", blocks(1, 2))
    index.insert("a", blocks(1, 2))
    assert index.blocks_held("a") == 2
    index.insert("a", blocks(1, 2, 3))
    assert index.blocks_held("a") == 3
    assert index.node_count == 3


def test_lru_eviction_drops_least_recent_leaves_first():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=4)
    index.insert("a", blocks(1, 2))  # older
    index.insert("a", blocks(3, 4))  # newer
    assert index.blocks_held("a") == 4
    index.insert("a", blocks(5))  # one over: the oldest leaf (1-2) goes, then its parent stays
    assert index.blocks_held("a") == 4
    assert index.match(blocks(1, 2)) == {"a": 1}
    assert index.match(blocks(3, 4)) == {"a": 2}
    index.insert("a", blocks(6, 7))  # two over: 1, then the leaf 3-4
    assert index.blocks_held("a") == 4
    assert index.match(blocks(1)) == {"a": 0}
    assert index.match(blocks(3, 4)) == {"a": 1}
    assert index.match(blocks(5)) == {"a": 1}
    assert index.match(blocks(6, 7)) == {"a": 2}
    assert index.evictions == 3


def test_touching_a_prefix_protects_it():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=3)
    index.insert("a", blocks(1))
    index.insert("a", blocks(2))
    index.insert("a", blocks(3))
    first = index.last_used("a", blocks(1))
    index.insert("a", blocks(1))  # 1 is now the most recent; 2 is the oldest
    assert index.last_used("a", blocks(1)) > first
    index.insert("a", blocks(4))
    assert index.match(blocks(1)) == {"a": 1}
    assert index.match(blocks(2)) == {"a": 0}
    assert index.match(blocks(3)) == {"a": 1}


def test_eviction_keeps_shared_nodes_for_other_replicas():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=2)
    index.insert("a", blocks(1, 2))
    index.insert("b", blocks(1, 2))
    index.insert("a", blocks(3))  # a evicts 1-2, keeps 1 (shared nodes stay for b)
    assert index.match(blocks(1, 2)) == {"a": 1, "b": 2}
    index.insert("a", blocks(4))  # a evicts 1
    assert index.match(blocks(1, 2)) == {"a": 0, "b": 2}
    assert index.node_count == 4  # 1, 1-2 (b), 3, 4 (a)
    index.remove_replica("b")
    assert index.node_count == 2


def test_prompt_longer_than_bound_keeps_its_first_blocks():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=3)
    index.insert("a", blocks(9))
    assert index.insert("a", blocks(1, 2, 3, 4, 5)) == 3
    assert index.blocks_held("a") == 3
    assert index.match(blocks(1, 2, 3, 4, 5)) == {"a": 3}
    assert index.match(blocks(9)) == {"a": 0}


def test_bounds_hold_under_many_inserts():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=16)
    rng = random.Random(3)
    for _ in range(500):
        replica = f"r{rng.randrange(4)}"
        index.insert(replica, blocks(*[rng.randrange(3) for _ in range(rng.randrange(1, 12))]))
        assert index.blocks_held(replica) <= 16
    assert all(index.blocks_held(r) <= 16 for r in index.replicas())
    assert index.node_count <= index.total_blocks <= 4 * 16


def test_remove_and_retain_replicas():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=10)
    index.insert("a", blocks(1, 2, 3))
    index.insert("b", blocks(1, 2))
    index.insert("c", blocks(4))
    assert index.remove_replica("a") == 3
    assert index.remove_replica("a") == 0
    assert index.match(blocks(1, 2, 3)) == {"b": 2, "c": 0}
    assert index.node_count == 3  # 1, 1-2, 4
    assert index.retain_replicas(["c", "z"]) == ["b"]
    assert index.replicas() == ["c"]
    assert index.match(blocks(1, 2)) == {"c": 0}
    assert index.node_count == 1
    index.clear()
    assert index.replicas() == [] and index.node_count == 0


@pytest.mark.parametrize("kwargs", [
    {"block_size": 0, "max_blocks_per_replica": 1},
    {"block_size": 4, "max_blocks_per_replica": 0},
    {"block_size": True, "max_blocks_per_replica": 1},
    {"block_size": 4.0, "max_blocks_per_replica": 1},
])
def test_index_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError, match="block_size|max_blocks_per_replica"):
        PrefixIndex(**kwargs)


def test_insert_rejects_empty_replica_id():
    with pytest.raises(ValueError, match="replica"):
        PrefixIndex(block_size=BS, max_blocks_per_replica=4).insert("", blocks(1))


# -- brute-force reference ---------------------------------------------------------------------------------------

class Reference:
    """Per replica, a plain dict of whole-block prefixes -> use sequence number; evicts the smallest."""

    def __init__(self, block_size: int, bound: int) -> None:
        self.block_size, self.bound = block_size, bound
        self.held: dict[str, dict[tuple, int]] = {}
        self.seq = 0

    def _prefix(self, tokens):
        n = len(tokens) // self.block_size
        return tuple(tuple(tokens[i * self.block_size:(i + 1) * self.block_size]) for i in range(n))

    def insert(self, replica, tokens):
        prefix = self._prefix(tokens)[:self.bound]
        if not prefix:
            return
        held = self.held.setdefault(replica, {})
        for depth in range(len(prefix), 0, -1):  # leaf first: a prefix is never older than its extensions
            self.seq += 1
            held[prefix[:depth]] = self.seq
        while len(held) > self.bound:
            del held[min(held, key=held.__getitem__)]

    def match(self, tokens):
        prefix = self._prefix(tokens)
        out = {}
        for replica, held in self.held.items():
            out[replica] = max((d for d in range(len(prefix) + 1) if d == 0 or prefix[:d] in held), default=0)
        return out

    def remove(self, replica):
        self.held.pop(replica, None)

    def nodes(self):
        return len({p for held in self.held.values() for p in held})


def _run_against_reference(ops, block_size, bound):
    index = PrefixIndex(block_size=block_size, max_blocks_per_replica=bound)
    ref = Reference(block_size, bound)
    for op, replica, tokens in ops:
        if op == "insert":
            index.insert(replica, tokens)
            ref.insert(replica, tokens)
        elif op == "remove":
            index.remove_replica(replica)
            ref.remove(replica)
        assert index.match(tokens) == ref.match(tokens)
        for r in ("a", "b", "c"):
            assert index.blocks_held(r) == len(ref.held.get(r, {}))
        assert index.node_count == ref.nodes()


_token_lists = st.lists(st.integers(0, 2), max_size=14)
_ops = st.lists(
    st.tuples(st.sampled_from(["insert", "insert", "insert", "match", "remove"]), st.sampled_from("abc"),
              _token_lists),
    max_size=40,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, block_size=st.integers(1, 3), bound=st.integers(1, 6))
def test_index_agrees_with_brute_force_reference(ops, block_size, bound):
    _run_against_reference(ops, block_size, bound)


@pytest.mark.parametrize("seed", range(5))
def test_index_agrees_with_reference_on_long_seeded_runs(seed):
    rng = random.Random(seed)
    ops = []
    for _ in range(400):
        op = rng.choices(["insert", "match", "remove"], weights=[8, 3, 1])[0]
        ops.append((op, rng.choice("abc"), [rng.randrange(2) for _ in range(rng.randrange(0, 24))]))
    _run_against_reference(ops, block_size=2, bound=rng.randrange(3, 12))


def test_index_scales_without_total_work_per_request():
    """1e5 blocks held in all: inserts and matches stay fast (each is O(prompt blocks x replicas))."""
    index = PrefixIndex(block_size=16, max_blocks_per_replica=12_500)
    rng = random.Random(0)
    shared = [[rng.randrange(256) for _ in range(16 * 8)] for _ in range(50)]
    for i in range(4000):
        prompt = shared[i % 50] + [rng.randrange(256) for _ in range(16 * 30)]
        index.insert(f"r{i % 8}", prompt)
    assert sum(index.blocks_held(f"r{k}") for k in range(8)) == 8 * 12_500
    assert max(index.match(shared[3] + [0] * 16).values()) == 8


# -- choice policy ---------------------------------------------------------------------------------------------

def load(replica, queue, capacity=8):
    return ReplicaLoad(replica, queue, capacity)


def choose(candidates, matched, prompt_blocks=10, *, threshold=4, ratio=0.5, held=None):
    return choose_replica(candidates, matched, prompt_blocks, imbalance_threshold=threshold, min_match_ratio=ratio,
                          blocks_held=held)


def test_prefix_reason_picks_longest_match():
    choice = choose([load("a", 2), load("b", 0), load("c", 1)], {"a": 8, "b": 2, "c": 6})
    assert choice == RoutingChoice("a", 8, "prefix")


def test_prefix_ties_break_on_queue_then_blocks_held_then_id():
    assert choose([load("a", 2), load("b", 1)], {"a": 6, "b": 6}).replica_id == "b"
    assert choose([load("a", 1), load("b", 1)], {"a": 6, "b": 6}, held={"a": 90, "b": 30}).replica_id == "b"
    assert choose([load("b", 1), load("a", 1)], {"a": 6, "b": 6}).replica_id == "a"


def test_balance_reason_when_load_is_imbalanced():
    # b holds the whole prompt but a queue 5 deeper than a's: more than the threshold of 4.
    choice = choose([load("a", 0), load("b", 5), load("c", 0)], {"a": 0, "b": 10, "c": 3})
    assert choice == RoutingChoice("c", 3, "balance")  # least loaded; tie a/c broken by most matched
    assert choose([load("b", 0), load("a", 0), load("c", 5)], {}).replica_id == "a"  # then by id
    # At exactly the threshold the load still counts as balanced.
    assert choose([load("a", 0), load("b", 4)], {"b": 10}) == RoutingChoice("b", 10, "prefix")


def test_imbalance_filters_replicas_instead_of_overriding_the_prefix():
    # c is 9 deeper than a (> 4): left out. b is within the threshold and holds 8 of 10 blocks: it wins, although
    # a is less loaded (the rule before 2026-11-25 sent every request to the least loaded as soon as any replica
    # was imbalanced). The reason says a longer match was passed over for balance.
    candidates = [load("a", 0, capacity=16), load("b", 3, capacity=16), load("c", 9, capacity=16)]
    assert choose(candidates, {"b": 8, "c": 10}) == RoutingChoice("b", 8, "balance")
    # Without the deep replica's longer match it is a plain prefix choice.
    assert choose(candidates, {"b": 8, "c": 2}) == RoutingChoice("b", 8, "prefix")
    # Only the excluded replica has a useful match: least loaded, reason balance.
    assert choose(candidates, {"c": 10}) == RoutingChoice("a", 0, "balance")


def test_imbalance_ratio_admits_deep_queues_in_proportion():
    candidates = [load("a", 40, capacity=99), load("b", 55, capacity=99), load("c", 61, capacity=99)]
    matched = {"b": 9, "c": 10}
    # Absolute threshold only: b and c are more than 4 deeper than a.
    assert choose(candidates, matched) == RoutingChoice("a", 0, "balance")
    # 1.5 x 40 = 60: b (55) is admitted, c (61) is not.
    assert choose_replica(candidates, matched, 10, imbalance_threshold=4, min_match_ratio=0.5,
                          imbalance_ratio=1.5) == RoutingChoice("b", 9, "balance")
    assert choose_replica(candidates, matched, 10, imbalance_threshold=4, min_match_ratio=0.5,
                          imbalance_ratio=1.6) == RoutingChoice("c", 10, "prefix")
    # An idle replica admits nothing by ratio (1.5 x 0 = 0): the absolute threshold still applies.
    idle = [load("a", 0, capacity=99), load("b", 6, capacity=99)]
    assert choose_replica(idle, {"b": 10}, 10, imbalance_threshold=4, min_match_ratio=0.5,
                          imbalance_ratio=3.0) == RoutingChoice("a", 0, "balance")


@pytest.mark.parametrize("ratio", [None, 1.25, 2.0])
def test_imbalance_is_bounded_whatever_the_matches(ratio):
    # Safety: no request goes to a replica deeper than the lightest eligible one by more than the threshold
    # (or, with a ratio, more than ratio x the lightest), so a hot prefix cannot starve other replicas' work.
    rng = random.Random(11)
    for _ in range(500):
        threshold = rng.randrange(0, 10)
        candidates = [load(f"r{i}", rng.randrange(0, 40), capacity=64) for i in range(rng.randrange(1, 7))]
        matched = {c.replica_id: rng.randrange(0, 12) for c in candidates}
        choice = choose_replica(candidates, matched, 10, imbalance_threshold=threshold, min_match_ratio=0.1,
                                imbalance_ratio=ratio)
        lightest = min(c.queue_len for c in candidates)
        queue = next(c.queue_len for c in candidates if c.replica_id == choice.replica_id)
        assert queue - lightest <= threshold or (ratio is not None and queue <= ratio * lightest)
        # ... and within that bound the longest useful match is taken.
        admitted = [c for c in candidates if c.queue_len - lightest <= threshold
                    or (ratio is not None and c.queue_len <= ratio * lightest)]
        best = max(min(matched[c.replica_id], 10) for c in admitted)
        if best >= 1:
            assert choice.matched_blocks == best


def test_least_loaded_reason_when_no_useful_prefix():
    choice = choose([load("a", 3), load("b", 1), load("c", 2)], {"a": 4}, ratio=0.5)  # 4/10 < 0.5
    assert choice == RoutingChoice("b", 0, "least_loaded")
    # Ties spread new prefixes: the replica holding fewest blocks, then id.
    assert choose([load("a", 1), load("b", 1)], {}, held={"a": 50, "b": 10}).replica_id == "b"
    assert choose([load("b", 1), load("a", 1)], {}, held={}).replica_id == "a"


def test_zero_match_is_never_a_prefix_choice():
    assert choose([load("a", 1), load("b", 0)], {}, ratio=0.0).reason == "least_loaded"
    assert choose([load("a", 1), load("b", 0)], {}, prompt_blocks=0, ratio=0.0).reason == "least_loaded"
    assert choose([load("a", 1), load("b", 0)], {"a": 1}, ratio=0.0) == RoutingChoice("a", 1, "prefix")


def test_full_replicas_are_excluded_unless_all_are_full():
    candidates = [load("a", 8, capacity=8), load("b", 3, capacity=8), load("c", 2, capacity=4)]
    assert choose(candidates, {"a": 10, "b": 1}, ratio=0.05) == RoutingChoice("b", 1, "prefix")
    # The full replica's long queue does not make the eligible ones look imbalanced (8 - 2 > 4 otherwise).
    assert choose(candidates, {}).reason == "least_loaded"
    all_full = [load("a", 8, capacity=8), load("b", 9, capacity=8)]
    assert choose(all_full, {"b": 10}) == RoutingChoice("b", 10, "prefix")
    assert choose(all_full, {}) == RoutingChoice("a", 0, "least_loaded")


def test_matched_values_are_capped_at_prompt_blocks():
    assert choose([load("a", 0)], {"a": 50}, prompt_blocks=10) == RoutingChoice("a", 10, "prefix")


def test_choice_is_deterministic_and_order_independent():
    rng = random.Random(7)
    for _ in range(200):
        ids = [f"r{i}" for i in range(rng.randrange(1, 6))]
        candidates = [load(i, rng.randrange(10), capacity=rng.randrange(1, 10)) for i in ids]
        matched = {i: rng.randrange(6) for i in ids}
        held = {i: rng.randrange(100) for i in ids}
        kwargs = {"prompt_blocks": 5, "threshold": rng.randrange(4), "ratio": rng.random(), "held": held}
        first = choose(candidates, matched, **kwargs)
        shuffled = candidates[:]
        rng.shuffle(shuffled)
        assert choose(shuffled, dict(reversed(matched.items())), **kwargs) == first
        assert first.reason in ("prefix", "balance", "least_loaded")
        assert first.matched_blocks == matched[first.replica_id]


def test_choice_with_index_end_to_end():
    index = PrefixIndex(block_size=BS, max_blocks_per_replica=100)
    loads = [load("a", 0), load("b", 0)]
    prompt = blocks(1, 2, 3, 4)
    first = choose_replica(loads, index.match(prompt), index.prompt_blocks(prompt), imbalance_threshold=2,
                           min_match_ratio=0.5)
    assert first == RoutingChoice("a", 0, "least_loaded")
    index.insert(first.replica_id, prompt)
    second = choose_replica([load("a", 1), load("b", 0)], index.match(blocks(1, 2, 3, 9)), 4,
                            imbalance_threshold=2, min_match_ratio=0.5)
    assert second == RoutingChoice("a", 3, "prefix")


@pytest.mark.parametrize("candidates, kwargs, field", [
    ([], {}, "candidates"),
    ([load("a", 0), load("a", 1)], {}, "candidates"),
    ([load("a", 0)], {"prompt_blocks": -1}, "prompt_blocks"),
    ([load("a", 0)], {"threshold": -1}, "imbalance_threshold"),
    ([load("a", 0)], {"ratio": 1.5}, "min_match_ratio"),
])
def test_choose_rejects_bad_input(candidates, kwargs, field):
    with pytest.raises(ValueError, match=field):
        choose(candidates, {}, **kwargs)


@pytest.mark.parametrize("value", [0.5, float("inf"), float("nan"), True, "2"])
def test_choose_rejects_bad_imbalance_ratio(value):
    with pytest.raises(ValueError, match="imbalance_ratio"):
        choose_replica([load("a", 0)], {}, 1, imbalance_threshold=4, min_match_ratio=0.1, imbalance_ratio=value)


@pytest.mark.parametrize("args, field", [
    (("", 0, 1), "replica_id"),
    (("a", -1, 1), "queue_len"),
    (("a", 0, 0), "capacity"),
])
def test_replica_load_validates(args, field):
    with pytest.raises(ValueError, match=field):
        ReplicaLoad(*args)
