"""Data parallelism: DDP, ZeRO-1/2/3 and FSDP (HSDP across nodes), and single-process nn.DataParallel.

Sharding (Rajbhandari et al. 2020, arXiv 1910.02054, s.3.1): each of the dp_shard ranks of a model-state copy
keeps 1/dp_shard of the optimizer states (ZeRO-1), also of the gradients (ZeRO-2, FSDP SHARD_GRAD_OP), also of
the weights (ZeRO-3, FSDP FULL_SHARD). HYBRID_SHARD shards inside a node and replicates across nodes.

Communication per step (nccl-tests bytes; advisor.comm):
- DDP: all-reduce the gradients, bucket by bucket or in one call (the stack's ``gradient_reduction``),
  overlapped with the last micro-batch's backward; the last bucket (at least the input embedding's gradient,
  the last one backward produces) never overlaps.
- ZeRO-1: reduce-scatter the gradients (overlapped as DDP's), all-gather the updated weights after the step.
  DeepSpeed's engine (``engine.zero_buffers``) all-reduces each gradient bucket instead, and its ZeRO-2 too gathers
  once a step (advisor.parallel.zero_buffers).
- ZeRO-2 / SHARD_GRAD_OP: per micro-batch (FSDP1 under no_sync: parallel.no_sync), all-gather the weights in forward and
  reduce-scatter the gradients in backward; ZeRO-3 / FULL_SHARD also gathers again in backward. Prefetch hides each gather
  behind the pass's compute, except the first layer's (``zero3_overlap: prefetch``); without backward prefetch (``forward``)
  only the forward's gathers hide, each backward gather waiting in line behind the reduce-scatter before it; DeepSpeed's
  coordinator gathers one sub-module at a time (``per_submodule``, ``zero3.deepspeed_exposed``). An FSDP stack calls the
  collectives per unit (each layer, then the root), each paying its start-up (``zero_collectives: per_unit``).
- HSDP also all-reduces each shard across the replicas.
- While a collective overlaps the compute, NCCL's thread blocks hold one SM per channel (advisor.comm.held_sms): the
  compute beside it runs on the rest and finishes the work it lost after (advisor.comm.beside).
- nn.DataParallel: every step replicate the model from GPU 0, gather the outputs (loss and logits) on GPU 0,
  and reduce the gradients back to it; single-process threads, nothing overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor import adapters, comm, mtp, optimizer
from advisor.candidates import Candidates, Mesh
from advisor.comm import Collective
from advisor.compute import LayerTimes
from advisor.hardware import Hardware
from advisor.layout import DataParallelKind, Schedule
from advisor.parallel import accumulator, expert, fp8_gather, fsdp2, grad_checks, no_sync, pipeline, zero3, zero_buffers, zero_offload
from advisor.parallel.model_states import ModelStates
from advisor.parallel.overlap import Windows, bucket_bytes, edge_bucket_share, hidden, overlaps, zero1_edges  # noqa: F401
from advisor.peft_modules import largest_transformers_module
from advisor.recompute import mix
from advisor.workload import Workload

# Copy-engine peer copies (cudaMemcpyPeer, as torch.cuda.comm.gather uses) reach 88% of the link rate:
# nvbandwidth on H200 NVLink4, 396 of 450 GB/s (reference/published_collectives.yaml, mleng_h200_pairwise_copy).
COPY_ENGINE_EFFICIENCY = 0.88


def violations(c: Candidates, hw: Hardware) -> dict[str, Any]:
    g, single = hw.gpus_per_node, c.dp_kind == DataParallelKind.dp.code
    return {
        "nn.DataParallel is single-node, single-process: no ZeRO, TP or PP": single & (
            (c.zero > 0) | (c.tp > 1) | (c.pp > 1) | (c.dp > g)),
        "hybrid shard needs ZeRO-3 and dp spanning more than one node": np.asarray(c.hybrid, dtype=bool) & (
            (c.zero != 3) | (c.dp <= g) | (c.dp % g != 0)),
    }


def model_states(w: Workload, c: Candidates, mesh: Mesh, layers: Any, last: bool = False) -> ModelStates:
    m, tp, zero, shard, eng = w.model, mesh.tp, np.asarray(c.zero), mesh.dp_shard, w.stack.engine
    # split linears' share, replicated ones (MLA's down projections) whole; routed experts split by ep and etp
    p_layer = expert.rank_layer_params(w.layer, tp, mesh.ep, mesh.etp)
    extra = (mtp.last_stage_outside_params if last else mtp.outside_params)(m, w.mtp_layers)
    # MTP's eh_proj and norms without a pipeline, or on its ``last`` rank with the embedding copy it builds (advisor.mtp)
    outside = (pipeline.params_outside_layers(m, mesh.pp, c.schedule, eng.tied_pipeline == "untied")
               + np.where((mesh.pp <= 1) | last, extra, 0.0)) / tp
    # uneven split: ``layers`` is u - 1, and the busiest rank holds the first's embedding or a middle rank's u-th layer
    outside = np.where(pipeline.uneven(c), np.maximum(outside, p_layer), outside)
    params = layers * p_layer + outside
    # the routed experts' states sharded over the expert data-parallel group (edp ranks) by ZeRO, the rest over dp (without
    # EP, etp = tp, the experts are reduced, sharded and gathered with the rest over dp: edp = dp)
    experts = (np.where((mesh.ep > 1) | (mesh.etp != tp), layers * expert.expert_params(w.layer) / (mesh.ep * mesh.etp),
                        0.0) if w.layer.routed else 0.0)
    stepped = (params - experts) / shard + experts / np.where(zero >= 1, mesh.edp, 1.0) if w.layer.routed else params / shard
    master = (zero >= 1) & (eng.master_weights != "never") | (eng.master_weights == "always") | eng.fsdp_at_one
    wb, gb = optimizer.weight_grad_bytes(w.precision, master)
    # fp32 gradients: Megatron's main_grad buffer; FSDP2 under a pipeline accumulating unsharded ones in reduce_dtype
    # (where there is an FSDP group: at dp 1 torchtitan 0.2.2 applies none, 0.3.0 a one-rank one: engine.fsdp_at_one)
    fsdp_pp = eng.zero1 == "fsdp_under_pipeline"
    fp32 = (fsdp_pp & (eng.reduce_dtype == "fp32") & (zero == 1) & ((shard > 1) | eng.fsdp_at_one)
            | (eng.main_grads == "fp32"))
    gb = np.where(fp32, np.maximum(gb, 4.0), gb)
    r = w.precision.recipe
    if r is not None and eng.low_precision_params:  # the layers' weights held (and gathered) in the recipe's format
        wb = np.where(master, (layers * p_layer * r.stored_bytes + outside * wb) / params, wb)
    grads = params * gb / np.where(zero >= 2, shard, 1.0)
    weights = params * wb / np.where(zero >= 3, shard, 1.0)
    if w.layer.routed:  # ZeRO-2/3 shard the experts' gradients (and weights) over edp as ZeRO-1 their optimizer states
        grads = np.where(zero >= 2, stepped, params) * gb
        weights = np.where(zero >= 3, stepped, params) * wb
    # ZeRO-3 holds two gathered units (current + prefetch): a layer per FSDP unit, or DeepSpeed's largest sub-module (stage3.py
    # fetch_sub_module), less local experts nothing shards (edp 1); never more than the weights this GPU does not hold
    sharded = p_layer - (np.where(mesh.edp > 1, 0.0, expert.expert_params(w.layer) / (mesh.ep * mesh.etp)) if w.layer.routed else 0)
    largest = (largest_transformers_module(m, tp) if eng.base_modules == "transformers" and not w.layer.routed
               else w.layer.largest_module_weights(tp))  # (transformers' routed experts: one fused 3-D parameter)
    unit = sharded if eng.zero3_gathered == "layer" else np.minimum(largest, sharded)
    root = np.maximum({"none": 0.0, "output": np.minimum(m.vocab * m.d_model / tp, outside), "root": outside}[eng.root_held],
                      zero3.reused_tail(w, outside, layers * p_layer, tp))  # held from forward into backward
    ub = fp8_gather.layer_gather_bytes(w, wb)  # a layer's weights gathered in float8 (advisor.parallel.fp8_gather)
    held = 2 * unit * ub + root * wb if eng.root_held == "root" else np.maximum(2 * unit * ub, unit * ub + root * wb)
    gathered = np.where(zero >= 3, np.minimum(held, (layers * p_layer * ub + outside * wb) * (1 - 1 / shard)), 0.0)
    ddp = (mesh.dp > 1) & (c.dp_kind == DataParallelKind.ddp.code) & (zero == 0)
    # gradients reduced in fp32 (torchtitan's MixedPrecisionPolicy, Composer's DEFAULT) move 4 bytes a parameter and, per
    # unit, an fp32 copy joins the unsharded gradient while it is reduce-scattered
    reduce_bytes = 4.0 if eng.reduce_dtype == "fp32" else gb
    buffer = p_layer * (gb + (4.0 if eng.reduce_dtype == "fp32" else 0.0)) if eng.unit_grad_buffer else 0.0
    states = ModelStates(
        params=params, params_outside_layers=outside, master=master, weight_bytes=wb, grad_bytes=gb,
        reduce_bytes=reduce_bytes, grad_buffer=np.where(zero >= 2, buffer, 0.0), weights=weights, grads=grads,
        # pure bf16 in DeepSpeed (zero_offload.half_master) adds its bf16 master partition, cloned beside the moments
        # (stage_1_and_2.py:558-561: master_weights_and_grads_dtype)
        optimizer_states=stepped * (optimizer.state_bytes(w, master) + np.where(
            zero_offload.half_master(w) & (zero >= 1), zero_offload.HALF, 0.0)), gathered=gathered,
        bucket_copy=np.where(ddp & eng.gradient_bucket_copy, params * optimizer.weight_grad_bytes(w.precision, master)[1], 0.0),
        autocast_copy=optimizer.autocast_weights(w, master) * params * 2.0
        + quantised_weights(w, zero, layers * p_layer, eng.low_precision_params),
        step_temporaries=optimizer.step_temporaries(w, stepped, optimizer.largest_tensor(w, zero, shard, p_layer, outside, tp)),
        head_grads=np.minimum(m.vocab * m.d_model / tp * gb, grads),
        # gradients exist before backward when accumulated across micro-batches, in a buffer allocated up front, or in
        # ZeRO's flat or partitioned buffers (not FSDP2's ZeRO-1 under PP: made in backward, _fsdp_param.py:802-813)
        grads_persist=(c.grad_accum > 1) | eng.gradients_persist | (zero >= 1) & ~(fsdp_pp & (zero == 1)), expert_params=experts,
        stepped_params=stepped, gather_bytes=(layers * p_layer * ub + outside * wb) / np.maximum(params, 1.0))
    states = adapters.model_states(w, c, mesh, layers, states) if w.finetune.adapters else states
    states = accumulator.apply(w, c, mesh, states)  # half .grad beside an fp32 accumulator (engine.grad_accumulator)
    return zero_buffers.apply(w, c, mesh, states)  # a ZeRO engine's buckets and step copies (engine.zero_buffers)


def quantised_weights(w: Workload, zero: Any, layer_params: Any, low_params: bool = False) -> Any:
    """Bytes of the recipe's quantised weight copies kept through the step: where the weights stay whole on the GPU
    (ZeRO 0-2), Transformer Engine quantises each weight at the first micro-batch and keeps the copy for the
    rest (``is_first_microbatch``), in both orientations (the forward's row-wise copy and the dgrad's column-wise
    one; TE recipe docstrings: "both versions are computed from the high precision input"), scales included.
    Under ZeRO-3 / FSDP the gathered weight is cast per use and freed with it (torchao's float8 all-gather: the
    measured torchtitan FSDP runs hold the same memory in FP8 as in BF16, reference/lowprec_runs.yaml). Where the
    stack keeps the weights themselves in the recipe's format (``low_precision_params``), only the column-wise copy
    is extra."""
    r = w.precision.recipe
    if r is None:
        return 0.0
    return np.where(zero >= 3, 0.0, (1.0 if low_params else 2.0) * r.stored_bytes * layer_params)


@dataclass(frozen=True)
class DataParallelTime:
    """Seconds per step the data-parallel collectives add beyond what overlaps with compute."""

    grad_s: Any  # the gradient reduction (DDP, ZeRO-1)
    zero_params_s: Any  # ZeRO-1's weight all-gather; ZeRO-2/3's per micro-batch gathers and reduce-scatters; HSDP
    dataparallel_s: Any  # nn.DataParallel's replicate, gather and reduce


def time(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, layers: Any, windows: Windows,
         inline: LayerTimes, tokens: Any) -> DataParallelTime:
    active, zero = mesh.dp > 1, np.asarray(c.zero)
    can_overlap = zero_buffers.overlap(w, zero, overlaps(c, w.hw))  # less a ZeRO engine's that never overlaps
    hide = np.where(can_overlap, windows.last_backward_s, 0.0)
    ddp = active & (c.dp_kind == DataParallelKind.ddp.code) & (zero == 0)
    rs, ag, roots = sharded_collectives(w, mesh, states, layers, zero, active & (zero >= 1))
    if w.layer.routed:  # the experts' own reduce-scatter and gather over the expert data-parallel group, on the same links
        ers, eag = expert.sharded_collectives(w, mesh, states, np.asarray(c.zero) >= 1)
        rs, ag = rs + ers, ag + eag
    # NCCL's thread blocks hold SMs while a collective runs beside the compute (advisor.comm.held_sms): wherever a
    # window hides it (a collective nothing hides, hide = 0, is costed whole and holds nothing from anything)
    held = comm.held_sms(mesh.dp_shard, mesh.shard_per_node, w.hw)
    hsdp = comm.collective_time(Collective.all_reduce, mesh.dp_replicate, states.dp_params * states.reduce_bytes / mesh.dp_shard,
                                w.hw, 1, where=np.asarray(c.hybrid, dtype=bool))  # replicas sit in different nodes
    rs, roots, hsdp = fsdp2.replicas_per_micro_batch(w, states, rs, roots, hsdp)
    once = zero_buffers.gathers_once(w, zero)  # ZeRO-1 (and DeepSpeed's ZeRO-2) gathers the weights once a step
    mb = lambda r, a, rt: zero_exposed_per_micro_batch(w, c, mesh, states, zero, r, a, layers, windows, inline, rt, held)  # noqa: E731
    exposed = mb(rs, np.where(once, 0.0, ag), roots)
    exposed = zero_buffers.serial_reduction(w, zero, can_overlap, rs, exposed)  # DeepSpeed without overlap_comm
    idle = np.where(can_overlap, windows.idle_backward_s, 0.0)  # the backward's (Windows); staged through the host, none
    grad = np.where(ddp, ddp_exposed(w, mesh, states, ddp, can_overlap, hide, idle) * fsdp2.replica_passes(w, c), 0.0)
    # ZeRO-1's gather: beside the next forward (its idle behind the host too) bucket by bucket, the first one (the embedding's)
    # waiting (else all of it exposed); the backward's idle, before the optimizer step, hides the reduce-scatter only
    rs_edge, ag_edge = zero1_edges(w, mesh, states, active & (zero == 1))  # (advisor.parallel.overlap)
    first = np.minimum(ag_edge, ag) if w.stack.engine.param_gather_overlap else ag
    z1_ag = first + np.maximum(comm.beside(np.maximum(ag - first, 0.0), windows.fwd_s, held)
                               - np.where(can_overlap, windows.idle_forward_s, 0.0), 0.0)
    z1_rs = hidden([np.minimum(rs_edge, rs)], [comm.beside(np.maximum(rs - rs_edge, 0.0), hide, held)], idle)[0]
    grad = grad + np.where(active & (zero == 1), z1_rs, 0.0)  # the last bucket after the backward, as DDP's
    grad = grad + grad_checks.nan_check_seconds(w, mesh, states, zero)  # before the reduction (engine.grad_nan_check)
    exposed = no_sync.step_seconds(w, c, zero, exposed + fsdp2.unit_copy_seconds(w, states, zero), rs, ag, roots, mb)
    params = np.where(active & once, z1_ag, 0.0) + np.where(active & (zero >= 2), exposed + hsdp, 0.0)
    params = params + fsdp2.one_rank_copies(w, c, states, zero, active)
    params = params + fp8_gather.amax_precompute_s(w, mesh, layers, active & (zero >= 2))  # after the optimizer step
    return DataParallelTime(grad, params, dataparallel_time(w, c, mesh, states, tokens))


def ddp_exposed(w: Workload, mesh: Mesh, states: ModelStates, ddp: Any, can_overlap: Any, hide: Any,
                idle: Any = 0.0) -> Any:
    """DDP's gradient all-reduce beyond the backward it overlaps with and the GPU's idle time behind the host
    (``Windows``); the last bucket is always exposed."""
    hw, eng = w.hw, w.stack.engine
    size = states.dp_params * states.reduce_bytes
    bucket = bucket_bytes(w, mesh.dp, states.reduce_bytes)
    # PyTorch DDP all-reduces bucket_cap_mb buckets: every call pays the collective's start-up
    n = 1.0 if eng.gradient_reduction == "one_call" else np.maximum(np.ceil(size / bucket), 1.0)
    call, path = comm.collective_time_and_path_where(Collective.all_reduce, mesh.dp, size / n, hw, mesh.dp_per_node, ddp)
    total = n * call
    last = size * edge_bucket_share(w, mesh.tp, states.dp_params, states.reduce_bytes, mesh.dp)
    last_t = comm.collective_time(Collective.all_reduce, mesh.dp, last, hw, mesh.dp_per_node, where=ddp)
    floor = np.where(can_overlap, last_t, total)
    held = comm.held_sms(mesh.dp, mesh.dp_per_node, hw, path)  # without overlap hide is 0: beside() is the whole call
    return hidden([floor], [comm.beside(np.maximum(total - floor, 0.0), hide, held)], idle)[0]


def sharded_collectives(w: Workload, mesh: Mesh, states: ModelStates, layers: Any, zero: Any,
                        on: Any) -> tuple[Any, Any, tuple[Any, Any]]:
    """(reduce-scatter of the gradients, all-gather of the weights) seconds for one pass over the stage, and of those
    the root unit's (reduce-scatter, all-gather): the parameters outside the layers, where the stack calls per unit."""
    hw, shard, per_node = w.hw, mesh.dp_shard, mesh.shard_per_node
    # An FSDP stack calls them per unit: each layer, then the root (embeddings and head). ZeRO-1 is DeepSpeed's
    # stage 1 there, with its 500M-element buckets: one call each, as in a stack that reduces in one call.
    units_on = on & (zero >= 2) & (w.stack.engine.zero_collectives == "per_unit")
    whole_on = on & ~units_on
    units = np.maximum(layers, 1.0)
    out, roots = [], []
    for coll, per_param, n in states.zero_payloads(zero):
        share = n / states.params
        unit = (states.params - states.params_outside_layers) / units * share
        whole = comm.collective_time(coll, shard, n * per_param, hw, per_node, where=whole_on)
        each = zero_buffers.all_reduces(w, zero)  # an all-reduce where ZeRO-1/2 (DeepSpeed's, nanotron's) do
        if coll is Collective.reduce_scatter and np.any(each):
            whole = np.where(each, comm.collective_time(Collective.all_reduce, shard, n * per_param, hw, per_node,
                                                        where=whole_on & each), whole)
        root = np.where(units_on, comm.collective_time(coll, shard, states.params_outside_layers * share * per_param, hw,
                                                       per_node, where=units_on), 0.0)
        per_unit = units * comm.collective_time(coll, shard, unit * per_param, hw, per_node, where=units_on) + root
        out.append(np.where(units_on, per_unit, whole))
        roots.append(root)
    return out[0], out[1] + fp8_gather.amax_per_gather_s(w, mesh, layers, on & (zero >= 2)), (roots[0], roots[1])


