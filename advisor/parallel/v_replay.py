"""The V schedules (ZB-V, DualPipeV) as torch 2.13 runs them: their action lists, replayed.

torch's ScheduleZBVZeroBubble (torch/distributed/pipelining/schedules.py:3269-3395, _calculate_single_rank_operations)
builds each rank's action list for max(2 pp - 1, n) micro-batches and blanks the actions of micro-batches n and beyond
(:3385-3394): it refuses no count, unlike ScheduleDualPipeV (:3439-3443) and Schedule1F1B (:1020-1024).
ScheduleDualPipeV (:3459-3595) runs its main steps as OVERLAP_F_B actions, a forward of one chunk and a full backward
(input and weight gradients) of the other, which the runtime runs one after the other (:2632-2636, where no custom
function is registered) and whose sends follow both (_add_send_recv, :1493-1505).

This module ports the lists and replays them, each rank running its actions in order (_PipelineScheduleRuntime runs
its list so), each action waiting on the one it depends on (F on the previous stage's F, I or B on the next stage's I
or B or the last stage's own F, W on its own I), with F, I, W (B = I + W) the same on every stage and the sends and
receives in the body's times (advisor.parallel.pipeline.bubble_time), and returns what a rank idles. A trimmed ZB-V
idles longer than its steady state, as each warm-up and cool-down step it keeps waits on the stages around it; the
steady state idles (p - 1)(F + I - W) where F = I = W, not the paper's (p - 1)(F + I - 2W) = 0, which no schedule
reaches (rank p - 1 starts (p - 1) forwards late with a rank's whole work to do)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

F, I, W, B = 0, 1, 2, 3  # FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FULL_BACKWARD (torch's _ComputationType)
ZBV, DUALPIPEV = "zb-v", "dualpipev"

Step = tuple[tuple[int, int, int], ...]  # the (type, stage, micro-batch) of one action, two for OVERLAP_F_B


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


@lru_cache(maxsize=256)
def dualpipev_steps(pp: int, n: int, rank: int) -> tuple[Step, ...]:
    """The steps torch 2.13's ScheduleDualPipeV gives ``rank`` of ``pp`` over ``n`` >= 2 pp micro-batches, in its
    order, an OVERLAP_F_B as its two sub-actions (schedules.py:3459-3595, its eight steps)."""
    c0, c1 = rank, 2 * pp - 1 - rank  # generate_rank_to_stage_mapping(pp, 2 pp, style="v")
    cnt: dict[tuple[int, int], int] = {}
    queue: list[tuple[int, int]] = []  # input gradients whose weight gradients are pending
    out: list[Step] = []

    def action(stage: int, kind: int) -> tuple[int, int, int]:
        mb = cnt.get((stage, I if kind == B else kind), 0)
        if kind == B:
            cnt[(stage, I)], cnt[(stage, W)] = mb + 1, cnt.get((stage, W), 0) + 1
        else:
            if kind == I:
                queue.append((stage, mb))
            cnt[(stage, kind)] = mb + 1
        return (kind, stage, mb)

    def add(stage: int, kind: int) -> None:
        out.append((action(stage, kind),))

    def weight() -> None:
        if queue:
            stage, mb = queue.pop(0)
            out.append(((W, stage, mb),))
            cnt[(stage, W)] = cnt.get((stage, W), 0) + 1

    def overlap(fwd: int, bwd: int) -> None:
        out.append((action(fwd, F), action(bwd, B)))

    for _ in range(2 * (pp - rank - 1)):  # 1: F0
        add(c0, F)
    for _ in range(rank + 1):  # 2: F0 F1
        add(c0, F)
        add(c1, F)
    for _ in range(pp - rank - 1):  # 3: I1 W1 F1
        add(c1, I)
        weight()
        add(c1, F)
    for i in range(n - 2 * pp + rank + 1):  # 4: F0B1 F1B0, the first of the last rank not overlapped
        if i == 0 and rank == pp - 1:
            add(c0, F)
            add(c1, B)
        else:
            overlap(c0, c1)
        overlap(c1, c0)
    for _ in range(pp - rank - 1):  # 5: B1 F1B0
        add(c1, B)
        overlap(c1, c0)
    zb = False
    for i in range(rank + 1):  # 6: B1 B0, the second half zero-bubble
        zb = zb or (i == (rank + 1) // 2 and rank % 2 == 1)
        add(c1, I if zb else B)
        zb = zb or (i == (rank + 1) // 2 and rank % 2 == 0)
        add(c0, I if zb else B)
    for _ in range(pp - rank - 1):  # 7: W0 B0
        weight()
        add(c0, I if zb else B)
    for _ in range(rank + 1):  # 8: W0
        weight()
    return tuple(out)


@lru_cache(maxsize=64)
def _events(schedule: str, pp: int, n: int) -> tuple[tuple[int, tuple[tuple[int, int, int], ...]], ...]:
    """Every rank's steps in an order where each follows what it waits on: (rank, ((type, micro-batch, index of the
    step whose end it waits on, or -1), ...))."""
    lists = [tuple((a,) for a in rank_actions(pp, n, r)) if schedule == ZBV else dualpipev_steps(pp, n, r)
             for r in range(pp)]
    index: dict[tuple[int, int, int], int] = {}
    order: list[tuple[int, tuple[tuple[int, int, int], ...]]] = []
    pos, last, total = [0] * pp, 2 * pp - 1, sum(len(x) for x in lists)

    def need(kind: int, stage: int, m: int) -> Any:
        if kind == F:
            return (F, stage - 1, m) if stage > 0 else None
        return ((I, stage + 1, m) if stage < last else (F, stage, m)) if kind in (I, B) else (I, stage, m)

    while len(order) < total:
        moved = False
        for r in range(pp):
            while pos[r] < len(lists[r]):
                step = lists[r][pos[r]]
                deps = [need(*a) for a in step]
                if any(d is not None and d not in index for d in deps):
                    break
                order.append((r, tuple((k, m, -1 if d is None else index[d]) for (k, _, m), d in zip(step, deps))))
                for kind, stage, m in step:  # a full backward gives the input gradient its upstream waits on
                    index[(I if kind == B else kind, stage, m)] = len(order) - 1
                pos[r] += 1
                moved = True
        if not moved:  # torch's lists always resolve; a stalled replay is a bug in the port
            raise RuntimeError(f"{schedule} replay stalled at pp={pp}, n={n}")
    return tuple(order)


def span(pp: int, n: int, f: Any, b: Any, w: Any, first: Any = 0.0, schedule: str = ZBV) -> Any:
    """Seconds from the first forward to the last action of a step over ``n`` micro-batches on ``pp`` ranks, each
    chunk's F, I (input gradients) and W (weight gradients) taking ``f``, ``b`` and ``w`` (arrays alike), a full
    backward b + w, a chunk's first forward ``first`` more (the weight casts of a step: advisor.step's first_cast)."""
    f, b, w, first = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (f, b, w, first)))
    dur = (f, b, w, b + w)
    free = [np.zeros(f.shape) for _ in range(pp)]
    done: list[Any] = []  # the end of each step, when its sends leave
    for rank, subs in _events(schedule, pp, n):
        t = free[rank]
        for kind, m, dep in subs:
            t = (t if dep < 0 else np.maximum(t, done[dep])) + dur[kind] + (first if kind == F and m == 0 else 0.0)
        free[rank] = t
        done.append(t)
    return np.max(np.stack(free), axis=0)


def idle(pp: int, n: int, f: Any, b: Any, w: Any, first: Any = 0.0, schedule: str = ZBV) -> Any:
    """What a rank idles in a step over ``n`` micro-batches: the span less its work, 2 n (f + b + w) (each chunk's
    ``first`` cast counted idle, as the fill of the other schedules counts it: advisor.step's first_cast)."""
    return span(pp, n, f, b, w, first, schedule) - 2.0 * n * (np.asarray(f) + b + w)
