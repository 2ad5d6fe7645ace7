"""The planner's inputs and outputs: plain frozen dataclasses, no Django, no Ray.

- ``ModelSpec``: a decoder-only transformer (GPT / Llama style, dense or mixture-of-experts).
- ``DeviceType``: one accelerator type's facts (peak dense TFLOPS, memory, memory bandwidth) and the
  fraction of peak its matrix multiplies reach (``achievable_fraction``).
- ``DevicePool``: a set of identical nodes of one device type with their link bandwidths.
- ``PlanRequest``: a model, a global batch and the pools; ``PlanOptions`` limits the search.
- ``Stage`` / ``Layout``: one way to run the job (DP x pipeline of TP stages, micro-batches, recompute, ZeRO-1/2).
- ``Prediction`` / ``PlanResult``: what the cost model says about a layout, and the planner's answer.

Units: TFLOPS are 1e12 FLOP/s; memory in GB of 1e9 bytes; every bandwidth is in GB/s (gigabytes, as in
``controlplane.cluster.accelerator_facts``), per device and per direction. A device's ``memory_gb`` is the
datasheet's figure; where that "GB" is really binary (an "80GB" H100 has 80 GiB of HBM3),
``DeviceType.memory_bytes`` is the capacity the driver reports (``DEVICE_MEMORY_BYTES``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

PRECISIONS = ("bf16", "fp8")
# Activation recomputation: "norms" recomputes the two layer norms of each layer from their inputs and keeps
# neither output (Megatron-core's --recompute-granularity selective --recompute-modules layernorm, where the norms
# are modules of their own, not fused into the next linear layer); "selective" the attention core (Korthikanti et
# al. 2022); "full" the whole layer from its input.
RECOMPUTE_MODES = ("none", "norms", "selective", "full")
RECOMPUTE_LABELS = {"none": "no recompute", "norms": "layer-norm recompute", "selective": "selective recompute",
                    "full": "full recompute"}

# A matrix-multiply-bound chip reaches this fraction of its datasheet dense peak when nothing better is
# known. ``CALIBRATED_ACHIEVABLE_FRACTION`` replaces it for chips with measured or published step times.
DEFAULT_ACHIEVABLE_FRACTION = 0.5

# One constant per chip, fitted (a single least-squares scalar) to end-to-end throughput that was
# measured on that chip; see benchmarks/planner.py, which prints the fit and the leave-one-out error.
# nvidia-a100: the ten rows of Table 1 of Narayanan et al. (SC'21), published_runs.json (fit 0.6515).
# nvidia-h100: the two 8K-sequence rows of Table 4 of the Llama 3 paper (Grattafiori et al. 2024,
#   arXiv:2407.21783: Llama 3 405B on 8,192 and 16,384 H100s, 430 and 400 TFLOPs/GPU), published_runs.json
#   (fit 0.5975; leave-one-out error 1.1% on each row). Only two runs, of one model and one software stack.
CALIBRATED_ACHIEVABLE_FRACTION: dict[str, float] = {
    "nvidia-a100": 0.65,
    "nvidia-h100": 0.6,
}


_MIB = 1024 * 1024

# {slug: (datasheet memory_gb, bytes the driver reports as the device's total memory, source)}: chips whose
# datasheet "GB" is binary, so memory_gb x 1e9 would understate them by about 7%. Applied only when a
# DeviceType's memory_gb is that datasheet figure (another memory variant of the same slug keeps memory_gb x 1e9,
# the conservative reading). Sources: nvidia-smi's "Memory-Usage" total and rocm-smi's "VRAM Total Memory (B)" as
# printed in public logs found by exact-string search of public repositories (several independent ones each).
DEVICE_MEMORY_BYTES: dict[str, tuple[float, int, str]] = {
    "nvidia-h100": (80.0, 81559 * _MIB, "nvidia-smi on 'NVIDIA H100 80GB HBM3' (SXM, 700 W): 81559MiB total = "
                    "85.52e9 bytes (80 GiB of HBM3 less what the driver reserves)"),
    "nvidia-a100": (80.0, 81920 * _MIB, "nvidia-smi on 'NVIDIA A100-SXM4-80GB': 81920MiB total = 80 GiB = "
                    "85.90e9 bytes"),
    "nvidia-h200": (141.0, 143771 * _MIB, "nvidia-smi on 'NVIDIA H200' (SXM, 700 W): 143771MiB total = "
                    "150.75e9 bytes"),
    "amd-mi300x": (192.0, 205822885888, "rocm-smi --showmeminfo vram on 'AMD Instinct MI300X': VRAM Total "
                   "Memory (B) 205822885888 = 192 GiB less 0.3 GiB"),
}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be a positive integer, got {_shown(value)}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {_shown(value)}")
    return value


# Upper bounds on a model description. Generous: each is several times (heads, layers) to hundreds of times the
# largest figure among the presets (presets.py) and the published runs (published_runs.json): layers 128 (the 1T
# GPT of Narayanan et al.), hidden 25,600, heads 160, kv_heads 8 (up to heads), ffn_hidden 53,248 (Llama 3 405B),
# seq_len 32,768 (Mixtral), vocab 128,256, experts 8. They keep every size the planner computes finite as a float
# (a hidden width of 1e300 made the byte counts too large for a float: an OverflowError, a 500) and its search
# short (it walks every pipeline depth up to the layer count: 2,000,000 layers took more than 10 s).
MODEL_FIELD_LIMITS: dict[str, int] = {
    "layers": 1_000,
    "hidden": 1_000_000,
    "heads": 10_000,
    "kv_heads": 10_000,
    "ffn_hidden": 10_000_000,
    "seq_len": 10_000_000,
    "vocab": 10_000_000,
    "experts": 100_000,
    "top_k": 100_000,
}


def _shown(value) -> str:
    """A number for an error message: a huge one as its order of magnitude, not hundreds of digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**15:
        return f"about 1e{int(abs(value).bit_length() * math.log10(2))}"
    return repr(value)


