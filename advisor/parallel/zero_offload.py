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
  on the reduction stream under overlap_comm, else on the compute stream (reduce_ipg_grads, :2239-2248), and either
  way the host waits for each parameter's before the next (``exposed``): none hides behind the backward.
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
(``gpu_staging_bytes``) and on the host its pinned twin (temp_grad_buffer_for_cpu_offload, :653-658: allocated on
self.device, 'cpu' under offload (:278), in the model's dtype, pinned: a power of two, 2^31 B for Llama 3 8B's
embedding), never written but held. ZeRO-3's upload copies the fp32 sub-group into the GPU's bf16 partition with a
blocking copy_ (stage3.py:2858-2859), which torch converts on the CPU first (ATen/native/cuda/Copy.cu copy_kernel_cuda:
"For blocking transfers conversions are performed on CPU"): a pageable bf16 temporary of one sub-group; under fp16 its
overflow check runs torch.isinf / isnan over the host gradient buffer (has_overflow, :3009-3018; only for fp16,
:2815-2816), a bool temporary of the partition.

The CPU step (``host_step_factor``): the profiles' CPU Adam rate is memory-bound at 30 bytes a parameter (dgx-a100.yaml
cpu_adam_Gparams_per_s); the step also scales the fp32 gradient partition in place by 1 / (loss scale x clip)
(unscale_and_clip_grads, stage_1_and_2.py:3193-3216; stage3.py:2979-2988, unconditional), which the shipped
profiles' exports reach (gradient_clipping 1.0 where the stack clips, export/common.py gradient_clip; the Trainer's
max_grad_norm defaults to 1.0): a read and a write of the gradient; ZeRO-3 under fp16 adds its host overflow check (isinf, isnan: each reads the half
gradient, writes and reads a bool).

Pure bf16 (``half_master``: the stack's zero_buffers.half_master and --precision bf16): the deepspeed export writes
bf16_master_weights_and_grads and bf16_optimizer_states (export/deepspeed.py _precision), so the master partition
and its gradient are bf16 (base_optimizer.py:521-526; stage_1_and_2.py:558-561), the boundary copies 2 bytes (:1899-1900
casts to master_weights_and_grads_dtype), the running sums are views of the bf16 gradient partition, not pinned
buffers of their own (:1821-1825), and CPU Adam keeps its moments in bf16 (engine.py:2388-2391 fp32_optimizer_states
False, cpu_adam.py:158): 2 + 2 + 4 + 2 host bytes a parameter, and the step moves 16 bytes where mixed precision's 30.

Left out: the per-parameter buffers' own rounding, init-time copies (the estimator's 4 x GPUs bytes term), NVMe's
swap buffers, the upload's pageable copy rate (ZeRO-3), the host waits' own cost per parameter (~36 a rank a
micro-batch for Llama 3 8B on 8 ranks) and the bucket all-reduces they also expose, and how one rank's stall delays
the others at the next collective.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.parallel import zero_buffers

FP32 = 4.0  # bytes of the fp32 gradient partition the boundary copies down (master_weights_and_grads_dtype)
HALF = 2.0  # bytes of a bf16 master weight, gradient or moment under pure bf16 (module docstring)
# the hardware profiles' memory-bound CPU Adam: fp32 parameter, gradient, momentum and variance read (16), parameter,
# momentum and variance written (12), the half-precision copy written (2) (dgx-a100.yaml's cpu_adam_Gparams_per_s)
CPU_ADAM_BYTES = 30.0
PURE_BF16_ADAM_BYTES = 16.0  # the same terms in bf16: 8 read, 6 written, the upload buffer's 2 (cpu_adam.py:158)
# ZeRO-3's fp16 overflow check on the host gradient buffer: isinf and isnan each read 2 B and write a 1 B bool, .any()
# reads the bool (stage3.py:3012-3013)
FP16_CHECK_BYTES = 2.0 * (2.0 + 1.0 + 1.0)
ZERO1_ACCUMULATES = ("DeepSpeed's ZeRO-1 with offload_optimizer adds the previous step's gradient under gradient "
                     "accumulation (stage_1_and_2.py:1852-1857 never reset): --grad-accum 1, or --zero 2")


