"""Tensor parallelism (Megatron; Shoeybi et al. 2019, arXiv 1909.08053) and sequence parallelism (Korthikanti
et al. 2022, arXiv 2205.05198).

Each layer's column-parallel GEMMs split their outputs and its row-parallel GEMMs their inputs over the tp
ranks (the split is in the layer table, advisor.model.layer), so the layer's weights and its GEMM work are
divided by tp. The row-parallel outputs are all-reduced: 2 all-reduces of the [s, b, h] activation per layer
forward, 2 backward, 2 more when the forward is recomputed. Under sequence parallelism each becomes an
all-gather + reduce-scatter (the same bytes on a ring), and the LayerNorms, dropouts and residuals, replicated
on every rank without it, are split along the sequence (their activations and traffic: the stack's
``sequence`` bytes, advisor.stack). Outside the layers (megatron-core): the vocab-parallel embedding
all-reduces its output (under SP: reduce-scatters it), the LM head's input gradient is all-reduced in backward
(under SP: all-gather + reduce-scatter), and the vocab-parallel cross-entropy all-reduces three fp32 values per
token (max, target logit, sum of exp).

TP groups stay inside an NVLink domain (the search's constraint: a node, or an NVL72 rack of 18 trays): the
collectives run on the NVLink link (advisor.comm).

Under a low-precision recipe with sequence parallelism, Transformer Engine quantises before it gathers: a
column-parallel linear's input and a row-parallel linear's output gradient are all-gathered in the recipe's format
(TE 2.10 module/linear.py: input_quantizer(inputmat) then gather_along_first_dim(..., quantizer=...);
module/base.py grad_output_preprocess: gather_along_first_dim(grad_output, quantizer=...)), the reduce-scatters
stay in the activations' dtype; torchao's Float8ColwiseParallel / Float8RowwiseParallel, which torchtitan 0.2 applies
under tensorwise FP8 alone, cast a linear's input to e4m3 before its all-gather and its output gradient to e5m2 before
the backward's (torchao float8/float8_tensor_parallel.py). Which stacks do so, under which recipes, is their profile's
``engine.tp_gathers_quantised``.

Under sequence parallelism a stack may pipeline the collectives with the GEMMs they feed (``tp_overlap``
userbuffers: Megatron --tp-comm-overlap, Transformer Engine's ring-exchange and bulk overlaps): ``overlap_share``
costs each collective beside its GEMM as TE's methods run it (ring exchange, pipeline, bulk), with the SMs they take
from the GEMMs. Without it, a stack whose linears run their backward collectives
asynchronously (``tp_backward_overlap``: Megatron, Transformer Engine) hides the column-parallel linear's input
re-gather behind its dgrad GEMM and its input gradient's reduce-scatter (or all-reduce) behind its wgrad GEMM
(``backward_exposed``). The SMs are TE's defaults (``engine.userbuffers``): Megatron-Bridge's recipes tune them per
model and GPU (training/comm_overlap.py: 1-32 SMs), which the profile does not follow recipe by recipe. torchtitan's
async tensor parallel (``tp_overlap`` async: torch's symmetric-memory micro-pipeline, which inductor fuses into every
all-gather -> matmul and matmul -> reduce-scatter of the compiled graph) is ``async_share``; the linears' own async_op
collectives (``tp_overlap`` linear-async: nanotron's tp_linear_async_communication) are advisor.parallel.linear_async.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor import adapters, comm
from advisor.candidates import Candidates, Mesh
from advisor.comm import Collective
from advisor.compute import mem_time
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.model.layer import Split
from advisor.parallel.linear_async import linear_async_share
from advisor.recompute import mix
from advisor.workload import Workload

# collectives per layer and micro-batch: 2 forward, 2 backward, 2 more in a recomputed forward
LAYER_COLLECTIVES, RECOMPUTE_COLLECTIVES = 4.0, 2.0


def violations(c: Candidates, model: ModelSpec, hw: Hardware, beyond_kv: str = "replicate") -> dict[str, Any]:
    """Constraint -> where a plan breaks it. Heads are split over the TP ranks; KV heads too, or, where tp exceeds
    them and the stack replicates them (``beyond_kv``: its engine.tp_beyond_kv_heads), a whole number of ranks per
    KV head; TP needs the NVLink link of its domain (a node, or a rack where NVLink joins several)."""
    g, kv, replicate = hw.domain_gpus, model.kv_heads, beyond_kv == "replicate"
    return {
        "tp does not divide the attention heads": (model.n_heads % c.tp) != 0,
        "tp does not divide the KV heads": ((kv % c.tp) != 0) & ((c.tp <= kv) | (not replicate)),
        "tp > KV heads does not divide evenly": (c.tp > kv) & ((c.tp % kv) != 0) & replicate,
        "tp spans nodes (TP needs the intra-node link; pass --allow-tp-across-nodes to force)": (
            (c.tp > g) & (not c.allow_tp_across_nodes)),
        # consecutive groups straddle a domain boundary only where the job spans more than one domain (TP 16 on 64 of
        # an NVL72's 72 GPUs stays in it)
        "tp does not divide the GPUs per node (TP groups would straddle nodes)": (c.tp <= g) & ((g % c.tp) != 0) & (
            c.world > g),
    }


@dataclass(frozen=True)
class TensorParallelTime:
    """Seconds of TP collectives for one micro-batch on the busiest stage (0 where tp = 1)."""

    per_layer_collective_s: Any  # one of a layer's collectives (all-reduce, or all-gather + reduce-scatter)
    collectives_per_layer: Any  # 4, or 6 under full recomputation
    layers_s: Any  # every layer's collectives
    embedding_s: Any
    lm_head_s: Any
    loss_s: Any
    backward_share: Any = 1.0  # the layer's backward collectives' exposed share (tp_backward_overlap), else 1
    kv_gather_s: Any = 0.0  # one layer's q/k/v re-gather beyond the KV heads (kv_group_gathers), forward
    kv_scatter_s: Any = 0.0  # and its backward reduce-scatter
    kv_layers_s: Any = 0.0  # every layer's, recomputed forwards included (part of layers_s)
    kv_layers_fwd_s: Any = 0.0  # every layer's forward ones

    @property
    def forward_layer_s(self) -> Any:
        """One layer's forward collectives, in line with its forward GEMMs."""
        return 2.0 * self.per_layer_collective_s + self.kv_gather_s

    @property
    def backward_layer_s(self) -> Any:
        """One layer's backward collectives in line with its backward GEMMs: what they leave exposed."""
        return 2.0 * self.backward_share * self.per_layer_collective_s + self.kv_scatter_s

    @property
    def head_s(self) -> Any:
        return self.embedding_s + self.lm_head_s + self.loss_s

    @property
    def fwd_s(self) -> Any:
        """The layers' forward collectives (2 of the layer's 4 or 6, and the q/k/v re-gathers)."""
        return (self.layers_s - self.kv_layers_s) * 2.0 / self.collectives_per_layer + self.kv_layers_fwd_s

    @property
    def after_fwd_s(self) -> Any:
        """All but the layers' forward collectives and the embedding's: backward, recompute, LM head, loss."""
        return self.layers_s - self.fwd_s + self.lm_head_s + self.loss_s


