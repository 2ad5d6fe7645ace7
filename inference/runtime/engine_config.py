"""Settings of the LLM server (one per replica), without torch: validated at submit by the control plane.

    EngineConfig.from_dict({"slots": 4, "block_size": 16})   # ValueError("slots: must be ...") on bad input
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jobs.runtime.lm_config import _check_int, _reject_unknown


@dataclass(frozen=True)
class EngineConfig:
    """slots: sequences decoded together (continuous batching); block_size: tokens per KV block (the unit of
    prefix reuse); *_cache_blocks: capacity of each prefix-cache tier (device, host DRAM, local disk; 0 turns a
    tier off); max_prompt_tokens: longest prompt accepted (0 = the model's window minus one);
    max_waiting: requests queued inside a replica beyond its slots before it refuses more;
    torch_threads: intra-op threads per replica (1 on small CPU hosts)."""

    slots: int = 4
    block_size: int = 16
    device_cache_blocks: int = 256
    host_cache_blocks: int = 1024
    disk_cache_blocks: int = 4096
    max_prompt_tokens: int = 0
    max_waiting: int = 16
    torch_threads: int = 1

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> EngineConfig:
        d = dict(d or {})
        _reject_unknown(cls, d)
        config = cls(**d)
        _check_int("slots", config.slots, 1, 256)
        _check_int("block_size", config.block_size, 1, 1024)
        _check_int("device_cache_blocks", config.device_cache_blocks, 0, 10_000_000)
        _check_int("host_cache_blocks", config.host_cache_blocks, 0, 10_000_000)
        _check_int("disk_cache_blocks", config.disk_cache_blocks, 0, 100_000_000)
        _check_int("max_prompt_tokens", config.max_prompt_tokens, 0, 1_000_000)
        _check_int("max_waiting", config.max_waiting, 0, 100_000)
        _check_int("torch_threads", config.torch_threads, 1, 256)
        return config

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def replica_kv_limit_bytes() -> int:
    """What one replica may hold in keys and values: FLEETYARD_REPLICA_KV_LIMIT_GIB (default 8), the control plane's
    setting (its deploy check; settings checks it at start-up)."""
    raw = os.environ.get("FLEETYARD_REPLICA_KV_LIMIT_GIB", "8")
    try:
        gib = float(raw)
    except ValueError:
        raise ValueError(f"FLEETYARD_REPLICA_KV_LIMIT_GIB={raw!r} is not a number of GiB") from None
    if not (math.isfinite(gib) and gib * 1024 ** 3 >= 1):
        raise ValueError(f"FLEETYARD_REPLICA_KV_LIMIT_GIB={raw!r} must be a finite number of GiB, more than 0")
    return int(gib * 1024 ** 3)


def kv_memory_bytes(model: Mapping[str, Any], config: EngineConfig) -> int:
    """Bytes of keys and values (float32) a replica of the built-in LM with shape `model` (LMConfig's fields:
    n_layers, d_model, context) holds in memory: every slot's whole window, plus the device and host tiers of the
    prefix cache full (the disk tier is on disk; blocks on their way there, in memory until written, are not
    counted)."""
    per_token = 2 * int(model["n_layers"]) * int(model["d_model"]) * 4
    cached = (config.device_cache_blocks + config.host_cache_blocks) * config.block_size
    return per_token * (config.slots * int(model["context"]) + cached)


def kv_memory_refusal(model: Mapping[str, Any], config: EngineConfig, limit_bytes: int) -> str:
    """Why a replica of `model` with these engine settings would hold too much KV memory, or "": an engine
    allocates its slots' caches when the replica starts, so a window of 32,768 tokens with 256 slots asks for tens of
    GiB from a model file of a few MB, and would fail there (out of memory), not as a clear refusal here."""
    need = kv_memory_bytes(model, config)
    if need <= limit_bytes:
        return ""
    return (f"a replica would hold {_size(need)} of keys and values ({model['n_layers']} layers x d_model "
            f"{model['d_model']} x ({config.slots} slots x {model['context']}-token window + "
            f"{(config.device_cache_blocks + config.host_cache_blocks) * config.block_size} cached tokens) x 8 "
            f"bytes), over the {_size(limit_bytes)} a replica may hold (FLEETYARD_REPLICA_KV_LIMIT_GIB): lower "
            "engine.slots or the cache tiers, or serve a model with a shorter window")


def _size(size: float) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size:.0f} bytes"
