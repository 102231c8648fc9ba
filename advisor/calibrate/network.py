"""Calibrate the inter-node network from collectives over whole multi-node groups (no torch here).

A collective over every GPU of k nodes (g per node) is what data parallelism across nodes runs, and the
model costs it through advisor.comm.collective_time (an all-reduce: reduce-scatter in the node, NCCL's ring
or tree across the nodes on all their NICs, all-gather in the node). This fits the inter-node ``CommFit`` through that same function, the intra-node
link held at its own fit, so the fitted profile reproduces the measured sweep by the path the estimates
use. Free: latency_us, bandwidth_efficiency, half_size_MiB, half_size_exponent, and latency_per_hop_us
when more than one node count or collective was measured (one count of hops cannot separate it from
latency_us); and the
algorithms, NCCL's ring alone unless ring-or-tree fits clearly better (by 5%), with the tree's own size ramp
(tree_half_size_MiB). Several collectives measured on the same nodes may be fitted together.

Used by ``advisor calibrate`` for "world" rows (advisor.calibrate.microbench measures them under torchrun on
several nodes) and for published multi-node sweeps (validation/fit_collectives.py).
"""

from __future__ import annotations

import numpy as np

from advisor.calibrate.fitting import (
    FitReport,
    fit_report,
    fitted,
    judged_sizes,
    least_squares,
    link_with_fit,
)
from advisor.hardware import CommFit, Hardware, Link
from advisor.calibrate.measurements import CalibrationError
from advisor.units import MiB

# (field, lower, upper, start)
_FREE = (("latency_us", 0.0, 1e4, 10.0), ("bandwidth_efficiency", 1e-3, 1.0, 0.8),
         ("half_size_MiB", 0.0, 1e4, 8.0), ("half_size_exponent", 0.0, 1.0, 0.5))
_HOP = ("latency_per_hop_us", 0.0, 1e3, 5.0)
_TREE = ("tree_half_size_MiB", 0.0, 1e5, 100.0)
_STARTS = ((1.0, 1.0, 1.0, 1.0), (0.1, 0.5, 10.0, 0.3), (5.0, 0.95, 0.1, 1.0))  # multipliers of the start


def fit_world(base: Hardware, collective, n: np.ndarray, per_node: np.ndarray, S: np.ndarray, t: np.ndarray,
              judge_from_bytes: float = 4 * MiB, algorithms: tuple[str, ...] = ("ring", "tree")) -> tuple[Link, FitReport]:
    """The base profile's inter-node link refitted to times ``t`` of ``collective`` (a name, or one per point:
    several collectives are fitted together) over ``n`` GPUs placed ``per_node`` to a node, and the fit's report.
    Sizes below ``judge_from_bytes`` weigh 0.3 and are not judged (as advisor.calibrate.links.fit_link).
    ``algorithms``: the fit.algorithm values tried ("ring": NCCL's ring alone; "tree": ring or tree)."""
    from advisor.comm import collective_time

    n, g, S, t = (np.asarray(a, dtype=float) for a in (n, per_node, S, t))
    colls = np.broadcast_to(np.asarray(collective, dtype=object), S.shape)
    names = "+".join(sorted(set(colls.tolist())))
    if np.all(np.ceil(n / np.maximum(g, 1.0)) <= 1):
        raise CalibrationError(f"{names}: every measured group fits in one node; nothing to fit the network to")
    if len(S) < 4:
        raise CalibrationError(f"{names}: {len(S)} multi-node sizes measured, need at least 4")
    # the per-hop start-up is told apart from the constant one by several node counts, or by collectives that cross
    # a different number of hops (a 2-node tree all-reduce 2, a ring all-gather 1)
    several_hops = len(np.unique(np.ceil(n / g))) > 1 or len(set(colls.tolist())) > 1
    judged = judged_sizes(S, judge_from_bytes)
    w = np.where(judged, 1.0, 0.3)

    def pred_with(hw: Hardware):
        out = np.empty(S.shape)
        for c in set(colls.tolist()):
            m = colls == c
            out[m] = collective_time(c, n[m], S[m], hw, g[m])
        return out

    # NCCL's ring alone, or ring and tree as its tuner picks (advisor.comm.network): both are fitted, and the tree is
    # kept only where it fits clearly better (one 2-node sweep cannot tell them apart unless it beats the ring's bound)
    best = None
    # the tree's own ramp is fitted, or held at 0 (the ring's ramp on S / n): one cannot reach the other continuously
    variants = [(a, t) for a in algorithms for t in ((False, True) if a == "tree" and "all_reduce" in set(colls.tolist())
                                                    else (False,))]
    for algorithm, tree in variants:
        free = _FREE + ((_HOP,) if several_hops else ()) + ((_TREE,) if tree else ())
        keys = [f[0] for f in free]
        lo, hi = np.array([f[1] for f in free]), np.array([f[2] for f in free])

        def pred(x):
            link = link_with_fit(base.inter_node, {"tree_half_size_MiB": 0.0, **dict(zip(keys, x)), "algorithm": algorithm})
            return pred_with(base.model_copy(update={"inter_node": link}))

        for mult in _STARTS:
            x0 = np.clip([f[3] * m for f, m in zip(free, mult + (1.0,) * (len(free) - len(mult)))], lo, hi)
            x = least_squares(lambda x: w * np.log(pred(x) / t), x0, lo, hi)
            err = np.abs(pred(x)[judged] / t[judged] - 1)
            score = (err.max() + err.mean()) * (1.0 if algorithm == "ring" else 1.05)
            if best is None or score < best[1]:
                best = ({"tree_half_size_MiB": 0.0, **dict(zip(keys, x))}, score, algorithm)
    values = {**fitted(best[0]), "algorithm": best[2]}
    link = base.inter_node.model_copy(update={"fit": CommFit(**{**base.inter_node.fit.model_dump(), **values})})
    hw = base.model_copy(update={"inter_node": link})
    what = (f"world {names} (n={','.join(str(int(v)) for v in np.unique(n))}, {int(g.max())} per node, "
            f"inter-node fit, NCCL {'ring' if best[2] == 'ring' else 'ring or tree'} across nodes)")
    return link, fit_report(pred_with(hw), n, S, t, [], what, judge_from_bytes)
