"""The built-in models (``advisor models``) and ``load_model``: a catalogue name, or a Hugging Face config.json.

Shapes from each model's Hugging Face config.json (openai-community/gpt2*, meta-llama/*) and papers; the
families added with the config.json adapters (Mistral, Mixtral, Qwen, Gemma, Phi-3, OLMo 2, Falcon, GPT-NeoX,
MPT, DeepSeek, GPT-OSS) are their cited config.json (advisor.model.hub_configs) read by those adapters.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional

from advisor.io import is_file, not_a_file
from advisor.model.hf import model_from_hf_config, model_from_hf_dict
from advisor.model.hub_configs import HUB_CONFIGS
from advisor.model.layer import MLPKind, NormKind
from advisor.model.spec import ModelError, ModelSpec, PositionKind
from advisor.spec import checked


def gpt2_like(name: str, n_layers: int, d_model: int, n_heads: int, vocab: int = 50257,
              max_positions: int = 1024, d_ff: Optional[int] = None, tied: bool = True,
              norm_eps: Optional[float] = None) -> ModelSpec:
    return ModelSpec(name=name, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     d_ff=d_ff or 4 * d_model, vocab=vocab, max_positions=max_positions,
                     tied_embeddings=tied, norm_eps=norm_eps, family="gpt")


def llama_like(name: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
               vocab: int, max_positions: int, tied: bool = False, rope_theta: Optional[float] = None,
               norm_eps: Optional[float] = None, rope_scaling: Optional[dict] = None) -> ModelSpec:
    return ModelSpec(name=name, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, d_ff=d_ff, vocab=vocab, max_positions=max_positions,
                     mlp=MLPKind.swiglu, norm=NormKind.rmsnorm, position=PositionKind.rotary,
                     tied_embeddings=tied, linear_bias=False, rope_theta=rope_theta, norm_eps=norm_eps,
                     rope_scaling=rope_scaling, family="llama")


# RoPE's base and the RMSNorms' epsilon of the Llamas, from their config.json: meta-llama/Llama-2-*-hf rms_norm_eps
# 1e-05 and no rope_theta (LlamaConfig's 10000); Meta-Llama-3-8B / -70B and Llama-3.1-405B rope_theta 500000.0,
# rms_norm_eps 1e-05; Llama-3.1-405B's rope_scaling (rope_type llama3), which the catalogue's 405B keeps
LLAMA2, LLAMA3 = dict(rope_theta=10000.0, norm_eps=1e-5), dict(rope_theta=500000.0, norm_eps=1e-5)
LLAMA31_SCALING = {"kind": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_positions": 8192}
GPT2_EPS = 1e-5  # openai-community/gpt2* config.json layer_norm_epsilon


# Shapes from each model's Hugging Face config.json (openai-community/gpt2*, meta-llama/*) and papers.
CATALOGUE: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        gpt2_like("gpt2", 12, 768, 12, norm_eps=GPT2_EPS),
        gpt2_like("gpt2-medium", 24, 1024, 16, norm_eps=GPT2_EPS),
        gpt2_like("gpt2-large", 36, 1280, 20, norm_eps=GPT2_EPS),
        gpt2_like("gpt2-xl", 48, 1600, 25, norm_eps=GPT2_EPS),
        llama_like("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, **LLAMA2),
        llama_like("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, **LLAMA2),
        llama_like("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, **LLAMA2),
        llama_like("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, **LLAMA3),
        llama_like("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, **LLAMA3),
        llama_like("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, **LLAMA3, rope_scaling=LLAMA31_SCALING),
        # GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d_model 12288, 96 heads, 2048 context); the paper gives
        # no LayerNorm epsilon (norm_eps None: the exports say so).
        gpt2_like("gpt3-175b", 96, 12288, 96, vocab=50257, max_positions=2048),
        # BLOOM-176B: bigscience/bloom config.json (ALiBi, embedding LayerNorm, 250880 vocab, layer_norm_epsilon 1e-05).
        ModelSpec(name="bloom-176b", n_layers=70, d_model=14336, n_heads=112, d_ff=4 * 14336,
                  vocab=250880, max_positions=2048, position=PositionKind.alibi,
                  embedding_norm=True, norm_eps=1e-5, family="bloom"),
    ] + [model_from_hf_dict(cfg, name, f"advisor.model.hub_configs[{name!r}]") for name, cfg in HUB_CONFIGS.items()]
}
ALIASES = {
    "llama-2-7b": "llama2-7b", "llama-2-13b": "llama2-13b", "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b", "llama-3-70b": "llama3-70b", "llama-3-405b": "llama3-405b",
    "llama3.1-405b": "llama3-405b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "bloom": "bloom-176b",
    "gpt2-small": "gpt2", "mistral-7b-v0.1": "mistral-7b", "mixtral": "mixtral-8x7b", "qwen2.5-7b-base": "qwen2.5-7b",
    "deepseek-v2-lite-base": "deepseek-v2-lite", "olmo-2-1124-7b": "olmo-2-7b", "phi-3-mini-4k": "phi-3-mini",
    "gpt-oss": "gpt-oss-120b", "llama-4-scout": "llama4-scout", "llama-4-scout-17b-16e": "llama4-scout",
    "llama-4-maverick": "llama4-maverick", "llama-4-maverick-17b-128e": "llama4-maverick", "glm-4.5-air-base": "glm-4.5-air",
    "smollm3": "smollm3-3b", "phi-3.5-moe-instruct": "phi-3.5-moe", "kimi-k2-instruct": "kimi-k2",
}


def list_models() -> list[str]:
    return list(CATALOGUE)


def catalogue_twin(spec: ModelSpec) -> Optional[str]:
    """The catalogue name of a model of ``spec``'s shape, every field but the name equal (a Hugging Face config.json of
    a catalogue model is named after its file or folder: Qwen3-30B-A3B), or None."""
    if spec.name in CATALOGUE:
        return spec.name
    return next((n for n, m in CATALOGUE.items() if m == spec.model_copy(update={"name": n})), None)


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A catalogue name (``gpt2-xl``), or a path to a Hugging Face ``config.json``."""
    if isinstance(name_or_path, ModelSpec):  # built in Python (model_copy skips validation): checked again
        return checked(name_or_path, ModelError, f"model {name_or_path.name}")
    text = str(name_or_path)
    key = ALIASES.get(text.lower(), text.lower())
    if key in CATALOGUE:
        return CATALOGUE[key]
    path = Path(text)
    if is_file(path / "config.json"):
        path = path / "config.json"
    if is_file(path):
        return model_from_hf_config(path)
    kind = not_a_file(path) if text else None  # a folder, FIFO or device is named as what it is, not "not found"
    if kind == "a directory":  # without a config.json that is a regular file
        path = path / "config.json"
        kind = not_a_file(path)
        if kind is None:
            raise ModelError(f"model {text[:200]!r} is a directory without a config.json: give a Hugging Face "
                             "model folder (holding config.json) or the config.json file")
    if kind is not None:
        raise ModelError(f"model config {str(path)[:200]!r} is {kind}, not a file: give a Hugging Face config.json "
                         "file or a catalogue name (see `advisor models`)")
    if text.endswith(".json") or "/" in text:
        raise ModelError(f"model config file {text[:200]!r} not found")
    close = difflib.get_close_matches(key, list(CATALOGUE) + list(ALIASES), n=3, cutoff=0.4)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(CATALOGUE)}"
    raise ModelError(f"unknown model {text[:200]!r}: {hint} (or pass a path to a Hugging Face config.json)")


