"""Communication: alpha-beta cost of NCCL collectives on one link class, and across nodes.

The measured quantity is defined as nccl-tests defines it (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
``algbw = S / t`` and ``busbw = algbw * bus_factor(n)``, where the bus factor turns algorithm
bandwidth into the bandwidth each rank's link actually carries in a ring:
    all_reduce 2(n-1)/n, all_gather (n-1)/n, reduce_scatter (n-1)/n, broadcast/reduce/send_recv 1,
    all_to_all (n-1)/n.
``bus_factor`` below is that table, written once and used by validation/microbench.py for its busbw column.

One link class (advisor.hardware.CommFit) costs
    t(n, S) = max(floor(n), alpha(n) + bus_factor(n) * S_loop / (B_link * eff(n, S)))
    alpha(n)  = latency_us + latency_per_hop_us * (n - 1)           ring/tree start-up, per hop
    eff(n, S) = bandwidth_efficiency * (1 - group_penalty / n)       large-message busbw / link rate;
                * (S / (S + half_size)) ** half_size_exponent        small messages fill fewer channels
    S_loop    = S + loop_quantization * (ceil(S / L) * L - S),  L = loop_MiB_per_rank * n
              NCCL moves data in loops of nchannels x nranks x chunk; a partly filled last loop
              costs part of a full one, which is the sawtooth visible in nccl-tests sweeps.
    floor(n)  = floor_us + floor_per_hop_us * (n - 1)               the smallest launch-to-completion time
The parameters are fitted per profile by ``advisor calibrate`` (advisor.calibrate).

Across nodes a group of n GPUs with g of them in each of k nodes is costed two ways, and the cheaper
is taken and named (NCCL picks between ring and tree similarly):
- ring bottleneck: busbw bounded by each GPU's share of its node's network (and the intra link).
- hierarchical (all-reduce only): reduce-scatter inside the node (g), all-reduce of S/g across the k
  nodes on each GPU's NIC share, all-gather inside the node (g): all of a node's NICs carry data.
PCIe without peer-to-peer (NCCL_P2P_DISABLE=1, ``titan-rtx-pcie``) stages through host memory; the
profile's pcie bandwidth is that staged path's effective rate.

Left out: NVLink SHARP and in-network (SHARP) reductions, congestion from other jobs, rail mismatch.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np

from advisor.hardware import Hardware, Link
from advisor.units import MiB, us


class Collective(str, Enum):
    all_reduce = "all_reduce"
    all_gather = "all_gather"
    reduce_scatter = "reduce_scatter"
    broadcast = "broadcast"
    reduce = "reduce"
    send_recv = "send_recv"
    all_to_all = "all_to_all"


def bus_factor(coll: Collective | str, n: Any) -> Any:
    """nccl-tests bus factor: busbw = algbw * bus_factor(n)."""
    n = np.asarray(n, dtype=float)
    c = Collective(coll)
    if c is Collective.all_reduce:
        return 2.0 * (n - 1.0) / n
    if c in (Collective.all_gather, Collective.reduce_scatter, Collective.all_to_all):
        return (n - 1.0) / n
    return np.ones_like(n)



def link_time(coll: Collective | str, n: Any, size_bytes: Any, link: Link) -> Any:
    """Seconds for one collective of ``size_bytes`` per rank over ``n`` ranks on one link class.

    ``size_bytes`` is the nccl-tests "size": the buffer each rank contributes (all-reduce), or the
    full output (all-gather) / full input (reduce-scatter). Zero ranks-1 or zero bytes cost nothing.
    """
    f = link.fit
    n = np.asarray(n, dtype=float)
    S = np.asarray(size_bytes, dtype=float)
    nn = np.maximum(n, 2.0)
    bw = link.bandwidth_bytes_per_s
    eff = f.bandwidth_efficiency * (1.0 - f.group_penalty / nn)
    if f.loop_MiB_per_rank > 0 and f.loop_quantization > 0:
        L = f.loop_MiB_per_rank * MiB * nn
        S_loop = S + f.loop_quantization * (np.ceil(S / L) * L - S)
    else:
        S_loop = S
    if f.half_size_MiB > 0:
        # evaluated at S_loop, so that S_loop / eff (and the time) never decreases with S
        eff = eff * (S_loop / (S_loop + f.half_size_MiB * MiB) + 1e-30) ** f.half_size_exponent
    alpha = (f.latency_us + f.latency_per_hop_us * (nn - 1.0)) * us
    t = alpha + bus_factor(coll, nn) * S_loop / (bw * eff)
    t = np.maximum(t, (f.floor_us + f.floor_per_hop_us * (nn - 1.0)) * us)
    return np.where((n <= 1) | (S <= 0), 0.0, t)


def collective_time(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any) -> Any:
    """Seconds for a collective over ``n`` GPUs placed ``per_node`` to a node (vectorised).

    Groups that fit in one node use the intra-node link; groups that span nodes take the cheaper of
    the ring bottleneck and the hierarchical algorithm (see module docstring).
    """
    return collective_time_and_path(coll, n, size_bytes, hw, per_node)[0]


def collective_time_and_path(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any):
    """(seconds, path) where path is 0 intra-node, 1 ring across nodes, 2 hierarchical."""
    c = Collective(coll)
    n = np.asarray(n, dtype=float)
    S = np.asarray(size_bytes, dtype=float)
    g = np.clip(np.asarray(per_node, dtype=float), 1.0, np.maximum(n, 1.0))
    k = np.ceil(n / g)
    intra = link_time(c, n, S, hw.intra_node)
    # Ring across nodes: every GPU of the group sends and receives its full share over the inter-node
    # network, so busbw is bounded by each GPU's share of its node's NICs (rail-optimised nodes: one NIC
    # per GPU), and by the intra-node link. This is what ZeRO-3's all-gathers over thousands of GPUs show
    # (Narayanan et al. 2021 Table 2: the step time stays flat from 768 to 1536 GPUs).
    share = hw.inter_node_bytes_per_s_per_gpu / hw.inter_node.bandwidth_bytes_per_s
    ring = np.maximum(link_time(c, n, S, hw.inter_node) / share, intra)
    # Hierarchical all-reduce (NCCL tree / 2D): intra-node reduce-scatter, all-reduce of S/g across the k
    # nodes on each GPU's NIC share (all g NICs of a node busy at once), intra-node all-gather. NCCL has
    # no such algorithm for all-gather / reduce-scatter alone: those stay on the ring.
    inter_part = link_time(c, k, S / g, hw.inter_node) / share
    if c is Collective.all_reduce:
        hier = (
            link_time(Collective.reduce_scatter, g, S, hw.intra_node)
            + inter_part
            + link_time(Collective.all_gather, g, S, hw.intra_node)
        )
    else:
        hier = ring
    multi = k > 1
    t = np.where(multi, np.minimum(ring, hier), intra)
    path = np.where(multi, np.where(hier < ring, 2, 1), 0)
    return np.where((n <= 1) | (S <= 0), 0.0, t), path


PATH_NAMES = {0: "intra-node", 1: "ring across nodes", 2: "hierarchical across nodes"}


def p2p_time(size_bytes: Any, hw: Hardware, across_nodes: Any) -> Any:
    """Point-to-point send/recv between neighbouring pipeline stages (one message)."""
    intra = link_time(Collective.send_recv, 2, size_bytes, hw.intra_node)
    inter = link_time(Collective.send_recv, 2, size_bytes, hw.inter_node) * hw.gpus_per_node
    return np.where(np.asarray(across_nodes, dtype=bool), inter, intra)