def _at_most(name: str, value) -> None:
    limit = MODEL_FIELD_LIMITS[name]
    if value > limit:
        raise ValueError(f"{name} must be at most {limit:,}, got {_shown(value)}")


def _positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. ``experts`` 0 or 1 means dense; otherwise every MLP is a mixture of
    ``experts`` experts of which ``top_k`` run per token. Defaults describe a GPT-2/3 style model
    (learned positions, biases, tied embeddings, 4h GeLU MLP, dropout); Llama-style models set ``gated_mlp``,
    ``bias=False``, ``tied_embeddings=False``, ``learned_positions=False`` and ``dropout=False``.

    ``dropout``: the model applies dropout (GPT-2/3 and Megatron-LM's GPT: 0.1 on the attention probabilities and
    on the attention and MLP outputs), so training stores dropout masks. Llama 1/2/3 and Mixtral have no dropout
    layer at all (meta-llama/llama3 llama/model.py: h = x + attention(norm(x)); out = h + feed_forward(norm(h));
    Hugging Face configs: attention_dropout 0.0), so nothing of it is stored."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    kv_heads: int = 0  # 0: same as heads (multi-head attention)
    ffn_hidden: int = 0  # 0: 4 * hidden
    experts: int = 0
    top_k: int = 1
    precision: str = "bf16"
    gated_mlp: bool = False
    bias: bool = True
    tied_embeddings: bool = True
    learned_positions: bool = True
    dropout: bool = True
    name: str = ""

    def __post_init__(self):
        """Every size within ``MODEL_FIELD_LIMITS``. ``top_k`` may not exceed ``experts`` where experts are given
        (1 expert is a dense MLP: top_k must be 1). A dense model built directly (``experts`` 0) keeps whatever
        ``top_k`` it is given, unused (``active_experts`` is 1), so code that draws dense and MoE models alike may
        pass one; ``from_dict``, which reads what people write, refuses a top_k other than 1 there."""
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            _positive_int(name, getattr(self, name))
            _at_most(name, getattr(self, name))
        for name in ("kv_heads", "ffn_hidden", "experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {_shown(value)}")
            _at_most(name, value)
        _positive_int("top_k", self.top_k)
        _at_most("top_k", self.top_k)
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.kv_heads and (self.kv_heads > self.heads or self.heads % self.kv_heads):
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.experts >= 1 and self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed experts ({self.experts})")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    # -- derived sizes --------------------------------------------------------------------------------------

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def active_experts(self) -> int:
        return self.top_k if self.is_moe else 1

    def attention_parameters(self) -> int:
        h, kv_width = self.hidden, self.kv * self.head_dim
        weights = h * (h + 2 * kv_width) + h * h
        biases = (h + 2 * kv_width) + h if self.bias else 0
        return weights + biases

    def expert_parameters(self) -> int:
        """One MLP (one expert of a MoE layer)."""
        h, f = self.hidden, self.ffn
        matrices = 3 if self.gated_mlp else 2
        biases = (f * (matrices - 1) + h) if self.bias else 0
        return matrices * h * f + biases

    def mlp_parameters(self) -> int:
        if self.is_moe:
            return self.experts * self.expert_parameters() + self.hidden * self.experts  # + router
        return self.expert_parameters()

    def layer_parameters(self) -> int:
        norms = 4 * self.hidden if self.bias else 2 * self.hidden
        return self.attention_parameters() + self.mlp_parameters() + norms

    def embedding_parameters(self) -> int:
        """Input embedding (+ learned positions), the final norm, and the output projection when untied."""
        words = self.vocab * self.hidden
        positions = self.seq_len * self.hidden if self.learned_positions else 0
        output = 0 if self.tied_embeddings else words
        final_norm = 2 * self.hidden if self.bias else self.hidden
        return words + positions + output + final_norm

    def parameters(self) -> int:
        """Total parameters. For the GPT defaults this is Narayanan et al.'s Eq. 2,
        12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), plus the final layer norm's 2h that Eq. 2 leaves out."""
        return self.layers * self.layer_parameters() + self.embedding_parameters()

    def active_parameters(self) -> int:
        """Parameters a token passes through (MoE: only top_k experts)."""
        if not self.is_moe:
            return self.parameters()
        idle = (self.experts - self.top_k) * self.expert_parameters()
        return self.parameters() - self.layers * idle

    # -- parsing --------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Mapping) -> ModelSpec:
        """Build from a JSON-like mapping; unknown keys and bad values raise ValueError naming the field.
        Accepts the Hugging Face names too (num_hidden_layers, hidden_size, ...)."""
        values = canonical_model_fields(data)
        missing = [name for name in ("layers", "hidden", "heads", "seq_len", "vocab") if name not in values]
        if missing:
            raise ValueError(f"model field {missing[0]!r} is required")
        for name in ("gated_mlp", "bias", "tied_embeddings", "learned_positions", "dropout"):
            if name in values and not isinstance(values[name], bool):
                raise ValueError(f"{name} must be true or false, got {values[name]!r}")
        if "name" in values and not isinstance(values["name"], str):
            raise ValueError(f"name must be a string, got {values['name']!r}")
        for name in ("layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn_hidden", "experts", "top_k"):
            value = values.get(name)
            if isinstance(value, float) and value.is_integer():
                values[name] = int(value)
            elif value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be an integer, got {_shown(value)}")
        top_k, experts = values.get("top_k", 1), values.get("experts", 0)
        if isinstance(top_k, int) and isinstance(experts, int) and top_k != 1 and experts <= 1:
            raise ValueError(f"top_k ({top_k}) applies only to a mixture of experts (experts > 1, got {experts}); "
                             f"a dense model takes top_k 1")
        return cls(**values)


