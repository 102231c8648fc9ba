"""Collectives across nodes and NVLink domains: which NICs a group uses, and the algorithm NCCL's tuner picks.

A group of n GPUs with g of them in each of k NVLink domains (a domain is one node, except where a profile joins
nodes into one, as the 18 trays of an NVL72 rack) runs on the domain's NVLink link when k = 1, and across the
network otherwise.

Which NICs. Every GPU owns an equal share of its node's NICs, B_gpu = the node's NIC rate / gpus_per_node (one
400 Gb/s NIC per GPU on a DGX H100, four 100 Gb/s EFA NICs per GPU on a p5, half a 100 Gb/s NIC on a p4d). A group
with g GPUs in a domain crosses the network on the g shares its GPUs own: NCCL spreads its channels over them (a
ring channel enters and leaves a node through one NIC, the channels take the NICs round-robin, and PXN lets a GPU
send through the NIC beside another GPU of its node; nccl_tuning_model.md s.5). The groups that run at the same
time use their own GPUs' shares: the tp ranks of a node each run their own data-parallel group, each on its own
NICs. A group never gets more than its GPUs own (one running alone could borrow idle NICs through PXN: left out).

The algorithms (NCCL 2.30, src/graph/tuning.cc, connect.cc, trees.cc; summarised in nccl_tuning_model.md), by
the bytes X each GPU's NIC share carries and the network hops of their start-up:
- ring (all-reduce, all-gather, reduce-scatter, broadcast, reduce): every channel is one ring through all n ranks
  that crosses each domain boundary once, so a domain's NICs carry bus_factor(n) x S, X = bus_factor(n) x S / g,
  and busbw tops out at the group's NIC rate g x B_gpu x eff at any domain count (p5, 8 GPUs on 3,200 Gb/s:
  all-gather 329/331/294 GB/s busbw on 2/4/8 nodes; maintainers: ~396 GB/s on 8x 400G, 192 on DGX A100's 8x
  200G). Hops: k - 1, and 2(k - 1) for an all-reduce (NCCL's nInter); its start-up also pays every NVLink step
  of the ring beyond the in-node part's, (g - 1)(k - 1) of them (twice for an all-reduce) at NCCL's 3.4 us: on 2x
  p5 that is 24 us of a 32 MiB all-gather's 240, on 8x p5 167 of 710, and on 1,536 A100s 4.5 ms per call.
- tree (all-reduce; NCCL's double binary tree across domains, a chain inside, NVLS-tree on NVLink SHARP nodes):
  at 2 domains each sends S across, half the ring's bytes ("2 nodes is a special case", NCCL's maintainers);
  from 3 domains each is inner in one tree (S/2 up, 2 x S/2 down) and a leaf in the other (S/2): 2S, no less
  than the ring's. X = S/g or 2S/g; hops 2 log2(k). So the tree wins large all-reduces on 2 nodes and small ones
  on many.
- CollNet (all-reduce, where the profile's fabric reduces in its switches: ``fit.collnet``): each domain sends S
  to the switch and receives the sum, X = S/g, one hop.
- pairwise (all-to-all): each GPU sends S/n to every other rank, S (n - g)/n of it across the network on its own
  share (PXN keeps each send on the rail of its peer; "alltoall cannot aggregate the bandwidth of multiple NICs",
  NCCL's maintainers): p5's all-to-all busbw 79/54/50 GB/s on 2/4/8 nodes is 0.84-0.88 of (n-1)/(n-g) x 50 GB/s.
Inside a domain the algorithms' NVLink part is the collective over its g GPUs (an all-reduce as reduce-scatter +
all-gather: on NVSwitch systems with NVLS the fitted one-domain all-reduce rate, which is NVLS's) and for an
all-to-all the sends to the g - 1 local peers. The NVLink and network parts run at once, the slower sets the time,
and each part's start-up (its time for one byte) is paid once: t = max(t_in - a_in, t_net - a_net) + a_in + a_net.
Summing the parts instead cannot reproduce a 2-node sweep that beats the NIC line rate (2x A3 Mega: 339 GB/s busbw
on 200 GB/s of NICs; pipelined within 10% on average, summed 32%). The same bound caps NCCL's 2-node tree by the
node's own all-reduce: 8 H100s all-reduce at ~245 GB/s algbw, and 2x p5 all-reduce at 237-256 GB/s algbw from
2 GiB, where their NICs (400 GB/s) would allow 330.

The tuner: every algorithm the system has is costed and the fastest taken, as NCCL's topoGetAlgoInfo takes the
argmin of its own model (the tree unless the profile's fit says NCCL ran only its ring, ``algorithm: ring``: p4d's
NCCL 2.9.9 sweep), except on 2 domains, where NCCL's model prefers the tree even where the network makes it the
slower: there it prices both at their graph's intra-node bandwidth (bw = bwIntra when nNodes <= 2, tuning.cc;
nccl_tuning_model.md s.3), and its search raises the tree graph's to NVLink's while the ring's stays at the NIC's
(s.4, pass 2: "trees raise only bwIntra, which matters for 2-node"). So a 2-domain all-reduce of several GPUs a
domain runs the tree wherever the profile has it ("On two nodes, NCCL uses the tree (or nvlstree) algorithm",
NVIDIA/nccl-tests issue 196; with one GPU a domain no NVLink raises the tree's rate, and the faster is taken): 2x A3
Mega's all-reduce takes 1.26 ms at 64 MiB where its all-gathers, half a ring all-reduce's bytes, take 0.45-0.52.
An oversubscribed fabric (``oversubscription``) divides the NICs' rate for groups over more than
``full_bisection_nodes`` nodes.

Left out: PAT (NCCL 2.23+, one GPU per node only), the protocols across nodes (the network fit's size ramp stands
for them), hierarchical all-gathers (no NCCL algorithm runs one for several GPUs per node), congestion from other
jobs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.comm.link import Collective, bus_factor, link_time, startup
from advisor.hardware import Hardware
from advisor.units import MiB, us

# NCCL's latency per ring step over NVLink, Simple protocol (hwLat[NVLINK][RING][SIMPLE] = 3.4 us in NCCL 2.30.7's
# tuning.cc; nccl_tuning_model.md s.2): ring start-up = base + (nsteps - nInter) x intraLat + nInter x interLat
NVLINK_RING_STEP_US = 3.4
# path codes (advisor.comm.PATH_NAMES): how a collective ran
IN_NODE, IN_DOMAIN, RING, TREE, COLLNET, PAIRWISE = range(6)


def domain_groups(n: Any, per_node: Any, hw: Hardware) -> tuple[Any, Any, Any]:
    """(GPUs of the group per node, per NVLink domain, domains spanned) for groups laid out node by node (as
    Megatron orders ranks: a group that fills g GPUs of a node fills domain / gpus_per_node nodes of a domain).
    ``per_node`` below 1 is a group strided wider than a node (a data-parallel group beside TP 8 on 4-GPU trays: a
    rank every second tray), which has that fraction of a domain's nodes, not all of them."""
    n = np.maximum(n, 1.0)
    g = np.clip(per_node, 1.0, n)
    g_dom = np.clip(np.asarray(per_node, dtype=float) * (hw.domain_gpus // hw.gpus_per_node), 1.0, n)
    return g, g_dom, np.ceil(n / g_dom)


def across(c: Collective, n: Any, S: Any, g: Any, k: Any, nodes: Any, hw: Hardware) -> tuple[Any, Any]:
    """(seconds, path code) of a collective over n GPUs, g in each of k > 1 NVLink domains (``nodes``: nodes spanned)."""
    intra, fit = hw.intra_node, hw.inter_node.fit
    rate = hw.inter_node_bytes_per_s_per_gpu * fit.bandwidth_efficiency  # one GPU's share of its node's NICs
    osub = hw.inter_node.oversubscription
    if osub > 1.0 and hw.inter_node.full_bisection_nodes is not None:
        rate = np.where(nodes > hw.inter_node.full_bisection_nodes, rate / osub, rate)

    ramps = {}  # one ramp per (chunk, half size): the power is most of this function's time in a search

    def pipelined(in_node: Any, in0: Any, per_gpu: Any, chunk: Any, hops: Any, half_MiB: float) -> Any:
        key = (id(chunk), half_MiB)
        if key not in ramps:
            ramps[key] = ramp(chunk, half_MiB, fit.half_size_exponent)
        net0 = network_startup(fit, hops)
        return np.maximum(in_node - in0, per_gpu / (rate * ramps[key])) + in0 + net0

    if c is Collective.all_to_all:  # S/n to each of the g - 1 local peers over NVLink, the rest on the GPU's NICs
        in_node = link_time(c, g, S * g / n, intra)
        in0 = startup(lambda x: link_time(c, x, 1.0, intra), g)
        t = pipelined(in_node, in0, S * (n - g) / n, S * g / n, k - 1.0, fit.half_size_MiB)
        return t, np.full(np.shape(n), PAIRWISE)
    # an all-reduce's in-node part: reduce-scatter + all-gather, which cost alike (the same bus factor)
    parts = 2.0 if c is Collective.all_reduce else 1.0
    part = Collective.reduce_scatter if c is Collective.all_reduce else c
    in_node = parts * link_time(part, g, S, intra)
    in0 = startup(lambda x: parts * link_time(part, x, 1.0, intra), g)
    steps = 2.0 if c is Collective.all_reduce else 1.0  # NCCL's ring: 2(n-1) steps for an all-reduce, n-1 otherwise
    # the ring's start-up grows with every rank it passes, not with the nodes alone: beyond the g - 1 NVLink steps of
    # the in-node part (its fitted start-up) it takes (g - 1)(k - 1) more, each a step of NCCL's own latency model
    ring_in0 = in0 + steps * (g - 1.0) * (k - 1.0) * NVLINK_RING_STEP_US * us
    chunk = S / n
    best = pipelined(in_node - in0 + ring_in0, ring_in0, bus_factor(c, n) * S / g, chunk, steps * (k - 1.0),
                     fit.half_size_MiB)
    path = np.full(np.shape(n), RING)
    if c is not Collective.all_reduce:
        return best, path
    options = []
    if fit.algorithm != "ring":  # the tree's pipeline carries whole messages: its ramp is on S (tree_half_size_MiB)
        tree_ramp = (S, fit.tree_half_size_MiB) if fit.tree_half_size_MiB > 0 else (chunk, fit.half_size_MiB)
        options.append((TREE, np.where(k <= 2, 1.0, 2.0) * S / g, *tree_ramp, 2.0 * np.floor(np.log2(np.maximum(k, 2.0)))))
    if fit.collnet:
        options.append((COLLNET, S / g, chunk, fit.half_size_MiB, np.ones(np.shape(k))))
    for code, per_gpu, chunk, half, hops in options:
        alt = pipelined(in_node, in0, per_gpu, chunk, hops, half)
        take = (alt < best) | ((code == TREE) & (k <= 2) & (g > 1))  # NCCL's 2-domain tree (module doc: the tuner)
        path = np.where(take, code, path)
        best = np.where(take, alt, best)
    return best, path


def ramp(chunk: Any, half_MiB: float, exponent: float) -> Any:
    """(x / (x + half)) ** exponent of the bytes each rank moves per step (S/n on a ring: p5's all-gather busbw is the
    same at 16, 32 and 64 GPUs for equal S/n, 131-144 GB/s at 2 MiB, 200-215 at 4 MiB): the fraction of the
    large-message rate that size reaches."""
    if half_MiB <= 0:
        return 1.0
    return (chunk / (chunk + half_MiB * MiB) + 1e-30) ** exponent


def network_startup(fit: Any, hops: Any) -> Any:
    """The network part's start-up over ``hops`` network hops: latency_us + latency_per_hop_us per hop (the floor
    where the fit has one)."""
    t = fit.latency_us * us + fit.latency_per_hop_us * us * hops
    if fit.floor_us > 0 or fit.floor_per_hop_us > 0:
        t = np.maximum(t, fit.floor_us * us + fit.floor_per_hop_us * us * hops)
    return t
