"""Named model architectures the planner can be asked about by name ("gpt3-175b", "llama2-70b", ...).

Plain data, no Django: each preset is the published architecture of one model, in ``ModelSpec`` fields,
with where the figures come from. ``seq_len`` is the model's published context length; a caller plans a
different training sequence length by overriding it (``model_spec("llama2-70b", seq_len=2048)``).
"""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.planning.model import ModelSpec, canonical_model_fields

# Llama 2/3 and Mixtral: SwiGLU, no biases, untied output layer, RoPE, and no dropout anywhere (Meta's reference
# meta-llama/llama3 llama/model.py has no dropout layer; the Hugging Face configs set attention_dropout 0.0).
_LLAMA = {"gated_mlp": True, "bias": False, "tied_embeddings": False, "learned_positions": False,
          "dropout": False}

MODEL_PRESETS: dict[str, dict] = {
    "gpt3-175b": {
        "spec": {"name": "GPT-3 175B", "layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048,
                 "vocab": 51200},
        "source": "Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 (96 layers, d_model "
                  "12288, 96 heads, context 2048); vocabulary 50257 padded to 51200 as Megatron-LM does "
                  "(Narayanan et al., SC'21)",
    },
    "llama2-7b": {
        "spec": {"name": "Llama-2 7B", "layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 11008,
                 "seq_len": 4096, "vocab": 32000, **_LLAMA},
        "source": "meta-llama/Llama-2-7b-hf config.json; Touvron et al. 2023, Table 1 (context 4k)",
    },
    "llama2-13b": {
        "spec": {"name": "Llama-2 13B", "layers": 40, "hidden": 5120, "heads": 40, "ffn_hidden": 13824,
                 "seq_len": 4096, "vocab": 32000, **_LLAMA},
        "source": "meta-llama/Llama-2-13b-hf config.json; Touvron et al. 2023, Table 1 (context 4k)",
    },
    "llama2-70b": {
        "spec": {"name": "Llama-2 70B", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
                 "ffn_hidden": 28672, "seq_len": 4096, "vocab": 32000, **_LLAMA},
        "source": "meta-llama/Llama-2-70b-hf config.json; Touvron et al. 2023, Table 1 (context 4k, GQA)",
    },
    "llama3-8b": {
        "spec": {"name": "Llama-3 8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                 "ffn_hidden": 14336, "seq_len": 8192, "vocab": 128256, **_LLAMA},
        "source": "meta-llama/Meta-Llama-3-8B config.json (context 8192)",
    },
    "llama3-70b": {
        "spec": {"name": "Llama-3 70B", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
                 "ffn_hidden": 28672, "seq_len": 8192, "vocab": 128256, **_LLAMA},
        "source": "meta-llama/Meta-Llama-3-70B config.json (context 8192)",
    },
    "llama3-405b": {
        "spec": {"name": "Llama-3 405B", "layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8,
                 "ffn_hidden": 53248, "seq_len": 8192, "vocab": 128256, **_LLAMA},
        "source": "Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783, Table 3 (126 layers, "
                  "model dimension 16,384, FFN 53,248, 128 heads, 8 KV heads, SwiGLU, RoPE) and section 3.2 "
                  "(pre-training at 8K context, later extended to 128K); vocabulary 128,256 from "
                  "meta-llama/Llama-3.1-405B config.json (Table 3's 128,000 tokens + 256 special tokens), as for "
                  "llama3-8b/70b. The model of published_runs.json's Llama 3 Table 4 rows",
    },
    "mixtral-8x7b": {
        "spec": {"name": "Mixtral 8x7B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                 "ffn_hidden": 14336, "experts": 8, "top_k": 2, "seq_len": 32768, "vocab": 32000, **_LLAMA},
        "source": "mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024, 'Mixtral of Experts' (8 experts, "
                  "top-2, context 32k)",
    },
}

PRESET_NAMES: tuple[str, ...] = tuple(sorted(MODEL_PRESETS))


def model_spec(preset: str, overrides: Mapping | None = None) -> ModelSpec:
    """The preset's ``ModelSpec``, with ``overrides`` (ModelSpec fields or their Hugging Face names) on top.
    Raises ValueError for an unknown preset or a bad override, naming it. An override under a Hugging Face name
    replaces the preset's figure like one under the ModelSpec name (the names are made the same first). Overriding
    a mixture-of-experts preset to a dense model (``experts`` 0 or 1) drops the preset's ``top_k`` with its experts,
    unless the override gives one."""
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known presets: {', '.join(PRESET_NAMES)}")
    base = dict(MODEL_PRESETS[preset]["spec"])
    changes = canonical_model_fields(overrides or {})
    experts = changes.get("experts")
    if "top_k" not in changes and not isinstance(experts, bool) and isinstance(experts, int | float) \
            and experts <= 1:
        base.pop("top_k", None)
    return ModelSpec.from_dict({**base, **changes})
