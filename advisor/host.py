"""The host: the time the CPU takes to issue a micro-batch's kernels, and the flow shop it forms with the GPU.

Each aten op costs the host its dispatch (the stack's measured ``cpu_us_per_op``, advisor.stack) and the CUDA
launch (the profile's ``kernel_launch_us``); GEMM-like calls (cuBLAS and attention: heuristics, workspace,
launch) cost more: a Python-issued matmul has a ~28 us floor in reference/h100/kernels.jsonl (1024^3 takes
35 us though the GPU needs 3), the profile's ``matmul_host_us``.

The host runs ahead of the GPU, so a micro-batch takes at least the longer of the GPU's work and the host's.
It also starts on an empty GPU queue: training loops synchronise the device at least once per micro-batch
(DeepSpeed's ThroughputTimer in every engine.forward(), deepspeed 0.9.5 runtime/engine.py and utils/timer.py;
Megatron-LM's 2021 timers; the HF Trainer's per-step isnan(loss) check). So a micro-batch is a two-stage flow
shop restarted each time: its makespan is the longest of "the host issues the first k ops, then the GPU runs
the rest", taken here at the phase boundaries: when the forward is host-bound and the backward GPU-bound, the
backward cannot start early and the GPU idles through the forward. A stack whose ``device_syncs`` is
``per_phase`` also drains the forward before the backward: each phase takes the longer of its host and GPU
time. The excess over the GPU's work is the step's "host_overhead".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor.adapters import host_work
from advisor.parallel import expert
from advisor.recompute import as_mix, rerun, selected
from advisor.training import Attention
from advisor.workload import Workload


def op_costs(w: Workload) -> tuple[float, float]:
    """(seconds the host spends on one op, extra seconds for a GEMM/attention call) in this stack."""
    eff = w.hw.efficiency
    launch = (eff.kernel_launch_us + w.tables.cpu_us_per_op) * 1e-6
    return launch, max(eff.matmul_host_us * 1e-6 - launch, 0.0)


@dataclass(frozen=True)
class LayerHostTimes:
    """Host seconds to issue one layer's kernels for one micro-batch (arrays over plans)."""

    fwd_s: Any
    bwd_s: Any
    recompute_s: Any

    @property
    def total_s(self) -> Any:
        return self.fwd_s + self.bwd_s + self.recompute_s


def expert_launches(w: Workload, ep: Any) -> Any:
    """Host seconds a routed layer's grouped expert GEMMs take beyond one GEMM call each, forward (backward: twice,
    dgrad and wgrad): Transformer Engine's C++ loop (libtransformer_engine multi_stream_cublas_gemm) launches one
    cuBLAS GEMM per local expert (advisor.parallel.expert gemm_calls), each a CUDA launch (``kernel_launch_us``)
    and no aten op; the first is the call the layer already counts. Its event records and waits are not counted."""
    if not (w.layer.routed and w.stack.engine.moe_grouped_gemm):
        return 0.0
    more = sum(expert.gemm_calls(w, lin, ep)[1] - 1.0 for lin in expert.expert_linears(w.layer))
    return more * w.hw.efficiency.kernel_launch_us * 1e-6


def layer_host_times(w: Workload, tp: Any, recompute: Any, ep: Any = 1) -> LayerHostTimes:
    t = w.tables
    launch, extra = op_costs(w)
    # Forward issues one GEMM-like call per linear layer and one attention call (two eager bmm), backward two each.
    g_fwd = len(w.layer.linears) + (1 if w.attention is Attention.sdpa else 2)
    fwd, bwd = t.host_forward_ops * launch + g_fwd * extra, t.host_backward_ops * launch + 2 * g_fwd * extra
    experts = expert_launches(w, ep)
    fwd, bwd = fwd + experts, bwd + 2.0 * experts
    # a fine-tune's adapters and dequantisation: ops, and GEMM calls at a GEMM's cost (advisor.adapters.host_work)
    (fo, fg), (bo, bg) = host_work(w.layer, w.finetune, w.model.family, w.stack.engine.base_modules)
    fwd, bwd = fwd + fo * launch + fg * (launch + extra), bwd + bo * launch + bg * (launch + extra)
    # Tensor parallelism adds two collective calls per layer forward and two backward (all-reduces, or all-gather
    # + reduce-scatter under sequence parallelism), which the probe (run at TP=1, where Megatron skips them) did
    # not count: each is one more op through the dispatcher.
    coll = np.where(np.asarray(tp) > 1, 2.0 * launch, 0.0)
    fwd, bwd = fwd + coll, bwd + coll
    # selective recomputation reruns what the stack names: the attention core is ~8 ops and one attention call, a
    # linear layer one GEMM call, the pointwise ops every forward op that is not a GEMM or attention call
    issued = {"attention/core": 8 * launch + extra, "elementwise": max(t.host_forward_ops - g_fwd, 0) * launch,
              **{lin.name: launch + extra for lin in w.layer.linears},
              "norms": len(w.layer.norms) * launch, "mlp/act": launch,  # a sub-module's pointwise ops, one call each
              # MLA's up projections rerun besides their GEMM calls: the views, new_empty, contiguous calls and the two
              # rope kernels of multi_latent_attention.py qkv_up_proj_and_rope_apply, 16 ops (megatron-core 0.19.2)
              "attention/latent": 16 * launch}
    selective = selected(issued, w.selective_recomputes, w.layer)
    rc = rerun(as_mix(recompute, w.model.n_layers), fwd, selective)
    ones = np.ones(np.shape(rc))
    return LayerHostTimes(fwd * ones, bwd * ones, rc)


