"""Python API: ``estimate(...)`` takes the CLI's options as keyword arguments and returns a typed result.

``Estimate.model_dump()`` is exactly what ``advisor estimate --json`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import numpy as np
from pydantic import BaseModel, ConfigDict

from advisor.compute import MATH
from advisor.errors import AdvisorError, format_validation_error
from advisor.estimate import TIME_PARTS, evaluate
from advisor.hardware import Hardware, load_hardware
from advisor.memory import MEMORY_PARTS, OVERHEAD_PARTS
from advisor.model import ModelSpec, load_model
from advisor.plans import (
    FSDP_TO_ZERO,
    Plan,
    Precision,
    TrainingSetup,
    columns_of,
    plan_errors,
    resolve_grad_accum,
)
from advisor.styles import Scalars


class Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class MemoryReport(Result):
    peak_bytes: float
    parts: dict[str, float]
    overhead_bytes: float
    overhead: dict[str, float]
    capacity_bytes: float
    headroom_bytes: float
    fits: bool


class Estimate(Result):
    model: str
    hw: str
    params: int
    world_size: int
    nodes: int
    plan: dict
    setup: dict
    label: str
    grad_accum: int
    global_batch: int
    tokens_per_step: int
    step_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float
    hfu: float
    tflops_per_gpu: float
    hw_tflops_per_gpu: float
    fits: bool
    memory: MemoryReport
    breakdown: dict[str, float]
    dominant: str
    usd_per_million_tokens: Optional[float] = None  # when the profile has a price per GPU-hour


class PlanError(AdvisorError):
    pass


def resolve_world(hw: Hardware, gpus: Optional[int], nodes: Optional[int], plan_product: Optional[int]) -> int:
    if gpus is not None and nodes is not None and gpus != nodes * hw.gpus_per_node:
        raise PlanError(f"--gpus {gpus} disagrees with --nodes {nodes} x {hw.gpus_per_node} GPUs per node; give one of them")
    if gpus is not None:
        if gpus < 1:
            raise PlanError(f"--gpus must be at least 1 (got {gpus})")
        return gpus
    if nodes is not None:
        if nodes < 1:
            raise PlanError(f"--nodes must be at least 1 (got {nodes})")
        return nodes * hw.gpus_per_node
    return plan_product or 1


def resolve_precision(hardware: Hardware, precision: Optional[str]) -> str:
    """The precision to train in: the one asked for, if the GPU runs its math natively (a one-line error
    otherwise), or by default bf16-mixed where the GPU has bf16 (Ampere and later), else fp16-mixed."""
    gpu = hardware.gpu
    default = "bf16-mixed" if gpu.runs("bf16") else ("fp16-mixed" if gpu.runs("fp16") else "fp32")
    if precision is None:
        return default
    try:
        math = MATH[Precision(precision)]
    except ValueError:
        return precision  # not a precision at all: TrainingSetup names the choices
    if not gpu.runs(math):
        raise PlanError(f"--precision {precision}: the {gpu.name} of profile {hardware.name} has no {math} math "
                        f"(it lists {', '.join(sorted(gpu.peak_tflops))}); use {default}")
    return precision


def build_inputs(model, hw, gpus=None, nodes=None, dp=None, tp=1, pp=1, zero=0, fsdp=None, sp=False,
                 schedule="1f1b", virtual_stages=None, micro_batch=1, global_batch=None, grad_accum=None,
                 seq=1024, precision=None, attention="sdpa", recompute="none", optimizer="adamw",
                 overlap_grad_reduce=None, data_parallel="ddp", framework="auto", allow_tp_across_nodes=False):
    """Validate every option and return (model spec, hardware, plan, setup, world size)."""
    spec = load_model(model)
    hardware = load_hardware(hw)
    precision = resolve_precision(hardware, precision)
    if fsdp is not None:
        if fsdp not in FSDP_TO_ZERO:
            raise PlanError(f"--fsdp {fsdp!r} is not one of {', '.join(FSDP_TO_ZERO)}")
        zero = FSDP_TO_ZERO[fsdp]
    tp = 1 if tp is None else tp
    pp = 1 if pp is None else pp
    if any(x is not None and x < 1 for x in (tp, pp, dp)):
        raise PlanError(f"parallel degrees must be >= 1 (got dp={dp}, tp={tp}, pp={pp})")
    world = resolve_world(hardware, gpus, nodes, (dp or 1) * tp * pp if dp else None)
    if dp is None:
        if world % (tp * pp):
            raise PlanError(f"{world} GPUs are not divisible by tp x pp = {tp} x {pp}")
        dp = world // (tp * pp)
    if virtual_stages is None:
        virtual_stages = 2 if schedule == "interleaved" else 1
    try:
        setup = TrainingSetup(seq_len=seq, micro_batch=micro_batch, global_batch=global_batch, grad_accum=grad_accum,
                              precision=precision, optimizer=optimizer, attention=attention, recompute=recompute,
                              framework=framework)
        plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, hybrid_shard=(fsdp == "hybrid-shard"), sp=sp, schedule=schedule,
                    virtual_stages=virtual_stages, data_parallel=data_parallel,
                    overlap_grad_reduce=True if overlap_grad_reduce is None else overlap_grad_reduce,
                    allow_tp_across_nodes=allow_tp_across_nodes)
    except Exception as exc:
        raise PlanError(format_validation_error(exc)) from None
    if seq > spec.max_positions and spec.position.value == "learned":
        raise PlanError(f"--seq {seq} exceeds {spec.name}'s {spec.max_positions} learned positions; use --seq <= {spec.max_positions}")
    errors = plan_errors(plan, setup, spec, hardware, world)
    if errors:
        raise PlanError("invalid plan: " + "; ".join(errors))
    return spec, hardware, plan, setup, world


def dominant_part(breakdown: dict[str, float]) -> str:
    return max(breakdown, key=lambda k: breakdown[k])


def make_estimate(spec: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, world: int,
                  out: dict, i=None) -> Estimate:
    """Turn one row (``i``; None for 0-d) of ``evaluate``'s output into a typed Estimate."""
    pick = (lambda a: float(np.asarray(a).reshape(-1)[i if i is not None else 0]))
    breakdown = {k: pick(out["time"][k]) for k in TIME_PARTS}
    step = sum(breakdown.values())
    mem_parts = {k: pick(out["memory"][k]) for k in MEMORY_PARTS}
    peak = sum(mem_parts.values())
    over = {k: pick(out["overhead"][k]) for k in OVERHEAD_PARTS}
    cap = hw.gpu.memory_bytes
    fits = peak + sum(over.values()) <= cap
    tokens = pick(out["tokens"])
    grad_accum, _ = resolve_grad_accum(setup, plan)
    peak_flops = hw.gpu.peak_flops_per_s(MATH[setup.precision])
    return Estimate(
        model=spec.name, hw=hw.name, params=spec.n_params, world_size=world,
        nodes=int(-(-world // hw.gpus_per_node)),
        plan=plan.model_dump(mode="json"), setup=setup.model_dump(mode="json"), label=plan.label(),
        grad_accum=grad_accum, global_batch=setup.micro_batch * grad_accum * plan.dp,
        tokens_per_step=int(tokens), step_time_s=step, tokens_per_s=tokens / step,
        samples_per_s=tokens / setup.seq_len / step,
        mfu=6.0 * spec.n_params * tokens / (step * world * peak_flops),
        hfu=pick(out["hw_flops"]) / (step * world * peak_flops),
        tflops_per_gpu=pick(out["model_flops"]) / (step * world) / 1e12,
        hw_tflops_per_gpu=pick(out["hw_flops"]) / (step * world) / 1e12,
        fits=bool(fits),
        memory=MemoryReport(peak_bytes=peak, parts=mem_parts, overhead_bytes=sum(over.values()), overhead=over,
                            capacity_bytes=cap, headroom_bytes=cap - peak - sum(over.values()), fits=bool(fits)),
        breakdown=breakdown, dominant=dominant_part(breakdown),
        usd_per_million_tokens=(hw.price_per_gpu_hour_usd * world * step / 3600.0 / tokens * 1e6
                                if hw.price_per_gpu_hour_usd else None),
    )


def estimate(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], **options) -> Estimate:
    """Estimate one plan. Options are ``advisor estimate``'s, spelled with underscores."""
    spec, hardware, plan, setup, world = build_inputs(model, hw, **options)
    grad_accum, _ = resolve_grad_accum(setup, plan)
    out = evaluate(spec, hardware, Scalars.of(setup), columns_of(plan, setup, grad_accum), world)
    return make_estimate(spec, hardware, plan, setup, world, out)
