"""benchmarks.routing_bound: prefix ids, cache hits, LRU eviction, the policies and the command's errors."""

import json

import pytest

from benchmarks.mooncake import TraceRequest
from benchmarks.routing_bound import BLOCK_TOKENS, Cache, bound_rows, main, prompts_of, replay


def request(ids, input_length=None, output=10):
    length = input_length if input_length is not None else BLOCK_TOKENS * len(ids)
    return TraceRequest(0.0, length, output, tuple(ids))


def test_prefix_ids_stand_for_the_whole_chain_and_the_last_block_is_partial():
    a, b, c = prompts_of([request([1, 2, 3], input_length=2 * BLOCK_TOKENS + 100), request([1, 2, 9]),
                          request([7, 2, 3])])
    assert a.tokens == (BLOCK_TOKENS, BLOCK_TOKENS, 100)
    assert a.prefixes[:2] == b.prefixes[:2] and a.prefixes[2] != b.prefixes[2]
    assert not set(a.prefixes) & set(c.prefixes)  # the same hash ids after another first block are another prefix


def test_capped_prompts_keep_their_first_blocks_whole():
    (prompt,) = prompts_of([request([1, 2, 3], input_length=2 * BLOCK_TOKENS + 5)], cap_blocks=2)
    assert prompt.tokens == (BLOCK_TOKENS, BLOCK_TOKENS)


def test_a_cache_reuses_the_longest_prefix_and_always_computes_one_token():
    first, second, again = prompts_of([request([1, 2, 3]), request([1, 2, 4]), request([1, 2, 3])])
    cache = Cache()
    assert cache.serve(first) == 0
    assert cache.serve(second) == 2 * BLOCK_TOKENS
    assert cache.serve(again) == 3 * BLOCK_TOKENS - 1


def test_an_lru_cache_drops_the_least_recent_blocks():
    a, b, a_again = prompts_of([request([1, 2]), request([5, 6]), request([1, 2])])
    cache = Cache(capacity=2)
    cache.serve(a)
    cache.serve(b)
    assert cache.serve(a_again) == 0
    unbounded = Cache()
    unbounded.serve(a)
    unbounded.serve(b)
    assert unbounded.serve(a_again) == 2 * BLOCK_TOKENS - 1


def test_affinity_follows_the_prefix_and_the_pooled_cache_holds_everything():
    # two conversations, each turn extending the last: affinity keeps each on one replica
    turns = [request([1, 2]), request([3, 4]), request([1, 2, 5]), request([3, 4, 6]), request([1, 2, 5, 7])]
    prompts = prompts_of(turns)
    affinity = replay(prompts, "affinity", 2)
    pooled = replay(prompts, "pooled", 2)
    assert affinity.cached_tokens == pooled.cached_tokens == (2 + 2 + 3) * BLOCK_TOKENS
    one_replica = replay(prompts, "default", 1)
    assert one_replica.cached_tokens == pooled.cached_tokens


def test_the_default_router_reuses_less_with_more_replicas_and_the_bound_says_so():
    turns = [request([conversation, *range(100 + conversation * 10, 100 + conversation * 10 + turn)])
             for turn in range(1, 6) for conversation in range(20)]
    rows = bound_rows(prompts_of(turns), [1, 4], seeds=3, capacities=[None])
    one, four = rows
    assert one["throughput_bound_pooled"] == pytest.approx(1.0)
    assert four["default_hit_rate"] < one["default_hit_rate"]
    assert four["throughput_bound_pooled"] > 1.2
    assert four["pooled_hit_rate"] == pytest.approx(one["pooled_hit_rate"])


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        replay(prompts_of([request([1])]), "sticky", 2)


def test_the_command_prints_a_table_and_writes_json_and_csv(tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": i, "input_length": 1000, "output_length": 5, "hash_ids": [0, i % 3, i]} for i in range(30)]
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    out_json, out_csv = tmp_path / "bound.json", tmp_path / "bound.csv"
    assert main(["--trace", str(trace), "--replicas", "2", "--cache-blocks", "4,unbounded", "--seeds", "2",
                 "--json", str(out_json), "--csv", str(out_csv)]) == 0
    assert "throughput bound" in capsys.readouterr().out
    rows = json.loads(out_json.read_text())["rows"]
    assert [row["cache_blocks"] for row in rows] == [4, "unbounded"]
    assert out_csv.read_text().startswith("replicas,cache_blocks,")


def test_bad_input_gets_a_message_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5}\n')
    assert main(["--trace", str(bad)]) == 2
    assert "bad.jsonl:1: output_length: missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--trace", str(bad), "--cache-blocks", "lots"])
    assert "--cache-blocks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--trace", str(bad), "--replicas", "0"])
    assert "--replicas" in capsys.readouterr().err
