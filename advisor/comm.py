"""Communication: alpha-beta cost of NCCL collectives on one link class, and across nodes.

The measured quantity is defined as nccl-tests defines it (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
``algbw = S / t`` and ``busbw = algbw * bus_factor(n)``, where the bus factor turns algorithm
bandwidth into the bandwidth each rank's link actually carries in a ring:
    all_reduce 2(n-1)/n, all_gather (n-1)/n, reduce_scatter (n-1)/n, broadcast/reduce/send_recv 1,
    all_to_all (n-1)/n.
``bus_factor`` below is that table, written once and used by advisor/calibrate/microbench.py for its busbw column.

One link class (advisor.hardware.CommFit) costs the cheaper of NCCL's two bulk protocols, as NCCL's
tuner picks the protocol with the lower predicted time per call (src/graph/tuning.cc):
    t(n, S) = max(floor(n), alpha(n) + bus_factor(n) * min(X_simple, X_ll128) / B_link)
    X_simple  = S_simple / eff(n, S_simple)
    S_simple  = S + loop_quantization * (ceil(S / L) * L - S) + simple_fill_MiB_per_rank * n,
                L = loop_MiB_per_rank * n
              Simple moves data in loops of nchannels x nranks x chunk; a partly filled last loop
              costs part of a full one, which is the sawtooth visible in nccl-tests sweeps (period
              L: 3 MiB per rank on 2..8 A100s). Its chunks go through a pipeline of FIFO slots on
              each of the ring's steps: filling and draining it costs like moving
              simple_fill_MiB_per_rank more per rank, so Simple is slow for small messages.
    X_ll128   = S / (ll128_bandwidth_ratio * eff(n, S))                    (absent when the ratio is 0)
              LL128 sends 128-byte lines with an 8-byte flag in each (120 bytes of data), so it has
              no loop handshakes or pipeline to fill, and a lower peak rate than Simple.
    alpha(n)  = latency_us + latency_per_hop_us * (n - 1)           ring/tree start-up, per hop
    eff(n, x) = bandwidth_efficiency * (1 - group_penalty / n)       large-message busbw / link rate;
                * (x / (x + half_size)) ** half_size_exponent        small messages fill fewer channels
    floor(n)  = floor_us + floor_per_hop_us * (n - 1)               the smallest launch-to-completion time
and where the profile has one, NCCL's low-latency path for small messages (LL; NVLS or tree on the
systems that have them) is taken when faster:
    t_LL      = ll_latency_us + bus_factor(n) * S / (ll_bandwidth_ratio * eff(n) * B_link)
With the exponent at most 1, x / eff(n, x) never decreases with x, and every protocol's time never
decreases with S: neither does their minimum.
The parameters are fitted per profile by ``advisor calibrate`` (advisor.calibrate).

Across nodes a group of n GPUs with g of them in each of k nodes is costed two ways, and the cheaper
is taken and named:
- one NIC share per GPU (all-gather and reduce-scatter; an all-reduce never does worse): busbw bounded by
  each GPU's share of its node's network (and the intra link); the share stretches the bandwidth term
  only, the start-up latency is the link's (``link_time(..., share)``).
- all of the node's NICs (all-reduce): NCCL runs one channel per NIC, so each GPU's NIC carries 1/g of
  the node's traffic, and the NVLink hops inside the node run at the same time as the NIC hops. How many
  bytes cross depends on the algorithm NCCL ran in the sweep the inter-node fit comes from
  (``CommFit.algorithm``): its ring sends 2(n-1)/n x S/g per NIC, so busbw tops out at the node's NIC
  rate whatever the node count (the 2x p4d, 3x A100 HDR and 4x B200 sweeps: 0.88-0.96 of it); its
  2-node tree sends 2(k-1)/k x S/g (half at k = 2; the 2x A3 Mega sweep reaches 339 GB/s busbw on 200
  GB/s of NICs). Costed as intra-node reduce-scatter, those bytes across the k nodes, intra-node
  all-gather, pipelined: the NVLink phases and the NIC phase run at once, the slower sets the time, and
  each phase's start-up is paid once, t = max(t_in_node - a_in, t_inter - a_inter) + a_in + a_inter (a:
  a phase's time for one byte; the start-up grows with k, not n, as NCCL takes its tree for small
  messages). Summing the phases instead cannot reproduce a 2-node sweep that beats the NIC line rate:
  the A3 Mega sweep comes out within 10% on average (max 29%) pipelined, and 32% (max 66%) summed.
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



def link_time(coll: Collective | str, n: Any, size_bytes: Any, link: Link, share: float = 1.0) -> Any:
    """Seconds for one collective of ``size_bytes`` per rank over ``n`` ranks on one link class.

    ``size_bytes`` is the nccl-tests "size": the buffer each rank contributes (all-reduce), or the
    full output (all-gather) / full input (reduce-scatter). Zero ranks-1 or zero bytes cost nothing.
    ``share``: the fraction of the link's bandwidth this rank gets when others use it at the same time
    (a GPU's share of its node's NICs); it stretches the bandwidth term only, not the latency.
    """
    f = link.fit
    # 1-d and of one shape, so that the in-place steps below (the search costs millions of plans a
    # second, and temporary arrays are most of that time) also work for scalars
    n, S = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(size_bytes, dtype=float))
    shape = n.shape
    n, S = n.reshape(-1), S.reshape(-1)
    nn = np.maximum(n, 2.0)
    hops = nn - 1.0
    S_simple = S  # Simple's bytes: the loop padding and the pipeline fill count as moved data
    if f.loop_MiB_per_rank > 0 and f.loop_quantization > 0:
        L = (f.loop_MiB_per_rank * MiB) * nn
        S_simple = np.divide(S, L)
        np.ceil(S_simple, out=S_simple)
        S_simple *= L
        S_simple -= S
        S_simple *= f.loop_quantization
        S_simple += S
    if f.simple_fill_MiB_per_rank > 0:
        S_simple = S_simple + (f.simple_fill_MiB_per_rank * MiB) * nn
    moved = S_simple / _size_ramp(S_simple, f)
    if f.ll128_bandwidth_ratio > 0:
        # LL128 can only be faster where S / ratio < S_simple (both ramps grow with size): cost it there
        ll = S < S_simple * f.ll128_bandwidth_ratio
        S_ll = S[ll]
        moved[ll] = np.minimum(moved[ll], S_ll / (f.ll128_bandwidth_ratio * _size_ramp(S_ll, f)))
    eff = f.bandwidth_efficiency - (f.bandwidth_efficiency * f.group_penalty) / nn
    t = moved
    t *= bus_factor(coll, nn)
    t /= (link.bandwidth_bytes_per_s * share) * eff
    t += (f.latency_us * us) + (f.latency_per_hop_us * us) * hops
    if f.floor_us > 0 or f.floor_per_hop_us > 0:
        np.maximum(t, (f.floor_us * us) + (f.floor_per_hop_us * us) * hops, out=t)
    if f.ll_bandwidth_ratio > 0:  # the low-latency path, where it is faster (small messages)
        ll = (f.ll_latency_us * us) + S * bus_factor(coll, nn) / ((link.bandwidth_bytes_per_s * share) * eff * f.ll_bandwidth_ratio)
        np.minimum(t, ll, out=t)
    t[(n <= 1) | (S <= 0)] = 0.0
    return t.reshape(shape)


def _size_ramp(x: Any, f) -> Any:
    """(x / (x + half_size)) ** exponent: the fraction of the large-message rate that x bytes reach."""
    if f.half_size_MiB <= 0:
        return 1.0
    r = x + f.half_size_MiB * MiB
    np.divide(x, r, out=r)
    r += 1e-30
    return np.power(r, f.half_size_exponent, out=r)


def _startup(time_of_one_byte, ranks: Any) -> Any:
    """A phase's time for one byte, per entry of ``ranks``: it depends on the rank count alone, so it is computed
    once per distinct count (the search passes a few distinct counts over many plans)."""
    ranks = np.asarray(ranks, dtype=float)
    top = float(ranks.max()) if ranks.size else 0.0
    if 1.0 <= ranks.min(initial=1.0) and top <= 65536 and np.all(ranks == np.floor(ranks)):
        # whole rank counts: a table over 1..max, looked up, is cheaper than sorting the plans to find them
        table = np.asarray(time_of_one_byte(np.arange(1.0, top + 1.0)), dtype=float)
        return table[ranks.astype(np.intp) - 1]
    distinct, where = np.unique(ranks, return_inverse=True)
    return np.asarray(time_of_one_byte(distinct), dtype=float)[where.reshape(ranks.shape)]


def collective_time(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any,
                    where: Any = None) -> Any:
    """Seconds for a collective over ``n`` GPUs placed ``per_node`` to a node (vectorised).

    Groups that fit in one node use the intra-node link; groups that span nodes take the cheaper of
    the ring bottleneck and the hierarchical algorithm (see module docstring). ``where``: a mask of the
    plans that run this collective; the others get 0 without being costed (a search's plans mostly share
    one kind, and costing a collective for every plan takes as long as the rest of the evaluation).
    """
    if where is None:
        return collective_time_and_path(coll, n, size_bytes, hw, per_node)[0]
    shape = np.broadcast_shapes(np.shape(where), np.shape(n), np.shape(size_bytes), np.shape(per_node))
    mask = np.broadcast_to(np.asarray(where, dtype=bool), shape)
    out = np.zeros(shape)
    if mask.any():
        n, size_bytes, per_node = (np.broadcast_to(np.asarray(a, dtype=float), shape)[mask] for a in (n, size_bytes, per_node))
        out[mask] = collective_time_and_path(coll, n, size_bytes, hw, per_node)[0]
    return out


def collective_time_and_path(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any):
    """(seconds, path) where path is 0 intra-node, 1 one NIC share per GPU, 2 all the node's NICs."""
    c = Collective(coll)
    n, S, per_node = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(size_bytes, dtype=float),
                                         np.asarray(per_node, dtype=float))
    g = np.clip(per_node, 1.0, np.maximum(n, 1.0))
    k = np.ceil(n / g)
    t = link_time(c, n, S, hw.intra_node)
    path = np.zeros(n.shape, dtype=int)
    multi = k > 1
    if np.any(multi):  # the search's TP groups never leave a node: cost the network paths only where used
        ring, hier = _across_nodes(c, n[multi], S[multi], g[multi], k[multi], t[multi], hw)
        t[multi] = np.minimum(ring, hier)
        path[multi] = np.where(hier < ring, 2, 1)
    return np.where((n <= 1) | (S <= 0), 0.0, t), path