def activation_bytes(w: Workload, tokens: Any) -> Any:
    """The [s, b, h] activation a layer all-reduces (and a pipeline stage sends)."""
    return tokens * w.model.d_model * w.act_bytes


def gathered_bytes_ratio(w: Workload) -> tuple[float, float]:
    """(forward, backward) bytes of a layer's sequence-parallel all-gathers over their activation-dtype bytes: the
    recipe's stored bytes where the stack quantises before gathering and the pass runs low (module docstring), the
    BF16 edge layers at 1, as a mean over the layers."""
    r, quantised = w.precision.recipe, w.stack.engine.tp_gathers_quantised
    if r is None or not (quantised is True or (isinstance(quantised, list) and w.precision.value in quantised)):
        return 1.0, 1.0
    low = r.stored_bytes / w.act_bytes
    share = w.bf16_share
    return tuple(share + (1.0 - share) * (low if r.runs_low(p) else 1.0) for p in ("fprop", "dgrad"))


def block_gemms(w: Workload, gemms: dict) -> list[list]:
    """[column-parallel, row-parallel] forward GEMM seconds of each sub-block (attention, MLP) of the layer table."""
    blocks: dict[str, list] = {}
    for lin in w.layer.linears:
        if lin.copies == 1 and lin.split in (Split.column, Split.row):
            block, side = blocks.setdefault(lin.name.split("/")[0], [0.0, 0.0]), 0 if lin.split is Split.column else 1
            block[side] = block[side] + gemms[lin.name]
    return list(blocks.values())


