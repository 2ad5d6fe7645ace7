"""The built-in training workload: a tiny byte-level decoder-only transformer language model (PyTorch, CPU-friendly).

Ray-side code: imports torch, never Django or Ray. A training worker uses it like this:

    hp = TrainHyperparameters.from_dict(job_hyperparameters)        # ValueError("field: why") on bad input
    model = build_model(hp.model_config(), seed=hp.seed)
    optimizer = make_optimizer(model, hp)
    start = load_model_state(checkpoint_files, model, optimizer) if checkpoint_files else 0
    tokens = tokens_from_bytes(corpus_bytes(...))
    for step in range(start, hp.steps):
        x, y = batch_for_step(tokens, step=step, rank=rank, world_size=world, batch_size=hp.batch_size,
                              context=hp.context, seed=hp.seed)
        loss = train_step(model, optimizer, x, y, step=step, hp=hp, all_reduce=average_grads_across_gang)
        time.sleep(hp.step_sleep_s)                                   # the worker's job, not train_step's
    files = model_state_bytes(model, optimizer, step=hp.steps, hp=hp)  # step = optimizer steps completed

Everything is deterministic: model initialisation uses its own generator (the global torch RNG is left as it was),
batches depend only on (seed, step, rank), and a run resumed from `model_state_bytes` at step s continues exactly
as the uninterrupted run would have (same process layout and thread count assumed: CPU float reductions may differ
between thread counts).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "VOCAB_SIZE",
    "ByteTokenizer",
    "LMConfig",
    "TinyTransformerLM",
    "TrainHyperparameters",
    "batch_for_step",
    "build_model",
    "evaluate_loss",
    "generate",
    "learning_rate",
    "load_model_for_inference",
    "load_model_state",
    "make_optimizer",
    "model_state_bytes",
    "tokens_from_bytes",
    "train_step",
]

from jobs.runtime.lm_config import (  # noqa: E402 - re-exported: the torch-free half of this module
    BOS_ID,
    CONFIG_FILE,
    EOS_ID,
    MODEL_FILE,
    OPTIMIZER_FILE,
    STATE_FORMAT,
    VOCAB_SIZE,
    ByteTokenizer,
    LMConfig,
    TrainHyperparameters,
    _check_int,
    _check_number,
)

# --------------------------------------------------------------------------------------------------- model


class _CausalSelfAttention(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _Block(nn.Module):
    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = _CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.fc = nn.Linear(config.d_model, config.d_ff)
        self.fc_proj = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class TinyTransformerLM(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, pre-LN blocks, tied output head."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """(batch, time) long ids, time <= context -> (batch, time, vocab_size) logits."""
        if idx.dim() != 2:
            raise ValueError(f"idx: expected (batch, time), got shape {tuple(idx.shape)}")
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"idx: {t} tokens exceed the context window of {self.config.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)  # weight-tied head

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(config: LMConfig, *, seed: int) -> TinyTransformerLM:
    """A freshly initialised model, identical for the same (config, seed); the global torch RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        model = TinyTransformerLM(config)
    gen = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * config.n_layers)
    with torch.no_grad():
        for name, param in model.named_parameters():  # named_parameters() order is fixed by the module layout
            if name.endswith("bias"):
                param.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                param.fill_(1.0)
            elif name.endswith(("attn.proj.weight", "fc_proj.weight")):
                param.normal_(0.0, residual_std, generator=gen)
            else:
                param.normal_(0.0, 0.02, generator=gen)
    return model


# --------------------------------------------------------------------------------------------------- training


def make_optimizer(model: nn.Module, hp: TrainHyperparameters) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings only (not on biases and LayerNorm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate(0, hp), betas=(0.9, 0.95), eps=1e-8, foreach=False,
    )


