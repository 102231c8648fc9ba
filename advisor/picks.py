"""Which link or NCCL algorithm each of a plan's collectives runs on, at the size one call moves, for the estimate's
output (``Estimate.collectives``): the pick advisor.comm made when it costed the step (NCCL's tuner picks per call,
by size: a 2-node all-reduce of a few MiB may take the ring where a 1 GiB bucket takes the tree).

One entry per kind of collective the plan runs: tensor parallelism's per-layer all-reduce (or all-gather +
reduce-scatter under sequence parallelism), the gradient all-reduce of DDP (one bucket), ZeRO's reduce-scatter and
all-gather (one unit: a layer, or the whole stage), HSDP's all-reduce across replicas, pipeline send/recv, the
expert-parallel all-to-all of one MoE layer's dispatch.
"""

from __future__ import annotations

import numpy as np

from advisor import comm
from advisor.candidates import Candidates, Mesh
from advisor.comm import Collective
from advisor.hardware import Hardware
from advisor.layout import DataParallelKind
from advisor.parallel import data, expert, overlap, pipeline, tensor, zero_buffers
from advisor.units import fmt_bytes
from advisor.workload import Workload

NAMES = {Collective.all_reduce: "all-reduce", Collective.all_gather: "all-gather",
         Collective.reduce_scatter: "reduce-scatter", Collective.send_recv: "send/recv",
         Collective.all_to_all: "all-to-all"}


def describe(coll: Collective, n: float, size: float, hw: Hardware, per_node: float) -> str:
    """'all-reduce of 1.00 GiB over 16 GPUs (8 per node, 2 nodes): tree across nodes'."""
    _, path = comm.collective_time_and_path(coll, n, size, hw, per_node)
    per_node = min(per_node, n)
    nodes = int(np.ceil(n / per_node - 1e-9))
    spread = f"{int(per_node)} per node" if per_node >= 1 else f"1 every {round(1 / per_node)} nodes"
    where = f"{spread}, {nodes} nodes" if nodes > 1 else "one node"
    return f"{NAMES[coll]} of {fmt_bytes(size)} over {int(n)} GPUs ({where}): {comm.algorithm_name(int(path), hw)}"


def held(hw: Hardware, n: float, per_node: float, overlapped: bool, path: object = None) -> str:
    """'; beside the compute, holding 24 of 108 SMs (NCCL's thread blocks)' where an overlapped call holds any
    (``path``: the algorithm it ran, where it holds its own channels: advisor.comm.held_sms)."""
    share = float(comm.held_sms(n, per_node, hw, path)) if overlapped else 0.0
    return f"; beside the compute, holding {round(share * hw.gpu.sm_count)} of {hw.gpu.sm_count} SMs (NCCL's thread " \
           "blocks)" if share > 0 else ""


def _beside(w: Workload, coll: Collective, zero: int, overlapped: bool) -> bool:
    """Whether advisor.parallel.data costs this ZeRO collective beside the compute: ZeRO-1's reduce-scatter beside the
    backward where the gradients overlap, its gather beside the next forward where the stack overlaps it; ZeRO-2/3's
    prefetched gathers and their reduce-scatters, except those a device sync per fetch serialises (DeepSpeed 0.3) and
    ZeRO-3's reduce-scatters without backward prefetch (the forward's gathers alone beside the compute)."""
    eng = w.stack.engine
    if zero == 1:
        return eng.param_gather_overlap if coll == Collective.all_gather else overlapped
    if coll == Collective.all_gather:
        return True
    return not (zero >= 3 and eng.zero3_overlap == "forward"
                or eng.zero3_calls is not None and eng.zero3_calls.device_sync_per_fetch)


