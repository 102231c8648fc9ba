"""What would fit when no plan does: computed, not guessed.

When every plan of a search is rejected, this re-runs the least-memory corner of the search space
(micro batch 1, full recomputation, every ZeRO stage and tp x pp x cp layout the constraints allow) for
other GPU counts (doubling, then bisecting in whole nodes), shorter sequences and the profiles with
more GPU memory, and names the first that fits. When constraints rather than memory reject every
plan, it names the constraints and their counts.

Where the stack compiles and the search ran eager, it says whether --compile model,loss fits.
Deliberately left out: CPU/NVMe offload (the search itself proposes it where the profile has a host side),
changing the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.constraints import setup_violations, setup_wide, stack_violations
from advisor.errors import AdvisorError
from advisor.hardware import Hardware, list_profiles, load_hardware
from advisor.model import ModelSpec
from advisor.parallel import expert_layout
from advisor.ranking import PlanSearch
from advisor.options import MAX_WORLD
from advisor.space import default_global_batch, layouts, pair_violations
from advisor.stack import StackError
from advisor.step import evaluate
from advisor.training import Recompute
from advisor.units import GiB
from advisor.workload import Workload


def _gpus(n: int) -> str:
    return f"{n:,} GPU{'' if n == 1 else 's'}"


def lean_recompute(stack) -> Recompute:
    """The checkpointing policy of the least memory the stack runs: full, else selective, else none (nanotron's)."""
    eng = stack.engine
    return (Recompute.full if "full" in eng.checkpointing else
            Recompute.selective if eng.selective is not None and "selective" in eng.checkpointing else Recompute.none)


def _lean_columns(world: int, spec: ModelSpec, hw: Hardware, gb: int, allow_tp: bool, stack,
                  seq: int, setup=None) -> Optional[Candidates]:
    """The least-memory corner of the search space for one world size: micro batch 1, the stack's leanest
    recomputation, every (tp, pp, cp) layout that passes the layout constraints (context parallelism in each flavour
    the stack runs, where the sequence splits: a long sequence fits only so), every ZeRO stage it allows, SP on and
    off; none the stack or the setup's choices refuse (adapters under TP where the stack runs them data-parallel)."""
    lays = layouts(world, spec, seq, stack)
    lays = lays[lays[:, 4] == 0]  # the even pipeline split: the uneven one holds no less on its busiest rank
    bad = np.zeros(len(lays), dtype=bool)
    for mask in pair_violations(world, lays, spec, hw, allow_tp, stack, seq_len=seq).values():
        bad |= mask
    rows = []
    for (tp, pp, cp, kind, _), b in zip(lays.tolist(), bad):
        dp = world // (tp * pp * cp)
        if b or gb % dp:
            continue
        for zero in ((0,) if dp * cp == 1 else (0, 1, 2, 3) if pp == 1 else (0, 1)):
            rows.extend((dp, tp, pp, zero, sp, cp, kind, ep, etp) for sp in ((0, 1) if tp > 1 else (0,))
                        for ep, etp in expert_layout.ep_choices(spec, dp, tp, cp=cp))  # experts split: less memory
    if not rows:
        return None
    a = np.array(rows, dtype=np.int64)
    n = len(a)
    cols = Candidates(dp=a[:, 0], tp=a[:, 1], pp=a[:, 2], zero=a[:, 3], hybrid=np.zeros(n, bool), sp=a[:, 4] == 1,
                      schedule=np.ones(n, int), virtual_stages=np.ones(n, int), dp_kind=np.zeros(n, int),
                      overlap=np.ones(n, bool), micro_batch=np.ones(n, int), grad_accum=gb // a[:, 0],
                      recompute=np.full(n, lean_recompute(stack).code), allow_tp_across_nodes=allow_tp, cp=a[:, 5],
                      cp_comm=a[:, 6], ep=a[:, 7], etp=a[:, 8])
    refused = [*stack_violations(cols, stack).values(), *(setup_violations(cols, setup, stack).values() if setup else ())]
    runs = ~np.any(refused or [np.zeros(n, bool)], axis=0)
    return cols.take(np.nonzero(runs)[0]) if runs.any() else None


def _stacks(s: PlanSearch, world: int, hw: Hardware) -> list:
    """The stacks a search on ``world`` GPUs costs its plans in: the one it ran, or under --stack auto the stack auto
    picks for that many GPUs (one GPU's may not be many's) beside the one of its TP/PP/CP plans."""
    if s.stack_rule is None:
        return [s.stack]
    from advisor.auto import model_parallel_partner, resolve_stack

    chosen = resolve_stack("auto", s.model_spec, hw, s.setup, gpus=world)[0]
    mp = model_parallel_partner(chosen, s.model_spec, s.setup) if world > 1 else None  # one GPU: no TP/PP/CP plan
    return [chosen] + ([mp] if mp is not None else [])


def _batch(s: PlanSearch, world: int, seq: Optional[int] = None) -> int:
    """The global batch a search on ``world`` GPUs runs: the default for that many, or the one given."""
    return default_global_batch(world, seq or s.seq_len) if s.global_batch_defaulted else s.global_batch


def _leanest(s: PlanSearch, world: int, seq: Optional[int] = None, hw: Optional[Hardware] = None,
             compile: Optional[str] = None, gb: Optional[int] = None) -> tuple[float, Optional[str]]:
    """(least per-GPU memory of any plan on ``world`` GPUs, its label); (inf, None) when no layout is valid."""
    hw = hw or s.hardware
    seq = seq or s.seq_len
    gb = gb or _batch(s, world, seq)
    best: tuple[float, Optional[str]] = (float("inf"), None)
    for stack in _stacks(s, world, hw):
        # the batch all-to-all overlap changes no memory, and its rules (EP, no full recomputation) refuse the lean corner
        setup = s.setup.model_copy(update={"seq_len": seq, "global_batch": gb, "compile": compile or s.setup.compile,
                                           "stack": stack.name, "moe_overlap": None if s.setup.moe_overlap == "batch"
                                           else s.setup.moe_overlap})
        cols = _lean_columns(world, s.model_spec, hw, gb, s.allow_tp_across_nodes, stack, seq, setup)
        if cols is None:
            continue
        out = evaluate(Workload.of(s.model_spec, hw, stack, setup), cols)
        need = out.memory.peak + out.overhead.total
        i = int(np.argmin(need))
        if float(need[i]) < best[0]:
            label = cols.plan(i).label() + (f" in {stack.name}" if s.stack_rule is not None else "")
            rc = lean_recompute(stack)
            best = (float(need[i]), f"{label}, {'no' if rc is Recompute.none else rc.value} recomputation")
    return best


def _fits(s: PlanSearch, world: int, **kw) -> tuple[bool, float, Optional[str]]:
    hw = kw.get("hw") or s.hardware
    need, label = _leanest(s, world, **kw)
    return need <= hw.gpu.memory_bytes * (1.0 - s.memory_headroom), need, label


def _compiled_fits(s: PlanSearch) -> bool:
    """Whether the leanest plan fits compiled; False where the stack has no compiled tables for this model (its
    profile compiles others: the tip is for a case it measured, never an error in place of the real answer)."""
    try:
        return _fits(s, s.world_size, compile="model,loss")[0]
    except StackError:
        return False


def min_fitting_world(s: PlanSearch) -> Optional[tuple[int, str]]:
    """The fewest GPUs (whole nodes beyond one node) on which the leanest plan fits, by doubling then bisecting."""
    gpn = s.hardware.gpus_per_node
    snap = lambda w: w if w <= gpn else -(-w // gpn) * gpn  # noqa: E731
    lo, hi, w = s.world_size, None, snap(s.world_size * 2)
    while w <= MAX_WORLD:
        ok, _, label = _fits(s, w)
        if ok:
            hi = (w, label)
            break
        lo, w = w, snap(w * 2)
    if hi is None:
        return None
    step = gpn if lo >= gpn else 1
    a, b = lo // step, hi[0] // step  # bisect in units of nodes (or GPUs below one node)
    while b - a > 1:
        mid = (a + b) // 2
        ok, _, label = _fits(s, mid * step)
        if ok:
            b, hi = mid, (mid * step, label)
        else:
            a = mid
    return hi


def _adapters_fit(s: PlanSearch, search: Optional[Callable[..., PlanSearch]]) -> Optional[str]:
    """For a full fine-tune that fits nowhere here, the first of LoRA and QLoRA whose search on the same GPUs finds a
    plan (the seeds' single-GPU branch: "ZeRO + CPU offload, or fine-tune adapters"); None where neither does, where
    adapters are already trained, or for a mixture of experts (adapters on it are not costed: advisor.finetune).
    ``search`` is advisor.search.plan, passed in (the search imports this module's neighbours: no import cycle)."""
    if search is None or s.setup.finetune.adapters or s.model_spec.layer.routed:
        return None
    for method in ("lora", "qlora"):
        try:
            found = search(s.model_spec, s.hardware, gpus=s.world_size, seq=s.seq_len, top=1, method=method,
                         global_batch=None if s.global_batch_defaulted else s.global_batch,
                         precision=s.setup.precision.value, stack="auto" if s.stack_rule is not None else s.stack)
        except AdvisorError:  # e.g. a stack that runs no adapters: no tip
            continue
        if found.plans:
            return method
    return None


def _unaccumulated(s: PlanSearch) -> list[str]:
    """Where a stack's FSDP keeps no gradients across micro-batches (engine.accumulation none: torch 1.11, whose
    _prep_grads_for_backward drops a sharded gradient at the next backward) and the batch takes several a GPU, the
    leanest plan costed is a DDP one: say why FSDP was not among them and whether one micro-batch a step fits."""
    world, gb = s.world_size, _batch(s, s.world_size)
    stacks = [st for st in _stacks(s, world, s.hardware) if st.engine.accumulation == "none"
              and {"zero2", "zero3", "hsdp"} & set(st.engine.offers)]
    if not stacks or gb <= world or gb % world:  # one sample a GPU already, or a batch pure DP cannot split
        return []
    name = " and ".join(st.name for st in stacks)
    tip = (f"{name}'s FSDP is not among them: it keeps no gradients across micro-batches, so it runs one micro-batch "
           f"a step, of {gb // world:,} samples a GPU at global batch {gb:,} on {_gpus(world)}")
    ok, need, label = _fits(s, world, gb=world)
    if label:
        fits = "fits" if ok else f"still needs {need / GiB:,.1f} GiB per GPU"
        tip += f"; --global-batch {world} (one sample a GPU a step) {fits} on {_gpus(world)} ({label}, micro batch 1)"
    return [tip]


def suggest_fix(s: PlanSearch, search: Optional[Callable[..., PlanSearch]] = None) -> str:
    """What would fit, computed: the fewest GPUs, a shorter sequence, adapters in place of a full fine-tune (with
    ``search``, advisor.search.plan), a GPU with more memory; or the constraint that rejected every plan."""
    tips = []
    if s.rejected.get("does not fit in memory"):
        cap = s.hardware.gpu.memory_bytes * (1.0 - s.memory_headroom)
        ok, need, label = _fits(s, s.world_size)
        if label:
            tips.append(f"even the leanest plan costed on {_gpus(s.world_size)} ({label}, micro batch 1) needs "
                        f"{need / GiB:,.1f} GiB per GPU, more than the {cap / GiB:,.1f} GiB usable")
            tips.extend(_unaccumulated(s))  # why the plans costed hold no FSDP one, where they do not
        found = min_fitting_world(s)
        if found:
            tips.append(f"it fits on --gpus {found[0]:,} ({found[1]}, micro batch 1)")
        else:
            tips.append(f"no GPU count up to {MAX_WORLD:,} fits it on {s.hardware.name}")
        # torch.compile where the stack compiles and the search did not: its fused kernels keep less (the compiled
        # loss 4 bytes a logit where eager keeps 14)
        if s.setup.compile == "none" and s.stack.compile_refusal("model,loss") is None \
                and _compiled_fits(s):
            tips.append(f"--compile model,loss fits on {_gpus(s.world_size)}")
        seq = s.seq_len // 2
        while seq >= 128:
            if _fits(s, s.world_size, seq=seq)[0]:
                tips.append(f"--seq {seq} fits on {_gpus(s.world_size)}")
                break
            seq //= 2
        if (method := _adapters_fit(s, search)) is not None:
            tips.append(f"--method {method} (adapters on a frozen base) fits on {_gpus(s.world_size)}")
        if s.hardware.host is None:  # offload.violations refuse every offloaded plan without it
            # (the adapters' own activation and optimizer offload, --method auto's last rung, is costed without it)
            tips.append(f"no ZeRO-Offload or FSDP offload was costed: profile {s.hardware.name} has no host: section "
                        "(host memory, PCIe per GPU, CPU Adam rate), which those offload plans need: `advisor "
                        f"calibrate --host --base {s.hardware.name} --out FILE` on the machine measures one")
        bigger = [h for h in (load_hardware(p) for p in list_profiles()) if h.gpu.memory_bytes > s.hardware.gpu.memory_bytes]
        for h in sorted(bigger, key=lambda h: h.gpu.memory_bytes):
            if _fits(s, s.world_size, hw=h)[0]:
                tips.append(f"--hw {h.name} ({h.gpu.memory_GiB:g} GiB GPUs) fits on {_gpus(s.world_size)}")
                break
    else:
        wide = setup_wide(s.setup)  # rejects every plan, whichever reason each was counted under first
        worst = sorted(s.rejected.items(), key=lambda kv: (kv[0] not in wide, -kv[1]))[:2]
        if worst:
            tips.append("every plan breaks a constraint: " + ", ".join(
                f"{r} ({'every plan' if r in wide else f'{n:,} plans'})" for r, n in worst))
        if s.candidates == 0 or not worst:
            tips.append(f"no dp x tp x pp layout of {s.world_size:,} GPUs has a dp that divides global batch "
                        f"{s.global_batch:,}; use --global-batch a multiple of {s.world_size:,}")
        else:
            tips.append("see --explain for every rejection; change --gpus or --global-batch")
    return "; ".join(tips)
