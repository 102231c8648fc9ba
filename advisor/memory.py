"""Memory: the per-GPU memory of a plan as a named breakdown, and its peak.

Model states follow the ZeRO paper (Rajbhandari et al. 2020, arXiv 1910.02054, s.3.1): with mixed
precision and Adam each parameter costs 2 (half weights) + 2 (half grads) + K=12 (fp32 master
weights, momentum, variance) bytes; ZeRO-1 shards the K bytes over dp, ZeRO-2 also the gradients,
ZeRO-3 also the weights. Its 7.5B-parameter example on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
Hugging Face / torch.autocast training without sharding keeps fp32 weights and grads instead
(4 + 4 + 8 bytes with Adam, and half-precision weight copies cached by autocast in forward).

Activations per layer and token are counted tensor by tensor from what autograd saves (see
``activation_per_token``); Megatron-style layers follow Korthikanti et al. 2022 (arXiv 2205.05198,
Table 2: sbh(34 + 5as/h) bytes without parallelism, 34/t with sequence parallelism, 2sbh with full
recomputation). Pipeline stages keep several micro-batches in flight (1F1B: the first stage holds pp).

``plan_memory`` composes these into the named parts of each candidate plan at its peak.
``peak_bytes`` is what ``torch.cuda.max_memory_allocated()`` reports; CUDA context, NCCL buffers and
allocator fragmentation are ``overhead`` and reported apart. Left out: CPU/NVMe offload, activation
offload, expert parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.compute import ACT_BYTES, Workload
from advisor.hardware import Hardware
from advisor.model import MLPKind, ModelSpec
from advisor.plans import Attention, Precision, Recompute, Schedule
from advisor.styles import Scalars, per_style
from advisor.units import GiB

# NCCL allocates per-communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers); a few hundred MiB
# per process with several communicators (nvidia-smi minus torch's allocations in NCCL jobs).
NCCL_BUFFER_BYTES = 0.25 * GiB
# Allocator fragmentation: reserved exceeds allocated by 2.5-8% in reference/h100/train_examples.jsonl
# (peak_reserved / peak_mem); 5% is kept as headroom in the `fits` verdict.
FRAGMENTATION = 0.05
MEMORY_PARTS = ("weights", "gradients", "optimizer_states", "activations", "logits_loss", "transient")
OVERHEAD_PARTS = ("cuda_context", "comm_buffers", "fragmentation")


def optimizer_state_bytes(optimizer: str, master: bool, precision: Precision) -> float:
    """Bytes per parameter held by the optimizer (momentum, variance, fp32 master copy)."""
    pure_half = precision is Precision.bf16
    state = 2.0 if pure_half else 4.0
    n_states = 1 if optimizer == "sgd" else 2
    return n_states * state + (4.0 if master else 0.0)


def weight_grad_bytes(precision: Precision, master: Any) -> tuple[Any, Any]:
    """(weight bytes, grad bytes) per parameter.

    ``master`` layout (Megatron/DeepSpeed/ZeRO): half weights and grads, fp32 master in the optimizer.
    torch.autocast layout (HF, DDP, FSDP without its own mixed precision): fp32 weights and grads.
    """
    if precision is Precision.fp32:
        return 4.0, 4.0
    if precision is Precision.bf16:
        return 2.0, 2.0
    return np.where(master, 2.0, 4.0), np.where(master, 2.0, 4.0)


def activation_per_token(m: ModelSpec, w: Workload, tp: Any, sp: Any, recompute: Any) -> Any:
    """Bytes saved for backward by one layer per token of a micro-batch (arrays over plans).

    ``megatron`` style: Korthikanti et al. 2022 Table 2 (16-bit: 10h + 24h/t, or 34h/t with sequence
    parallelism, plus 5 a s / t for the eager attention scores), scaled to the activation precision.
    ``hf`` style: what autograd keeps in Hugging Face GPT-2 / Llama layers, measured tensor by tensor
    (see ``hf_layer_bytes``). Full recomputation keeps each layer's input; selective drops the s x s part.
    """
    tp = np.asarray(tp, dtype=float)
    h, f = m.d_model, m.d_ff
    e = ACT_BYTES[w.precision]
    if w.framework == "megatron":
        base16 = np.where(sp, 34.0 * h / tp, 10.0 * h + 24.0 * h / tp)
        if m.mlp is MLPKind.swiglu:  # 34h assumes a 4h GELU MLP; SwiGLU keeps three d_ff-sized tensors
            base16 = base16 + (6.0 * f - 8.0 * h) / tp
        s2 = 5.0 * m.n_heads * w.seq_len / tp if w.attention is Attention.eager else 0.0
        full_layer = (base16 + s2) * (e / 2.0)
        no_scores = base16 * (e / 2.0)
        keep_input = 2.0 * h * (e / 2.0) * np.where(sp, 1.0 / tp, 1.0)
    else:
        base, s2 = hf_layer_bytes(m, w)
        full_layer, no_scores = (base + s2) / tp, base / tp
        keep_input = (2.0 * h + 10.0 if w.precision is Precision.bf16 else 4.0 * h + 10.0) * np.ones_like(tp)
    recompute = np.asarray(recompute)
    return np.where(recompute == int(Recompute.full), keep_input,
                    np.where(recompute == int(Recompute.selective), no_scores, full_layer))


def hf_layer_bytes(m: ModelSpec, w: Workload) -> tuple[float, float]:
    """(bytes per token, s x s bytes per token) one Hugging Face decoder layer keeps for backward.

    Measured on CPU with CUDA's autocast lists emulated (validation/probes/activation_probe.py, data in
    validation/data/activation_probe.json, transformers 5.23): saved tensors deduplicated by storage and
    checked by layer differencing. h = d_model, f = d_ff, kvd = kv_heads * d_head, nh = heads, s = seq.
    Includes the KV cache HF builds in training (``use_cache`` defaults to True): its concatenated K/V
    copies stay alive with the model output. Norm statistics and the flash logsumexp (4 nh) are the
    small constants.
    """
    h, f, kvd, nh, s = m.d_model, m.d_ff, m.kv_dim, m.n_heads, w.seq_len
    p = w.precision
    mode = "fp32" if p is Precision.fp32 else ("pure" if p is Precision.bf16 else "amp")
    eager = w.attention is Attention.eager
    if m.mlp is MLPKind.gelu:  # GPT-2: LayerNorm, gelu_new (four d_ff-sized saves), dropout masks
        table = {
            ("fp32", False): (34 * h + 20 * f + 16 + 4 * nh + 8 * h, 0.0),
            ("fp32", True): (34 * h + 20 * f + 16, 9.0 * nh * s),
            ("amp", False): (22 * h + 16 * f + 16 + 4 * nh + 4 * h, 0.0),
            ("amp", True): (22 * h + 16 * f + 16, 7.0 * nh * s),
            ("pure", False): (18 * h + 10 * f + 12 + 4 * nh + 4 * h, 0.0),
            ("pure", True): (18 * h + 10 * f + 8, 5.0 * nh * s),
        }
    else:  # Llama: RMSNorm, rotary, SwiGLU, no dropout; under autocast q/k/v and gate/up each cast the norm output
        table = {
            ("fp32", False): (32 * h + 8 * kvd + 16 * f + 8 + 4 * nh, 0.0),
            ("fp32", True): (40 * h + 16 * f + 8 + 8 * kvd, 4.0 * nh * s),
            ("amp", False): (30 * h + 4 * kvd + 8 * f + 8 + 4 * nh + 8 * kvd, 0.0),
            ("amp", True): (34 * h + 8 * f + 8 + 8 * kvd, 6.0 * nh * s),
            ("pure", False): (20 * h + 4 * kvd + 8 * f + 8 + 4 * nh, 0.0),
            ("pure", True): (24 * h + 8 * f + 8 + 4 * kvd, 6.0 * nh * s),
        }
    return table[(mode, eager)]


def hf_nonlayer_bytes(m: ModelSpec, w: Workload) -> float:
    """Per-token bytes outside the layers at the end of forward, logits excluded (same probe)."""
    h = m.d_model
    p = w.precision
    extra = 9 * h if p is Precision.fp32 else (5 * h if p is Precision.bf16 else 7 * h)
    if m.mlp is MLPKind.swiglu:
        extra += (12 * h if p is Precision.fp32 else 10 * h) + 8 * m.d_head  # + rotary cos/sin
    return float(extra)


def in_flight_layers(n_layers: int, pp: Any, v: Any, schedule: Any, grad_accum: Any) -> Any:
    """Layer-micro-batches of activations the busiest (first) pipeline stage holds at its peak.

    GPipe keeps all m micro-batches of its L/p layers; 1F1B keeps min(p, m); interleaved 1F1B keeps
    p micro-batches of L/p layers times (1 + (p-1)/(p v)) (Korthikanti et al. 2022, s.4.2.3).
    """
    pp = np.asarray(pp, dtype=float)
    m = np.asarray(grad_accum, dtype=float)
    v = np.asarray(v, dtype=float)
    per_stage = n_layers / pp
    gpipe = per_stage * m
    one_f = per_stage * np.minimum(pp, m)
    inter = per_stage * np.minimum(pp, m) * (1.0 + (pp - 1.0) / (pp * np.maximum(v, 1.0)))
    out = np.where(schedule == int(Schedule.gpipe), gpipe, np.where(schedule == int(Schedule.interleaved), inter, one_f))
    return np.where(pp <= 1, float(n_layers), out)


def logits_loss_bytes(m: ModelSpec, w: Workload, tokens: Any, tp: Any) -> tuple[Any, Any]:
    """(held, peak) bytes of the logits and cross-entropy buffers.

    HF ``ForCausalLMLoss`` (probe above): at the end of forward the logits (held by the model output,
    4 or 2 bytes) and the fp32 log-softmax result (4) are alive; inside log-softmax backward the nll
    gradient and the input gradient (4 + 4) join them: 16 bytes per logit in fp32, 14 in half precision.
    Megatron's vocab-parallel cross entropy works on fp32 logits in place: 4 held, 8 at the peak.
    """
    e = ACT_BYTES[w.precision]
    n = np.asarray(tokens, dtype=float) * m.vocab / np.asarray(tp, dtype=float)
    if w.framework == "megatron":
        return n * 4.0, n * 8.0
    return n * (e + 4.0), n * (e + 4.0 + 8.0)


@dataclass(frozen=True)
class PlanArrays:
    """The per-plan arrays the memory model needs (derived once in ``estimate.evaluate``)."""

    dp: Any
    tp: Any
    pp: Any
    zero: Any
    mb: Any
    ga: Any
    rc: Any
    v: Any
    schedule: Any
    sp: Any
    megatron: Any
    tokens: Any
    layers_stage: Any
    params_local: Any
    p_layer: Any
    shard: Any
    opt_shard: Any
    master: Any
    wb: Any
    gb: Any
    amp_cast: Any
    ddp_kind: Any  # DDP proper (not nn.DataParallel, not ZeRO) with more than one replica


def plan_memory(m: ModelSpec, hw: Hardware, sc: Scalars, p: PlanArrays) -> tuple[dict[str, Any], dict[str, Any]]:
    """Named memory parts (bytes) at the busiest GPU's peak, and the overheads reported apart."""
    dp, tp, pp, zero, mb, ga, rc, v, sp = p.dp, p.tp, p.pp, p.zero, p.mb, p.ga, p.rc, p.v, p.sp
    megatron, tokens, layers_stage, params_local, p_layer = p.megatron, p.tokens, p.layers_stage, p.params_local, p.p_layer
    shard, opt_shard, master, wb, gb, amp_cast = p.shard, p.opt_shard, p.master, p.wb, p.gb, p.amp_cast
    e = ACT_BYTES[sc.precision]
    act_tok = per_style(megatron, sc, lambda w: activation_per_token(m, w, tp, sp, rc))
    full_layer_tok = per_style(megatron, sc, lambda w: activation_per_token(m, w, tp, sp, 0))
    nonlayer = per_style(megatron, sc, lambda w: 0.0 if w.framework == "megatron" else hf_nonlayer_bytes(m, w)) * tokens
    # HF eager attention builds one b x s x s causal mask (fp32 residual dtype) for the whole model.
    eager_mask = np.where(~megatron & (sc.attention.value == "eager"), mb * sc.seq_len**2 * (2.0 if sc.precision is Precision.bf16 else 4.0), 0.0)
    n_inflight = in_flight_layers(m.n_layers, pp, v, p.schedule, ga)
    acts_first = act_tok * tokens * n_inflight + nonlayer + eager_mask
    acts_last = act_tok * tokens * layers_stage + nonlayer + eager_mask
    held_lg, peak_lg = per_style(megatron, sc, lambda w: logits_loss_bytes(m, w, tokens, tp))
    weights = params_local * wb / np.where(zero >= 3, shard, 1.0)
    grads = params_local * gb / np.where(zero >= 2, shard, 1.0)
    opt_states = params_local * optimizer_state_bytes(sc.optimizer, False, sc.precision) / opt_shard
    opt_states = opt_states + np.where(master & (sc.precision not in (Precision.fp32, Precision.bf16)), params_local * 4.0 / opt_shard, 0.0)
    # transient: ZeRO-3 holds two gathered units (current + prefetch): FSDP wraps a layer per unit; DeepSpeed
    # (the megatron style's ZeRO-3 engine) gathers per sub-module, the largest being one linear layer
    # (stage3.py fetch_sub_module: named_parameters(recurse=False)); autocast caches a half-precision copy
    # of every matmul weight until backward uses it; DDP keeps flat gradient buckets beside .grad.
    # (never more than the unsharded weights this GPU does not already hold)
    mlp_in = m.d_ff * (2 if m.mlp.value == "swiglu" else 1)
    largest_linear = m.d_model * max(m.q_dim + 2 * m.kv_dim, mlp_in) / tp
    z3_unit = np.where(megatron, largest_linear, p_layer)
    z3_gather = np.where(zero >= 3, np.minimum(2.0 * z3_unit * wb, params_local * wb * (1.0 - 1.0 / shard)), 0.0)
    autocast_copies = amp_cast * params_local * 2.0
    ddp_buckets = np.where(p.ddp_kind & ~megatron, params_local * gb, 0.0)
    # Gradients are alive during forward/backward when they persist across micro-batches (accumulation),
    # in Megatron's contiguous buffer, in ZeRO's flat (ZeRO-1) or partitioned (ZeRO-2/3) buffers; otherwise (zero_grad(set_to_none=True), one
    # micro-batch) backward allocates them as it frees activations: none exist when the loss backward starts.
    persistent = (ga > 1) | megatron | (zero >= 1)
    grads_fb = np.where(persistent, grads, 0.0)
    head_grad = np.minimum(m.vocab * m.d_model / tp * gb, grads)
    fixed = z3_gather + autocast_copies + ddp_buckets
    # Candidate peaks (the probe's timeline): (a) start of the loss backward: every activation plus the
    # cross-entropy buffers; (b) full recomputation: while the last layer is recomputed, its full
    # activations and ~3 d_ff-sized temporaries join the kept inputs, the held logits and the head's
    # gradient; (c) the optimizer step: all gradients and the optimizer's temporaries.
    # 1F1B: the first stage holds the most in-flight activations, the last holds the logits.
    loss_peak = np.where(pp > 1, np.maximum(acts_first, acts_last + peak_lg), acts_first + peak_lg)
    rc_extra = np.where(rc == int(Recompute.full), full_layer_tok * tokens + 3.0 * m.d_ff / tp * e * tokens + head_grad, 0.0)
    rc_peak = np.where(pp > 1, np.maximum(acts_first, acts_last + held_lg), acts_first + held_lg) + rc_extra
    fb = np.maximum(loss_peak, rc_peak)
    fwd_bwd_phase = fb + fixed + grads_fb
    opt_temp = np.where(np.asarray(sc.optimizer == "adamw"), params_local / opt_shard * (2.0 if sc.precision is Precision.bf16 else 4.0), 0.0)
    opt_phase = grads + opt_temp + ddp_buckets
    in_fb = fwd_bwd_phase >= opt_phase
    lg_part = np.where(loss_peak >= rc_peak, np.where(pp > 1, np.where(acts_last + peak_lg > acts_first, peak_lg, 0.0), peak_lg),
                       np.where(pp > 1, np.where(acts_last + held_lg > acts_first, held_lg, 0.0), held_lg))
    memory = {
        "weights": weights,
        "gradients": np.where(in_fb, grads_fb, grads),
        "optimizer_states": opt_states,
        "activations": np.where(in_fb, fb - lg_part, 0.0),
        "logits_loss": np.where(in_fb, lg_part, 0.0),
        "transient": np.where(in_fb, fixed, opt_temp + ddp_buckets),
    }
    peak = sum(memory.values())
    overhead = {
        "cuda_context": np.full(np.shape(peak), hw.efficiency.framework_overhead_GiB * GiB),
        "comm_buffers": np.where((dp > 1) | (tp > 1) | (pp > 1), NCCL_BUFFER_BYTES, 0.0) * np.ones(np.shape(peak)),
        "fragmentation": FRAGMENTATION * peak,
    }
    return memory, overhead
