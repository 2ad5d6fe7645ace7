"""QA of the serving runtime (engine, tiered prefix cache): races and limits found by review, each pinned here."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.runtime.engine import EngineOverloaded, GenerationRequest, LLMEngine
from inference.runtime.engine_config import EngineConfig
from jobs.runtime.lm import ByteTokenizer, LMConfig, build_model

SHAPE = {"context": 128, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
TOK = ByteTokenizer()
PROMPT = "Once upon a time there was a robot who liked tea"


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return build_model(LMConfig.from_dict(SHAPE), seed=7).eval()


def make_engine(model, tmp_path, **config):
    settings = {"slots": 2, "block_size": 8, "device_cache_blocks": 64, "host_cache_blocks": 0,
                "disk_cache_blocks": 0, **config}
    return LLMEngine(model, EngineConfig.from_dict(settings), cache_dir=str(tmp_path / "kv"))


def _during_prefill(engine, action):
    """Runs `action()` once, on the engine thread, while the first admitted request is being prefilled (its
    prefix-cache lookup), as a caller's thread could at that moment."""
    match = engine.cache.match
    done = threading.Event()

    def hooked(tokens):
        if not done.is_set():
            action()
            done.set()
        return match(tokens)

    engine.cache.match = hooked
    return done


def test_a_request_cancelled_while_it_is_prefilled_frees_its_slot_at_once(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=1)
    _during_prefill(engine, lambda: engine.cancel(1))  # the caller went away during the prefill
    events = []
    try:
        engine.start()
        assert engine.submit(GenerationRequest(prompt_tokens=TOK.encode(PROMPT), max_tokens=100), events.append) == 1
        follow = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode("Hi there"), max_tokens=3),
                                      timeout_s=30))
        assert follow[-1]["type"] == "done"
        # the cancelled request did not go on decoding its 100 tokens in the only slot
        assert not any(e["type"] == "done" for e in events)
        assert engine.counters["output_tokens"] == 3
        assert engine._cancelled == set()
    finally:
        engine.stop()


def test_stopping_during_a_prefill_tells_the_request_being_prefilled(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=1)
    events = []
    stopper = threading.Thread(target=engine.stop)

    def stop_meanwhile():
        stopper.start()
        threading.Event().wait(0.2)  # stop() has taken its list of requests to tell

    started = _during_prefill(engine, stop_meanwhile)
    engine.start()
    engine.submit(GenerationRequest(prompt_tokens=TOK.encode(PROMPT), max_tokens=100), events.append)
    assert started.wait(10)
    stopper.join(timeout=20)
    # the request in its prefill when the replica stopped got a final event (before: none, its caller hung)
    assert events and events[-1]["type"] in ("done", "error")


def test_waiting_requests_are_bounded_even_while_a_slot_is_free(model, tmp_path):
    # not started: nothing is admitted, as while the engine thread is busy with a long prefill or decode step
    engine = make_engine(model, tmp_path, slots=1, max_waiting=1)
    try:
        for _ in range(2):  # one for the free slot, one waiting
            engine.submit(GenerationRequest(prompt_tokens=[65] * 4), lambda e: None)
        with pytest.raises(EngineOverloaded):
            engine.submit(GenerationRequest(prompt_tokens=[65] * 4), lambda e: None)
        assert engine.load()["waiting"] == 2 and engine.counters["rejected"] == 1
    finally:
        engine.stop()


def test_a_failed_disk_write_leaves_no_partial_file_and_the_block_is_still_served(tmp_path, monkeypatch):
    from inference.runtime import kv_cache

    cache = kv_cache.TieredPrefixCache(block_size=4, device_blocks=1, disk_blocks=8, disk_dir=tmp_path)
    real_replace = kv_cache.os.replace

    def disk_full(src, dst):  # the temporary file is written (partly, say), then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kv_cache.os, "replace", disk_full)
    try:
        tokens = list(range(8))
        blocks = [torch.full((2, 2, 1, 4, 2), float(j)) for j in range(2)]
        cache.insert(tokens, blocks)  # the first block goes to the disk tier
        cache.flush()
        assert cache.blocks_in("disk") == 1
        assert not list(tmp_path.glob("*.kv.tmp"))  # before: one partial file per failed write, never removed
        hit = cache.match(tokens)
        assert [torch.equal(a, b) for a, b in zip(hit.blocks, blocks, strict=True)] == [True, True]
    finally:
        monkeypatch.setattr(kv_cache.os, "replace", real_replace)
        cache.close()
    assert not list(tmp_path.glob("*.kv*"))


