"""Search: enumerate every plan for a model, profile and cluster, evaluate them at once, rank, explain.

The space (advisor.space): dp x tp x pp factorisations of the world size, ZeRO stage 0-3 (and FSDP
HYBRID_SHARD across nodes, nn.DataParallel inside one node), sequence parallelism, pipeline schedule and
virtual stages, micro-batch size, recomputation; over one GPU count or a ladder of them (``--gpus A:B``: A,
2A, 4A, ... up to B). Candidates are one table; constraints (advisor.constraints) and the cost model
(advisor.step.evaluate) run once over all of them, with no Python loop per plan. Rejections are counted by
reason. Each plan is ranked once, with the checkpointing policy that ranks best among those that fit, costed in the
stack named or under ``--stack auto`` in its kind's (api.AUTO_RULE, as ``estimate``), ranked by the objective
(advisor.ranking) and explained by the seeds' decision tree (advisor.explain); advisor.suggest says what would fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from advisor import api
from advisor.admissible import valid_candidates
from advisor.api import PlanError, resolve_precision, resolve_world
from advisor.auto import model_parallel_partner, offloads_only
from advisor.candidates import Candidates
from advisor.constraints import drop_setup_violations
from advisor.errors import AdvisorError, format_validation_error
from advisor.explain import KIND_NAMES, decision_tree, explain, kind_codes
from advisor.export import unwritable
from advisor.hardware import Hardware, load_hardware
from advisor.layout import Offload
from advisor.model import ModelSpec, load_model
from advisor.options import DEFAULT_HEADROOM, MAX_WORLD, PlanOptions, modules_of, moe_setup, stack_name
from advisor.ranking import OBJECTIVES, TIE_BAND, PlanSearch, RankedPlan, coarse, first_per_plan, objective_key  # noqa: F401
from advisor.results import host_fits, make_estimate
from advisor.space import default_global_batch, held_worlds
from advisor.precision import RecipeError
from advisor.stack import Stack, StackError, list_stacks, load_stack
from advisor.step import Evaluation, evaluate
from advisor.training import TrainingSetup
from advisor.units import fmt_seconds_3g
from advisor.workload import Workload, stack_runs, stack_setup


def plan(model, hw, *, gpus=None, nodes: Optional[int] = None, seq: Optional[int] = None,
         global_batch: Optional[int] = None, precision: Optional[str] = None, attention: str = "sdpa",
         optimizer: Optional[str] = None, stack="auto", memory_headroom: float = DEFAULT_HEADROOM, objective: str = "time",
         top: int = 10, tokens=None, allow_tp_across_nodes: bool = False, method: str = "full", lora_rank: int = 8,
         lora_alpha: float = 16.0, lora_dropout: float = 0.0, lora_targets: Optional[str] = None, dora: bool = False,
         quant: Optional[str] = None, double_quant: bool = True, optimizer_8bit: bool = False, paged: bool = False,
         adapter_offload: str = "none", lora_library: Optional[str] = None,
         moe_capacity_factor: Optional[float] = None, moe_imbalance: float = 1.0, cp: Optional[int] = None,
         moe_dispatcher: Optional[str] = None, moe_overlap: Optional[str] = None, tp_overlap: Optional[str] = None,
         compile: str = "none", mtp_layers: int = 0, fp8_attention: bool = False, recompute_modules: Optional[str] = None,
         etp: Optional[int] = None, **unknown) -> PlanSearch:
    """Search every valid plan for ``model`` on ``gpus`` GPUs of ``hw`` and return the ``top`` best by
    ``objective``, each with its estimate and the reason for its rank: the Python API of `advisor plan`.

    ``model``: a catalogue name, a Hugging Face config.json path or a ModelSpec; ``hw``: a profile name, a YAML
    path or a Hardware. ``gpus``: a count, or a range ``"64:1024"`` (or ``(64, 1024)``) searched as 64, 128, ...
    1024 (default: ``nodes`` x the GPUs of a node, or one node). ``seq`` defaults to the model's context length
    (at most 8192), ``global_batch`` to ~0.5M tokens (a multiple of the largest GPU count), ``precision`` to the
    GPU's best, ``stack`` to auto (each plan in the stack a user of its kind most likely runs: api.AUTO_RULE, each
    row naming its stack); ``any`` ranks the plans of every stack (``advisor stacks``), each row naming its own.
    ``objective``: time, throughput (tokens/s per GPU), cost (USD per token) or memory (advisor.ranking).
    ``tokens``: a token budget (a number or "1T", "300B") whose training time and cost each plan reports.
    ``cp``: only plans of this context-parallel degree (default: every degree the space holds, advisor.space);
    ``recompute_modules``: only selective plans, rerunning these; ``etp``: every plan at this expert TP (as estimate's). ``memory_headroom``: the fraction of GPU memory kept free beyond the modelled overheads. Every bad value is
    an AdvisorError of one line. Fine-tuning: ``method`` (full, lora, qlora, or auto: advisor.methods picks the
    first that fits of full, LoRA, QLoRA and QLoRA with CPU offload) and the adapters' options, as ``estimate``'s.
    A mixture-of-experts model's plans also choose the expert-parallel degree (and expert tensor parallelism);
    ``moe_capacity_factor`` (default dropless) and ``moe_imbalance`` (default 1: balanced routing) say how its tokens
    are routed, ``moe_dispatcher`` and ``moe_overlap`` how they travel; tp_overlap, compile, mtp_layers, fp8_attention: estimate's.
    """
    given = {k: v for k, v in locals().items() if k not in ("model", "hw", "unknown")}
    o = PlanOptions.of(given, unknown, "plan")
    if o.method == "auto":
        from advisor.methods import plan_auto

        return plan_auto(plan, model, hw, given)
    spec, hardware = load_model(model), load_hardware(hw)
    if o.objective == "cost" and hardware.price_per_gpu_hour_usd is None:
        raise PlanError(f"profile {hardware.name} has no price_per_gpu_hour_usd; add it or use --objective time")
    worlds = _worlds(o, hardware)
    setup = _setup(o, spec, hardware, max(worlds))
    chosen, fits_one = api.resolve_stack(o.stack, spec, hardware, setup,
                                         headroom=o.memory_headroom, gpus=max(worlds))
    # every row names its stack; "auto" costs each plan kind in its own (api.AUTO_RULE): the data-parallel plans in
    # ``chosen``, the TP and PP plans in api.AUTO_MODEL_PARALLEL
    parts: dict[str, Optional[bool]] = {}  # stack name -> which plans it costs (True: TP/PP, False: data-parallel)
    left_out: dict[str, str] = {}  # --stack any: the stacks it could not search, and why
    if o.stack == "any":  # every stack's plans ranked together
        stacks = _describing(spec, hardware, setup, left_out)
    elif o.stack == "auto" and (mp := model_parallel_partner(chosen, spec, setup)) is not None:
        stacks = [chosen, mp]
        parts = {chosen.name: False, mp.name: True}
    else:
        stacks = [chosen]
    setups = _stack_setups(spec, setup, stacks, keep_going=o.stack == "any")
    stacks = [st for st in stacks if st.name in setups]
    one = _one_gpu_stack(o, spec, hardware, setup, worlds)
    found = [_search_world(spec, hardware, st, setups[st.name], w, o, parts.get(st.name)) for st in stacks for w in worlds
             if w > 1 or one is None]
    if one is not None:
        found.append(_search_world(spec, hardware, one, setups.setdefault(one.name, stack_setup(setup, one, spec)), 1, o, None))
        stacks += [] if any(st.name == one.name for st in stacks) else [one]
    if o.stack == "auto":  # DeepSpeed's ZeRO-Infinity on the GPU counts where nothing else fits
        more = _offloaded(spec, hardware, setup, setups, found, o)
        found, stacks = found + more, stacks + [f.stack for f in more if f.stack.name not in {s.name for s in stacks}][:1]
    stack_note = _model_parallel_that_pays(found, spec, hardware, setups, o, next(n for n, tp_pp in parts.items() if tp_pp)) if parts else None
    ft = setup.finetune
    tree = decision_tree(spec, hardware, max(worlds), fits_one, ft.method.value + (
        f" with the {ft.offload} on the CPU" if ft.offload.value != "none" else ""))
    # what the explanation of a CP or pipeline row quotes (advisor.explain.why_layout)
    per = spec.layer.flops_per_token(setups[chosen.name].seq_len, causal=True) if not spec.routed else {}
    tree.update(n_layers=spec.n_layers, attention_share=per.get("attention/core", 0.0) / max(sum(per.values()), 1e-30) if per else None)
    ranked, best_by_kind, near, kind_worlds = _rank(found, spec, hardware, o, tree, left_out=stack_note is not None)
    setup = setups[chosen.name] if o.stack != "any" else setup
    rejected = dict(sum((Counter(f.rejected) for f in found), Counter()))
    return PlanSearch(spec, hardware, stacks, setup, worlds, o.global_batch is None, o.objective,
                      sum(f.considered for f in found), rejected, ranked, tree, best_by_kind,
                      memory_headroom=o.memory_headroom, allow_tp_across_nodes=o.allow_tp_across_nodes,
                      seq_defaulted=o.seq is None, tokens=o.tokens, stack_rule=api.AUTO_RULE if o.stack == "auto" else None,
                      stack_note=stack_note, near_best=near, kind_worlds=kind_worlds, left_out=left_out, etp=o.etp)


PAYS_NOT = "{stack}'s TP/PP/CP plans slower than its own data-parallel best"


def _stack_setups(spec: ModelSpec, setup: TrainingSetup, stacks: list[Stack], keep_going: bool) -> dict[str, TrainingSetup]:
    """Each stack's setup (its name, default optimizer, PEFT's modules: workload.stack_setup); under --stack any a stack
    whose adapters cannot take the LoRA targets is left out (the others may: litgpt's fused qkv), else its one line."""
    out: dict[str, TrainingSetup] = {}
    first: Optional[AdvisorError] = None
    for st in stacks:
        try:
            out[st.name] = stack_setup(setup, st, spec)
        except AdvisorError as exc:
            if not keep_going:
                raise
            first = first or exc
    if not out and first is not None:
        raise first
    return out


def _one_gpu_stack(o: PlanOptions, spec: ModelSpec, hardware: Hardware, setup: TrainingSetup,
                   worlds: list[int]) -> Optional[Stack]:
    """A range from one GPU under auto: the stack auto picks for one GPU (api.resolve_stack), which that GPU's plans
    are costed in, as estimate's auto costs them; None otherwise."""
    if o.stack != "auto" or not min(worlds) == 1 < max(worlds):
        return None
    return api.resolve_stack("auto", spec, hardware, setup, headroom=o.memory_headroom, gpus=1)[0]


def _offloaded(spec: ModelSpec, hardware: Hardware, setup: TrainingSetup, setups: dict[str, TrainingSetup],
               found: list["_Found"], o: PlanOptions) -> list["_Found"]:
    """--stack auto on each GPU count where no plan of ``found`` fits and AUTO_SMALL has not searched: its
    data-parallel plans with an offload AUTO_LARGE lacks (parameters on the CPU or NVMe), the plans
    api.resolve_stack costs there."""
    small, large = load_stack(api.AUTO_SMALL), load_stack(api.AUTO_LARGE)
    lacking = [Offload(x).code for x in offloads_only(small, large)]
    if not lacking or not api.auto_runs(small, spec) or not stack_runs(small, setup):
        return []
    done = {f.world for f in found if f.stack.name == small.name}
    out = []
    for w in dict.fromkeys(f.world for f in found if f.world not in done):
        if any(f.fits.any() for f in found if f.world == w):
            continue
        f = _search_world(spec, hardware, small, setups.setdefault(small.name, stack_setup(setup, small, spec)), w, o, False)
        keep = np.isin(np.broadcast_to(f.plans.offload, f.fits.shape), lacking)
        if (f.fits & ~keep).any():
            f.rejected[f"--stack auto: {small.name}'s plans without ZeRO-Infinity's offload are {large.name}'s"] = int((f.fits & ~keep).sum())
        f.fits = f.fits & keep
        out.append(f)
    return out


def _model_parallel_that_pays(found: list["_Found"], spec: ModelSpec, hardware: Hardware,
                              setups: dict[str, TrainingSetup], o: PlanOptions, name: str) -> Optional[str]:
    """--stack auto over two stacks: ``name``'s TP/PP/CP plans (auto.model_parallel_stack's) are ranked where they
    beat that stack's own best data-parallel plan on the same GPUs, else left out (rejected), lest one rank for its
    stack's kernels, not its parallelism (GPT-2 XL on a DGX A100: megatron-core's ZeRO-1 dp=4 x PP=2, 4.34 s, above
    hf-trainer's ZeRO-2, 5.18 s, where megatron-core's ZeRO-1 dp=8 takes 3.99 s). Returns the line that says so."""
    bests, kept = [], 0
    for f in found:
        if f.stack.name != name or not f.fits.any():  # no TP/PP/CP plan fits (or none exists on these GPUs): nothing to say
            continue
        ref = _search_world(spec, hardware, f.stack, setups[name], f.world, o, model_parallel=False)
        idx = np.nonzero(ref.fits)[0]
        if not len(idx):
            continue
        ref_key = np.broadcast_to(ref.keys(o.objective), ref.fits.shape)[idx]
        slower = f.fits & (np.broadcast_to(f.keys(o.objective), f.fits.shape) >= ref_key.min())
        if slower.any():
            f.rejected[PAYS_NOT.format(stack=name)] = int(slower.sum())
        f.fits = f.fits & ~slower
        i, kept = int(idx[np.argmin(ref_key)]), kept + int(f.fits.sum())
        bests.append(f"{ref.plans.plan(i).label()} at " + (f"{float(ref.need[i]) / 2**30:.3g} GiB" if o.objective ==
                     "memory" else fmt_seconds_3g(float(ref.out.time.total[i]))))
    if not bests:
        return None
    one = len(bests) == 1
    best = f"{name}'s own best data-parallel plan is " if one else f"{name}'s own best data-parallel plans are "
    it = "it" if one else "the one of their GPU count"
    kept_words = (f"{kept:,} of its TP/PP/CP candidates beat {it} and are ranked" if kept else
                  f"none of its TP/PP/CP plans beats {it}, so none is ranked")
    return f"{best}{', '.join(bests)}; {kept_words} (--stack {name} ranks them all)"


def _describing(spec: ModelSpec, hardware: Hardware, setup: TrainingSetup, left_out: dict[str, str]) -> list[Stack]:
    """Every shipped stack whose profile describes this model and setup and whose launch formats write it
    (advisor.export.unwritable, as under --stack auto); --stack any leaves the others out, each in ``left_out`` with
    its reason (a plan's footer says so: litgpt trains in bf16, not the default bf16-mixed)."""
    out = []
    for stack in (load_stack(name) for name in list_stacks()):
        try:
            Workload.of(spec, hardware, stack, setup)
        except (StackError, RecipeError) as exc:  # RecipeError: --fp8-attention where the stack has none
            left_out[stack.name] = str(exc)
            continue
        lacks = unwritable(stack, spec)
        if lacks:
            left_out[stack.name] = f"its launch formats do not write {spec.name} ({'; '.join(lacks)})"
        out += [] if lacks else [stack]
    if not out:
        raise PlanError(f"no stack profile describes {spec.name} in {setup.precision.value} with {setup.attention.value} "
                        "attention (advisor stacks)")
    return out


def _worlds(o: PlanOptions, hw: Hardware) -> list[int]:
    """The GPU counts to search: one, or the ladder A, 2A, 4A, ... <= B (each beyond one node a whole number of nodes, a
    divisor of the largest, so one global batch suits them all; those --cp and --etp divide, where any: admissible)."""
    if o.gpus is None or isinstance(o.gpus, int):
        world = resolve_world(hw, o.gpus, o.nodes, hw.gpus_per_node)
        if world > MAX_WORLD:
            raise PlanError(f"{world:,} GPUs is beyond any cluster this model describes; use at most {MAX_WORLD:,}")
        return [world]
    if o.nodes is not None:
        raise PlanError("--gpus A:B searches a range of GPU counts: drop --nodes")
    (lo, hi), g = o.gpus, hw.gpus_per_node
    odd = lambda a: [a * 2**k for k in range(64) if hi >= a * 2**k > g and a * 2**k % g]  # noqa: E731
    if odd(lo):  # the starts whose doublings stay whole nodes: a multiple of g, or a divisor that doubles into one
        starts, first = [d for d in range(1, g) if g % d == 0 and not odd(d)], -(-lo // g) * g
        raise PlanError(f"--gpus {lo}:{hi}: {odd(lo)[0]} GPUs is not a whole number of {g}-GPU nodes of {hw.name}; start"
                        f" the range at {', '.join(map(str, starts)) + ' or ' if starts else ''}a multiple of {g}"
                        + (f" (--gpus {first}:{hi})" if first <= hi else ""))
    return held_worlds([lo * 2**k for k in range(64) if lo * 2**k <= hi], o.cp, o.etp)


def _setup(o: PlanOptions, spec: ModelSpec, hardware: Hardware, world: int) -> TrainingSetup:
    seq = api.default_seq_len(spec) if o.seq is None else o.seq
    api.check_seq(spec, seq)
    gb = default_global_batch(world, seq) if o.global_batch is None else o.global_batch
    if o.precision == "auto":
        raise PlanError("precision='auto' ranks every precision the GPU runs: call advisor.rank_precisions(model, hw, "
                        "...) (the `advisor plan --precision auto` command), or name one precision here")
    try:  # --recompute-modules: selective plans only (constraints.setup_violations), each rerunning them
        return TrainingSetup(seq_len=seq, global_batch=gb, precision=resolve_precision(hardware, o.precision, o.stack),
                             optimizer=o.optimizer, attention=o.attention, stack=stack_name(o.stack),
                             recompute="none" if o.recompute_modules is None else "selective", recompute_modules=modules_of(o.recompute_modules),
                             finetune=api.finetune_of(o, model=spec, hw=hardware),
                             **moe_setup(o))
    except Exception as exc:
        raise PlanError(format_validation_error(exc)) from None


@dataclass
class _Found:
    """The plans of one GPU count: those that break no constraint, evaluated, and which of them fit."""

    world: int
    stack: Stack
    setup: TrainingSetup
    plans: Candidates
    out: Evaluation
    fits: Any
    considered: int
    rejected: dict[str, int]

    @property
    def need(self) -> Any:
        """Bytes each plan needs on its busiest GPU: the peak and the overheads beside it."""
        return self.out.memory.peak + self.out.overhead.total

    def keys(self, objective: str) -> Any:
        """Each plan's sort key under ``objective`` (advisor.ranking.objective_key)."""
        return objective_key(objective, self.out.time.total, self.need, self.out.tokens, self.world)


def _search_world(spec: ModelSpec, hardware: Hardware, stack: Stack, setup: TrainingSetup, world: int,
                  o: PlanOptions, model_parallel: Optional[bool] = None) -> _Found:
    """The plans of one GPU count in one stack: all of them, or (``model_parallel`` True / False) only those with /
    without TP or PP, which --stack auto costs in different stacks."""
    valid, n, rejected = valid_candidates(spec, hardware, world, int(setup.global_batch), o.allow_tp_across_nodes, stack,
                                          model_parallel, setup.seq_len, setup.attention.value == "eager", o.cp, o.etp)
    valid = drop_setup_violations(valid, setup, stack, rejected)  # adapters beyond DP, an asked TP overlap without SP
    out = evaluate(Workload.of(spec, hardware, stack, setup), valid)
    fits = out.memory.peak + out.overhead.total <= hardware.gpu.memory_bytes * (1.0 - o.memory_headroom)
    if (~fits).any():
        rejected["does not fit in memory"] = int((~fits).sum())
    host_ok = host_fits(hardware, out.host_bytes)
    if (fits & ~host_ok).any():  # offloaded states beyond the node's host memory
        rejected["offloaded states exceed host memory"] = int((fits & ~host_ok).sum())
    fits = fits & host_ok
    return _Found(world, stack, setup, valid, out, fits, n, rejected)


def _rank(found: list[_Found], spec: ModelSpec, hardware: Hardware, o: PlanOptions, tree: dict,
          left_out: bool = False) -> tuple[list[RankedPlan], dict[str, float], int, dict[str, int]]:
    """The ``o.top`` best fitting plans over every stack and GPU count, and the fastest step of each plan kind
    (``left_out``: the search left out model-parallel plans slower than their stack's data-parallel best), how many
    plans are within TIE_BAND of the fastest step, and the GPU count of each kind's fastest plan."""
    rows = []  # (GPU-count index, candidate index) of every fitting plan, with its keys
    keys, steps = [], []
    best_by_kind: dict[str, float] = {}
    at_best: dict[str, tuple[int, int]] = {}  # kind -> (search, candidate) of its fastest plan
    for j, f in enumerate(found):
        idx = np.nonzero(f.fits)[0]
        step = f.out.time.total[idx]
        keys.append(np.broadcast_to(f.keys(o.objective), f.fits.shape)[idx])
        steps.append(step)
        rows.append(np.stack([np.full(len(idx), j), idx], axis=1))
        kinds = kind_codes(f.plans.take(idx)) if len(idx) else np.array([], dtype=object)
        for k in KIND_NAMES:
            if (kinds == k).any() and float(step[kinds == k].min()) < best_by_kind.get(k, np.inf):
                best_by_kind[k] = float(step[kinds == k].min())
                at_best[k] = (j, int(idx[kinds == k][np.argmin(step[kinds == k])]))
    # what each kind's fastest plan spends, part by part, and its micro batch: an overruled rule of thumb is explained
    # by the parts that differ (advisor.explain)
    kind_best = {k: ({n: float(np.broadcast_to(v, found[j].fits.shape)[i]) for n, v in found[j].out.time.parts().items()},
                     int(np.broadcast_to(found[j].plans.micro_batch, found[j].fits.shape)[i])) for k, (j, i) in at_best.items()}
    rows, key, step = np.concatenate(rows), np.concatenate(keys), np.concatenate(steps)
    # ties within float rounding (two plans with the same work) keep the order the space enumerates them in
    order = np.lexsort((rows[:, 1], rows[:, 0], coarse(step), coarse(key)))
    order = order[first_per_plan(found, rows[order])]
    best = float(step[order[0]]) if len(order) else 0.0
    near = int(np.sum(step[order] <= best * (1.0 + TIE_BAND)))  # distinct fitting plans in the tie band
    order = order[:o.top]
    ranked = []
    for r in order:  # only the top K become typed objects
        f, i = found[rows[r, 0]], int(rows[r, 1])
        est = make_estimate(spec, hardware, f.stack.name, f.plans.plan(i), f.plans.setup(i, f.setup), f.world,
                            int(f.plans.grad_accum[i]), f.out, i)
        # throughput and cost rank GPU-seconds a token: plan 1 on more GPUs may take a shorter step, and a row on
        # fewer a longer one that is as good a use of each GPU; "vs best" says the ranking's own terms
        behind = float(key[r] / key[order[0]]) if o.objective in ("throughput", "cost") and key[order[0]] else None
        ranked.append(RankedPlan(est, explain(est, hardware, tree, best, best_by_kind, kind_best, left_out, f.stack, behind)))
    return ranked, best_by_kind, near, {k: found[j].world for k, (j, _) in at_best.items()}
