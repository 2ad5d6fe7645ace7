"""Tests of the built-in training workload: corpus, byte tokenizer, hyperparameters, tiny transformer and its state."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from jobs.runtime.corpus import CORPUS_NAME, corpus_bytes, generate_corpus
from jobs.runtime.lm import (
    BOS_ID,
    EOS_ID,
    ByteTokenizer,
    LMConfig,
    TinyTransformerLM,
    TrainHyperparameters,
    batch_for_step,
    build_model,
    evaluate_loss,
    generate,
    learning_rate,
    load_model_for_inference,
    load_model_state,
    make_optimizer,
    model_state_bytes,
    tokens_from_bytes,
    train_step,
    write_random_model_dir,
)

# A model small enough that every test here runs in well under a second on one CPU thread.
SMALL = {"context": 32, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "batch_size": 8}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return tokens_from_bytes(corpus_bytes(0, 3000))


def _hp(**overrides) -> TrainHyperparameters:
    return TrainHyperparameters.from_dict({**SMALL, "steps": 60, "warmup_steps": 5, **overrides})


def _train(model, optimizer, tokens, hp, steps, *, rank=0, world_size=1, all_reduce=None) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch_for_step(tokens, step=step, rank=rank, world_size=world_size, batch_size=hp.batch_size,
                              context=hp.context, seed=hp.seed)
        losses.append(train_step(model, optimizer, x, y, step=step, hp=hp, all_reduce=all_reduce))
    return losses


# --------------------------------------------------------------------------------------------------- corpus


def test_corpus_is_deterministic_for_a_seed_and_differs_between_seeds():
    assert CORPUS_NAME == "fleetyard-tiny-tales"
    a = generate_corpus(seed=3, n_sentences=500)
    assert a == generate_corpus(seed=3, n_sentences=500)
    assert a != generate_corpus(seed=4, n_sentences=500)
    assert corpus_bytes(3, 500) == a.encode("utf-8")


def test_corpus_default_size_and_shape():
    text = generate_corpus()
    assert 600_000 < len(text.encode("utf-8")) < 2_000_000
    assert text.count(".") + text.count("?") + text.count("!") >= 20_000
    tales = text.strip().split("\n")
    assert len(tales) > 1000
    assert len(set(tales)) > 0.95 * len(tales)  # varied: tales rarely repeat
    assert generate_corpus(n_sentences=0) == ""


# --------------------------------------------------------------------------------------------------- tokenizer


def test_byte_tokenizer_round_trip_including_non_ascii():
    tok = ByteTokenizer()
    assert tok.vocab_size == 258 and (BOS_ID, EOS_ID) == (256, 257)
    text = "Mia found a shiny shell. Ça va? 東京 🚀"
    ids = tok.encode(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    with_bos = tok.encode(text, add_bos=True)
    assert with_bos[0] == BOS_ID and with_bos[1:] == ids
    assert tok.decode([*with_bos, EOS_ID]) == text  # specials are skipped
    assert tok.decode([0xE6, 0x9D]) == "\ufffd"  # a cut multi-byte sequence is replaced, not raised


# --------------------------------------------------------------------------------------------------- hyperparameters


def test_hyperparameter_defaults_and_model_config():
    hp = TrainHyperparameters.from_dict({})
    assert hp == TrainHyperparameters()
    assert (hp.steps, hp.batch_size, hp.lr, hp.warmup_steps, hp.seed) == (200, 16, 3e-3, 10, 0)
    assert hp.model_config() == LMConfig()
    assert TrainHyperparameters.from_dict(hp.to_dict()) == hp
    assert TrainHyperparameters.from_dict({"lr": 1}).lr == 1.0 and isinstance(TrainHyperparameters(lr=1).lr, float)
    assert LMConfig.from_dict(LMConfig(d_model=96, n_heads=3).to_dict()) == LMConfig(d_model=96, n_heads=3)


@pytest.mark.parametrize(("payload", "prefix"), [
    ({"bogus": 1}, "bogus:"),
    ({"lr": -0.1}, "lr: must be a positive number"),
    ({"lr": 0}, "lr: must be a positive number"),
    ({"lr": float("nan")}, "lr:"),
    ({"lr": "0.1"}, "lr:"),
    ({"steps": True}, "steps: must be an integer"),
    ({"steps": 2.0}, "steps: must be an integer"),
    ({"steps": 0}, "steps:"),
    ({"steps": 1_000_001}, "steps:"),
    ({"batch_size": -1}, "batch_size:"),
    ({"d_model": 30, "n_heads": 4}, "d_model: must be divisible by n_heads"),
    ({"d_model": 8192, "n_heads": 4}, "d_model:"),
    ({"context": 5000}, "context:"),
    ({"weight_decay": -1}, "weight_decay:"),
    ({"grad_clip": 0}, "grad_clip:"),
    ({"seed": -1}, "seed:"),
    ({"step_sleep_s": -0.5}, "step_sleep_s:"),
    ({"warmup_steps": False}, "warmup_steps:"),
])
def test_hyperparameter_validation_names_the_field(payload, prefix):
    with pytest.raises(ValueError) as excinfo:
        TrainHyperparameters.from_dict(payload)
    assert str(excinfo.value).startswith(prefix), str(excinfo.value)


def test_learning_rate_warms_up_then_decays_to_a_tenth():
    hp = TrainHyperparameters(steps=110, warmup_steps=10, lr=1e-2)
    assert learning_rate(0, hp) == pytest.approx(1e-3)
    assert learning_rate(9, hp) == pytest.approx(1e-2)
    assert learning_rate(10, hp) == pytest.approx(1e-2)
    assert learning_rate(60, hp) == pytest.approx(0.55e-2)
    assert learning_rate(110, hp) == pytest.approx(1e-3)
    values = [learning_rate(s, hp) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


# --------------------------------------------------------------------------------------------------- model


def test_a_model_may_declare_a_longer_window_than_training_accepts():
    """Positions are a learned table of `context` rows: a served model's window (e.g. 16K tokens for the
    long-prompt benchmark) may reach 32,768; a training job's stays at 4,096."""
    assert LMConfig.from_dict({"context": 16_456}).context == 16_456
    assert LMConfig(context=32_768).context == 32_768
    with pytest.raises(ValueError, match="context: must be between 1 and 32768"):
        LMConfig(context=32_769)
    with pytest.raises(ValueError, match="context: must be between 1 and 4096"):
        TrainHyperparameters(context=4097)
    model = build_model(LMConfig(context=5000, d_model=8, n_heads=2, n_layers=1, d_ff=16), seed=0)
    assert model.pos_emb.weight.shape == (5000, 8)
    with torch.no_grad():
        assert model(torch.zeros(1, 5000, dtype=torch.long)).shape == (1, 5000, 258)

