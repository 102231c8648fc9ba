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

Under a low-precision recipe (advisor.precision) each linear's three GEMMs (fprop, dgrad, wgrad) run at the
recipe's rate where the recipe runs them low (the profile's ``matmul_max[<recipe>]``, calibrated from per-GEMM
microbenchmarks against BF16 on the same harness), in BF16 otherwise; the quantisation kernels (amax, cast,
transposes, scales) are memory-bound: the input and the weight once per micro-batch in forward, the output
gradient once in backward, at the recipe's bytes per element. ``fp8-mixed`` reaches here as fp8-delayed (the recipe
every stack's FP8 switch launches: advisor.training TrainingSetup).

The host's side of the same kernels (issuing them) is advisor.host. torch.compile (--compile) changes the tables,
not these formulas: the stack's compiled element-wise bytes, kernel launches and saves (advisor.probe.compiled).
Deliberately left out: CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from advisor import finetune, mtp
from advisor.distinct import on_distinct
from advisor.hardware import Hardware
from advisor.model.layer import DecoderLayer, Linear, keys_per_query
from advisor.parallel import expert
from advisor.precision import FP8_ATTENTION_EFFICIENCY, PASSES, Recipe, fp8_attention_bytes
from advisor.recompute import as_mix, rerun, selected
from advisor.training import Attention
from advisor.unfused_bytes import rotary_bytes, routed_unfused
from advisor.workload import Workload


def recipe_key(hw: Hardware, r: Recipe) -> str:
    """The efficiency entry a recipe's GEMMs run at: its own calibration where the profile has one, else its format's."""
    return r.name if r.name in hw.efficiency.matmul_max else r.format


def recipe_gemm_time(hw: Hardware, r: Recipe, flops: Any, n: Any, k: Any, kernels: float = 1.0, floors: Any = 0.0) -> Any:
    """GPU seconds of a recipe's low-precision GEMMs: the format's peak at the recipe's calibrated efficiency (its
    half dims and fixed time those of the format where the profile gives none for the recipe); ``floors`` more
    kernels queued in sequence pay the kernel floor each (as ``gemm_time``)."""
    e, key = hw.efficiency, recipe_key(hw, r)
    # a format the profile gives no shape terms for (fp4) takes the BF16 kernels' (the same tile shapes and launch)
    h0 = next((e.matmul_half_dim[x] for x in (key, r.format, "bf16") if x in e.matmul_half_dim), 0.0)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    # a format the profile gives no ceiling for runs at the BF16 kernels' (as the B200 and H200 fits assume for FP8)
    top = next(e.matmul_max[x] for x in (key, r.format, "bf16", "fp32") if e.matmul_max.get(x) is not None)
    eff = top * n / (n + h0) * k / (k + h0)
    fixed = next((e.matmul_fixed_us[x] for x in (key, r.format, "bf16") if x in e.matmul_fixed_us), 0.0) * 1e-6 * kernels
    fixed = fixed + e.kernel_floor_us(key, r.format, "bf16") * 1e-6 * np.asarray(floors, dtype=float)
    return flops / (hw.gpu.peak_flops_per_s(r.format) * eff) + np.where(np.asarray(flops) > 0, fixed, 0.0)


