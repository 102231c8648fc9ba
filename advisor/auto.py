"""``--stack auto``: which training stack a plan is costed in when none is named, one rule for ``plan``,
``estimate`` and ``export`` (resolve_stack), so that a plan's row in a search and its estimate are the same numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from advisor.candidates import Candidates
from advisor.errors import PlanError
from advisor.hardware import Hardware
from advisor.layout import Plan
from advisor.model import ModelSpec
from advisor.options import DEFAULT_HEADROOM
from advisor.stack import Stack, StackError, list_stacks, load_stack
from advisor.step import evaluate
from advisor.training import Recompute, TrainingSetup
from advisor.workload import Workload, runs_model, stack_runs, why_not

# ``--stack auto``: the stack a user of the plan's kind most likely runs (issue 15), one rule for plan, estimate and
# export. Tensor and pipeline parallelism are what Megatron-LM, NeMo and Megatron-Bridge are for (megatron-core);
# data-parallel plans (DDP, ZeRO, FSDP) of a model that fits one GPU are what the Hugging Face Trainer / accelerate
# run; a model too large for one GPU is trained with Megatron's kernels (megatron-core, its distributed optimizer or
# Megatron-FSDP) even where a plan of it is data-parallel only. The vTrain and SC21 validations name
# megatron-deepspeed, which they ran.
AUTO_SMALL, AUTO_LARGE, AUTO_MODEL_PARALLEL, AUTO_NEITHER = "hf-trainer", "megatron-core", "megatron-core", "torchtitan-0.2"
# TP and PP plans of a model megatron-core's code does not build (ALiBi: BLOOM, MPT) go to the Megatron stack whose code
# does: Megatron-DeepSpeed, BLOOM-176B's own (BigScience's fork, TP 4 x PP 12, --position-embedding-type alibi), ahead of
# AUTO_SMALL, which runs no pipeline
AUTO_MODEL_PARALLEL_ELSE = "megatron-deepspeed"
ONE_STACK = ("--stack any ranks every stack's plans in advisor plan; one plan is costed in one stack: name it (the "
             "row's stack, advisor stacks) or use --stack auto")
AUTO_RULE = (f"--stack auto: plans with tensor, pipeline or context parallelism in {AUTO_MODEL_PARALLEL} "
             f"({AUTO_MODEL_PARALLEL_ELSE} where {AUTO_MODEL_PARALLEL} cannot build the model: BLOOM's ALiBi); data-parallel plans "
             f"(DDP, ZeRO, FSDP) in {AUTO_SMALL} where the model fits one GPU in it, the world is one GPU (DeepSpeed's "
             f"ZeRO-Offload), the plan offloads parameters or NVMe (ZeRO-Infinity, which {AUTO_LARGE} lacks: a search ranks those "
             f"plans where none of {AUTO_LARGE}'s fits) or {AUTO_LARGE} does "
             f"not run the fine-tuning method or build and export the model, else in {AUTO_LARGE}; a model neither builds "
             f"and exports (Llama 4) in {AUTO_NEITHER}")



def model_parallel(tp, pp, cp=1):
    """Whether a plan (or each of a table's plans) is of the kinds --stack auto costs in AUTO_MODEL_PARALLEL: tensor,
    pipeline or context parallelism."""
    return (tp > 1) | (pp > 1) | (cp > 1)


def auto_runs(stack: Stack, model: ModelSpec) -> bool:
    """Whether --stack auto may cost the model in ``stack``: its model code builds the decoder (engine.lacks) and
    one of its launch formats writes it (advisor.export.unwritable: Gemma's GeGLU and soft-capping and OLMo 2's
    full-width q/k norms have no Megatron-LM flag), so every plan it ranks exports."""
    from advisor.export import unwritable

    return runs_model(stack, model) and not unwritable(stack, model)


def left_out_words(left_out: dict[str, str]) -> str:
    """The stacks --stack any leaves out, grouped by their reason's gist (the text before its detail), one line:
    'litgpt, litgpt-2023: does not train in bf16-mixed; ...' (--stack NAME says why, in full)."""
    why: dict[str, list[str]] = {}
    for name, reason in left_out.items():
        gist = reason.replace(f"stack {name}'s ", "").replace(f"stack {name} ", "")
        why.setdefault(gist.split(" (")[0].split(":")[0].split(", which")[0], []).append(name)
    return "; ".join(f"{', '.join(names)}: {gist}" for gist, names in why.items())


def model_parallel_stack(model: ModelSpec, setup: TrainingSetup) -> Optional[Stack]:
    """The stack --stack auto costs the model's TP, PP and CP plans in: AUTO_MODEL_PARALLEL where its code builds and
    its formats write the model, else AUTO_MODEL_PARALLEL_ELSE where Megatron's flags describe all but the positions
    (ALiBi: its DeepSpeed JSON launches BLOOM), each where it runs the setup's choices (None: neither)."""
    from advisor.export.megatron_shape import unwritten_by

    first, other = load_stack(AUTO_MODEL_PARALLEL), load_stack(AUTO_MODEL_PARALLEL_ELSE)
    if auto_runs(first, model) and stack_runs(first, setup):
        return first
    if auto_runs(other, model) and not unwritten_by(model, "megatron") and stack_runs(other, setup):
        return deepspeed_launched(other)  # Megatron-LM's flags have no ALiBi (advisor.export.megatron)
    return None


def model_parallel_partner(chosen: Stack, model: ModelSpec, setup: TrainingSetup) -> Optional[Stack]:
    """The stack --stack auto costs the TP, PP and CP plans in beside ``chosen``, the one of its data-parallel plans
    (model_parallel_stack); None where that is ``chosen`` itself, or for adapters, which auto runs data-parallel."""
    mp = None if setup.finetune.adapters else model_parallel_stack(model, setup)
    return mp if mp is not None and mp.name != chosen.name else None


def deepspeed_launched(stack: Stack) -> Stack:
    """``stack`` as its DeepSpeed JSON launches it, so that every plan auto ranks exports: DeepSpeed's PipelineModule
    runs 1F1B over an even split, the JSON writes no context or expert parallelism, and its TP is AutoTP's, which
    shards no sequence (advisor.export.deepspeed)."""
    eng = stack.engine
    narrowed = eng.model_copy(update={"offers": [f for f in eng.offers if f not in ("interleaved", "gpipe", "ep", "sp")],
                                      "pipeline_splits": ["even"], "context_parallel": [], "zero_bubble": []})
    return load_stack(stack.model_copy(update={"engine": narrowed, "launch": ["deepspeed"]}))


def plan_stack(name: Union[str, Path, Stack], model: ModelSpec, hw: Hardware, setup: TrainingSetup,
               plan: Plan) -> Stack:
    """The stack one plan is costed in: the one named, or auto's for this plan; ``any`` (a search's) is refused."""
    if str(name) == "any":
        raise PlanError(ONE_STACK)
    return load_stack(name) if str(name) != "auto" else resolve_stack("auto", model, hw, setup, plan, DEFAULT_HEADROOM)[0]


def offloads_only(small: Stack, large: Stack) -> list[str]:
    """The offloads the data-parallel stack runs and the large-model stack does not: auto costs them in the former."""
    return [o for o in small.engine.offloads if o not in large.engine.offloads]


def fits_one_gpu(model: ModelSpec, hw: Hardware, stack: Stack, setup: TrainingSetup, headroom: float = 0.0) -> bool:
    """Whether the model trains on one GPU at all: micro batch 1, full recomputation, nothing sharded, with the
    fraction ``headroom`` of its memory kept free (a search's --memory-headroom: the answer its plans agree with)."""
    lean = setup.model_copy(update={"micro_batch": 1, "grad_accum": 1, "global_batch": None, "recompute": Recompute.full})
    out = evaluate(Workload.of(model, hw, stack, lean), Candidates.of_plan(Plan(), lean, 1))
    return bool(out.memory.peak[0] + out.overhead.total[0] <= hw.gpu.memory_bytes * (1.0 - headroom))


def resolve_stack(name: Union[str, Path, Stack], model: ModelSpec, hw: Hardware, setup: TrainingSetup,
                  plan: Optional[Plan] = None, headroom: float = 0.0, gpus: Optional[int] = None) -> tuple[Stack, bool]:
    """(the stack, whether the model fits on one GPU in it): the stack profile named, or for ``auto`` the one a
    user of this plan's kind most likely runs (AUTO_RULE): AUTO_MODEL_PARALLEL for a plan with TP or PP, else
    AUTO_SMALL where the model fits on one GPU in it (``headroom`` of its memory kept free) or AUTO_LARGE does not run
    the fine-tuning method (engine.methods), else AUTO_LARGE. Without a plan (a search), the stack of its
    data-parallel plans; the search costs its TP and PP plans in AUTO_MODEL_PARALLEL. On one GPU (``gpus``, or the
    plan's world) AUTO_SMALL: the seeds' single-GPU answer is DeepSpeed's ZeRO-Offload, and AUTO_LARGE's optimizer
    offload (Megatron's HybridDeviceOptimizer) keeps the whole gradient buffer on the GPU. For ``any`` (a search over
    every stack), auto's where it runs the setup's choices, else the first stack that does."""
    if str(name) == "any":
        try:
            stack, fits = resolve_stack("auto", model, hw, setup, plan, headroom, gpus)
        except StackError:
            stack = None
        if stack is not None and stack_runs(stack, setup) and auto_runs(stack, model):
            return stack, fits
        for stack in (load_stack(n) for n in list_stacks()):
            if stack_runs(stack, setup) and auto_runs(stack, model):
                return stack, fits_one_gpu(model, hw, stack, setup, headroom)
        why = {n: why_not(load_stack(n), setup) or f"stack {n} cannot build or write {model.name}" for n in list_stacks()}
        raise StackError(f"no stack profile runs {model.name} with what was asked: {left_out_words(why)} "
                         "(--stack NAME says why, in full)")
    if isinstance(name, Stack) or str(name) != "auto":
        stack = load_stack(name)
        return stack, fits_one_gpu(model, hw, stack, setup, headroom)
    small = load_stack(AUTO_SMALL)
    large = load_stack(AUTO_MODEL_PARALLEL if plan is not None and model_parallel(plan.tp, plan.pp, plan.cp) else AUTO_LARGE)
    why, why_large = why_not(small, setup), why_not(large, setup)
    if why and why_large:  # a choice neither runs (torchtitan's async TP): say who does, and why each does not
        others = [n for n in list_stacks() if stack_runs(load_stack(n), setup)]
        compiled = setup.model_copy(update={"compile": "model"})  # torchtitan's async TP needs its compiled blocks
        with_compile = [n for n in list_stacks() if not others and stack_runs(load_stack(n), compiled)]
        said = why_large if why_large.startswith(why[:40]) else f"{why}; {why_large}"
        raise StackError(f"--stack auto costs {small.name} or {large.name}, and neither runs what was asked ({said}); "
                         + (f"--stack {' or '.join(others)} runs it" if others else
                            f"--stack {' or '.join(with_compile)} runs it with --compile model" if with_compile else
                            "no stack profile runs it as asked"))
    if not auto_runs(large, model):  # a decoder it cannot build (Falcon's parallel blocks) or its formats cannot write
        other = model_parallel_stack(model, setup) if plan is not None and model_parallel(plan.tp, plan.pp, plan.cp) else None
        if other is not None:  # BLOOM's TP/PP plans: Megatron-DeepSpeed
            return other, fits_one_gpu(model, hw, other, setup, headroom)
        pick = small if auto_runs(small, model) else load_stack(AUTO_NEITHER)  # neither: Llama 4's experts and chunks
        return pick, fits_one_gpu(model, hw, pick, setup, headroom)
    # a choice only one of them runs picks it: QLoRA (the data-parallel stack, sharded or not), a flex token dispatcher
    # or a TP overlap (megatron-core); a plan's offload only the data-parallel stack runs (parameters on the CPU or NVMe:
    # DeepSpeed's ZeRO-Infinity; Megatron offloads the optimizer only)
    if not stack_runs(small, setup) and stack_runs(large, setup):
        return large, fits_one_gpu(model, hw, large, setup, headroom)
    if plan is not None and plan.offload.value in offloads_only(small, large) and stack_runs(small, setup) \
            and not model_parallel(plan.tp, plan.pp, plan.cp):  # TP/PP/CP plans stay AUTO_MODEL_PARALLEL's
        return small, fits_one_gpu(model, hw, small, setup, headroom)
    fits = fits_one_gpu(model, hw, small, setup, headroom)
    if fits or (plan.world_size if plan is not None else gpus) == 1:
        if plan is not None and model_parallel(plan.tp, plan.pp, plan.cp):
            return load_stack(AUTO_MODEL_PARALLEL), True
        return small, fits
    if not stack_runs(large, setup):
        return small, False
    return large, fits_one_gpu(model, hw, large, setup, headroom)  # its kernels' peak differs: it may fit where small's does not
