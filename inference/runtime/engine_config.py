"""Settings of the LLM server (one per replica), without torch: validated at submit by the control plane.

    EngineConfig.from_dict({"slots": 4, "block_size": 16})   # ValueError("slots: must be ...") on bad input
"""

from __future__ import annotations

import dataclasses
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