def _tp_pick(w: Workload, c: Candidates, mesh: Mesh, tp: float, one) -> str:
    """The TP collectives of a micro-batch's layer, and how the stack's overlap runs them."""
    act = one(tensor.activation_bytes(w, c.micro_batch.astype(float) * w.seq_len / mesh.cp))  # a rank's tokens (step.py)
    colls = (Collective.all_gather, Collective.reduce_scatter) if bool(c.sp[0]) else (Collective.all_reduce,)
    text = "; ".join(describe(x, tp, act, w.hw, one(mesh.tp_per_node)) for x in colls)
    if bool(tensor.overlaps(w, tp, c.sp[0])):
        text += {"userbuffers": "; pipelined with the GEMMs they feed (userbuffers, --tp-comm-overlap)",
                 "linear-async": "; the column linears' gathers and backward reduce-scatters issued async_op "
                                 "beside a GEMM, the row linears' forward reduce-scatters exposed"}.get(
            w.tp_overlap, "; pipelined with the GEMMs they feed (async TP: symmetric-memory copies, no SMs taken)")
    if tp > w.model.kv_heads and w.stack.engine.tp_beyond_kv_heads == "replicate":  # tensor.kv_group_gathers
        qkv = act * w.layer.qkv_dim / w.model.d_model
        text += (f"; tp {tp:g} > {w.model.kv_heads} KV heads: each layer's q/k/v output re-gathered whole, "
                 + "; ".join(describe(x, tp, qkv, w.hw, one(mesh.tp_per_node))
                             for x in (Collective.all_gather, Collective.reduce_scatter)) + ", not overlapped")
    return text


def _ep_pick(w: Workload, c: Candidates, mesh: Mesh, one) -> str:
    """The experts' collectives as advisor.parallel.expert.time costs them under comm/ep_alltoall: EP's dispatch and
    combine; without EP, experts split over etp > 1 ranks gather their tokens and reduce-scatter their outputs (an
    all-reduce as a dense TP MLP's without SP), which were costed there and not shown. "" where neither runs."""
    if not w.model.routed:  # a dense model: its TP ranks' etp (Candidates: tp by default) splits no experts
        return ""
    hw, ep, etp = w.hw, one(mesh.ep), one(mesh.etp)
    tokens = c.micro_batch.astype(float) * w.seq_len / mesh.cp  # a rank's own tokens, as step.py costs them
    if ep <= 1:
        if etp <= 1:
            return ""
        size = one(expert.alltoall_bytes(w, tokens, mesh.tp, c.sp, mesh.ep)) * (etp if bool(c.sp[0]) else 1.0)
        pair = (Collective.all_gather, Collective.reduce_scatter)
        return ("; ".join(describe(x, etp, size, hw, min(etp, hw.gpus_per_node)) for x in pair)
                + f" (no EP: the experts split over {etp:g} ranks, each MoE layer)")
    # the dispatch (and combine) of one MoE layer (advisor.parallel.expert)
    size = one(expert.alltoall_bytes(w, tokens, mesh.tp, c.sp, mesh.ep))
    text = describe(Collective.all_to_all, ep, size, hw, one(mesh.ep_per_node))
    if w.moe_dispatcher == "flex":
        x = w.model.experts
        reach = one(expert.reached(expert.n_experts(w.layer), expert.top_k(w.layer), ep, x.groups, x.group_topk))
        text += (f"; flex dispatcher: {reach:.1f}"
                 f" of {expert.top_k(w.layer):g} routed copies a token sent (once a GPU, once a domain across)")
    # the stack's default overlap names the shared experts; a model without them (Mixtral) has nothing there
    # to hide the all-to-alls behind (expert.py costs shared_fwd_s = 0), so nothing is said
    if w.moe_overlap == "batch" or (w.moe_overlap == "shared_experts" and w.model.experts.d_ff_shared):
        text += "; beside " + ("the shared experts' GEMMs" if w.moe_overlap == "shared_experts" else
                               "another micro-batch's compute (combined forward and backward steps)")
    return text


