"""Memory: the busiest GPU's memory at its peak, as a named breakdown.

Model states come from the data-parallel dimension (advisor.parallel.data: the ZeRO stage's shards, the stack's
master weights). Activations per layer and token are what the stack's layers save for backward (its profile's
``memory.saved``, advisor.stack), divided as tensor and sequence parallelism divide them; full recomputation
keeps each layer's input, selective drops the s x s scores. A pipeline stage keeps several micro-batches in
flight (advisor.parallel.pipeline): the first stage holds the most activations, the last the logits.

The peak is the largest of three moments (the activation probe's timeline): (a) the start of the loss's
backward: every activation plus the cross-entropy's buffers; (b) under full recomputation, while the last layer
is recomputed: its full activations and ~3 d_ff-sized temporaries join the kept inputs, the held logits and the
head's gradient; (c) the optimizer step: all gradients and the step's temporaries. ``peak`` is what
``torch.cuda.max_memory_allocated()`` reports; the CUDA context, NCCL buffers and allocator fragmentation are
``Overhead``, reported apart. Left out: CPU/NVMe offload, activation offload, expert parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from advisor.candidates import Candidates, Mesh
from advisor.parallel import context, pipeline
from advisor.parallel.data import ModelStates
from advisor.training import Recompute
from advisor.units import GiB
from advisor.workload import Workload

# NCCL allocates per-communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers); a few hundred MiB
# per process with several communicators (nvidia-smi minus torch's allocations in NCCL jobs).
NCCL_BUFFER_BYTES = 0.25 * GiB
# Allocator fragmentation: reserved exceeds allocated by 2.5-8% in reference/h100/train_examples.jsonl
# (peak_reserved / peak_mem); 5% is kept as headroom in the `fits` verdict.
FRAGMENTATION = 0.05
# Full recomputation: the recomputed layer's MLP holds ~3 d_ff-sized temporaries beside its saved tensors
RECOMPUTE_TEMPORARIES_D_FF = 3.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest GPU at its peak (arrays over plans)."""

    weights: Any
    gradients: Any
    optimizer_states: Any
    activations: Any
    logits_loss: Any
    transient: Any

    def parts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def peak(self) -> Any:
        return sum(self.parts().values())


@dataclass(frozen=True)
class Overhead:
    """Bytes outside torch's tensor allocations, reported beside the peak."""

    cuda_context: Any
    comm_buffers: Any
    fragmentation: Any

    def parts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def total(self) -> Any:
        return sum(self.parts().values())


def saved_per_token(w: Workload, c: Candidates, mesh: Mesh) -> tuple[Any, Any]:
    """(bytes one layer keeps per token under each plan's recomputation, bytes with none) on one TP rank."""
    t, sp = w.tables, np.asarray(c.sp, dtype=bool)
    scores = w.layer.n_heads * w.seq_len if w.eager else 0.0
    full = t.saved_layer.per_gpu(mesh.tp, sp, scores)
    kept = np.where(c.recompute == Recompute.full.code, t.saved_full_recompute.per_gpu(mesh.tp, sp),
                    np.where(c.recompute == Recompute.selective.code, t.saved_selective.per_gpu(mesh.tp, sp), full))
    return kept, full


def breakdown(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, tokens: Any,
              layers: Any) -> tuple[MemoryBreakdown, Overhead]:
    t, pp = w.tables, mesh.pp
    kept, full = saved_per_token(w, c, mesh)
    outside = t.saved_outside_layers * tokens
    if w.eager:  # one b x s x s causal mask for the whole model, where the stack builds one
        outside = outside + t.attention_mask * c.micro_batch * w.seq_len ** 2
    in_flight = pipeline.in_flight_layers(w.model.n_layers, pp, mesh.v, c.schedule, c.grad_accum, c.pp_split)
    first = kept * tokens * in_flight + outside  # the first stage holds the most micro-batches
    last = kept * tokens * layers + outside  # the last holds the logits
    logits = tokens * w.model.vocab / mesh.tp
    held, at_peak = logits * t.logits_held, logits * t.logits_peak
    piped = pp > 1
    loss_peak = np.where(piped, np.maximum(first, last + at_peak), first + at_peak)
    rc_extra = np.where(c.recompute == Recompute.full.code, full * tokens + RECOMPUTE_TEMPORARIES_D_FF * w.model.d_ff / mesh.tp
                        * w.act_bytes * tokens + states.head_grads, 0.0)
    rc_peak = np.where(piped, np.maximum(first, last + held), first + held) + rc_extra
    fb = np.maximum(loss_peak, rc_peak)
    fixed = states.gathered + states.grad_buffer + states.autocast_copy + states.bucket_copy
    gathered_kv = context.transient_bytes(w, c, mesh, tokens)  # all-gather CP's gathered K and V
    fixed = fixed + gathered_kv if np.ndim(gathered_kv) else fixed
    grads_fb = np.where(states.grads_persist, states.grads, 0.0)
    opt_phase = states.grads + states.step_temporaries + states.bucket_copy
    in_fb = fb + fixed + grads_fb >= opt_phase
    lg = np.where(loss_peak >= rc_peak, np.where(piped, np.where(last + at_peak > first, at_peak, 0.0), at_peak),
                  np.where(piped, np.where(last + held > first, held, 0.0), held))
    mem = MemoryBreakdown(
        weights=states.weights, gradients=np.where(in_fb, grads_fb, states.grads), optimizer_states=states.optimizer_states,
        activations=np.where(in_fb, fb - lg, 0.0), logits_loss=np.where(in_fb, lg, 0.0),
        transient=np.where(in_fb, fixed, states.step_temporaries + states.bucket_copy))
    peak = mem.peak
    shape = np.shape(peak)
    over = Overhead(cuda_context=np.full(shape, w.hw.efficiency.framework_overhead_GiB * GiB),
                    comm_buffers=np.where((mesh.dp > 1) | (mesh.tp > 1) | piped, NCCL_BUFFER_BYTES, 0.0) * np.ones(shape),
                    fragmentation=FRAGMENTATION * peak)
    return mem, over
