"""A training step: the dimensions' named time and memory parts composed into breakdowns, for every candidate
plan at once (an estimate is a table of one row).

Step time (one optimizer step on the busiest pipeline stage; m = grad_accum micro-batches):
    compute     m x (forward + backward + recomputation) of the stage's layers and the head (advisor.compute)
    comm/tp     m x the TP collectives of the layers and the head (advisor.parallel.tensor)
    host        m x what the host's issuing adds beyond the GPU's work (advisor.host)
    pipeline    m x stage-to-stage send/recv, and the bubble of the schedule (advisor.parallel.pipeline); the
                busiest rank's layers (and whether it holds the head) follow the pipeline split
    dp comm     the gradient reduction, ZeRO's gathers and reduce-scatters, nn.DataParallel's copies, beyond
                what overlaps with compute (advisor.parallel.data)
    optimizer   the memory-bound step on the local (sharded) parameters (advisor.optimizer)
    offload     offloaded states' PCIe and NVMe traffic beyond what overlaps, the CPU step, activation
                offload's copies (advisor.parallel.offload)
The step time is the sum of the parts (``TimeBreakdown.total``). Memory: advisor.memory.

FLOPs: the model FLOPs of a step count its forward and backward once (3x the forward: Narayanan et al. 2021
eq. 3): the layer table's GEMMs, the causal attention core for the keys each query sees ((s + 1) / 2 on
average), the LM head; the input embedding is a lookup, not counted. A mixture-of-experts layer counts its
routed experts at top-k (active parameters) and its shared experts and router whole, each distinct layer (dense
first layers) at its own count, as Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py:
routed FFN x moe_router_topk + shared experts) and torchtitan's ``get_num_flop_per_token`` (6 x active params +
attention) count them; they leave the router's h x E GEMM out (< 0.2% of a DeepSeek-V3 layer). The hardware FLOPs are what the GPUs
execute: the same, plus the masked half of the scores where eager attention computes them, plus the recomputed
forward (full: every layer; selective: the attention core). So HFU >= MFU, and neither exceeds 100%: every
counted FLOP is costed at no more than the GPU's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Optional

import numpy as np

from advisor import adapters, compute, host, mtp, optimizer, weight_casts
from advisor.candidates import Candidates, Mesh
from advisor.finetune import half_base
from advisor.memory import MemoryBreakdown, Overhead, breakdown, policy_mix, saved_per_token
from advisor.parallel import context, data, expert, offload, overlap, pipeline, tensor
from advisor.parallel.in_flight import in_flight_last, in_flight_layers
from advisor.recompute import Mix, rerun, selected
from advisor.training import Recompute
from advisor.workload import Workload


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per step (arrays over plans); ``parts()`` names them as the output does."""

    compute_forward: Any
    compute_backward: Any
    compute_recompute: Any
    comm_tp: Any
    host_overhead: Any
    comm_pp_p2p: Any
    pipeline_bubble: Any
    comm_dp_grad: Any
    comm_zero_params: Any
    comm_dataparallel: Any
    optimizer: Any
    offload: Any = 0.0  # the offloads' exposed PCIe and NVMe traffic and the CPU step (advisor/parallel/offload.py)
    comm_ep: Any = 0.0  # the expert-parallel dispatch and combine all-to-alls (advisor.parallel.expert)
    comm_ep_grad: Any = 0.0  # the routed experts' gradient reduction over the expert data-parallel group
    comm_cp: Any = 0.0  # the context-parallel K/V exchange beyond the attention it overlaps (advisor.parallel.context)

    def parts(self) -> dict[str, Any]:
        return {_NAMES[f.name]: getattr(self, f.name) for f in fields(self)}

    @property
    def total(self) -> Any:
        return sum(self.parts().values())


_NAMES = {"compute_forward": "compute/forward", "compute_backward": "compute/backward",
          "compute_recompute": "compute/recompute", "comm_tp": "comm/tp", "host_overhead": "host_overhead",
          "comm_pp_p2p": "comm/pp_p2p", "pipeline_bubble": "pipeline_bubble", "comm_dp_grad": "comm/dp_grad",
          "comm_zero_params": "comm/zero_params", "comm_dataparallel": "comm/dataparallel", "optimizer": "optimizer",
          "offload": "offload", "comm_ep": "comm/ep_alltoall", "comm_ep_grad": "comm/ep_grad", "comm_cp": "comm/cp"}
TIME_PARTS = tuple(_NAMES.values())


