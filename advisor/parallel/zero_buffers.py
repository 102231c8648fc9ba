"""An optimizer-sharding ZeRO engine's own buffers beyond the model states (the stack's ``engine.zero_buffers``),
read from DeepSpeed 0.19.8's source:

- ZeRO-1/2 (runtime/zero/stage_1_and_2.py): ``setup_buckets`` (:3256-3280) allocates the IPG bucket, a flat buffer of
  reduce_bucket_size elements in the gradients' dtype, at the first gradient of each backward, and a second one under
  overlap_comm; ``_release_ipg_buffers`` (:924-932) frees them after backward. Each filled bucket is all-reduced
  from a flat copy (``allreduce_bucket``: ``self.flatten(bucket)``, :2359-2368), at most a bucket of the gradients.
  The step (:3103-3118) flattens the partition's gradients (a copy in their dtype) and upcasts it
  (``flat_grad_partition.to(fp32)``): the fp32 gradient DeepSpeed's own estimator counts
  (``estimate_zero2_model_states_mem_needs``, :4029-4031: 18 = 2 grads_16bit + 4 grads_32bit + 4 params_32bit + 8).
- ZeRO-3 (runtime/zero/stage3.py): the IPG bucket is allocated once, at init, and kept (:779-784); the step flattens
  and upcasts one sub-group of sub_group_size elements at a time (``_prepare_fp32_grad_for_sub_group``, :2683-2693).

Left out: the CPU-offload paths' pinned staging buffers (the optimizer step's copies then live on the host).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from advisor.parallel import accumulator

FP32 = 4.0  # bytes of the upcast gradient partition


def apply(w: Any, c: Any, mesh: Any, states: Any) -> Any:
    """``states`` (advisor.parallel.model_states.ModelStates) with the engine's buckets in ``grad_buffer`` (held through
    backward; ZeRO-3's also through the step) and its step copies in ``step_temporaries``."""
    zb = w.stack.engine.zero_buffers
    if zb is None:
        return states
    gb = states.grad_bytes
    zero = np.where(runs(w, c.zero), np.asarray(c.zero), 0)  # the stages another engine runs: none here
    # parameters this GPU steps: its partition (the adapters' under LoRA)
    stepped = states.stepped_params if states.grad_params is None else states.grad_params / mesh.dp_shard
    buffers = np.where(overlap(w, np.asarray(c.zero), np.asarray(c.overlap, dtype=bool)), 2.0, 1.0)
    flat = np.minimum(zb.ipg_elements, states.dp_params) if zb.grad_all_reduce else 0.0
    z12 = (zb.ipg_elements * buffers + flat) * gb
    z3 = zb.ipg_elements * gb
    ipg = np.where(zero >= 3, z3, np.where(zero >= 1, z12, 0.0))
    step = (gb + FP32) * np.where(zero >= 3, np.minimum(stepped, zb.sub_group_elements), stepped)
    return replace(states, grad_buffer=states.grad_buffer + ipg,
                   step_temporaries=states.step_temporaries + np.where(zero >= 1, step, 0.0) + np.where(zero >= 3, z3, 0.0))


def gathers_once(w: Any, zero: Any) -> Any:
    """Where the updated weights are all-gathered once a step, after the optimizer step: ZeRO-1, and ZeRO-2 in an
    engine that keeps the half-precision weights whole (DeepSpeed's: stage_1_and_2.py all_gather_dp_groups, :3149-3155)."""
    zb = w.stack.engine.zero_buffers
    return (zero == 1) | ((zero == 2) & (zb is not None and zb.zero2_gather_per_step and 2 in zb.stages))


def all_reduces(w: Any, zero: Any) -> Any:
    """Where ZeRO-1/2 all-reduce the gradients where a reduce-scatter is the rule: this engine's each bucket
    (``grad_all_reduce``), and nanotron's ZeRO-1 its fp32 buffer after the backward (advisor.parallel.accumulator)."""
    zb = w.stack.engine.zero_buffers
    bucket = (np.asarray(zero) <= 2) & runs(w, zero) & (zb is not None and zb.grad_all_reduce)
    return bucket | accumulator.all_reduces(w, zero)


def runs(w: Any, zero: Any) -> Any:
    """Where a plan's ZeRO stage runs on this engine (engine.zero_buffers.stages)."""
    return on_engine(w.stack, zero)


def on_engine(stack: Any, zero: Any) -> Any:
    """``runs`` for a stack (or None: nowhere), where no workload is built (advisor.parallel.offload's checks)."""
    zb = stack.engine.zero_buffers if stack is not None else None
    return np.isin(zero, zb.stages) if zb is not None else np.zeros(np.shape(zero), dtype=bool)


def overlap(w: Any, zero: Any, can_overlap: Any) -> Any:
    """``can_overlap`` (where the gradient reduction may overlap the backward) less the plans whose engine never sets
    overlap_comm: without it ZeRO-1 reduces every bucket after the backward (stage_1_and_2.py reduce_gradients:
    ``if not self.overlap_comm``), at the accumulation boundary (engine.py allreduce_gradients)."""
    out = np.asarray(can_overlap, dtype=bool) & ~accumulator.all_reduces(w, zero)  # nanotron's ZeRO-1: after the backward
    zb = w.stack.engine.zero_buffers
    return out & ~runs(w, zero) if zb is not None and zb.overlap_comm is False else out


def serial_reduction(w: Any, zero: Any, can_overlap: Any, rs: Any, exposed: Any) -> Any:
    """``exposed`` (ZeRO-2/3 seconds per micro-batch) where the engine reduces on the compute stream: DeepSpeed without
    overlap_comm (stage_1_and_2.py reduce_ipg_grads: ``current_stream()`` unless overlap_comm) exposes its ZeRO-2
    reduction ``rs`` whole every micro-batch (its gather runs once a step: gathers_once)."""
    return np.where((zero == 2) & runs(w, zero) & ~np.asarray(can_overlap, dtype=bool), rs, exposed)

