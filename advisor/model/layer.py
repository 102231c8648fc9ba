"""The decoder layer, described once: its linear layers (shapes, bias, how tensor parallelism splits them), its
attention core and its norms. Parameter counts, FLOPs, GEMM shapes and times, the units ZeRO-3/FSDP gathers
and the sub-modules DeepSpeed gathers one at a time all read this one table.

A layer is, in order (Megatron's sub-module names; Hugging Face's in brackets):
    qkv    column-parallel  h -> q_dim + 2 kv_dim     [q_proj, k_proj, v_proj / c_attn]
    core   attention over s keys: 4 s q_dim FLOPs per token forward (QK^T and PV)
    out    row-parallel     q_dim -> h                [o_proj / c_proj]
    fc1    column-parallel  h -> d_ff (GELU) or gate and up, h -> d_ff each (SwiGLU)
    fc2    row-parallel     d_ff -> h                 [down_proj / mlp.c_proj]
plus two norms. Column-parallel layers split their outputs over the TP ranks, row-parallel their inputs
(Shoeybi et al. 2019, arXiv 1909.08053, s.3): each rank's GEMM is (n_out / tp) x n_in or n_out x (n_in / tp).
A multiply-add is 2 FLOPs (Narayanan et al. 2021, arXiv 2104.04473, eq. 3, here extended to GQA and SwiGLU).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class MLPKind(str, Enum):
    gelu = "gelu"  # fc -> GELU -> proj (GPT-2, GPT-3, BLOOM)
    swiglu = "swiglu"  # down(silu(gate(x)) * up(x)) (Llama)


class NormKind(str, Enum):
    layernorm = "layernorm"  # weight + bias
    rmsnorm = "rmsnorm"  # weight only


class Split(str, Enum):
    column = "column"  # outputs split over the TP ranks
    row = "row"  # inputs split over the TP ranks (its output is all-reduced)


@dataclass(frozen=True)
class Linear:
    name: str  # "attention/qkv", "mlp/gate", ...
    module: str  # the sub-module holding it: qkv, out, fc1, fc2
    group: str  # its line in the parameter breakdown: attention/qkv, attention/out, mlp
    n_in: int
    n_out: int
    bias: bool
    split: Split

    @property
    def weights(self) -> int:
        return self.n_in * self.n_out

    @property
    def params(self) -> int:
        return self.weights + (self.n_out if self.bias else 0)

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.n_in * self.n_out

    def gemm_dims(self, tp: Any) -> tuple[Any, Any]:
        """(n, k) of one TP rank's GEMM: n the output features, k the reduction dimension."""
        if self.split is Split.column:
            return self.n_out / tp, self.n_in
        return self.n_out, self.n_in / tp


@dataclass(frozen=True)
class DecoderLayer:
    d_model: int
    d_ff: int
    n_heads: int
    kv_heads: int
    d_head: int
    mlp: MLPKind
    norm: NormKind
    linears: tuple[Linear, ...]

    @classmethod
    def build(cls, d_model: int, d_ff: int, n_heads: int, kv_heads: int, d_head: int, mlp: MLPKind, norm: NormKind,
              linear_bias: bool, qkv_bias: bool) -> "DecoderLayer":
        h, f, q, kv, b = d_model, d_ff, n_heads * d_head, kv_heads * d_head, linear_bias
        col, row = Split.column, Split.row
        attn = (Linear("attention/qkv", "qkv", "attention/qkv", h, q + 2 * kv, b or qkv_bias, col),
                Linear("attention/out", "out", "attention/out", q, h, b, row))
        if mlp is MLPKind.swiglu:
            ffn = (Linear("mlp/gate", "fc1", "mlp", h, f, b, col), Linear("mlp/up", "fc1", "mlp", h, f, b, col),
                   Linear("mlp/down", "fc2", "mlp", f, h, b, row))
        else:
            ffn = (Linear("mlp/fc", "fc1", "mlp", h, f, b, col), Linear("mlp/proj", "fc2", "mlp", f, h, b, row))
        return cls(h, f, n_heads, kv_heads, d_head, mlp, norm, attn + ffn)

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_head

    @property
    def norm_params(self) -> int:
        """Parameters of one norm: weight and bias (LayerNorm) or weight only (RMSNorm)."""
        return 2 * self.d_model if self.norm is NormKind.layernorm else self.d_model

    def params(self) -> dict[str, int]:
        """Parameters as a named breakdown (attention/qkv, attention/out, mlp, norms)."""
        out: dict[str, int] = {}
        for lin in self.linears:
            out[lin.group] = out.get(lin.group, 0) + lin.params
        out["norms"] = 2 * self.norm_params
        return out

    @property
    def n_params(self) -> int:
        return sum(self.params().values())

    def flops_per_token(self, seq_len: int, causal: bool = True) -> dict[str, float]:
        """Forward FLOPs per token, unsharded: the linear layers by group and the attention core."""
        out = {"attention/qkv": 0.0, "attention/core": self.core_flops_per_token(seq_len, causal), "attention/out": 0.0,
               "mlp": 0.0}
        for lin in self.linears:
            out[lin.group] += lin.flops_per_token
        return out

    def core_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """QK^T and PV: 4 q_dim FLOPs per key. A decoder's query attends to the keys up to its own, (s + 1) / 2
        on average, which a causal kernel (flash / SDPA) computes; ``causal=False`` counts all s keys, as eager
        attention computes them before masking and as Narayanan et al. 2021 eq. 3 and PaLM's 12 l h q t count."""
        keys = (seq_len + 1) / 2.0 if causal else float(seq_len)
        return 4.0 * keys * self.q_dim

    def module_weights(self) -> dict[str, int]:
        """Weight elements (no biases) of each sub-module, in forward order (qkv, out, fc1, fc2)."""
        out: dict[str, int] = {}
        for lin in self.linears:
            out[lin.module] = out.get(lin.module, 0) + lin.weights
        return out