@dataclass(frozen=True)
class Evaluation:
    time: TimeBreakdown
    memory: MemoryBreakdown
    overhead: Overhead
    model_flops: Any  # per step, all GPUs
    hw_flops: Any
    tokens: Any  # per step
    params_local: Any  # parameters of the busiest GPU's stage and TP rank
    host_bytes: Any = 0.0  # host memory per node the offloads need (advisor/parallel/offload.py)


def evaluate(w: Workload, c: Candidates) -> Evaluation:
    """Every time part (seconds) and memory part (bytes) of the plans in ``c`` (vectorised). Where the stack's FSDP
    runs the layers in half precision (Workload.fsdp_variant), its ZeRO-2/3 plans are costed with those tables."""
    c = _sharded_only(w, c)
    alt, fsdp = _fsdp_rows(w, c)
    if not fsdp.any():
        return _staged(w, c)
    if fsdp.all():
        return _staged(alt, c)
    return _merge(_staged(w, c.take(np.nonzero(~fsdp)[0])), _staged(alt, c.take(np.nonzero(fsdp)[0])), fsdp)


def _staged(w: Workload, c: Candidates) -> Evaluation:
    """Where the even split leaves the last pipeline rank fewer layers (advisor.parallel.pipeline.two_ranks), the step
    of the first rank (its layers and the embedding) and of the last (fewer, and the head), each with its layers'
    collectives, its checkpointing policy over its own layers (block's first k of fewer) and its own model states (the
    data-parallel collectives and the optimizer step of fewer layers), the slower taken; the bubble is the first
    rank's in both (fill and drain pass through the ranks before the last, which hold as many layers as the first),
    and so is the memory."""
    two = pipeline.two_ranks(w.model, c, _layout(w), w.mtp_layers)
    if not two.any():
        return _evaluate(w, c)
    first, last = _first_and_last(w, c.take(np.nonzero(two)[0]))
    busier = _pick(first, last, np.asarray(last.time.total > first.time.total))
    fuller = np.asarray(last.memory.peak + last.overhead.total > first.memory.peak + first.overhead.total)
    mem = _pick(first, last, fuller)  # the verdict is the fuller rank's: the last, with MTP and the head, may not fit
    busier = replace(busier, memory=mem.memory, overhead=mem.overhead, host_bytes=mem.host_bytes)
    return busier if two.all() else _merge(_evaluate(w, c.take(np.nonzero(~two)[0])), busier, two)


def _first_and_last(w: Workload, c: Candidates) -> tuple[Evaluation, Evaluation]:
    """The first rank's evaluation and the last's (its own memory: its layers, MTP depths, head and logits), which
    takes the first's bubble (fill and drain pass through the fuller ranks)."""
    first, last = _evaluate(w, c, "first"), _evaluate(w, c, "last")
    return first, replace(last, time=replace(last.time, pipeline_bubble=first.time.pipeline_bubble))


def _sharded_only(w: Workload, c: Candidates) -> Candidates:
    """Where the stack keeps master weights with its shards and has no rank to shard over (dp_shard x cp 1): no ZeRO
    (torchtitan 0.2.2: no FSDP2 there, autocast), or where it wraps every unit in FSDP2 whatever (engine.fsdp_at_one,
    torchtitan 0.3.0) ZeRO-3 over one rank, under a pipeline its ZeRO-1 (reshard_after_forward False: the stage's bf16
    parameters and fp32 gradients held across the micro-batches, advisor.parallel.data)."""
    eng = w.stack.engine
    if eng.master_weights != "with_shards":
        return c
    alone = np.where(np.asarray(c.pp) > 1, 1, 3) if eng.fsdp_at_one else 0
    return replace(c, zero=np.where((c.dp == 1) & (c.cp == 1), alone, c.zero))


def _fsdp_rows(w: Workload, c: Candidates) -> tuple[Optional[Workload], Any]:
    """(the workload the stack's FSDP runs as, or None: Workload.fsdp_variant; the plans that run as it, ZeRO-2/3
    (and ZeRO-1 where the stack's is DeepSpeed's bf16 engine: engine.half_from_zero), on one rank too: torch's FSDP
    at world size 1 runs NO_SHARD and keeps its MixedPrecision's bf16 parameters for the compute (torch 2.13
    fsdp/_init_utils.py, _flat_param.py _use_low_precision_shard), as accelerate's launcher wraps the model whatever
    --num_processes is)."""
    alt = w.fsdp_variant()
    return alt, (c.zero >= w.stack.engine.half_from_zero) if alt is not None else np.zeros(len(c), dtype=bool)