def backward_exposed(w: Workload, gemms: dict, ag_in: Any, ag_go: Any, rs: Any, ar: Any, sp: Any) -> Any:
    """Seconds of a layer's backward TP collectives left exposed per sub-block (a mean over them) where the stack
    overlaps them as Megatron and Transformer Engine do without userbuffers (``tp_backward_overlap``: TE 2.13
    module/linear.py backward, megatron-core tensor_parallel/layers.py): under SP the row-parallel linear's output
    gradient is all-gathered before its dgrad (exposed), the column-parallel linear's input is re-gathered beside its
    dgrad GEMM and its input gradient reduce-scattered beside its wgrad GEMM (each GEMM the forward's size); without
    SP only the column-parallel input gradient's all-reduce, beside the wgrad. A sub-block without a column-parallel
    GEMM (routed experts) keeps its all-gather and reduce-scatter exposed."""
    out, blocks = 0.0, block_gemms(w, gemms)
    for g_col, _ in blocks:
        overlapped = np.where(sp, ag_go + np.maximum(ag_in - g_col, 0.0) + np.maximum(rs - g_col, 0.0),
                              np.maximum(ar - g_col, 0.0))
        out = out + np.where(g_col > 0, overlapped, np.where(sp, ag_go + rs, ar))
    return out / max(len(blocks), 1)


def overlaps(w: Workload, tp: Any, sp: Any) -> Any:
    """Where the workload's TP overlap pipelines a plan's collectives with their GEMMs: under sequence parallelism
    only, and async TP only inside the NVLink domain (symmetric memory maps the peers' buffers over NVLink: a group
    forced beyond it runs its collectives as without)."""
    sp = np.asarray(sp, dtype=bool)
    if w.tp_overlap == "async":
        return sp & (np.asarray(tp) <= w.hw.domain_gpus)
    return sp & (w.tp_overlap != "none")


def _chunked(c: Any, g: Any, chunks: Any) -> Any:
    """Seconds a collective of ``c`` and a GEMM of ``g`` take pipelined in ``chunks`` steps: the longer of the two,
    and one chunk of the shorter that nothing hides."""
    return np.maximum(c, g) + np.minimum(c, g) / chunks


def overlap_share(w: Workload, gemms: dict, ag: Any, rs: Any, tp: Any) -> Any:
    """The share of a layer's sequence-parallel collectives left exposed (beyond the GEMMs they run beside) when
    Transformer Engine's userbuffers pipeline them with their GEMMs (Megatron --tp-comm-overlap; TE 2.13 module/base.py
    initialize_ub), per sub-block (attention, MLP) of the layer table, every backward GEMM the forward's size:

    - ring exchange (the column-parallel input's all-gather beside its fprop GEMM, the output gradient's beside the
      row-parallel dgrad): tp peer-to-peer steps, each beside a GEMM chunk: max(C, G) + min(C, G) / tp;
    - pipeline (the row-parallel output's reduce-scatter beside its fprop GEMM): the GEMM launched on the SMs the
      collective leaves (set_sm_margin), G' = G x SMs / (SMs - n), in ``pipeline_splits`` chunks: max(C, G') +
      min(C, G') / splits;
    - bulk (the column-parallel input re-gathered beside its dgrad GEMM, its input gradient reduce-scattered beside
      its wgrad GEMM): the collective's kernel holds n SMs while it runs, the GEMM slowed by n / SMs for that time:
      max(C, G + C n / SMs).

    Each pair costs its time less G; the backward's three pairs and the forward's two, over the four collectives the
    layer table counts (so a share may pass 1: SMs taken cost more than a short collective saves). Without the GPU's SM
    count no SMs are costed. Not modelled: the ring exchange's GEMM chunks of M / tp rows (advisor.compute's GEMM fit
    has a standalone kernel's fixed cost, 24 us on H100, which chunks issued back to back inside one call do not pay
    each) and a sub-block without a column- or row-parallel GEMM (routed experts) keeps its collectives exposed."""
    ub, sms = w.stack.engine.userbuffers, w.hw.gpu.sm_count
    slow = sms / (sms - ub.pipeline_sms) if sms else 1.0  # fewer SMs than the GPU has (workload.tp_overlap_choice)
    held = ub.bulk_sms / sms if sms else 0.0

    def ring(c: Any, g: Any) -> Any:
        return _chunked(c, g, tp) - g

    def pipeline(c: Any, g: Any) -> Any:
        return _chunked(c, g * slow, ub.pipeline_splits) - g

    blocks = block_gemms(w, gemms)
    exposed = 0.0
    for g_col, g_row in blocks:
        exposed = exposed + ring(ag, g_col) + pipeline(rs, g_row)  # forward
        exposed = exposed + ring(ag, g_row) + comm.beside(ag, g_col, held) + comm.beside(rs, g_col, held)  # backward
    n = max(len(blocks), 1)
    return np.where(ag + rs > 0, exposed / np.maximum(2.0 * n * (ag + rs), 1e-30), 1.0)