def canonical_model_fields(data: Mapping) -> dict:
    """``data`` with the Hugging Face names (``_MODEL_ALIASES``) replaced by ModelSpec's. ValueError for an unknown
    field, and for two names of one field with different values ({"hidden": 128, "hidden_size": 64}: which one was
    meant is a guess); the same value under two names (as some configs carry) is taken."""
    if not isinstance(data, Mapping):
        raise ValueError(f"model must be an object, got {type(data).__name__}")
    known = {f.name for f in fields(ModelSpec)}
    values: dict = {}
    given_as: dict[str, str] = {}
    for key, value in data.items():
        name = _MODEL_ALIASES.get(key, key)
        if name not in known:
            raise ValueError(f"unknown model field {key!r}")
        if name in values and not _same(values[name], value):
            raise ValueError(f"model fields {given_as[name]!r} and {key!r} both give {name}, with different values "
                             f"({_shown(values[name])} and {_shown(value)}); give one")
        values[name] = value
        given_as.setdefault(name, key)
    return values


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b or (
        not isinstance(a, bool) and not isinstance(b, bool) and isinstance(a, int | float)
        and isinstance(b, int | float) and a == b)


_MODEL_ALIASES = {
    "num_layers": "layers", "num_hidden_layers": "layers", "n_layer": "layers",
    "hidden_size": "hidden", "d_model": "hidden", "n_embd": "hidden",
    "num_attention_heads": "heads", "n_head": "heads",
    "num_key_value_heads": "kv_heads", "num_query_groups": "kv_heads",
    "intermediate_size": "ffn_hidden", "ffn_hidden_size": "ffn_hidden",
    "seq_length": "seq_len", "sequence_length": "seq_len", "max_position_embeddings": "seq_len",
    "vocab_size": "vocab", "padded_vocab_size": "vocab",
    "num_experts": "experts", "num_local_experts": "experts",
    "moe_router_topk": "top_k", "num_experts_per_tok": "top_k",
}


