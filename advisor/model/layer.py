"""The decoder layer, described once: its linear layers (shapes, bias, how tensor parallelism splits them, how
many copies exist and how many a token passes through), its attention core and its norms. Parameter counts,
FLOPs, GEMM shapes and times, the units ZeRO-3/FSDP gathers and the sub-modules DeepSpeed gathers one at a time
all read this one table. advisor.model.build fills it from a ModelSpec.

A layer is, in order (Megatron's sub-module names; Hugging Face's in brackets):
    qkv    column-parallel  h -> q_dim + 2 kv_dim     [q_proj, k_proj, v_proj / c_attn / query_key_value]
           or, with multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, s.2.1): q (or q_a, replicated,
           and q_b) and kv_a (replicated: h -> kv_lora_rank + the shared rope key) and kv_b (column-parallel)
    core   attention: per query, QK^T over the keys it sees at d_qk and PV at d_v: 2 heads (d_qk + d_v) FLOPs a key
    out    row-parallel     heads d_v -> h            [o_proj / c_proj / dense]
    fc1    column-parallel  h -> d_ff (plain) or gate and up, h -> d_ff each (gated: SwiGLU, GeGLU)
    fc2    row-parallel     d_ff -> h                 [down_proj / mlp.c_proj]
plus its norms (two, or four with Gemma 2/3's post-norms, or one in Falcon-7B's parallel block; q/k norms;
MLA's latent norms). Column-parallel layers split their outputs over the TP ranks, row-parallel their inputs
(Shoeybi et al. 2019, arXiv 1909.08053, s.3): each rank's GEMM is (n_out / tp) x n_in or n_out x (n_in / tp);
replicated ones run whole on every rank (megatron-core 0.16 multi_latent_attention.py: the q and kv down
projections are ``parallel_mode="duplicated"``). A multiply-add is 2 FLOPs (Narayanan et al. 2021, arXiv
2104.04473, eq. 3, here extended to GQA, gated MLPs, MLA and experts).

Mixture of experts: an expert linear exists ``copies`` times (every routed expert) and a token passes through
``active`` of them (top-k), so parameters count every copy and FLOPs the active ones (Fedus et al. 2021, Switch
Transformer s.2; Megatron and torchtitan count MoE FLOPs the same way). Layers that differ only in their attention
span (sliding-window, chunked and local/global models) share one DecoderLayer whose ``windows`` says how many layers
see which Span; layers that differ in their weights (DeepSeek's dense first layers) are separate DecoderLayers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple, Optional

import numpy as np

from advisor.distinct import on_distinct


class MLPKind(str, Enum):
    gelu = "gelu"  # fc -> activation -> proj: two linears (GPT-2, BLOOM, Falcon, GPT-NeoX, MPT; any activation)
    swiglu = "swiglu"  # down(silu(gate(x)) * up(x)): three linears (Llama)
    geglu = "geglu"  # down(gelu(gate(x)) * up(x)): three linears (Gemma)

    @property
    def gated(self) -> bool:
        return self is not MLPKind.gelu

    @property
    def kernels(self) -> str:
        """The stack profiles' ``mlp`` key. GeGLU runs the kernels SwiGLU runs (the same three GEMMs, one pointwise
        activation over the gate and a product with up), a tanh-GELU in place of the SiLU: the same bytes move."""
        return "swiglu" if self.gated else "gelu"


class NormKind(str, Enum):
    layernorm = "layernorm"  # weight + bias
    rmsnorm = "rmsnorm"  # weight only
    layernorm_nobias = "layernorm_nobias"  # weight only (MPT, Cohere)
    nonparametric = "nonparametric"  # no parameters (OLMo: LayerNorm without affine weights)

    @property
    def params_per_element(self) -> int:
        return {"layernorm": 2, "rmsnorm": 1, "layernorm_nobias": 1, "nonparametric": 0}[self.value]


class Split(str, Enum):
    column = "column"  # outputs split over the TP ranks
    row = "row"  # inputs split over the TP ranks (its output is all-reduced)
    replicated = "replicated"  # whole on every TP rank (MLA's down projections)


@dataclass(frozen=True)
class Linear:
    name: str  # "attention/qkv", "mlp/gate", "mlp/experts/up", ...
    module: str  # the sub-module holding it: qkv, out, fc1, fc2
    group: str  # its line in the parameter breakdown: attention/qkv, attention/out, mlp, mlp/experts, ...
    n_in: int
    n_out: int
    bias: bool
    split: Split
    copies: int = 1  # how many exist: the routed experts
    active: float = 1.0  # how many a token passes through: top-k for routed experts

    @property
    def weights(self) -> int:
        return self.n_in * self.n_out * self.copies

    @property
    def params(self) -> int:
        return self.weights + (self.n_out * self.copies if self.bias else 0)

    @property
    def flops_per_token(self) -> float:
        return 2.0 * self.n_in * self.n_out * self.active

    def rank_flops_per_token(self, tp: Any) -> Any:
        """Forward FLOPs per token on one TP rank: a replicated linear runs whole on each."""
        return self.flops_per_token if self.split is Split.replicated else self.flops_per_token / tp

    def rank_weights(self, tp: Any) -> Any:
        return self.weights if self.split is Split.replicated else self.weights / tp

    def gemm_dims(self, tp: Any) -> tuple[Any, Any]:
        """(n, k) of one TP rank's GEMM: n the output features, k the reduction dimension."""
        if self.split is Split.column:
            return self.n_out / tp, self.n_in
        if self.split is Split.row:
            return self.n_out, self.n_in / tp
        return self.n_out, self.n_in