def _across_nodes(c: Collective, n: Any, S: Any, g: Any, k: Any, intra: Any, hw: Hardware) -> tuple[Any, Any]:
    """(one NIC share per GPU, all the node's NICs) seconds for n GPUs spanning k nodes, g in each."""
    # One NIC share per GPU: busbw bounded by each GPU's share of its node's NICs (rail-optimised nodes: one
    # NIC per GPU), and by the intra-node link. This is what ZeRO-3's all-gathers over thousands of GPUs
    # measured (Narayanan et al. 2021 Table 2, 175B, pure dp, one micro-batch per GPU per step at 768 and
    # 1536 GPUs: both 66.7 s, for ~1.4 TB of gathers and reduce-scatters per GPU, 3 x 349 GB + 349 GB:
    # 21 GB/s per GPU, 0.85 x the 25 GB/s NIC share). An ideal node-contiguous ring would send only 1/g of
    # each GPU's data over the network (busbw up to g x share, g GPUs of the group per node); costed so,
    # those ZeRO-3 rows come out 2.5x too fast. The multi-node sweeps we have are all-reduces, which the
    # path below costs with every NIC of the node busy.
    share = hw.inter_node_share_per_gpu
    ring = np.maximum(link_time(c, n, S, hw.inter_node, share), intra)
    if c is not Collective.all_reduce:
        # NCCL has no hierarchical algorithm for all-gather / reduce-scatter alone: those stay on the ring.
        return ring, ring
    # All-reduce on all the node's NICs (module docstring): intra-node reduce-scatter, the bytes of NCCL's
    # ring or tree across the k nodes on each GPU's NIC share, intra-node all-gather, pipelined.
    per_nic = S / g  # each GPU's NIC carries 1/g of the node's traffic; the tree's 2(k-1)/k x that
    if hw.inter_node.fit.algorithm != "tree":  # the ring's bytes, 2(n-1)/n x S/g per NIC; the start-up stays k's
        per_nic = per_nic * bus_factor(c, n) / bus_factor(c, k)
    inter_part = link_time(c, k, per_nic, hw.inter_node, share)
    in_node = (link_time(Collective.reduce_scatter, g, S, hw.intra_node)
               + link_time(Collective.all_gather, g, S, hw.intra_node))
    in_node0 = _startup(lambda x: link_time(Collective.reduce_scatter, x, 1.0, hw.intra_node)
                        + link_time(Collective.all_gather, x, 1.0, hw.intra_node), g)
    inter0 = _startup(lambda x: link_time(c, x, 1.0, hw.inter_node, share), k)
    hier = np.maximum(in_node - in_node0, inter_part - inter0) + in_node0 + inter0
    return ring, hier


PATH_NAMES = {0: "intra-node", 1: "across nodes, one NIC share per GPU", 2: "across nodes on all the node's NICs"}


def p2p_time(size_bytes: Any, hw: Hardware, across_nodes: Any) -> Any:
    """Point-to-point send/recv between neighbouring pipeline stages (one message per GPU; across nodes every
    GPU of a stage sends at once, each on its share of the node's network)."""
    intra = link_time(Collective.send_recv, 2, size_bytes, hw.intra_node)
    share = hw.inter_node_share_per_gpu
    inter = link_time(Collective.send_recv, 2, size_bytes, hw.inter_node, share)
    return np.where(np.asarray(across_nodes, dtype=bool), inter, intra)
