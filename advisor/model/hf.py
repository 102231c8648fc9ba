"""Hugging Face config.json, read offline into a ModelSpec (GPT-2 or Llama-style keys)."""

from __future__ import annotations

import json
from pathlib import Path

from advisor.errors import format_validation_error
from advisor.io import read_text
from advisor.model.layer import MLPKind, NormKind
from advisor.model.spec import ModelError, ModelSpec, PositionKind


def _need(cfg: dict, key: str, origin: str, default=None):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is not None:
        return default
    raise ModelError(f"{origin}: config.json lacks {key!r}")


def _opt(cfg: dict, key: str, default):
    """An optional config.json key: absent or null means the default; any other value (0 too) is validated."""
    value = cfg.get(key)
    return default if value is None else value


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json offline (GPT-2 or Llama-style keys)."""
    origin = str(path)
    try:
        cfg = json.loads(read_text(path, "Hugging Face config.json", ModelError))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ModelError(f"{origin}: malformed JSON ({exc.__class__.__name__}: {str(exc).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{origin}: config.json must be a JSON object")
    p = Path(path)
    # a model folder's config.json is named by its folder (Qwen2-7B/config.json); any other file by its stem
    name = (p.resolve().parent.name if p.name == "config.json" else p.stem) or p.stem
    mtype = str(cfg.get("model_type", "")).lower()
    try:
        if "n_layer" in cfg or mtype == "gpt2":
            h = _need(cfg, "n_embd", origin)
            return ModelSpec(
                name=name, n_layers=_need(cfg, "n_layer", origin), d_model=h,
                n_heads=_need(cfg, "n_head", origin), d_ff=_opt(cfg, "n_inner", 4 * h),
                vocab=_need(cfg, "vocab_size", origin), max_positions=_opt(cfg, "n_positions", 1024),
                tied_embeddings=cfg.get("tie_word_embeddings", True), family="gpt",
            )
        if "num_hidden_layers" in cfg:
            h = _need(cfg, "hidden_size", origin)
            heads = _need(cfg, "num_attention_heads", origin)
            act = str(cfg.get("hidden_act", "silu")).lower()
            swiglu = mtype in ("llama", "mistral", "qwen2", "qwen3", "gemma") or act in ("silu", "swish")
            return ModelSpec(
                name=name, n_layers=cfg["num_hidden_layers"], d_model=h, n_heads=heads,
                n_kv_heads=_opt(cfg, "num_key_value_heads", heads), head_dim=cfg.get("head_dim"),
                d_ff=_need(cfg, "intermediate_size", origin, 4 * h), vocab=_need(cfg, "vocab_size", origin),
                max_positions=_opt(cfg, "max_position_embeddings", 2048),
                mlp=MLPKind.swiglu if swiglu else MLPKind.gelu,
                norm=NormKind.rmsnorm if swiglu else NormKind.layernorm,
                position=PositionKind.rotary,
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                linear_bias=bool(cfg.get("mlp_bias", False)) if swiglu else True,
                qkv_bias=bool(cfg.get("attention_bias", mtype == "qwen2")),
                family=mtype or "llama",
            )
    except ModelError:
        raise
    except Exception as exc:  # pydantic validation of the values found
        raise ModelError(f"{origin}: {format_validation_error(exc)}") from None
    raise ModelError(
        f"{origin}: not a GPT-2 (n_layer/n_embd/n_head) or Llama (num_hidden_layers/hidden_size/...) config"
    )