def test_a_request_cancelled_then_failed_by_an_engine_error_leaves_no_cancel_mark(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=1)
    decode = engine._decode
    calls = []

    def cancel_then_fail(seqs):
        if not calls:
            calls.append(1)
            engine.cancel(seqs[0].request_id)  # the caller went away
            raise RuntimeError("boom")  # and the next step failed, before the cancel was acted on
        return decode(seqs)

    engine._decode = cancel_then_fail
    try:
        engine.start()
        events = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode(PROMPT), max_tokens=50),
                                      timeout_s=30))
        assert events[-1]["type"] == "error" and engine.counters["errors"] == 1
        text = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode("Hi"), max_tokens=2), timeout_s=30))
        assert text[-1]["type"] == "done"
        assert engine._cancelled == set()  # before: the failed request's id stayed in the set for good
    finally:
        engine.stop()


def test_a_generate_stream_abandoned_by_its_caller_frees_its_slot(model, tmp_path):
    engine = make_engine(model, tmp_path, slots=1)
    try:
        engine.start()
        stream = engine.generate(GenerationRequest(prompt_tokens=TOK.encode(PROMPT), max_tokens=100), timeout_s=30)
        assert next(stream)["type"] == "token"
        stream.close()  # the caller stops reading (a break, or its timeout)
        events = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode("Hi"), max_tokens=2), timeout_s=30))
        assert events[-1]["type"] == "done"
        # the abandoned request was cancelled, not decoded on to its 100 tokens in the only slot
        assert engine.counters["finished"] == 1 and engine.counters["output_tokens"] == 2
    finally:
        engine.stop()


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_a_disk_block_whose_file_is_gone_or_damaged_is_a_miss_not_a_failure(model, tmp_path, damage):
    engine = make_engine(model, tmp_path, slots=1, device_cache_blocks=1, host_cache_blocks=0, disk_cache_blocks=64)
    try:
        engine.start()
        prompt = TOK.encode(PROMPT)
        request = GenerationRequest(prompt_tokens=prompt, max_tokens=8)
        first = list(engine.generate(request, timeout_s=30))
        engine.cache.flush()
        files = sorted((tmp_path / "kv").glob("*.kv"))
        assert files
        for file in files:  # e.g. a /tmp cleaner, a full disk or a crash of the host took the files
            if damage == "removed":
                file.unlink()
            else:
                file.write_bytes(file.read_bytes()[:10])
        again = list(engine.generate(request, timeout_s=30))
        # before: numpy.fromfile raised in the prefill, failing this (and every co-batched) request, and the
        # broken node stayed in the tree, so every later request with that prefix failed the same way
        assert again[-1]["type"] == "done" and engine.counters["errors"] == 0
        assert [e.get("text") for e in again] == [e.get("text") for e in first]
        assert engine.cache.match(prompt).num_blocks == len(prompt) // 8  # cached again, from the recompute
    finally:
        engine.stop()


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_a_tiny_temperature_samples_greedily_instead_of_failing_the_batch(model, tmp_path, temperature):
    from jobs.runtime.lm import generate

    engine = make_engine(model, tmp_path, slots=2)
    try:
        engine.start()
        # allowed by the API (0..2); before, logits / temperature overflowed, softmax gave NaN and
        # torch.multinomial raised in the engine loop, which fails every request in flight on the replica
        events = list(engine.generate(GenerationRequest(prompt_tokens=TOK.encode(PROMPT), max_tokens=6,
                                                        temperature=temperature), timeout_s=30))
        assert events[-1]["type"] == "done" and engine.counters["errors"] == 0
        text = "".join(e["text"] for e in events if e["type"] == "token")
        assert text == generate(model, TOK, PROMPT, max_new_tokens=6)  # the limit of sampling as t -> 0: greedy
    finally:
        engine.stop()
