"""DeepSpeed 0.19.8's ZeRO-Offload (``offload_optimizer``) as its source runs it, where a plan's ZeRO stage runs on
DeepSpeed's own engine (the stack's ``engine.zero_buffers.stages``): what crosses PCIe each micro-batch and each step,
and what one rank keeps in host memory. S is the rank's partition (parameters it steps), g the gradients' bytes
(grad_accum_dtype defaults to the model's half type: engine.py:1806-1807, so the stage 1/2 optimizer takes its
non-compact path, stage_1_and_2.py:1259-1261).

- **ZeRO-1/2** (DeepSpeedZeroOptimizer with cpu_offload; stage 1 is the same class with partition_grads False,
  engine.py:2676-2716). copy_grads_in_partition (stage_1_and_2.py:2161-2177) runs on each reduced gradient of the
  partition: where more micro-batches follow or some came before, async_accumulate_grad_in_cpu_via_gpu (:1809-1858)
  brings the running sum up (a pinned bf16 buffer per parameter; from the second micro-batch on, :1855-1856), adds
  it on the GPU and copies the sum back down (:1857); at the accumulation boundary
  async_inplace_copy_grad_to_fp32_buffer_from_gpu (:1888-1912) upcasts the gradient on the GPU and copies it down
  into the fp32 gradient partition: 4 bytes, not the paper's 2. Per step, ZeRO-2 with ga > 1: g (ga) + 4 down,
  g (ga - 1) up; ga = 1: 4 down. ZeRO-1 reduces at the boundary only (:2285-2287): 4 down at ga = 1. The copies run
  on the reduction stream under overlap_comm, else on the compute stream (reduce_ipg_grads, :2239-2248).
  ZeRO-1 with ga > 1 is refused: its only pass through that path is the boundary micro-batch, whose micro_step_id
  is > 0, so it adds the CPU buffer, which still holds the previous step's gradient (nothing resets
  accumulated_grads_in_cpu, :647 and :1852): every step from the second on steps on the sum of all steps' gradients.
- **ZeRO-3** (stage3.py partition_grads, :2006-2050): the grad_partitions_flat_buffer lives on the host (:791-795,
  device = cpu under offload, :333); each micro-batch's gradient partition goes down (copy_, :2025) and comes straight
  back up (``.to(device)``, :2028; from the second micro-batch: up, add, down, :2035-2041); at the boundary the fp32
  copy goes down (_offload_grad_partition_at_boundary, :1456-1457): g (ga) + 4 down, g (ga) up, on
  reduce_and_partition_stream whatever overlap_comm (:1669).
- After the CPU step the updated half-precision partition comes up (stage_1_and_2.py:3091-3095, stage3.py:2858): g.

Host memory per rank: the fp32 master partition (4; pinned for stage 1/2, :563-565), the fp32 gradient partition (4,
pinned, :937-941; stage3.py:1337-1340, per sub-group), Adam's momentum and variance (8, DeepSpeedCPUAdam,
ops/adam/cpu_adam.py:161-164, not pinned), and the half-precision buffer the step writes for the upload (stage 1/2,
:566-575) or the host gradient partition (stage 3, :791-795), pinned: 18 bytes per parameter where DeepSpeed's own
estimator (estimate_zero2_model_states_mem_needs, :4025-4027) says 16 (x 1.5 of margin); ZeRO-2 with ga > 1 adds the
pinned running sums (g). A pinned buffer takes the next power of two of its bytes (torch 2.13
ATen/core/CachingHostAllocator.h:300-309: PowerOf2Ceil below pinned_max_round_threshold, unbounded by default,
c10/core/AllocatorConfig.h:361): counted for the flat buffers. On the GPU, the largest parameter's staging buffer
(``gpu_staging_bytes``). Left out: the per-parameter buffers' own rounding, that buffer's pinned host twin
(temp_grad_buffer_for_cpu_offload, :653-658, allocated but unused), init-time copies
(the estimator's 4 x GPUs bytes term), NVMe's swap buffers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.parallel import zero_buffers

FP32 = 4.0  # bytes of the fp32 gradient partition the boundary copies down (master_weights_and_grads_dtype)
ADAM = 8.0  # DeepSpeedCPUAdam's exp_avg and exp_avg_sq in fp32 (cpu_adam.py:161-164)
ZERO1_ACCUMULATES = ("DeepSpeed's ZeRO-1 with offload_optimizer adds the previous step's gradient under gradient "
                     "accumulation (stage_1_and_2.py:1852-1857 never reset): --grad-accum 1, or --zero 2")


def runs(stack: Any, zero: Any) -> Any:
    """Where the plan's optimizer offload is DeepSpeed 0.19.8's ZeRO-Offload on its own engine."""
    e = stack.engine if stack is not None else None
    if e is None or e.offload_optimizer != "cpu_adam" or e.optimizer_offload != "zero_offload":
        return np.zeros(np.shape(zero), dtype=bool)
    return zero_buffers.on_engine(stack, zero)


def micro_batch_copies(zero: Any, ga: Any, grad_bytes: Any) -> tuple[Any, Any, Any, Any]:
    """Bytes per partition parameter on one stream, both directions together: (the first micro-batch's, each middle
    one's, the boundary micro-batch's), and the step's (down, up) gradient bytes (module docstring)."""
    zero, ga, g = np.asarray(zero), np.asarray(ga, dtype=float), np.asarray(grad_bytes, dtype=float)
    acc = ga > 1
    first = np.where(zero >= 3, 2.0 * g, np.where(zero == 2, g, 0.0))  # ZeRO-1 copies at the boundary only
    middle = np.where(zero >= 2, 2.0 * g, 0.0)
    last = np.where(acc | (zero >= 3), 2.0 * g, 0.0) + FP32  # the running sum up and down, and the fp32 copy
    down = np.where(zero >= 2, g * np.where(acc | (zero >= 3), ga, 0.0), np.where(acc, g, 0.0)) + FP32
    up = np.where(zero >= 3, g * ga, np.where(zero == 2, g * (ga - 1.0), np.where(acc, g, 0.0)))
    return first * acc, middle, last, (down, up)


