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
# The window is the model's shape, not a limit of the architecture: positions are a learned table of `context`
# rows. A model may declare up to 32,768 tokens (the long-prompt benchmark serves 16K prompts with random
# weights); a training job stays at 4,096 (TrainHyperparameters: the trainer's activations grow with the window,
# and nothing longer has been trained here).
MAX_MODEL_CONTEXT = 32_768
_MODEL_BOUNDS = {**_SHAPE_BOUNDS, "context": (1, MAX_MODEL_CONTEXT)}


def _check_shape(obj: Any, names: Sequence[str], bounds: Mapping[str, tuple[int, int]] = _SHAPE_BOUNDS) -> None:
    for name in names:
        lo, hi = bounds[name]
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
        _check_shape(self, list(_MODEL_BOUNDS), _MODEL_BOUNDS)

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
    # Model parallelism (jobs.runtime.model_parallel): None takes the job's parallel plan, if it has one, else 1.
    # `batch_size` is then per data-parallel replica (tensor and pipeline ranks of a replica share its batch).
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    micro_batches: int | None = None

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
        if self.tensor_parallel is not None:
            check_tensor_parallel(self.tensor_parallel, n_heads=self.n_heads, d_ff=self.d_ff)
        if self.pipeline_parallel is not None:
            check_pipeline_parallel(self.pipeline_parallel, n_layers=self.n_layers)
        if self.micro_batches is not None:
            _check_int("micro_batches", self.micro_batches, 1, self.batch_size)
            if self.batch_size % self.micro_batches:
                raise ValueError(f"micro_batches: must divide batch_size ({self.batch_size} % {self.micro_batches} "
                                 "!= 0)")
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


# --------------------------------------------------------------------------------------------------- parallel layout


def check_tensor_parallel(tp: Any, *, n_heads: int, d_ff: int) -> int:
    _check_int("tensor_parallel", tp, 1, 256)
    if n_heads % tp or d_ff % tp:
        raise ValueError(f"tensor_parallel: {tp} must divide n_heads ({n_heads}) and d_ff ({d_ff}): each rank "
                         "holds whole attention heads and an equal part of the MLP")
    return tp


def check_pipeline_parallel(pp: Any, *, n_layers: int) -> int:
    _check_int("pipeline_parallel", pp, 1, 128)
    if pp > n_layers:
        raise ValueError(f"pipeline_parallel: {pp} stages need at least {pp} layers, the model has n_layers={n_layers}")
    return pp


def stage_layers(n_layers: int, stages: int) -> list[tuple[int, int]]:
    """(first layer, layer count) of each pipeline stage: contiguous, as even as possible, earlier stages longer."""
    base, extra = divmod(n_layers, stages)
    out, first = [], 0
    for stage in range(stages):
        count = base + (1 if stage < extra else 0)
        out.append((first, count))
        first += count
    return out


@dataclass(frozen=True)
class TrainerLayout:
    """How the built-in trainer splits a gang of `world_size` workers (one rank each): tp x pp x dp."""

    tp: int
    pp: int
    dp: int
    micro_batches: int
    source: str  # where the degrees come from, in words

    @property
    def model_parallel(self) -> bool:
        return self.tp * self.pp > 1


def _default_micro_batches(batch_size: int, pp: int) -> int:
    """With a pipeline, the largest divisor of the batch up to 4 per stage (GPipe's bubble is (pp-1)/(m+pp-1));
    without one, a single micro-batch."""
    if pp == 1:
        return 1
    return max(d for d in range(1, min(batch_size, 4 * pp) + 1) if batch_size % d == 0)


def _plan_degrees(plan: Mapping[str, Any], world_size: int, devices_per_worker: int) -> tuple[int, int, str]:
    """The plan's tensor and pipeline degrees at worker granularity, or (1, 1, why not). In Megatron's order (tensor
    rank fastest, pipeline stage slowest) a worker holds `devices_per_worker` consecutive devices: a tensor group
    inside one worker stays inside it (its devices compute it together), one spanning several workers spans their
    ranks; pipeline stages map onto whole workers when a stage's devices fill whole workers."""
    tp, pp, dp = int(plan.get("tp", 1)), int(plan.get("pp", 1)), int(plan.get("dp", 1))
    k = max(1, int(devices_per_worker))
    if tp % k == 0:
        tp_w = tp // k
    elif k % tp == 0:
        tp_w = 1
    else:
        return 1, 1, f"the plan's tensor parallel {tp} does not align with {k} device(s) per worker"
    if (dp * tp) % k:
        return 1, 1, f"the plan's pipeline stages ({dp * tp} devices each) do not fill whole workers of {k} devices"
    if world_size % (tp_w * pp):
        return 1, 1, (f"the plan's tensor x pipeline ranks ({tp_w} x {pp} workers) do not divide the "
                      f"{world_size} workers")
    return tp_w, pp, ""


def trainer_layout(hp: TrainHyperparameters, *, world_size: int, plan: Mapping[str, Any] | None = None,
                   devices_per_worker: int = 1) -> TrainerLayout:
    """The built-in trainer's layout for a gang of `world_size` workers: the hyperparameters' explicit degrees
    (ValueError naming the field when they cannot run on this gang), else the job's parallel plan where this model
    and gang can take it (else data parallel, with the reason in `source`), else data parallel."""
    explicit = hp.tensor_parallel is not None or hp.pipeline_parallel is not None
    if explicit:
        tp, pp = hp.tensor_parallel or 1, hp.pipeline_parallel or 1
        if world_size % (tp * pp):
            raise ValueError(f"tensor_parallel: tensor_parallel x pipeline_parallel = {tp * pp} must divide the "
                             f"gang's {world_size} worker(s)")
        source = "set in the hyperparameters"
    elif plan:
        tp, pp, why = _plan_degrees(plan, world_size, devices_per_worker)
        if not why:
            try:
                check_tensor_parallel(tp, n_heads=hp.n_heads, d_ff=hp.d_ff)
                check_pipeline_parallel(pp, n_layers=hp.n_layers)
            except ValueError as exc:
                why = f"the built-in model cannot take the plan's layout: {exc}"
        if why:
            tp, pp = 1, 1
            source = f"data parallel only: {why}"
        else:
            source = (f"the parallel plan for {plan.get('accelerator_type', '?')}: tp {plan.get('tp', 1)}, "
                      f"pp {plan.get('pp', 1)}, dp {plan.get('dp', 1)} over {devices_per_worker} device(s) per worker")
    else:
        tp, pp, source = 1, 1, "data parallel (no tensor or pipeline degree asked for)"
    micro = hp.micro_batches if hp.micro_batches is not None else _default_micro_batches(hp.batch_size, pp)
    return TrainerLayout(tp=tp, pp=pp, dp=world_size // (tp * pp), micro_batches=micro, source=source)