def _held_layers(w: Workload, c: Candidates, mesh: Mesh, rank: Optional[str]) -> Any:
    """The layers whose states (and checkpointing) the rank costed holds: the last rank's own, else the busiest's by
    memory (advisor.parallel.pipeline.memory_layers)."""
    if rank == "last":
        return pipeline.stage_layers(w.model, c, mesh, 0.0, 0.0, "last", w.mtp_layers)[0]
    return pipeline.memory_layers(w.model, c, mesh, w.mtp_layers)


def _in_flight(w: Workload, c: Candidates, mesh: Mesh, layers: Any, rank: Optional[str]) -> tuple[Any, Any]:
    """(layer-micro-batches of activations the rank costed holds at its peak, those beside its loss): the last rank's
    own (its ``layers``, the MTP depths in: in_flight_last), all of them beside its loss; else the first's
    (in_flight_layers), the last stage's one micro-batch of ``layers`` beside the loss (memory.breakdown)."""
    if rank == "last":  # its chunks but the last: the layout's ceil(L / (pp v)) or the uneven split's (L + 2) / (pp v)
        units = w.model.n_layers + np.where(pipeline.uneven(c), 2.0, 0.0)
        chunk = np.where(pipeline.uneven(c), units / (mesh.pp * mesh.v), np.ceil(units / (mesh.pp * mesh.v)))
        return in_flight_last(layers, mesh.pp, mesh.v, c.schedule, c.grad_accum, chunk)
    # the first of two ranks costed apart (_staged) holds no loss: the last's is its own evaluation
    return in_flight_layers(w.model.n_layers, mesh.pp, mesh.v, c.schedule, c.grad_accum, c.pp_split,
                            w.mtp_layers), None if rank == "first" else layers


def _layout(w: Workload) -> bool:
    """Whether the stack lays out the layers pp x v does not divide as Megatron does (advisor.parallel.pipeline)."""
    return "layout" in w.stack.engine.pipeline_splits


def _pick(a: Any, b: Any, rows: Any) -> Any:
    """``b`` where ``rows`` is True, else ``a``: two evaluations of the same plans, field by field."""
    if is_dataclass(a):
        return type(a)(**{f.name: _pick(getattr(a, f.name), getattr(b, f.name), rows) for f in fields(a)})
    return np.where(rows, b, a)


def _merge(a: Any, b: Any, rows: Any) -> Any:
    """``a`` on the rows where ``rows`` is False and ``b`` where it is True, field by field (arrays, dataclasses)."""
    if is_dataclass(a):
        return type(a)(**{f.name: _merge(getattr(a, f.name), getattr(b, f.name), rows) for f in fields(a)})
    out = np.empty(len(rows))
    out[~rows], out[rows] = np.broadcast_to(a, (int((~rows).sum()),)), np.broadcast_to(b, (int(rows.sum()),))
    return out


