"""Model: a decoder-only transformer spec, the built-in catalogue, HF config.json loading, parameter counts.

Parameter counts are a named breakdown and match what Hugging Face ``transformers`` builds:
GPT-2 small 124,439,808 (tied embeddings, biases on every Linear, learned positions); Llama-2 7B
6,738,415,616 (untied, no biases, RMSNorm, SwiGLU); BLOOM-176B 176,247,271,424.

Deliberately left out: mixture-of-experts, encoder-decoder models, multimodal towers.
"""

from __future__ import annotations

import difflib
import json
from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import Field, model_validator

from advisor.errors import AdvisorError, format_validation_error
from advisor.io import is_file, not_a_file, read_text
from advisor.spec import Spec


class MLPKind(str, Enum):
    gelu = "gelu"  # fc -> GELU -> proj (GPT-2, GPT-3, BLOOM)
    swiglu = "swiglu"  # down(silu(gate(x)) * up(x)) (Llama)


class NormKind(str, Enum):
    layernorm = "layernorm"  # weight + bias
    rmsnorm = "rmsnorm"  # weight only


class PositionKind(str, Enum):
    learned = "learned"  # absolute position embedding table (GPT-2, GPT-3)
    rotary = "rotary"  # RoPE: no parameters
    alibi = "alibi"  # BLOOM: no parameters


class ModelSpec(Spec):
    name: str
    n_layers: int = Field(ge=1, le=100_000)
    d_model: int = Field(ge=1, le=10_000_000)
    n_heads: int = Field(ge=1, le=1_000_000)
    n_kv_heads: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    head_dim: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    d_ff: int = Field(ge=1, le=100_000_000)
    vocab: int = Field(ge=1, le=100_000_000)
    max_positions: int = Field(default=2048, ge=1, le=100_000_000)
    mlp: MLPKind = MLPKind.gelu
    norm: NormKind = NormKind.layernorm
    position: PositionKind = PositionKind.learned
    tied_embeddings: bool = True
    linear_bias: bool = True  # biases on every Linear (GPT-2/3, BLOOM)
    qkv_bias: bool = False  # biases on q, k, v only (Qwen2)
    embedding_norm: bool = False  # BLOOM's word_embeddings_layernorm
    family: str = "gpt"  # informational: gpt, llama, bloom, qwen2, ...

    @model_validator(mode="after")
    def _heads(self) -> "ModelSpec":
        kv = self.kv_heads
        if kv > self.n_heads or self.n_heads % kv:
            raise ValueError(f"n_kv_heads={kv} must divide n_heads={self.n_heads}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_head

    # -- parameter counts (a named breakdown) ---------------------------------------------------
    def norm_params(self) -> int:
        return 2 * self.d_model if self.norm is NormKind.layernorm else self.d_model

    def layer_params(self) -> dict[str, int]:
        h, b = self.d_model, self.linear_bias
        qkv = h * (self.q_dim + 2 * self.kv_dim)
        qkv_b = (self.q_dim + 2 * self.kv_dim) if (b or self.qkv_bias) else 0
        if self.mlp is MLPKind.swiglu:
            mlp = 3 * h * self.d_ff + ((2 * self.d_ff + h) if b else 0)
        else:
            mlp = 2 * h * self.d_ff + ((self.d_ff + h) if b else 0)
        return {
            "attention/qkv": qkv + qkv_b,
            "attention/out": self.q_dim * h + (h if b else 0),
            "mlp": mlp,
            "norms": 2 * self.norm_params(),
        }

    def param_breakdown(self) -> dict[str, int]:
        per_layer = sum(self.layer_params().values())
        out = {"embedding": self.vocab * self.d_model}
        if self.position is PositionKind.learned:
            out["position_embedding"] = self.max_positions * self.d_model
        if self.embedding_norm:
            out["embedding_norm"] = self.norm_params()
        out["layers"] = per_layer * self.n_layers
        out["final_norm"] = self.norm_params()
        if not self.tied_embeddings:
            out["lm_head"] = self.vocab * self.d_model
        return out

    @property
    def n_params(self) -> int:
        return sum(self.param_breakdown().values())

    @property
    def params_per_layer(self) -> int:
        return sum(self.layer_params().values())

    @property
    def embedding_params(self) -> int:
        """Parameters outside the transformer layers (embeddings, final norm, untied head)."""
        return self.n_params - self.params_per_layer * self.n_layers


def gpt2_like(name: str, n_layers: int, d_model: int, n_heads: int, vocab: int = 50257,
              max_positions: int = 1024, d_ff: Optional[int] = None, tied: bool = True) -> ModelSpec:
    return ModelSpec(name=name, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     d_ff=d_ff or 4 * d_model, vocab=vocab, max_positions=max_positions,
                     tied_embeddings=tied, family="gpt")


def llama_like(name: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
               vocab: int, max_positions: int, tied: bool = False) -> ModelSpec:
    return ModelSpec(name=name, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                     n_kv_heads=n_kv_heads, d_ff=d_ff, vocab=vocab, max_positions=max_positions,
                     mlp=MLPKind.swiglu, norm=NormKind.rmsnorm, position=PositionKind.rotary,
                     tied_embeddings=tied, linear_bias=False, family="llama")


# Shapes from each model's Hugging Face config.json (openai-community/gpt2*, meta-llama/*) and papers.
CATALOGUE: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        gpt2_like("gpt2", 12, 768, 12),
        gpt2_like("gpt2-medium", 24, 1024, 16),
        gpt2_like("gpt2-large", 36, 1280, 20),
        gpt2_like("gpt2-xl", 48, 1600, 25),
        llama_like("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        llama_like("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        llama_like("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        llama_like("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
        llama_like("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
        llama_like("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
        # GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d_model 12288, 96 heads, 2048 context).
        gpt2_like("gpt3-175b", 96, 12288, 96, vocab=50257, max_positions=2048),
        # BLOOM-176B: bigscience/bloom config.json (ALiBi, embedding LayerNorm, 250880 vocab).
        ModelSpec(name="bloom-176b", n_layers=70, d_model=14336, n_heads=112, d_ff=4 * 14336,
                  vocab=250880, max_positions=2048, position=PositionKind.alibi,
                  embedding_norm=True, family="bloom"),
    ]
}
ALIASES = {
    "llama-2-7b": "llama2-7b", "llama-2-13b": "llama2-13b", "llama-2-70b": "llama2-70b",
    "llama-3-8b": "llama3-8b", "llama-3-70b": "llama3-70b", "llama-3-405b": "llama3-405b",
    "llama3.1-405b": "llama3-405b", "gpt3": "gpt3-175b", "gpt-3": "gpt3-175b", "bloom": "bloom-176b",
    "gpt2-small": "gpt2",
}


class ModelError(AdvisorError):
    pass


def list_models() -> list[str]:
    return list(CATALOGUE)


def load_model(name_or_path: str | Path | ModelSpec) -> ModelSpec:
    """A catalogue name (``gpt2-xl``), or a path to a Hugging Face ``config.json``."""
    if isinstance(name_or_path, ModelSpec):
        return name_or_path
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
