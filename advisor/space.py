"""The search space: every plan a world size admits, as a table of candidates (no estimates here).

dp x tp x pp factorisations of the world size, ZeRO stage 0-3 (and FSDP HYBRID_SHARD across nodes,
nn.DataParallel inside one node), sequence parallelism, pipeline schedule and virtual stages, micro-batch
size, recomputation, and for a mixture-of-experts model the expert-parallel degree and expert tensor
parallelism (``with_experts``); structural duplicates are left out (SP without TP, schedules without a pipeline,
ZeRO over one replica). advisor.search evaluates and ranks them; advisor.suggest re-runs a corner of
the space when nothing fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.constraints import violations
from advisor.hardware import Hardware
from advisor.layout import Offload, Schedule
from advisor.recompute import SEARCH_K
from advisor.training import Recompute
from advisor.model import ModelSpec
from advisor.parallel import expert


MICRO_BATCHES = np.array([1, 2, 4, 8, 16, 32, 64, 128])
# (schedule, virtual stages)
SCHEDULES = [(Schedule.one_f_one_b, 1), (Schedule.gpipe, 1)] + [(Schedule.interleaved, v) for v in (2, 3, 4, 6, 8)]
# data-parallel variants: 0 DDP/ZeRO, 1 nn.DataParallel, 2 FSDP hybrid shard
VARIANTS = (0, 1, 2)
# checkpointing policies (Recompute codes) and offloads (Offload codes) searched where nothing else is said
TODAY_POLICIES = (Recompute.none.code, Recompute.selective.code, Recompute.full.code)
NO_OFFLOAD = (Offload.none.code,)
# the k each policy is searched with (advisor.recompute.SEARCH_K; block's is set per plan by advisor.search)
K_OF_POLICY = np.array([SEARCH_K.get(r, 1) for r in Recompute])


def policies_of(stack) -> tuple[int, ...]:
    """The checkpointing policies searched for a stack: today's three and those its profile adds."""
    if stack is None:
        return TODAY_POLICIES
    # today's three always (a stack without selective recomputation has its rows rejected, and counted, as before)
    return TODAY_POLICIES + tuple(r.code for r in Recompute if r.value in stack.engine.checkpointing
                                  and r.code not in TODAY_POLICIES)


def offloads_of(stack, hw: Hardware) -> tuple[int, ...]:
    """No offload, and what the stack offloads where the hardware profile describes its host side."""
    if stack is None or hw.host is None:
        return NO_OFFLOAD
    return NO_OFFLOAD + tuple(o.code for o in Offload if o.value in stack.engine.offloads
                              and (hw.host.has_nvme or "nvme" not in o.value))


