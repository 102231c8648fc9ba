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

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.compute import ACT_BYTES, Workload
from advisor.hardware import Hardware
from advisor.model import MLPKind, ModelSpec, NormKind, PositionKind
from advisor.plans import Attention, Precision, Recompute, Schedule
from advisor.units import GiB, MiB


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
    """Bytes saved for backward by one layer per token of a micro-batch (arrays over plans)."""
    tp = np.asarray(tp, dtype=float)
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    e = ACT_BYTES[w.precision]
    heads = m.n_heads
    s = w.seq_len
    scores = 0.0
    if w.attention is Attention.eager:
        # scores (QK^T, scaled, masked) and softmax probabilities, b*heads*s*s each; dropout mask on them for GPT-2.
        drop = 1.0 if m.family in ("gpt", "bloom") else 0.0
        scores = heads * s * (2 * e + drop + (e if drop else 0.0))
    else:
        scores = heads * 4.0 * 2  # flash: logsumexp (fp32) + RNG state per head, negligible
    if w.framework == "megatron":
        # Korthikanti et al. Table 2, generalised: 10h+24h/t without SP (34h/t with SP) for 16-bit;
        # the eager scores term 5as/t (2 bytes scores + 2 softmax + 1 dropout mask per element).
        base16 = np.where(sp, 34.0 * h / tp, 10.0 * h + 24.0 * h / tp)
        if m.mlp is MLPKind.swiglu:
            base16 = base16 + np.where(sp, 1.0, 1.0) * (3 * f - 8 * h) * 2 / tp
        per = base16 * (e / 2.0) + scores / tp
    else:
        per = _hf_layer_bytes(m, w) / tp + scores / tp
    recompute = np.asarray(recompute)
    keep_input = 2.0 * h * (e / 2.0) * np.where(sp, 1.0 / tp, 1.0)
    selective = per - scores / tp
    return np.where(recompute == int(Recompute.full), keep_input, np.where(recompute == int(Recompute.selective), selective, per))


def _hf_layer_bytes(m: ModelSpec, w: Workload) -> float:
    """Per-token bytes autograd keeps for one Hugging Face decoder layer (GPT-2 or Llama modules)."""
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    amp = w.precision in (Precision.bf16_mixed, Precision.fp16_mixed, Precision.fp8_mixed)
    e = ACT_BYTES[w.precision]
    r = 4.0 if (amp or w.precision is Precision.fp32) else e  # residual stream: fp32 under autocast
    total = 0.0
    # norm inputs (residual stream), saved by LayerNorm/RMSNorm
    total += 2 * h * r
    if m.norm is NormKind.rmsnorm:
        # LlamaRMSNorm saves the fp32 upcast input and the normalised fp32 hidden state (x*rsqrt) for the weight mul
        total += 2 * (h * 4.0 + (h * 4.0 if e < 4 else 0.0))
    # GEMM inputs: norm outputs cast for the qkv and first MLP GEMMs, the attention output for o_proj
    total += 2 * h * e + q * e
    # q, k, v and the attention output saved by SDPA (q/k/v after rotary for Llama)
    total += (q + 2 * kv) * e + q * e
    if m.position is PositionKind.rotary:
        total += 0.0  # cos/sin are shared across layers; rotary mul saves cos/sin views only
    if m.mlp is MLPKind.gelu:
        # fc output, gelu_new intermediates (tanh output, 0.5x and 1+tanh: fp32 under autocast), fc2 input
        inner = 3 * f * (4.0 if amp else e)
        total += f * e + inner + f * e
    else:
        # gate and up outputs, silu(gate), and down's input silu(gate)*up
        total += 4 * f * e
    if m.family in ("gpt", "bloom"):
        total += 2 * h * 1.0  # two dropout masks (bool)
    return total


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


@dataclass(frozen=True)
class MemoryParts:
    weights: Any
    gradients: Any
    optimizer_states: Any
    activations: Any
    logits_loss: Any
    transient: Any
    overhead_context: Any
    overhead_comm: Any
    overhead_fragmentation: Any

    def peak(self) -> Any:
        return self.weights + self.gradients + self.optimizer_states + self.activations + self.logits_loss + self.transient

    def overhead(self) -> Any:
        return self.overhead_context + self.overhead_comm + self.overhead_fragmentation


def logits_loss_bytes(m: ModelSpec, w: Workload, tokens: Any, tp: Any) -> Any:
    """Logits and cross-entropy buffers alive at their peak (start of the loss backward).

    logits in activation precision (held by the model output), log-softmax output in fp32 (saved),
    its gradient and the gradient w.r.t. the logits in fp32; under autocast also the fp32 upcast.
    """
    e = ACT_BYTES[w.precision]
    per = e + 4.0 + 4.0 + 4.0 if w.framework != "megatron" else 4.0 + 4.0
    return np.asarray(tokens, dtype=float) * m.vocab / np.asarray(tp, dtype=float) * per
