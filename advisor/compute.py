"""Compute: the GPU time of one layer's kernels and of the work outside the layers, for one micro-batch.

GEMMs are the layer table's linear layers (advisor.model.layer), each rank's share under tensor parallelism,
at the datasheet peak of the math precision times a measured efficiency that falls for thin GEMMs:
    eff(n, k) = matmul_max * n/(n + h0) * k/(k + h0)
plus a fixed GPU time per kernel (``matmul_fixed_us``), fitted per GPU from measured GEMMs
(reference/h100/kernels.jsonl; ``advisor calibrate``). Backward costs twice the forward's GEMMs (gradients
with respect to inputs and to weights). Causal fused attention (SDPA/flash) does half of the core's FLOPs
at its own measured efficiency; eager attention runs the core as batched GEMMs plus memory-bound passes over
the s x s scores. Element-wise work (norms, activations, dropout, residuals, rotary, the loss) is
memory-bound: bytes moved, as the stack's profile measures them (advisor.stack), over HBM bandwidth x the
element-wise efficiency. Full recomputation reruns the layer forward, selective the attention core.

The host's side of the same kernels (issuing them) is advisor.host. Deliberately left out: CUDA graphs,
torch.compile fusion, FP8 scaling kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.hardware import Hardware
from advisor.model.layer import DecoderLayer, keys_per_query
from advisor.parallel import expert
from advisor.training import Attention, Recompute
from advisor.workload import Workload


def gemm_eff(hw: Hardware, math: str, n: Any, k: Any) -> Any:
    e = hw.efficiency
    key = math if math in e.matmul_max else "fp32"
    h0 = e.matmul_half_dim.get(key, 0.0)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    return e.matmul_max[key] * n / (n + h0) * k / (k + h0)


def gemm_time(hw: Hardware, math: str, flops: Any, n: Any, k: Any, kernels: float = 1.0) -> Any:
    """GPU seconds of ``kernels`` GEMM kernels doing ``flops`` in all: FLOPs at the shape's efficiency plus
    the fixed time each kernel pays (``matmul_fixed_us``: fitted, e.g. 24 us for bf16 on an H100)."""
    key = math if math in hw.efficiency.matmul_max else "fp32"
    fixed = hw.efficiency.matmul_fixed_us.get(key, 0.0) * 1e-6 * kernels
    return flops / (hw.gpu.peak_flops_per_s(math) * gemm_eff(hw, math, n, k)) + np.where(np.asarray(flops) > 0, fixed, 0.0)


# Tensor-core GEMMs want every dimension a multiple of 8 half-precision elements (16 bytes; NVIDIA
# "Matrix Multiplication Background" guide, Tensor Core requirements); otherwise cuBLAS falls back to
# kernels for unaligned operands. nanoGPT measured ~25% faster GPT-2 124M training from padding the
# vocabulary 50257 -> 50304, which for its logits GEMM + loss share means roughly half speed unaligned.
UNALIGNED_GEMM_EFFICIENCY = 0.5


def aligned(dim: Any, math: str) -> Any:
    return (np.asarray(dim) % 8 == 0) | (math == "fp32")


def mem_time(hw: Hardware, nbytes: Any) -> Any:
    """Seconds for element-wise kernels moving ``nbytes`` (at the element-wise fraction of HBM bandwidth)."""
    return nbytes / (hw.gpu.memory_bandwidth_bytes_per_s * hw.efficiency.elementwise)


def attention_core_time(w: Workload, tokens: Any, tp: Any) -> tuple[Any, Any]:
    """(forward, backward) GPU seconds of the attention core for ``tokens`` tokens on one TP rank. QK^T runs at the
    query/key width and PV at the value width (they differ under MLA): each GEMM at their mean. A fused kernel does
    the keys each query sees, (s + 1) / 2 causal or ~w under a sliding window of w, at the efficiency of its key
    span (s, or w); eager attention computes every score of s x s before masking, windows or not."""
    hw, s, layer = w.hw, w.seq_len, w.layer
    heads, d = layer.n_heads / tp, (layer.d_head + layer.v_head) / 2.0
    full_flops = 4.0 * tokens * s * d * heads  # QK^T and PV over all s keys
    math = "bf16" if w.math == "fp8" else w.math  # attention stays in bf16 under fp8 recipes
    if w.attention is Attention.sdpa:
        causal = keys_per_query(s)
        fwd = sum(n * _fused_forward(w, math, 0.5 * full_flops * keys_per_query(s, win) / causal, min(s, win or s), d)
                  for win, n in layer.windows) / layer.count
        # the fused kernel pays the per-kernel fixed time of a bf16 GEMM (advisor.calibrate.compute.fit_attention)
        fwd = fwd + hw.efficiency.matmul_fixed_us.get("bf16", 0.0) * 1e-6
        # Flash backward recomputes P and runs 4 more GEMMs: 2.5x the forward's work (Dao 2023, FlashAttention-2 s.3)
        return fwd, 2.5 * fwd
    # Eager: two batched GEMMs (s x d x s and s x s x d) and the stack's memory passes over the scores
    gemm = gemm_time(hw, math, full_flops, s, d, kernels=2.0)  # QK^T and PV
    score_elems = tokens * s * heads
    t = w.tables
    return gemm + mem_time(hw, score_elems * t.score_forward), 2.0 * gemm + mem_time(hw, score_elems * t.score_backward)


def _fused_forward(w: Workload, math: str, flops: Any, span: int, d: float) -> Any:
    """Seconds of a fused attention kernel's ``flops`` over a key span of ``span``, at its measured efficiency."""
    hw = w.hw
    eff = hw.efficiency.attention_max * span * d / (span * d + hw.efficiency.attention_half_sd) * w.tables.attention_efficiency
    if math == "fp32":  # no fp32 flash kernel: the memory-efficient kernel runs at fp32 GEMM speed
        return flops / (hw.gpu.peak_flops_per_s("fp32") * hw.efficiency.matmul_max.get("fp32", 0.7) * eff / hw.efficiency.attention_max)
    return flops / (hw.gpu.peak_flops_per_s(math) * eff)