def learning_rate(step: int, hp: TrainHyperparameters) -> float:
    """Learning rate for 0-based `step`: linear warmup over warmup_steps, then cosine decay to 10% of lr."""
    if step < hp.warmup_steps:
        return hp.lr * (step + 1) / hp.warmup_steps
    floor = 0.1 * hp.lr
    decay_steps = max(1, hp.steps - hp.warmup_steps)
    progress = min(1.0, max(0.0, (step - hp.warmup_steps) / decay_steps))
    return floor + 0.5 * (hp.lr - floor) * (1.0 + math.cos(math.pi * progress))


def tokens_from_bytes(data: bytes) -> torch.Tensor:
    """Byte ids (0..255) as a 1-D long tensor."""
    if not data:
        return torch.zeros(0, dtype=torch.long)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def _generator_for(seed: int, step: int, rank: int, purpose: str) -> torch.Generator:
    digest = hashlib.blake2b(f"{purpose}:{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def _windows(tokens: torch.Tensor, gen: torch.Generator, batch_size: int, context: int) -> tuple[torch.Tensor, ...]:
    if tokens.dim() != 1:
        raise ValueError(f"tokens: expected a 1-D tensor, got shape {tuple(tokens.shape)}")
    if tokens.numel() < context + 1:
        raise ValueError(f"tokens: {tokens.numel()} tokens, need at least context + 1 = {context + 1}")
    starts = torch.randint(0, tokens.numel() - context, (batch_size,), generator=gen)
    window = tokens[starts.unsqueeze(1) + torch.arange(context + 1)]
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()


def batch_for_step(tokens: torch.Tensor, *, step: int, rank: int, world_size: int, batch_size: int, context: int,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) of shape (batch_size, context), y shifted by one; a function of (seed, step, rank) only."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, {world_size}), got {rank}")
    return _windows(tokens, _generator_for(seed, step, rank, "train"), batch_size, context)


def train_step(model: TinyTransformerLM, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
               step: int, hp: TrainHyperparameters,
               all_reduce: Callable[[list[torch.Tensor]], None] | None = None) -> float:
    """One optimizer step at 0-based `step`; returns this worker's loss before the update.

    `all_reduce(grads)` receives every parameter's gradient (always the same list, in `model.parameters()` order,
    none missing) and must average them across the gang in place; it is called before clipping.
    """
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if all_reduce is not None:
        all_reduce([p.grad for p in params])
    torch.nn.utils.clip_grad_norm_(params, hp.grad_clip, foreach=False)
    lr = learning_rate(step, hp)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate_loss(model: TinyTransformerLM, tokens: torch.Tensor, *, batches: int, batch_size: int, context: int,
                  seed: int) -> float:
    """Mean cross entropy over `batches` fixed windows (the same for a given seed, distinct from training batches)."""
    _check_int("batches", batches, 1, 1_000_000)
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for b in range(batches):
            x, y = _windows(tokens, _generator_for(seed, b, 0, "eval"), batch_size, context)
            total += model.loss(x, y).item()
        return total / max(1, batches)
    finally:
        model.train(was_training)


# --------------------------------------------------------------------------------------------------- state


