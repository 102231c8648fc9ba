"""The model states and the optimizer: bytes per parameter of weights, gradients and optimizer states, and the
time of the optimizer step and of autocast's weight casts. How data parallelism shards them is
advisor.parallel.data.

Mixed precision with Adam costs 2 (half weights) + 2 (half gradients) + K = 12 (fp32 master weights,
momentum, variance) bytes per parameter in the ZeRO paper's accounting (Rajbhandari et al. 2020, arXiv
1910.02054, s.3.1), where the stack keeps fp32 master weights (``master``). torch.autocast without them
trains fp32 weights and gradients (4 + 4 + 8 with Adam) and casts the weights to half precision in every
forward. Pure bf16 keeps everything in bf16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.compute import mem_time
from advisor.training import Optimizer, Precision
from advisor.workload import Workload

# Bytes the step reads and writes per parameter: AdamW reads parameter, gradient, momentum and variance and
# writes parameter, momentum and variance (7 x 4 bytes; reference/h100/optim.jsonl's GBps_7x4); SGD with
# momentum reads 3 and writes 2 (5 x 4). Pure bf16 halves them.
STEP_BYTES = {Optimizer.adamw: 28.0, Optimizer.adamw_fused: 28.0, Optimizer.sgd: 20.0}
MASTER_STEP_BYTES = 6.0  # read the fp32 master weight, write the half-precision copy
GRAD_SCALER_BYTES = 12.0  # fp16 GradScaler: unscale_ (r+w gradients) and the inf/nan check (r gradients)
UNSCALE_BYTES = 8.0  # GRAD_SCALER_BYTES' unscale_ (r+w): none where the clip's multiply unscales (engine.clip_unscales)
# Gradient clipping (engine.clip_grad_norm): get_grad_norm_fp32's multi-tensor L2 norm reads each main gradient the
# step updates (megatron-core 0.19.2 optimizer/clip_grads.py:116-118), clip_grad_by_total_norm_fp32 reads and writes it
# (:186-188, multi_tensor_scale_tensor: the coefficient stays a tensor, no host sync): 3 x 4 bytes of fp32 gradients.
# The other stacks' norm and scale are the same three passes: torch.nn.utils clip_grad_norm_'s _foreach_norm and
# _foreach_mul_ (torch 2.13 nn/utils/clip_grad.py:95, 173; torchtitan 0.3.0 distributed/utils.py:652, 675), FSDP1's
# per-gradient vector_norm and mul_ (fully_sharded_data_parallel.py:1167, 1203-1204: HF Trainer, Composer), nanotron's
# (optim/clip_grads.py:65-92), DeepSpeed's get_grad_norm_direct and unscale_and_clip_grads (stage_1_and_2.py:2684, 3214)
CLIP_BYTES = 12.0
AUTOCAST_CAST_BYTES = 6.0  # autocast re-casts each fp32 weight to half precision every forward: r 4, w 2


def weight_grad_bytes(precision: Precision, master: Any) -> tuple[Any, Any]:
    """(weight bytes, gradient bytes) per parameter the GPU computes with: half precision where the stack
    keeps fp32 master weights, else fp32 under autocast."""
    if precision is Precision.fp32:
        return 4.0, 4.0
    if precision is Precision.bf16:
        return 2.0, 2.0
    return np.where(master, 2.0, 4.0), np.where(master, 2.0, 4.0)


def state_bytes(w: Workload, master: Any) -> Any:
    """Bytes per parameter the optimizer holds: momentum (and variance), and the fp32 master weights."""
    n_states = 1 if w.optimizer is Optimizer.sgd else 2
    states = n_states * (2.0 if w.precision is Precision.bf16 else 4.0)
    return states + np.where(master & (w.precision not in (Precision.fp32, Precision.bf16)), 4.0, 0.0)


def step_time(w: Workload, params: Any, sharded_params: Any, master: Any, zero: Any = 0) -> Any:
    """Seconds of the memory-bound optimizer step on the ``sharded_params`` this GPU updates (``zero``: its stage)."""
    hw = w.hw
    per_param = STEP_BYTES[w.optimizer] / (2.0 if w.precision is Precision.bf16 else 1.0)
    eff = hw.efficiency.optimizer_bandwidth[w.optimizer.value]  # the profile validator guarantees every optimizer
    t = np.asarray(sharded_params, dtype=float) * 1.0 / (hw.gpu.memory_bandwidth_bytes_per_s * eff) * (
        per_param + np.where(master, MASTER_STEP_BYTES, 0.0))
    e = w.stack.engine
    # the stages DeepSpeed's ZeRO optimizer runs (the Trainer's ZeRO-1 alone: zero_buffers.stages), else every one
    deepspeed = np.isin(zero, e.zero_buffers.stages) if e.zero_buffers is not None else np.asarray(zero) >= 1
    if e.clip_grad_norm:  # at the element-wise rate, as the scaler's passes
        clipped = np.asarray(sharded_params if e.clip_grad_scope == "stepped" else params, dtype=float)
        per_clipped = e.clip_grad_bytes or CLIP_BYTES / (2.0 if w.precision is Precision.bf16 else 1.0)
        per_clipped = np.where(deepspeed, e.clip_grad_bytes_zero or per_clipped, per_clipped)
        t = t + mem_time(hw, clipped * per_clipped)
    if w.precision is Precision.fp16_mixed:  # the unscale: the clip's multiply where it folds in (clip_unscales)
        folded = e.clip_unscales | (deepspeed & e.clip_unscales_zero)
        scaler = GRAD_SCALER_BYTES - np.where(folded, UNSCALE_BYTES, 0.0)
        if not e.clip_grad_norm:  # the multiply by 1 / loss_scale alone, on the stepped grads, where it folds
            t = t + mem_time(hw, np.where(folded, np.asarray(sharded_params, dtype=float), 0.0) * UNSCALE_BYTES)
        t = t + mem_time(hw, params * scaler)
    return t


def step_temporaries(w: Workload, sharded_params: Any, largest: Any = None) -> Any:
    """Bytes the step allocates while it runs: torch.optim.AdamW's foreach implementation keeps one temporary
    per parameter in the states' dtype (the fused and SGD steps work in place); a step looping over the tensors
    (engine.adamw_step ``loop``: F.adamw before torch 1.12, its ``denom``) one of the ``largest`` tensor's, given
    for such a step alone."""
    if w.optimizer is not Optimizer.adamw:
        return np.zeros(np.shape(sharded_params))
    held = sharded_params if largest is None else np.minimum(sharded_params, largest)
    return held * (2.0 if w.precision is Precision.bf16 else 4.0)


def largest_tensor(w: Workload, zero: Any, shard: Any, p_layer: Any, outside: Any, tp: Any) -> Any:
    """Elements of the largest tensor the optimizer steps: a layer's largest sub-module or the V x h table, or under
    ZeRO / FSDP the shard of the largest flat parameter (a layer's unit, or the root's); None where the step does not
    loop over the tensors (engine.adamw_step), the only one that needs it (step_temporaries)."""
    if w.stack.engine.adamw_step != "loop":
        return None
    whole = np.maximum(w.layer.largest_module_weights(tp), w.model.vocab * w.model.d_model / tp)
    return np.where(np.asarray(zero) >= 1, np.maximum(p_layer, outside) / shard, whole)


def autocast_weights(w: Workload, master: Any) -> Any:
    """1 where autocast casts fp32 weights to half precision in every forward (no master weights), else 0."""
    return np.where(~np.asarray(master, dtype=bool) & w.precision.autocast, 1.0, 0.0)


def autocast_cast_time(w: Workload, params: Any, master: Any, grad_accum: Any) -> Any:
    """Seconds per step autocast spends re-casting the weights, once per micro-batch's forward."""
    hw = w.hw
    return mem_time(hw, autocast_weights(w, master) * grad_accum * params * AUTOCAST_CAST_BYTES)