@dataclass(frozen=True)
class DeviceType:
    """An accelerator type. ``peak_tflops`` maps precision to dense peak; ``achievable_fraction`` is the
    share of that peak large matrix multiplies reach in training (refined from measured step times)."""

    slug: str
    peak_tflops: Mapping[str, float]
    memory_gb: float
    memory_bandwidth_gbps: float
    achievable_fraction: float = DEFAULT_ACHIEVABLE_FRACTION

    def __post_init__(self):
        if not self.slug:
            raise ValueError("slug is required")
        if not self.peak_tflops:
            raise ValueError(f"{self.slug}: peak_tflops needs at least one precision")
        for precision, value in self.peak_tflops.items():
            if precision not in PRECISIONS:
                raise ValueError(f"{self.slug}: unknown precision {precision!r} in peak_tflops")
            _positive_float(f"{self.slug}: peak_tflops[{precision}]", value)
        _positive_float(f"{self.slug}: memory_gb", self.memory_gb)
        _positive_float(f"{self.slug}: memory_bandwidth_gbps", self.memory_bandwidth_gbps)
        if not 0 < self.achievable_fraction <= 1:
            raise ValueError(f"{self.slug}: achievable_fraction must be in (0, 1], got {self.achievable_fraction!r}")
        # A dict field would make the frozen dataclass unhashable; store an immutable, sorted copy.
        object.__setattr__(self, "peak_tflops", _FrozenMap(self.peak_tflops))

    def peak(self, precision: str) -> float | None:
        """Dense peak TFLOPS for ``precision``; FP8 falls back to nothing (the chip cannot run it)."""
        return self.peak_tflops.get(precision)

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes: what the driver reports for a chip whose datasheet "GB" is binary
        (``DEVICE_MEMORY_BYTES``), else ``memory_gb`` x 1e9."""
        known = DEVICE_MEMORY_BYTES.get(self.slug)
        if known is not None and known[0] == self.memory_gb:
            return float(known[1])
        return self.memory_gb * 1e9


class _FrozenMap(Mapping):
    __slots__ = ("_items",)

    def __init__(self, data: Mapping[str, float]):
        self._items = tuple(sorted((str(k), float(v)) for k, v in data.items()))

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self):
        return repr(dict(self._items))


def device_type_from_facts(fact: Mapping, achievable_fraction: float | None = None) -> DeviceType:
    """A ``DeviceType`` from one entry of ``controlplane.cluster.accelerator_facts.ACCELERATOR_FACTS``.

    Raises ValueError naming the missing figure when the facts lack BF16 TFLOPS, memory or bandwidth
    (the planner never invents a figure the facts leave out). ``achievable_fraction`` defaults to the
    chip's calibrated value, else ``DEFAULT_ACHIEVABLE_FRACTION``."""
    slug = fact.get("slug") or ""
    for key in ("bf16_dense_tflops", "memory_gb", "memory_bandwidth_gbps"):
        if fact.get(key) is None:
            raise ValueError(f"{slug or 'accelerator'}: no published {key}; the planner cannot model it")
    peaks = {"bf16": fact["bf16_dense_tflops"]}
    if fact.get("fp8_dense_tflops") is not None:
        peaks["fp8"] = fact["fp8_dense_tflops"]
    if achievable_fraction is None:
        achievable_fraction = CALIBRATED_ACHIEVABLE_FRACTION.get(slug, DEFAULT_ACHIEVABLE_FRACTION)
    return DeviceType(slug=slug, peak_tflops=peaks, memory_gb=fact["memory_gb"],
                      memory_bandwidth_gbps=fact["memory_bandwidth_gbps"], achievable_fraction=achievable_fraction)


