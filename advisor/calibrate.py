"""Calibrate: fit a hardware profile's link and efficiency figures to measurements (no torch here).

Inputs are rows of measurements, read from
- our results JSONL (written by validation/microbench.py, one JSON object per measurement),
- nccl-tests CSVs (``all_reduce_<n>gpu.csv``: size(B),count,type,time(ns),busbw,time(ns),busbw), as in
  reference/a100-nccl, a file or a folder of them,
- the reference kernel/optimizer JSONL (reference/h100/kernels.jsonl, optim.jsonl).

Fits
- per link class (intra-node, inter-node) the advisor.hardware.CommFit consumed by advisor.comm.link_time:
  log-time least squares from several starts, then a minimax polish (p-norm continuation and a
  sequential LP on the worst points), since a cost model is judged by its worst size, not its mean.
  The loop size (NCCL's nchannels x chunk per rank) is chosen on a grid by a linear per-group-size
  fit of t = a + b S + c sqrt(S) + d log(S) + e ceil(S / (L n)) over the judged sizes; the nonlinear fit
  then runs at that L. NCCL's two protocols (advisor.comm: LL128 and Simple's pipeline fill) are fitted
  like any other term, from a start that has both.
- ComputeEfficiency (advisor.calibrate_compute): GEMM, fused attention, copy, element-wise and optimizer
  efficiencies from kernel and optimizer measurements;
- the inter-node link from collectives over every GPU of several nodes (advisor.calibrate_network).

The numerical machinery (log-time least squares, the minimax polish, fit reports) is advisor.fitting.
Every fit reports its quality (R^2 of log time, max/mean relative error, points used) and lists outliers
(relative error > OUTLIER_REL) and failed sizes: nothing is dropped silently.
Deliberately left out: fitting the datasheet peaks themselves (they come from the base profile).
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from advisor.calibrate_compute import fit_efficiency
from advisor.calibrate_network import fit_world
from advisor.fitting import (
    MEAN_WEIGHT,
    FitReport,
    fit_report,
    fitted,
    judged_sizes,
    least_squares,
    link_with_fit,
    signed_pow,
    slp_minimax,
)
from advisor.hardware import CommFit, Hardware, Link
from advisor.measurements import (  # noqa: F401  (re-exported: calibrate is the public entry point)
    COLLECTIVES,
    CalibrationError,
    _math_of,
    on_cpu_note,
    parse_sizes,
    read_results,
    refuse_shipped,
    repair_torn_tail,
    write_profile,
    write_text_atomic,
)
from advisor.units import GB, MiB

LOOP_GRID_MIB = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


# ---------------------------------------------------------------------------------------------- reading


# (field, lower, upper): the CommFit fields the fit moves; loop_MiB_per_rank is chosen on a grid.
# half_size_exponent stays <= 1 so that the time never decreases with size (advisor.comm).
_FREE = (("latency_us", 0.0, 1e4), ("latency_per_hop_us", 0.0, 1e3), ("bandwidth_efficiency", 1e-4, 1.0),
         ("group_penalty", 0.0, 1.9), ("half_size_MiB", 0.0, 1e6), ("half_size_exponent", 0.0, 1.0),
         ("loop_quantization", 0.0, 1.0), ("floor_us", 0.0, 1e4), ("floor_per_hop_us", 0.0, 1e3),
         ("simple_fill_MiB_per_rank", 0.0, 1e2), ("ll128_bandwidth_ratio", 0.0, 1.0))
_NEEDS_SEVERAL_N = {"latency_per_hop_us", "group_penalty", "floor_per_hop_us"}


def collective_points(rows: Iterable[dict], link: str, collective: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, list]:
    """(n, size, time) of the ok rows of one link class and collective, and the failed ones."""
    ok, failed = [], []
    for r in rows:
        if r.get("kind") != "collective" or r.get("link", "intra") != link or r.get("collective") != collective:
            continue
        try:
            point = (float(r["n_ranks"]), float(r["size_bytes"]), float(r["time_s"]))
        except (KeyError, TypeError, ValueError):
            point = None
        if r.get("status", "ok") != "ok" or point is None or not (point[0] >= 2 and point[1] > 0 and point[2] > 0):
            failed.append((r.get("n_ranks"), r.get("size_bytes"), r.get("error", r.get("status", "invalid row"))))
        else:
            ok.append(point)
    a = np.array(ok, dtype=float).reshape(-1, 3)
    return a[:, 0], a[:, 1], a[:, 2], failed


def fit_link(link: Link, collective: str, n: np.ndarray, S: np.ndarray, t: np.ndarray,
             judge_from_bytes: float = 0.0, minimax: bool = True, share: float = 1.0) -> tuple[CommFit, dict]:
    """Fit ``link.fit`` to measured times of one collective; returns the CommFit and the fit stats.

    ``judge_from_bytes``: sizes below it are fitted with weight 0.3 and left out of the minimax polish
    (a profile is used for gradient buckets and activations of MiBs, not for latency-bound bytes).
    ``share``: the fraction of the link's bandwidth the measured ranks had (advisor.comm.link_time).
    """
    from advisor.comm import link_time

    if len(S) < 3:
        raise CalibrationError(f"{collective}: {len(S)} measured sizes, need at least 3 to fit a link")
    several_n = len(np.unique(n)) > 1
    free = [f for f in _FREE if several_n or f[0] not in _NEEDS_SEVERAL_N]
    names = [f[0] for f in free]
    lo = np.array([f[1] for f in free])
    hi = np.array([f[2] for f in free])
    judged = judged_sizes(S, judge_from_bytes)
    # a sweep that never reaches judge_from_bytes is latency noise (CPU/gloo CI runs): least squares only
    minimax = minimax and bool((S >= judge_from_bytes).sum() >= 4)
    w = np.where(judged, 1.0, 0.3)
    L = choose_loop_MiB(n[judged], S[judged], t[judged])  # latency-bound sizes show no loop sawtooth

    def pred(x):
        vals = dict(zip(names, x), loop_MiB_per_rank=L)
        return link_time(collective, n, S, link_with_fit(link, vals), share)

    best = None
    for x0 in _starts(link, n, S, t, collective, names, L):
        x = least_squares(lambda x: w * np.log(pred(x) / t), np.clip(x0, lo, hi), lo, hi)
        if minimax and judged.sum() > len(names):
            for p in (4, 16, 64):  # p-norm continuation towards the max error (scaled: r/0.1 is O(1))
                x = least_squares(lambda x: signed_pow((pred(x)[judged] / t[judged] - 1) / 0.1, p), x, lo, hi)
        rel = np.abs(pred(x) / t - 1)[judged]
        if best is None or rel.max() + MEAN_WEIGHT * rel.mean() < best[1]:
            best = (x, rel.max() + MEAN_WEIGHT * rel.mean())
    x = best[0]
    if minimax and judged.sum() > len(names):
        x = slp_minimax(lambda x: pred(x)[judged] / t[judged] - 1, x, lo, hi)
    values = dict(zip(names, (float(v) for v in x)), loop_MiB_per_rank=float(L))
    fit = CommFit(**{**link.fit.model_dump(), **fitted(values)})
    return fit, {"loop_MiB_per_rank": L}


LL_BELOW_BYTES = MiB  # NCCL's low-latency path carries the small messages: fitted on the sizes below this


def fit_low_latency(link: Link, collective: str, n: np.ndarray, S: np.ndarray, t: np.ndarray,
                    share: float = 1.0) -> Optional[tuple[Link, FitReport]]:
    """The link with its low-latency path (``ll_latency_us``, ``ll_bandwidth_ratio``) fitted to the sizes below
    LL_BELOW_BYTES, the rest of its fit held; None with fewer than 4 such sizes. A robust loss (soft L1 in
    log time): small-message sweeps carry single slow points (a 68 us 32-byte all-reduce among 13 us ones)."""
    from advisor.comm import link_time

    small = S < LL_BELOW_BYTES
    if small.sum() < 4:
        return None
    n_s, S_s, t_s = n[small], S[small], t[small]

    def pred(x):
        return link_time(collective, n_s, S_s, link_with_fit(link, {"ll_latency_us": x[0], "ll_bandwidth_ratio": x[1]}), share)

    x0 = np.array([float(np.median(t_s[S_s <= np.quantile(S_s, 0.25)])) * 1e6, 0.3])
    x = least_squares(lambda x: np.log(pred(x) / t_s), x0, [0.0, 1e-4], [1e4, 1.0], loss="soft_l1", f_scale=0.05)
    fitted = link.model_copy(update={"fit": CommFit(**{**link.fit.model_dump(), "ll_latency_us": round(float(x[0]), 4),
                                                        "ll_bandwidth_ratio": round(float(x[1]), 6)})})
    rep = fit_report(link_time(collective, n_s, S_s, fitted, share), n_s, S_s, t_s, [],
                     f"low-latency path, {collective} below {LL_BELOW_BYTES / MiB:g} MiB")
    return fitted, rep


def _starts(link: Link, n, S, t, collective: str, names: list[str], loop_MiB: float = 0.0) -> list[np.ndarray]:
    """Starting points: the base profile's fit, a plain alpha-beta fit with and without size terms, and
    one with NCCL's two protocols (LL128 at 0.7 of Simple's rate, Simple's fill a quarter of a loop)."""
    from advisor.comm import bus_factor

    big = S >= np.quantile(S, 0.75)
    busbw = float(np.median(bus_factor(collective, n[big]) * S[big] / t[big]))
    eff = float(np.clip(busbw / link.bandwidth_bytes_per_s, 1e-4, 1.0))
    lat = float(max(np.min(t) * 1e6 * 0.5, 0.0))
    base = link.fit.model_dump()
    plain = dict(latency_us=lat, latency_per_hop_us=0.0, bandwidth_efficiency=eff, group_penalty=0.0,
                 half_size_MiB=0.0, half_size_exponent=1.0, loop_quantization=0.0, floor_us=0.0, floor_per_hop_us=0.0,
                 simple_fill_MiB_per_rank=0.0, ll128_bandwidth_ratio=0.0)
    sized = dict(plain, half_size_MiB=10.0, half_size_exponent=0.5, loop_quantization=0.1,
                 floor_us=lat, group_penalty=0.3)
    slow = dict(sized, half_size_MiB=1000.0, half_size_exponent=0.05)
    knee = dict(sized, latency_us=lat / 4, latency_per_hop_us=lat / 8, half_size_MiB=10.0, half_size_exponent=0.5,
                group_penalty=0.4, loop_quantization=0.0)
    mid = dict(sized, latency_us=lat / 2, latency_per_hop_us=lat / 20, half_size_MiB=60.0, half_size_exponent=0.12,
               group_penalty=0.3, loop_quantization=0.0)
    protocols = dict(plain, latency_us=lat / 2, group_penalty=0.4, half_size_MiB=1e4, half_size_exponent=0.02,
                     loop_quantization=0.15, simple_fill_MiB_per_rank=max(loop_MiB, 1.0) / 4, ll128_bandwidth_ratio=0.7)
    return [np.array([d[k] for k in names], dtype=float) for d in (base, plain, sized, slow, knee, mid, protocols)]


