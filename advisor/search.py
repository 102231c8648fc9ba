"""Search: enumerate every plan for a model, profile and cluster, evaluate them at once, rank, explain.

The space (advisor.space): dp x tp x pp factorisations of the world size, ZeRO stage 0-3 (and FSDP
HYBRID_SHARD across nodes, nn.DataParallel inside one node), sequence parallelism, pipeline schedule and
virtual stages, micro-batch size, recomputation. Candidates are one table; constraints
(advisor.constraints) and the cost model (advisor.step.evaluate) run once over all of them, with no Python
loop per plan. Rejections are counted by reason. Every plan of a search is costed in one training stack
(advisor.api.resolve_stack, the rule ``estimate`` follows too). The ranked plans are explained against the
seeds' decision tree (advisor.explain); when nothing fits, advisor.suggest says what would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from advisor import api
from advisor.api import PlanError, resolve_precision, resolve_world
from advisor.candidates import Candidates
from advisor.constraints import violations
from advisor.errors import format_validation_error
from advisor.explain import KIND_NAMES, decision_tree, explain, kind_codes
from advisor.hardware import Hardware, load_hardware
from advisor.model import ModelSpec, load_model
from advisor.results import Estimate, make_estimate
from advisor.space import (
    MAX_CANDIDATES,
    MAX_WORLD,
    count_candidates,
    default_global_batch,
    enumerate_candidates,
    pair_violations,
    tp_pp_pairs,
)
from advisor.stack import Stack
from advisor.step import evaluate
from advisor.training import TrainingSetup
from advisor.workload import Workload

OBJECTIVES = ("time", "throughput", "memory", "cost")


@dataclass
class RankedPlan:
    estimate: Estimate
    reason: str

    @property
    def plan(self):
        return self.estimate.plan

    @property
    def setup(self):
        return self.estimate.setup


@dataclass
class PlanSearch:
    model_spec: ModelSpec
    hardware: Hardware
    stack: Stack
    setup: TrainingSetup  # what every plan shares (the global batch; micro batch and recompute vary per plan)
    world_size: int
    global_batch_defaulted: bool
    objective: str
    candidates: int
    rejected: dict[str, int]
    plans: list[RankedPlan]
    tree: dict[str, Any] = field(default_factory=dict)
    best_by_kind: dict[str, float] = field(default_factory=dict)  # fastest fitting step time per plan kind
    memory_headroom: float = 0.05
    allow_tp_across_nodes: bool = False

    @property
    def global_batch(self) -> int:
        return int(self.setup.global_batch)

    @property
    def seq_len(self) -> int:
        return self.setup.seq_len

    def header(self) -> str:
        gb = f"global batch {self.global_batch}" + (" (default: ~0.5M tokens, a multiple of the GPU count)" if self.global_batch_defaulted else "")
        return (f"{self.model_spec.name} ({self.model_spec.n_params / 1e9:.2f}B) on {self.world_size}x {self.hardware.name}: "
                f"{gb}, seq {self.seq_len}, {self.setup.precision.value}; {self.candidates:,} plans evaluated, "
                f"{sum(self.rejected.values()):,} rejected, ranked by {self.objective}")

    def notes(self) -> list[str]:
        t = self.tree
        out = [f"decision tree (HF multi-GPU guide): {t.get('position', '')}; rule of thumb: {t.get('rule', '')}",
               f"stack: every plan costed as {self.stack.name} runs it ({self.stack.description.split(',')[0]}); "
               "--stack NAME costs another (advisor stacks)"]
        if self.best_by_kind:
            best = min(self.best_by_kind.values())
            kinds = sorted(self.best_by_kind.items(), key=lambda kv: kv[1])
            out.append("fastest fitting plan of each kind: " + ", ".join(
                f"{KIND_NAMES[k]} {v:.3g} s" + (f" (+{100 * (v / best - 1):.1f}%)" if v > best * 1.0005 else "") for k, v in kinds))
        return out

    def to_json(self) -> dict:
        return {
            "model": self.model_spec.name, "hw": self.hardware.name, "world_size": self.world_size,
            "global_batch": self.global_batch, "seq_len": self.seq_len, "objective": self.objective,
            "candidates": self.candidates, "rejected": dict(self.rejected), "stack": self.stack.name,
            "decision_tree": self.tree, "best_step_time_s_by_kind": dict(self.best_by_kind),
            "plans": [{"rank": i + 1, "reason": p.reason, **p.estimate.model_dump(mode="json")} for i, p in enumerate(self.plans)],
        }


def _round_world(world: int, hw: Hardware) -> int:
    """A nearby GPU count with few divisors: whole nodes, a power of two of them."""
    nodes = max(1, world // hw.gpus_per_node)
    return hw.gpus_per_node * 2 ** (nodes.bit_length() - 1)


def _coarse(x: np.ndarray) -> np.ndarray:
    """``x`` to 40 bits of mantissa (~1e-12 relative): sums taken in another order rank alike."""
    m, e = np.frexp(x)
    return np.ldexp(np.round(m * 2.0**40) / 2.0**40, e)


def _check(objective: str, memory_headroom: float, top: int, seq, hardware: Hardware) -> None:
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


def plan(model, hw, gpus: Optional[int] = None, nodes: Optional[int] = None, seq: int = 1024,
         global_batch: Optional[int] = None, precision: Optional[str] = None, attention: str = "sdpa",
         optimizer: str = "adamw", stack: str = "auto", memory_headroom: float = 0.05,
         objective: str = "time", top: int = 10, allow_tp_across_nodes: bool = False) -> PlanSearch:
    """Search every valid plan and return the ``top`` best by ``objective`` (Python API of `advisor plan`)."""
    spec, hardware = load_model(model), load_hardware(hw)
    precision = resolve_precision(hardware, precision)
    _check(objective, memory_headroom, top, seq, hardware)
    world = resolve_world(hardware, gpus, nodes, hardware.gpus_per_node)
    if world > MAX_WORLD:
        raise PlanError(f"{world:,} GPUs is beyond any cluster this model describes; use at most {MAX_WORLD:,}")
    defaulted = global_batch is None
    gb = default_global_batch(world, seq) if defaulted else global_batch
    try:
        setup = TrainingSetup(seq_len=seq, global_batch=gb, precision=precision, optimizer=optimizer,
                              attention=attention, stack=stack if isinstance(stack, str) else stack.name)
    except Exception as exc:
        raise PlanError(format_validation_error(exc)) from None
    if seq > spec.max_positions and spec.position.value == "learned":
        raise PlanError(f"--seq {seq} exceeds {spec.name}'s {spec.max_positions} learned positions")
    chosen, fits_one = api.resolve_stack(stack, spec, hardware, setup)
    if setup.stack == "auto":
        setup = setup.model_copy(update={"stack": chosen.name})
    valid, n, rejected = _valid_candidates(spec, hardware, world, gb, allow_tp_across_nodes)
    out = evaluate(Workload.of(spec, hardware, chosen, setup), valid)
    step, need = out.time.total, out.memory.peak + out.overhead.total
    fits = need <= hardware.gpu.memory_bytes * (1.0 - memory_headroom)
    if (~fits).any():
        rejected["does not fit in memory"] = int((~fits).sum())
    idx = np.nonzero(fits)[0]
    key = {"time": step, "throughput": step, "memory": need, "cost": step}[objective][idx]
    # ties within float rounding (two plans with the same work) keep the order the space enumerates them in
    order = idx[np.lexsort((idx, _coarse(step[idx]), _coarse(key)))][:top]
    tree = decision_tree(spec, hardware, world, fits_one)
    best = float(step[order[0]]) if len(order) else 0.0
    kinds = kind_codes(valid.take(idx)) if len(idx) else np.array([], dtype=object)
    best_by_kind = {k: float(step[idx][kinds == k].min()) for k in KIND_NAMES if (kinds == k).any()}
    ranked = []
    for i in order:  # only the top K become typed objects
        est = make_estimate(spec, hardware, chosen.name, valid.plan(i), valid.setup(i, setup), world,
                            int(valid.grad_accum[i]), out, int(i))
        ranked.append(RankedPlan(est, explain(est, hardware, tree, best, best_by_kind)))
    return PlanSearch(spec, hardware, chosen, setup, world, defaulted, objective, n, rejected, ranked, tree,
                      best_by_kind, memory_headroom=memory_headroom, allow_tp_across_nodes=allow_tp_across_nodes)


def _valid_candidates(spec: ModelSpec, hardware: Hardware, world: int, gb: int,
                      allow_tp_across_nodes: bool) -> tuple[Candidates, int, dict[str, int]]:
    """(the plans that break no constraint, how many were considered, rejections by reason)."""
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
    cols = enumerate_candidates(world, gb, multi, kept_pairs)
    cols = Candidates(**{**cols.__dict__, "allow_tp_across_nodes": allow_tp_across_nodes})
    bad = violations(cols, spec, hardware, world)
    pruned_by_reason = np.bincount(pair_reason[pair_reason >= 0], weights=pruned_counts, minlength=len(pair_bad))
    rejected: dict[str, int] = {}
    ok = np.ones(len(cols), dtype=bool)
    for j, (reason, mask) in enumerate(bad.items()):
        newly = int((mask & ok).sum()) + (int(pruned_by_reason[j]) if j < len(pruned_by_reason) else 0)
        if newly:
            rejected[reason] = newly
        ok &= ~mask
    return cols.take(np.nonzero(ok)[0]), len(cols) + int(pruned_counts.sum()), rejected