def runs(stack: Any, zero: Any) -> Any:
    """Where the plan's optimizer offload is DeepSpeed 0.19.8's ZeRO-Offload on its own engine."""
    e = stack.engine if stack is not None else None
    if e is None or e.offload_optimizer != "cpu_adam" or e.optimizer_offload != "zero_offload":
        return np.zeros(np.shape(zero), dtype=bool)
    return zero_buffers.on_engine(stack, zero)


def half_master(w: Any) -> bool:
    """Whether the plan trains pure bf16 with bf16 master weights, gradients and moments on the host (module
    docstring): the stack's DeepSpeed config sets bf16_master_weights_and_grads under --precision bf16."""
    from advisor.training import Precision  # noqa: PLC0415 (a leaf enum)

    zb = w.stack.engine.zero_buffers if w.stack is not None else None
    return bool(zb is not None and zb.half_master and w.precision is Precision.bf16)


def master_bytes(w: Any) -> float:
    """Bytes of a host master weight and of its gradient: 2 under pure bf16, else fp32's 4."""
    return HALF if half_master(w) else FP32


def micro_batch_copies(zero: Any, ga: Any, grad_bytes: Any, master: Any = FP32) -> tuple[Any, Any, Any, Any]:
    """Bytes per partition parameter on one stream, both directions together: (the first micro-batch's, each middle
    one's, the boundary micro-batch's), and the step's (down, up) gradient bytes (module docstring); ``master``: the
    bytes of the gradient partition the boundary copies down (master_weights_and_grads_dtype)."""
    zero, ga, g = np.asarray(zero), np.asarray(ga, dtype=float), np.asarray(grad_bytes, dtype=float)
    acc = ga > 1
    first = np.where(zero >= 3, 2.0 * g, np.where(zero == 2, g, 0.0))  # ZeRO-1 copies at the boundary only
    middle = np.where(zero >= 2, 2.0 * g, 0.0)
    last = np.where(acc | (zero >= 3), 2.0 * g, 0.0) + master  # the running sum up and down, and the master copy
    down = np.where(zero >= 2, g * np.where(acc | (zero >= 3), ga, 0.0), np.where(acc, g, 0.0)) + master
    up = np.where(zero >= 3, g * ga, np.where(zero == 2, g * (ga - 1.0), np.where(acc, g, 0.0)))
    return first * acc, middle, last, (down, up)


def exposed(zero: Any, ga: Any, grad_bytes: Any, per_byte_s: Any, window: Any, units: Any, master: Any = FP32) -> Any:
    """Seconds the gradient copies add per step (``per_byte_s``: a copy's seconds per byte of each partition parameter,
    S over the PCIe rate). ZeRO-3's run on reduce_and_partition_stream, each micro-batch's hidden behind its backward
    (``window``) but for the last unit's share. ZeRO-1/2's block the host whatever the stream: with offload
    (_offload_gradient_safety_enabled = cpu_offload and not zenflow, stage_1_and_2.py:232) each parameter's
    async_accumulate_grad_in_cpu_via_gpu first waits for the previous one's copy (_wait_for_offload_copies,
    :1812-1814, :1735-1738: event.synchronize()), and at the boundary the overflow tracker takes bool() of a device
    tensor on the copying stream (update_offload_overflow_tracker, :1791-1793, before each fp32 copy, :2172-2176), so
    the backward's hook thread launches nothing while they run: all of them show."""
    first, middle, last, _ = micro_batch_copies(zero, ga, grad_bytes, master)
    ga = np.asarray(ga, dtype=float)
    side = np.asarray(zero) >= 3

    def hide(b: Any) -> Any:
        t = b * per_byte_s
        return np.where(side, np.maximum(t - window, t / units), t)

    return hide(first) + np.maximum(ga - 2.0, 0.0) * hide(middle) + hide(last)


def largest_param(w: Any, tp: Any) -> Any:
    """Elements of the model's largest parameter (largest_param_numel, stage_1_and_2.py:626-635): the embedding or
    output table for these models (Llama 3 8B's 128256 x 4096 = 525M), else a layer's largest module."""
    return np.maximum(w.model.vocab * w.model.d_model / np.asarray(tp, dtype=float), w.layer.largest_module_weights(tp))