def choose_loop_MiB(n: np.ndarray, S: np.ndarray, t: np.ndarray) -> float:
    """NCCL's loop size per rank: the grid value whose step term best explains t per group size.

    Per group size, t = a + b S + c sqrt(S) + d log(S) + e ceil(S / (L n)) in relative least squares:
    the smooth terms take the curvature of the efficiency ramp, so that the step term is chosen for
    the sawtooth alone (without them a coarse L wins by bending the curve).
    """
    best, best_L = None, 0.0
    for L in LOOP_GRID_MIB:
        sse = 0.0
        for k in np.unique(n):
            m = n == k
            smooth = [np.sqrt(S[m]), np.log(S[m])] if m.sum() > 8 else []
            cols = [np.ones(m.sum()), S[m]] + smooth + ([np.ceil(S[m] / (L * MiB * k))] if L > 0 else [])
            A = np.c_[tuple(cols)] / t[m, None]
            coef, *_ = np.linalg.lstsq(A, np.ones(m.sum()), rcond=None)
            sse += float(np.sum((A @ coef - 1) ** 2))
        if best is None or sse < best * 0.98:  # a finer loop must explain clearly more to be chosen
            best, best_L = sse, L
    return best_L


def link_report(link: Link, collective: str, n, S, t, failed: list, what: str, judge_from_bytes: float = 0.0,
                share: float = 1.0) -> FitReport:
    from advisor.comm import link_time

    return fit_report(link_time(collective, n, S, link, share), n, S, t, failed, what, judge_from_bytes)


