"""The constraints a plan must meet, gathered from each dimension in one order (the search counts a rejected
plan under the first it breaks): the layout's world size, then tensor, pipeline and data parallelism.

Megatron's constraints (seed 002): world_size = tp x pp x dp; global batch divisible by micro_batch x dp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.candidates import Candidates
from advisor.hardware import Hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import ModelSpec
from advisor.parallel import data, pipeline, tensor
from advisor.training import TrainingSetup

WORLD = "dp x tp x pp != world size"


def violations(c: Candidates, model: ModelSpec, hw: Hardware, world_size: Any) -> dict[str, Any]:
    """Constraint name -> boolean array, True where the plan breaks it (short reasons users see)."""
    ones = np.ones(len(c), dtype=bool)
    out = {WORLD: c.world != world_size, **tensor.violations(c, model, hw), **pipeline.violations(c, model),
           **data.violations(c, hw)}
    return {k: np.asarray(v, dtype=bool) & ones for k, v in out.items()}


def plan_errors(plan: Plan, setup: TrainingSetup, model: ModelSpec, hw: Hardware, world_size: int) -> list[str]:
    """One-line reasons a single plan is invalid (empty when valid)."""
    grad_accum, batch_err = resolve_grad_accum(setup, plan)
    reasons = [batch_err] if batch_err else []
    if plan.sp and plan.tp == 1:
        # Megatron silently turns it off at tp 1 (megatron/training/arguments.py); saying so beats costing
        # a plan the user did not mean
        reasons.append("sequence parallel needs tp > 1 (it splits activations across the TP group): drop --sp or set --tp")
    bad = violations(Candidates.of_plan(plan, setup, grad_accum), model, hw, world_size)
    for reason, flag in bad.items():
        if bool(flag[0]):
            if reason == WORLD:
                reason = f"dp({plan.dp}) x tp({plan.tp}) x pp({plan.pp}) = {plan.world_size} != world size {world_size}"
            elif "heads" in reason:
                reason = f"{reason}: tp={plan.tp}, heads={model.n_heads}, kv heads={model.kv_heads}"
            elif reason.startswith("tp spans"):
                reason = f"tp={plan.tp} > {hw.domain_gpus} GPUs per NVLink domain: {reason}"
            elif reason.startswith("pp >"):
                reason = f"pp={plan.pp} > {model.n_layers} layers"
            reasons.append(reason)
    return reasons
