"""Mooncake trace reader and request builder (benchmarks/mooncake.py): errors name the line and field, blocks are
deterministic, shared leading hash ids give shared leading tokens, truncation, output and arrival scaling, and
the unbounded-cache reuse fraction."""

from __future__ import annotations

import json

import pytest

from benchmarks import mooncake
from benchmarks.mooncake import (
    BenchRequest,
    ScaleSpec,
    TraceRequest,
    block_tokens_for,
    build_requests,
    describe_scaling,
    read_trace,
    reusable_block_fraction,
)


def _line(timestamp=0, input_length=1024, output_length=100, hash_ids=(0, 1), **extra):
    record = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length,
              "hash_ids": list(hash_ids), **extra}
    return json.dumps(record)


def _write(tmp_path, lines):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _req(timestamp=0, input_length=1024, output_length=100, hash_ids=(0, 1)):
    return TraceRequest(timestamp, input_length, output_length, tuple(hash_ids))


# -- reading ---------------------------------------------------------------------------------------------------

def test_reads_records_skips_blank_lines_and_sorts_stably(tmp_path):
    path = _write(tmp_path, [
        _line(timestamp=2000, hash_ids=[5]),
        "",
        "   ",
        _line(timestamp=1000, hash_ids=[1]),
        _line(timestamp=2000, hash_ids=[6]),
        _line(timestamp=0, input_length=512, output_length=0, hash_ids=[0], extra="ignored"),
    ])
    trace = read_trace(path)
    assert [r.hash_ids for r in trace] == [(0,), (1,), (5,), (6,)]  # 5 before 6: file order among equals
    assert trace[0] == TraceRequest(0, 512, 0, (0,))
    assert trace[-1].blocks == 1


def test_start_and_limit_count_records_in_file_order(tmp_path):
    path = _write(tmp_path, [_line(timestamp=t, hash_ids=[t]) for t in range(10)] + ["", "{broken"])
    assert [r.hash_ids[0] for r in read_trace(path, start=2, limit=3)] == [2, 3, 4]
    assert [r.hash_ids[0] for r in read_trace(path, limit=2)] == [0, 1]  # the broken tail is never read
    assert read_trace(path, limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        read_trace(path, limit=-1)
    with pytest.raises(ValueError, match="start"):
        read_trace(path, start=-1)


@pytest.mark.parametrize("text, field, reason", [
    ("{not json", "json", "invalid JSON"),
    ("[1, 2]", "record", "JSON object"),
    (json.dumps({"input_length": 1, "output_length": 1, "hash_ids": [1]}), "timestamp", "missing"),
    (json.dumps({"timestamp": 0, "output_length": 1, "hash_ids": [1]}), "input_length", "missing"),
    (json.dumps({"timestamp": 0, "input_length": 1, "hash_ids": [1]}), "output_length", "missing"),
    (json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1}), "hash_ids", "missing"),
    (_line(timestamp="5"), "timestamp", "expected a number"),
    (_line(timestamp=-1), "timestamp", ">= 0"),
    (_line(input_length=1.5), "input_length", "expected an integer"),
    (_line(input_length=True), "input_length", "expected an integer"),
    (_line(input_length=-3), "input_length", ">= 0"),
    (_line(output_length=-1), "output_length", ">= 0"),
    (_line(output_length=None), "output_length", "expected an integer"),
    (_line(hash_ids=[]), "hash_ids", "must not be empty"),
    (_line(hash_ids=[1, "2"]), "hash_ids", "item 1: expected an integer"),
    (_line(hash_ids=[1, -2]), "hash_ids", "item 1: must be >= 0"),
    (json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": 7}), "hash_ids", "list"),
])
def test_errors_name_path_line_and_field(tmp_path, text, field, reason):
    path = _write(tmp_path, [_line(), "", text])
    with pytest.raises(ValueError) as error:
        read_trace(path)
    message = str(error.value)
    assert message.startswith(f"{path}:3: {field}: "), message
    assert reason in message


def test_float_timestamps_are_accepted(tmp_path):
    path = _write(tmp_path, [_line(timestamp=1.5)])
    assert read_trace(path)[0].timestamp_ms == 1.5