def zero_exposed_per_micro_batch(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, zero: Any, rs: Any,
                                 ag: Any, layers: Any, windows: Windows, inline: LayerTimes,
                                 roots: tuple[Any, Any] = (0.0, 0.0), held: Any = 0.0) -> Any:
    """ZeRO-2/3 collectives per micro-batch beyond the compute they hide behind (the first layer's gather and
    the last layer's reduce-scatter are always exposed).

    Where the stack calls them per unit (FSDP), the root unit (the parameters outside the layers: the embedding, final
    norm and output layer) is gathered in the root's pre-forward before anything computes, and the first layer's
    gather is issued behind it on the same all-gather stream while the compute stream waits for both; the root's
    gradients are reduce-scattered last, after the embedding's gradient (its post-backward: FSDP2's
    ``_root_post_backward_final_callback``, torch 2.13 _fully_shard/_fsdp_state.py; FSDP1's flat parameter holds the
    embedding, whose gradient backward produces last), behind the first layer's reduce-scatter. So the root's
    collectives are exposed at their own size (Llama 3's 128K-entry embedding and output layer are 4.8x a layer of
    the 8B), not at a layer's average. What overlaps holds ``held`` of the SMs from the compute (comm.beside)."""
    units = np.maximum(layers, 1.0)
    rs_root, ag_root = roots
    ag_unit, rs_unit = (ag - ag_root) / units, (rs - rs_root) / units
    outside, m = np.maximum(states.params_outside_layers, 1.0), w.model  # the root's share held into the backward
    kept = {"none": 0.0, "output": np.minimum(m.vocab * m.d_model / mesh.tp, outside), "root": outside}  # is not
    ag_bwd = ag - ag_root * kept[w.stack.engine.root_held] / outside  # gathered again (engine.root_held)
    floor_f, floor_b, floor_b3 = ag_unit + ag_root, rs_unit + rs_root, ag_unit + rs_unit + rs_root

    def need(c: Any, window: Any) -> Any:
        return comm.beside(np.maximum(c, 0.0), window, held)
    need_f = need(ag - floor_f, windows.fwd_s)
    z2 = sum(hidden([floor_f, floor_b], [need_f, need(rs - floor_b, windows.bwd_s)], windows.idle_s))
    if not np.any(zero >= 3):
        return z2
    if w.stack.engine.zero3_overlap == "per_submodule":  # costed on the ZeRO-3 plans alone
        z3 = np.zeros(np.shape(z2))
        on = np.broadcast_to(zero >= 3, z3.shape)
        pick = (lambda x: np.broadcast_to(x, z3.shape)[on])  # noqa: E731
        sub = LayerTimes(*(pick(getattr(inline, f)) for f in LayerTimes.__dataclass_fields__))
        v = np.where(c.schedule == Schedule.interleaved.code, c.virtual_stages, 1)
        rerun = mix(c.recompute, c.recompute_k, layers, v, w.model.n_layers).full  # checkpointed layers' share
        z = w.stack.engine.zero3_calls
        # what the sub-modules' compute leaves exposed, less the GPU's idle behind a host-bound issue (Windows), which
        # the coordinator's gathers run through as they run through compute (a faster GPU leaves the host's time as it is)
        idle = pick(np.broadcast_to(windows.idle_s, z3.shape))
        if z is None:  # one call per pass, shared out over the sub-modules
            z3[on] = sum(hidden([0.0, 0.0], list(zero3.deepspeed_exposed(w, sub, pick(layers), pick(rerun), pick(ag_unit),
                                                                         pick(rs_unit), pick(held))), idle))
        else:  # call by call, as the stack's coordinator issues them (advisor.parallel.zero3)
            calls = zero3.submodule_calls(w, z, pick(mesh.tp), pick(mesh.dp_shard), pick(mesh.shard_per_node),
                                          pick(states.weight_bytes), pick(states.reduce_bytes),
                                          pick(states.params_outside_layers), w.tables.cpu_us_per_op)
            z3[on] = sum(hidden([0.0, 0.0], list(zero3.exposed(w, z, sub, pick(layers), pick(rerun), calls, pick(held))), idle))
    elif w.stack.engine.zero3_overlap == "forward":
        # FSDP without backward prefetch (torch 1.11's default, backward_prefetch=None; fully_sharded_data_parallel.py):
        # the forward's gathers run ahead of the compute on their own stream, as the host issues them. In backward a
        # unit's pre-backward hook issues its gather only when autograd reaches it, after the post-backward hook of the
        # unit before has issued that unit's reduce-scatter, which waits for its backward; both run on the process
        # group's one NCCL stream (ProcessGroupNCCL), so the gather waits for that compute and that reduce-scatter, and
        # the unit's compute for the gather: every backward gather and reduce-scatter is exposed
        z3 = sum(hidden([floor_f, 0.0], [need_f, ag_bwd + rs], windows.idle_s))  # in line: the host's idle alone hides
    else:
        z3 = sum(hidden([floor_f, floor_b3], [need_f, need(ag_bwd + rs - floor_b3, windows.bwd_s)], windows.idle_s))
    return np.where(zero >= 3, z3, z2)


def dataparallel_time(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, tokens: Any) -> Any:
    """nn.DataParallel's per-step replicate (broadcast), logits gather and gradient reduce through GPU 0."""
    single = (c.dp_kind == DataParallelKind.dp.code) & (mesh.dp > 1)
    if not single.any():
        return np.zeros(np.shape(single))
    hw, dp = w.hw, mesh.dp
    bcast = comm.collective_time(Collective.broadcast, dp, states.params * states.weight_bytes, hw, dp, where=single)
    gather = tokens * w.model.vocab * 4.0 * (dp - 1) / (hw.intra_node.bandwidth_bytes_per_s * COPY_ENGINE_EFFICIENCY)
    reduce = comm.collective_time(Collective.reduce, dp, states.trained * states.grad_bytes, hw, dp, where=single)
    return np.where(single, c.grad_accum * (bcast + gather) + reduce, 0.0)