def keys_per_query(seq_len: int, window: Optional[int] = None, causal: bool = True,
                   chunk: Optional[int] = None) -> float:
    """Keys a query attends to, on average over s positions. Causal: query p sees min(p, w) keys (w: the sliding
    window, HF's ``sliding_window``, which counts the query's own key), so (s + 1) / 2 without a window and
    (w (w + 1) / 2 + (s - w) w) / s ~ w for s >> w; under chunked attention of c (Llama 4) query p sees the
    (p mod c) + 1 keys of its own chunk up to itself: c (c + 1) / 2 per whole chunk, r (r + 1) / 2 for the r
    positions of the last. ``causal=False``: all s, as eager attention computes them."""
    s = float(seq_len)
    if not causal:
        return s
    if chunk is not None and chunk < seq_len:
        whole, rest = divmod(seq_len, chunk)
        return (whole * chunk * (chunk + 1.0) / 2.0 + rest * (rest + 1.0) / 2.0) / s
    if window is None or window >= seq_len:
        return (s + 1.0) / 2.0
    w = float(window)
    return (w * (w + 1.0) / 2.0 + (s - w) * w) / s


class Latent(NamedTuple):
    """Multi-head latent attention's widths beside its heads' (advisor.model.spec.LatentAttention): the query latent
    (0: a full-rank q projection), the key/value latent, and each head's rotated and unrotated query/key parts."""

    q_lora: int
    kv_lora: int
    rope: int
    nope: int


class Span(NamedTuple):
    """The keys a layer's queries may attend to: every earlier one (both None), a sliding ``window`` of them, or
    the earlier ones of the query's ``chunk`` (advisor.model.spec.LayerRun)."""

    window: Optional[int] = None
    chunk: Optional[int] = None

    def keys(self, seq_len: int, causal: bool = True) -> float:
        return keys_per_query(seq_len, self.window, causal, self.chunk)

    def extent(self, seq_len: int) -> int:
        """The longest run of keys one query block spans (a fused kernel's key length): s, w or c."""
        return min(seq_len, self.window or self.chunk or seq_len)