@dataclass(frozen=True)
class DevicePool:
    """``nodes`` identical nodes with ``devices_per_node`` devices each. ``intra_node_gbps``: GB/s per
    device per direction inside a node (NVLink/NVSwitch); ``inter_node_gbps``: GB/s per device per
    direction between nodes (for example one 200 Gb/s HDR InfiniBand port per GPU = 25 GB/s)."""

    device: DeviceType
    nodes: int
    devices_per_node: int
    intra_node_gbps: float
    inter_node_gbps: float
    name: str = ""

    def __post_init__(self):
        _positive_int("nodes", self.nodes)
        _positive_int("devices_per_node", self.devices_per_node)
        _positive_float("intra_node_gbps", self.intra_node_gbps)
        _positive_float("inter_node_gbps", self.inter_node_gbps)
        if not self.name:
            object.__setattr__(self, "name", self.device.slug)

    @property
    def devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def memory_gb(self) -> float:
        return self.devices * self.device.memory_gb

    @property
    def memory_bytes(self) -> float:
        return self.devices * self.device.memory_bytes


@dataclass(frozen=True)
class PlanOptions:
    """What the search may use. ``max_micro_batch`` caps the micro-batch size tried; ``flash_attention``
    says the attention kernel never materialises the s x s score matrix (FlashAttention); 2021-era
    Megatron runs set it False."""

    allow_recompute: bool = True
    allow_selective_recompute: bool = True  # False for frameworks that only checkpoint whole layers
    # Layer-norm recomputation needs the norms as modules of their own: Megatron-core's --recompute-modules layernorm
    # skips norms fused into the next linear layer (Transformer Engine's LayerNormColumnParallelLinear).
    allow_norm_recompute: bool = True
    allow_zero: bool = True
    allow_interleave: bool = True
    allow_sequence_parallel: bool = True
    allow_heterogeneous: bool = True
    flash_attention: bool = True
    max_micro_batch: int = 16
    max_alternatives: int = 5
    # The devices a tensor-parallel group must stay inside (0: a node's): a TP degree divides it. A training job whose
    # workers are smaller than a node sets it to a worker's devices: its workers may land on different nodes, and a
    # TP group must not span two of them.
    tensor_parallel_within: int = 0

    def __post_init__(self):
        _positive_int("max_micro_batch", self.max_micro_batch)
        if isinstance(self.tensor_parallel_within, bool) or not isinstance(self.tensor_parallel_within, int) \
                or self.tensor_parallel_within < 0:
            raise ValueError(f"tensor_parallel_within must be an integer >= 0, got {self.tensor_parallel_within!r}")
        if isinstance(self.max_alternatives, bool) or not isinstance(self.max_alternatives, int) \
                or self.max_alternatives < 0:
            raise ValueError(f"max_alternatives must be an integer >= 0, got {self.max_alternatives!r}")