def _save(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _load(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def model_state_bytes(model: TinyTransformerLM, optimizer: torch.optim.Optimizer, *, step: int,
                      hp: TrainHyperparameters) -> dict[str, bytes]:
    """{"model.pt", "optimizer.pt", "config.json"}; `step` is the number of optimizer steps completed."""
    config = {
        "format": STATE_FORMAT,
        "model": model.config.to_dict(),
        "hyperparameters": hp.to_dict(),
        "step": int(step),
    }
    return {
        MODEL_FILE: _save(model.state_dict()),
        OPTIMIZER_FILE: _save(optimizer.state_dict()),
        CONFIG_FILE: json.dumps(config, sort_keys=True, indent=2).encode("utf-8"),
    }


def _read_config(files: Mapping[str, bytes]) -> dict[str, Any]:
    for name in (MODEL_FILE, CONFIG_FILE):
        if name not in files:
            raise ValueError(f"{name}: missing from the model state")
    config = json.loads(files[CONFIG_FILE].decode("utf-8"))
    if not isinstance(config, dict) or config.get("format") != STATE_FORMAT:
        raise ValueError(f"{CONFIG_FILE}: unsupported model state format")
    return config


def load_model_state(files: Mapping[str, bytes], model: TinyTransformerLM,
                     optimizer: torch.optim.Optimizer | None = None) -> int:
    """Loads weights (and optimizer state when given) into `model`; returns the step to continue from."""
    config = _read_config(files)
    saved = LMConfig.from_dict(config["model"])
    if saved != model.config:
        raise ValueError(f"{CONFIG_FILE}: saved model shape {saved} does not match {model.config}")
    model.load_state_dict(_load(files[MODEL_FILE]))
    if optimizer is not None:
        if OPTIMIZER_FILE not in files:
            raise ValueError(f"{OPTIMIZER_FILE}: missing from the model state")
        optimizer.load_state_dict(_load(files[OPTIMIZER_FILE]))
    return int(config["step"])


def write_random_model_dir(directory, shape: Mapping[str, Any], *, seed: int = 0, note: str = "") -> Any:
    """A model directory (model.pt + config.json, as a checkpoint has) of the built-in LM with seeded random
    weights, for serving tests and benchmarks that measure serving, not text. Returns `directory` (a Path)."""
    from pathlib import Path

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = LMConfig.from_dict(dict(shape))
    described = {"format": STATE_FORMAT, "model": config.to_dict(), "hyperparameters": {}, "step": 0}
    if note:
        described["note"] = note
    (directory / MODEL_FILE).write_bytes(_save(build_model(config, seed=seed).state_dict()))
    (directory / CONFIG_FILE).write_text(json.dumps(described, indent=2))
    return directory


def load_model_for_inference(files: Mapping[str, bytes]) -> tuple[TinyTransformerLM, ByteTokenizer, LMConfig]:
    """The model described by config.json with weights from model.pt, in eval mode."""
    config = LMConfig.from_dict(_read_config(files)["model"])
    model = build_model(config, seed=0)
    model.load_state_dict(_load(files[MODEL_FILE]))
    model.eval()
    return model, ByteTokenizer(), config


def sample_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None = None) -> int:
    """The next token from a 1-D `logits`: the argmax at temperature 0, else a draw from softmax(logits / temperature)
    with `generator`. A temperature so small that logits / temperature overflows (about 1e-40 and below in float32:
    softmax gives NaN and torch.multinomial raises) is greedy too, sampling's limit as the temperature goes to 0.
    `generate` and the serving engine (inference/runtime/engine.py) both draw with this, so they agree."""
    if temperature == 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if not bool(torch.isfinite(probs).all()):
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
def generate(model: TinyTransformerLM, tokenizer: ByteTokenizer, prompt: str, *, max_new_tokens: int,
             temperature: float = 0.0, seed: int = 0) -> str:
    """The continuation of `prompt` (without the prompt): greedy at temperature 0 (and at a temperature too small to
    sample with, see `sample_token`), else sampled with `seed`.

    Only byte ids are generated (the specials never occur in training text); an empty prompt starts a new tale
    (the corpus separates tales with a newline). The context is cropped to the model's window.
    """
    _check_int("max_new_tokens", max_new_tokens, 0, 1_000_000)
    temperature = _check_number("temperature", temperature, lo=0.0, hi=100.0)
    ids = tokenizer.encode(prompt) or tokenizer.encode("\n")
    gen = torch.Generator().manual_seed(seed)
    context = model.config.context
    was_training = model.training
    model.eval()
    out: list[int] = []
    try:
        for _ in range(max_new_tokens):
            window = torch.tensor([(ids + out)[-context:]], dtype=torch.long)
            logits = model(window)[0, -1, :256]
            out.append(sample_token(logits, temperature, gen))
    finally:
        model.train(was_training)
    return tokenizer.decode(out)
