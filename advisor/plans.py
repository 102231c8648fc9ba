"""Plans: how a training step is laid out on GPUs, and the training setup it runs.

Two typed inputs live here:
- ``TrainingSetup``: what is trained (micro batch, global batch or gradient accumulation, sequence
  length, precision, optimizer, attention kernel, activation recomputation).
- ``Plan``: how it is parallelised (dp x tp x pp, ZeRO stage / FSDP mode, sequence parallel,
  pipeline schedule and virtual stages, nn.DataParallel vs DDP, gradient-reduce overlap).

``Columns`` is the same information as numbers that may be numpy arrays: the cost model is written
once over Columns so that one plan (0-d values) and a whole search space (1-d arrays) go through
the same formulas. ``violations`` returns, per constraint, which plans break it: reasons, not asserts.

Megatron's constraints (seed 002): world_size = tp * pp * dp; global batch divisible by
micro_batch * dp; with pipeline parallelism ZeRO goes no further than stage 1 (seed 001).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from enum import Enum, IntEnum
from typing import Any, Optional

import numpy as np
from pydantic import Field, model_validator

from advisor.hardware import Hardware
from advisor.spec import Spec


class Precision(str, Enum):
    fp32 = "fp32"
    bf16_mixed = "bf16-mixed"
    fp16_mixed = "fp16-mixed"
    bf16 = "bf16"
    fp8_mixed = "fp8-mixed"


class Optimizer(str, Enum):
    adamw = "adamw"  # torch.optim.AdamW default: foreach implementation
    adamw_fused = "adamw-fused"
    sgd = "sgd"  # with momentum


class Attention(str, Enum):
    sdpa = "sdpa"  # fused flash/memory-efficient kernel: no s x s matrix stored
    eager = "eager"  # softmax(QK^T)V in separate kernels, s x s scores kept for backward


class Recompute(IntEnum):
    none = 0
    selective = 1  # Korthikanti et al. 2022: recompute the attention core only
    full = 2  # keep only each layer's input; rerun the layer forward in backward


class Schedule(IntEnum):
    gpipe = 0
    one_f_one_b = 1
    interleaved = 2


class DataParallelKind(IntEnum):
    ddp = 0  # torch DistributedDataParallel: one process per GPU, bucketed all-reduce
    dp = 1  # torch.nn.DataParallel: one process, scatter/replicate/gather through GPU 0


RECOMPUTE_NAMES = {"none": Recompute.none, "selective": Recompute.selective, "full": Recompute.full}
SCHEDULE_NAMES = {"gpipe": Schedule.gpipe, "1f1b": Schedule.one_f_one_b, "interleaved": Schedule.interleaved}
FSDP_TO_ZERO = {"full-shard": 3, "shard-grad-op": 2, "hybrid-shard": 3, "no-shard": 0}
DATA_PARALLEL_NAMES = {"ddp": DataParallelKind.ddp, "dp": DataParallelKind.dp}


class TrainingSetup(Spec):
    seq_len: int = Field(default=1024, ge=1, le=10_000_000)
    micro_batch: int = Field(default=1, ge=1, le=1_000_000)
    global_batch: Optional[int] = Field(default=None, ge=1, le=1_000_000_000)
    grad_accum: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    precision: Precision = Precision.bf16_mixed
    optimizer: Optimizer = Optimizer.adamw
    attention: Attention = Attention.sdpa
    recompute: str = Field(default="none", pattern="^(none|selective|full)$")
    framework: str = Field(
        default="auto",
        pattern="^(auto|hf|megatron)$",
        description="kernel style: hf (eager HF modules), megatron (fused kernels); auto = megatron when tp or pp > 1",
    )

    @model_validator(mode="after")
    def _batch(self) -> "TrainingSetup":
        if self.global_batch is not None and self.grad_accum is not None:
            raise ValueError("give --global-batch or --grad-accum, not both")
        return self


class Plan(Spec):
    dp: int = Field(default=1, ge=1, le=10_000_000)
    tp: int = Field(default=1, ge=1, le=1_000_000)
    pp: int = Field(default=1, ge=1, le=1_000_000)
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage; FSDP FULL_SHARD=3, SHARD_GRAD_OP=2")
    hybrid_shard: bool = Field(default=False, description="FSDP HYBRID_SHARD: shard inside a node, replicate across")
    sp: bool = Field(default=False, description="Megatron sequence parallelism (needs tp > 1)")
    schedule: str = Field(default="1f1b", pattern="^(gpipe|1f1b|interleaved)$")
    virtual_stages: int = Field(default=1, ge=1, le=1024)
    data_parallel: str = Field(default="ddp", pattern="^(ddp|dp)$")
    overlap_grad_reduce: bool = Field(
        default=True, description="gradient reduction overlapped with backward (PyTorch DDP: on; Megatron default: off)"
    )
    allow_tp_across_nodes: bool = False

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def label(self) -> str:
        parts = []
        if self.data_parallel == "dp" and self.dp > 1:
            parts.append(f"nn.DataParallel {self.dp}")
        elif self.dp > 1 or (self.tp == 1 and self.pp == 1):
            kind = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}[self.zero]
            if self.hybrid_shard:
                kind = "HSDP"
            parts.append(f"{kind} dp={self.dp}")
        if self.tp > 1:
            parts.append(f"TP={self.tp}" + ("+SP" if self.sp else ""))
        if self.pp > 1:
            sched = self.schedule + (f"(v={self.virtual_stages})" if self.schedule == "interleaved" else "")
            parts.append(f"PP={self.pp} {sched}")
        return " x ".join(parts)


@dataclass(frozen=True)
class Columns:
    """Plan + setup as numbers; each field is a Python scalar or a numpy array of equal length."""

    dp: Any
    tp: Any
    pp: Any
    zero: Any
    hybrid: Any
    sp: Any
    schedule: Any
    v: Any
    dp_kind: Any
    overlap: Any
    micro_batch: Any
    grad_accum: Any
    recompute: Any
    tp_across_nodes_ok: Any = False

    @property
    def world(self) -> Any:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> Any:
        return self.micro_batch * self.grad_accum * self.dp

    def take(self, idx: Any) -> "Columns":
        """The rows ``idx`` of every array field (scalars broadcast)."""
        out = {}
        for f in fields(self):
            val = getattr(self, f.name)
            out[f.name] = val[idx] if isinstance(val, np.ndarray) and val.ndim else val
        return replace(self, **out)


def resolve_grad_accum(setup: TrainingSetup, plan: Plan) -> tuple[int, Optional[str]]:
    """Gradient-accumulation steps (= pipeline micro-batches per step) and an error if the batch doesn't divide."""
    if setup.grad_accum is not None:
        return setup.grad_accum, None
    if setup.global_batch is None:
        return 1, None
    per_step = setup.micro_batch * plan.dp
    if setup.global_batch % per_step:
        return 1, (
            f"global batch {setup.global_batch} is not divisible by micro_batch x dp = "
            f"{setup.micro_batch} x {plan.dp} = {per_step}"
        )
    return setup.global_batch // per_step, None