def linear_pass_times(w: Workload, lin: Linear, tokens: Any, tp: Any, shape: Optional[tuple] = None,
                      weights: Any = 1.0, weight_casts: Any = 1.0) -> tuple[Any, Any, Any]:
    """(forward, backward, quantisation in forward) GPU seconds of one linear for ``tokens`` tokens on one TP rank.
    Without a recipe: the forward GEMM at the precision's math, backward twice it, no casts. A frozen base (LoRA,
    QLoRA: advisor.finetune) computes its input gradients only, not its weight gradients. ``shape``: (FLOPs, n, k,
    kernels, kernel floors) where another module shapes the GEMM (routed experts: advisor.parallel.expert.gemm_shape), with
    ``weights`` weight matrices of n x k to cast; ``weight_casts``: the share of micro-batches that cast them
    (advisor.weight_casts share)."""
    hw, r = w.hw, w.precision.recipe
    wg = finetune.weight_grad_share(w)
    if shape is None:
        flops, (n, k), kernels, floors = lin.rank_flops_per_token(tp) * tokens, lin.gemm_dims(tp), 1.0, 0.0
    else:
        flops, n, k, kernels, floors = shape
    if r is None:
        f = gemm_time(hw, w.math, flops, n, k, kernels, floors)
        return f, (1.0 + wg) * f, 0.0
    bf16 = gemm_time(hw, "bf16", flops, n, k, kernels, floors)
    low = recipe_gemm_time(hw, r, flops, n, k, kernels, floors)
    rows = flops / (2.0 * n * k)  # the GEMM's M: the tokens it multiplies (routed copies for experts)
    # the layers the stack keeps in BF16 at each end (Megatron's first_last_layers_bf16; advisor.workload) are spread
    # over all layers: the per-layer time is the mean of the model's layers
    bf16_share = w.bf16_share
    fprop, dgrad, wgrad = (bf16_share * bf16 + (1.0 - bf16_share) * (low if r.runs_low(g) else bf16) for g in PASSES)
    # casts: the input (tokens x k) and the weight (k x n) in forward, the output gradient (tokens x n) in backward;
    # a recipe that keeps wgrad in BF16 still casts all three for fprop and dgrad
    q = w.stack.engine.quantise_bytes.get(r.name, r.quantise_bytes)  # the stack's own kernels, else the recipe's
    q_fwd = (1.0 - bf16_share) * mem_time(hw, q * (rows * k + weight_casts * weights * k * n))
    q_bwd = (1.0 - bf16_share) * mem_time(hw, q * rows * n)
    return fprop + q_fwd, dgrad + wg * wgrad + q_bwd, q_fwd


def cast_seconds(w: Workload, tokens: Any, tp: Any) -> Any:
    """GPU seconds one layer's quantisation kernels take for ``tokens`` tokens on one TP rank, forward and backward
    (0 without a recipe): what `advisor plan --precision auto` reports as the recipe's price beside its GEMMs."""
    if w.precision.recipe is None:
        return 0.0
    total = 0.0
    for lin in w.layer.linears:
        fwd, bwd, q_fwd = linear_pass_times(w, lin, tokens, tp)
        # the backward's cast is the output gradient's: its share of the forward's casts by element count
        n, k = lin.gemm_dims(tp)
        total = total + q_fwd * (1.0 + tokens * n / (tokens * k + k * n))
    return total


def gemm_eff(hw: Hardware, math: str, n: Any, k: Any) -> Any:
    e = hw.efficiency
    key = math if math in e.matmul_max else "fp32"
    h0 = e.matmul_half_dim.get(key, 0.0)
    n = np.asarray(n, dtype=float)
    k = np.asarray(k, dtype=float)
    return e.matmul_max[key] * n / (n + h0) * k / (k + h0)


