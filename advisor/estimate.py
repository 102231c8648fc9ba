"""Estimate: the one module that composes compute, communication and memory into a step time.

``evaluate`` takes the three typed inputs (model, hardware, plan+setup as Columns) and returns named
time and memory parts as numpy arrays, one entry per plan; ``estimate`` wraps it for a single plan
and returns a typed ``Estimate``. The search calls ``evaluate`` once on all candidates.

Step time (one optimizer step, busiest pipeline stage; m = grad_accum micro-batches):
    pipeline   = m x (fwd + bwd + recompute + TP comm + p2p) per micro-batch, each micro-batch lasting
                 the longer of its GPU work and the host's issue time, as a flow shop restarted at every
                 device synchronisation (one per micro-batch; per phase under pp > 1): "host_overhead"
    bubble     = (pp - 1) / v x the layer-only stage time (Narayanan et al. 2021 s.2.2)
    dp comm    = gradient all-reduce (DDP), reduce-scatter + all-gather (ZeRO-1/2), per-layer parameter
                 all-gathers (ZeRO-3/FSDP), exposed beyond what overlaps with backward / prefetch
    optimizer  = memory-bound step on the local (sharded) parameters
Every part is in ``breakdown`` and the step time is their sum. Memory: ``memory.plan_memory``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from advisor import comm
from advisor.comm import Collective
from advisor.compute import (
    ACT_BYTES,
    HOST_HEAD_OPS,
    LayerTimes,
    head_host_time,
    head_times,
    layer_flops_per_token,
    layer_times,
    logits_flops_per_token,
    optimizer_time,
)
from advisor.hardware import Hardware
from advisor.memory import PlanArrays, plan_memory, weight_grad_bytes
from advisor.model import MLPKind, ModelSpec
from advisor.plans import Columns, DataParallelKind, Precision, Recompute
from advisor.styles import Scalars, per_style
from advisor.units import MiB

# PyTorch DDP's default bucket_cap_mb (torch.nn.parallel.DistributedDataParallel): the last bucket's
# all-reduce starts only when backward ends, so at least one bucket is always exposed.
DDP_BUCKET_BYTES = 25 * MiB
# Copy-engine peer copies (cudaMemcpyPeer, as torch.cuda.comm.gather uses) reach 88% of the link rate:
# nvbandwidth on H200 NVLink4, 396 of 450 GB/s (reference/published_collectives.yaml, mleng_h200_pairwise_copy).
COPY_ENGINE_EFFICIENCY = 0.88

TIME_PARTS = (
    "compute/forward",
    "compute/backward",
    "compute/recompute",
    "comm/tp",
    "host_overhead",
    "comm/pp_p2p",
    "pipeline_bubble",
    "comm/dp_grad",
    "comm/zero_params",
    "comm/dataparallel",
    "optimizer",
)


def _deepspeed_z3_exposed(m: ModelSpec, lt: LayerTimes, layers: Any, rc: Any, ag_layer: Any, rs_layer: Any) -> tuple[Any, Any]:
    """Exposed ZeRO-3 gather/reduce-scatter seconds per micro-batch under DeepSpeed's parameter coordinator.

    DeepSpeed gathers per sub-module, and ``fetch_sub_module`` is blocking: when the next sub-module's
    parameters are in flight it waits for them and synchronises the device (stage3.py in the 0.3 releases
    Megatron-DeepSpeed ran in 2021: ``_synchronize_communication`` ends in ``torch.cuda.synchronize()``),
    then prefetches only the next ``stage3_prefetch_bucket_size`` (5e7) elements: one linear layer of a
    large model. So the gather of each linear layer hides only behind the compute of the one before it,
    not behind the whole pass: a layer is four steps, (qkv + attention), out-projection, MLP in, MLP out,
    and each lasts the longer of its compute and the next step's gather (the gradient reduce-scatter of
    the step just finished joins that gather in backward, on the same link). A checkpointed layer's
    recomputation is a forward: the hooks fire and gather its parameters again, so full recomputation
    makes three gathers per micro-batch (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 4).
    Not modelled: parameters kept for reuse within ``stage3_max_reuse_distance`` elements.
    """
    h, q, kv, f = m.d_model, m.q_dim, m.kv_dim, m.d_ff
    mlp_in = f * (2 if m.mlp is MLPKind.swiglu else 1)
    params = np.array([h * (q + 2 * kv), q * h, h * mlp_in, f * h], dtype=float)
    share = params / params.sum()  # of the layer's weights, and of its GEMM FLOPs (proportional to them)
    comp = [lt.gemm_fwd_s * share[0] + lt.attention_fwd_s + lt.elementwise_fwd_s / 2.0, lt.gemm_fwd_s * share[1],
            lt.gemm_fwd_s * share[2] + lt.elementwise_fwd_s / 2.0, lt.gemm_fwd_s * share[3]]
    total = sum(comp)
    share_c = [np.where(total > 0, c / np.where(total > 0, total, 1.0), 0.25) for c in comp]
    ag = [ag_layer * s for s in share]
    rs = [rs_layer * s for s in share]

    def exposed(window: Any, comm_during: list) -> Any:
        """Seconds the four steps outlast their compute when step k runs beside comm_during[k]."""
        return sum(np.maximum(window * c, x) - window * c for c, x in zip(share_c, comm_during))

    next_gather = [ag[(k + 1) % 4] for k in range(4)]
    fwd = exposed(lt.fwd_s, next_gather)
    rcp = exposed(lt.recompute_s, next_gather)
    bwd = exposed(lt.bwd_s, [ag[(k - 1) % 4] + rs[(k + 1) % 4] for k in range(4)])
    full = np.asarray(rc) == int(Recompute.full)
    return layers * fwd + ag[0], layers * (np.where(full, rcp, 0.0) + bwd)


def _only(mask: Any, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` where ``mask`` holds and 0 elsewhere, computed on those plans alone: a search's plans share
    one kernel style and mostly one data-parallel kind, and a collective costed over every plan takes as long
    as the rest of the row (``fn`` is elementwise in its array arguments)."""
    shape = np.broadcast_shapes(np.shape(mask), *(np.shape(a) for a in args))
    where = np.broadcast_to(np.asarray(mask, dtype=bool), shape)
    out = np.zeros(shape)
    if where.any():
        out[where] = np.broadcast_to(fn(*(np.broadcast_to(np.asarray(a, dtype=float), shape)[where] for a in args)),
                                     (int(where.sum()),))
    return out


