"""How long a calibration sweep has left, from the time the measurements made so far took.

Each measurement of the sweep (advisor.calibrate.microbench.measurement_plan) makes warmup + iters calls of
one collective at one size. A call of collective k is modelled as t = a_k + b_k B, with B the bytes each rank
moves (nccl-tests' bus bytes: bus_factor x size): one start-up and one rate per collective, since on gloo/CPU
a bus byte of reduce-scatter takes 5x one of all-reduce and send/recv 4x less (one rate for all was off by
3x). They are fitted (non-negative least squares) to the time rank 0 took between the positions the launcher
saw. A measurement to come at a size its collective has been timed at or above takes that collective's a_k,
b_k. Beyond (or for a collective not timed yet) the rate is the one of every collective pooled, which larger
sizes have set: a rate fitted on a collective's small, latency-bound sizes alone extrapolated a 1 GiB
reduce-scatter to 10^6 s. The figure is then "rough", and says why.

Before: the time left was elapsed x (measurements left / done), by count; sizes double along the sweep, so the
last measurements take most of the time (42 s left at 13 s, for a run that ended at 137 s).
Left out: the compute measurements after the collectives (the text says they follow, untimed)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


class SweepClock:
    """Time left in a sweep whose measurement i makes ``calls[i]`` calls of ``bytes[i]`` bus bytes each, of
    collective ``kinds[i]`` at ``sizes[i]`` bytes."""

    def __init__(self, calls: Sequence[float], bytes_per_call: Sequence[float], kinds: Sequence[str],
                 sizes: Sequence[float], compute_follows: bool = False):
        self.calls = np.asarray(calls, dtype=float)
        self.bytes = np.asarray(bytes_per_call, dtype=float)
        self.kinds = np.asarray(kinds)
        self.sizes = np.asarray(sizes, dtype=float)
        self.names = sorted(set(kinds))
        self.compute_follows = compute_follows
        self._spans: list[np.ndarray] = []  # per span between two positions: calls, calls x bytes per kind, seconds
        self._last: Optional[tuple[int, float]] = None

    @classmethod
    def for_sweep(cls, cfg, world: int, local: int) -> "SweepClock":
        """The clock of a BenchConfig's sweep on ``world`` ranks, ``local`` per node (measurements the
        config skips, done by an earlier run, make no calls)."""
        from advisor.calibrate.microbench import measurement_plan
        from advisor.comm import bus_factor

        skip = {tuple(s) for s in cfg.skip}
        plan = measurement_plan(cfg, world, local)
        calls = [0 if (link, coll, len(ranks), size) in skip else cfg.warmup + cfg.iters for link, ranks, coll, size in plan]
        nbytes = [float(bus_factor(coll, len(ranks))) * size for _, ranks, coll, size in plan]
        return cls(calls, nbytes, [e[2] for e in plan], [e[3] for e in plan], compute_follows=bool(cfg.compute))

    def observe(self, position: int, t: float) -> None:
        """Rank 0 started measurement ``position`` (and so finished every one before it) at time ``t`` (s)."""
        if self._last is not None and position > self._last[0] and t >= self._last[1]:
            done = slice(self._last[0], position)
            c, B, k = self.calls[done], self.bytes[done], self.kinds[done]
            if c.sum() > 0:  # per collective: calls, then calls x bytes; then the seconds the span took
                self._spans.append(np.r_[[c[k == name].sum() for name in self.names],
                                         [(c * B)[k == name].sum() for name in self.names], t - self._last[1]])
        if self._last is None or position > self._last[0]:
            self._last = (position, t)

    def left(self, now: float) -> tuple[Optional[float], str]:
        """(seconds left, or None before a measurement has been timed; why the figure is rough, or "")."""
        if not self._spans or self._last is None:
            return None, ""
        from scipy.optimize import nnls

        S, K = np.array(self._spans), len(self.names)
        C, CB, y = S[:, :K], S[:, K:2 * K], S[:, -1]
        timed = C.sum(axis=0) > 0
        own = _nnls(nnls, np.c_[C[:, timed], CB[:, timed]], y)
        a_pool, b_pool = _nnls(nnls, np.c_[C.sum(axis=1), CB.sum(axis=1)], y)
        a, b = np.full(K, a_pool), np.full(K, b_pool)
        a[timed], b[timed] = own[:timed.sum()], own[timed.sum():]
        i, t_last = self._last
        kind = np.searchsorted(self.names, self.kinds)
        largest = np.array([self.sizes[self._finished(i) & (self.kinds == name)].max(initial=0.0) for name in self.names])
        todo = np.arange(len(self.calls)) >= i
        rate = np.where(self.sizes <= largest[kind], b[kind], b_pool)
        rest = (self.calls * (a[kind] + rate * self.bytes))[todo]
        return max(float(rest.sum()) - (now - t_last), 0.0), self._rough(i)

    def _finished(self, i: int) -> np.ndarray:
        return (np.arange(len(self.calls)) < i) & (self.calls > 0)

    def _rough(self, i: int) -> str:
        """Why the time left is extrapolated ("" where each measurement to come has been timed at its size or
        above for its collective, in some group)."""
        finished = self._finished(i)
        todo = (np.arange(len(self.calls)) >= i) & (self.calls > 0)
        untimed = sorted({k for k in self.kinds[todo] if not (finished & (self.kinds == k)).any()})
        if untimed:
            return f"{', '.join(untimed)} not timed yet"
        larger = [k for k in self.names if (todo & (self.kinds == k)).any()
                  and self.sizes[todo & (self.kinds == k)].max() > self.sizes[finished & (self.kinds == k)].max()]
        return f"{', '.join(larger)} not yet timed at the largest size" if larger else ""

    def text(self, now: float) -> str:
        left, rough = self.left(now)
        then = ", then the compute measurements" if self.compute_follows else ""
        if left is None:
            return "time left: known after the first measurements" + then
        return f"~{left:.0f} s left" + (f" (rough: {rough})" if rough else "") + then


def _nnls(nnls, A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares on columns of very different sizes (calls ~10, bytes ~1e10), solved scaled."""
    scale = np.maximum(np.abs(A).max(axis=0), 1e-30)
    return nnls(A / scale, y)[0] / scale