def test_model_shapes_tied_head_and_deterministic_init():
    config = LMConfig(context=16, d_model=32, n_heads=4, n_layers=2, d_ff=64)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model = build_model(config, seed=7)
    assert torch.equal(torch.rand(1), before), "build_model must not consume the global RNG"
    assert isinstance(model, TinyTransformerLM)
    idx = torch.randint(0, 258, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 258)
    assert model(idx[:, :5]).shape == (3, 5, 258)
    assert model.loss(idx, idx).shape == ()
    assert "head.weight" not in model.state_dict()  # the output head is the token embedding
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 17, dtype=torch.long))
    same, other = build_model(config, seed=7), build_model(config, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(), strict=True))
    assert not torch.equal(model.tok_emb.weight, other.tok_emb.weight)


def test_model_is_causal():
    model = build_model(LMConfig(context=16, d_model=32, n_heads=4, n_layers=2, d_ff=64), seed=0)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert torch.equal(a[:, :10], b[:, :10]), "earlier positions must not see a later token"
    assert not torch.allclose(a[:, 10:], b[:, 10:]), "the changed and later positions must see it"


# --------------------------------------------------------------------------------------------------- batches


def test_tokens_from_bytes():
    t = tokens_from_bytes("aé".encode())
    assert t.dtype == torch.long and t.tolist() == [97, 195, 169]
    assert tokens_from_bytes(b"").numel() == 0


def test_batch_for_step_is_deterministic_and_differs_by_rank_and_step(tokens):
    kw = {"world_size": 2, "batch_size": 4, "context": 16, "seed": 5}
    x, y = batch_for_step(tokens, step=3, rank=0, **kw)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    x2, y2 = batch_for_step(tokens, step=3, rank=0, **kw)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, batch_for_step(tokens, step=3, rank=1, **kw)[0])
    assert not torch.equal(x, batch_for_step(tokens, step=4, rank=0, **kw)[0])
    assert not torch.equal(x, batch_for_step(tokens, step=3, rank=0, **{**kw, "seed": 6})[0])
    with pytest.raises(ValueError, match="rank"):
        batch_for_step(tokens, step=0, rank=2, **kw)
    with pytest.raises(ValueError, match="tokens"):
        batch_for_step(tokens[:10], step=0, rank=0, **kw)