def evaluate(m: ModelSpec, hw: Hardware, sc: Scalars, c: Columns, world_size: Any) -> dict[str, Any]:
    """All time parts (seconds) and memory parts (bytes) for the plans in ``c`` (vectorised)."""
    f = {k: np.asarray(getattr(c, k)) for k in ("dp", "tp", "pp", "zero", "micro_batch", "grad_accum", "recompute", "schedule", "v", "dp_kind")}
    dp, tp, pp, zero = (f[k].astype(float) for k in ("dp", "tp", "pp", "zero"))
    mb, ga, rc = f["micro_batch"].astype(float), f["grad_accum"].astype(float), f["recompute"]
    v = np.where(f["schedule"] == 2, f["v"], 1).astype(float)
    sp = np.asarray(c.sp, dtype=bool)
    hybrid = np.asarray(c.hybrid, dtype=bool)
    overlap = np.asarray(c.overlap, dtype=bool)
    is_dp_kind = f["dp_kind"] == int(DataParallelKind.dp)
    gpn = hw.gpus_per_node
    megatron = (tp > 1) | (pp > 1) if sc.framework == "auto" else np.full(np.shape(dp), sc.framework == "megatron")
    megatron = np.asarray(megatron, dtype=bool)
    e = ACT_BYTES[sc.precision]
    tokens = mb * sc.seq_len

    # --- compute, per micro-batch on the busiest stage ------------------------------------------
    lt = per_style(megatron, sc, lambda w: layer_times(m, hw, w, mb, tp, rc, sp))
    layer_fwd, layer_bwd, layer_rc = lt.fwd_s, lt.bwd_s, lt.recompute_s
    host_layer = lt.host_fwd_s + lt.host_bwd_s + lt.host_recompute_s
    head_fwd, head_bwd = per_style(megatron, sc, lambda w: head_times(m, hw, w, mb, tp))
    layers_stage = np.ceil(m.n_layers / pp)
    fwd_mb = layers_stage * layer_fwd + head_fwd
    bwd_mb = layers_stage * layer_bwd + head_bwd
    rc_mb = layers_stage * layer_rc

    # --- tensor parallel: 2 all-reduces per layer forward, 2 backward (+2 per recomputed forward) ---
    act_bytes = tokens * m.d_model * e
    tp_per_node = np.minimum(tp, gpn)
    ar = comm.collective_time(Collective.all_reduce, tp, act_bytes, hw, tp_per_node)
    ag_rs = comm.collective_time(Collective.all_gather, tp, act_bytes, hw, tp_per_node) + comm.collective_time(
        Collective.reduce_scatter, tp, act_bytes, hw, tp_per_node
    )
    per_ar = np.where(sp, ag_rs, ar)  # sequence parallel: each all-reduce becomes an all-gather + reduce-scatter
    n_ar = 4.0 + np.where(rc == int(Recompute.full), 2.0, 0.0)
    tp_mb = np.where(tp > 1, layers_stage * n_ar * per_ar, 0.0)
    # one layer's GPU time with its TP collectives in line (2 forward, 2 backward, 2 more when recomputed)
    tp_coll = np.where(tp > 1, per_ar, 0.0)
    lw = replace(lt, fwd_s=layer_fwd + 2.0 * tp_coll, bwd_s=layer_bwd + 2.0 * tp_coll,
                 recompute_s=layer_rc + np.where(rc == int(Recompute.full), 2.0 * tp_coll, 0.0))
    # Outside the layers (megatron-core): the vocab-parallel embedding all-reduces its output, the LM head's
    # input gradient is all-reduced in backward (under SP: reduce-scatter, all-gather + reduce-scatter), and
    # the vocab-parallel cross-entropy all-reduces three fp32 values per token (max, target logit, sum of exp).
    emb_tp = np.where(sp, 0.5 * ag_rs, ar)
    ce_tp = 3.0 * comm.collective_time(Collective.all_reduce, tp, tokens * 4.0, hw, tp_per_node)
    head_tp = np.where(tp > 1, emb_tp + np.where(sp, ag_rs, ar) + ce_tp, 0.0)

    # --- pipeline: activations to the next stage forward, gradients back ---
    # Megatron's scatter/gather optimisation (Narayanan et al. 2021 s.4.1; --scatter-gather-tensors-in-pipeline,
    # on by default): each TP rank sends 1/tp of the activation over its own link and the receiving stage
    # all-gathers it over the intra-node link. Under sequence parallelism the activation is already split.
    scatter = megatron & (tp > 1)
    p2p_bytes = act_bytes / np.where(scatter | sp, tp, 1.0)
    regather = np.where(scatter & ~sp, comm.collective_time(Collective.all_gather, tp, act_bytes, hw, tp_per_node), 0.0)
    stage_span = tp * dp  # GPUs of one stage; a boundary crosses nodes when a stage fills a node
    across = stage_span >= gpn
    p2p_mb = np.where(pp > 1, 2.0 * v * (comm.p2p_time(p2p_bytes, hw, across) + regather), 0.0)

    # The host issues kernels asynchronously and runs ahead of the GPU; a micro-batch takes at least the
    # longer of the GPU's work and the host's. Each micro-batch also starts on an empty GPU queue: the
    # training loops synchronise the device once per micro-batch (DeepSpeed's ThroughputTimer.start() in
    # every engine.forward() when the engine has no dataloader, as under Megatron-DeepSpeed, deepspeed
    # 0.9.5 runtime/engine.py and utils/timer.py; Megatron-LM's 2021 timers; the HF Trainer's per-step
    # isnan(loss) check). So it is a two-stage flow shop restarted each micro-batch: its makespan is the
    # longest of "host issues the first k ops, then the GPU runs the rest", taken here at the phase
    # boundaries: when the forward is host-bound and the backward GPU-bound, the backward cannot start
    # early and the GPU idles through the forward. The excess over the GPU's work is "host_overhead".
    gpu_mb = fwd_mb + bwd_mb + rc_mb + tp_mb + head_tp
    head_host = per_style(megatron, sc, lambda w: head_host_time(m, hw, w, tp))
    host_mb = layers_stage * host_layer + head_host
    tp_after_fwd = tp_mb * (n_ar - 2.0) / n_ar + head_tp - np.where(tp > 1, emb_tp, 0.0)  # all but the forward layers'
    gpu_after_fwd = layers_stage * (layer_bwd + layer_rc) + tp_after_fwd
    host_fwd = layers_stage * lt.host_fwd_s
    flow_mb = np.maximum(host_fwd + head_fwd + head_bwd, host_fwd + head_host) + gpu_after_fwd
    # Megatron's pipeline schedules synchronise the device after every stage-to-stage exchange
    # (p2p_communication._communicate: batch_isend_irecv, wait, then torch.cuda.synchronize(); megatron-core
    # 0.8.0 with its defaults batch_p2p_comm = batch_p2p_sync = True, and Megatron-LM since 2021), so with pp > 1 a micro-batch's forward and its backward each start
    # on an empty queue and end drained: each phase takes the longer of its host and GPU time. Without a pipeline
    # the forward drains too: DeepSpeed 0.9.5's engine.backward() logs loss.mean().item() on every micro-batch but
    # the last of a step before it issues the backward (runtime/engine.py; from 0.14 the loss stays on the device),
    # and Megatron-LM's 2021 timers synchronise at the start and end of forward_step and backward_step.
    # (A CPU probe of Megatron-DeepSpeed's loop under deepspeed 0.9.5, 0.14.5 and 0.19.8 counted the engine's
    # synchronize() calls: two per micro-batch, ThroughputTimer start and stop, plus that .item() in 0.9.5; the
    # engine's own Python adds ~0.17 ms per micro-batch and ~0.9 ms per step on this machine, not costed.)
    gpu_fwd = layers_stage * layer_fwd + head_fwd + tp_mb * 2.0 / n_ar + np.where(tp > 1, emb_tp + ce_tp, 0.0)
    n_hf, n_hb = HOST_HEAD_OPS[("megatron", "gpt")]
    host_fwd_all = host_fwd + head_host * n_hf / (n_hf + n_hb)
    # The forward ends with the LM head and the loss (GPU-heavy, few ops): the GPU can start them only once
    # the host has issued every layer before them, so a host-bound forward lasts at least the layers' host
    # time plus the head's GPU time (the flow shop split just before the head; the embedding lookup at the
    # start, ~2 tokens x h x bytes of head_fwd, is counted in the tail too: < 1% of it).
    fwd_tail = host_fwd + head_fwd + np.where(tp > 1, ce_tp, 0.0)
    phase_fwd = np.maximum(np.maximum(host_fwd_all, gpu_fwd), fwd_tail)
    phases_mb = phase_fwd + np.maximum(host_mb - host_fwd_all, gpu_mb - gpu_fwd)
    flow_mb = np.where(megatron, np.maximum(flow_mb, phases_mb), flow_mb)
    host_excess_mb = np.maximum(np.maximum(host_mb, flow_mb) - gpu_mb, 0.0)
    bubble_frac = np.where(pp > 1, (pp - 1.0) / v, 0.0)
    # Fill and drain pass once through each of the other stages, which hold layers only: the last stage's
    # logits and loss are paid once per micro-batch, not (p-1)/v more times (a pipeline with stage times
    # t_i takes sum(t_i) + (m-1) max(t_i); Narayanan et al. 2021's (p-1)/m bubble assumes equal t_i).
    body_mb = np.maximum(layers_stage * (layer_fwd + layer_bwd + layer_rc) + tp_mb, layers_stage * host_layer) + p2p_mb
    bubble = bubble_frac * body_mb

    # --- parameters held per GPU ----------------------------------------------------------------
    p_layer = m.params_per_layer / tp
    stage_extra = np.where(pp > 1, m.vocab * m.d_model + (m.max_positions * m.d_model if m.position.value == "learned" else 0), m.embedding_params)
    params_local = layers_stage * p_layer + stage_extra / tp
    shard = np.where(hybrid, np.minimum(dp, gpn), dp)

    # --- data-parallel communication --------------------------------------------------------------
    master = (zero >= 1) | megatron
    wb, gb = weight_grad_bytes(sc.precision, master)
    grad_comm_bytes = params_local * gb
    dp_per_node = np.clip(np.floor(gpn / tp), 1, dp)
    shard_per_node = np.minimum(dp_per_node, shard)
    # Megatron reduces its contiguous gradient buffer and DeepSpeed its 500M-element buckets in a few large
    # calls: one collective each. PyTorch DDP all-reduces 25 MiB buckets, and FSDP gathers and reduce-scatters
    # one unit at a time (each transformer layer, then the root: embeddings and head): every call pays the
    # collective's start-up latency.
    ar_whole = _only(megatron, lambda n, s, g: comm.collective_time(Collective.all_reduce, n, s, hw, g),
                     dp, grad_comm_bytes, dp_per_node)
    n_buckets = np.maximum(np.ceil(grad_comm_bytes / DDP_BUCKET_BYTES), 1.0)
    ar_buckets = _only(~megatron, lambda n, nb, s, g: nb * comm.collective_time(Collective.all_reduce, n, s / nb, hw, g),
                       dp, n_buckets, grad_comm_bytes, dp_per_node)
    ar_grad = np.where(megatron, ar_whole, ar_buckets)
    units = np.maximum(layers_stage, 1)
    unit_bytes = (params_local - stage_extra / tp) / units

    def per_unit(coll: Collective, nbytes_per_param: Any) -> Any:
        """One FSDP pass: a call per layer unit and one for the root unit (costed for FSDP plans only)."""
        return _only(fsdp, lambda u, n, ub, root, g: u * comm.collective_time(coll, n, ub, hw, g)
                     + comm.collective_time(coll, n, root, hw, g),
                     units, shard, unit_bytes * nbytes_per_param, stage_extra / tp * nbytes_per_param, shard_per_node)

    rs_grad = comm.collective_time(Collective.reduce_scatter, shard, grad_comm_bytes, hw, shard_per_node)
    ag_param = comm.collective_time(Collective.all_gather, shard, params_local * wb, hw, shard_per_node)
    fsdp = ~megatron & (zero >= 2)  # HF-style ZeRO-1 is DeepSpeed's stage 1: 500M-element buckets, few calls
    rs_grad = np.where(fsdp, per_unit(Collective.reduce_scatter, gb), rs_grad)
    ag_param = np.where(fsdp, per_unit(Collective.all_gather, wb), ag_param)
    # Hybrid shard also all-reduces the shard across the replicas (nodes).
    rep = np.maximum(dp / shard, 1.0)
    hsdp_ar = _only(hybrid, lambda r, s: comm.collective_time(Collective.all_reduce, r, s, hw, 1), rep, grad_comm_bytes / shard)
    # The input embedding's gradient is the last one backward produces, so its bucket (at least the
    # embedding table, at least bucket_cap_mb) can never overlap with backward.
    last_bucket = np.minimum(np.maximum(DDP_BUCKET_BYTES, m.vocab * m.d_model / tp * gb), grad_comm_bytes)
    bucket = comm.collective_time(Collective.all_reduce, dp, last_bucket, hw, dp_per_node)
    # The backward of the last micro-batch, which the gradient reduction can hide behind: its GPU work
    # (a host-bound backward lasts longer, but that excess is charged per micro-batch; see fwd_comp below).
    last_bwd = bwd_mb + rc_mb + tp_mb * (n_ar - 2.0) / n_ar
    # Without peer-to-peer (PCIe, NCCL_P2P_DISABLE=1) NCCL's SHM transport stages every chunk through pinned
    # host memory with SM-driven copies that contend with the backward kernels for SMs and PCIe: modelled
    # as no overlap.
    can_overlap = overlap & (hw.intra_node.kind.value != "pcie")
    hide = np.where(can_overlap, last_bwd, 0.0)
    ddp_exposed = np.maximum(ar_grad - hide, np.where(can_overlap, bucket, ar_grad))
    # ZeRO-2 / SHARD_GRAD_OP: per micro-batch all-gather of params (forward) and reduce-scatter (backward);
    # ZeRO-3 / FULL_SHARD: all-gather in forward and again in backward. Prefetch overlaps them with compute;
    # the first layer's gather is always exposed.
    per_layer_ag, per_layer_rs = ag_param / units, rs_grad / units
    # windows the gathers hide behind: the forward / backward GPU work with its TP collectives. A host-bound
    # phase lasts longer and would hide more, but the host's excess is charged per micro-batch, not per
    # phase; counting it here too would let a faster host make a step slower. Conservative when host-bound.
    fwd_comp = layers_stage * lw.fwd_s
    bwd_comp = layers_stage * (lw.bwd_s + lw.recompute_s)
    z2_fwd = np.maximum(ag_param - fwd_comp, per_layer_ag)
    z2_bwd = np.maximum(rs_grad - bwd_comp, per_layer_rs)
    z3_bwd = np.maximum(ag_param + rs_grad - bwd_comp, per_layer_ag + per_layer_rs)
    z3_fwd = z2_fwd
    if np.any(megatron & (zero >= 3)):  # Megatron-DeepSpeed's ZeRO-3: its own coordinator (see the function)
        ds_fwd, ds_bwd = _deepspeed_z3_exposed(m, lw, layers_stage, rc, per_layer_ag, per_layer_rs)
        z3_fwd = np.where(megatron, ds_fwd, z2_fwd)
        z3_bwd = np.where(megatron, ds_bwd, z3_bwd)
    z23_exposed_mb = np.where(zero >= 3, z3_fwd + z3_bwd, z2_fwd + z2_bwd)
    dp_active = dp > 1
    grad_part = np.where(dp_active & ~is_dp_kind & (zero == 0), ddp_exposed, 0.0)
    grad_part = grad_part + np.where(dp_active & (zero == 1), np.maximum(rs_grad - hide, 0.0), 0.0)
    zero_part = np.where(dp_active & (zero == 1), ag_param, 0.0)
    zero_part = zero_part + np.where(dp_active & (zero >= 2), ga * z23_exposed_mb + hsdp_ar, 0.0)

    # nn.DataParallel: every step replicate the model from GPU 0, gather the outputs (loss and logits)
    # on GPU 0, and reduce the gradients back to it; single-process threads, nothing overlapped.
    dp_single = is_dp_kind & dp_active
    bcast = _only(dp_single, lambda n, s: comm.collective_time(Collective.broadcast, n, s, hw, n), dp, params_local * wb)
    gather_logits = tokens * m.vocab * 4.0 * (dp - 1) / (hw.intra_node.bandwidth_bytes_per_s * COPY_ENGINE_EFFICIENCY)
    reduce = _only(dp_single, lambda n, s: comm.collective_time(Collective.reduce, n, s, hw, n), dp, params_local * gb)
    dataparallel = np.where(dp_single, ga * (bcast + gather_logits) + reduce, 0.0)

    # --- optimizer --------------------------------------------------------------------------------
    opt_shard = np.where(zero >= 1, shard, 1.0)
    bytes_pp = {"adamw": 28.0, "adamw-fused": 28.0, "sgd": 20.0}[sc.optimizer]
    if sc.precision is Precision.bf16:
        bytes_pp /= 2.0
    opt_bytes_extra = np.where(master, 6.0, 0.0)  # read fp32 master, write the half-precision copy
    optimizer = optimizer_time(hw, sc.optimizer, params_local / opt_shard, 1.0) * (bytes_pp + opt_bytes_extra)
    if sc.precision is Precision.fp16_mixed:
        # GradScaler: unscale_ (r+w grads) and the inf/nan check (r grads): 12 bytes/param, memory-bound.
        optimizer = optimizer + params_local * 12.0 / (hw.gpu.memory_bandwidth_bytes_per_s * hw.efficiency.elementwise)
    # autocast re-casts fp32 weights to half precision every forward (r 4, w 2 bytes per parameter)
    amp_cast = np.where(~master & (sc.precision in (Precision.bf16_mixed, Precision.fp16_mixed, Precision.fp8_mixed)), 1.0, 0.0)
    cast_s = amp_cast * ga * params_local * 6.0 / (hw.gpu.memory_bandwidth_bytes_per_s * hw.efficiency.elementwise)

    time = {
        "compute/forward": ga * fwd_mb + cast_s,
        "compute/backward": ga * bwd_mb,
        "compute/recompute": ga * rc_mb,
        "comm/tp": ga * (tp_mb + head_tp),
        "host_overhead": ga * host_excess_mb,
        "comm/pp_p2p": ga * p2p_mb,
        "pipeline_bubble": bubble,
        "comm/dp_grad": grad_part,
        "comm/zero_params": zero_part,
        "comm/dataparallel": dataparallel,
        "optimizer": optimizer,
    }

    # --- memory -----------------------------------------------------------------------------------
    memory, overhead = plan_memory(m, hw, sc, PlanArrays(
        dp=dp, tp=tp, pp=pp, zero=zero, mb=mb, ga=ga, rc=rc, v=v, schedule=f["schedule"], sp=sp,
        megatron=megatron, tokens=tokens, layers_stage=layers_stage, params_local=params_local, p_layer=p_layer,
        shard=shard, opt_shard=opt_shard, master=master, wb=wb, gb=gb, amp_cast=amp_cast,
        ddp_kind=dp_active & ~is_dp_kind & (zero == 0)))

    # --- FLOPs --------------------------------------------------------------------------------------
    per_layer_tok = sum(layer_flops_per_token(m, sc.seq_len).values())
    tokens_step = dp * ga * tokens
    model_flops = 3.0 * (m.n_layers * per_layer_tok + logits_flops_per_token(m)) * tokens_step
    rc_flops = np.where(rc == int(Recompute.full), m.n_layers * per_layer_tok, np.where(rc == int(Recompute.selective), m.n_layers * 4.0 * sc.seq_len * m.q_dim, 0.0)) * tokens_step
    return {"time": time, "memory": memory, "overhead": overhead, "model_flops": model_flops,
            "hw_flops": model_flops + rc_flops, "tokens": tokens_step, "params_local": params_local}
