"""Python API: ``estimate(...)`` takes the CLI's options as keyword arguments and returns a typed result.

``Estimate.model_dump()`` is exactly what ``advisor estimate --json`` prints. The stack a plan is costed in is
resolved by one rule for ``estimate`` and ``plan`` alike (``resolve_stack``), so a plan's row in a search and
its estimate are the same numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from advisor.candidates import Candidates
from advisor.constraints import plan_errors
from advisor.errors import AdvisorError, format_validation_error
from advisor.hardware import Hardware, load_hardware
from advisor.layout import FSDP_TO_ZERO, Plan, resolve_grad_accum
from advisor.model import ModelSpec, load_model
from advisor.results import Estimate, make_estimate
from advisor.stack import Stack, load_stack
from advisor.step import evaluate
from advisor.training import Precision, Recompute, TrainingSetup
from advisor.workload import Workload

# The stacks ``--stack auto`` chooses between: models that fit on one GPU are typically trained with Hugging Face
# modules (DDP, FSDP, DeepSpeed), larger ones with Megatron's fused kernels.
AUTO_SMALL, AUTO_LARGE = "hf-trainer", "megatron-deepspeed"


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
        math = Precision(precision).math
    except ValueError:
        return precision  # not a precision at all: TrainingSetup names the choices
    if not gpu.runs(math):
        raise PlanError(f"--precision {precision}: the {gpu.name} of profile {hardware.name} has no {math} math "
                        f"(it lists {', '.join(sorted(gpu.peak_tflops))}); use {default}")
    return precision


def fits_one_gpu(model: ModelSpec, hw: Hardware, stack: Stack, setup: TrainingSetup) -> bool:
    """Whether the model trains on one GPU at all: micro batch 1, full recomputation, nothing sharded."""
    lean = setup.model_copy(update={"micro_batch": 1, "grad_accum": 1, "global_batch": None, "recompute": Recompute.full})
    out = evaluate(Workload.of(model, hw, stack, lean), Candidates.of_plan(Plan(), lean, 1))
    return bool(out.memory.peak[0] + out.overhead.total[0] <= hw.gpu.memory_bytes)


def resolve_stack(name: Union[str, Path, Stack], model: ModelSpec, hw: Hardware,
                  setup: TrainingSetup) -> tuple[Stack, bool]:
    """(the stack, whether the model fits on one GPU in it): the stack profile named, or for ``auto`` the one a
    user of this model most likely runs (AUTO_SMALL where the model fits on one GPU in it, else AUTO_LARGE);
    the same rule for every plan of a search and for an estimate."""
    if isinstance(name, Stack) or str(name) != "auto":
        stack = load_stack(name)
        return stack, fits_one_gpu(model, hw, stack, setup)
    small = load_stack(AUTO_SMALL)
    if fits_one_gpu(model, hw, small, setup):
        return small, True
    large = load_stack(AUTO_LARGE)  # its kernels' peak differs: it may fit where the small stack's does not
    return large, fits_one_gpu(model, hw, large, setup)


def build_inputs(model, hw, gpus=None, nodes=None, dp=None, tp=1, pp=1, zero=0, fsdp=None, sp=False,
                 schedule="1f1b", virtual_stages=None, micro_batch=1, global_batch=None, grad_accum=None,
                 seq=1024, precision=None, attention="sdpa", recompute="none", optimizer="adamw",
                 overlap_grad_reduce=None, data_parallel="ddp", stack="auto", allow_tp_across_nodes=False):
    """Validate every option and return (model spec, hardware, stack, plan, setup, world size)."""
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
                              stack=stack if isinstance(stack, str) else getattr(stack, "name", str(stack)))
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
    resolved = load_stack(stack) if str(stack) != "auto" else resolve_stack(stack, spec, hardware, setup)[0]
    if setup.stack == "auto":  # the choice is recorded, so that the setup names the stack it was costed in
        setup = setup.model_copy(update={"stack": resolved.name})
    return spec, hardware, resolved, plan, setup, world


def estimate(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], **options) -> Estimate:
    """Estimate one plan. Options are ``advisor estimate``'s, spelled with underscores."""
    spec, hardware, stack, plan, setup, world = build_inputs(model, hw, **options)
    return _estimate(spec, hardware, stack, plan, setup, world)


def estimate_plan(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], plan: Plan,
                  setup: TrainingSetup, world_size: Optional[int] = None) -> Estimate:
    """Estimate a typed Plan and TrainingSetup (e.g. a row of ``advisor.plan``'s result) on ``world_size`` GPUs
    (default: the plan's dp x tp x pp)."""
    spec, hardware = load_model(model), load_hardware(hw)
    world = plan.world_size if world_size is None else world_size
    errors = plan_errors(plan, setup, spec, hardware, world)
    if errors:
        raise PlanError("invalid plan: " + "; ".join(errors))
    stack = load_stack(setup.stack) if setup.stack != "auto" else resolve_stack("auto", spec, hardware, setup)[0]
    if setup.stack == "auto":
        setup = setup.model_copy(update={"stack": stack.name})
    return _estimate(spec, hardware, stack, plan, setup, world)


def _estimate(spec: ModelSpec, hardware: Hardware, stack: Stack, plan: Plan, setup: TrainingSetup, world: int) -> Estimate:
    grad_accum, _ = resolve_grad_accum(setup, plan)
    out = evaluate(Workload.of(spec, hardware, stack, setup), Candidates.of_plan(plan, setup, grad_accum))
    return make_estimate(spec, hardware, stack.name, plan, setup, world, grad_accum, out)