def _evaluate(w: Workload, c: Candidates, rank: Optional[str] = None) -> Evaluation:
    mesh = Mesh.of(c, w.hw.gpus_per_node, w.hw.domain_gpus)
    ga = c.grad_accum.astype(float)
    tokens = c.micro_batch.astype(float) * w.seq_len / mesh.cp  # one rank's share of a micro-batch
    mem_layers = _held_layers(w, c, mesh, rank)
    pol = policy_mix(w, c, mesh, mem_layers)
    casts = weight_casts.share(w, c.zero, ga)
    lt = adapters.with_adapters(w, compute.layer_times(w, tokens, mesh.tp, c.sp, pol, mesh.ep, mesh.etp, casts,
                                                       weight_casts.rerun_share(w, c.zero)), tokens, pol, mesh.tp)
    head = compute.head_times(w, tokens, mesh.tp)
    # the busiest pipeline rank's layers (or the ``rank`` asked), and whether it holds the head and the embedding
    layers, on_head, on_embedding = pipeline.stage_layers(w.model, c, mesh, lt.fwd_s + lt.bwd_s + lt.recompute_s,
                                                          head.fwd_s + head.bwd_s, rank, w.mtp_layers)
    # each linear's forward GEMM seconds, where the TP overlap (parallel.tensor) or the all-to-alls pair collectives with them
    gemms = (compute.layer_gemms(w, w.layer, tokens, mesh.tp, mesh.ep, mesh.etp)
             if w.tp_overlap != "none" or w.layer.routed or w.stack.engine.tp_backward_overlap else None)
    tp = tensor.time(w, c, mesh, tokens, layers, gemms)
    # some busiest ranks hold no head (the first, a middle one) or no embedding (the last, a middle one)
    head = head.on_ranks(on_head, on_embedding)
    tp = replace(tp, embedding_s=on_embedding * tp.embedding_s, lm_head_s=on_head * tp.lm_head_s, loss_s=on_head * tp.loss_s)
    ep, moe = _expert_time(w, c, mesh, tokens, layers, lt, gemms)
    p2p = pipeline.p2p_time(w, c, mesh, tensor.activation_bytes(w, tokens))
    cp = context.time(w, c, mesh, tokens, *(compute.attention_core_time(w, tokens, mesh.tp) if np.any(mesh.cp > 1) else (0.0, 0.0)))
    hosts = host.layer_host_times(w, mesh.tp, pol, mesh.ep)
    mb = micro_batch(w, mesh, layers, lt, head, tp, hosts, on_head, ep, moe, np.maximum(on_head, on_embedding), cp)
    inline = replace(lt, fwd_s=lt.fwd_s + tp.forward_layer_s + cp.fwd_s, bwd_s=lt.bwd_s + tp.backward_layer_s
                     + cp.bwd_s, recompute_s=lt.recompute_s + pol.full * tp.forward_layer_s + cp.recompute_s)
    if ep is not None:  # the all-to-alls in line with the MoE layers' compute (their share of the stage's layers)
        frac = moe / layers
        inline = replace(inline, fwd_s=inline.fwd_s + frac * ep.per_layer_fwd_s, bwd_s=inline.bwd_s + frac * ep.per_layer_bwd_s,
                         recompute_s=inline.recompute_s + pol.full * frac * ep.per_layer_fwd_s)
    idle_fwd, idle_rest = host.idle_per_micro_batch(w, mb)
    kept, full = saved_per_token(w, c, mesh, pol)
    # activation offload's copies beyond what they overlap (the pass as it lasts, the host's idle included) lengthen
    # their passes (advisor.parallel.offload)
    stall_f, stall_b = offload.activation_stalls(w, pol, full * tokens, mem_layers, layers * inline.fwd_s + idle_fwd,
                                                 layers * (inline.bwd_s + inline.recompute_s) + idle_rest)
    # the last backward as it lasts: its TP collectives, its exposed all-to-alls and CP exchange in line too
    ep_bwd = moe * (ep.per_layer_bwd_s + pol.full * ep.per_layer_fwd_s) if ep is not None else 0.0
    windows = overlap.Windows(fwd_s=layers * inline.fwd_s + stall_f, bwd_s=layers * (inline.bwd_s + inline.recompute_s) + stall_b,
                           last_backward_s=layers * (lt.bwd_s + lt.recompute_s + cp.bwd_s + cp.recompute_s) + head.bwd_s + tp.layers_s - tp.fwd_s
                           + ep_bwd + stall_b,
                           idle_forward_s=idle_fwd, idle_backward_s=idle_rest)
    on_gpu = data.model_states(w, c, mesh, mem_layers, rank == "last")
    states = offload.apply(w, c, on_gpu, mem_layers)
    dpt = data.time(w, c, mesh, states, layers, windows, inline, tokens)
    off = offload.time(w, c, mesh, states, on_gpu, pol, stall_f + stall_b, mem_layers, windows.fwd_s, windows.bwd_s)
    in_flight, loss_layers = _in_flight(w, c, mesh, mem_layers, rank)
    host_bytes = offload.host_bytes(w, c, mesh, states, on_gpu, full, tokens, in_flight, pol)
    on_cpu = offload.codes(c)[0]
    ep_s = ep.layers_s if ep is not None else 0.0
    per_layer = lt.fwd_s + lt.bwd_s + lt.recompute_s
    per_layer = per_layer + cp.layer_s if np.ndim(cp.layer_s) else per_layer
    body, first_cast = pipeline.fill(layers * per_layer + tp.layers_s + ep_s, layers * hosts.total_s, p2p,
                                     layers * (1.0 - casts) * lt.weight_cast_s)
    bwd_wall = windows.last_backward_s + windows.idle_backward_s  # the last backward, its idle behind the host too
    ep_grad = (expert.grad_time(w, c, mesh, states, np.where(np.asarray(c.overlap, dtype=bool), bwd_wall, 0.0))
               if ep is not None else np.zeros(np.shape(ga)))
    off_f, off_b = 0.0, 0.0
    if w.finetune.offloads_activations:  # saved tensors to the CPU and back, beyond the pass they overlap
        off_f, off_b = adapters.activation_offload_exposed(w, kept * tokens * layers, layers * lt.fwd_s,
                                                           layers * (lt.bwd_s + lt.recompute_s))
    cast = states.trained if half_base(w.finetune, w.precision, w.stack) else states.params  # a half base is not re-cast
    # the parameters whose optimizer states this GPU steps: the adapters' share, or its dense shard and its experts'
    stepped = states.trained / mesh.dp_shard if w.finetune.adapters else states.stepped_params
    time = TimeBreakdown(
        compute_forward=ga * (layers * lt.fwd_s + head.fwd_s + off_f) + optimizer.autocast_cast_time(w, cast, states.master, ga),
        compute_backward=ga * (layers * lt.bwd_s + head.bwd_s + off_b), compute_recompute=ga * layers * lt.recompute_s,
        comm_tp=ga * (tp.layers_s + tp.head_s), host_overhead=ga * windows.idle_s,
        comm_pp_p2p=ga * p2p + pipeline.tied_sync_time(w, c, mesh, states.reduce_bytes),
        pipeline_bubble=pipeline.bubble_time(w.model, c, mesh, layers, body, layers * lt.fwd_s, layers * lt.bwd_s,
                                             layers * lt.recompute_s, first_cast),
        comm_dp_grad=dpt.grad_s, comm_zero_params=dpt.zero_params_s, comm_dataparallel=dpt.dataparallel_s,
        optimizer=(adapters.offloaded_step_time(w, states, mesh.dp_shard) if w.finetune.offloads_optimizer else
                   np.where(on_cpu, 0.0, optimizer.step_time(w, states.trained, stepped, states.master, c.zero))),
        offload=off.exposed_s, comm_ep=ga * ep_s, comm_ep_grad=ep_grad,
        comm_cp=ga * layers * cp.layer_s if np.ndim(cp.layer_s) else np.zeros(len(c)))
    memory, overhead = breakdown(w, c, mesh, states, tokens, loss_layers, pol, in_flight, (kept, full))
    model_flops, hw_flops = flops(w, c, mesh.dp * ga * tokens, pol)
    return Evaluation(time, memory, overhead, model_flops, hw_flops, mesh.dp * ga * tokens, states.params, host_bytes)


