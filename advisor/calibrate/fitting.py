"""Fitting machinery shared by the calibrations: least squares in log time, a minimax polish, and the
report of how well a fit reproduces its measurements (links, network and compute use it; no torch here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from advisor.hardware import CommFit, Link
from advisor.units import MiB

OUTLIER_REL = 0.25  # a point the fitted model misses by more than 25% is listed as an outlier
# A fit explains nothing when it predicts the sweep no better than one constant time (R^2 <= R2_MIN, in log
# time: a CPU/gloo sweep dominated by scheduler noise gave R^2 -0.16) and does not reproduce it either (mean
# error above OUTLIER_REL): where the measured times hardly vary across sizes, R^2 compares with a spread near
# zero and says nothing, and the error alone judges the fit. Such a fit is not used; the base profile's
# figures are kept instead.
R2_MIN = 0.0
# The minimax polish minimises max + MEAN_WEIGHT * mean of the relative errors. The worst size is flat
# near its optimum (many parameter sets are within a fraction of a point of it) while the mean is not:
# weighting the mean twice picks, among near-minimax fits, one that is also right on typical sizes.
MEAN_WEIGHT = 2.0


@dataclass
class FitReport:
    """How well one fit reproduces its measurements."""

    what: str
    points: int
    r2: float
    max_rel_err: float
    mean_rel_err: float
    outliers: list[tuple] = field(default_factory=list)
    failed: list[tuple] = field(default_factory=list)
    note: str = ""

    @property
    def explains_nothing(self) -> bool:
        return not self.r2 > R2_MIN and not self.mean_rel_err <= OUTLIER_REL

    def why_useless(self) -> str:
        return (f"R^2 {self.r2:.2f} <= {R2_MIN:g} and off by {100 * self.mean_rel_err:.0f}% on average: "
                "the fit explains nothing")

    def detail_lines(self, shown: int = 3) -> list[str]:
        """At most two indented lines: the outliers counted with the worst few, the failed sizes with the first few."""
        out = []
        if self.outliers:
            worst = sorted(self.outliers, key=lambda o: -abs(o[-1]))[:shown]
            out.append(f"  {len(self.outliers)} outliers (model off by more than {100 * OUTLIER_REL:.0f}%); worst: "
                       + ", ".join(f"{_point(o[:-1])} {100 * o[-1]:+.0f}%" for o in worst))
        if self.failed:
            more = f"; and {len(self.failed) - shown} more" if len(self.failed) > shown else ""
            out.append(f"  {len(self.failed)} failed: " + "; ".join(f"n={a} size={b}: {e}" for a, b, e in self.failed[:shown]) + more)
        return out

    def line(self) -> str:
        out = f"; outliers {len(self.outliers)}" if self.outliers else ""
        fail = f"; failed sizes {len(self.failed)}" if self.failed else ""
        note = f" ({self.note})" if self.note else ""
        return (f"{self.what}: {self.points} points, R^2 {self.r2:.4f}, max error {100 * self.max_rel_err:.1f}%, "
                f"mean {100 * self.mean_rel_err:.2f}%{out}{fail}{note}")


def _point(key: tuple) -> str:
    """A measured point as the report names it: (n, size) for collectives, (m, k, n) for GEMMs."""
    if len(key) == 2:
        return f"n={key[0]} size={key[1]} B"
    return "x".join(str(k) for k in key)


@dataclass
class Ledger:
    """What one calibration did: report lines, the profile parts fitted, what could not be fitted and why, and
    the fits measured but not used (they explain nothing), by the profile part that kept its base value."""

    lines: list[str] = field(default_factory=list)
    fitted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped.append(why)
        self.lines.append(why)

    def reject(self, part: str, rep: "FitReport", base: str, say: bool = True) -> None:
        """``part`` keeps its base value: ``rep``'s fit explains nothing (a line says so unless ``say`` is False,
        where the caller has said it)."""
        why = f"{rep.what}: {rep.why_useless()}"
        self.rejected[part] = f"{why}; kept from {base}"
        self.skipped.append(why)
        if say:
            self.lines.append(f"  {why}: not used; {part} kept from the base profile {base}")


def fitted(values: dict) -> dict:
    """Fitted parameters as a profile stores them: 6 decimals, solver dust (< 1e-12) as 0."""
    return {k: (0.0 if abs(v) < 1e-12 else round(float(v), 6)) for k, v in values.items()}


def link_with_fit(link: Link, values: dict) -> Link:
    """The link with its fit replaced (unvalidated: the fitter calls this in its inner loop)."""
    fit = CommFit.model_construct(**{**link.fit.model_dump(), **values})
    return Link.model_construct(**{**dict(link), "fit": fit})


def judged_sizes(S: np.ndarray, judge_from_bytes: float) -> np.ndarray:
    """Sizes the fit is judged on: from judge_from_bytes up, or all when the sweep has < 4 of those."""
    judged = S >= judge_from_bytes
    return judged if judged.sum() >= 4 else np.ones_like(S, dtype=bool)


def signed_pow(r: np.ndarray, p: int) -> np.ndarray:
    r = np.clip(r, -30.0, 30.0)  # a wild trial point must not overflow the power
    return np.sign(r) * np.abs(r) ** (p / 2)


def least_squares(fun, x0, lo, hi, **kw):
    """scipy's bounded least squares from ``x0`` clipped into [lo, hi] (a start computed from the data, e.g. a
    20 ms start-up on a preempted CPU run, can fall outside: scipy would refuse it); a NaN start takes lo."""
    from scipy.optimize import least_squares as scipy_least_squares

    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    x0 = np.asarray(x0, dtype=float)
    x0 = np.clip(np.where(np.isfinite(x0), x0, lo), lo, hi)
    return scipy_least_squares(fun, x0, bounds=(lo, hi), x_scale="jac", max_nfev=2000, **kw).x


def slp_minimax(rel, x, lo, hi, iters: int = 40, mean_weight: float = MEAN_WEIGHT):
    """Minimise max |rel(x)| + mean_weight * mean |rel(x)| (the many near-minimax optima differ in their
    mean: see MEAN_WEIGHT) by sequential linear programming with a trust region."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, hstack, identity, vstack

    def score(f):
        return np.abs(f).max() + mean_weight * np.abs(f).mean()

    scale = np.maximum(np.abs(x), 1e-2)
    tr, f0 = 0.03, rel(x)
    m = len(f0)
    for _ in range(iters):
        G = np.empty((m, len(x)))
        for i in range(len(x)):
            d = 1e-6 * scale[i]
            xx = x.copy()
            xx[i] = x[i] + d if x[i] + d <= hi[i] else x[i] - d
            G[:, i] = (rel(xx) - f0) / (xx[i] - x[i])
        # variables: dx, z, s (one per point); rows: +-(f0 + G dx) <= z and <= s
        ones = csr_matrix(np.ones((m, 1)))
        eye = identity(m, format="csr")
        Gs = csr_matrix(G)
        zero_s = csr_matrix((m, m))
        zero_z = csr_matrix((m, 1))
        A = vstack([hstack([Gs, -ones, zero_s]), hstack([-Gs, -ones, zero_s]),
                    hstack([Gs, zero_z, -eye]), hstack([-Gs, zero_z, -eye])]).tocsr()
        b = np.r_[-f0, f0, -f0, f0]
        c = np.r_[np.zeros(len(x)), 1.0, np.full(m, mean_weight / m)]
        bounds = [(max(lo[i] - x[i], -tr * scale[i]), min(hi[i] - x[i], tr * scale[i])) for i in range(len(x))]
        sol = linprog(c, A_ub=A, b_ub=b, bounds=bounds + [(0, None)] * (m + 1), method="highs-ipm")
        if sol.status != 0:
            break
        xn = np.clip(x + sol.x[: len(x)], lo, hi)
        fn = rel(xn)
        if score(fn) < score(f0):
            x, f0, tr = xn, fn, min(tr * 1.5, 0.3)
        else:
            tr /= 2
            if tr < 1e-4:
                break
    return x


def log_r2(predicted: Any, measured: Any) -> float:
    """R^2 of a fit in log time (the fits minimise log errors: every size counts alike)."""
    lt = np.log(measured)
    return float(1 - np.sum((np.log(predicted) - lt) ** 2) / max(np.sum((lt - lt.mean()) ** 2), 1e-30))


def fit_report(p, n, S, t, failed: list, what: str, judge_from_bytes: float = 0.0) -> FitReport:
    """Quality of predicted times ``p`` against measured ``t`` (judged from ``judge_from_bytes`` up)."""
    rel = p / t - 1
    r2 = log_r2(p, t)
    judged = judged_sizes(S, judge_from_bytes)
    outliers = [(int(a), int(b), round(float(c), 3)) for a, b, c in zip(n, S, rel) if abs(c) > OUTLIER_REL]
    note = "" if judged.all() else (f"{int(judged.sum())} points from {judge_from_bytes / MiB:g} MiB judged; "
                                    f"max over all sizes {100 * np.abs(rel).max():.1f}%")
    return FitReport(what, int(len(S)), float(r2), float(np.abs(rel[judged]).max()),
                     float(np.abs(rel[judged]).mean()), outliers, failed, note)
