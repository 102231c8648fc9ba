"""The search space: every plan a world size admits, as a table of candidates (no estimates here).

dp x tp x cp x pp factorisations of the world size (cp a power of two up to advisor.parallel.context.MAX_CP,
in each context-parallel flavour the stack runs, where the sequence splits into 2 x cp chunks; pipelines split
evenly, or unevenly where the stack can and the layers do not divide), ZeRO stage 0-3 (and FSDP HYBRID_SHARD
across nodes, nn.DataParallel inside one node), sequence parallelism, pipeline schedule (the zero-bubble ones
where the stack runs them) and virtual stages, micro-batch size, recomputation (the checkpointing policies the stack runs), offload (where the stack and the
host side allow it), and for a mixture-of-experts model the expert-parallel degree and expert tensor
parallelism (``with_experts``); structural duplicates are left out (SP without TP, schedules without a pipeline,
ZeRO over one replica). advisor.search evaluates and ranks them; advisor.suggest re-runs a corner of
the space when nothing fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.constraints import violations
from advisor.hardware import Hardware
from advisor.layout import ContextParallel, Offload, PipelineSplit, Schedule
from advisor.model import ModelSpec
from advisor.parallel import expert_layout, offload
from advisor.parallel.context import MAX_CP
from advisor.recompute import SEARCH_K
from advisor.training import Recompute

# The search's smallest share of a sequence per context-parallel rank (a bound of the space, as MAX_CP; estimate
# takes any cp): below it tensor and sequence parallelism already split the activations as well, and a ring step's
# attention block, (s / cp)^2 / 2 scores, is too short to hide its K/V transfer. Published runs keep far more:
# Llama 3 405B at 131,072 tokens with CP 16 holds 8,192 per rank (Dubey et al. 2024 s.3.3.2).
MIN_TOKENS_PER_CP_RANK = 2048


MICRO_BATCHES = np.array([1, 2, 4, 8, 16, 32, 64, 128])
# (schedule, virtual stages)
SCHEDULES = [(Schedule.one_f_one_b, 1), (Schedule.gpipe, 1)] + [(Schedule.interleaved, v) for v in (2, 3, 4, 6, 8)] + [
    (Schedule.zb_h1, 1), (Schedule.zb_v, 2), (Schedule.dualpipe_v, 2)]
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


def layouts(world: int, spec: ModelSpec, seq_len: int, stack=None) -> np.ndarray:
    """Every (tp, pp, cp, cp flavour code, pipeline split code) the search considers, one row each: the (tp, pp)
    pairs, cp a power of two up to MAX_CP dividing what is left, splitting the sequence into 2 x cp chunks and
    leaving a rank MIN_TOKENS_PER_CP_RANK, in each flavour the stack runs (all without a stack); the uneven split
    where the stack runs it and the layers do not divide."""
    eng = stack.engine if stack is not None else None
    flavours = np.array([k.code for k in ContextParallel if eng is None or k.value in eng.context_parallel], dtype=np.int64)
    uneven = eng is None or PipelineSplit.edges.value in eng.pipeline_splits
    pairs = np.array(tp_pp_pairs(world), dtype=np.int64).reshape(-1, 2)
    tp, pp = pairs[:, 0], pairs[:, 1]
    rest = world // (tp * pp)
    rows = [np.stack([tp, pp, np.ones_like(tp), np.full_like(tp, ContextParallel.ring.code), np.zeros_like(tp)], axis=1)]
    for cp in (2 ** k for k in range(1, MAX_CP.bit_length())):
        if seq_len % (2 * cp) or seq_len // cp < MIN_TOKENS_PER_CP_RANK:
            continue
        ok = rest % cp == 0
        for kind in flavours:
            n = int(ok.sum())
            rows.append(np.stack([tp[ok], pp[ok], np.full(n, cp), np.full(n, kind), np.zeros(n, dtype=np.int64)], axis=1))
    out = np.concatenate(rows)
    if uneven:
        edges = out[(out[:, 1] > 1) & (spec.n_layers % out[:, 1] != 0)].copy()
        edges[:, 4] = PipelineSplit.edges.code
        out = np.concatenate([out, edges])
    return out


def _columns(pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tp, pp, cp, cp flavour, split) arrays of (tp, pp) pairs or (tp, pp, cp, flavour, split) layouts."""
    a = np.asarray(pairs, dtype=np.int64)
    if a.size == 0:
        return tuple(np.zeros(0, dtype=np.int64) for _ in range(5))
    a = a.reshape(len(a), -1)
    if a.shape[1] == 2:
        a = np.concatenate([a, np.tile([1, 0, 0], (len(a), 1))], axis=1)
    return a[:, 0], a[:, 1], a[:, 2], a[:, 3], a[:, 4]


