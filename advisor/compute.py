"""Compute: FLOPs of a training step as a named breakdown, and the time the GPU needs for them.

FLOPs per token of one transformer layer, forward (a multiply-add = 2 FLOPs; Narayanan et al. 2021,
arXiv 2104.04473 eq. 3, extended to GQA and SwiGLU):
    attention/qkv    2 h (q_dim + 2 kv_dim)          q_dim = heads*d_head, kv_dim = kv_heads*d_head
    attention/core   4 s q_dim                        QK^T and (softmax)V over s keys
    attention/out    2 q_dim h
    mlp              4 h d_ff (GELU) or 6 h d_ff (SwiGLU: gate, up, down)
    logits           2 h V                            once per token, on the last pipeline stage
Backward costs twice the forward (grad w.r.t. inputs and w.r.t. weights); full recomputation adds
one more layer forward, selective recomputation the attention core only (Korthikanti et al. 2022).

Time: each GEMM runs at peak(precision) x matmul efficiency, where efficiency falls for thin GEMMs:
    eff(n, k) = matmul_max * n/(n + h0) * k/(k + h0)
fitted per GPU from measured GEMMs (reference/h100/kernels.jsonl; ``advisor calibrate``). Causal
fused attention (SDPA/flash) does half of the core's FLOPs at its own measured efficiency; eager
attention runs the core as batched GEMMs plus memory-bound passes over the s x s scores.
Element-wise work (norms, activations, dropout, residuals, rotary, the loss) is memory-bound:
bytes moved / (HBM bandwidth x memory efficiency). Each eager kernel also costs a host-side launch;
a layer takes the longer of its GPU time and its launch time (the CPU runs ahead of the GPU).

Two kernel styles are modelled: ``hf`` (Hugging Face eager modules: GELU-tanh and RMSNorm written as
several element-wise kernels) and ``megatron`` (fused bias-GELU, fused layer norm, fused
bias-dropout-add). Deliberately left out: CUDA graphs, torch.compile fusion, FP8 scaling overheads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.hardware import Hardware
from advisor.model import MLPKind, ModelSpec
from advisor.plans import Attention, Precision, Recompute

# Math precision of the GEMMs and bytes of activations, per training precision.
MATH = {
    Precision.fp32: "fp32",  # PyTorch default: TF32 off for matmuls (torch.backends.cuda.matmul.allow_tf32)
    Precision.bf16_mixed: "bf16",
    Precision.fp16_mixed: "fp16",
    Precision.bf16: "bf16",
    Precision.fp8_mixed: "fp8",
}
ACT_BYTES = {
    Precision.fp32: 4.0,
    Precision.bf16_mixed: 2.0,
    Precision.fp16_mixed: 2.0,
    Precision.bf16: 2.0,
    Precision.fp8_mixed: 2.0,  # fp8 GEMM inputs are cast per GEMM; activations stay bf16 (Transformer Engine)
}


@dataclass(frozen=True)
class Workload:
    """The scalar part of a training setup that the compute and memory models need."""

    seq_len: int
    precision: Precision
    attention: Attention
    framework: str  # "hf" or "megatron"


def layer_flops_per_token(m: ModelSpec, seq_len: int) -> dict[str, float]:
    """Forward FLOPs per token of one layer, unsharded (see module docstring)."""
    h, q, kv = m.d_model, m.q_dim, m.kv_dim
    mlp = (6.0 if m.mlp is MLPKind.swiglu else 4.0) * h * m.d_ff
    return {
        "attention/qkv": 2.0 * h * (q + 2 * kv),
        "attention/core": 4.0 * seq_len * q,
        "attention/out": 2.0 * q * h,
        "mlp": mlp,
    }


def logits_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * m.d_model * m.vocab


def model_flops_per_token(m: ModelSpec, seq_len: int) -> float:
    """Forward+backward FLOPs per token of the whole model, no recomputation (3 x forward)."""
    per_layer = sum(layer_flops_per_token(m, seq_len).values())
    return 3.0 * (m.n_layers * per_layer + logits_flops_per_token(m))


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


# Hugging Face modules, bytes per token per layer moved by element-wise kernels, (forward, backward), as
# (coefficient of d_model, coefficient of d_ff); and bytes per attention-score element for eager attention.
# Measured by validation/probes/traffic_probe.py (every aten op's input + output bytes, views, GEMMs and
# attention kernels excluded, 1-layer minus 0-layer model, CUDA autocast lists emulated; data in
# validation/data/traffic_probe.json), with autocast's per-step weight casts taken out (costed apart).
HF_TRAFFIC = {
    # arch, mode: ((fwd h, fwd f), (bwd h, bwd f))
    ("gpt", "fp32"): ((74.1, 72.0), (110.3, 116.0)),
    ("gpt", "amp"): ((66.2, 76.0), (104.3, 120.0)),
    ("gpt", "pure"): ((38.1, 36.0), (56.1, 58.0)),
    ("llama", "fp32"): ((150.2, 20.0), (350.3, 36.0)),
    ("llama", "amp"): ((172.2, 10.0), (389.3, 18.0)),
    ("llama", "pure"): ((119.2, 10.0), (271.3, 18.0)),
}
HF_SCORE_TRAFFIC = {  # bytes per b*heads*s*s element, (forward, backward): (eager - sdpa) traffic / (heads * s)
    # at s = 512 with the same probe (the per-token difference between the two paths is < 10% of it there)
    ("gpt", "fp32"): (36.0, 32.0), ("gpt", "amp"): (31.0, 34.5), ("gpt", "pure"): (18.5, 16.5),
    ("llama", "fp32"): (29.0, 23.0), ("llama", "amp"): (28.8, 31.0), ("llama", "pure"): (30.5, 29.5),
}


def _hf_key(m: ModelSpec, w: Workload) -> tuple[str, str]:
    p = w.precision
    mode = "fp32" if p is Precision.fp32 else ("pure" if p is Precision.bf16 else "amp")
    return ("llama" if m.mlp is MLPKind.swiglu else "gpt", mode)


def elementwise_per_token(m: ModelSpec, w: Workload, tp: Any = 1, sp: Any = False) -> tuple[Any, Any]:
    """(forward, backward) bytes moved per token of one layer by element-wise kernels, per GPU under TP.

    ``hf``: measured per module style (HF_TRAFFIC; no tensor parallelism). ``megatron``: counted kernel
    by kernel: 2 fused LayerNorms (r+w), fused bias-GELU on d_ff (r+w; SwiGLU r 2f w f), 2 fused
    bias-dropout-adds (r 2h, w h, 1-byte mask), q/k/v layout copies (r+w of q+2kv) and the core output
    merge (r+w q); backward reads the saved input and the incoming gradient and writes one gradient per
    kernel: twice forward. Under TP the GELU and the q/k/v work are split across the ranks (columns and
    heads), but without sequence parallelism the LayerNorms and bias-dropout-adds run on the whole
    [s, b, h] tensor on every rank (Korthikanti et al. 2022, arXiv 2205.05198, s.4.2.2: TP leaves them
    unsplit, the 10sbh term of its activation count); sequence parallelism splits them along the sequence.
    """
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    e = ACT_BYTES[w.precision]
    tp = np.asarray(tp, dtype=float)
    if w.framework == "megatron":
        act = 2 * f if m.mlp is MLPKind.gelu else 3 * f
        split = act + 2 * (q + 2 * kv) + 2 * q  # column- and head-parallel: 1/tp per rank
        norms_dropouts = 2 * 2 * h + 2 * (3 * h + 0.5 * h)  # replicated unless sequence parallel
        elems = split / tp + norms_dropouts / np.where(np.asarray(sp, dtype=bool), tp, 1.0)
        return elems * e, 2.0 * elems * e
    (fh, ff), (bh, bf) = HF_TRAFFIC[_hf_key(m, w)]
    return (fh * h + ff * f) / tp, (bh * h + bf * f) / tp


def attention_core_time(m: ModelSpec, hw: Hardware, w: Workload, tokens: Any, tp: Any) -> tuple[Any, Any, Any]:
    """(forward seconds, backward seconds, kernels) of the attention core for ``tokens`` tokens."""
    s, d = w.seq_len, m.d_head
    heads = m.n_heads / tp
    full_flops = 4.0 * tokens * s * d * heads  # QK^T and PV over all s keys
    math = MATH[w.precision]
    e = ACT_BYTES[w.precision]
    if w.attention is Attention.sdpa:
        eff = hw.efficiency.attention_max * s * d / (s * d + hw.efficiency.attention_half_sd)
        fwd = 0.5 * full_flops / (hw.gpu.peak_flops_per_s("bf16" if math == "fp8" else math) * eff)
        if math == "fp32":  # no fp32 flash kernel: the memory-efficient kernel runs at fp32 GEMM speed
            fwd = 0.5 * full_flops / (hw.gpu.peak_flops_per_s("fp32") * hw.efficiency.matmul_max.get("fp32", 0.7) * eff / hw.efficiency.attention_max)
        # the fused kernel pays the per-kernel fixed time of a bf16 GEMM (advisor.calibrate_compute.fit_attention)
        fwd = fwd + hw.efficiency.matmul_fixed_us.get("bf16", 0.0) * 1e-6
        # Flash backward recomputes P and runs 4 more GEMMs: 2.5x the forward's work (Dao 2023, FlashAttention-2 s.3)
        return fwd, 2.5 * fwd, 1.0
    # Eager: two batched GEMMs (s x d x s and s x s x d) and memory passes over the b*heads*s*s scores.
    # HF GPT-2: scale, causal mask, softmax, dropout each read+write the scores (4 passes); HF Llama: mask,
    # softmax (fp32), cast (3). Megatron fuses scale+mask+softmax into one kernel and adds dropout (2).
    gemm = gemm_time(hw, "bf16" if math == "fp8" else math, full_flops, s, d, kernels=2.0)  # QK^T and PV
    score_elems = tokens * s * heads
    if w.framework == "megatron":
        # Megatron's causal fused softmax (scaled_upper_triang_masked_softmax) reads only the lower triangle
        # (half the scores) and writes every row; dropout reads and writes the scores and a 1-byte mask.
        # Backward: the softmax gradient reads output and gradient on the triangle and writes full rows;
        # dropout's reads the gradient and the mask and writes one.
        fwd = gemm + mem_time(hw, score_elems * (1.5 * e + 2 * e + 1))
        return fwd, 2.0 * gemm + mem_time(hw, score_elems * (2 * e + 2 * e + 1)), 4.0
    fwd_b, bwd_b = HF_SCORE_TRAFFIC[_hf_key(m, w)]
    return gemm + mem_time(hw, score_elems * fwd_b), 2.0 * gemm + mem_time(hw, score_elems * bwd_b), 4.0


# Host work per layer and micro-batch: aten ops issued (forward, backward) and the CPU time each costs
# before its kernel launch, measured with a TorchDispatchMode on CPU with tiny tensors by
# validation/probes/host_overhead.py (validation/data/host_overhead.json: two quiet runs on this 2-core
# machine averaged; megatron-core's GPT layer, local spec; HF GPT-2/Llama decoder layers). Each op also
# pays the profile's ``kernel_launch_us`` (cudaLaunchKernel); the GPU idles when its kernels are shorter.
HOST_OPS = {  # (forward ops, backward ops, CPU us per op)
    ("megatron", "gpt"): (65, 95, 8.6),
    ("hf", "gpt", "sdpa"): (75, 98, 6.5),
    ("hf", "gpt", "eager"): (91, 96, 6.0),
    ("hf", "llama", "sdpa"): (77, 142, 4.9),
    ("hf", "llama", "eager"): (123, 164, 4.4),
}


# The rest of a micro-batch's host work: embedding, final norm, LM head and loss (aten ops, forward and
# backward), from the same probe: megatron-core's GPTModel with one layer less that layer; HF models with
# no layers ("-head" rows of host_overhead.json, three runs). Each op costs the style's CPU time per op.
HOST_HEAD_OPS = {("megatron", "gpt"): (44, 27), ("hf", "gpt"): (25, 23), ("hf", "llama"): (31, 34)}


def head_host_time(m: ModelSpec, hw: Hardware, w: Workload, tp: Any = 1) -> Any:
    """Host seconds per micro-batch to issue the embedding, LM head and loss (their ops and the 3 GEMM calls).

    Under TP, five collective calls more (embedding, LM-head gradient, three in the cross-entropy), which
    the probe, run at TP=1 where Megatron skips them, did not count."""
    n_f, n_b = HOST_HEAD_OPS[("megatron", "gpt") if w.framework == "megatron" else ("hf", _arch(m))]
    launch, extra = host_op_costs(m, hw, w)
    coll = np.where(np.asarray(tp) > 1, 5.0 * launch, 0.0)
    return (n_f + n_b) * launch + 3 * extra + coll  # logits GEMM: one call forward, two backward


def _arch(m: ModelSpec) -> str:
    return "llama" if m.mlp is MLPKind.swiglu else "gpt"


def host_ops(m: ModelSpec, w: Workload) -> tuple[float, float, float]:
    if w.framework == "megatron":
        return HOST_OPS[("megatron", "gpt")]
    return HOST_OPS[("hf", _arch(m), w.attention.value)]


def host_op_costs(m: ModelSpec, hw: Hardware, w: Workload) -> tuple[float, float]:
    """(seconds the host spends on one op, extra seconds for a GEMM/attention call) in this kernel style.

    One op: its CPU dispatch (HOST_OPS) plus the CUDA launch. GEMM-like calls (cuBLAS and attention:
    heuristics, workspace, launch) cost the host more: a Python-issued matmul has a ~28 us floor in
    reference/h100/kernels.jsonl (1024^3 takes 35 us though the GPU needs 3).
    """
    launch = (hw.efficiency.kernel_launch_us + host_ops(m, w)[2]) * 1e-6
    return launch, max(hw.efficiency.matmul_host_us * 1e-6 - launch, 0.0)


@dataclass(frozen=True)
class LayerTimes:
    """Seconds for one layer and one micro-batch on one GPU (arrays over plans)."""

    fwd_s: Any  # GPU time of the kernels
    bwd_s: Any
    recompute_s: Any
    host_fwd_s: Any  # host time to issue them
    host_bwd_s: Any
    host_recompute_s: Any
    gemm_fwd_s: Any
    attention_fwd_s: Any
    elementwise_fwd_s: Any


def layer_times(m: ModelSpec, hw: Hardware, w: Workload, micro_batch: Any, tp: Any, recompute: Any, sp: Any = False) -> LayerTimes:
    tokens = np.asarray(micro_batch, dtype=float) * w.seq_len
    tp = np.asarray(tp, dtype=float)
    math = MATH[w.precision]
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    gemms = [  # (flops per token unsharded, n, k) per GEMM, n and k per GPU under TP
        (2.0 * h * (q + 2 * kv), (q + 2 * kv) / tp, h),
        (2.0 * q * h, h, q / tp),
    ]
    if m.mlp is MLPKind.swiglu:
        gemms += [(2.0 * h * f, f / tp, h), (2.0 * h * f, f / tp, h), (2.0 * f * h, h, f / tp)]
    else:
        gemms += [(2.0 * h * f, f / tp, h), (2.0 * f * h, h, f / tp)]
    gemm_fwd = sum(gemm_time(hw, math, fl * tokens / tp, n, k) for fl, n, k in gemms)
    attn_fwd, attn_bwd, _ = attention_core_time(m, hw, w, tokens, tp)
    ew_fwd_bytes, ew_bwd_bytes = elementwise_per_token(m, w, tp, sp)
    ew_fwd = mem_time(hw, ew_fwd_bytes * tokens)
    ew_bwd = mem_time(hw, ew_bwd_bytes * tokens)
    fwd = gemm_fwd + attn_fwd + ew_fwd
    bwd = 2.0 * gemm_fwd + attn_bwd + ew_bwd
    n_fwd, n_bwd, _ = host_ops(m, w)
    launch, extra = host_op_costs(m, hw, w)
    # Forward issues one GEMM-like call per GEMM and one attention call (two eager bmm), backward two each.
    g_fwd = len(gemms) + (1 if w.attention is Attention.sdpa else 2)
    g_bwd = 2 * g_fwd
    host_fwd, host_bwd = n_fwd * launch + g_fwd * extra, n_bwd * launch + g_bwd * extra
    # Tensor parallelism adds two collective calls per layer forward and two backward (all-reduces, or
    # all-gather + reduce-scatter under sequence parallelism), which the probe (run at TP=1, where Megatron
    # skips them) did not count: each is one more op through the dispatcher.
    coll = np.where(tp > 1, 2.0 * launch, 0.0)
    host_fwd, host_bwd = host_fwd + coll, host_bwd + coll
    recompute = np.asarray(recompute)
    full, sel = recompute == int(Recompute.full), recompute == int(Recompute.selective)
    recompute_s = np.where(full, fwd, np.where(sel, attn_fwd, 0.0))
    host_rc = np.where(full, host_fwd, np.where(sel, 8 * launch + extra, 0.0))
    ones = np.ones(np.broadcast_shapes(np.shape(fwd), np.shape(host_fwd)))
    return LayerTimes(fwd, bwd, recompute_s, host_fwd * ones, host_bwd * ones, host_rc * ones, gemm_fwd, attn_fwd, ew_fwd)


def head_times(m: ModelSpec, hw: Hardware, w: Workload, micro_batch: Any, tp: Any) -> tuple[Any, Any]:
    """(forward, backward) seconds of embedding + final norm + logits + loss for one micro-batch.

    The logits GEMM is vocab-parallel under TP (Megatron). The loss reads the logits in fp32:
    HF upcasts them (``logits.float()``), log-softmax reads and writes them, and backward does the
    same again; ~34 bytes per logit under mixed precision, 24 in fp32. Megatron's cross-entropy makes
    more passes (52 bytes per logit under mixed precision, see below).
    """
    tokens = np.asarray(micro_batch, dtype=float) * w.seq_len
    tp = np.asarray(tp, dtype=float)
    math = MATH[w.precision]
    logits_fwd = gemm_time(hw, math, logits_flops_per_token(m) * tokens / tp, m.vocab / tp, m.d_model)
    # Megatron pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by 128): aligned.
    ok = aligned(m.vocab / tp, math) | (w.framework == "megatron")
    logits_fwd = logits_fwd / np.where(ok, 1.0, UNALIGNED_GEMM_EFFICIENCY)
    e = ACT_BYTES[w.precision]
    if w.framework == "megatron":
        # Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py, the same
        # in Megatron-DeepSpeed) on ``logits.float()``: the upcast (r e, w 4), max (r 4), in-place subtract
        # (r+w 8), exp (8), sum (r 4), in-place divide into the saved softmax (8); backward multiplies it by
        # the loss gradient in place (8) and casts back to the half-precision logits' dtype (r 4, w e).
        up = (e + 4) if e < 4 else 0.0
        loss_bytes_fwd = tokens * m.vocab / tp * (up + 4 + 8 + 8 + 4 + 8)
        loss_bytes_bwd = tokens * m.vocab / tp * (8 + ((4 + e) if e < 4 else 0.0))
    else:
        loss_bytes_fwd = tokens * m.vocab / tp * ((e + 4 + 8) if e < 4 else 8.0)
        loss_bytes_bwd = tokens * m.vocab / tp * ((12 + 4 + e) if e < 4 else 16.0)
    emb_bytes = tokens * m.d_model * e * 4  # lookup (+ position add) and final norm
    fwd = logits_fwd + mem_time(hw, loss_bytes_fwd + emb_bytes)
    # Embedding backward: zero a V x h fp32 gradient, then scatter-add the token gradients.
    emb_bwd = mem_time(hw, m.vocab * m.d_model / tp * 4.0 + tokens * m.d_model * 8.0)
    bwd = 2.0 * logits_fwd + mem_time(hw, loss_bytes_bwd + emb_bytes) + emb_bwd
    return fwd, bwd


def optimizer_time(hw: Hardware, optimizer: str, params_local: Any, bytes_per_param: float) -> Any:
    """Memory-bound optimizer step over the locally held parameters (bytes moved per parameter)."""
    eff = hw.efficiency.optimizer_bandwidth[optimizer]  # the profile validator guarantees every optimizer
    return np.asarray(params_local, dtype=float) * bytes_per_param / (hw.gpu.memory_bandwidth_bytes_per_s * eff)
