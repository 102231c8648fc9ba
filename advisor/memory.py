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

``peak_bytes`` is what ``torch.cuda.max_memory_allocated()`` reports; CUDA context, NCCL buffers and
allocator fragmentation are ``overhead`` and reported apart. Left out: CPU/NVMe offload, activation
offload, expert parallelism.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.compute import ACT_BYTES, Workload
from advisor.model import MLPKind, ModelSpec
from advisor.plans import Attention, Precision, Recompute, Schedule


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
