"""Communication: the time of NCCL collectives over a group of GPUs, inside a node, an NVLink domain, or across
the network.

- ``advisor.comm.link``: one link class's alpha-beta-protocol model (``link_time``) and nccl-tests' bus factors;
- ``advisor.comm.network``: groups across nodes and NVLink domains, the NICs a group owns and the algorithm NCCL's
  tuner picks (ring, tree / NVLS-tree, CollNet, pairwise all-to-all).

``collective_time`` is what the cost model calls; ``collective_time_and_path`` also names the algorithm each
entry ran (``PATH_NAMES``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.comm import network
from advisor.comm.link import Collective, bus_factor, link_time, startup
from advisor.distinct import DISTINCT_FROM, distinct, on_distinct
from advisor.hardware import Hardware

PATH_NAMES = {network.IN_NODE: "NVLink in one node", network.IN_DOMAIN: "NVLink domain across nodes",
              network.RING: "ring across nodes", network.TREE: "tree across nodes",
              network.COLLNET: "CollNet (in-network reduction)", network.PAIRWISE: "pairwise across nodes"}


def collective_time(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any,
                    where: Any = None) -> Any:
    """Seconds for a collective over ``n`` GPUs placed ``per_node`` to a node (vectorised).

    Groups inside one NVLink domain use its link; groups that span domains take the fastest of the algorithms
    NCCL has there, on the NICs their GPUs own (advisor.comm.network). ``where``: a mask of the plans that run
    this collective; the others get 0 without being costed (a search's plans mostly share one kind, and costing
    a collective for every plan takes as long as the rest of the evaluation).
    """
    if where is None:
        return collective_time_and_path(coll, n, size_bytes, hw, per_node)[0]
    return collective_time_and_path_where(coll, n, size_bytes, hw, per_node, where)[0]


def collective_time_and_path_where(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any,
                                   where: Any) -> tuple[Any, Any]:
    """collective_time_and_path costed only where ``where`` holds: elsewhere 0 seconds on path IN_NODE."""
    shape = np.broadcast_shapes(np.shape(where), np.shape(n), np.shape(size_bytes), np.shape(per_node))
    mask = np.broadcast_to(np.asarray(where, dtype=bool), shape)
    out, path = np.zeros(shape), np.full(shape, network.IN_NODE)
    if mask.any():
        rows = np.nonzero(mask)  # indexing with these is cheaper than with the mask, three arguments over
        n, size_bytes, per_node = (np.broadcast_to(np.asarray(a, dtype=float), shape)[rows] for a in (n, size_bytes, per_node))
        out[rows], path[rows] = collective_time_and_path(coll, n, size_bytes, hw, per_node)
    return out, path


# From DISTINCT_FROM entries on, a collective is costed once per distinct (n, size, per_node) and the result
# scattered back: a search's plans share a few hundred distinct collectives, and costing every entry (the size
# ramps' powers, the network's algorithms) takes several times longer than finding the distinct ones.


def collective_time_and_path(coll: Collective | str, n: Any, size_bytes: Any, hw: Hardware, per_node: Any):
    """(seconds, path) where path is a key of PATH_NAMES: the link or the algorithm across nodes that ran it."""
    c = Collective(coll)
    n, S, per_node = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(size_bytes, dtype=float),
                                         np.asarray(per_node, dtype=float))
    if n.size < DISTINCT_FROM:
        return _costed(c, n, S, hw, per_node)
    shape = n.shape
    n, S, per_node = n.ravel(), S.ravel(), per_node.ravel()
    rows, inverse = distinct(n, S, per_node)
    t, path = _costed(c, n[rows], S[rows], hw, per_node[rows])
    return t[inverse].reshape(shape), path[inverse].reshape(shape)


def _costed(c: Collective, n: Any, S: Any, hw: Hardware, per_node: Any):
    """collective_time_and_path on broadcast float arrays, entry by entry."""
    g, g_dom, k = network.domain_groups(n, per_node, hw)
    nodes = np.ceil(n / g)
    path = np.where(nodes > 1, network.IN_DOMAIN, network.IN_NODE)
    multi = k > 1
    if not np.any(multi):  # the search's TP groups never leave a domain: cost the network only where used
        t = np.asarray(link_time(c, n, S, hw.intra_node), dtype=float)
    else:
        t = np.zeros(n.shape)
        inside = ~multi
        if np.any(inside):
            t[inside] = link_time(c, n[inside], S[inside], hw.intra_node)
        t[multi], path[multi] = network.across(c, n[multi], S[multi], g_dom[multi], k[multi], nodes[multi], hw)
    return np.where((n <= 1) | (S <= 0), 0.0, t), path


def algorithm_name(path: int, hw: Hardware) -> str:
    """The algorithm a path code stands for on this system (NCCL's tree is NVLS-tree where the NVSwitch reduces)."""
    if path == network.TREE and hw.intra_node.nvls:
        return "NVLS-tree across nodes"
    if path == network.IN_NODE and hw.intra_node.kind.value == "pcie":  # through the host bridge, not NVLink
        return "PCIe in one node"
    return PATH_NAMES[int(path)]


def beside(comm_s: Any, compute_s: Any, held: Any) -> Any:
    """Seconds a collective of ``comm_s`` adds to the ``compute_s`` it runs beside when its kernels hold ``held`` of
    the GPU's SMs: the compute runs on the rest while it lasts and does the work it lost after, so the pair ends at
    max(comm, compute + comm x held) (userbuffers' bulk overlaps, the flex dispatcher's all-to-alls)."""
    return np.maximum(comm_s, compute_s + comm_s * held) - compute_s


# NVLS channels across nodes (ncclNvlsTuning; reference/nccl_tuning_model.md s.7): 16 on sm90, 32 on sm100 multi-node
# (the summary also names SM100 NVLS-tree overrides by NIC bandwidth, not given there: the B200 count is unverified)
NVLS_TREE_CHANNELS = {False: 16, True: 32}  # keyed by GPU.block_scaling (Blackwell, sm_100+)


def held_sms(n: Any, per_node: Any, hw: Hardware, path: Any = None) -> Any:
    """The share of a GPU's SMs NCCL's kernels hold while a collective over ``n`` GPUs (``per_node`` of them in each
    node) runs: one thread block per runtime channel, the NVLink domain's channels for a group inside it, the
    network's for one across domains (every rank of a ring runs all of its channels). 0 where the profile does not
    give its SM count or the link's channels. The link's count is its ring's (all-gather and reduce-scatter run no
    other algorithm across nodes); an all-reduce whose ``path`` (collective_time_and_path's) is the tree on an
    NVSwitch that reduces runs as NCCL's NVLS-tree, on the NVLS channels (NVLS_TREE_CHANNELS)."""
    n, per_node = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(per_node, dtype=float))
    sms, chans = hw.gpu.sm_count, [link.nccl_channels for link in (hw.intra_node, hw.inter_node)]
    if sms is None or chans == [None, None]:
        return np.zeros(n.shape)
    # a network whose channels the profile does not give holds the node's: a collective across nodes is never free
    # beside the compute where one inside the node is not (its ring runs through the node's NVLink as well)
    inside, across = (chans[0] or 0) / sms, (chans[1] if chans[1] is not None else chans[0] or 0) / sms
    # a search's plans share a handful of groups: each costed once
    share = on_distinct(lambda g, p: _held(g, p, hw, inside, across), n, per_node)
    if path is None or not hw.intra_node.nvls:
        return share
    return np.where(np.asarray(path) == network.TREE, NVLS_TREE_CHANNELS[hw.gpu.block_scaling] / sms, share)


