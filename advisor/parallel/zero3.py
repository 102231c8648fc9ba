"""DeepSpeed's ZeRO-3 parameter coordinator, call by call (a stack whose ``engine.zero3_calls`` says how).

DeepSpeed gathers a sub-module's parameters when its forward (or backward) hook fires and prefetches what the
trace says comes next; it reduce-scatters the gradients as backward produces them. What it costs depends on how
many collective calls that makes, because every call pays NCCL's start-up over every rank of the group (a ring
over 1,536 A100s: ~7 ms, advisor.comm.network), and on what the host does per call:

- which tensors are gathered: those with at least ``persistence_elements`` (stage3_param_persistence_threshold;
  smaller ones stay whole on every rank), one call each (``per_tensor``, DeepSpeed 0.3 ``_allgather_param``) or
  coalesced up to ``gather_bucket_elements`` a call (``per_bucket``: ``all_gather_coalesced``, one
  ``all_gather_into_tensor``); reduce-scatters likewise, over every tensor (persistent ones too);
- host ops per rank of the group in every call made with per-rank tensor lists (DeepSpeed 0.3 slices the flat
  buffer once per rank in Python; torch's list-form all_gather / reduce_scatter copies each rank's slice out of /
  into a flat buffer), at the stack's CPU time per op; the host issues them while the fetch blocks;
- overlap: while sub-module k computes, the next one's parameters are in flight (prefetched) unless k's own
  gathered elements reach ``max_live_elements`` (stage3_max_live_parameters: the coordinator prefetches only
  while fewer are live), in which case the next fetch gathers blocking after k; a coordinator that synchronises
  the device in every fetch (``device_sync_per_fetch``, DeepSpeed 0.3) also waits there for the reduce-scatter of
  k's gradients, which otherwise runs beside the next gather.
A checkpointed layer's recomputation is a forward: its hooks gather again (three gather passes per micro-batch).
Memory: a parameter the trace reuses within ``max_reuse_elements`` (stage3_max_reuse_distance) is not released
(``reused_tail``): the output layer and the last layers stay gathered from the forward into the backward, where the
activations peak. Left out: the time of the backward gathers that retention saves, and the embedding's and head's
gathers beyond one exposed call per pass.

``deepspeed_exposed`` is the coarser form for a stack with no ``zero3_calls``: one call per pass, shared out over
the layer's four sub-modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor import comm
from advisor.comm import Collective
from advisor.compute import LayerTimes
from advisor.distinct import distinct
from advisor.model.layer import Split
from advisor.stack import Zero3Calls
from advisor.units import us
from advisor.workload import Workload


@dataclass(frozen=True)
class SubModuleCalls:
    """Per sub-module of a layer (forward order): seconds of its gather and of its gradients' reduce-scatter
    (collective and host), and its gathered elements on one TP rank; the root's (embedding, head) gather and
    reduce-scatter once."""

    gather_s: list
    reduce_s: list
    gathered: list
    root_gather_s: Any
    root_reduce_s: Any
    gather_comm_s: Any = None  # of gather_s and reduce_s, the collectives' own seconds (the host's apart): what holds
    reduce_comm_s: Any = None  # SMs beside the compute (None: all of them)


def reused_tail(w: Workload, outside: Any, layer_params: Any, tp: Any) -> Any:
    """Parameters (per TP rank) a ZeRO-3 coordinator keeps gathered from the end of the forward into the backward.

    DeepSpeed's release (partitioned_param_coordinator.py ``__params_to_release``, deepspeed 0.19.8) walks the trace
    from the next sub-module and keeps a parameter that recurs before ``max_reuse_elements`` elements are traversed.
    A sub-module j of the forward recurs in the backward after the sub-modules behind it have run twice (forward,
    then backward): j is kept while twice the parameters behind it stay under the distance. So the output layer,
    which the backward reuses next, is always kept, and the last layers while the head and they hold under half the
    distance (gpt2-xl at the default 1e9: its tied head, 80M, and the last ~13 of its 48 layers; Llama 3 8B's
    525M-element head: the head alone). Sub-module granularity is taken as continuous."""
    z = w.stack.engine.zero3_calls
    if z is None or z.max_reuse_elements <= 0:
        return 0.0
    head = np.minimum(w.model.vocab * w.model.d_model / tp, outside)
    return head + np.clip(z.max_reuse_elements / 2.0 - head, 0.0, layer_params)


def tensors(w: Workload, tp: Any) -> dict[str, list]:
    """Elements of each parameter tensor on one TP rank, by sub-module (weights, biases; the norms' weights and
    biases with the first sub-module, whose hook gathers them in a layer without norm sub-modules of its own)."""
    out: dict[str, list] = {}
    for lin in w.layer.linears:
        out.setdefault(lin.module, []).append(lin.rank_weights(tp))
        if lin.bias:
            out[lin.module].append(lin.n_out * lin.copies / (tp if lin.split is Split.column else 1.0))
    first = next(iter(out))
    per_norm = {"layernorm": 2, "rmsnorm": 1, "layernorm_nobias": 1}.get(w.layer.norm.value, 0)
    out[first] += [float(n) for _, n in w.layer.norms for _ in range(per_norm)]
    return out


def _per_tensor(hw: Any, coll: Collective, sizes: list, keep: list, owner: list, k: int, shard: Any, per_node: Any,
                per_elem: Any, host_s: Any) -> tuple[list, list]:
    """(seconds of each sub-module's calls, of them the collectives'), one call per kept tensor: every tensor costed
    in one vectorised call."""
    S, K = np.stack(np.broadcast_arrays(*sizes)), np.stack(np.broadcast_arrays(*keep))
    bare = np.where(K, comm.collective_time(coll, shard[None, ...], S * per_elem, hw, per_node[None, ...]), 0.0)
    own = np.asarray(owner)
    bare_j = [bare[own == j].sum(axis=0) for j in range(k)]
    return [b + K[own == j].sum(axis=0) * host_s for j, b in enumerate(bare_j)], bare_j


def _per_bucket(hw: Any, coll: Collective, bucket: float, sizes: list, keep: list, owner: list, k: int, shard: Any,
                per_node: Any, per_elem: Any, host_s: Any) -> tuple[list, list]:
    """(seconds of each sub-module's calls, of them the collectives'), its kept tensors coalesced up to ``bucket``
    elements a call (a larger tensor is one call of its own)."""
    S, K = np.stack(np.broadcast_arrays(*sizes)), np.stack(np.broadcast_arrays(*keep))
    own = np.asarray(owner)
    total = np.stack([np.where(K[own == j], S[own == j], 0.0).sum(axis=0) for j in range(k)])
    count = np.stack([K[own == j].sum(axis=0) for j in range(k)]).astype(float)
    calls = np.minimum(count, np.maximum(1.0, np.ceil(total / bucket))) if bucket > 0 else np.minimum(count, 1.0)
    one = comm.collective_time(coll, shard[None, ...], total * per_elem / np.maximum(calls, 1.0), hw, per_node[None, ...])
    bare = np.where(calls > 0, calls * one, 0.0)
    return list(bare + calls * host_s), list(bare)


def submodule_calls(w: Workload, z: Zero3Calls, tp: Any, shard: Any, per_node: Any, weight_bytes: Any,
                    reduce_bytes: Any, root_params: Any, cpu_us_per_op: float) -> SubModuleCalls:
    """The calls of every plan (arrays over plans): costed once per distinct (tp, shard, GPUs per node, bytes) and
    spread back, since a search's ZeRO-3 plans share a handful of them (the search's speed)."""
    cols = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (tp, shard, per_node, weight_bytes, reduce_bytes,
                                                                      root_params)))
    first, inverse = distinct(*(c.ravel() for c in cols))
    u = _submodule_calls(w, z, *(c.ravel()[first] for c in cols), cpu_us_per_op)
    back = (lambda x: np.broadcast_to(x, (len(first),))[inverse].reshape(cols[0].shape))
    return SubModuleCalls([back(x) for x in u.gather_s], [back(x) for x in u.reduce_s], [back(x) for x in u.gathered],
                          back(u.root_gather_s), back(u.root_reduce_s), [back(x) for x in u.gather_comm_s],
                          [back(x) for x in u.reduce_comm_s])


def _submodule_calls(w: Workload, z: Zero3Calls, tp: Any, shard: Any, per_node: Any, weight_bytes: Any,
                     reduce_bytes: Any, root_params: Any, cpu_us_per_op: float) -> SubModuleCalls:
    shard, per_node = np.asarray(shard, dtype=float), np.asarray(per_node, dtype=float)
    host_ag = z.host_ops_per_rank_gather * shard * cpu_us_per_op * us
    host_rs = z.host_ops_per_rank_reduce * shard * cpu_us_per_op * us
    by_module = tensors(w, tp)
    k = len(by_module)
    sizes = [np.broadcast_to(np.asarray(s, dtype=float), shard.shape) for v in by_module.values() for s in v]
    owner = [j for j, v in enumerate(by_module.values()) for _ in v]
    keep = [s >= z.persistence_elements for s in sizes]
    every = [np.ones(shard.shape, dtype=bool) for _ in sizes]
    if z.gathers == "per_tensor":
        gather = _per_tensor(w.hw, Collective.all_gather, sizes, keep, owner, k, shard, per_node, weight_bytes, host_ag)
    else:
        gather = _per_bucket(w.hw, Collective.all_gather, z.gather_bucket_elements, sizes, keep, owner, k, shard,
                             per_node, weight_bytes, host_ag)
    if z.reduces == "per_tensor":
        reduce = _per_tensor(w.hw, Collective.reduce_scatter, sizes, every, owner, k, shard, per_node, reduce_bytes, host_rs)
    else:
        reduce = _per_bucket(w.hw, Collective.reduce_scatter, z.reduce_bucket_elements, sizes, every, owner, k, shard,
                             per_node, reduce_bytes, host_rs)
    gathered = [sum(np.where(kp, s, 0.0) for s, kp, o in zip(sizes, keep, owner) if o == j) for j in range(k)]
    root_ag = comm.collective_time(Collective.all_gather, shard, root_params * weight_bytes, w.hw, per_node) + host_ag
    root_rs = comm.collective_time(Collective.reduce_scatter, shard, root_params * reduce_bytes, w.hw, per_node) + host_rs
    return SubModuleCalls(gather[0], reduce[0], gathered, root_ag, root_rs, gather[1], reduce[1])


def exposed(w: Workload, z: Zero3Calls, lt: LayerTimes, layers: Any, rerun: Any,
            calls: SubModuleCalls, held: Any = 0.0) -> tuple[Any, Any]:
    """Exposed gather and reduce-scatter seconds per micro-batch (forward, backward) on the busiest stage; ``lt`` is
    one layer's GPU time with its TP collectives in line, ``rerun`` the checkpointed share of the layers (each
    gathers again while it is recomputed, over its own forward). Sub-module k's compute is its share of the layer's GEMM
    FLOPs (proportional to its weights), the first one also carrying the attention core and half the element-wise
    work, the first MLP one the other half. A prefetched call beside a sub-module's compute takes ``held`` of the SMs
    from it while its collective runs (advisor.comm.held_sms), not while the host issues it."""
    params = np.array(list(w.layer.module_weights().values()), dtype=float)
    share = params / params.sum()
    n = len(share)

    def compute(gemm: Any, attn: Any, ew: Any) -> list:
        out = [gemm * s for s in share]
        out[0] = out[0] + attn + ew / 2.0
        out[n // 2] = out[n // 2] + ew / 2.0
        return out

    fwd_c = compute(lt.gemm_fwd_s, lt.attention_fwd_s, lt.elementwise_fwd_s)
    total_f = sum(fwd_c)
    frac = [np.where(total_f > 0, c / np.where(total_f > 0, total_f, 1.0), 1.0 / n) for c in fwd_c]
    ag, rs, live = calls.gather_s, calls.reduce_s, calls.gathered
    agc, rsc = calls.gather_comm_s or ag, calls.reduce_comm_s or rs
    prefetch = [g < z.max_live_elements for g in live]

    def one_pass(window: Any, order: list, backward: bool) -> Any:
        t = 0.0
        for i, k in enumerate(order):
            nxt = order[(i + 1) % n]
            comp = window * frac[k]
            with_rs = backward and not z.device_sync_per_fetch
            beside = ag[nxt] + (rs[k] if with_rs else 0.0)
            holding = agc[nxt] + (rsc[k] if with_rs else 0.0)  # the host's share of the calls holds no SM
            step = np.where(prefetch[k], np.maximum(comp + holding * held, beside), comp + beside)
            if backward and z.device_sync_per_fetch:
                step = step + rs[k]
            t = t + step - comp
        return t

    fwd_order, bwd_order = list(range(n)), list(range(n - 1, -1, -1))
    fwd = layers * one_pass(lt.fwd_s, fwd_order, False) + calls.root_gather_s
    rcp = rerun * one_pass(lt.recompute_s / np.where(rerun > 0, rerun, 1.0), fwd_order, False)
    bwd = layers * (rcp + one_pass(lt.bwd_s, bwd_order, True))
    return fwd, bwd + calls.root_gather_s + calls.root_reduce_s


def deepspeed_exposed(w: Workload, lt: LayerTimes, layers: Any, rerun: Any, ag_layer: Any,
                            rs_layer: Any, held: Any = 0.0) -> tuple[Any, Any]:
    """Exposed ZeRO-3 gather/reduce-scatter seconds per micro-batch (forward, backward) under DeepSpeed's
    parameter coordinator; ``lt`` is one layer's GPU time with its TP collectives in line.

    DeepSpeed gathers per sub-module, and ``fetch_sub_module`` is blocking: when the next sub-module's
    parameters are in flight it waits for them and synchronises the device (stage3.py in the 0.3 releases
    Megatron-DeepSpeed ran in 2021: ``_synchronize_communication`` ends in ``torch.cuda.synchronize()``),
    then prefetches only the next ``stage3_prefetch_bucket_size`` (5e7) elements: one linear layer of a
    large model. So the gather of each sub-module hides only behind the compute of the one before it, not
    behind the whole pass: a layer is four steps (the layer table's sub-modules: qkv with the attention core,
    out, fc1, fc2), and each lasts the longer of its compute and the next step's gather (the gradient
    reduce-scatter of the step just finished joins that gather in backward, on the same link). A checkpointed
    layer's recomputation is a forward: the hooks fire and gather its parameters again, so full recomputation
    makes three gathers per micro-batch (ZeRO-Infinity, Rajbhandari et al. 2021, Sec. 4).
    A call beside a step's compute takes ``held`` of the SMs from it while it runs (advisor.comm.held_sms).
    Not modelled: parameters kept for reuse within ``stage3_max_reuse_distance`` elements.
    """
    params = np.array(list(w.layer.module_weights().values()), dtype=float)
    share = params / params.sum()  # of the layer's weights, and of its GEMM FLOPs (proportional to them)
    comp = [lt.gemm_fwd_s * share[0] + lt.attention_fwd_s + lt.elementwise_fwd_s / 2.0, lt.gemm_fwd_s * share[1],
            lt.gemm_fwd_s * share[2] + lt.elementwise_fwd_s / 2.0, lt.gemm_fwd_s * share[3]]
    total = sum(comp)
    share_c = [np.where(total > 0, x / np.where(total > 0, total, 1.0), 0.25) for x in comp]
    ag = [ag_layer * s for s in share]
    rs = [rs_layer * s for s in share]

    def exposed(window: Any, comm_during: list) -> Any:
        """Seconds the four steps outlast their compute when step k runs beside comm_during[k]."""
        return sum(np.maximum(window * x + y * held, y) - window * x for x, y in zip(share_c, comm_during))

    next_gather = [ag[(k + 1) % 4] for k in range(4)]
    fwd = exposed(lt.fwd_s, next_gather)
    # the checkpointed share ``rerun`` of the layers gathers again while it is recomputed, each over its forward
    rcp = rerun * exposed(lt.recompute_s / np.where(rerun > 0, rerun, 1.0), next_gather)
    bwd = exposed(lt.bwd_s, [ag[(k - 1) % 4] + rs[(k + 1) % 4] for k in range(4)])
    return layers * fwd + ag[0], layers * (rcp + bwd)
