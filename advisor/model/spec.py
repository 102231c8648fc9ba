"""A decoder-only transformer: its shape, its parameter count as a named breakdown.

The layer's own parameters come from the layer table (advisor.model.layer); here are those outside the
layers: the token embedding, learned positions where the model has them, BLOOM's embedding norm, the final
norm and an untied LM head. The counts match what Hugging Face ``transformers`` builds: GPT-2 small
124,439,808 (tied embeddings, biases on every Linear, learned positions); Llama-2 7B 6,738,415,616 (untied,
no biases, RMSNorm, SwiGLU); BLOOM-176B 176,247,271,424.

Deliberately left out: mixture-of-experts, encoder-decoder models, multimodal towers.
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field, model_validator

from advisor.errors import AdvisorError
from advisor.model.layer import DecoderLayer, MLPKind, NormKind
from advisor.spec import Spec


class PositionKind(str, Enum):
    learned = "learned"  # absolute position embedding table (GPT-2, GPT-3)
    rotary = "rotary"  # RoPE: no parameters
    alibi = "alibi"  # BLOOM: no parameters


class ModelError(AdvisorError):
    pass


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

    @property
    def layer(self) -> DecoderLayer:
        """The decoder layer's table of operations (advisor.model.layer)."""
        return DecoderLayer.build(self.d_model, self.d_ff, self.n_heads, self.kv_heads, self.d_head, self.mlp,
                                  self.norm, self.linear_bias, self.qkv_bias)

    # -- parameter counts (a named breakdown) ---------------------------------------------------
    def layer_params(self) -> dict[str, int]:
        return self.layer.params()

    def param_breakdown(self) -> dict[str, int]:
        layer = self.layer
        out = {"embedding": self.vocab * self.d_model}
        if self.position is PositionKind.learned:
            out["position_embedding"] = self.max_positions * self.d_model
        if self.embedding_norm:
            out["embedding_norm"] = layer.norm_params
        out["layers"] = layer.n_params * self.n_layers
        out["final_norm"] = layer.norm_params
        if not self.tied_embeddings:
            out["lm_head"] = self.vocab * self.d_model
        return out

    @property
    def n_params(self) -> int:
        return sum(self.param_breakdown().values())

    @property
    def params_per_layer(self) -> int:
        return self.layer.n_params

    @property
    def embedding_params(self) -> int:
        """Parameters outside the transformer layers (embeddings, final norm, untied head)."""
        return self.n_params - self.params_per_layer * self.n_layers

    @property
    def position_params(self) -> int:
        """A learned position table's parameters (0 for rotary and ALiBi)."""
        return self.max_positions * self.d_model if self.position is PositionKind.learned else 0