def collective_picks(w: Workload, c: Candidates) -> dict[str, str]:
    """The plan's collectives (row 0 of ``c``) named with the link or algorithm each runs on."""
    hw = w.hw
    mesh = Mesh.of(c, hw.gpus_per_node, hw.domain_gpus)
    one = lambda x: float(np.asarray(x).reshape(-1)[0])  # noqa: E731
    tp, dp, shard, pp = one(mesh.tp), one(mesh.dp), one(mesh.dp_shard), one(mesh.pp)
    zero, out = int(c.zero[0]), {}
    layers = pipeline.layers_per_stage(w.model, mesh.pp)
    states = data.model_states(w, c, mesh, layers)
    if tp > 1:
        out["tp"] = _tp_pick(w, c, mesh, tp, one)
    if dp > 1 and int(c.dp_kind[0]) == DataParallelKind.ddp.code:
        grads = one(states.dp_params * states.grad_bytes)
        # as advisor.parallel.data costs them (less a ZeRO engine's that never sets overlap_comm: zero_buffers.overlap)
        overlapped = bool(np.asarray(zero_buffers.overlap(w, np.asarray(c.zero), data.overlaps(c, hw))).reshape(-1)[0])
        if zero == 0:
            eng = w.stack.engine
            bucket = one(overlap.bucket_bytes(w, mesh.dp, states.reduce_bytes))  # a bucket as data.ddp_exposed sizes it
            size = grads if eng.gradient_reduction == "one_call" else min(grads, bucket)
            path = comm.collective_time_and_path(Collective.all_reduce, dp, size, hw, one(mesh.dp_per_node))[1]
            out["dp_grad"] = (describe(Collective.all_reduce, dp, size, hw, one(mesh.dp_per_node))
                              + held(hw, dp, one(mesh.dp_per_node), overlapped, path))
        else:
            per_unit = zero >= 2 and w.stack.engine.zero_collectives == "per_unit"
            units = max(one(layers), 1.0) if per_unit else 1.0
            # one call's bytes as data.sharded_collectives issues them: a layer's share of them per unit
            body = (lambda n: (states.params - states.params_outside_layers) * n / states.params / units  # noqa: E731
                    if per_unit else n)
            # an all-reduce where that ZeRO-1/2 does (DeepSpeed's each bucket, nanotron's after the backward)
            every = bool(zero_buffers.all_reduces(w, zero))
            swap = lambda x: Collective.all_reduce if every and x == Collective.reduce_scatter else x  # noqa: E731
            out["zero"] = "; ".join(describe(swap(x), shard, one(body(n) * b), hw, one(mesh.shard_per_node))
                                    + held(hw, shard, one(mesh.shard_per_node), _beside(w, x, zero, overlapped))
                                    for x, b, n in states.zero_payloads(zero))
        if bool(c.hybrid[0]):
            out["hsdp"] = describe(Collective.all_reduce, one(mesh.dp_replicate), grads / shard, hw, 1)
    if (ep := _ep_pick(w, c, mesh, one)):
        out["ep"] = ep
    cp = one(mesh.cp)
    if cp > 1:
        from advisor.parallel import context

        kind = int(c.cp_comm[0])
        kv = one(c.micro_batch.astype(float) * w.seq_len * context.kv_bytes_per_token(w, mesh.tp))  # the sequence's K, V
        if kind == context.RING:
            leaves = bool(np.asarray(mesh.cp_domains).reshape(-1)[0] > 1)
            out["cp"] = (f"ring send/recv of {fmt_bytes(kv / cp)} K/V blocks, {int(cp) - 1} steps a layer, overlapped with "
                         "attention: " + ("the network" if leaves else "NVLink (the ring stays in one NVLink domain)"))
        elif kind == context.ALL_GATHER:
            out["cp"] = describe(Collective.all_gather, cp, kv, hw, one(mesh.cp_per_node))
        else:
            out["cp"] = describe(Collective.all_to_all, cp, kv / cp / 2.0, hw, one(mesh.cp_per_node)) + " (x4 a layer)"
    if pp > 1:
        across = bool(np.asarray(mesh.stage_crosses_domains).reshape(-1)[0])
        out["pp_p2p"] = ("send/recv between stages: " + ("the network, each GPU on its own NIC share" if across
                                                         else "NVLink (stages inside one NVLink domain)"))
        on, size, per_node = pipeline.tied_sync(w, c, mesh, states.reduce_bytes)
        if bool(np.asarray(on).reshape(-1)[0]):
            # shown as a pair on two nodes (the cost spreads the pair as the ranks sit: pipeline.tied_sync)
            table = ("the tied embeddings' gradient " if w.model.tied_embeddings else  # else MTP's copy (tied_sync)
                     "the embedding gradient of the MTP depths' copy on the last stage: ")
            out["pp_p2p"] += "; " + table + describe(Collective.all_reduce, 2.0, one(size), hw,
                                                                           max(one(per_node), 1.0)) + " (the end stages, once a step)"
    return out