def exposed(zero: Any, ga: Any, grad_bytes: Any, per_byte_s: Any, overlapped: Any, window: Any, units: Any) -> Any:
    """Seconds the gradient copies add per step (``per_byte_s``: a copy's seconds per byte of each partition parameter,
    S over the PCIe rate): on a side stream each micro-batch's hides behind its backward (``window``) but for the last
    unit's share; on the compute stream (ZeRO-1/2 without overlap_comm) all of it."""
    first, middle, last, _ = micro_batch_copies(zero, ga, grad_bytes)
    ga = np.asarray(ga, dtype=float)
    side = np.asarray(overlapped, dtype=bool) | (np.asarray(zero) >= 3)

    def hide(b: Any) -> Any:
        t = b * per_byte_s
        return np.where(side, np.maximum(t - window, t / units), t)

    return hide(first) + np.maximum(ga - 2.0, 0.0) * hide(middle) + hide(last)


def gpu_staging_bytes(w: Any, zero: Any, tp: Any, grad_bytes: Any) -> Any:
    """The GPU buffer ZeRO-1/2's offload allocates at init and keeps, one largest parameter in the model's half type
    (temp_grad_buffer_for_gpu_offload, stage_1_and_2.py:659-661: the running sums and fp32 upcasts are staged through
    it): the embedding or output table for these models (Llama 3 8B's 525M elements: 1.05 GB), else a layer's largest
    module; 0 where the plan's optimizer offload is not DeepSpeed's ZeRO-1/2."""
    largest = np.maximum(w.model.vocab * w.model.d_model / np.asarray(tp, dtype=float), w.layer.largest_module_weights(tp))
    return np.where(runs(w.stack, zero) & (np.asarray(zero) <= 2), largest * grad_bytes, 0.0)


def pow2(nbytes: Any) -> Any:
    """A pinned buffer's bytes as torch's caching host allocator takes them: the next power of two."""
    b = np.asarray(nbytes, dtype=float)
    return np.where(b > 0, 2.0 ** np.ceil(np.log2(np.maximum(b, 1.0))), 0.0)


def host_bytes_per_rank(zero: Any, ga: Any, shard: Any, weight_bytes: Any, grad_bytes: Any, params: Any,
                        sub_group: float) -> Any:
    """One rank's host bytes (module docstring); ``params``: offload_param too (stage 3's pinned half-precision
    partition, stage3.py:906-907); ``sub_group``: ZeRO-3's sub_group_size (one pinned fp32 gradient buffer each)."""
    zero, s = np.asarray(zero), np.asarray(shard, dtype=float)
    # stage3.py _create_fp16_sub_groups (:1210-1233) closes a sub-group once it reaches sub_group_size: full ones and
    # the rest (parameter boundaries left out)
    full = np.floor(s / sub_group)
    grads = full * pow2(FP32 * sub_group) + pow2(FP32 * (s - full * sub_group))
    z12 = pow2(FP32 * s) + pow2(FP32 * s) + pow2(weight_bytes * s) + np.where(
        (zero == 2) & (np.asarray(ga) > 1), grad_bytes * s, 0.0)
    z3 = FP32 * s + grads + pow2(grad_bytes * s) + np.where(params, pow2(weight_bytes * s), 0.0)
    return ADAM * s + np.where(zero >= 3, z3, z12)
