"""The plans of one GPU count that break no constraint, found a slice of layouts at a time.

A highly composite GPU count has thousands of (tp, pp, cp) layouts, each with thousands of rows (ZeRO stage, schedule,
micro-batch, recomputation, ...), and a mixture of experts multiplies each row by the expert-parallel degrees its
data-parallel ranks admit: DeepSeek-V3 on 1,024 GPUs is 2.0 million rows, on 2,048 about 10 million. The layouts that
break a layout-only constraint (heads vs tp, layers vs pp, tp across nodes) are counted, not built; the rest are built
and checked in slices of at most MAX_CANDIDATES rows (the memory one vectorised pass is sized for: advisor.space), and
only the plans that pass every constraint are kept: those the search evaluates, which may number MAX_CANDIDATES.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

from advisor import api
from advisor.api import PlanError
from advisor.candidates import Candidates, concat
from advisor.constraints import violations
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.space import (MAX_CANDIDATES, MIN_TOKENS_PER_CP_RANK, block_layers, count_candidates, enumerate_candidates,
                           layouts, offloads_of, pair_violations, policies_of, with_experts)
from advisor.stack import Stack


# Slices of MAX_CANDIDATES rows one search builds and checks at most, about a second each: DeepSeek-V3 on 2,048 GPUs
# builds 3.5 million rows (2 slices) in 2.4 s; a world size past this many is refused before any is built
SCANNED_SLICES = 8


def round_world(world: int, hw: Hardware) -> int:
    """A nearby GPU count with fewer divisors: whole nodes, a power of two of them (half as many where ``world`` is
    one already)."""
    nodes = max(1, world // hw.gpus_per_node)
    near = hw.gpus_per_node * 2 ** (nodes.bit_length() - 1)
    return near if near != world or nodes == 1 else near // 2


def _slices(counts: np.ndarray, limit: int) -> Iterator[np.ndarray]:
    """Consecutive runs of layouts whose rows sum to at most ``limit`` (a layout above it alone)."""
    start, total = 0, 0
    for i, n in enumerate(counts):
        if i > start and total + n > limit:
            yield np.arange(start, i)
            start, total = i, 0
        total += int(n)
    if start < len(counts):
        yield np.arange(start, len(counts))


def valid_candidates(spec: ModelSpec, hardware: Hardware, world: int, gb: int, allow_tp_across_nodes: bool,
                     stack: Stack, model_parallel: Optional[bool] = None, seq_len: int = 1, eager: bool = False,
                     cp: Optional[int] = None, etp: Optional[int] = None) -> tuple[Candidates, int, dict[str, int]]:
    """(the plans that break no constraint, how many were considered, rejections by reason); ``model_parallel``:
    only the layouts with (True) or without (False) TP or PP; ``etp``: every plan at this expert TP (space.with_experts)."""
    if etp is not None and not spec.routed:
        raise PlanError(f"--etp {etp}: {spec.name} has no routed experts (a dense model): drop --etp")
    if etp is not None and world % etp:  # ep x etp divides a pipeline stage's dp x cp x tp, world / pp (expert_layout)
        raise PlanError(f"--etp {etp}: an expert tensor-parallel group lies within one pipeline stage's dp x cp x tp "
                        f"ranks, and {world:,} GPUs hold no stage of a multiple of {etp}: give --etp a divisor of "
                        f"{world:,}")
    multi = world > hardware.gpus_per_node
    pairs = layouts(world, spec, seq_len, stack)
    if model_parallel is not None:
        pairs = pairs[np.asarray(api.model_parallel(pairs[:, 0], pairs[:, 1], pairs[:, 2]), dtype=bool) == model_parallel]
    if cp is not None:
        pairs = pairs[pairs[:, 2] == cp]
    if cp is not None and cp > 1 and model_parallel is False:
        pairs = pairs[:0]  # --stack auto costs CP plans in its model-parallel stack, searched beside this one
    elif cp is not None and cp > 1 and not stack.engine.context_parallel:  # layouts() proposes none: say why
        raise PlanError(f"--cp {cp}: {stack.name} runs no context parallelism; use --cp 1 or another --stack "
                        "(advisor stacks: context_parallel)")
    if cp is not None and not len(pairs) and model_parallel is not False:
        raise PlanError(f"--cp {cp}: {world:,} GPUs hold no layout with cp={cp} for --seq {seq_len} (cp must divide "
                        f"the GPUs left by tp x pp, split the sequence into 2 x cp chunks of at least "
                        f"{MIN_TOKENS_PER_CP_RANK // 2:,} tokens, the search's floor, and be a power of two <= 32; "
                        "advisor estimate costs any cp)")
    pair_bad = pair_violations(world, pairs, spec, hardware, allow_tp_across_nodes, stack, seq_len, eager)
    pair_reason = np.full(len(pairs), -1)
    for j, mask in enumerate(pair_bad.values()):
        pair_reason = np.where((pair_reason < 0) & mask, j, pair_reason)
    policies, offloads = policies_of(stack), offloads_of(stack, hardware)
    pruned_counts = count_candidates(world, pairs[pair_reason >= 0], gb, multi, stack, policies, offloads)
    pruned = np.bincount(pair_reason[pair_reason >= 0], weights=pruned_counts, minlength=len(pair_bad))
    kept_pairs = pairs[pair_reason < 0]
    rows = count_candidates(world, kept_pairs, gb, multi, stack, policies, offloads)
    if rows.sum() > SCANNED_SLICES * MAX_CANDIDATES:
        _too_many(world, int(rows.sum()), spec, hardware)
    # the layouts' rows a slice at a time; the expert degrees multiply a slice's rows, which is halved until they fit
    todo = list(_slices(rows, MAX_CANDIDATES)) if spec.routed or rows.sum() > MAX_CANDIDATES else [np.arange(len(rows))]
    kept, rejected, built = [], {}, 0  # rows built and checked (the pruned layouts' are counted, never built)
    while todo:
        idx = todo.pop(0)
        cols = with_experts(enumerate_candidates(world, gb, multi, kept_pairs[idx], stack, policies, offloads), spec, etp)
        if len(cols) > MAX_CANDIDATES and len(idx) > 1:
            todo[:0] = [idx[:len(idx) // 2], idx[len(idx) // 2:]]
            continue
        if len(cols) > MAX_CANDIDATES:
            _too_many(world, len(cols), spec, hardware)
        # the pruned layouts' rows counted with the first slice's, under their reasons
        kept.append(_admit(cols, spec, hardware, world, stack, seq_len, eager, allow_tp_across_nodes, rejected,
                           None if kept else pruned))
        built += len(cols)
        if built > SCANNED_SLICES * MAX_CANDIDATES:  # the expert degrees took the rows past it
            _too_many(world, built, spec, hardware)
    for j, reason in enumerate(pair_bad):  # no layout left to build: the pruned ones counted alone
        if not kept and pruned[j]:
            rejected[reason] = int(pruned[j])
    valid = concat(kept) if kept else with_experts(enumerate_candidates(world, gb, multi, kept_pairs[:0], stack, policies,
                                                                        offloads), spec, etp)
    if len(valid) > MAX_CANDIDATES:
        _too_many(world, len(valid), spec, hardware, " that break no constraint")
    return valid, built + int(pruned_counts.sum()), rejected


def _admit(cols: Candidates, spec: ModelSpec, hardware: Hardware, world: int, stack: Stack, seq_len: int, eager: bool,
           allow_tp_across_nodes: bool, rejected: dict[str, int], pruned: Optional[np.ndarray]) -> Candidates:
    """The rows of ``cols`` that break no constraint; each other counted in ``rejected`` under the first it breaks (and
    ``pruned``'s layouts under theirs, the layout-only reasons being the first of ``violations``)."""
    cols = Candidates(**{**cols.__dict__, "allow_tp_across_nodes": allow_tp_across_nodes,
                         "recompute_k": block_layers(spec, cols)})
    bad = violations(cols, spec, hardware, world, stack, seq_len, eager)
    ok = np.ones(len(cols), dtype=bool)
    for j, (reason, mask) in enumerate(bad.items()):
        newly = int((mask & ok).sum()) + (int(pruned[j]) if pruned is not None and j < len(pruned) else 0)
        if newly:
            rejected[reason] = rejected.get(reason, 0) + newly
        ok &= ~mask
    return cols.take(np.nonzero(ok)[0])


def _too_many(world: int, rows: int, spec: ModelSpec, hardware: Hardware, what: str = "") -> None:
    raise PlanError(f"{world:,} GPUs give {rows:,} candidate plans{what} for {spec.name}, more than the "
                    f"{MAX_CANDIDATES:,} one search evaluates; use fewer GPUs (e.g. --gpus "
                    f"{round_world(world, hardware)}) or --cp to keep one context-parallel degree")