@dataclass(frozen=True)
class LayerTimes:
    """GPU seconds of one layer for one micro-batch on one GPU (arrays over plans)."""

    gemm_fwd_s: Any
    attention_fwd_s: Any
    elementwise_fwd_s: Any
    fwd_s: Any
    bwd_s: Any
    recompute_s: Any


def layer_gemms(w: Workload, layer: DecoderLayer, tokens: Any, tp: Any, ep: Any = 1.0, etp: Any = 1.0) -> dict[str, Any]:
    """Forward GPU seconds of each linear of ``layer`` on one GPU; routed experts as advisor.parallel.expert costs them."""
    hw = w.hw
    return {lin.name: (gemm_time(hw, w.math, *expert.gemm_shape(w, lin, tokens, tp, ep, etp)) if lin.copies > 1 else
                       gemm_time(hw, w.math, lin.rank_flops_per_token(tp) * tokens, *lin.gemm_dims(tp)))
            for lin in layer.linears}


def layer_times(w: Workload, tokens: Any, tp: Any, sp: Any, recompute: Any, ep: Any = 1.0, etp: Any = 1.0) -> LayerTimes:
    hw = w.hw
    gemms = layer_gemms(w, w.layer, tokens, tp, ep, etp)
    gemm_fwd = sum(gemms.values())
    if len(w.model.layers) > 1:  # dense first layers beside routed ones (DeepSeek): the model's mean layer
        gemm_fwd = sum(k.count * (gemm_fwd if k is w.layer else sum(layer_gemms(w, k, tokens, tp, ep, etp).values()))
                       for k in w.model.layers) / w.model.n_layers
    attn_fwd, attn_bwd = attention_core_time(w, tokens, tp)
    t = w.tables
    ew_fwd = mem_time(hw, t.elementwise_forward.per_gpu(tp, sp) * tokens)
    ew_bwd = mem_time(hw, t.elementwise_backward.per_gpu(tp, sp) * tokens)
    if w.layer.routed:  # tokens put in expert order and back (advisor.parallel.expert), in the routed layers' share
        frac = w.layer.count / w.model.n_layers
        pf, pb = expert.permute_bytes(w, tokens, tp, sp, ep)
        ew_fwd, ew_bwd = ew_fwd + frac * mem_time(hw, pf), ew_bwd + frac * mem_time(hw, pb)
    fwd = gemm_fwd + attn_fwd + ew_fwd
    bwd = 2.0 * gemm_fwd + attn_bwd + ew_bwd
    # selective recomputation reruns what the stack's profile names (advisor.stack.Selective)
    parts = {**gemms, "attention/core": attn_fwd, "elementwise": ew_fwd}
    selective = sum(parts[op] for op in w.selective_recomputes) if w.selective_recomputes else 0.0
    rc = np.where(recompute == Recompute.full.code, fwd, np.where(recompute == Recompute.selective.code, selective, 0.0))
    return LayerTimes(gemm_fwd, attn_fwd, ew_fwd, fwd, bwd, rc)


@dataclass(frozen=True)
class HeadTimes:
    """GPU seconds outside the layers for one micro-batch: embedding, final norm, logits and loss."""

    fwd_s: Any
    bwd_s: Any


def head_times(w: Workload, tokens: Any, tp: Any) -> HeadTimes:
    """The logits GEMM is vocab-parallel under TP (Megatron); the loss moves the stack's bytes per logit."""
    hw, h, vocab = w.hw, w.model.d_model, w.model.vocab
    t = w.tables
    logits_fwd = gemm_time(hw, w.math, 2.0 * h * vocab * tokens / tp, vocab / tp, h)
    # a stack that pads the vocabulary to a multiple of 128 x tp (Megatron's --make-vocab-size-divisible-by) is aligned
    ok = aligned(vocab / tp, w.math) | (t.vocab_padding > 0)
    logits_fwd = logits_fwd / np.where(ok, 1.0, UNALIGNED_GEMM_EFFICIENCY)
    logits = tokens * vocab / tp
    emb_bytes = tokens * h * w.act_bytes * 4  # lookup (+ position add) and final norm
    fwd = logits_fwd + mem_time(hw, logits * t.loss_forward + emb_bytes)
    # Embedding backward: zero a V x h fp32 gradient, then scatter-add the token gradients.
    emb_bwd = mem_time(hw, vocab * h / tp * 4.0 + tokens * h * 8.0)
    bwd = 2.0 * logits_fwd + mem_time(hw, logits * t.loss_backward + emb_bytes) + emb_bwd
    return HeadTimes(fwd, bwd)