def columns_of(plan: Plan, setup: TrainingSetup, grad_accum: int) -> Columns:
    return Columns(
        dp=plan.dp,
        tp=plan.tp,
        pp=plan.pp,
        zero=plan.zero,
        hybrid=bool(plan.hybrid_shard),
        sp=bool(plan.sp and plan.tp > 1),
        schedule=int(SCHEDULE_NAMES[plan.schedule]),
        v=plan.virtual_stages if plan.schedule == "interleaved" else 1,
        dp_kind=int(DATA_PARALLEL_NAMES[plan.data_parallel]),
        overlap=bool(plan.overlap_grad_reduce),
        micro_batch=setup.micro_batch,
        grad_accum=grad_accum,
        recompute=int(RECOMPUTE_NAMES[setup.recompute]),
        tp_across_nodes_ok=bool(plan.allow_tp_across_nodes),
    )


def violations(c: Columns, model: Any, hw: Hardware, world_size: Any) -> dict[str, Any]:
    """Constraint name -> boolean (array) that is True where the plan breaks it.

    The keys are short reasons shown to users and counted by the search. ``model`` is a ModelSpec.
    """
    ones = np.ones_like(np.asarray(c.dp * c.tp * c.pp), dtype=bool)
    n_layers = model.n_layers
    out = {
        "dp x tp x pp != world size": (c.dp * c.tp * c.pp) != world_size,
        "tp does not divide the attention heads": (model.n_heads % c.tp) != 0,
        "tp does not divide the KV heads": ((model.kv_heads % c.tp) != 0) & (c.tp <= model.kv_heads),
        "tp > KV heads does not divide evenly": (c.tp > model.kv_heads) & ((c.tp % model.kv_heads) != 0),
        "tp spans nodes (TP needs the intra-node link; pass --allow-tp-across-nodes to force)": (
            (c.tp > hw.gpus_per_node) & ~np.asarray(c.tp_across_nodes_ok, dtype=bool)
        ),
        "tp does not divide the GPUs per node (TP groups would straddle nodes)": (
            (c.tp <= hw.gpus_per_node) & ((hw.gpus_per_node % c.tp) != 0)
        ),
        "pp > number of layers": c.pp > n_layers,
        "ZeRO-2/3 with pipeline parallelism (only ZeRO-1 combines with PP)": (c.pp > 1) & (c.zero >= 2),
        "interleaved schedule needs pp > 1 and layers divisible by pp x virtual stages": (
            (c.schedule == int(Schedule.interleaved))
            & ((c.pp == 1) | ((n_layers % np.maximum(c.pp * c.v, 1)) != 0) | (c.v < 2))
        ),
        "interleaved schedule needs the micro-batch count divisible by pp": (
            (c.schedule == int(Schedule.interleaved)) & (c.pp > 1) & ((c.grad_accum % c.pp) != 0)
        ),
        "nn.DataParallel is single-node, single-process: no ZeRO, TP or PP": (
            (c.dp_kind == int(DataParallelKind.dp))
            & ((c.zero > 0) | (c.tp > 1) | (c.pp > 1) | (c.dp > hw.gpus_per_node))
        ),
        "hybrid shard needs ZeRO-3 and dp spanning more than one node": (
            np.asarray(c.hybrid, dtype=bool) & ((c.zero != 3) | (c.dp <= hw.gpus_per_node) | (c.dp % hw.gpus_per_node != 0))
        ),
    }
    return {k: np.asarray(v, dtype=bool) & ones for k, v in out.items()}


