"""Context parallelism: each sequence split over cp ranks, every rank computing attention for its queries
against the keys of the whole sequence.

- Sharding: a rank holds s / cp tokens of each micro-batch, so the activations, the GEMMs, the logits and the
  attention core's FLOPs of a rank are 1/cp of the sequence's (the caller passes s / cp tokens per micro-batch:
  advisor.step). Causal attention stays balanced by splitting the sequence into 2 x cp chunks and giving rank
  i chunks i and 2cp - 1 - i (Megatron's get_batch_on_this_cp_rank, megatron/training/utils.py; torch CP's
  "headtail" load balancer, torchtitan 0.3.0 context_parallel_load_balancer): the sequence must divide into
  2 x cp chunks. Weights are not split: gradients are reduced over dp x cp (advisor.candidates.Mesh.dp).
- Flavours (which ones a stack runs is data: its profile's ``engine.context_parallel``):
  * ring (Megatron / Transformer Engine, ``--cp-comm-type p2p``; TE attention.py AttnFuncWithCPAndKVP2P): in
    forward, cp - 1 steps each pass this rank's K and V block to the next rank of the ring while the attention
    of the block received before runs; a step costs max(attention of a block, send/recv of a block), so the
    time beyond the attention is (cp - 1) x max(0, t_p2p - t_attn / cp). Backward passes K, V and dK, dV
    (twice the bytes) the same way. Bytes a rank sends per layer forward: (cp - 1) x 2 x (s / cp) x kv_dim x
    bytes = 2 (cp - 1) / cp x s x kv_dim x bytes (K and V: 2 x kv_dim per token). Each step's partial output is
    kept and merged after the ring on the compute stream (Transformer Engine 2.10 context_parallel.py:
    flash_attn_fwd_out_correction_init, then out.add_(out_per_step[i] x exp(lse_i - lse)) for every later step,
    the second half only where the step's keys lie past the rank's first chunk; the last rank merges all of
    them, and is the one the step waits for); backward accumulates dq (dq.add_(dq_)) and dK, dV into the
    received buffer step by step (``ring_merge_bytes``). The partial outputs of one layer are a transient.
  * all-gather (torchtitan 0.3.0 with torch's CP, _RotateMethod.ALL_GATHER, torch/distributed/tensor/
    experimental/_context_parallel/_attention.py; Llama 3, Dubey et al. 2024 s.3.3.2): all-gather K and V in
    forward, all-gather them again and reduce-scatter dK, dV in backward; not overlapped (Llama 3 accepts the
    exposed all-gather: under GQA K and V are small beside the attention of a long sequence). The gathered
    K and V of one layer are a transient buffer of the whole sequence.
  * ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509 s.3; deepspeed/sequence/layer.py
    DistributedAttention): all-to-all q, k, v from sequence-split to head-split, the attention core on whole
    sequences of heads / cp heads, all-to-all the output back: 4 all-to-alls forward, 4 backward, not
    overlapped; cp must divide each TP rank's heads and KV heads (Transformer Engine 2.14's AttnFuncWithCPAndQKVOA2A,
    megatron-core's a2a: "The number of attention heads needs to be divisible by CP size!", context_parallel.py:3402;
    a rank of tp >= the KV heads holds one, megatron-core attention.py:353-357, so only cp 1 runs there).
- Placement: a CP group's ranks follow tp in the rank order (tp, cp, dp, pp), so it fills the rest of a node
  (or NVLink domain) before leaving it; a ring that leaves the domain runs every step at the network's pace.

Left out: the lower efficiency of the attention kernel on s / cp key blocks, the a2a+p2p hierarchical flavour
(--cp-comm-type a2a+p2p), the saved softmax statistics' growth with cp, the softmax statistics' own merges (4 bytes
a head per token, beside the output's q_dim elements).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from advisor import comm
from advisor.candidates import Candidates, Mesh
from advisor.comm import Collective
from advisor.compute import mem_time
from advisor.layout import ContextParallel
from advisor.model import ModelSpec
from advisor.training import Recompute
from advisor.workload import Workload

RING, ALL_GATHER, ULYSSES = (k.code for k in ContextParallel)
# The search's largest cp: published long-context runs use up to 16 (Llama 3 405B at 128K tokens: TP 8 x CP 16,
# Dubey et al. 2024 Table 4); one doubling beyond keeps the space bounded.
MAX_CP = 32


def violations(c: Candidates, model: ModelSpec, seq_len: Optional[int] = None, eager: bool = False,
               split: str = "cp_then_tp") -> dict[str, Any]:
    """Constraint -> where a plan breaks it (module docstring); ``split``: the stack's engine.sequence_split."""
    cp = np.asarray(c.cp)
    on, uly = cp > 1, (cp > 1) & (c.cp_comm == ULYSSES)
    group = c.tp * cp
    kv = model.kv_heads
    out = {
        "Ulysses needs cp x tp to divide the attention heads": uly & ((model.n_heads % group) != 0),
        "Ulysses needs cp to divide the KV heads of each TP rank": uly & ((np.where(c.tp >= kv, 1, kv // c.tp) % cp) != 0),
        "context parallelism needs a fused attention kernel (--attention sdpa)": on & bool(eager),
    }
    if seq_len is not None:
        out["sequence not divisible into 2 x cp load-balancing chunks"] = on & ((seq_len % (2 * cp)) != 0)
        # sequence parallelism scatters a rank's s / cp tokens over the TP ranks: Megatron's _split_along_first_dim
        # asserts they divide (megatron-core tensor_parallel/mappings.py "First dimension of the tensor should be
        # divisible by tensor parallel size")
        # torchtitan 0.3.0 checks seq_len % (tp x 2 cp) at once (trainer.py), which (s / cp) % tp does not imply
        per = (seq_len // cp) % c.tp if split == "cp_then_tp" else seq_len % (c.tp * np.where(on, 2 * cp, 1))
        out["sequence parallelism needs the sequence (per CP rank) divisible by tp"] = np.asarray(c.sp, dtype=bool) & (
            per != 0)
    return out


def kv_bytes_per_token(w: Workload, tp: Any) -> Any:
    """K and V bytes per token on one TP rank: KV heads split over the TP ranks, one each when tp exceeds them."""
    layer = w.layer
    return 2.0 * layer.kv_dim / np.minimum(tp, layer.kv_heads) * w.act_bytes


def ring_bytes_per_layer(w: Workload, tokens: Any, tp: Any, cp: Any) -> Any:
    """Bytes one rank sends per layer forward under ring attention: (cp - 1) blocks of its s / cp tokens' K and
    V (``tokens`` is the rank's own, s / cp per sequence): 2 (cp - 1) / cp x s x kv_dim x bytes per sequence."""
    return (cp - 1.0) * tokens * kv_bytes_per_token(w, tp)


def ring_merge_bytes(w: Workload, tokens: Any, tp: Any, cp: Any) -> tuple[Any, Any]:
    """(forward, backward) bytes the ring's merge kernels move per layer on the busiest (last) rank, whose every
    step covers its whole output (module docstring): forward, the first step's output scaled (read, write: 4 bytes
    an element in bf16) and cp - 1 more added in (read the step's, read and write the sum: 6); backward, dq the
    same, and cp - 1 additions of this rank's dK, dV into the block received (6 bytes an element)."""
    out = tokens * w.layer.q_dim / tp  # elements of this rank's attention output
    kv = tokens * kv_bytes_per_token(w, tp) / w.act_bytes
    per = w.act_bytes / 2.0  # the bytes above are bf16's
    merge = (4.0 * out + 6.0 * (cp - 1.0) * out) * per
    return merge, merge + 6.0 * (cp - 1.0) * kv * per


@dataclass(frozen=True)
class ContextParallelTime:
    """Seconds context parallelism adds to one layer of one micro-batch: its exchanges beyond the attention they
    overlap with, and the ring's merge kernels."""

    fwd_s: Any
    bwd_s: Any
    recompute_s: Any

    @property
    def layer_s(self) -> Any:
        return self.fwd_s + self.bwd_s + self.recompute_s


def time(w: Workload, c: Candidates, mesh: Mesh, tokens: Any, attn_fwd_s: Any, attn_bwd_s: Any) -> ContextParallelTime:
    """Per layer and micro-batch; ``tokens`` are the rank's (s / cp per sequence), ``attn_*_s`` the rank's
    attention core (advisor.compute)."""
    cp, tp, hw = mesh.cp, mesh.tp, w.hw
    on = cp > 1
    if not np.any(on):  # no plan splits its sequences: nothing to add (a scalar keeps the search's arrays few)
        return ContextParallelTime(0.0, 0.0, 0.0)
    zero = np.zeros(np.broadcast_shapes(np.shape(cp), np.shape(tokens), np.shape(c.cp_comm)))
    kind = np.asarray(c.cp_comm)
    kv = tokens * kv_bytes_per_token(w, tp)  # this rank's K and V block
    # ring: (cp - 1) steps, each max(attention of a block, send/recv of a block) (TE's AttnFuncWithCPAndKVP2P)
    ring = on & (kind == RING)
    leaves = mesh.cp_domains > 1
    step_f = comm.p2p_time(kv, hw, leaves)
    step_b = comm.p2p_time(2.0 * kv, hw, leaves)  # K, V and dK, dV
    merge_f, merge_b = ring_merge_bytes(w, tokens, tp, cp)
    ring_f = np.where(ring, (cp - 1.0) * np.maximum(step_f - attn_fwd_s / cp, 0.0) + mem_time(hw, merge_f), 0.0)
    ring_b = np.where(ring, (cp - 1.0) * np.maximum(step_b - attn_bwd_s / cp, 0.0) + mem_time(hw, merge_b), 0.0)
    # all-gather: the whole sequence's K and V gathered forward; gathered again, dK and dV reduce-scattered backward
    ag = on & (kind == ALL_GATHER)
    gather = comm.collective_time(Collective.all_gather, cp, kv * cp, hw, mesh.cp_per_node, where=ag)
    scatter = comm.collective_time(Collective.reduce_scatter, cp, kv * cp, hw, mesh.cp_per_node, where=ag)
    # Ulysses: q, k, v in and the output back, each an all-to-all of this rank's tensor; the same 4 backward
    uly = on & (kind == ULYSSES)
    layer = w.layer
    q = tokens * layer.q_dim / tp * w.act_bytes
    a2a = (2.0 * comm.collective_time(Collective.all_to_all, cp, q, hw, mesh.cp_per_node, where=uly)
           + 2.0 * comm.collective_time(Collective.all_to_all, cp, kv / 2.0, hw, mesh.cp_per_node, where=uly))
    fwd = ring_f + np.where(ag, gather, 0.0) + np.where(uly, a2a, 0.0)
    bwd = ring_b + np.where(ag, gather + scatter, 0.0) + np.where(uly, a2a, 0.0)
    rc = np.where(c.recompute == Recompute.full.code, fwd, 0.0)
    return ContextParallelTime(fwd + zero, bwd + zero, rc + zero)


def transient_bytes(w: Workload, c: Candidates, mesh: Mesh, tokens: Any) -> Any:
    """Bytes alive during one layer's attention beyond what it saves: all-gather CP's gathered K and V of the
    whole sequence (``tokens`` x cp); the ring's partial outputs, one per step, until they are merged."""
    kind = np.asarray(c.cp_comm)
    ag, ring = (mesh.cp > 1) & (kind == ALL_GATHER), (mesh.cp > 1) & (kind == RING)
    if not np.any(ag | ring):
        return 0.0
    outputs = mesh.cp * tokens * w.layer.q_dim / mesh.tp * w.act_bytes
    return np.where(ag, tokens * mesh.cp * kv_bytes_per_token(w, mesh.tp), np.where(ring, outputs, 0.0))


def attention_share(w: Workload) -> float:
    """The attention core's share of a layer's FLOPs at this sequence length (the explanation's figure)."""
    per = w.layer.flops_per_token(w.seq_len, causal=True)
    return float(per.get("attention/core", 0.0) / max(sum(per.values()), 1e-30))