# Candidate rows evaluated in one vectorised pass: evaluate keeps a few dozen float64 columns per row, so
# 2M rows is ~0.5-1 GB. Realistic clusters stay far below (16,384 GPUs: ~0.5M rows before constraints).
MAX_CANDIDATES = 2_000_000


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def default_global_batch(world: int, seq_len: int) -> int:
    """About half a million tokens per step (GPT-3's smallest models; Brown et al. 2020 Table 2.1),
    rounded up to a multiple of the world size so that every pure-DP plan divides it."""
    target = max(1, round(2**19 / seq_len))
    return int(world * max(1, -(-target // world)))


def tp_pp_pairs(world: int) -> list[tuple[int, int]]:
    """Every (tp, pp) with tp * pp dividing the world size (dp = world / (tp * pp))."""
    return [(tp, pp) for tp in divisors(world) for pp in divisors(world // tp)]


def _grid(tp_a: np.ndarray, pp_a: np.ndarray, dp_a: np.ndarray, global_batch: int, multi_node: bool,
          policies=TODAY_POLICIES, offloads=NO_OFFLOAD):
    """The full grid over pairs x (zero, sp, schedule, micro batch, recompute, variant, offload) and which rows are
    kept; ``policies`` (Recompute codes) and ``offloads`` (Offload codes) are what the stack and hardware offer."""
    grids = np.meshgrid(np.arange(len(tp_a)), np.arange(4), np.arange(2), np.arange(len(SCHEDULES)),
                        np.arange(len(MICRO_BATCHES)), np.asarray(policies), np.array(VARIANTS), indexing="ij")
    pi, zero, sp, si, mi, rc, var = (g.ravel() for g in grids)
    off = np.zeros(len(pi), dtype=np.int64)
    if len(offloads) > 1:  # offload rows exist only under ZeRO-2/3, one process per GPU, no pipeline: built for those
        base = np.nonzero((zero >= 2) & (var == 0) & (pp_a[pi] == 1))[0]
        extra = [base[(zero[base] == 3) | (not Offload.of_code(o).params)] for o in offloads if o != Offload.none.code]
        codes = [np.full(len(e), o) for e, o in zip(extra, [o for o in offloads if o != Offload.none.code])]
        rows = np.concatenate([np.arange(len(pi))] + extra)
        pi, zero, sp, si, mi, rc, var = (x[rows] for x in (pi, zero, sp, si, mi, rc, var))
        off = np.concatenate([off] + codes)
    params_off = (off == Offload.params_cpu.code) | (off == Offload.params_nvme.code)
    tp, pp, dp = tp_a[pi], pp_a[pi], dp_a[pi]
    mb = MICRO_BATCHES[mi]
    multi_node = np.bool_(multi_node)  # ~ of a Python bool is an int (-1/-2), not a negation
    keep = (
        ~((sp == 1) & (tp == 1))  # SP without TP is the same plan
        & ~((pp == 1) & (si != 0))  # schedules only differ with a pipeline
        & (global_batch % (mb * dp) == 0)  # Megatron: global batch divisible by micro_batch x dp
        & ~((var == 1) & ((dp == 1) | (zero > 0) | (tp > 1) | (pp > 1) | multi_node))  # nn.DataParallel: plain DP only
        & ~((var == 2) & ((zero != 3) | ~multi_node))  # hybrid shard: FSDP full-shard across nodes only
        & ~((dp == 1) & (zero > 0) & (off == 0))  # ZeRO over one replica is no ZeRO (but ZeRO-Offload's engine)
        # offload: the optimizer under ZeRO-2 or -3, parameters under ZeRO-3, one process per GPU, no pipeline
        & ~((off > 0) & ((zero < 2) | (var != 0) | (pp > 1)))
        & ~(params_off & (zero != 3))
        & ~((dp == 1) & (off > 0) & ~params_off & (zero == 3))  # one GPU: ZeRO-3 without sharding is ZeRO-2's plan
    )
    return (pi, zero, sp, si, mi, rc, var, off), keep


def count_candidates(world: int, pairs: list[tuple[int, int]], global_batch: int, multi_node: bool,
                     policies=None, offloads=None) -> np.ndarray:
    """Rows ``enumerate_candidates`` keeps per pair, without building them: the count depends on a pair only
    through (dp, tp > 1, pp > 1), so one representative per distinct key is enumerated."""
    if not pairs:
        return np.zeros(0, dtype=np.int64)
    tp_a = np.array([p[0] for p in pairs], dtype=np.int64)
    pp_a = np.array([p[1] for p in pairs], dtype=np.int64)
    keys = np.stack([world // (tp_a * pp_a), np.minimum(tp_a, 2), np.minimum(pp_a, 2)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    counts = np.zeros(len(uniq), dtype=np.int64)
    for start in range(0, len(uniq), 256):  # bounded memory: 256 keys x 4,032 rows at a time
        u = uniq[start:start + 256]
        (pi, *_), keep = _grid(u[:, 1], u[:, 2], u[:, 0], global_batch, multi_node,
                               TODAY_POLICIES if policies is None else policies, NO_OFFLOAD if offloads is None else offloads)
        counts[start:start + len(u)] = np.bincount(pi[keep], minlength=len(u))
    return counts[np.asarray(inverse).reshape(-1)]


def enumerate_candidates(world: int, global_batch: int, multi_node: bool,
                         pairs: Optional[list[tuple[int, int]]] = None, policies=None, offloads=None) -> Candidates:
    """All combinations as a table (structural duplicates removed, constraints not applied).

    ``pairs`` restricts the (tp, pp) layouts (default: all of them)."""
    pairs = tp_pp_pairs(world) if pairs is None else pairs
    tp_a = np.array([p[0] for p in pairs], dtype=np.int64).reshape(-1)
    pp_a = np.array([p[1] for p in pairs], dtype=np.int64).reshape(-1)
    (pi, zero, sp, si, mi, rc, var, off), keep = _grid(
        tp_a, pp_a, world // (tp_a * pp_a), global_batch, multi_node,
        TODAY_POLICIES if policies is None else policies, NO_OFFLOAD if offloads is None else offloads)
    tp, pp = tp_a[pi], pp_a[pi]
    dp = world // (tp * pp)
    sched = np.array([s[0].code for s in SCHEDULES])[si]
    v = np.array([s[1] for s in SCHEDULES])[si]
    mb = MICRO_BATCHES[mi]
    idx = np.nonzero(keep)[0]
    ga = global_batch // (mb[idx] * dp[idx])
    return Candidates(dp=dp[idx], tp=tp[idx], pp=pp[idx], zero=zero[idx], hybrid=var[idx] == 2, sp=sp[idx] == 1,
                      schedule=sched[idx], virtual_stages=v[idx], dp_kind=(var[idx] == 1).astype(int),
                      overlap=np.ones(len(idx), bool), micro_batch=mb[idx], grad_accum=ga, recompute=rc[idx],
                      recompute_k=K_OF_POLICY[rc[idx]], offload=off[idx])


def pair_violations(world: int, pairs: list[tuple[int, int]], spec: ModelSpec, hw: Hardware,
                    allow_tp_across_nodes: bool, stack=None) -> dict[str, np.ndarray]:
    """The constraints that a (tp, pp) layout breaks whatever the rest of the plan (checked once per pair)."""
    tp_a = np.array([p[0] for p in pairs], dtype=np.int64).reshape(-1)
    pp_a = np.array([p[1] for p in pairs], dtype=np.int64).reshape(-1)
    n = len(tp_a)
    c = Candidates(dp=world // (tp_a * pp_a), tp=tp_a, pp=pp_a, zero=np.zeros(n, int), hybrid=np.zeros(n, bool),
                   sp=np.zeros(n, bool), schedule=np.full(n, Schedule.one_f_one_b.code), virtual_stages=np.ones(n, int),
                   dp_kind=np.zeros(n, int), overlap=np.ones(n, bool), micro_batch=np.ones(n, int),
                   grad_accum=np.ones(n, int), recompute=np.zeros(n, int), allow_tp_across_nodes=allow_tp_across_nodes)
    return violations(c, spec, hw, world, stack)


def with_experts(c: Candidates, model: ModelSpec) -> Candidates:
    """Each plan of a mixture-of-experts model once per (ep, etp) its (dp, tp) admits (advisor.parallel.expert.
    ep_choices), where it can split experts (not HSDP or nn.DataParallel: those keep ep 1, etp = tp); a dense model's
    as is."""
    if not model.routed or len(c) == 0:
        return c
    dp, tp = np.broadcast_to(c.dp, (len(c),)), np.broadcast_to(c.tp, (len(c),))
    uniq, inv = np.unique(np.stack([dp, tp], axis=1), axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    choices = [expert.ep_choices(model, int(d), int(t)) for d, t in uniq]
    table = np.ones((len(uniq), max(len(ch) for ch in choices), 2), dtype=np.int64)
    for j, ch in enumerate(choices):
        table[j, :len(ch)] = ch
        table[j, :, 1] = np.where(np.arange(table.shape[1]) < len(ch), table[j, :, 1], uniq[j, 1])
    splits = ~np.broadcast_to(np.asarray(c.hybrid, dtype=bool), (len(c),)) & (
        np.broadcast_to(c.dp_kind, (len(c),)) == 0)
    reps = np.where(splits, np.array([len(ch) for ch in choices])[inv], 1)
    idx = np.repeat(np.arange(len(c)), reps)
    offs = np.arange(len(idx)) - np.repeat(np.cumsum(reps) - reps, reps)
    pick = table[inv[idx], offs]
    # a plan that cannot split experts keeps them as tensor parallelism splits them
    keep = np.repeat(splits, reps)
    ep = np.where(keep, pick[:, 0], 1)
    etp = np.where(keep, pick[:, 1], tp[idx])
    out = c.take(idx)
    return replace(out, ep=ep, etp=etp)
