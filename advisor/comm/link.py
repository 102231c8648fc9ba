"""One link class: the alpha-beta cost of NCCL collectives on it, with NCCL's protocols.

The measured quantity is defined as nccl-tests defines it (doc/PERFORMANCE.md in NVIDIA/nccl-tests):
``algbw = S / t`` and ``busbw = algbw * bus_factor(n)``, where the bus factor turns algorithm
bandwidth into the bandwidth each rank's link actually carries in a ring:
    all_reduce 2(n-1)/n, all_gather (n-1)/n, reduce_scatter (n-1)/n, broadcast/reduce/send_recv 1,
    all_to_all (n-1)/n (each rank sends S/n to each of the n-1 others: (n-1)/n x S leaves every rank).
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
PCIe without peer-to-peer (NCCL_P2P_DISABLE=1, ``titan-rtx-pcie``) stages through host memory; the
profile's pcie bandwidth is that staged path's effective rate.

Groups across nodes and NVLink domains: advisor.comm.network.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np

from advisor.hardware import Link
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



def link_time(coll: Collective | str, n: Any, size_bytes: Any, link: Link, share: Any = 1.0) -> Any:
    """Seconds for one collective of ``size_bytes`` per rank over ``n`` ranks on one link class.

    ``size_bytes`` is the nccl-tests "size": the buffer each rank contributes (all-reduce), or the
    full output (all-gather) / full input (reduce-scatter). Zero ranks-1 or zero bytes cost nothing.
    ``share``: the fraction of the link's bandwidth this rank gets when others use it at the same time
    (a GPU's share of its node's NICs; a number, or one per entry); it stretches the bandwidth term only, not
    the latency.
    """
    f = link.fit
    # 1-d and of one shape, so that the in-place steps below (the search costs millions of plans a
    # second, and temporary arrays are most of that time) also work for scalars
    n, S = np.broadcast_arrays(np.asarray(n, dtype=float), np.asarray(size_bytes, dtype=float))
    shape = n.shape
    n, S = n.reshape(-1), S.reshape(-1)
    if np.ndim(share):  # one share per entry (a group's share of the network, advisor.comm.network)
        share = np.broadcast_to(np.asarray(share, dtype=float), shape).reshape(-1)
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
    x = np.maximum(x, 0.0)  # an empty call (S <= 0, costed 0 by the caller) must not raise a power of a negative
    r = x + f.half_size_MiB * MiB
    np.divide(x, r, out=r)
    r += 1e-30
    return np.power(r, f.half_size_exponent, out=r)


def startup(time_of_one_byte, ranks: Any) -> Any:
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