# --------------------------------------------------------------------------------------------------- training


def test_loss_falls_on_the_corpus(tokens):
    hp = _hp(lr=1e-2)
    model = build_model(hp.model_config(), seed=hp.seed)
    optimizer = make_optimizer(model, hp)
    eval_kw = {"batches": 4, "batch_size": 32, "context": hp.context, "seed": 99}
    initial = evaluate_loss(model, tokens, **eval_kw)
    assert initial == evaluate_loss(model, tokens, **eval_kw)  # fixed windows
    losses = _train(model, optimizer, tokens, hp, range(hp.steps))
    final = evaluate_loss(model, tokens, **eval_kw)
    assert 5.0 < initial < 6.0  # about ln(258) for an untrained model
    assert final < 0.8 * initial, (initial, final)
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:5]) / 5
    text = generate(model, ByteTokenizer(), "Once upon a time", max_new_tokens=20)
    assert isinstance(text, str) and text == generate(model, ByteTokenizer(), "Once upon a time", max_new_tokens=20)
    sampled = generate(model, ByteTokenizer(), "", max_new_tokens=40, temperature=1.0, seed=1)
    assert sampled == generate(model, ByteTokenizer(), "", max_new_tokens=40, temperature=1.0, seed=1)
    assert generate(model, ByteTokenizer(), "x" * 100, max_new_tokens=3) is not None  # prompt longer than context


_SHAPE = {key: value for key, value in SMALL.items() if key != "batch_size"}


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_generate_at_a_tiny_temperature_is_greedy_not_a_nan_error(temperature):
    """The reference generator raised RuntimeError (probability tensor contains nan) for a tiny positive temperature:
    logits / temperature overflowed in float32 and softmax gave NaN, as the serving engine did before cdb498c. Now
    it samples greedily there (sampling's limit as the temperature goes to 0), like the engine (one shared rule)."""
    model = build_model(LMConfig.from_dict(_SHAPE), seed=3)
    greedy = generate(model, ByteTokenizer(), "Once upon", max_new_tokens=8)
    assert generate(model, ByteTokenizer(), "Once upon", max_new_tokens=8, temperature=temperature) == greedy
    assert generate(model, ByteTokenizer(), "Once upon", max_new_tokens=8, temperature=1e-30) == greedy  # (it was)


def test_generate_and_the_serving_engine_sample_alike(tmp_path):
    """Sampled (not only greedy) output of the engine is the reference generator's for the same seed and temperature:
    both draw the next token with lm.sample_token."""
    from inference.runtime.engine import GenerationRequest, LLMEngine
    from inference.runtime.engine_config import EngineConfig

    model = build_model(LMConfig.from_dict(_SHAPE), seed=3).eval()
    tok = ByteTokenizer()
    config = EngineConfig.from_dict({"slots": 1, "block_size": 8, "device_cache_blocks": 8, "host_cache_blocks": 0,
                                     "disk_cache_blocks": 0})
    engine = LLMEngine(model, config, cache_dir=str(tmp_path / "kv")).start()
    try:
        for temperature in (0.7, 1.0, 1e-300):
            request = GenerationRequest(prompt_tokens=tok.encode("Once upon"), max_tokens=12, temperature=temperature,
                                        seed=5)
            events = list(engine.generate(request, timeout_s=30))
            assert events[-1]["type"] == "done", events[-1]
            text = "".join(e["text"] for e in events if e["type"] == "token")
            assert text == generate(model, tok, "Once upon", max_new_tokens=12, temperature=temperature, seed=5)
    finally:
        engine.stop()