def _expert_time(w: Workload, c: Candidates, mesh: Mesh, tokens: Any, layers: Any, lt: compute.LayerTimes,
                 gemms: Any) -> tuple[Any, Any]:
    """(the all-to-alls of the stage's MoE layers, how many of its layers route), or (None, 0) for a dense model;
    ``gemms``: the routed layer's forward GEMM seconds by linear (compute.layer_gemms)."""
    if not w.layer.routed:
        return None, 0.0
    moe = layers * w.layer.count / w.model.n_layers  # dense first layers spread over the stages as their share
    shared = sum(t for name, t in gemms.items() if name.startswith("mlp/shared"))
    # what a combined step runs beside the all-to-alls (the batch overlap): the MLP's GEMMs (their backward, input and
    # weight gradients: twice) and the rest of the layer, the attention side
    mlp_f = sum(t for name, t in gemms.items() if name.startswith("mlp/"))
    partners = (np.maximum(lt.fwd_s - mlp_f, 0.0), mlp_f, 2.0 * mlp_f, np.maximum(lt.bwd_s - 2.0 * mlp_f, 0.0))
    return expert.time(w, c, mesh, tokens, moe, shared, partners), moe


def micro_batch(w: Workload, mesh: Mesh, layers: Any, lt: compute.LayerTimes, head: compute.HeadTimes,
                tp: tensor.TensorParallelTime, hosts: host.LayerHostTimes, on_head: Any = 1.0, ep: Any = None,
                moe: Any = 0.0, outside: Any = 1.0, cp: Optional[context.ContextParallelTime] = None) -> host.MicroBatch:
    """One micro-batch's GPU and host work on the busiest stage, split as the flow shop needs it (``on_head``:
    1.0 where that stage issues the head's kernels; ``outside``: where it issues any op outside the layers, the
    embedding's or the head's; ``ep``: its MoE layers' all-to-alls; ``cp``: the CP exchange beyond the attention, in
    line with each layer, so that the GPU idles behind a host-bound host only for what it does not spend on it)."""
    if cp is not None:
        lt = replace(lt, fwd_s=lt.fwd_s + cp.fwd_s, bwd_s=lt.bwd_s + cp.bwd_s, recompute_s=lt.recompute_s + cp.recompute_s)
    gpu = layers * (lt.fwd_s + lt.bwd_s + lt.recompute_s) + head.fwd_s + head.bwd_s + tp.layers_s + tp.head_s
    ep_fwd = 0.0
    if ep is not None:
        gpu, ep_fwd = gpu + ep.layers_s, moe * ep.per_layer_fwd_s
    return host.MicroBatch(
        gpu_s=gpu, gpu_fwd_s=layers * lt.fwd_s + head.fwd_s + tp.fwd_s + tp.embedding_s + tp.loss_s + ep_fwd,
        gpu_after_fwd_s=layers * (lt.bwd_s + lt.recompute_s) + tp.after_fwd_s + (ep.layers_s - ep_fwd if ep is not None else 0.0),
        head_fwd_s=head.fwd_s, head_bwd_s=head.bwd_s, loss_comm_s=tp.loss_s, host_layers_fwd_s=layers * hosts.fwd_s,
        host_s=layers * hosts.total_s + outside * host.head_host_time(w, mesh.tp),
        host_head_s=on_head * host.head_host_time(w, mesh.tp))


