"""Configuration of the built-in language model, without torch: the byte tokenizer, the model
shape (LMConfig) and the training hyperparameters (TrainHyperparameters, validated with errors that
name the field). The control plane validates a job's hyperparameters with it at submit time without
importing torch; `jobs.runtime.lm` re-exports everything here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258
STATE_FORMAT = 1
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
CONFIG_FILE = "config.json"


# --------------------------------------------------------------------------------------------------- tokenizer


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, plus BOS (256) and EOS (257)."""

    vocab_size = VOCAB_SIZE
    bos_id = BOS_ID
    eos_id = EOS_ID

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes back to text; `ids` may be a list or a tensor (anything with tolist())."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------------- validation


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name}: must be between {lo} and {hi}, got {value}")
    return value


def _check_number(name: str, value: Any, *, lo: float, hi: float, positive: bool = False) -> float:
    what = "a positive number" if positive else f"a number between {lo:g} and {hi:g}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be {what}, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < lo or value > hi or (positive and value <= 0):
        raise ValueError(f"{name}: must be {what}" + (f" (at most {hi:g})" if positive else "") + f", got {value!r}")
    return value


def _reject_unknown(cls: type, d: Mapping[str, Any]) -> None:
    if not isinstance(d, Mapping):
        raise ValueError(f"{cls.__name__}: expected a mapping, got {type(d).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    for key in d:
        if key not in known:
            raise ValueError(f"{key}: unknown field (expected one of {', '.join(sorted(known))})")


# (lo, hi) for every integer field of the model shape, shared by LMConfig and TrainHyperparameters.
_SHAPE_BOUNDS = {
    "vocab_size": (VOCAB_SIZE, VOCAB_SIZE),
    "context": (1, 4096),
    "d_model": (1, 4096),
    "n_heads": (1, 256),
    "n_layers": (1, 128),
    "d_ff": (1, 16384),
}


def _check_shape(obj: Any, names: Sequence[str]) -> None:
    for name in names:
        lo, hi = _SHAPE_BOUNDS[name]
        _check_int(name, getattr(obj, name), lo, hi)
    if obj.d_model % obj.n_heads:
        raise ValueError(f"d_model: must be divisible by n_heads ({obj.d_model} % {obj.n_heads} != 0)")


@dataclass(frozen=True)
class LMConfig:
    """The model's shape."""

    vocab_size: int = VOCAB_SIZE
    context: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256

    def __post_init__(self) -> None:
        _check_shape(self, list(_SHAPE_BOUNDS))

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LMConfig:
        _reject_unknown(cls, d)
        return cls(**d)


@dataclass(frozen=True)
class TrainHyperparameters:
    """What a training job may set; `batch_size` is per worker, so the global batch is batch_size x world size."""

    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    context: int = 64
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    step_sleep_s: float = 0.0  # artificial per-step delay (the worker sleeps it): lets tests stretch runs

    def __post_init__(self) -> None:
        _check_int("steps", self.steps, 1, 1_000_000)
        _check_int("batch_size", self.batch_size, 1, 65536)
        floats = {
            "lr": _check_number("lr", self.lr, lo=0.0, hi=10.0, positive=True),
            "weight_decay": _check_number("weight_decay", self.weight_decay, lo=0.0, hi=10.0),
            "grad_clip": _check_number("grad_clip", self.grad_clip, lo=0.0, hi=1e6, positive=True),
            "step_sleep_s": _check_number("step_sleep_s", self.step_sleep_s, lo=0.0, hi=60.0),
        }
        _check_int("warmup_steps", self.warmup_steps, 0, 1_000_000)
        _check_int("seed", self.seed, 0, 2**63 - 1)
        _check_shape(self, ["context", "d_model", "n_layers", "n_heads", "d_ff"])
        for name, value in floats.items():  # ints are accepted for float fields and stored as floats
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainHyperparameters:
        """Defaults for missing keys; ValueError("<field>: ...") for unknown keys, wrong types and bad values."""
        _reject_unknown(cls, d)
        return cls(**d)

    def model_config(self) -> LMConfig:
        return LMConfig(context=self.context, d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
                        d_ff=self.d_ff)