def gemm_time(hw: Hardware, math: str, flops: Any, n: Any, k: Any, kernels: float = 1.0, floors: Any = 0.0) -> Any:
    """GPU seconds of ``kernels`` GEMM kernels doing ``flops`` in all: FLOPs at the shape's efficiency plus
    the fixed time each kernel pays (``matmul_fixed_us``: fitted, e.g. 24 us for bf16 on an H100), and ``floors``
    more kernels queued behind them with no launch gap, each at the GPU's kernel floor (``matmul_kernel_floor_us``)."""
    key = math if math in hw.efficiency.matmul_max else "fp32"
    fixed = hw.efficiency.matmul_fixed_us.get(key, 0.0) * 1e-6 * kernels
    fixed = fixed + hw.efficiency.kernel_floor_us(key) * 1e-6 * np.asarray(floors, dtype=float)
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
    the keys each query sees, (s + 1) / 2 causal, ~w under a sliding window of w, ~(c + 1) / 2 in chunks of c, at the
    efficiency of its key span (s, w or c); eager attention computes every score of s x s before masking, windows
    or not."""
    hw, s, layer = w.hw, w.seq_len, w.layer
    heads, d = layer.n_heads / tp, (layer.d_head + layer.v_head) / 2.0
    full_flops = 4.0 * tokens * s * d * heads  # QK^T and PV over all s keys
    # attention stays in bf16 under fp8 and fp4 recipes unless --fp8-attention runs it in FP8 (TE's fp8_dpa)
    math = "bf16" if w.math in ("fp8", "fp4") else w.math
    if w.attention is Attention.sdpa:
        causal = keys_per_query(s)
        fwd = sum(n * _fused_forward(w, math, 0.5 * full_flops * span.keys(s) / causal, span.extent(s), d)
                  for span, n in layer.windows) / layer.count
        casts = (0.0, 0.0)
        if w.fp8_attention:  # in the layers the recipe runs low (bf16_share: its BF16 edge layers keep BF16)
            low = 1.0 - w.bf16_share
            # at the FP8 peak, at the BF16 kernel's measured share of its peak times FP8_ATTENTION_EFFICIENCY
            fwd = fwd * (1.0 - low + low * hw.gpu.peak_flops_per_s(math) / hw.gpu.peak_flops_per_s("fp8")
                         / FP8_ATTENTION_EFFICIENCY)
            casts = tuple(low * mem_time(hw, b) for b in fp8_attention_bytes(w, tokens, tp))
        # the fused kernel pays the per-kernel fixed time of a bf16 GEMM (advisor.calibrate.compute.fit_attention)
        fwd = fwd + hw.efficiency.matmul_fixed_us.get("bf16", 0.0) * 1e-6
        # Flash backward recomputes P and runs 4 more GEMMs: 2.5x the forward's work (Dao 2023, FlashAttention-2 s.3)
        return fwd + casts[0], 2.5 * fwd + casts[1]
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
    # one whole cast of the layer's weights (weight_cast_time): what a step's first micro-batch pays beyond the share
    # every micro-batch carries (advisor.weight_casts), as the pipeline's fill sees it
    weight_cast_s: Any = 0.0


def layer_passes(w: Workload, layer: DecoderLayer, tokens: Any, tp: Any, ep: Any = 1.0,
                 etp: Any = 1.0, weight_casts: Any = 1.0) -> dict[str, tuple[Any, Any, Any]]:
    """(forward, backward, forward casts) GPU seconds of each linear of ``layer`` on one GPU (linear_pass_times);
    routed experts at the shape advisor.parallel.expert gives them, their ``copies / ep`` local weights cast."""
    return {lin.name: (linear_pass_times(w, lin, tokens, tp, expert.gemm_shape(w, lin, tokens, tp, ep, etp),
                                         np.asarray(lin.copies, dtype=float) / ep, weight_casts) if lin.copies > 1 else
                       linear_pass_times(w, lin, tokens, tp, weight_casts=weight_casts))
            for lin in layer.linears}


def weight_cast_time(w: Workload, tokens: Any, tp: Any, ep: Any = 1.0, etp: Any = 1.0) -> Any:
    """GPU seconds one layer (the model's mean) takes to quantise all its weights once (0 without a recipe)."""
    if w.precision.recipe is None:
        return 0.0
    once = lambda k: sum(a[2] - b[2] for a, b in zip(layer_passes(w, k, tokens, tp, ep, etp, 1.0).values(),  # noqa: E731
                                                     layer_passes(w, k, tokens, tp, ep, etp, 0.0).values()))
    return sum(k.count * once(k) for k in w.model.layers) / w.model.n_layers


def layer_gemms(w: Workload, layer: DecoderLayer, tokens: Any, tp: Any, ep: Any = 1.0, etp: Any = 1.0) -> dict[str, Any]:
    """Forward GPU seconds of each linear of ``layer`` on one GPU; routed experts as advisor.parallel.expert costs them."""
    return {name: p[0] for name, p in layer_passes(w, layer, tokens, tp, ep, etp).items()}


def layer_times(w: Workload, tokens: Any, tp: Any, sp: Any, recompute: Any, ep: Any = 1.0, etp: Any = 1.0,
                weight_casts: Any = 1.0, rerun_casts: Any = None) -> LayerTimes:
    """One layer's GPU seconds for one micro-batch of ``tokens`` tokens on one GPU, a step's mean where the weights
    are quantised once a step (``weight_casts``: advisor.weight_casts share); a recomputed forward casts
    ``rerun_casts`` of them (rerun_share; None: as the forward)."""
    hw = w.hw
    passes = layer_passes(w, w.layer, tokens, tp, ep, etp, weight_casts)
    gemms = {name: p[0] for name, p in passes.items()}
    gemm_fwd = sum(gemms.values())
    gemm_bwd = sum(p[1] for p in passes.values())
    if len(w.model.layers) > 1:  # dense first layers beside routed ones (DeepSeek): the model's mean layer
        other = {id(k): layer_passes(w, k, tokens, tp, ep, etp, weight_casts) for k in w.model.layers if k is not w.layer}
        gemm_fwd, gemm_bwd = (sum(k.count * sum(p[j] for p in (passes if k is w.layer else other[id(k)]).values())
                                  for k in w.model.layers) / w.model.n_layers for j in (0, 1))
    attn_fwd, attn_bwd = attention_core_time(w, tokens, tp)
    t = w.tables
    rf, rb = rotary_bytes(w, tp)  # RoPE where the tables leave it out (advisor.unfused_bytes)
    ew_fwd = mem_time(hw, (t.elementwise_forward.per_gpu(tp, sp) + rf) * tokens)
    ew_bwd = mem_time(hw, (t.elementwise_backward.per_gpu(tp, sp) + rb) * tokens)
    # backward: the input gradients, and the weight gradients where the weights train (a frozen base: none);
    # adapters and dequantisation add their own (advisor.adapters.with_adapters)
    if w.layer.routed:  # tokens put in expert order and back (advisor.parallel.expert), in the routed layers' share,
        frac = w.layer.count / w.model.n_layers  # and what the stack runs of the routed MLP unfused
        pf, pb = expert.permute_bytes(w, tokens, tp, sp, ep)
        uf, ub = routed_unfused(w, tp, ep, etp)[:2]
        ew_fwd, ew_bwd = ew_fwd + frac * mem_time(hw, pf + uf * tokens), ew_bwd + frac * mem_time(hw, pb + ub * tokens)
    fwd = gemm_fwd + attn_fwd + ew_fwd
    bwd = gemm_bwd + attn_bwd + ew_bwd
    # selective recomputation reruns what the stack's profile names (advisor.selective.Selective)
    ops = w.selective_recomputes
    parts = {**gemms, "attention/core": attn_fwd, "elementwise": ew_fwd}
    if any(op in POINTWISE for op in ops):  # the pointwise ops a sub-module recomputation names apart
        parts.update({op: mem_time(hw, b * tokens) for op, b in pointwise_bytes(w, tp, sp, ep).items()})
    selective = selected(parts, ops, w.layer)
    # a rerun forward casts the weights as the stack's cache lets it: fwd less the casts it does not repeat
    cast = weight_cast_time(w, tokens, tp, ep, etp)
    cached = 0.0 if rerun_casts is None else (weight_casts - rerun_casts) * cast
    rc = rerun(as_mix(recompute, w.model.n_layers), fwd - cached, selective)  # advisor.recompute: the policy's share
    return LayerTimes(gemm_fwd, attn_fwd, ew_fwd, fwd, bwd, rc, cast)


POINTWISE = ("norms", "mlp/act", "attention/latent")  # pointwise_bytes' ops


def pointwise_bytes(w: Workload, tp: Any, sp: Any, ep: Any = None) -> dict[str, Any]:
    """Bytes per token one GPU moves rerunning the ops a sub-module recomputation names apart (engine.selective
    modules): "norms", the layer's d_model-wide norms (read and write h each, split under sequence parallelism);
    "mlp/act", the MLP activation (a gated one reads 2 f and writes f; f the layer's width, a routed layer's k x the
    experts'; split over TP), in the activation dtype; "attention/latent", MLA's own kernels (kernels.latent)."""
    layer, e = w.layer, w.act_bytes
    norms = 2.0 * e * w.model.d_model * sum(1 for _, width in layer.norms if width == w.model.d_model)
    f = layer.d_ff * (expert.routed_copies(w, ep) if layer.routed else 1.0)
    clamp = routed_unfused(w, tp, ep).clamp_forward if layer.routed else 0.0  # the clamp reruns with the activation
    return {"norms": norms / np.where(np.asarray(sp, dtype=bool), tp, 1.0),
            "mlp/act": (3.0 if layer.mlp.gated else 2.0) * e * f / tp + clamp,
            "attention/latent": w.tables.latent_forward.per_gpu(tp, sp)}


@dataclass(frozen=True)
class HeadTimes:
    """GPU seconds outside the layers for one micro-batch: embedding, final norm, logits and loss; of them the word
    embedding's (its lookup, its gradient's zeroing and scatter-add), which a pipeline's first rank runs and the rest
    its last."""

    fwd_s: Any
    bwd_s: Any
    embedding_fwd_s: Any = 0.0
    embedding_bwd_s: Any = 0.0

    def on_ranks(self, head: Any, embedding: Any) -> "HeadTimes":
        """What a rank holding the head (``head`` 1.0, else 0.0) and the embedding (``embedding``) runs of it."""
        f, b = self.fwd_s - self.embedding_fwd_s, self.bwd_s - self.embedding_bwd_s
        return HeadTimes(head * f + embedding * self.embedding_fwd_s, head * b + embedding * self.embedding_bwd_s,
                         embedding * self.embedding_fwd_s, embedding * self.embedding_bwd_s)


def head_times(w: Workload, tokens: Any, tp: Any) -> HeadTimes:
    """The logits GEMM is vocab-parallel under TP (Megatron); the loss moves the stack's bytes per logit."""
    # costed once per distinct (tokens, tp): a search's plans share a few hundred
    return HeadTimes(*on_distinct(lambda x, n: _head_times(w, x, n), tokens, tp))


def _head_times(w: Workload, tokens: Any, tp: Any) -> tuple[Any, Any]:
    hw, h, vocab = w.hw, w.model.d_model, w.model.vocab
    t = w.tables
    # a recipe leaves the output layer in BF16 (advisor.precision); fp8-mixed is costed as fp8-delayed (TrainingSetup)
    math = "bf16" if w.precision.recipe is not None else w.math
    logits_fwd = gemm_time(hw, math, 2.0 * h * vocab * tokens / tp, vocab / tp, h)
    # a stack that pads the vocabulary to a multiple of 128 x tp (Megatron's --make-vocab-size-divisible-by) is aligned
    ok = aligned(vocab / tp, math) | (t.vocab_padding > 0)
    logits_fwd = logits_fwd / np.where(ok, 1.0, UNALIGNED_GEMM_EFFICIENCY)
    logits = tokens * vocab / tp
    emb_bytes = tokens * h * w.act_bytes * 4  # lookup (+ position add) and final norm, half each
    fwd = logits_fwd + mem_time(hw, logits * t.loss_forward + emb_bytes)
    # Embedding backward: zero a V x h fp32 gradient, then scatter-add the token gradients.
    emb_bwd = mem_time(hw, vocab * h / tp * 4.0 + tokens * h * 8.0)
    # a frozen head computes the input gradient only; a frozen embedding has no backward
    ft = w.finetune
    frozen = ft.adapters
    head_lora = 0.0
    if frozen and "head" in ft.target_set:
        r = ft.lora_rank
        head_lora = gemm_time(hw, w.math, 2.0 * tokens * h * r, r, h) + gemm_time(hw, w.math, 2.0 * tokens * r * vocab, vocab, r)
    fwd = fwd + head_lora
    bwd = ((1.0 if frozen else 2.0) * logits_fwd + mem_time(hw, logits * t.loss_backward + emb_bytes)
           + (0.0 if frozen else emb_bwd) + 2.0 * head_lora)
    lookup = mem_time(hw, emb_bytes / 2.0)
    d = w.mtp_layers
    if d:  # each multi-token prediction depth (advisor.mtp): the logits and loss again, eh_proj's 2h -> h GEMM (column-
        # parallel, under the run's recipe: multi_token_prediction.py:1195 fp8_context) and its element-wise passes
        eh = gemm_time(hw, w.math, 2.0 * 2.0 * h * h * tokens / tp, h / tp, 2.0 * h)
        passes = tokens * h * w.act_bytes
        fwd = fwd + d * (logits_fwd + mem_time(hw, logits * t.loss_forward + passes * mtp.FORWARD_ACCESSES) + eh)
        bwd = bwd + d * (2.0 * logits_fwd + mem_time(hw, logits * t.loss_backward + passes * mtp.BACKWARD_ACCESSES) + 2.0 * eh)
    return fwd, bwd, lookup, lookup + (0.0 if frozen else emb_bwd)