def schedules_run(stack=None) -> np.ndarray:
    """Which SCHEDULES the stack runs (every one without a stack): the zero-bubble ones only where it lists them."""
    zb = (Schedule.zb_h1, Schedule.zb_v, Schedule.dualpipe_v)
    return np.array([s not in zb or stack is None or s.value in stack.engine.zero_bubble for s, _ in SCHEDULES])


def _grid(tp_a: np.ndarray, pp_a: np.ndarray, dp_a: np.ndarray, global_batch: int, multi_node: bool,
          stack=None, policies=TODAY_POLICIES, offloads=NO_OFFLOAD, cp_a=None):
    """The kept rows of the grid over pairs x (zero, sp, schedule, micro batch, recompute, variant), as the index
    of each axis (the recompute axis as Recompute codes, ``policies``), and each row's Offload code: the keep rule is
    evaluated on broadcast axes, only kept rows are built, and offload rows (``offloads``, what the stack and the host
    side allow) are added where they can exist: ZeRO-2/3, one process per GPU, no pipeline. ``cp_a``: the layouts'
    context-parallel degrees (ZeRO shards over dp x cp: Megatron's distributed optimizer, FSDP over the CP mesh)."""
    shape = (len(tp_a), 4, 2, len(SCHEDULES), len(MICRO_BATCHES), len(policies), len(VARIANTS))

    def axis(values, k):
        return np.asarray(values).reshape([-1 if j == k else 1 for j in range(len(shape))])

    tp, pp, dp = axis(tp_a, 0), axis(pp_a, 0), axis(dp_a, 0)
    zero, sp, si = axis(np.arange(4), 1), axis(np.arange(2), 2), axis(np.arange(len(SCHEDULES)), 3)
    mb, var = axis(MICRO_BATCHES, 4), axis(np.array(VARIANTS), 6)
    multi_node = np.bool_(multi_node)  # ~ of a Python bool is an int (-1/-2), not a negation
    # a stack offloading the first k layers (Megatron's CPU offload) does so without a pipeline only (advisor.constraints)
    first_k = stack is not None and stack.engine.activation_offload == "first_k"
    offload_piped = (axis(np.asarray(policies), 5) == Recompute.offload.code) & (pp > 1) & first_k
    keep = (
        ~((sp == 1) & (tp == 1))  # SP without TP is the same plan
        & ~((pp == 1) & (si != 0))  # schedules only differ with a pipeline
        & (global_batch % (mb * dp) == 0)  # Megatron: global batch divisible by micro_batch x dp
        & ~((var == 1) & ((dp == 1) | (zero > 0) | (tp > 1) | (pp > 1) | multi_node))  # nn.DataParallel: plain DP only
        & ~((var == 2) & ((zero != 3) | ~multi_node))  # hybrid shard: FSDP full-shard across nodes only
        & axis(schedules_run(stack), 3)  # zero-bubble schedules where the stack runs them
        & ~offload_piped
    )
    keep = np.broadcast_to(keep, shape)
    pi, zero, sp, si, mi, rc, vi = np.unravel_index(np.flatnonzero(keep), shape)
    rc, var = np.asarray(policies, dtype=np.int64)[rc], np.asarray(VARIANTS)[vi]
    one = dp_a[pi] * (1 if cp_a is None else cp_a[pi]) == 1  # the ZeRO group, dp x cp, is one rank
    plain = ~(one & (zero > 0))  # ZeRO over one replica is no ZeRO (but ZeRO-Offload's engine, below)
    cols = [[x[plain]] for x in (pi, zero, sp, si, mi, rc, var)]
    off = [np.zeros(int(plain.sum()), dtype=np.int64)]
    # the optimizer offloaded under ZeRO-2 or -3 (on one GPU, ZeRO-3 without sharding is ZeRO-2's plan), or under the
    # distributed optimizer where the stack's is Megatron's (advisor.parallel.offload.hybrid); parameters under ZeRO-3
    base = (((zero == 1) if offload.hybrid(stack) else (zero >= 2)) & (var == 0) & (pp_a[pi] == 1))
    for o in offloads:
        if o == Offload.none.code:
            continue
        sel = base & ((zero == 3) if Offload.of_code(o).params else ~(one & (zero == 3)))
        for col, x in zip(cols, (pi, zero, sp, si, mi, rc, var)):
            col.append(x[sel])
        off.append(np.full(int(sel.sum()), o, dtype=np.int64))
    return (*(np.concatenate(c) for c in cols), np.concatenate(off))