@dataclass(frozen=True)
class DecoderLayer:
    d_model: int
    d_ff: int
    n_heads: int
    kv_heads: int
    d_head: int  # query and key width per head (MLA: qk_nope + qk_rope)
    mlp: MLPKind
    norm: NormKind
    linears: tuple[Linear, ...]
    norms: tuple[tuple[str, int], ...] = ()  # (name, elements) of each norm in the layer
    windows: tuple[tuple[Span, int], ...] = ((Span(), 1),)  # (the attention span, layers with it)
    d_v: Optional[int] = None  # value width per head, where it differs from d_head (MLA)
    core_params: int = 0  # parameters of the attention core itself: GPT-OSS's per-head sink logits
    softcap: Optional[float] = None  # attention logit soft-capping, tanh(x / c) c (Gemma 2)
    latent: Optional[Latent] = None  # multi-head latent attention's widths (DeepSeek-V2/V3)

    @property
    def count(self) -> int:
        """How many of the model's layers are this layer."""
        return sum(n for _, n in self.windows)

    @property
    def v_head(self) -> int:
        return self.d_v or self.d_head

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.d_head

    @property
    def kv_dim(self) -> float:
        """Width of one of K and V per token (their mean where K and V differ: MLA's expanded keys and values)."""
        return self.kv_heads * (self.d_head + self.v_head) / 2 if self.d_v else self.kv_heads * self.d_head

    @property
    def qkv_dim(self) -> float:
        """Width of Q, K and V together per token (the qkv linear's output): q_dim + 2 kv_dim."""
        return self.q_dim + 2.0 * self.kv_dim

    def latent_widths(self) -> dict[str, int]:
        """Elements per token of MLA's tensors, all 0 without it: the query's rotated part (``q_rope``, heads x rope),
        kv_b's output (``kv_up``, heads x (nope + d_v)), the normed latents (``latents``, q and kv), the kv latent
        alone (``kv_latent``) and kv_a's output (``kv_down``: the kv latent and the shared rope key)."""
        x = self.latent or Latent(0, 0, 0, 0)
        return {"q_rope": self.n_heads * x.rope, "kv_up": self.n_heads * (x.nope + self.v_head) if self.latent else 0,
                "latents": x.q_lora + x.kv_lora, "kv_latent": x.kv_lora, "kv_down": x.kv_lora + x.rope}

    @property
    def norm_params(self) -> int:
        """Parameters of one d_model-wide norm: weight and bias (LayerNorm), weight only, or none."""
        return self.norm.params_per_element * self.d_model

    @property
    def routed(self) -> bool:
        """Whether a token takes some of the layer's weights and not others (routed experts)."""
        return any(lin.copies != lin.active for lin in self.linears)

    def params(self) -> dict[str, int]:
        """Parameters as a named breakdown (attention/qkv, attention/out, mlp, mlp/experts, ..., norms)."""
        out: dict[str, int] = {}
        for lin in self.linears:
            out[lin.group] = out.get(lin.group, 0) + lin.params
        if self.core_params:
            out["attention/sinks"] = self.core_params
        out["norms"] = self.norm.params_per_element * sum(n for _, n in self.norms)
        return out

    @property
    def n_params(self) -> int:
        return sum(self.params().values())

    @property
    def active_params(self) -> float:
        """Parameters one token uses: every linear at its active copies (top-k of the routed experts)."""
        full = sum(lin.params for lin in self.linears)
        used = sum(lin.params * lin.active / lin.copies for lin in self.linears)
        return self.n_params - full + used

    def flops_per_token(self, seq_len: int, causal: bool = True) -> dict[str, float]:
        """Forward FLOPs per token, unsharded: the linear layers by group and the attention core."""
        out = {"attention/qkv": 0.0, "attention/core": self.core_flops_per_token(seq_len, causal), "attention/out": 0.0,
               "mlp": 0.0}
        for lin in self.linears:
            out[lin.group] = out.get(lin.group, 0.0) + lin.flops_per_token
        return out

    def mean_keys(self, seq_len: int, causal: bool = True) -> float:
        """Keys per query, averaged over this layer's windows."""
        if len(self.windows) == 1:
            return self.windows[0][0].keys(seq_len, causal)
        return sum(n * span.keys(seq_len, causal) for span, n in self.windows) / self.count

    def core_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """QK^T (d_head) and PV (d_v) for each key a query sees: 2 heads (d_head + d_v) FLOPs per key. A decoder's
        query attends to the keys up to its own, (s + 1) / 2 on average (fewer under a window or chunks), which a
        causal kernel (flash / SDPA) computes; ``causal=False`` counts all s keys, as eager attention computes them
        before masking and as Narayanan et al. 2021 eq. 3 and PaLM's 12 l h q t count."""
        return 2.0 * self.mean_keys(seq_len, causal) * self.n_heads * (self.d_head + self.v_head)

    def module_weights(self) -> dict[str, int]:
        """Weight elements (no biases) of each sub-module, in forward order (qkv, out, fc1, fc2)."""
        out: dict[str, int] = {}
        for lin in self.linears:
            out[lin.module] = out.get(lin.module, 0) + lin.weights
        return out

    def rank_module_weights(self, tp: Any) -> dict[str, Any]:
        """Weight elements of each sub-module on one TP rank (replicated linears whole)."""
        out: dict[str, Any] = {}
        for lin in self.linears:
            out[lin.module] = out.get(lin.module, 0) + lin.rank_weights(tp)
        return out

    def largest_module_weights(self, tp: Any) -> Any:
        """The weight elements of the largest sub-module on one TP rank (costed once per distinct tp: a search passes
        a few over many plans)."""
        return on_distinct(lambda t: np.maximum.reduce(list(self.rank_module_weights(t).values())), tp)

    def rank_params(self, tp: Any) -> Any:
        """Parameters one TP rank holds: split linears' share and replicated linears whole; biases and norms
        counted as split, as the cost model always has (they are < 0.1% of a layer)."""
        replicated = sum(lin.params for lin in self.linears if lin.split is Split.replicated)
        return (self.n_params - replicated) / tp + replicated