# ---------------------------------------------------------------------------------------------- profile
def calibrate_profile(rows: list[dict], base: Hardware, name: str, provenance: dict,
                      judge_from_bytes: float = 4 * MiB) -> tuple[Hardware, list[str]]:
    """The base profile with every measured figure refitted; report lines for the operator.

    One CommFit per link class: the all-reduce fit when all-reduce was measured (DDP gradients, the
    dominant collective), else the collective with the most points; every collective's error under
    its own fit is reported. A link class without measurements keeps the base profile's fit.
    """
    lines: list[str] = []
    links = {"intra": base.intra_node, "inter": base.inter_node}
    for cls in ("intra", "inter"):
        link, chosen = links[cls], None
        # one GPU per node measures one GPU's share of its node's network (rail-optimised: its own NIC),
        # the share advisor.comm gives each GPU when a whole node communicates
        share = 1.0 if cls == "intra" else base.inter_node_share_per_gpu
        for coll in COLLECTIVES:
            n, S, t, failed = collective_points(rows, cls, coll)
            if len(S) == 0:
                if failed:
                    lines.append(f"{cls}-node {coll}: every size failed ({len(failed)}): nothing to fit")
                continue
            link_b = _widen_bandwidth(link, coll, n, S, t, lines, cls, share)
            fit, _ = fit_link(link_b, coll, n, S, t, judge_from_bytes=judge_from_bytes, share=share)
            fitted = link_b.model_copy(update={"fit": fit})
            rep = link_report(fitted, coll, n, S, t, failed, f"{cls}-node {coll} (n={_ns(n)})", judge_from_bytes, share)
            lines.append(rep.line())
            lines += [f"  outlier n={a} size={b} B: model off by {100 * c:+.0f}%" for a, b, c in rep.outliers[:10]]
            lines += [f"  failed n={a} size={b}: {e}" for a, b, e in failed[:10]]
            if chosen is None or coll == "all_reduce" or (chosen[0] != "all_reduce" and len(S) > chosen[2]):
                chosen = (coll, fitted, len(S), (n, S, t, share))
        if chosen is None:
            why = "one node: only intra-node links measured" if cls == "inter" else "no intra-node measurements"
            lines.append(f"{cls}-node link: not measured ({why}); kept from the base profile")
        else:
            links[cls] = chosen[1]
            ll = fit_low_latency(chosen[1], chosen[0], *chosen[3])
            if ll is not None:
                links[cls] = ll[0]
                lines.append(f"{cls}-node {ll[1].line()}: start-up {ll[0].fit.ll_latency_us:.1f} us, "
                             f"rate {ll[0].fit.ll_bandwidth_ratio:.3f} of the link")
            lines.append(f"{cls}-node profile fit from {chosen[0]}: " + _fit_text(links[cls].fit))
    world = _fit_world_rows(rows, base.model_copy(update=links_update(links)), judge_from_bytes, lines)
    if world is not None:
        links["inter"] = world

    eff, eff_lines = fit_efficiency(rows, base)
    lines += eff_lines
    if not eff_lines:
        lines.append("compute: no matmul/copy/optimizer rows; efficiencies kept from the base profile")
    where = f" on {provenance['host']}" if provenance.get("host") else ""
    description = f"calibrated{where} ({provenance.get('date', 'undated')}); datasheet figures from {base.name}: {base.description}"
    hw = base.model_copy(update={"name": name, "description": description, "intra_node": links["intra"], "inter_node": links["inter"],
                                 "efficiency": eff, "calibration": provenance})
    return Hardware.model_validate(hw.model_dump()), lines