def plan_errors(plan: Plan, setup: TrainingSetup, model: Any, hw: Hardware, world_size: int) -> list[str]:
    """One-line reasons a single plan is invalid (empty when valid)."""
    grad_accum, batch_err = resolve_grad_accum(setup, plan)
    reasons = [batch_err] if batch_err else []
    if plan.sp and plan.tp == 1:
        # Megatron silently turns it off at tp 1 (megatron/training/arguments.py); saying so beats costing
        # a plan the user did not mean
        reasons.append("sequence parallel needs tp > 1 (it splits activations across the TP group): drop --sp or set --tp")
    bad = violations(columns_of(plan, setup, grad_accum), model, hw, world_size)
    for reason, flag in bad.items():
        if bool(flag):
            if reason.startswith("dp x tp x pp"):
                reason = f"dp({plan.dp}) x tp({plan.tp}) x pp({plan.pp}) = {plan.world_size} != world size {world_size}"
            elif "heads" in reason:
                reason = f"{reason}: tp={plan.tp}, heads={model.n_heads}, kv heads={model.kv_heads}"
            elif reason.startswith("tp spans"):
                reason = f"tp={plan.tp} > {hw.gpus_per_node} GPUs per node: {reason}"
            elif reason.startswith("pp >"):
                reason = f"pp={plan.pp} > {model.n_layers} layers"
            reasons.append(reason)
    return reasons