def head_host_time(w: Workload, tp: Any) -> Any:
    """Host seconds per micro-batch to issue the embedding, LM head and loss (their ops and the 3 GEMM calls).

    Under TP, five collective calls more (embedding, LM-head gradient, three in the cross-entropy), which
    the probe, run at TP=1 where Megatron skips them, did not count."""
    t = w.tables
    launch, extra = op_costs(w)
    coll = np.where(np.asarray(tp) > 1, 5.0 * launch, 0.0)
    return (t.head_forward_ops + t.head_backward_ops) * launch + 3 * extra + coll  # logits: 1 call forward, 2 backward


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch on the busiest stage, GPU and host seconds, as the flow shop needs them."""

    gpu_s: Any  # every kernel and in-line collective of the micro-batch
    gpu_fwd_s: Any  # of those, the forward's (layers, head, their TP collectives)
    gpu_after_fwd_s: Any  # the layers' backward and recomputation and the TP collectives after the forward
    head_fwd_s: Any  # the LM head and loss, forward (the forward's tail)
    head_bwd_s: Any
    loss_comm_s: Any  # the loss's TP collectives, in the forward's tail
    host_layers_fwd_s: Any
    host_s: Any  # every op of the micro-batch
    host_head_s: Any


def idle_per_micro_batch(w: Workload, mb: MicroBatch) -> tuple[Any, Any]:
    """Seconds a micro-batch lasts beyond its GPU work because of the host (module docstring), split as (the GPU
    idling while a host-bound forward issues it, the rest: a host slower than the whole flow shop, which idles the
    GPU through the backward too); their sum is the step's host_overhead per micro-batch. Collectives hide in the
    idle time of their own phase: the gradient reduction only in the second part (advisor.parallel.overlap.Windows).
    A stack that synchronises only once per step lets the host run ahead across micro-batches: only a host slower
    than the GPU over the whole micro-batch shows."""
    if w.stack.engine.device_syncs == "per_step":
        return 0.0, np.maximum(mb.host_s - mb.gpu_s, 0.0)
    host_fwd = mb.host_layers_fwd_s
    # The head (LM head and loss, forward then backward) as a flow shop of its own once the host has issued the layers:
    # the host issues its forward ops (hf_host) then its backward ones (hb_host), the GPU runs each after it is issued,
    # so it lasts the longest of host prefix + GPU suffix at the split points: the GPU throughout, the host's forward
    # then the GPU's backward, the host throughout.
    t = w.tables
    hb_host = mb.host_head_s * t.head_backward_ops / max(t.head_forward_ops + t.head_backward_ops, 1)
    hf_host = mb.host_head_s - hb_host
    head = np.maximum(np.maximum(mb.head_fwd_s + mb.head_bwd_s, hf_host + mb.head_bwd_s), mb.host_head_s)
    span = host_fwd + head + mb.gpu_after_fwd_s
    first = np.maximum(span, mb.gpu_s)  # the host-bound forward, then the GPU's backward
    # The forward ends when the GPU has run the head's forward, max(its GPU time, the host's issuing of it); the head's
    # idle after that lies in the backward, beside the gradient reduction: the second part's. So the forward's idle
    # depends on the forward alone and a faster GPU never moves backward idle into it (at most the first part).
    moved = np.minimum(head - np.maximum(mb.head_fwd_s, hf_host) - mb.head_bwd_s, first - mb.gpu_s)
    if w.stack.engine.device_syncs == "per_phase":
        host_fwd_all = host_fwd + hf_host
        # The forward ends with the LM head and the loss (GPU-heavy, few ops): the GPU can start them only once the
        # host has issued every layer before them, so a host-bound forward lasts at least the layers' host time
        # plus the head's GPU time (the flow shop split just before the head; the embedding lookup at the start,
        # ~2 tokens x h x bytes of head_fwd, is counted in the tail too: < 1% of it).
        tail = host_fwd + mb.head_fwd_s + mb.loss_comm_s
        fwd = np.maximum(np.maximum(host_fwd_all, mb.gpu_fwd_s), tail)
        span = np.maximum(span, fwd + np.maximum(mb.host_s - host_fwd_all, mb.gpu_s - mb.gpu_fwd_s))
    return first - mb.gpu_s - moved, np.maximum(np.maximum(mb.host_s, span), first) - first + moved
