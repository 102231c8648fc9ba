"""Search: enumerate every plan for a model, profile and cluster, evaluate them at once, rank, explain.

The space (advisor.space): dp x tp x pp factorisations of the world size, ZeRO stage 0-3 (and FSDP
HYBRID_SHARD across nodes, nn.DataParallel inside one node), sequence parallelism, pipeline schedule and
virtual stages, micro-batch size, recomputation. Candidates are numpy columns; constraints (advisor.plans.violations)
and the cost model (advisor.estimate.evaluate) run once over all of them, with no Python loop per
plan. Rejections are counted by reason. The ranked plans are explained against the seeds' decision
tree (Hugging Face, "Efficient Training on Multiple GPUs": single/multi node, fits or not, fast or
slow links), and the explanation says when the cost model overrules that rule of thumb.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from advisor.api import (
    Estimate,
    PlanError,
    make_estimate,
    resolve_precision,
    resolve_world,
)
from advisor.estimate import TIME_PARTS, evaluate
from advisor.explain import KIND_NAMES, decision_tree, explain, kind_codes, plan_kind  # noqa: F401
from advisor.hardware import Hardware, load_hardware
from advisor.memory import MEMORY_PARTS, OVERHEAD_PARTS
from advisor.model import ModelSpec, load_model
from advisor.plans import Columns, Plan, TrainingSetup, violations
from advisor.space import (
    MAX_CANDIDATES,
    MAX_WORLD,
    count_candidates,
    default_global_batch,
    enumerate_candidates,
    pair_violations,
    tp_pp_pairs,
)
from advisor.styles import Scalars
from advisor.suggest import suggest_fix

OBJECTIVES = ("time", "throughput", "memory", "cost")


@dataclass
class RankedPlan:
    plan_obj: Plan
    setup_obj: TrainingSetup
    estimate: Estimate
    reason: str

    @property
    def plan(self) -> dict:
        return self.estimate.plan


@dataclass
class PlanSearch:
    model_spec: ModelSpec
    hardware: Hardware
    world_size: int
    global_batch: int
    global_batch_defaulted: bool
    seq_len: int
    objective: str
    candidates: int
    rejected: dict[str, int]
    plans: list[RankedPlan]
    tree: dict[str, Any] = field(default_factory=dict)
    best_by_kind: dict[str, float] = field(default_factory=dict)  # fastest fitting step time per plan kind
    scalars: Optional[Scalars] = None  # precision, attention, optimizer, kernel style of the search
    memory_headroom: float = 0.05
    allow_tp_across_nodes: bool = False

    def header(self) -> str:
        gb = f"global batch {self.global_batch}" + (" (default: ~0.5M tokens, a multiple of the GPU count)" if self.global_batch_defaulted else "")
        prec = f", {self.scalars.precision.value}" if self.scalars is not None else ""
        return (f"{self.model_spec.name} ({self.model_spec.n_params / 1e9:.2f}B) on {self.world_size}x {self.hardware.name}: "
                f"{gb}, seq {self.seq_len}{prec}; {self.candidates:,} plans evaluated, {sum(self.rejected.values()):,} rejected, "
                f"ranked by {self.objective}")

    def notes(self) -> list[str]:
        t = self.tree
        out = [f"decision tree (HF multi-GPU guide): {t.get('position', '')}; rule of thumb: {t.get('rule', '')}"]
        if self.scalars is not None and self.scalars.framework in KERNEL_STYLES:
            # every plan is costed in one kernel style; an exported FSDP/DeepSpeed run on HF modules differs
            out.append(f"kernels: every plan costed with {KERNEL_STYLES[self.scalars.framework]}; "
                       "--framework hf|megatron costs the other style")
        if self.best_by_kind:
            best = min(self.best_by_kind.values())
            kinds = sorted(self.best_by_kind.items(), key=lambda kv: kv[1])
            out.append("fastest fitting plan of each kind: " + ", ".join(
                f"{KIND_NAMES[k]} {v:.3g} s" + (f" (+{100 * (v / best - 1):.1f}%)" if v > best * 1.0005 else "") for k, v in kinds))
        return out

    def suggestion(self) -> str:
        return suggest_fix(self)

    def to_json(self) -> dict:
        return {
            "model": self.model_spec.name, "hw": self.hardware.name, "world_size": self.world_size,
            "global_batch": self.global_batch, "seq_len": self.seq_len, "objective": self.objective,
            "candidates": self.candidates, "rejected": dict(self.rejected),
            "kernels": self.scalars.framework if self.scalars is not None else None,
            "decision_tree": self.tree, "best_step_time_s_by_kind": dict(self.best_by_kind),
            "plans": [{"rank": i + 1, "reason": p.reason, **p.estimate.model_dump()} for i, p in enumerate(self.plans)],
        }


KERNEL_STYLES = {"megatron": "Megatron's fused kernels (fused LayerNorm, bias-GELU, bias-dropout-add)",
                 "hf": "Hugging Face eager modules"}


def _round_world(world: int, hw: Hardware) -> int:
    """A nearby GPU count with few divisors: whole nodes, a power of two of them."""
    nodes = max(1, world // hw.gpus_per_node)
    return hw.gpus_per_node * 2 ** (nodes.bit_length() - 1)


def _single_gpu_fits(m: ModelSpec, hw: Hardware, sc: Scalars) -> bool:
    c = Columns(dp=1, tp=1, pp=1, zero=0, hybrid=False, sp=False, schedule=1, v=1, dp_kind=0, overlap=True,
                micro_batch=1, grad_accum=1, recompute=2)
    out = evaluate(m, hw, sc, c, 1)
    peak = sum(np.asarray(out["memory"][k]).reshape(-1)[0] for k in MEMORY_PARTS)
    over = sum(np.asarray(out["overhead"][k]).reshape(-1)[0] for k in OVERHEAD_PARTS)
    return bool(peak + over <= hw.gpu.memory_bytes)


def plan(model, hw, gpus: Optional[int] = None, nodes: Optional[int] = None, seq: int = 1024,
         global_batch: Optional[int] = None, precision: Optional[str] = None, attention: str = "sdpa",
         optimizer: str = "adamw", framework: str = "auto", memory_headroom: float = 0.05,
         objective: str = "time", top: int = 10, allow_tp_across_nodes: bool = False) -> PlanSearch:
    """Search every valid plan and return the ``top`` best by ``objective`` (Python API of `advisor plan`)."""
    spec = load_model(model)
    hardware = load_hardware(hw)
    precision = resolve_precision(hardware, precision)
    if objective not in OBJECTIVES:
        raise PlanError(f"--objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if not (0.0 <= memory_headroom < 1.0):
        raise PlanError(f"--memory-headroom {memory_headroom} must be a fraction in [0, 1)")
    if objective == "cost" and hardware.price_per_gpu_hour_usd is None:
        raise PlanError(f"profile {hardware.name} has no price_per_gpu_hour_usd; add it or use --objective time")
    if top < 1:
        raise PlanError(f"--top must be at least 1 (got {top})")
    if seq is None or seq < 1:
        raise PlanError(f"--seq must be at least 1 token (got {seq})")
    world = resolve_world(hardware, gpus, nodes, hardware.gpus_per_node)
    if world > MAX_WORLD:
        raise PlanError(f"{world:,} GPUs is beyond any cluster this model describes; use at most {MAX_WORLD:,}")
    defaulted = global_batch is None
    gb = default_global_batch(world, seq) if defaulted else global_batch
    try:
        setup = TrainingSetup(seq_len=seq, global_batch=gb, precision=precision, optimizer=optimizer,
                              attention=attention, framework=framework)
    except Exception as exc:
        from advisor.errors import format_validation_error

        raise PlanError(format_validation_error(exc)) from None
    if seq > spec.max_positions and spec.position.value == "learned":
        raise PlanError(f"--seq {seq} exceeds {spec.name}'s {spec.max_positions} learned positions")
    sc = Scalars.of(setup)
    fits_hf = None
    if framework == "auto":
        # One kernel style for the whole search, so that plans are compared on equal kernels: models that
        # fit on one GPU are typically trained with eager HF modules (DDP/FSDP), larger ones with Megatron.
        fits_hf = _single_gpu_fits(spec, hardware, Scalars(seq, sc.precision, sc.attention, sc.optimizer, "hf"))
        style = "hf" if fits_hf else "megatron"
        sc = Scalars(seq, sc.precision, sc.attention, sc.optimizer, style)
        setup = setup.model_copy(update={"framework": style})
    multi = world > hardware.gpus_per_node
    # (tp, pp) layouts that break a layout-only constraint (heads vs tp, layers vs pp, tp across nodes) are
    # counted, not built: a highly composite world size has thousands of layouts x 4,032 rows each.
    pairs = tp_pp_pairs(world)
    pair_bad = pair_violations(world, pairs, spec, hardware, allow_tp_across_nodes)
    pair_reason = np.full(len(pairs), -1)
    for j, mask in enumerate(pair_bad.values()):
        pair_reason = np.where((pair_reason < 0) & mask, j, pair_reason)
    pruned_counts = count_candidates(world, [p for p, r in zip(pairs, pair_reason) if r >= 0], gb, multi)
    kept_pairs = [p for p, r in zip(pairs, pair_reason) if r < 0]
    rows = int(count_candidates(world, kept_pairs, gb, multi).sum())
    if rows > MAX_CANDIDATES:
        raise PlanError(f"{world:,} GPUs give {rows:,} candidate plans for {spec.name}, more than the {MAX_CANDIDATES:,} "
                        f"one search evaluates; use a GPU count with fewer divisors (e.g. --gpus {_round_world(world, hardware)})")
    cols = enumerate_candidates(world, spec.n_layers, gb, multi, kept_pairs)
    cols = Columns(**{**cols.__dict__, "tp_across_nodes_ok": allow_tp_across_nodes})
    n_rows = len(np.atleast_1d(cols.dp))
    n = n_rows + int(pruned_counts.sum())
    bad = violations(cols, spec, hardware, world)
    pruned_by_reason = np.bincount(pair_reason[pair_reason >= 0], weights=pruned_counts, minlength=len(pair_bad))
    rejected: dict[str, int] = {}
    ok = np.ones(n_rows, dtype=bool)
    for j, (reason, mask) in enumerate(bad.items()):
        newly = int((mask & ok).sum()) + (int(pruned_by_reason[j]) if j < len(pruned_by_reason) else 0)
        if newly:
            rejected[reason] = newly
        ok &= ~mask
    valid = cols.take(np.nonzero(ok)[0])
    out = evaluate(spec, hardware, sc, valid, world)
    step = sum(np.asarray(out["time"][k], dtype=float) for k in TIME_PARTS)
    peak = sum(np.asarray(out["memory"][k], dtype=float) for k in MEMORY_PARTS)
    over = sum(np.asarray(out["overhead"][k], dtype=float) for k in OVERHEAD_PARTS)
    fits = peak + over <= hardware.gpu.memory_bytes * (1.0 - memory_headroom)
    if (~fits).any():
        rejected["does not fit in memory"] = int((~fits).sum())
    idx = np.nonzero(fits)[0]
    key = {"time": step, "throughput": step, "memory": peak + over, "cost": step}[objective][idx]
    order = idx[np.lexsort((step[idx], key))][:top]
    # Fits on one GPU with the search's kernel style: when HF kernels fit, the auto choice above asked exactly
    # this; when they do not, Megatron's still may (another peak: gpt2 bf16-mixed 3.258 GB vs HF's 3.276 GB).
    fits_one_gpu = True if fits_hf else _single_gpu_fits(spec, hardware, sc)
    tree = decision_tree(spec, hardware, world, fits_one_gpu)
    best = float(step[order[0]]) if len(order) else 0.0
    kinds = kind_codes(valid.take(idx)) if len(idx) else np.array([], dtype=object)
    best_by_kind = {k: float(step[idx][kinds == k].min()) for k in KIND_NAMES if (kinds == k).any()}
    ranked = []
    for i in order:  # only the top K become typed objects
        row = valid.take(np.array([i]))
        p = Plan(dp=int(row.dp[0]), tp=int(row.tp[0]), pp=int(row.pp[0]), zero=int(row.zero[0]),
                 hybrid_shard=bool(row.hybrid[0]), sp=bool(row.sp[0]),
                 schedule={0: "gpipe", 1: "1f1b", 2: "interleaved"}[int(row.schedule[0])],
                 virtual_stages=int(row.v[0]), data_parallel="dp" if int(row.dp_kind[0]) else "ddp",
                 overlap_grad_reduce=True, allow_tp_across_nodes=allow_tp_across_nodes)
        st = setup.model_copy(update={"micro_batch": int(row.micro_batch[0]),
                                      "recompute": ("none", "selective", "full")[int(row.recompute[0])]})
        est = make_estimate(spec, hardware, p, st, world, out, int(i))
        ranked.append(RankedPlan(p, st, est, explain(est, hardware, tree, best, best_by_kind)))
    return PlanSearch(spec, hardware, world, gb, defaulted, seq, objective, n, rejected, ranked, tree, best_by_kind,
                      scalars=sc, memory_headroom=memory_headroom, allow_tp_across_nodes=allow_tp_across_nodes)