# -- building --------------------------------------------------------------------------------------------------

def test_blocks_are_deterministic_and_depend_on_the_id():
    block = block_tokens_for(42, 16)
    assert block == block_tokens_for(42, 16)
    assert len(block) == 16 and all(0 <= t < 256 for t in block)
    assert block != block_tokens_for(43, 16)
    assert len({block_tokens_for(i, 16) for i in range(2000)}) == 2000
    long = block_tokens_for(42, 200)  # beyond one blake2b digest
    assert len(long) == 200 and long[:16] == block and len(set(long)) > 50


def test_build_is_deterministic():
    trace = [_req(0, 1500, 300, (0, 1, 2)), _req(10, 700, 50, (0, 3))]
    assert build_requests(trace) == build_requests(list(trace))


def test_prompt_is_concatenation_of_id_blocks():
    scale = ScaleSpec(block_tokens=8)
    (request,) = build_requests([_req(0, 3 * 512, 10, (7, 8, 9))], scale)
    assert request.prompt_tokens == [*block_tokens_for(7, 8), *block_tokens_for(8, 8), *block_tokens_for(9, 8)]
    assert request.hash_ids == (7, 8, 9)


def test_shared_leading_hash_ids_share_leading_tokens_exactly():
    scale = ScaleSpec(block_tokens=16)
    a, b, c = build_requests([
        _req(0, 4 * 512, 10, (0, 1, 2, 3)),
        _req(1, 3 * 512, 10, (0, 1, 9)),
        _req(2, 2 * 512, 10, (5, 1)),
    ], scale)
    assert a.prompt_tokens[:32] == b.prompt_tokens[:32]
    assert a.prompt_tokens[32:48] != b.prompt_tokens[32:48]
    assert c.prompt_tokens[:16] != a.prompt_tokens[:16]


def test_last_block_is_truncated_proportionally():
    scale = ScaleSpec(block_tokens=16)
    lengths = {
        2 * 512: 32,       # full last block
        512 + 256: 24,     # half: 8 tokens
        512 + 100: 16 + 4,  # 100/512 of 16 = 3.1 -> rounded up to 4
        512 + 1: 17,       # at least one token
        3: 1,              # a one-block prompt of 3 tokens keeps 1 token
    }
    for input_length, expected in lengths.items():
        ids = (1, 2) if input_length > 512 else (1,)
        (request,) = build_requests([_req(0, input_length, 10, ids)], scale)
        assert len(request.prompt_tokens) == expected, input_length
        full = [token for hash_id in ids for token in block_tokens_for(hash_id, 16)]
        assert request.prompt_tokens == full[:expected]
    # An input_length beyond the ids' blocks cannot make the last block longer than a block.
    (request,) = build_requests([_req(0, 5000, 10, (1, 2))], scale)
    assert len(request.prompt_tokens) == 32


def test_max_prompt_blocks_keeps_leading_whole_blocks():
    scale = ScaleSpec(block_tokens=4, max_prompt_blocks=2)
    (long, short) = build_requests([_req(0, 3 * 512 + 10, 10, (1, 2, 3, 4)), _req(1, 512 + 128, 10, (1, 2))],
                                   scale)
    assert long.prompt_tokens == [*block_tokens_for(1, 4), *block_tokens_for(2, 4)]
    assert long.hash_ids == (1, 2)
    assert short.prompt_tokens == [*block_tokens_for(1, 4), block_tokens_for(2, 4)[0]]  # its own last block


def test_output_scaling_rounds_and_clamps():
    scale = ScaleSpec(output_scale=1 / 16, min_output_tokens=2, max_output_tokens=64)
    trace = [_req(i, 512, out, (i,)) for i, out in enumerate([0, 8, 40, 160, 343, 1024, 5000])]
    assert [r.max_tokens for r in build_requests(trace, scale)] == [2, 2, 2, 10, 21, 64, 64]
    assert build_requests([_req(0, 512, 100, (0,))], ScaleSpec(output_scale=1.0, max_output_tokens=1000))[0] \
        .max_tokens == 100


