"""ZB-V as torch 2.13 runs it on fewer micro-batches than 2 x pp.

torch's ScheduleZBVZeroBubble (torch/distributed/pipelining/schedules.py:3269-3395, _calculate_single_rank_operations)
builds each rank's action list for max(2 pp - 1, n) micro-batches and blanks the actions of micro-batches n and beyond
(:3385-3394): it refuses no count, unlike ScheduleDualPipeV (:3439-3443) and Schedule1F1B (:1020-1024). This module
replays torch's action lists, each rank running its actions in order (_PipelineScheduleRuntime runs its list so),
each action waiting on the one it depends on (F on the previous stage's F, I on the next stage's I or the last
stage's own F, W on its own I), with F, I and W the same on every stage and the sends and receives in the body's
times (advisor.parallel.pipeline.bubble_time), and returns what a rank idles. A trimmed schedule idles longer than the
steady state, as each warm-up and cool-down step it keeps waits on the stages around it; the steady state idles
(p - 1)(F + I - W) where F = I = W, not the paper's (p - 1)(F + I - 2W) = 0."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

F, I, W = 0, 1, 2  # the computation types torch's list holds: FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT


@lru_cache(maxsize=256)
def rank_actions(pp: int, n: int, rank: int) -> tuple[tuple[int, int, int], ...]:
    """(type, stage, micro-batch) of each action torch 2.13's ScheduleZBVZeroBubble gives ``rank`` of ``pp`` over
    ``n`` micro-batches, in its order, the blanked ones (micro-batch >= n) left out (schedules.py:3269-3395)."""
    total = max(2 * pp - 1, n)
    c0, c1 = rank, 2 * pp - 1 - rank  # the V: chunk 0 going down, chunk 1 coming back
    out: list[tuple[int, int, int]] = []
    cnt = {"f0": 0, "f1": 0, "b0": 0, "b1": 0}

    def add(kind: int, stage: int, key: str, bump: bool = True) -> None:
        out.append((kind, stage, cnt[key]))
        if bump:
            cnt[key] += 1

    for _ in range(2 * (pp - rank) - 1):  # warm-up 1: chunk 0's forwards
        add(F, c0, "f0")
    for _ in range(rank):  # warm-up 2: one of each chunk
        add(F, c1, "f1")
        add(F, c0, "f0")
    for _ in range(pp - rank):  # warm-up 3: chunk 1's F, I, W
        add(F, c1, "f1")
        add(I, c1, "b1", bump=False)
        add(W, c1, "b1")
    while cnt["f1"] < cnt["f0"] or cnt["f0"] < total:  # steady state
        if cnt["f0"] < total:
            add(F, c0, "f0")
        add(I, c0, "b0", bump=False)
        add(W, c0, "b0")
        add(F, c1, "f1")
        add(I, c1, "b1", bump=False)
        add(W, c1, "b1")
    w0, w1 = cnt["b0"], cnt["b1"]
    for _ in range(rank):  # cool-down 1: input gradients of both chunks
        add(I, c0, "b0")
        add(I, c1, "b1")
    for _ in range(pp - rank):  # cool-down 2
        add(I, c0, "b0")
        out.append((W, c0, w0))
        w0 += 1
    out += [(W, c1, m) for m in range(w1, cnt["b1"])] + [(W, c0, m) for m in range(w0, cnt["b0"])]
    return tuple(a for a in out if a[2] < n)


@lru_cache(maxsize=64)
def _events(pp: int, n: int) -> tuple[tuple[int, int, int, int], ...]:
    """The actions of every rank in an order where each follows what it waits on: (rank, type, micro-batch, index of
    the action it depends on or -1)."""
    lists = [rank_actions(pp, n, r) for r in range(pp)]
    index: dict[tuple[int, int, int], int] = {}
    order: list[tuple[int, int, int, int]] = []
    pos = [0] * pp
    last = 2 * pp - 1
    while len(order) < sum(len(x) for x in lists):
        moved = False
        for r in range(pp):
            while pos[r] < len(lists[r]):
                kind, stage, m = lists[r][pos[r]]
                dep = ((F, stage - 1, m) if stage > 0 else None) if kind == F else (
                    ((I, stage + 1, m) if stage < last else (F, stage, m)) if kind == I else (I, stage, m))
                if dep is not None and dep not in index:
                    break
                index[(kind, stage, m)] = len(order)
                order.append((r, kind, m, -1 if dep is None else index[dep]))
                pos[r] += 1
                moved = True
        if not moved:  # torch's lists always resolve; a stalled replay is a bug in the port
            raise RuntimeError(f"ZB-V replay stalled at pp={pp}, n={n}")
    return tuple(order)


def span(pp: int, n: int, f: Any, b: Any, w: Any, first: Any = 0.0) -> Any:
    """Seconds from the first forward to the last action of a ZB-V step over ``n`` micro-batches on ``pp`` ranks,
    each chunk's F, I (input gradients) and W (weight gradients) taking ``f``, ``b`` and ``w`` (arrays alike), a
    chunk's first forward ``first`` more (the weight casts of a step: advisor.step's first_cast)."""
    f, b, w, first = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (f, b, w, first)))
    dur = (f, b, w)
    free = [np.zeros(f.shape) for _ in range(pp)]
    done: list[Any] = []
    for rank, kind, m, dep in _events(pp, n):
        start = free[rank] if dep < 0 else np.maximum(free[rank], done[dep])
        free[rank] = start + dur[kind] + (first if kind == F and m == 0 else 0.0)
        done.append(free[rank])
    return np.max(np.stack(free), axis=0)


def idle(pp: int, n: int, f: Any, b: Any, w: Any, first: Any = 0.0) -> Any:
    """What a rank idles in a ZB-V step over ``n`` micro-batches: the span less its work, 2 n (f + b + w) (each
    chunk's ``first`` cast counted idle, as the fill of the other schedules counts it: advisor.step's first_cast)."""
    return span(pp, n, f, b, w, first) - 2.0 * n * (np.asarray(f) + b + w)