def _ns(n: np.ndarray) -> str:
    return ",".join(str(int(k)) for k in np.unique(n))


def _fit_text(f: CommFit) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in f.model_dump(exclude_none=True).items())


def links_update(links: dict) -> dict:
    return {"intra_node": links["intra"], "inter_node": links["inter"]}


def _fit_world_rows(rows: list[dict], base: Hardware, judge_from_bytes: float, lines: list[str]) -> Optional[Link]:
    """The inter-node link fitted to "world" rows (every GPU of several nodes) through advisor.comm's
    multi-node paths, all-reduce preferred; None when there are none. Reports each collective's fit."""

    chosen = None
    for coll in COLLECTIVES:
        pts = [(float(r["n_ranks"]), float(r["per_node"]), float(r["size_bytes"]), float(r["time_s"])) for r in rows
               if r.get("kind") == "collective" and r.get("link") == "world" and r.get("collective") == coll
               and r.get("status", "ok") == "ok"]
        if not pts:
            continue
        n, g, S, t = (np.array(v) for v in zip(*pts))
        try:
            link, rep = fit_world(base, coll, n, g, S, t, judge_from_bytes)
        except CalibrationError as exc:
            lines.append(f"world {coll}: {exc}")
            continue
        lines.append(rep.line())
        if chosen is None or coll == "all_reduce":
            chosen = (coll, link)
    if chosen is None:
        return None
    lines.append(f"inter-node profile fit from world {chosen[0]} (replaces the one-GPU-per-node fit): " + _fit_text(chosen[1].fit))
    return chosen[1]


def _widen_bandwidth(link: Link, coll: str, n, S, t, lines: list[str], cls: str, share: float = 1.0) -> Link:
    """A measured busbw above the link's datasheet rate (NVLS, SHARP) cannot be an efficiency <= 1:
    the link's rate is raised to the measured peak, and the report says so."""
    from advisor.comm import bus_factor

    peak = float(np.max(bus_factor(coll, n) * S / t)) / share
    rate = link.bandwidth_bytes_per_s
    if peak <= 0.98 * rate:
        return link
    new = round(peak / 0.98 / GB, 1)
    per_gpu = f" ({peak * share / GB:.1f} GB/s from one GPU of {1 / share:g})" if share < 1 else ""
    lines.append(f"{cls}-node {coll}: measured busbw {peak / GB:.1f} GB/s{per_gpu} exceeds the base link's "
                 f"{rate / GB:.1f} GB/s; link bandwidth set to {new} GB/s")
    return link.model_copy(update={"bandwidth_GBps": new, "bandwidth_Gbps": None})