def flops(w: Workload, c: Candidates, tokens_per_step: Any, pol: Mix) -> tuple[Any, Any]:
    """(model FLOPs, hardware FLOPs) per step (module docstring). Tokens beyond an expert's capacity skip it (the
    residual only), computed by no one: under balanced routing a share 1 - cf of every routed linear's tokens."""
    m, layer = w.model, w.layer
    kept = min(1.0, w.moe_capacity_factor or 1.0)

    def per_token(k) -> float:  # a layer's FLOPs per token, its routed linears at the tokens they keep
        return sum(k.flops_per_token(w.seq_len, causal=True).values()) - (1.0 - kept) * sum(
            lin.flops_per_token for lin in expert.expert_linears(k))
    per_layer = per_token(layer)  # dense first layers beside routed ones: each at its own (routed experts at top-k)
    layers_flops = m.n_layers * per_layer if len(m.layers) == 1 else sum(k.count * per_token(k) for k in m.layers)
    depths = mtp.forward_flops_per_token(m, w.mtp_layers, w.seq_len, kept)  # multi-token prediction (advisor.mtp)
    model = 3.0 * (layers_flops + 2.0 * m.d_model * m.vocab + depths) * tokens_per_step
    ft = w.finetune
    if ft.adapters:  # a frozen base skips its weight-gradient GEMMs (1x the linears' forward); adapters train (3x)
        from advisor.finetune import adapter_params_per_layer, head_adapter_params

        linears = m.n_layers * sum(lin.flops_per_token for lin in layer.linears) + 2.0 * m.d_model * m.vocab
        adapters = 2.0 * (m.n_layers * adapter_params_per_layer(layer, ft) + head_adapter_params(m, ft))
        model = model + (3.0 * adapters - linears) * tokens_per_step
    # eager attention computes every score before masking: the masked half is executed too
    extra_core = layer.core_flops_per_token(w.seq_len, causal=not w.eager) - layer.core_flops_per_token(w.seq_len)
    executed_layer, executed_core = per_layer + extra_core, layer.core_flops_per_token(w.seq_len, causal=not w.eager)
    executed = {"attention/core": executed_core, "elementwise": 0.0, "norms": 0.0, "mlp/act": 0.0, "attention/latent": 0.0,
                **{lin.name: lin.flops_per_token * (kept if lin.copies > 1 else 1.0) for lin in layer.linears}}
    selective = selected(executed, w.selective_recomputes, layer)
    rc = rerun(pol, executed_layer, selective)
    # each MTP depth reruns its eh_proj and layer under full uniform recompute (multi_token_prediction.py:1415-1423;
    # 'block' skips it, :1424-1428), its layer's selective ops as the decoder's (the same layer spec)
    depth = mtp.forward_flops_per_token(m, w.mtp_layers, w.seq_len, kept) - w.mtp_layers * 2.0 * m.d_model * m.vocab
    rc_mtp = np.where(c.recompute == Recompute.full.code, depth, w.mtp_layers * np.where(pol.selective, selective, 0.0))
    return model, model + (3.0 * m.n_layers * extra_core + m.n_layers * rc + rc_mtp) * tokens_per_step