def gpu_staging_bytes(w: Any, zero: Any, tp: Any, grad_bytes: Any) -> Any:
    """The GPU buffer ZeRO-1/2's offload allocates at init and keeps, one largest parameter in the model's half type
    (temp_grad_buffer_for_gpu_offload, stage_1_and_2.py:659-661: the running sums and fp32 upcasts are staged through
    it): Llama 3 8B's 525M elements, 1.05 GB; 0 where the plan's optimizer offload is not DeepSpeed's ZeRO-1/2."""
    return np.where(runs(w.stack, zero) & (np.asarray(zero) <= 2), largest_param(w, tp) * grad_bytes, 0.0)


def host_step_factor(zero: Any, master: Any, fp16: bool) -> Any:
    """The CPU step's seconds over the profile's CPU Adam time (its 30 bytes a parameter): Adam's bytes (16 under pure
    bf16), the in-place unscale and clip of the gradient partition (a read and a write), and ZeRO-3's fp16 overflow
    check on the host (module docstring)."""
    m = np.asarray(master, dtype=float)
    adam = np.where(m < FP32, PURE_BF16_ADAM_BYTES, CPU_ADAM_BYTES)
    check = np.where((np.asarray(zero) >= 3) & fp16, FP16_CHECK_BYTES, 0.0)
    return (adam + 2.0 * m + check) / CPU_ADAM_BYTES


def pow2(nbytes: Any) -> Any:
    """A pinned buffer's bytes as torch's caching host allocator takes them: the next power of two."""
    b = np.asarray(nbytes, dtype=float)
    return np.where(b > 0, 2.0 ** np.ceil(np.log2(np.maximum(b, 1.0))), 0.0)


def host_bytes_per_rank(zero: Any, ga: Any, shard: Any, weight_bytes: Any, grad_bytes: Any, params: Any,
                        sub_group: float, largest: Any = 0.0, master: Any = FP32, fp16: bool = False) -> Any:
    """One rank's host bytes (module docstring); ``params``: offload_param too (stage 3's pinned half-precision
    partition, stage3.py:906-907); ``sub_group``: ZeRO-3's sub_group_size (one pinned gradient buffer each);
    ``largest``: the largest parameter's elements (ZeRO-1/2's pinned host twin of its staging buffer); ``master``:
    bytes of a master weight and of its gradient (2 under pure bf16, whose moments are bf16 too); ``fp16``: ZeRO-3's
    overflow check's bool temporary."""
    zero, s, m = np.asarray(zero), np.asarray(shard, dtype=float), np.asarray(master, dtype=float)
    # stage3.py _create_fp16_sub_groups (:1210-1233) closes a sub-group once it reaches sub_group_size: full ones and
    # the rest (parameter boundaries left out)
    full = np.floor(s / sub_group)
    grads = full * pow2(m * sub_group) + pow2(m * (s - full * sub_group))
    # the running sums: pinned buffers of their own only where the master is fp32 (stage_1_and_2.py:1821-1825)
    sums = np.where((zero == 2) & (np.asarray(ga) > 1) & (m >= FP32), grad_bytes * s, 0.0)
    z12 = pow2(m * s) + pow2(m * s) + pow2(weight_bytes * s) + sums + pow2(grad_bytes * np.asarray(largest, dtype=float))
    # the step's transients, one after the other: the upload's pageable bf16 sub-group (none where the master is in
    # the weights' dtype, or the partition already on the host) and fp16's overflow-check bool (1 B an element)
    upload = np.where(~np.asarray(params, dtype=bool) & (m != weight_bytes), weight_bytes * np.minimum(s, sub_group), 0.0)
    transient = np.maximum(upload, s if fp16 else 0.0)
    z3 = m * s + grads + pow2(grad_bytes * s) + np.where(params, pow2(weight_bytes * s), 0.0) + transient
    return 2.0 * m * s + np.where(zero >= 3, z3, z12)
