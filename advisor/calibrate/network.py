"""Calibrate the inter-node network from collectives over whole multi-node groups (no torch here).

A collective over every GPU of k nodes (g per node) is what data parallelism across nodes runs, and the
model costs it through advisor.comm.collective_time (an all-reduce: reduce-scatter in the node, NCCL's ring
or tree across the nodes on all their NICs, all-gather in the node). This fits the inter-node ``CommFit`` through that same function, the intra-node
link held at its own fit, so the fitted profile reproduces the measured sweep by the path the estimates
use. Free: latency_us, bandwidth_efficiency, half_size_MiB, half_size_exponent, and latency_per_hop_us
when more than one node count was measured (one count cannot separate it from latency_us); and the
algorithm, ring unless the tree fits clearly better (by 5%).

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
_STARTS = ((1.0, 1.0, 1.0, 1.0), (0.1, 0.5, 10.0, 0.3), (5.0, 0.95, 0.1, 1.0))  # multipliers of the start


def fit_world(base: Hardware, collective: str, n: np.ndarray, per_node: np.ndarray, S: np.ndarray, t: np.ndarray,
              judge_from_bytes: float = 4 * MiB) -> tuple[Link, FitReport]:
    """The base profile's inter-node link refitted to times ``t`` of ``collective`` over ``n`` GPUs placed
    ``per_node`` to a node, and the fit's report. Sizes below ``judge_from_bytes`` weigh 0.3 and are
    not judged (as advisor.calibrate.links.fit_link)."""
    from advisor.comm import collective_time

    n, g, S, t = (np.asarray(a, dtype=float) for a in (n, per_node, S, t))
    if np.all(np.ceil(n / np.maximum(g, 1.0)) <= 1):
        raise CalibrationError(f"{collective}: every measured group fits in one node; nothing to fit the network to")
    if len(S) < 4:
        raise CalibrationError(f"{collective}: {len(S)} multi-node sizes measured, need at least 4")
    nodes = np.unique(np.ceil(n / g))
    free = _FREE + ((_HOP,) if len(nodes) > 1 else ())
    names = [f[0] for f in free]
    lo, hi = np.array([f[1] for f in free]), np.array([f[2] for f in free])
    judged = judged_sizes(S, judge_from_bytes)
    w = np.where(judged, 1.0, 0.3)

    def hw_with(x, algorithm: str) -> Hardware:
        link = link_with_fit(base.inter_node, {**dict(zip(names, x)), "algorithm": algorithm})
        return base.model_copy(update={"inter_node": link})

    def pred(x, algorithm: str):
        return collective_time(collective, n, S, hw_with(x, algorithm), g)

    # NCCL's ring or its tree across nodes (advisor.comm): both are fitted, and the tree is kept only where it
    # fits clearly better (one 2-node sweep cannot tell them apart unless it beats the ring's NIC-rate bound).
    best = None
    for algorithm in ("ring", "tree"):
        for mult in _STARTS:
            x0 = np.clip([f[3] * m for f, m in zip(free, mult + (1.0,) * (len(free) - len(mult)))], lo, hi)
            x = least_squares(lambda x: w * np.log(pred(x, algorithm) / t), x0, lo, hi)
            err = np.abs(pred(x, algorithm)[judged] / t[judged] - 1)
            score = (err.max() + err.mean()) * (1.0 if algorithm == "ring" else 1.05)
            if best is None or score < best[1]:
                best = (x, score, algorithm)
    values = {**fitted(dict(zip(names, best[0]))), "algorithm": best[2]}
    link = base.inter_node.model_copy(update={"fit": CommFit(**{**base.inter_node.fit.model_dump(), **values})})
    hw = base.model_copy(update={"inter_node": link})
    what = (f"world {collective} (n={','.join(str(int(v)) for v in np.unique(n))}, {int(g.max())} per node, "
            f"inter-node fit, NCCL {best[2]} across nodes)")
    return link, fit_report(collective_time(collective, n, S, hw, g), n, S, t, [], what, judge_from_bytes)
