"""Fit one link class's CommFit (advisor.comm.link_time) to measured collective times (no torch here).

Log-time least squares from several starts, then a minimax polish (p-norm continuation and a sequential LP on
the worst points), since a cost model is judged by its worst size, not its mean. The loop size (NCCL's
nchannels x chunk per rank) is chosen on a grid by a linear per-group-size fit of
t = a + b S + c sqrt(S) + d log(S) + e ceil(S / (L n)) over the judged sizes; the nonlinear fit then runs at
that L. NCCL's two protocols (advisor.comm: LL128 and Simple's pipeline fill) are fitted like any other term,
from a start that has both; the low-latency path (ll_*) is fitted apart on the sizes below 1 MiB.
Deliberately left out: fitting the link's datasheet rate (it comes from the base profile).
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from advisor.calibrate.fitting import (
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
from advisor.calibrate.measurements import CalibrationError
from advisor.hardware import CommFit, Link
from advisor.units import MiB

LOOP_GRID_MIB = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)



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

    if len(set(zip(np.asarray(n).tolist(), np.asarray(S).tolist()))) < 3:  # a repeated size is one point
        raise CalibrationError(f"{collective}: {len(set(np.asarray(S).tolist()))} distinct measured sizes ({len(S)} rows), "
                               "need at least 3 to fit a link")
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