def test_state_round_trip_and_bit_identical_resume(tokens):
    hp = _hp(steps=10)
    model = build_model(hp.model_config(), seed=hp.seed)
    optimizer = make_optimizer(model, hp)
    _train(model, optimizer, tokens, hp, range(4))
    files = model_state_bytes(model, optimizer, step=4, hp=hp)
    assert set(files) == {"model.pt", "optimizer.pt", "config.json"}
    config = json.loads(files["config.json"])
    assert config["step"] == 4 and config["model"] == hp.model_config().to_dict()
    assert TrainHyperparameters.from_dict(config["hyperparameters"]) == hp

    # Inference copy: same logits.
    loaded, tokenizer, lm_config = load_model_for_inference(files)
    assert lm_config == hp.model_config() and not loaded.training and isinstance(tokenizer, ByteTokenizer)
    probe = tokens[:32].unsqueeze(0)
    with torch.no_grad():
        assert torch.equal(loaded(probe), model(probe))

    # Resume into a differently initialised model: continues exactly like the uninterrupted run.
    resumed = build_model(hp.model_config(), seed=12345)
    resumed_opt = make_optimizer(resumed, hp)
    assert load_model_state(files, resumed, resumed_opt) == 4
    expected = _train(model, optimizer, tokens, hp, range(4, 10))
    got = _train(resumed, resumed_opt, tokens, hp, range(4, 10))
    assert got == expected
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed.parameters(), strict=True))

    with pytest.raises(ValueError, match="config.json"):
        load_model_state(files, build_model(LMConfig(context=16, d_model=32, n_heads=4, d_ff=64), seed=0))


class _PairAllReduce:
    """In-process all-reduce between two worker threads: each gets the mean of both gradient lists."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=60)
        self.slots: list[list[torch.Tensor] | None] = [None, None]

    def for_rank(self, rank: int):
        def all_reduce(grads: list[torch.Tensor]) -> None:
            self.slots[rank] = [g.clone() for g in grads]
            self.barrier.wait()
            for g, a, b in zip(grads, self.slots[0], self.slots[1], strict=True):
                g.copy_((a + b) / 2)
            self.barrier.wait()  # nobody overwrites a slot before both have read it

        return all_reduce


def test_data_parallel_replicas_stay_identical_and_match_a_big_batch(tokens):
    hp = _hp(steps=6)
    reducer = _PairAllReduce()
    replicas = [build_model(hp.model_config(), seed=hp.seed) for _ in range(2)]
    optimizers = [make_optimizer(m, hp) for m in replicas]
    losses: list[list[float]] = [[], []]
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            losses[rank] = _train(replicas[rank], optimizers[rank], tokens, hp, range(hp.steps), rank=rank,
                                  world_size=2, all_reduce=reducer.for_rank(rank))
        except BaseException as exc:
            errors.append(exc)
            reducer.barrier.abort()

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert losses[0] != losses[1]  # each rank trained on its own windows ...
    for a, b in zip(replicas[0].parameters(), replicas[1].parameters(), strict=True):
        assert torch.equal(a, b)  # ... yet the replicas are bit-identical

    # The averaged gradient of two workers equals the gradient of one worker on both batches together.
    averaged: list[torch.Tensor] = []
    pair = _PairAllReduce()
    models = [build_model(hp.model_config(), seed=1) for _ in range(2)]

    def capture(rank: int) -> None:
        reduce = pair.for_rank(rank)

        def all_reduce(grads: list[torch.Tensor]) -> None:
            reduce(grads)
            if rank == 0:
                averaged.extend(g.clone() for g in grads)

        x, y = batch_for_step(tokens, step=0, rank=rank, world_size=2, batch_size=4, context=hp.context, seed=0)
        train_step(models[rank], make_optimizer(models[rank], hp), x, y, step=0, hp=hp, all_reduce=all_reduce)

    threads = [threading.Thread(target=capture, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    batches = [batch_for_step(tokens, step=0, rank=r, world_size=2, batch_size=4, context=hp.context, seed=0)
               for r in range(2)]
    big_x, big_y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    single: list[torch.Tensor] = []
    big = build_model(hp.model_config(), seed=1)
    train_step(big, make_optimizer(big, hp), big_x, big_y, step=0, hp=hp,
               all_reduce=lambda grads: single.extend(g.clone() for g in grads))
    assert len(averaged) == len(single) == len(list(big.parameters()))
    for a, b in zip(averaged, single, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_random_model_dir_loads_as_a_checkpoint_with_the_seeded_weights(tmp_path):
    shape = {"vocab_size": 258, "context": 64, "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64}
    directory = write_random_model_dir(tmp_path / "m", shape, seed=5, note="test")
    files = {name: (directory / name).read_bytes() for name in ("model.pt", "config.json")}
    model, _tokenizer, config = load_model_for_inference(files)
    assert config == LMConfig.from_dict(shape)
    assert json.loads(files["config.json"])["note"] == "test"
    same, other = build_model(config, seed=5).state_dict(), build_model(config, seed=6).state_dict()
    assert all(torch.equal(model.state_dict()[k], same[k]) for k in same)
    assert not all(torch.equal(model.state_dict()[k], other[k]) for k in other)