def _held(n: Any, per_node: Any, hw: Hardware, inside: float, across: float) -> Any:
    _, _, k = network.domain_groups(n, per_node, hw)
    return np.where(n <= 1, 0.0, np.where(k > 1, across, inside))


def p2p_time(size_bytes: Any, hw: Hardware, across_nodes: Any) -> Any:
    """Point-to-point send/recv between neighbouring pipeline stages (one message per GPU; across the network every
    GPU of a stage sends at once, each on its own share of its node's NICs)."""
    size, across = np.broadcast_arrays(np.asarray(size_bytes, dtype=float), np.asarray(across_nodes, dtype=float))
    if size.size >= DISTINCT_FROM:  # as collective_time_and_path: each distinct message costed once
        shape, size, across = size.shape, size.ravel(), across.ravel()
        rows, inverse = distinct(size, across)
        return _p2p(size[rows], hw, across[rows])[inverse].reshape(shape)
    return _p2p(size, hw, across)


def _p2p(size: Any, hw: Hardware, across: Any) -> Any:
    intra = link_time(Collective.send_recv, 2, size, hw.intra_node)
    inter = link_time(Collective.send_recv, 2, size, hw.inter_node, 1.0 / hw.gpus_per_node)
    return np.where(across.astype(bool), inter, intra)


__all__ = ["Collective", "PATH_NAMES", "algorithm_name", "bus_factor", "collective_time", "collective_time_and_path",
           "collective_time_and_path_where", "held_sms", "link_time", "p2p_time", "startup"]