def test_arrivals_are_relative_to_the_first_and_scaled():
    trace = [_req(5000, 512, 1, (0,)), _req(7500, 512, 1, (1,)), _req(15000, 512, 1, (2,))]
    assert [r.arrival_s for r in build_requests(trace)] == [0.0, 2.5, 10.0]
    assert [r.arrival_s for r in build_requests(trace, ScaleSpec(time_scale=0.5))] == [0.0, 1.25, 5.0]
    assert [r.arrival_s for r in build_requests(trace, ScaleSpec(time_scale=0))] == [0.0, 0.0, 0.0]
    # Unsorted input comes out in timestamp order.
    assert [r.hash_ids for r in build_requests(trace[::-1])] == [(0,), (1,), (2,)]
    assert build_requests([]) == []


@pytest.mark.parametrize("kwargs, field", [
    ({"block_tokens": 0}, "block_tokens"),
    ({"trace_block_tokens": 0}, "trace_block_tokens"),
    ({"output_scale": -1.0}, "output_scale"),
    ({"time_scale": float("inf")}, "time_scale"),
    ({"min_output_tokens": 5, "max_output_tokens": 4}, "max_output_tokens"),
    ({"min_output_tokens": -1}, "min_output_tokens"),
    ({"max_prompt_blocks": 0}, "max_prompt_blocks"),
])
def test_scale_spec_validates(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ScaleSpec(**kwargs)


def test_describe_scaling_mentions_the_factors():
    text = describe_scaling(ScaleSpec(block_tokens=16, time_scale=0.25, max_prompt_blocks=64))
    assert "32x" in text and "16 synthetic token ids" in text
    assert "0.0625" in text and "[1, 64]" in text
    assert "4x as fast" in text and "first 64 blocks" in text
    assert "\n" not in text
    assert "same request rate" in describe_scaling(ScaleSpec())
    assert "time 0" in describe_scaling(ScaleSpec(time_scale=0))


def test_bench_request_fields():
    (request,) = build_requests([_req(0, 512, 16, (3,))])
    assert isinstance(request, BenchRequest)
    assert request.max_tokens == 1 and request.arrival_s == 0.0 and len(request.prompt_tokens) == 16


# -- reuse fraction --------------------------------------------------------------------------------------------

def test_reusable_block_fraction_on_a_hand_made_trace():
    trace = [
        _req(0, 0, 0, (0, 1, 2)),  # 3 new
        _req(1, 0, 0, (0, 1, 3)),  # 0, 0-1 reused; 3 new
        _req(2, 0, 0, (0, 1, 2, 4)),  # 0, 0-1, 0-1-2 reused; 4 new
        _req(3, 0, 0, (5, 1)),  # 1 at another position after another block: a different prefix, new
        _req(4, 0, 0, (5,)),  # reused
    ]
    assert reusable_block_fraction(trace) == pytest.approx(6 / 13)
    assert reusable_block_fraction([]) == 0.0
    assert reusable_block_fraction(trace[:1]) == 0.0


@pytest.mark.skipif(not mooncake.TRACE_PATH.exists(), reason="shared Mooncake trace not present")
def test_reusable_fraction_on_the_real_trace_head():
    trace = read_trace(mooncake.TRACE_PATH, limit=2000)
    assert len(trace) == 2000
    fraction = reusable_block_fraction(trace)
    assert 0.0 < fraction < 1.0
    requests = build_requests(trace[:50], ScaleSpec())
    assert all(1 <= len(r.prompt_tokens) <= 16 * len(r.hash_ids) for r in requests)
    assert requests[0].arrival_s == 0.0


@pytest.mark.skipif(not mooncake.TRACE_PATH.exists(), reason="shared Mooncake trace not present")
def test_reusable_fraction_on_the_whole_trace_matches_the_published_figure():
    trace = read_trace(mooncake.TRACE_PATH)
    assert len(trace) == 12_031
    assert reusable_block_fraction(trace) == pytest.approx(mooncake.PUBLISHED_REUSABLE_FRACTION, abs=0.001)