def async_share(w: Workload, gemms: dict, ag: Any, rs: Any, tp: Any, act: Any) -> Any:
    """The share of a layer's sequence-parallel collectives left exposed under torchtitan's async tensor parallel
    (compile.enable_async_tensor_parallel: inductor's micro_pipeline_tp pass rewrites each all-gather -> matmul into
    fused_all_gather_matmul and each matmul -> reduce-scatter into fused_matmul_reduce_scatter, in the forward and the
    compiled backward). torch 2.13 distributed/_symmetric_memory/__init__.py runs them as:

    - _pipelined_all_gather_and_consume: the local shard's GEMM first, then tp - 1 steps that each copy a peer's shard
      out of its symmetric buffer (a copy-engine copy: no SMs taken) beside the previous shard's GEMM, on two streams:
      max(C, G) + min(C, G) / tp;
    - _pipelined_produce_and_all2all: the GEMM in tp chunks, each pulled by its peer while the next one runs, then a
      sum of the tp partials (reduce_fn over stacked_partials: reads the [s, b, h] output once, writes 1/tp of it,
      memory-bound): the same pair plus that kernel.

    Forward: the column-parallel input's all-gather beside its GEMM, the row-parallel output's reduce-scatter beside
    its GEMM; backward: the output gradient's all-gather beside the row-parallel dgrad, the column-parallel input
    gradient's reduce-scatter beside its dgrad (each GEMM the forward's size); over the four collectives the layer table
    counts. Not modelled: the chunked GEMMs' smaller tiles (wave quantisation, which the two streams are there to hide)."""
    def ring(c: Any, g: Any) -> Any:
        return _chunked(c, g, tp) - g

    partial_sum = mem_time(w.hw, act * (1.0 + 1.0 / tp))
    blocks = block_gemms(w, gemms)
    exposed = 0.0
    for g_col, g_row in blocks:
        exposed = exposed + ring(ag, g_col) + ring(rs, g_row) + ring(ag, g_row) + ring(rs, g_col) + 2.0 * partial_sum
    n = max(len(blocks), 1)
    return np.where(ag + rs > 0, exposed / np.maximum(2.0 * n * (ag + rs), 1e-30), 1.0)


def kv_group_gathers(w: Workload, tp: Any, tokens: Any, mesh: Mesh) -> tuple[Any, Any]:
    """(forward, backward) seconds of one layer's q/k/v regathered where tp exceeds the KV heads and the stack
    replicates them (engine.tp_beyond_kv_heads): megatron-core 0.19.2 splits linear_qkv's "q1 q2 k1 v1 | q3 q4 k2 v2"
    columns evenly over the TP ranks, so a rank holds no whole KV group; it all-gathers the qkv output along its last
    dimension and keeps its group's slice (transformer/attention.py:1839-1858,
    all_gather_last_dim_from_tensor_parallel_region), a synchronous all-gather of the whole [s, b, q + 2 kv] output
    whose backward reduce-scatters its gradient (tensor_parallel/mappings.py:393-401). 0 where tp <= KV heads."""
    beyond = (np.asarray(tp) > w.model.kv_heads) & (w.stack.engine.tp_beyond_kv_heads == "replicate")
    size = tokens * w.layer.qkv_dim * w.act_bytes
    ag = comm.collective_time(Collective.all_gather, tp, size, w.hw, mesh.tp_per_node, where=beyond)
    rs = comm.collective_time(Collective.reduce_scatter, tp, size, w.hw, mesh.tp_per_node, where=beyond)
    return np.where(beyond, ag, 0.0), np.where(beyond, rs, 0.0)