def count_candidates(world: int, pairs: list[tuple[int, int]], global_batch: int, multi_node: bool,
                     stack=None, policies=None, offloads=None) -> np.ndarray:
    """Rows ``enumerate_candidates`` keeps per pair, without building them: the count depends on a pair only
    through (dp, tp > 1, pp > 1), so one representative per distinct key is enumerated."""
    if len(pairs) == 0:
        return np.zeros(0, dtype=np.int64)
    tp_a, pp_a, cp_a, _, _ = _columns(pairs)
    # one integer key per (dp, tp > 1, pp > 1, cp > 1): np.unique on rows sorts a structured view, ~10x slower
    key = (world // (tp_a * pp_a * cp_a)) * 8 + (tp_a > 1) * 4 + (pp_a > 1) * 2 + (cp_a > 1)
    ukey, inverse = np.unique(key, return_inverse=True)
    uniq = np.stack([ukey // 8, 1 + (ukey // 4) % 2, 1 + (ukey // 2) % 2, 1 + ukey % 2], axis=1)
    counts = np.zeros(len(uniq), dtype=np.int64)
    for start in range(0, len(uniq), 128):  # bounded memory: 128 keys x 5,760 rows at a time
        u = uniq[start:start + 128]
        pi, *_ = _grid(u[:, 1], u[:, 2], u[:, 0], global_batch, multi_node, stack,
                       TODAY_POLICIES if policies is None else policies, NO_OFFLOAD if offloads is None else offloads,
                       u[:, 3])
        counts[start:start + len(u)] = np.bincount(pi, minlength=len(u))
    return counts[np.asarray(inverse).reshape(-1)]


def enumerate_candidates(world: int, global_batch: int, multi_node: bool,
                         pairs: Optional[list[tuple[int, int]]] = None, stack=None, policies=None, offloads=None) -> Candidates:
    """All combinations as a table (structural duplicates removed, constraints not applied).

    ``pairs`` restricts the layouts: (tp, pp) pairs (cp 1, even split) or ``layouts`` (default: every pair)."""
    pairs = tp_pp_pairs(world) if pairs is None else pairs
    tp_a, pp_a, cp_a, kind_a, split_a = _columns(pairs)
    pi, zero, sp, si, mi, rc, var, off = _grid(tp_a, pp_a, world // (tp_a * pp_a * cp_a), global_batch, multi_node, stack,
                                               TODAY_POLICIES if policies is None else policies,
                                               NO_OFFLOAD if offloads is None else offloads, cp_a)
    tp, pp, cp = tp_a[pi], pp_a[pi], cp_a[pi]
    dp = world // (tp * pp * cp)
    sched = np.array([s[0].code for s in SCHEDULES])[si]
    v = np.array([s[1] for s in SCHEDULES])[si]
    mb = MICRO_BATCHES[mi]
    ga = global_batch // (mb * dp)
    return Candidates(dp=dp, tp=tp, pp=pp, zero=zero, hybrid=var == 2, sp=sp == 1,
                      schedule=sched, virtual_stages=v, dp_kind=(var == 1).astype(int),
                      overlap=np.ones(len(pi), bool), micro_batch=mb, grad_accum=ga, recompute=rc,
                      recompute_k=K_OF_POLICY[rc], offload=off, cp=cp, cp_comm=kind_a[pi], pp_split=split_a[pi])


def pair_violations(world: int, pairs: list[tuple[int, int]], spec: ModelSpec, hw: Hardware,
                    allow_tp_across_nodes: bool, stack=None, seq_len: Optional[int] = None,
                    eager: bool = False) -> dict[str, np.ndarray]:
    """The constraints that a layout ((tp, pp) pair or ``layouts`` entry) breaks whatever the rest of the plan
    (checked once per layout). The uneven split's divisibility is checked here for one chunk per rank only."""
    tp_a, pp_a, cp_a, kind_a, split_a = _columns(pairs)
    n = len(tp_a)
    c = Candidates(dp=world // (tp_a * pp_a * cp_a), tp=tp_a, pp=pp_a, zero=np.zeros(n, int), hybrid=np.zeros(n, bool),
                   sp=np.zeros(n, bool), schedule=np.full(n, Schedule.one_f_one_b.code), virtual_stages=np.ones(n, int),
                   dp_kind=np.zeros(n, int), overlap=np.ones(n, bool), micro_batch=np.ones(n, int),
                   grad_accum=np.ones(n, int), recompute=np.zeros(n, int), allow_tp_across_nodes=allow_tp_across_nodes,
                   cp=cp_a, cp_comm=kind_a, pp_split=split_a)
    return violations(c, spec, hw, world, stack, seq_len, eager, layout_only=True)


def with_experts(c: Candidates, model: ModelSpec, etp: Optional[int] = None) -> Candidates:
    """Each plan of a mixture-of-experts model once per (ep, etp) its (dp, tp, cp) admits (advisor.parallel.
    expert_layout.ep_choices), where it can split experts (not HSDP or nn.DataParallel: those keep ep 1, etp = tp); a
    dense model's as is. ``etp`` (plan's --etp): every row at that etp, one (ep 1, etp) row where its layout admits none
    (and HSDP's and nn.DataParallel's at it too), refused by advisor.parallel.expert_layout.violations under its reason,
    so counted."""
    if not model.routed or len(c) == 0:
        return c
    dp, tp, cp = (np.broadcast_to(x, (len(c),)) for x in (c.dp, c.tp, c.cp))
    uniq, inv = np.unique(np.stack([dp, tp, cp], axis=1), axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    choices = [expert_layout.ep_choices(model, int(d), int(t), etp, int(k)) or [(1, etp)] for d, t, k in uniq]
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
    etp = np.where(keep, pick[:, 1], tp[idx] if etp is None else etp)
    out = c.take(idx)
    return replace(out, ep=ep, etp=etp)


def block_layers(spec: ModelSpec, c: Candidates) -> Any:
    """The candidates' k, with Megatron's block method searched at half of each stage chunk's layers checkpointed
    (the rest of its chunk keeps everything: the middle of the memory/recompute trade), and activation offload at half
    the layers offloaded (where the stack offloads the first k: without pipeline parallelism, of the model's)."""
    block, off = c.recompute == Recompute.block.code, c.recompute == Recompute.offload.code
    if not (block.any() or off.any()):
        return c.recompute_k
    v = np.where(c.schedule == Schedule.interleaved.code, c.virtual_stages, 1)
    chunk = np.maximum(np.ceil(spec.n_layers / (c.pp * v)), 1)
    return np.where(off, max(spec.n_layers // 2, 1), np.where(block, np.ceil(chunk / 2.0).astype(int), c.recompute_k))


def held_worlds(ladder: list[int], *degrees: Optional[int]) -> list[int]:
    """The GPU counts of a range that every given degree divides (plan's --cp and --etp split a pipeline stage's
    ranks), or all of them where none does: the first count's search then refuses the degree, saying why
    (advisor.admissible)."""
    return [w for w in ladder if not any(w % d for d in degrees if d)] or ladder