@dataclass(frozen=True)
class PlanRequest:
    model: ModelSpec
    global_batch_size: int  # sequences per optimizer step
    pools: tuple[DevicePool, ...]
    options: PlanOptions = field(default_factory=PlanOptions)

    def __post_init__(self):
        _positive_int("global_batch_size", self.global_batch_size)
        object.__setattr__(self, "pools", tuple(self.pools))
        if not self.pools:
            raise ValueError("pools: at least one device pool is required")
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools: names must be unique, got {names}")

    def pool(self, name: str) -> DevicePool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: ``layers`` transformer layers on ``tp`` devices of pool ``pool``."""

    pool: str
    tp: int
    layers: int

    def __post_init__(self):
        _positive_int("tp", self.tp)
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            raise ValueError(f"layers must be an integer >= 0, got {self.layers!r}")


@dataclass(frozen=True)
class Layout:
    """``dp`` copies of a pipeline made of ``stages``. ``ep`` splits each MoE layer's experts over ``ep``
    of the ``dp`` ranks. ``virtual_stages`` > 1 is Megatron's interleaved 1F1B schedule."""

    dp: int
    stages: tuple[Stage, ...]
    micro_batch_size: int
    recompute: str = "none"
    zero: bool = False
    ep: int = 1
    virtual_stages: int = 1
    sequence_parallel: bool = False
    # ZeRO-2 (Rajbhandari et al. 2020): gradients sharded over data parallel as well as the optimizer state
    # (``zero``): each micro-batch's gradients are reduce-scattered into the 1/dp shard the device owns.
    shard_gradients: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise ValueError("a layout needs at least one stage")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_MODES)}, got {self.recompute!r}")
        for name in ("dp", "micro_batch_size", "ep", "virtual_stages"):
            _positive_int(name, getattr(self, name))

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def tp(self) -> int:
        """The tensor-parallel degree when all stages share one, else the largest."""
        return max(s.tp for s in self.stages)

    @property
    def devices(self) -> int:
        return self.dp * sum(s.tp for s in self.stages)

    def devices_by_pool(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for stage in self.stages:
            used[stage.pool] = used.get(stage.pool, 0) + self.dp * stage.tp
        return used

    @property
    def heterogeneous(self) -> bool:
        return len({s.pool for s in self.stages}) > 1

    def describe(self) -> str:
        pools = []
        for stage in self.stages:
            if pools and pools[-1][0] == stage.pool and pools[-1][1] == stage.tp:
                pools[-1][2].append(stage.layers)
            else:
                pools.append((stage.pool, stage.tp, [stage.layers]))
        if len(pools) == 1:
            pool, tp, layers = pools[0]
            text = f"DP{self.dp} x TP{tp} x PP{len(layers)} on {pool}"
        else:
            parts = [f"{pool}: {len(layers)} stage(s) x TP{tp}, layers {'/'.join(map(str, layers))}"
                     for pool, tp, layers in pools]
            text = f"DP{self.dp} x pipeline[{'; '.join(parts)}]"
        if self.ep > 1:
            text += f" x EP{self.ep}"
        extras = [f"micro-batch {self.micro_batch_size}"]
        if self.virtual_stages > 1:
            extras.append(f"interleaved x{self.virtual_stages}")
        if self.recompute != "none":
            extras.append(RECOMPUTE_LABELS[self.recompute])
        if self.sequence_parallel:
            extras.append("sequence parallel")
        if self.zero:
            extras.append("ZeRO-2" if self.shard_gradients else "ZeRO-1")
        return f"{text} ({', '.join(extras)})"

    def as_dict(self) -> dict:
        return {
            "dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep,
            "micro_batch_size": self.micro_batch_size, "recompute": self.recompute, "zero": self.zero,
            "virtual_stages": self.virtual_stages, "sequence_parallel": self.sequence_parallel,
            "shard_gradients": self.shard_gradients,
            "stages": [{"pool": s.pool, "tp": s.tp, "layers": s.layers} for s in self.stages],
            "devices": self.devices, "devices_by_pool": self.devices_by_pool(),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Layout:
        """The layout ``as_dict`` described (its derived keys are ignored); ValueError on a malformed one."""
        if not isinstance(data, Mapping) or not isinstance(data.get("stages"), list):
            raise ValueError("a layout needs a list of stages")
        try:
            stages = tuple(Stage(str(s["pool"]), s["tp"], s["layers"]) for s in data["stages"])
            return cls(dp=data["dp"], stages=stages, micro_batch_size=data["micro_batch_size"],
                       recompute=data.get("recompute", "none"), zero=bool(data.get("zero", False)),
                       ep=data.get("ep", 1), virtual_stages=data.get("virtual_stages", 1),
                       sequence_parallel=bool(data.get("sequence_parallel", False)),
                       shard_gradients=bool(data.get("shard_gradients", False)))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed layout: {exc!r}") from exc


@dataclass(frozen=True)
class Prediction:
    """The cost model's view of one layout. Times in seconds, memory in GB, throughput per step."""

    layout: Layout
    num_micro_batches: int
    step_time_s: float
    tokens_per_s: float
    mfu: float  # model FLOPs (no recompute) / (step time x sum of the devices' dense peaks)
    model_tflops_per_device: float  # model FLOPs per second per device
    hardware_tflops_per_device: float  # FLOPs actually executed (with recompute) per second per device
    memory_gb: float  # the fullest device
    memory_limit_gb: float  # that device's usable memory
    breakdown: Mapping[str, float]  # seconds per step: compute, bubble, tp/pp/dp/ep comm, optimizer
    memory_breakdown: Mapping[str, float]  # GB on the fullest device: weights, grads, optimizer, activations
    reason: str = ""

    @property
    def fits(self) -> bool:
        return self.memory_gb <= self.memory_limit_gb

    def as_dict(self) -> dict:
        return {
            "layout": self.layout.as_dict(), "description": self.layout.describe(),
            "num_micro_batches": self.num_micro_batches, "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
            "model_tflops_per_device": self.model_tflops_per_device,
            "hardware_tflops_per_device": self.hardware_tflops_per_device,
            "memory_gb": self.memory_gb, "memory_limit_gb": self.memory_limit_gb,
            "breakdown": dict(self.breakdown), "memory_breakdown": dict(self.memory_breakdown),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PlanResult:
    """``best`` is None when nothing fits; ``reason`` then says why in plain language."""

    best: Prediction | None
    alternatives: tuple[Prediction, ...]
    reason: str
    candidates_evaluated: int
    search_time_s: float

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def as_dict(self) -> dict:
        return {
            "feasible": self.feasible, "reason": self.reason,
            "best": self.best.as_dict() if self.best else None,
            "alternatives": [p.as_dict() for p in self.alternatives],
            "candidates_evaluated": self.candidates_evaluated, "search_time_s": self.search_time_s,
        }