def time(w: Workload, c: Candidates, mesh: Mesh, tokens: Any, layers: Any, gemms: Any = None) -> TensorParallelTime:
    hw, tp, sp = w.hw, mesh.tp, np.asarray(c.sp, dtype=bool)
    on = tp > 1
    act = activation_bytes(w, tokens)
    ar = comm.collective_time(Collective.all_reduce, tp, act, hw, mesh.tp_per_node, where=on & ~sp)
    rs = comm.collective_time(Collective.reduce_scatter, tp, act, hw, mesh.tp_per_node, where=on & sp)
    ag = comm.collective_time(Collective.all_gather, tp, act, hw, mesh.tp_per_node, where=on & sp)
    ag_rs = ag + rs
    # the layers' gathers, quantised where the stack gathers in the recipe's format: a forward and a backward one each
    # per sub-block (each costed once: a pass that gathers in the activations' dtype is the gather above)
    f, b = gathered_bytes_ratio(w)
    gathers = {x: ag if x == 1.0 else comm.collective_time(Collective.all_gather, tp, act * x, hw, mesh.tp_per_node,
                                                           where=on & sp) for x in {f, b}}
    ag_f, ag_b = gathers[f], gathers[b]
    layer_ag = (ag_f + ag_b) / 2.0  # their mean
    per = np.where(sp, rs + layer_ag, ar)
    backward = 1.0  # the backward collectives' exposed share of LAYER_COLLECTIVES / 2 collectives
    piped = on & overlaps(w, tp, sp)
    # each plan on its own: a search holds piped and unpiped plans together, and neither rule may reach the other's
    if w.stack.engine.tp_backward_overlap and gemms is not None and np.any(on & ~piped):  # async beside dgrad and wgrad
        backward = np.where(piped, 1.0, backward_exposed(w, gemms, ag_f, ag_b, rs, ar, sp) / np.maximum(per, 1e-30))
    if gemms is not None and np.any(piped):  # userbuffers, torch's micro-pipeline or the linears' async_op, beside GEMMs
        share = (overlap_share(w, gemms, layer_ag, rs, tp) if w.tp_overlap == "userbuffers"
                 else linear_async_share(w, gemms, ag_f, ag_b, rs, tp, tokens, mesh.tp_per_node)
                 if w.tp_overlap == "linear-async" else async_share(w, gemms, layer_ag, rs, tp, act))
        per = np.where(piped, per * share, per)
    rerun = mix(c.recompute, c.recompute_k, layers, mesh.v, w.model.n_layers).full  # checkpointed layers' share
    # LoRA adapters under TP add their own; their forward ones rerun with the checkpointed layers
    n = (LAYER_COLLECTIVES / 2.0 * (1.0 + backward) + rerun * RECOMPUTE_COLLECTIVES
         + adapters.tp_collectives(w, sp) * (1.0 + 0.5 * rerun))
    # the loss's three all-reduces; each multi-token prediction depth runs the head's collectives and loss again and
    # gathers eh_proj's output (multi_token_prediction.py:1144 gather_from_tensor_model_parallel_region; advisor.mtp)
    d = w.mtp_layers
    loss = 3.0 * (1 + d) * comm.collective_time(Collective.all_reduce, tp, tokens * 4.0, hw, mesh.tp_per_node, where=on)
    head = np.where(sp, ag_rs, ar) * (1 + d) + (d * comm.collective_time(Collective.all_gather, tp, act, hw, mesh.tp_per_node,
                                                                           where=on) if d else 0.0)
    kv_ag, kv_rs = kv_group_gathers(w, tp, tokens, mesh)
    kv_layers = layers * (kv_ag * (1.0 + rerun) + kv_rs)
    return TensorParallelTime(per_layer_collective_s=np.where(on, per, 0.0), collectives_per_layer=n,
                              layers_s=np.where(on, layers * n * per, 0.0) + kv_layers,
                              embedding_s=np.where(on, np.where(sp, 0.5 * ag_rs, ar), 0.0),
                              lm_head_s=np.where(on, head, 0.0), loss_s=np.where(on, loss, 0.0),
                              backward_share=backward, kv_gather_s=kv_ag, kv_scatter_s=kv_rs, kv_layers_s=kv_layers,
                              kv_layers_fwd_s=layers * kv_ag)
