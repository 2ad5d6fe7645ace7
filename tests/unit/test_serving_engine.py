"""The LLM engine and its three-tier prefix cache: exact outputs, reuse, spill and reload, batching, limits."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.runtime.engine import (
    EngineOverloaded,
    EngineRequestInvalid,
    GenerationRequest,
    LLMEngine,
    _holdback,
)
from inference.runtime.engine_config import EngineConfig
from inference.runtime.kv_cache import TieredPrefixCache
from jobs.runtime.lm import ByteTokenizer, LMConfig, build_model, generate

SHAPE = {"context": 128, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
TOK = ByteTokenizer()
PROMPTS = ["Once upon a time there was a robot", "Once upon a time there was a robot who liked tea",
           "A completely different prompt, longer than a block"]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(LMConfig.from_dict(SHAPE), seed=7).eval()


def make_engine(model, tmp_path, **config):
    settings = {"slots": 3, "block_size": 8, "device_cache_blocks": 64, "host_cache_blocks": 0,
                "disk_cache_blocks": 0, **config}
    return LLMEngine(model, EngineConfig.from_dict(settings), cache_dir=str(tmp_path / "kv")).start()


def run(engine, prompt: str, **kw) -> tuple[str, dict]:
    events = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode(prompt), **kw), timeout_s=30))
    assert events[-1]["type"] == "done", events[-1]
    return "".join(e["text"] for e in events if e["type"] == "token"), events[-1]


def test_greedy_output_equals_the_reference_generator_with_and_without_cache_hits(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        for _ in range(2):  # the second pass reuses cached prefixes
            for prompt in PROMPTS:
                text, done = run(engine, prompt, max_tokens=24)
                assert text == generate(model, TOK, prompt, max_new_tokens=24)
                assert done["finish_reason"] == "length" and done["metrics"]["output_tokens"] == 24
        assert engine.stats()["cached_tokens"] > 0
    finally:
        engine.stop()


def test_cached_prefix_is_reused_and_measured(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        _, first = run(engine, PROMPTS[0], max_tokens=4)
        _, second = run(engine, PROMPTS[1], max_tokens=4)
        assert first["metrics"]["cached_tokens"] == 0
        # "Once upon a time there was a robot" is 34 bytes: 4 whole blocks of 8 are shared
        assert second["metrics"]["cached_tokens"] == 32
        assert second["metrics"]["cached_blocks_by_tier"] == {"device": 4, "host": 0, "disk": 0}
        m = second["metrics"]
        assert m["ttft_s"] >= m["queue_s"] >= 0 and m["tpot_s"] > 0 and m["prompt_tokens"] == 48
    finally:
        engine.stop()


def test_blocks_spilled_to_host_and_disk_are_loaded_back_with_identical_outputs(model, tmp_path):
    engine = make_engine(model, tmp_path, device_cache_blocks=2, host_cache_blocks=2, disk_cache_blocks=64)
    try:
        reference = [run(engine, p, max_tokens=16)[0] for p in PROMPTS]
        engine.cache.flush()  # disk writes happen in the background
        cache = engine.cache.stats.to_dict()
        assert cache["spilled_to_host"] > 0 and cache["spilled_to_disk"] > 0
        assert list((tmp_path / "kv").glob("*.kv"))  # real files on the disk tier
        again = [run(engine, p, max_tokens=16) for p in PROMPTS]
        assert [text for text, _ in again] == reference
        tiers = {tier: sum(done["metrics"]["cached_blocks_by_tier"][tier] for _, done in again)
                 for tier in ("device", "host", "disk")}
        assert tiers["disk"] > 0 and tiers["host"] + tiers["device"] > 0
        assert engine.cache.stats.loaded_from_disk == tiers["disk"]
    finally:
        engine.stop()
    assert not list((tmp_path / "kv").glob("*.kv.tmp"))


def test_device_only_cache_drops_what_it_cannot_hold(model, tmp_path):
    engine = make_engine(model, tmp_path, device_cache_blocks=2)
    try:
        for p in PROMPTS:
            run(engine, p, max_tokens=2)
        assert engine.cache.blocks_in("device") == 2 and engine.cache.stats.dropped_blocks > 0
        assert not (tmp_path / "kv").exists() or not list((tmp_path / "kv").glob("*.kv"))
    finally:
        engine.stop()


def test_concurrent_requests_are_batched_and_each_gets_its_own_exact_answer(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=3)
    results: dict[int, str] = {}

    def worker(i: int) -> None:
        results[i] = run(engine, PROMPTS[i % 3], max_tokens=20)[0]

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(9)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert all(results[i] == generate(model, TOK, PROMPTS[i % 3], max_new_tokens=20) for i in range(9))
        stats = engine.stats()
        assert stats["finished"] == 9 and stats["running"] == 0
        # fewer iterations than the sequential total (9 x 20) shows sequences were decoded together
        assert stats["iterations"] < 9 * 20
    finally:
        engine.stop()


def test_stop_string_ends_the_output_before_it_and_is_never_streamed(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        full, _ = run(engine, PROMPTS[2], max_tokens=30)
        stop = full[5:7]
        text, done = run(engine, PROMPTS[2], max_tokens=30, stop=(stop,))
        assert done["finish_reason"] == "stop"
        assert text == full[: full.find(stop)]
    finally:
        engine.stop()


def test_sampling_is_reproducible_for_a_seed(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        a, _ = run(engine, PROMPTS[0], max_tokens=20, temperature=1.0, seed=3)
        b, _ = run(engine, PROMPTS[0], max_tokens=20, temperature=1.0, seed=3)
        assert a == b
    finally:
        engine.stop()


def test_prompt_too_long_or_empty_is_refused(model, tmp_path):
    engine = make_engine(model, tmp_path, max_prompt_tokens=20)
    try:
        with pytest.raises(EngineRequestInvalid, match="at most 20"):
            engine.submit(GenerationRequest(prompt_tokens=[65] * 21), lambda e: None)
        with pytest.raises(EngineRequestInvalid, match="empty"):
            engine.submit(GenerationRequest(prompt_tokens=[]), lambda e: None)
    finally:
        engine.stop()


def test_output_stops_at_the_model_window(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        text, done = run(engine, "x" * 120, max_tokens=50)
        # positions 120..127 take 8 decode steps after the prefill's token; the last is predicted from a full window
        assert done["finish_reason"] == "length" and done["metrics"]["output_tokens"] == 128 - 120 + 1
    finally:
        engine.stop()


def test_a_prompt_beyond_4096_tokens_is_served_exactly_cold_and_from_each_tier(tmp_path):
    """A model whose window is longer than 4,096 tokens (the old limit); the cold prefill (plain causal attention,
    no mask) and prefills after a hit in each tier give the greedy tokens of the model's own forward pass. Sharp
    weights, so that reading a wrong key or value, or attending to a later token, changes the output."""
    model = build_model(LMConfig.from_dict({**SHAPE, "context": 4_200}), seed=5).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(8.0)
    story = TOK.encode("".join(f"Chapter {i}: the robot counted {i * 7 % 13} cups of tea. " for i in range(200)))
    story = story[:4_100]
    follow_up = story + TOK.encode(" And then?")

    def greedy(ids: list[int], n: int) -> list[int]:
        with torch.no_grad():
            for _ in range(n):
                ids = ids + [int(torch.argmax(model(torch.tensor([ids]))[0, -1, :256]))]
        return ids[-n:]

    expected = {"story": greedy(story, 6), "follow_up": greedy(follow_up, 6)}
    assert len(set(expected["story"] + expected["follow_up"])) > 3
    engine = make_engine(model, tmp_path, block_size=64, device_cache_blocks=64, host_cache_blocks=64,
                         disk_cache_blocks=256)
    generated: list[int] = []
    accept = engine._accept_token  # every token, also those the stream holds back as part of a character
    engine.__dict__["_accept_token"] = lambda seq, token: (generated.append(token), accept(seq, token))

    def serve(prompt: list[int], max_tokens: int) -> tuple[list[int], dict]:
        generated.clear()
        events = list(engine.generate(GenerationRequest(prompt_tokens=prompt, max_tokens=max_tokens), timeout_s=30))
        assert events[-1]["type"] == "done", events[-1]
        return list(generated), events[-1]["metrics"]

    try:
        ids, metrics = serve(story, 6)
        assert ids == expected["story"] and metrics["cached_tokens"] == 0
        for tier in ("device", "host", "disk"):
            if tier != "device":  # unrelated prompts push the story's 64 blocks to host DRAM, then to disk
                for i in range(2 if tier == "host" else 4):
                    serve(TOK.encode(chr(65 + i) * 2_100 + tier), 1)
                engine.cache.flush()
            ids, metrics = serve(follow_up, 6)
            assert metrics["cached_blocks_by_tier"][tier] == 64, (tier, metrics)
            assert ids == expected["follow_up"], tier
    finally:
        engine.stop()

def test_full_engine_refuses_instead_of_queueing_forever(model, tmp_path):
    engine = LLMEngine(model, EngineConfig.from_dict({"slots": 1, "max_waiting": 1, "block_size": 8}))
    try:  # not started: nothing is admitted, so the queue fills
        engine.submit(GenerationRequest(prompt_tokens=[65] * 4), lambda e: None)  # waits (1 of 1)
        engine._running.append(object())  # the single slot is busy
        with pytest.raises(EngineOverloaded):
            engine.submit(GenerationRequest(prompt_tokens=[65] * 4), lambda e: None)
        assert engine.counters["rejected"] == 1
    finally:
        engine._running.clear()
        engine.stop()


def test_cancelled_request_frees_its_slot(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=1)
    try:
        seen = []
        request_id = engine.submit(GenerationRequest(prompt_tokens=TOK.encode(PROMPTS[0]), max_tokens=100),
                                   seen.append)
        engine.cancel(request_id)
        text, done = run(engine, PROMPTS[1], max_tokens=5)
        assert done["finish_reason"] == "length"
        assert not any(e["type"] == "done" for e in seen)
    finally:
        engine.stop()


def test_holdback_keeps_a_possible_stop_prefix():
    assert _holdback("hello wor", ["world"]) == 3
    assert _holdback("hello", ["xyz"]) == 0
    assert _holdback("ab", ["b", "abc"]) == 2


@pytest.mark.parametrize(("field", "value"), [("slots", 0), ("block_size", 0), ("device_cache_blocks", -1),
                                              ("torch_threads", 0), ("nope", 1)])
def test_engine_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig.from_dict({field: value})


def test_cache_lru_moves_leaves_down_first_and_drops_subtrees_off_the_last_tier(tmp_path):
    cache = TieredPrefixCache(block_size=2, device_blocks=2, host_blocks=1, disk_blocks=1, disk_dir=tmp_path)
    kv = [torch.full((1,), float(i)) for i in range(4)]
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], kv)  # a chain of 4 blocks: the two deepest go down
    assert (cache.blocks_in("device"), cache.blocks_in("host"), cache.blocks_in("disk")) == (2, 1, 1)
    cache.flush()
    assert len(list(tmp_path.glob("*.kv"))) == 1  # the disk tier's block is a real file
    hit = cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert hit.num_blocks == 4 and [float(b) for b in hit.blocks] == [0.0, 1.0, 2.0, 3.0]
    assert hit.found_in == {"device": 2, "host": 1, "disk": 1}
    cache.insert([9, 9, 9, 9, 9, 9], [torch.zeros(1)] * 3)  # pushes the old chain's tail off the disk tier
    assert cache.stats.dropped_blocks > 0
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]).num_blocks < 4
    cache.close()


def test_partial_blocks_are_never_cached_or_matched(tmp_path):
    cache = TieredPrefixCache(block_size=4, device_blocks=8)
    cache.insert([1, 2, 3], [torch.zeros(1)])
    assert cache.blocks_in("device") == 0
    cache.insert([1, 2, 3, 4, 5], [torch.zeros(1)])
    assert cache.match([1, 2, 3, 4, 5, 6]).num_blocks == 1
    assert cache.match([1, 2, 3]).num_blocks == 0


def test_a_block_read_back_while_its_write_is_pending_is_served_from_memory_and_no_file_is_left(tmp_path):
    cache = TieredPrefixCache(block_size=2, device_blocks=1, host_blocks=0, disk_blocks=8, disk_dir=tmp_path)
    cache._writes.put(None)  # stop the background writer: spilled blocks now wait in its queue
    cache._writer.join(timeout=5)
    cache.insert([1, 2, 3, 4], [torch.full((3,), 1.0), torch.full((3,), 2.0)])
    assert cache.blocks_in("disk") == 1 and not list(tmp_path.glob("*.kv"))
    hit = cache.match([1, 2, 3, 4])  # reads the spilled block while its write is still queued
    assert [b.tolist() for b in hit.blocks] == [[1.0] * 3, [2.0] * 3] and hit.found_in["disk"] == 1
    cache._writes.put(None)
    cache._write_loop()  # drain the queued writes here, up to the sentinel
    on_disk = {p.name for p in tmp_path.glob("*.kv")}
    assert len(on_disk) == cache.blocks_in("disk")  # the file of the block read back was not kept
    cache.close()
    assert not list(tmp_path.glob("*.kv*"))



def test_cancelling_finished_requests_leaves_nothing_behind(model, tmp_path):
    engine = make_engine(model, tmp_path)
    try:
        for _ in range(5):
            events = []
            request_id = engine.submit(GenerationRequest(prompt_tokens=TOK.encode(PROMPTS[0]), max_tokens=2),
                                       events.append)
            while not events or events[-1]["type"] != "done":
                threading.Event().wait(0.01)
            engine.cancel(request_id)  # what a replica does after every stream, finished or not
        assert engine._cancelled == set()
    finally:
        engine.stop()


def test_a_started_engine_keeps_its_temporaries_on_the_heap_and_says_so(model, tmp_path):
    import platform

    from inference.runtime.engine import tune_host_allocator

    engine = make_engine(model, tmp_path)
    try:
        said = engine.stats()["allocator"]
        if platform.libc_ver()[0] == "glibc":
            assert said.startswith("glibc: mmap threshold 32 MiB"), said
        else:
            assert said.startswith("default"), said
        assert tune_host_allocator() == said  # idempotent: a second replica in the process sets the same
    finally:
        engine.stop()


def test_decoding_is_exact_whether_the_batchs_slots_are_contiguous_or_not(tmp_path):
    """Slots 0-2 start together; the middle one finishes first, so later steps decode slots {0, 2}: a contiguous
    batch reads keys and values as a view of the slot cache, a gapped one gathers them; both give `generate`'s.
    The weights are scaled up: a small random model repeats one byte whatever attention reads, a sharp one does not."""
    from inference.runtime.engine import LLMEngine
    from inference.runtime.engine_config import EngineConfig

    model = build_model(LMConfig.from_dict(SHAPE), seed=7).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(8.0)
    engine = LLMEngine(model, EngineConfig.from_dict({"slots": 3, "block_size": 8, "device_cache_blocks": 64,
                                                      "host_cache_blocks": 0, "disk_cache_blocks": 0}),
                       cache_dir=str(tmp_path / "kv"))
    batches: list[tuple[int, ...]] = []
    decode = engine._decode
    engine.__dict__["_decode"] = lambda seqs: (batches.append(tuple(sorted(s.slot for s in seqs))), decode(seqs))
    outputs: dict[int, list[str]] = {0: [], 1: [], 2: []}
    done = threading.Semaphore(0)
    lengths = (24, 3, 24)
    for i, max_tokens in enumerate(lengths):
        def emit(event, i=i):
            if event["type"] == "token":
                outputs[i].append(event["text"])
            if event["type"] in ("done", "error"):
                done.release()
        engine.submit(GenerationRequest(prompt_tokens=TOK.encode(PROMPTS[i]), max_tokens=max_tokens), emit)
    engine.start()  # all three are admitted in the first iteration
    try:
        for _ in lengths:
            assert done.acquire(timeout=30)
    finally:
        engine.stop()
    for i, max_tokens in enumerate(lengths):
        expected = generate(model, TOK, PROMPTS[i], max_new_tokens=max_tokens)
        assert "".join(outputs[i]) == expected
        assert max_tokens < 24 or len(set(expected)) > 5  # varied output: a wrong key or value shows
    assert (0, 1, 2) in batches and (0, 2) in batches


def test_the_kv_memory_of_a_replica_is_counted_as_the_engine_allocates_it(model, tmp_path, monkeypatch):
    from inference.runtime.engine_config import kv_memory_bytes, kv_memory_refusal, replica_kv_limit_bytes

    shape = model.config.to_dict()
    config = EngineConfig(slots=3, block_size=8, device_cache_blocks=10, host_cache_blocks=20)
    per_token = 2 * shape["n_layers"] * shape["d_model"] * 4  # keys and values, float32
    assert kv_memory_bytes(shape, config) == per_token * (3 * shape["context"] + 30 * 8)
    engine = LLMEngine(model, config, cache_dir=str(tmp_path / "kv"))  # its slot caches: the first term exactly
    assert sum(t.numel() * t.element_size() for t in engine._k + engine._v) == per_token * 3 * shape["context"]
    assert kv_memory_refusal(shape, config, kv_memory_bytes(shape, config)) == ""
    assert "312.0 KiB of keys and values" in kv_memory_refusal(shape, config, kv_memory_bytes(shape, config) - 1)
    for bad, message in (("lots", "is not a number of GiB"), ("inf", "must be a finite number"),
                         ("1e-12", "must be a finite number"), ("-1", "must be a finite number")):
        monkeypatch.setenv("FLEETYARD_REPLICA_KV_LIMIT_GIB", bad)
        with pytest.raises(ValueError, match=f"FLEETYARD_REPLICA_KV_LIMIT_GIB={bad!r} {message}"):
            replica_kv_limit_bytes()
    monkeypatch.setenv("FLEETYARD_REPLICA_KV_LIMIT_GIB", "0.5")
    assert replica_kv_limit_bytes() == 512 * 1024 ** 2


def test_a_long_new_part_after_a_cached_prefix_is_attended_in_two_merged_halves_exactly(tmp_path):
    """After a cached prefix, a new part of SPLIT_PREFILL_FROM tokens or more is attended as the cached half (all
    visible) and the new half (causal), merged by log-sum-exp: the same attention as one masked SDPA, and the same
    greedy tokens as the model's own forward pass (sharp weights: attending to a later token would show)."""
    import torch.nn.functional as F

    from inference.runtime import engine as engine_module

    q, keys, values = torch.randn(1, 4, 300, 8), torch.randn(1, 4, 364, 8), torch.randn(1, 4, 364, 8)
    mask = torch.ones(300, 364, dtype=torch.bool).tril(diagonal=64)
    merged = engine_module._attend_after_prefix(q, keys, values, 64)
    assert torch.allclose(merged, F.scaled_dot_product_attention(q, keys, values, attn_mask=mask), atol=1e-5)

    model = build_model(LMConfig.from_dict({**SHAPE, "context": 1_024}), seed=3).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(8.0)
    head = TOK.encode("The robot poured tea for the cat. " * 3)[:64]
    tail = TOK.encode("".join(f"Then it counted {i * 5 % 11} spoons. " for i in range(40)))[:400]

    def greedy(ids: list[int], n: int) -> list[int]:
        with torch.no_grad():
            for _ in range(n):
                ids = ids + [int(torch.argmax(model(torch.tensor([ids]))[0, -1, :256]))]
        return ids[-n:]

    expected = greedy(head + tail, 5)
    engine = make_engine(model, tmp_path, block_size=64, device_cache_blocks=16)
    generated: list[int] = []
    accept = engine._accept_token
    engine.__dict__["_accept_token"] = lambda seq, token: (generated.append(token), accept(seq, token))
    calls = []
    split = engine_module._attend_after_prefix
    engine_module._attend_after_prefix = lambda *a: (calls.append(a[3]), split(*a))[1]
    try:
        list(engine.generate(GenerationRequest(prompt_tokens=head + TOK.encode("!"), max_tokens=1), timeout_s=30))
        generated.clear()
        events = list(engine.generate(GenerationRequest(prompt_tokens=head + tail, max_tokens=5), timeout_s=30))
        assert events[-1]["metrics"]["cached_tokens"] == 64
        assert calls and set(calls) == {64}  # the split path ran, after the 64 cached tokens
        assert generated == expected
    finally:
        engine_module._attend_after_prefix = split
        engine.stop()


def test_an_output_that_ends_inside_a_character_ends_with_the_replacement_character(model, tmp_path):
    """Bytes 0xC3 0xA9 are "é"; an output cut after 0xC3 (max_tokens) streams U+FFFD for it, as decoding the whole
    output does, instead of dropping it (the decoder was never flushed)."""
    engine = make_engine(model, tmp_path)
    script = iter([0x68, 0xC3, 0xA9, 0xC3])  # "h", "é", then half of another "é"
    engine.__dict__["_sample"] = lambda seq, logits: next(script)
    try:
        text, done = run(engine, "Once upon a time", max_tokens=4)
    finally:
        engine.stop()
    assert text == bytes([0x68, 0xC3, 0xA9, 0xC3]).decode("utf-8", errors="replace") == "hé\ufffd"
    assert done["finish_reason"] == "length"
