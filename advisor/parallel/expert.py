"""Mixture of experts and expert parallelism (EP): the routed experts split over ep ranks, their own tensor parallelism
(etp), the dispatch and combine all-to-alls, grouped GEMMs, expert model states and routed activations.

Layout (advisor.parallel.expert_layout): megatron-core carves the experts' own grid etp x ep x edp from a pipeline
stage's dp x cp x tp ranks, edp = dp x cp x tp / (ep x etp); an EP group may hold context-parallel peers, each
dispatching its own slice of the sequence. Experts split over ep, each FFN over etp; etp ranks fastest, then ep:
ep_per_node = min(ep, g / etp).

Work (balanced routing): the dense layers' dp x cp x tp ranks of a stage hold dp micro-batches of tokens (1 / cp of each
sequence a rank); every token goes to top-k experts, and the dp x cp x tp = edp x ep x etp ranks share that expert work
evenly: one GPU does tokens x k x (expert FLOPs) / tp, its own tokens', what tensor parallelism alone would give. Its
local experts run as one grouped GEMM per linear (the stack's ``moe_grouped_gemm``; Transformer Engine's is one cuBLAS
GEMM per expert on several streams: ``gemm_calls``) or one GEMM each, of M = tokens x k
x ep x etp / (tp x E) rows: the existing GEMM efficiency (advisor.compute.gemm_eff) on the (n, k) shape, times M / (M +
h0) for the thin M dimension, the same saturating form on rows that the profile fits on columns. Routing imbalance (the
busiest rank's tokens over the balanced share, an explicit input: 1 by default, as Megatron-Bridge's published tables
force a balanced distribution) multiplies the busiest rank's expert GEMMs, its all-to-all bytes and its routed
activations; a capacity factor caps it (tokens beyond capacity are dropped: Fedus et al. 2021, Switch Transformer
s.2.2). FLOPs and MFU count the top-k active experts at the balanced load, as Megatron-LM's
``num_floating_point_operations`` (training.py: routed FFN x moe_router_topk, plus shared experts) and torchtitan's
``get_num_flop_per_token`` (active parameters: 6 N_active + attention) count them (advisor.step.flops).

Communication per MoE layer and micro-batch (the alltoall dispatcher, megatron-core moe/token_dispatcher.py
MoEAlltoAllTokenDispatcher): dispatch and combine forward, their gradients backward, two more in a recomputed forward;
each GPU sends its tokens x k hidden states (its sequence-parallel share of the tokens), in the activation dtype, over
the ep ranks (advisor.comm all_to_all: NVLink inside a domain, the network across). With etp > 1 the received tokens
are also all-gathered and the outputs reduce-scattered over the etp ranks. The flex dispatcher
(--moe-token-dispatcher-type flex, DeepEP / HybridEP backends: moe/fused_a2a.py) sends a token once to each GPU that
holds one of its experts (``reached``: at uniform routing 5.3 GPUs of 8 for Qwen3-30B-A3B's top-8 of 128 on EP 8) and,
across NVLink domains, once to each domain on the GPU's own NIC, forwarded there on NVLink (``dispatch_time``; the two
pipelined). What the all-to-alls run beside (``moe_overlap``, the stack's ``ep_alltoall_overlap`` unless asked):
nothing, the shared experts' GEMMs (--moe-shared-expert-overlap), or another micro-batch's compute
(--overlap-moe-expert-parallel-comm: combined forward-and-backward steps, each all-to-all beside its partner op of the
other micro-batch, on the share of passes ``batch_overlap_share`` gives; where Megatron refuses it, a 1F1B pipeline or
full recomputation, exposed). The flex dispatcher's kernels hold the stack's ``flex_dispatcher_sms`` while they run,
which the compute beside them does without (advisor.comm.beside).

Memory: a GPU holds its local experts, E / ep of every routed linear, 1 / etp of each; their optimizer states (ZeRO-1,
the distributed optimizer), gradients (ZeRO-2) and weights (ZeRO-3, FSDP) are sharded over the expert data-parallel
group (edp ranks), as megatron-core's DistributedOptimizer and Megatron-FSDP build a separate buffer for expert
parameters over ``expert_data_parallel_group``; their reduce-scatters and gathers run over that group beside the dense
ones (advisor.parallel.data), DDP's all-reduce apart (``grad_time``). Routed activations: the stack's tables at the MLP
width a token passes through (k x d_ff_expert + d_ff_shared: ``table_layer``), plus the permuted copies the experts
read and the outputs the combine weighs, as the stack keeps them, and the router's (``routed_saved``).

Not modelled: HSDP with EP (refused), NCCL's all-to-all SMs, FP8 dispatch, the aux-loss kernels, the busiest stage's
dense first layers' own weights (they are costed in time and FLOPs, the stage's weights as routed layers). Group-limited
routing (DeepSeek-V3's top 4 of 8 groups) sets the flex dispatchers' reach (advisor.parallel.routing).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from advisor import comm
from advisor.candidates import Candidates, Mesh, members_per_node
from advisor.comm import Collective
from advisor.comm.network import across, domain_groups
from advisor.model import DecoderLayer, ModelSpec
from advisor.model.layer import Linear, Split
from advisor.parallel.routing import reached
from advisor.training import Recompute

# Passes of the dispatch + combine pair per MoE layer and micro-batch: forward, backward, a recomputed forward
FORWARD_ALLTOALLS, BACKWARD_ALLTOALLS, RECOMPUTE_ALLTOALLS = 2.0, 2.0, 2.0


# --- the layer's parts --------------------------------------------------------------------------------------
def expert_linears(layer: DecoderLayer) -> tuple[Linear, ...]:
    return tuple(lin for lin in layer.linears if lin.copies > 1)


def expert_params(layer: DecoderLayer) -> int:
    """Parameters of the routed experts of one layer (every copy)."""
    return sum(lin.params for lin in expert_linears(layer))


def rank_layer_params(layer: DecoderLayer, tp: Any, ep: Any, etp: Any) -> Any:
    """Parameters one GPU holds of one layer: the rest split by tp as advisor.model.layer says, the routed experts
    by ep and etp. A dense layer is ``layer.rank_params(tp)``."""
    if not layer.routed:
        return layer.rank_params(tp)
    rest = replace(layer, linears=tuple(lin for lin in layer.linears if lin.copies == 1))
    return rest.rank_params(tp) + expert_params(layer) / (np.asarray(ep, dtype=float) * etp)


def table_layer(layer: DecoderLayer) -> DecoderLayer:
    """The layer whose dimensions the stack's per-token tables are evaluated on: a routed layer at the MLP width one
    token passes through (top-k routed experts and the shared ones); a dense layer itself."""
    if not layer.routed:
        return layer
    k = max(lin.active for lin in expert_linears(layer))
    shared = {lin.n_out for lin in layer.linears if lin.name in ("mlp/shared/gate", "mlp/shared/fc")}
    return replace(layer, d_ff=int(round(k * layer.d_ff)) + sum(shared))


def top_k(layer: DecoderLayer) -> float:
    return max((lin.active for lin in expert_linears(layer)), default=1.0)


def n_experts(layer: DecoderLayer) -> int:
    return max((lin.copies for lin in expert_linears(layer)), default=1)


def load(w, ep: Any = None) -> Any:
    """The busiest rank's routed tokens over the balanced share: the imbalance (at most E / k: advisor.workload refuses
    more), capped by the capacity factor and by ``ep``: min(ep, E / k) is what a rank of E / ep experts can take (at
    most min(k, E / ep) of a token's k copies, its balanced share k / ep), one rank taking every copy 1."""
    asked = min(w.moe_imbalance, w.moe_capacity_factor or w.moe_imbalance)  # (a capacity factor is > 0 or None)
    return asked if ep is None else np.minimum(asked, np.maximum(np.asarray(ep, dtype=float), 1.0))


def moe_note(model: ModelSpec, setup) -> str:
    """A mixture-of-experts model's active parameters and how its routing is costed, for the output ('' if dense)."""
    if not model.routed:
        return ""
    e = model.experts  # shared experts are named with their width (DeepSeek's, Llama 4's)
    return (f"mixture of experts: top-{e.experts_per_token} of {e.n_experts} routed experts"
            f"{f' beside a shared MLP of width {e.d_ff_shared}' if e.d_ff_shared else ''}, "
            f"{model.active_params / 1e9:.2f}B of {model.n_params / 1e9:.2f}B parameters active per token (FLOPs and "
            f"MFU count the active ones, as Megatron and torchtitan do); {routing_note(setup)}")


def routing_note(w) -> str:
    """How routing is costed, for the output."""
    cap = w.moe_capacity_factor
    drop = f"capacity factor {cap:g}, tokens beyond it dropped" if cap is not None else "dropless"
    bal = ("balanced routing (the default, as the published MoE benchmarks force)" if w.moe_imbalance == 1.0
           else f"routing imbalance {w.moe_imbalance:g}x on the busiest expert rank (at most ep x: one rank takes all)")
    return f"{bal}; {drop}"


# --- time ------------------------------------------------------------------------------------------------------
def gemm_shape(w, lin: Linear, tokens: Any, tp: Any, ep: Any, etp: Any) -> tuple[Any, Any, Any, Any, Any]:
    """(FLOPs at the dense model's efficiency, n, k, kernels, kernel floors) of one routed-expert linear on one GPU
    for a micro-batch of ``tokens``, for advisor.compute.gemm_time: the FLOPs divided by the thin-M factor M / (M + h0)
    (module docstring); the kernels' fixed times as ``fixed_times`` splits them."""
    hw, math = w.hw, w.math
    tp, ep, etp = (np.asarray(x, dtype=float) for x in (tp, ep, etp))
    busy = load(w, ep)
    flops = lin.flops_per_token * tokens / tp * busy
    n, k = (lin.n_out / etp, lin.n_in) if lin.split is Split.column else (lin.n_out, lin.n_in / etp)
    rows = tokens * lin.active * ep * etp / (tp * lin.copies) * busy
    key = math if math in hw.efficiency.matmul_max else "fp32"
    h0 = hw.efficiency.matmul_half_dim.get(key, 0.0)
    return (flops / (rows / (rows + h0)), n, k) + fixed_times(w, lin, ep)


def fixed_times(w, lin: Linear, ep: Any) -> tuple[Any, Any]:
    """(kernels paying the profile's per-call ``matmul_fixed_us``, kernels paying its ``matmul_kernel_floor_us``) of one
    GEMM pass in sequence (``gemm_calls``). On several streams the pass is one call from the layer, whose first kernel
    pays the fixed time a dense GEMM pays; the C++ loop queues the rest with no Python between them, so each further
    kernel on the busiest stream pays the GPU's own per-kernel time: aiconfigurator 0.4.0's GPU-timed GEMM tables put
    it at 3.4-4.4 us (validation.validate_kernels kernel_floor), where the per-call fit of reference/h100/kernels.jsonl
    gives 23.7 us. One GEMM per expert in turn from Python (SequentialMLP) pays the fixed time on each."""
    seq, launched = gemm_calls(w, lin, ep)
    streams = np.asarray(launched) > np.asarray(seq)  # the multi-stream path: fewer kernels in sequence than launched
    return np.where(streams, 1.0, seq), np.where(streams, np.asarray(seq) - 1.0, 0.0)


def gemm_calls(w, lin: Linear, ep: Any) -> tuple[Any, Any]:
    """(kernels whose fixed time one GEMM pass of a routed-expert linear pays in sequence, kernels it launches) on one
    GPU of ``ep``. One GEMM per local expert, in sequence (Megatron's SequentialMLP), unless the stack groups them
    (``moe_grouped_gemm``): then one kernel, or, where the stack's grouped GEMM is one cuBLAS GEMM per local expert on
    ``moe_gemm_streams`` streams (Transformer Engine 2.14 and 2.20.2 general_grouped_gemm -> nvte_multi_tensor_gemm ->
    multi_stream_cublas_gemm: GEMM i on compute stream i % 4, nvte_get_num_compute_streams a constant 4, no variable
    sets it), one launch per local expert, the busiest stream's ceil(E_local / streams) fixed times in sequence (the
    streams' kernels overlap their fixed time as they share the SMs for the FLOPs), save under the recipes of
    ``moe_one_kernel_under`` (TE's fused grouped MLP: one grouped kernel per linear)."""
    eng, r = w.stack.engine, w.precision.recipe
    local = lin.copies / np.asarray(ep, dtype=float)
    if not eng.moe_grouped_gemm:
        return local, local
    if eng.moe_gemm_streams and not (r is not None and r.name in eng.moe_one_kernel_under):
        return np.ceil(local / eng.moe_gemm_streams), local
    return 1.0, 1.0


def permute_bytes(w, tokens: Any, tp: Any, sp: Any, ep: Any) -> tuple[Any, Any]:
    """(forward, backward) bytes one GPU's MoE layer moves to put tokens in expert order and back, for a micro-batch
    of ``tokens`` (megatron-core 0.16.1 moe/moe_utils.py, the fused kernels of --moe-permute-fusion): permute reads
    each token once and writes its k copies, (1 + k) h; unpermute reads the k expert outputs and the probabilities and
    writes the token, (k + 1) h; with EP and several local experts the alltoall dispatcher sorts the received chunks
    by expert after the dispatch and back before the combine (sort_chunks_by_idxs: read and write k h, twice); the
    flex dispatcher's backends hand the tokens over already grouped by local expert (token_dispatcher.py
    _HybridEPManager / _DeepepManager: the dispatch, then one permute; no sort_chunks_by_idxs). Backward moves the same
    gradients the other way, and unpermute's backward reads the k expert outputs once more for the probabilities'
    gradient. In the activation dtype, at the busiest rank's load, on the GPU's sequence share under SP."""
    layer = w.layer
    k, h = top_k(layer), w.model.d_model
    share = np.where(np.asarray(sp, dtype=bool), np.asarray(tp, dtype=float), 1.0)
    sorted_chunks = (np.asarray(ep) > 1) & (n_experts(layer) / np.asarray(ep, dtype=float) > 1)
    sort = np.where(sorted_chunks & (w.moe_dispatcher != "flex"), 4.0 * k, 0.0)
    per_token = h * w.act_bytes * load(w, ep) / share
    fwd = tokens * per_token * (2.0 * k + 2.0 + sort)
    return fwd, fwd + tokens * per_token * k


@dataclass(frozen=True)
class ExpertTime:
    """Seconds of the expert-parallel all-to-alls for one micro-batch on the busiest stage (0 without EP)."""

    per_layer_fwd_s: Any  # one MoE layer's dispatch + combine forward, beyond what overlaps
    per_layer_bwd_s: Any
    layers_s: Any  # every MoE layer of the stage: forward, backward and a recomputed forward


def batch_overlap_share(c: Candidates, mesh: Mesh) -> Any:
    """The share of a stage's micro-batch passes that run in a combined forward-and-backward step under
    --overlap-moe-expert-parallel-comm (megatron-core 0.19 pipeline_parallel/combined_1f1b.py): without a pipeline
    every micro-batch's forward beside the previous one's backward but the first forward and the last backward; an
    interleaved pipeline after its warm-up forwards, ``2 (pp - 1) + (v - 1) pp + 1`` on the first rank (schedules.py:
    one extra forward "to ensure the forward and backward computations are independent"). Megatron asserts the rest
    away (transformer_config.py: a pipeline without virtual stages, full recomputation): 0 there."""
    ga = np.asarray(c.grad_accum, dtype=float)
    total = ga * mesh.v
    warm = np.where(mesh.pp > 1, 2.0 * (mesh.pp - 1.0) + (mesh.v - 1.0) * mesh.pp + 1.0, 1.0)
    share = np.clip(1.0 - warm / total, 0.0, 1.0)
    allowed = ((mesh.pp == 1) | (mesh.v > 1)) & (c.recompute != Recompute.full.code) & (mesh.ep > 1)
    return np.where(allowed, share, 0.0)


def routed_copies(w, ep: Any = None) -> Any:
    """A token's routed copies as the busiest of ``ep`` ranks sees them: top-k x its load (``load``)."""
    return top_k(w.layer) * load(w, ep)


def alltoall_bytes(w, tokens: Any, tp: Any, sp: Any, ep: Any = None) -> Any:
    """Bytes one GPU sends in one dispatch (or combine): its tokens (its sequence-parallel share under TP) x top-k
    hidden states in the activation dtype, at the busiest of ``ep`` ranks' load."""
    share = np.where(np.asarray(sp, dtype=bool), np.asarray(tp, dtype=float), 1.0)
    return tokens / share * routed_copies(w, ep) * w.model.d_model * w.act_bytes


def dispatch_time(w, mesh: Mesh, size: Any, on: Any) -> Any:
    """Seconds of one dispatch (or combine) over the ep ranks, ``size``: one GPU's tokens x top-k hidden states.
    alltoall: NCCL's pairwise all-to-all of every routed copy. flex (DeepEP / HybridEP): a token goes once to each
    GPU holding one of its experts, reached(E, k, ep) copies of k; across NVLink domains once to each domain on the
    GPU's own NIC (the same-rail GPU there), then on NVLink to the GPUs of that domain, the two pipelined in chunks."""
    hw = w.hw
    if w.moe_dispatcher != "flex":
        return comm.collective_time(Collective.all_to_all, mesh.ep, size, hw, mesh.ep_per_node, where=on)
    e, k = n_experts(w.layer), top_k(w.layer)
    grouped = (w.model.experts.groups, w.model.experts.group_topk)  # group-limited routing (reached)
    per_copy = size / k
    g, g_dom, domains = domain_groups(mesh.ep, mesh.ep_per_node, hw)
    nvlink = comm.collective_time(Collective.all_to_all, g_dom, per_copy * reached(e, k, mesh.ep, *grouped), hw,
                                  np.minimum(g_dom, hw.gpus_per_node), where=on)
    many = on & (domains > 1)
    if not np.any(many):  # every group inside one NVLink domain: no network part to cost
        return nvlink
    rail, _ = across(Collective.all_to_all, domains, per_copy * reached(e, k, domains, *grouped), np.ones(np.shape(domains)),
                     domains, domains * np.maximum(g_dom / hw.gpus_per_node, 1.0), hw)
    return np.where(many, np.maximum(nvlink, rail), nvlink)


def time(w, c: Candidates, mesh: Mesh, tokens: Any, moe_layers: Any, shared_fwd_s: Any,
         partners: Any = None) -> ExpertTime:
    """The dispatch and combine all-to-alls per micro-batch over the stage's ``moe_layers`` MoE layers;
    ``shared_fwd_s``: one layer's shared-expert GEMMs forward, which they run beside where the stack overlaps them;
    ``partners``: one layer's (attention forward, MLP forward, MLP backward, attention backward) seconds, what a
    combined step runs them beside under the batch overlap."""
    on = mesh.ep > 1
    size = alltoall_bytes(w, tokens, mesh.tp, c.sp, mesh.ep)
    one = dispatch_time(w, mesh, size, on)
    etp_on = mesh.etp > 1  # the received tokens gathered over the etp ranks, the outputs reduce-scattered
    etp_per_node = np.minimum(mesh.etp, w.hw.gpus_per_node)
    # the etp ranks gather the tokens they hold a 1 / etp share of under SP; without SP each holds them all, and the
    # split experts' outputs are reduced as a dense TP MLP's (an all-reduce: AG + RS of the tokens)
    gathered = size * np.where(np.asarray(c.sp, dtype=bool), mesh.etp, 1.0)
    one = one + (comm.collective_time(Collective.all_gather, mesh.etp, gathered, w.hw, etp_per_node, where=etp_on)
                 + comm.collective_time(Collective.reduce_scatter, mesh.etp, gathered, w.hw, etp_per_node,
                                        where=etp_on)) / 2.0
    pair = FORWARD_ALLTOALLS * one  # dispatch and combine (backward: their gradients, as many)
    hide = shared_fwd_s if w.moe_overlap == "shared_experts" else 0.0
    n, sms = w.stack.engine.flex_dispatcher_sms, w.hw.gpu.sm_count  # the SMs the flex dispatcher's kernels hold
    held = min(n / sms, 1.0) if (w.moe_dispatcher == "flex" and n and sms) else 0.0  # (0: alltoall, or SMs unknown)
    fwd = comm.beside(pair, hide, held)
    bwd = comm.beside(pair, 2.0 * np.asarray(hide), held)  # the shared experts' backward: twice their forward
    if w.moe_overlap == "batch" and partners is not None:
        # megatron-core 0.19 models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run: one layer of
        # a combined step runs combine_bwd | dispatch_fwd, dispatch_bwd | combine_fwd on the communication stream
        # beside pre_dispatch_fwd | mlp_bwd, mlp_fwd | pre_dispatch_bwd on the compute stream, each waiting on the
        # slower of its pair
        exposed = sum(comm.beside(one, p, held) for p in partners) / 2.0  # a forward's and a backward's, split evenly
        share = batch_overlap_share(c, mesh)
        fwd, bwd = share * exposed + (1.0 - share) * fwd, share * exposed + (1.0 - share) * bwd
    rc = np.where(c.recompute == Recompute.full.code, RECOMPUTE_ALLTOALLS / FORWARD_ALLTOALLS * fwd, 0.0)
    return ExpertTime(fwd, bwd, moe_layers * (fwd + bwd + rc))


def _edp(w, mesh: Mesh) -> tuple[Any, Any]:
    """(where the experts have an expert data-parallel group of their own, its ranks per node: etp x ep apart)."""
    own = (mesh.edp > 1) & ((mesh.ep > 1) | (mesh.etp != mesh.tp))
    return own, members_per_node(w.hw.gpus_per_node, mesh.ep * mesh.etp, mesh.edp)


def grad_time(w, c: Candidates, mesh: Mesh, states, hide: Any) -> Any:
    """DDP's all-reduce of the expert gradients over the expert data-parallel group (edp ranks), hidden behind the
    last backward as the dense gradients' is (``hide``). Under ZeRO the experts' reduce-scatters and gathers join the
    dense ones' (``sharded_collectives``, advisor.parallel.data)."""
    on, per_node = _edp(w, mesh)
    grads = states.expert_params * states.reduce_bytes
    ar = comm.collective_time(Collective.all_reduce, mesh.edp, grads, w.hw, per_node, where=on & (np.asarray(c.zero) == 0))
    return np.maximum(ar - hide, 0.0)


def sharded_collectives(w, mesh: Mesh, states, zero_on: Any) -> tuple[Any, Any]:
    """(reduce-scatter of the expert gradients, all-gather of the expert weights) over the expert data-parallel group,
    one call each per pass over the stage (the distributed optimizer's expert buffer; Megatron-FSDP's expert units)."""
    on, per_node = _edp(w, mesh)
    on = on & zero_on
    rs = comm.collective_time(Collective.reduce_scatter, mesh.edp, states.expert_params * states.reduce_bytes, w.hw,
                              per_node, where=on)
    ag = comm.collective_time(Collective.all_gather, mesh.edp, states.expert_params * states.weight_bytes, w.hw,
                              per_node, where=on)
    return rs, ag


# --- memory ----------------------------------------------------------------------------------------------------
def routed_saved(w, mesh: Mesh, sp: Any, exchanged: bool = False) -> Any:
    """Bytes per token one MoE (routed) layer keeps for backward beyond the stack's table at the routed width, on one GPU, at
    the busiest rank's load: the permuted tokens the experts read (k x h, in the recipe's format where the stack's
    linears keep their inputs quantised, ``engine.quantised_inputs``), the expert outputs the combine weighs by the
    router's probabilities (k x h at ``engine.moe_output_bytes``: none where the experts apply them), the router's
    logits and routing map (E x (activation bytes + 1)). ``exchanged``: only what the all-to-alls deliver, k x h each
    way in the activation dtype (torchtitan's SelectiveAC saves all_to_all_single outputs). Split over TP as the
    sequence is (sequence parallelism, which EP with TP needs)."""
    eng, r, act = w.stack.engine, w.precision.recipe, w.act_bytes
    share = np.where(np.asarray(sp, dtype=bool), mesh.tp, 1.0)
    copies = routed_copies(w, mesh.ep) * w.model.d_model
    if exchanged:
        return 2.0 * copies * act / share
    inputs = r.stored_bytes if (r is not None and eng.quantised_inputs is not None) else act
    outputs = act if eng.moe_output_bytes is None else eng.moe_output_bytes
    return (copies * (inputs + outputs) + n_experts(w.layer) * (act + 1.0)) / share
