"""Python API: ``estimate(...)`` takes the CLI's options as keyword arguments and returns a typed result.

``Estimate.model_dump()`` is exactly what ``advisor estimate --json`` prints. The stack a plan is costed in is
resolved by one rule for ``estimate`` and ``plan`` alike (``resolve_stack``), so a plan's row in a search and
its estimate are the same numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from advisor.candidates import Candidates
from advisor.plan_errors import plan_errors
from advisor.auto import (AUTO_LARGE, AUTO_MODEL_PARALLEL, AUTO_NEITHER, AUTO_RULE, AUTO_SMALL, ONE_STACK,  # noqa: F401
                          auto_runs, fits_one_gpu, model_parallel, plan_stack, resolve_stack)
from advisor.errors import AdvisorError, PlanError, format_validation_error  # noqa: F401 (PlanError: read from here too)
from advisor.hardware import Hardware, load_hardware
from advisor.layout import FSDP_TO_ZERO, TWO_CHUNK_SCHEDULES, ContextParallel, PipelineSplit, Plan, resolve_grad_accum
from advisor.model import ModelSpec, load_model
from advisor.options import EstimateOptions, modules_of, moe_setup, stack_name
from advisor.peft_modules import targets_as_run
from advisor.picks import collective_picks
from advisor.results import Estimate, make_estimate
from advisor.precision import canonical, check_gpu
from advisor.stack import Stack, load_stack
from advisor.stages import stage_note
from advisor.step import evaluate
from advisor.spec import checked
from advisor.training import Precision, TrainingSetup
from advisor.workload import Workload, stack_setup



def resolve_world(hw: Hardware, gpus: Optional[int], nodes: Optional[int], plan_product: Optional[int]) -> int:
    """The GPUs of a plan or search: ``gpus``, ``nodes`` whole nodes, or the plan's own product; beyond one node a
    whole number of nodes (the model places ranks node by node, and launchers start as many on every node)."""
    g = hw.gpus_per_node
    if gpus is not None and nodes is not None and gpus != nodes * g:
        raise PlanError(f"--gpus {gpus} disagrees with --nodes {nodes} x {g} GPUs per node; give one of them")
    if gpus is not None and gpus < 1:
        raise PlanError(f"--gpus must be at least 1 (got {gpus})")
    if nodes is not None and nodes < 1:
        raise PlanError(f"--nodes must be at least 1 (got {nodes})")
    world = gpus if gpus is not None else nodes * g if nodes is not None else plan_product or 1
    if world > g and world % g:
        raise PlanError(f"{world} GPUs is not a whole number of {g}-GPU nodes of {hw.name}: use at most {g} or a "
                        f"multiple of {g} (torchrun and the other launchers start as many processes on every node)")
    return world


def resolve_precision(hardware: Hardware, precision: Optional[str], stack: Union[str, Path, Stack, None] = None) -> str:
    """The precision to train in: the one asked for (a stack's own recipe name, e.g. Float8CurrentScaling or
    Megatron's ``--fp8-recipe tensorwise``, means advisor's: advisor.precision), if the GPU runs it (a one-line error
    otherwise), or by default bf16-mixed where the GPU has bf16 (Ampere and later), else fp16-mixed; in a named
    ``stack`` that trains in neither, the first of its own the GPU runs (litgpt's bf16-true)."""
    gpu = hardware.gpu
    default = "bf16-mixed" if gpu.runs("bf16") else ("fp16-mixed" if gpu.runs("fp16") else "fp32")
    named = load_stack(stack) if stack is not None and str(stack) not in ("auto", "any") else None
    held = named.engine.precisions if named is not None else None
    own = [p for p in held or () if gpu.runs(Precision(p).math) and Precision(p).recipe is None]
    if held and default not in held:  # the stack's own, where it lacks the GPU's
        if not own:
            raise PlanError(f"stack {named.name} trains in {', '.join(held)}, which the {gpu.name} of profile "
                            f"{hardware.name} does not run: use another --stack")
        default = own[0]
    if precision is None:
        return default
    precision = canonical(precision)
    try:
        p = Precision(precision)
    except ValueError:
        return precision  # not a precision at all: TrainingSetup names the choices
    math = p.math
    r = p.recipe
    if r is not None:
        why = check_gpu(r, gpu.name, gpu.peak_tflops, gpu.block_scaling)
        if why is not None:
            raise PlanError(f"{why} (profile {hardware.name})")
    if not gpu.runs(math):
        raise PlanError(f"--precision {precision}: the {gpu.name} of profile {hardware.name} has no {math} math "
                        f"(it lists {', '.join(sorted(gpu.peak_tflops))}); use {default}")
    return precision


def finetune_of(o, method: Optional[str] = None, model: Optional[ModelSpec] = None, hw: Optional[Hardware] = None):
    """The options' FineTune (PEFT's default targets for ``model``'s family where none are given), or a one-line
    PlanError naming the option ("auto" is plan's only, an offload ``hw`` cannot cost: check_host)."""
    if (method or o.method) == "auto":
        raise PlanError("--method auto picks a method by searching: use it with advisor plan (estimate and export "
                        "cost one method: full, lora or qlora)")
    named = stack_name(o.stack)
    try:  # a named stack's own adapter code where --lora-library is not given (engine.adapter_library)
        library = load_stack(o.stack).engine.adapter_library if named not in ("auto", "any") else "peft"
    except AdvisorError:
        library = "peft"  # an unknown stack is refused where the setup is built, in its own words
    try:
        ft = o.finetune(method, model, library)
    except Exception as exc:
        raise PlanError(format_validation_error(exc)) from None
    if hw is not None:
        check_host(hw, ft)
    return ft


def check_host(hardware: Hardware, ft) -> None:
    """A fine-tune's CPU offload (--adapter-offload: the adapters' optimizer step on the CPU, the activations copied to
    host memory) crosses the host link to the host's CPU and memory: as the plans' --offload (advisor.parallel.offload
    NO_HOST), it is costed only where the hardware profile describes its host side."""
    if ft.offload.value != "none" and hardware.host is None:
        raise PlanError(f"--adapter-offload {ft.offload.value}: hardware profile {hardware.name} has no host side (its "
                        f"host link, CPU and memory): offload is not costed (measure it on the machine: advisor calibrate --host --base {hardware.name} "
                        "--out FILE, then --hw FILE; or add host: to the profile)")


def build_inputs(model, hw, **given):
    """Validate every option (advisor.options) and return (model spec, hardware, stack, plan, setup, world)."""
    o = EstimateOptions.of(given, {}, "estimate")
    spec, hardware = load_model(model), load_hardware(hw)
    precision = resolve_precision(hardware, o.precision, o.stack)
    zero = FSDP_TO_ZERO[o.fsdp] if o.fsdp is not None else (o.zero or 0)
    # without --gpus or --nodes the plan's own degrees say how many GPUs: dp (default 1) x tp x pp
    world = resolve_world(hardware, o.gpus, o.nodes, (o.dp or 1) * o.tp * o.pp * o.cp)
    dp = o.dp
    if dp is None:
        if world % (o.tp * o.pp * o.cp):
            what = f"tp x pp x cp = {o.tp} x {o.pp} x {o.cp}" if o.cp > 1 else f"tp x pp = {o.tp} x {o.pp}"
            raise PlanError(f"{world} GPUs are not divisible by {what}: give --dp or a GPU count that it divides")
        dp = world // (o.tp * o.pp * o.cp)
    # the interleaved schedule's chunks; ZB-V's and DualPipeV's two (Plan.chunks) recorded as the search does
    two = o.schedule in TWO_CHUNK_SCHEDULES
    virtual_stages = (o.virtual_stages or 2) if o.schedule == "interleaved" else 2 if two else 1
    seq = default_seq_len(spec) if o.seq is None else o.seq
    try:
        setup = TrainingSetup(seq_len=seq, micro_batch=o.micro_batch, global_batch=o.global_batch,
                              grad_accum=o.grad_accum, precision=precision, optimizer=o.optimizer,
                              attention=o.attention, recompute=o.recompute, recompute_layers=o.recompute_layers,
                              recompute_modules=modules_of(o.recompute_modules),
                              stack=stack_name(o.stack), finetune=finetune_of(o, model=spec, hw=hardware),
                              **moe_setup(o))
        plan = Plan(dp=dp, tp=o.tp, pp=o.pp, zero=zero, hybrid_shard=(o.fsdp == "hybrid-shard"), sp=bool(o.sp),
                    schedule=o.schedule, virtual_stages=virtual_stages, data_parallel=o.data_parallel,
                    overlap_grad_reduce=True if o.overlap_grad_reduce is None else o.overlap_grad_reduce,
                    allow_tp_across_nodes=o.allow_tp_across_nodes, offload=o.offload, ep=o.ep, etp=o.etp)
    except Exception as exc:
        raise PlanError(format_validation_error(exc)) from None
    check_setup(spec, setup)
    if o.cp > 1:  # before the stack: --stack auto costs a CP plan where CP runs (AUTO_RULE)
        plan = plan.model_copy(update={"cp": o.cp})
    resolved = plan_stack(o.stack, spec, hardware, setup, plan)
    # the stack's own default; SP under a routed model's TP where the stack's MoE layer needs it (megatron-core)
    if o.sp is None and o.tp > 1 and (resolved.engine.sequence_parallel != "opt_in" or (
            resolved.engine.moe_tp_needs_sp and spec.routed)):
        plan = plan.model_copy(update={"sp": True})
    if o.cp > 1:  # the flavour asked for, or the first the stack runs
        flavours = resolved.engine.context_parallel
        kind = o.cp_comm or (flavours[0] if flavours else "ring")
        plan = plan.model_copy(update={"cp": o.cp, "cp_comm": ContextParallel(kind)})
    if o.pp_split != "even":
        plan = plan.model_copy(update={"pp_split": PipelineSplit(o.pp_split)})
    errors = plan_errors(plan, setup, spec, hardware, world, resolved)
    if errors:
        raise PlanError("invalid plan: " + "; ".join(errors) + _auto_said(o.stack, spec, resolved, plan))
    setup = stack_setup(setup, resolved, spec)  # the stack auto chose, its default optimizer, PEFT's modules
    return spec, hardware, resolved, plan, setup, world


def _auto_said(asked: str, spec: ModelSpec, resolved: Stack, plan: Plan) -> str:
    """Why --stack auto costed a model-parallel plan outside AUTO_MODEL_PARALLEL, where that is why it is refused."""
    large = load_stack(AUTO_MODEL_PARALLEL)
    if str(asked) != "auto" or resolved.name == large.name or not model_parallel(plan.tp, plan.pp, plan.cp):
        return ""
    from advisor.export import unwritable
    from advisor.workload import lacked

    why = lacked(large, spec) or unwritable(large, spec)
    return (f" (--stack auto costs {spec.name} in {resolved.name}: {large.name}'s code or formats lack "
            f"{', '.join(why)}; --stack {large.name} costs the plan, its export refused)") if why else ""


# The default sequence length: the model's context length, at most Llama 3's 8,192 pretraining sequence (a
# long-context config's window, 131,072 for Llama 3.1, is reached by extending a model pretrained shorter).
MAX_DEFAULT_SEQ = 8192


def default_seq_len(spec: ModelSpec) -> int:
    return min(spec.max_positions, MAX_DEFAULT_SEQ)


def check_seq(spec: ModelSpec, seq: int) -> None:
    if seq > spec.max_positions and spec.position.value == "learned":
        raise PlanError(f"--seq {seq} exceeds {spec.name}'s {spec.max_positions} learned positions; use --seq <= {spec.max_positions}")


def check_setup(spec: ModelSpec, setup: TrainingSetup) -> None:
    """What a setup asks of the model: a sequence its positions reach, no more checkpointed layers than it has."""
    check_seq(spec, setup.seq_len)
    if setup.recompute_layers > spec.n_layers:
        raise PlanError(f"--recompute-layers {setup.recompute_layers}: {spec.name} has {spec.n_layers} layers; give at "
                        f"most {spec.n_layers}")


def estimate(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], *, gpus: Optional[int] = None,
             nodes: Optional[int] = None, dp: Optional[int] = None, tp: int = 1, pp: int = 1,
             zero: Optional[int] = None, fsdp: Optional[str] = None, sp: Optional[bool] = None, schedule: str = "1f1b",
             virtual_stages: Optional[int] = None, micro_batch: int = 1, global_batch: Optional[int] = None,
             grad_accum: Optional[int] = None, seq: Optional[int] = None, precision: Optional[str] = None,
             attention: str = "sdpa", recompute: str = "none", optimizer: Optional[str] = None,
             overlap_grad_reduce: Optional[bool] = None, data_parallel: str = "ddp", stack: Union[str, Stack] = "auto",
             allow_tp_across_nodes: bool = False, recompute_layers: int = 1, recompute_modules: Optional[str] = None,
             offload: str = "none", method: str = "full", lora_rank: int = 8, lora_alpha: float = 16.0,
             lora_dropout: float = 0.0, lora_targets: Optional[str] = None, dora: bool = False,
             quant: Optional[str] = None, double_quant: bool = True, optimizer_8bit: bool = False, paged: bool = False,
             adapter_offload: str = "none", lora_library: Optional[str] = None, ep: int = 1,
             etp: Optional[int] = None, moe_capacity_factor: Optional[float] = None, moe_imbalance: float = 1.0,
             moe_dispatcher: Optional[str] = None, moe_overlap: Optional[str] = None, tp_overlap: Optional[str] = None,
             cp: int = 1, cp_comm: Optional[str] = None, pp_split: str = "even", compile: str = "none",
             mtp_layers: int = 0, fp8_attention: bool = False, **unknown) -> Estimate:
    """Estimate one plan: step time, throughput, MFU and HFU, per-GPU memory, the time breakdown.

    ``model``: a catalogue name (``advisor models``), a Hugging Face config.json path or a ModelSpec;
    ``hw``: a profile name (``advisor profiles``), a YAML path or a Hardware. The plan: ``gpus`` or ``nodes``
    (default dp x tp x pp), ``dp`` (default gpus / (tp x pp)), ``tp``, ``pp``, ``zero`` (0-3) or ``fsdp``
    (full-shard, shard-grad-op, hybrid-shard, no-shard), ``sp`` (sequence parallel), ``schedule`` (gpipe, 1f1b,
    interleaved) and ``virtual_stages``, ``data_parallel`` (ddp or dp for nn.DataParallel),
    ``overlap_grad_reduce``, ``cp`` (context parallelism) and ``cp_comm`` (ring, all-gather, ulysses; default the
    stack's first), ``pp_split`` (even, edges: the embedding and the loss counted as layers). The setup: ``micro_batch``, ``global_batch`` or ``grad_accum``, ``seq`` (default the
    model's context length, at most 8192), ``precision`` (fp32, bf16-mixed, fp16-mixed, bf16, fp8-mixed; default
    the GPU's best), ``attention`` (sdpa, eager), ``recompute`` (none, selective, full, block, every-k, offload;
    advisor/recompute.py) with ``recompute_layers`` (k) and ``recompute_modules`` (selective: the sub-modules rerun,
    comma-separated, Megatron's --recompute-modules: core_attn, layernorm, moe_act, mla_up_proj), ``offload`` (none, optimizer-cpu, optimizer-nvme,
    params-cpu, params-nvme: advisor/parallel/offload.py), ``optimizer`` (adamw, adamw-fused, sgd), ``stack``
    (``advisor stacks``, a YAML path, or auto: AUTO_RULE). Fine-tuning (advisor.finetune):
    ``method`` (full, lora, qlora), ``lora_rank``, ``lora_alpha``, ``lora_dropout``, ``lora_targets`` (PEFT's,
    torchtune's or litgpt's module names, or all-linear), ``dora``, ``quant`` (none, int8, nf4), ``double_quant``,
    ``optimizer_8bit``, ``paged``, ``adapter_offload`` (none, optimizer, activations, optimizer+activations:
    a fine-tune's CPU offload as torchtune and DeepSpeed run it), ``lora_library`` (peft, litgpt, torchtune:
    whose adapter code runs; default the stack's: litgpt's own in litgpt, else PEFT's). Mixture of experts: ``ep`` (expert parallelism, carved from dp x cp x tp), ``etp`` (the
    experts' tensor parallelism, default tp), ``moe_capacity_factor`` (default dropless), ``moe_imbalance``
    (default 1: balanced), ``moe_dispatcher`` (alltoall, flex) and ``moe_overlap`` (none, shared-experts, batch;
    both default the stack's: advisor.parallel.expert); ``tp_overlap`` (none, userbuffers, async: the sequence-parallel
    collectives pipelined with their GEMMs, advisor.parallel.tensor; default the stack's); ``compile``: what torch.compile
    compiles as the stack applies it (none, model, loss, model,loss: torchtitan's compile.components); ``mtp_layers``: the
    multi-token prediction depths trained beside the model (Megatron's --mtp-num-layers, advisor.mtp; default 0); ``fp8_attention``: the attention core in FP8 (megatron-core's TransformerConfig.fp8_dot_product_attention, which Megatron-LM's arguments.py gives no flag). Every bad value is an AdvisorError
    of one line; the options are ``advisor estimate``'s, spelled with underscores.
    """
    given = {k: v for k, v in locals().items() if k not in ("model", "hw", "unknown")}
    if unknown:
        EstimateOptions.of(given, unknown, "estimate")
    spec, hardware, stack_, plan, setup, world = build_inputs(model, hw, **given)
    est = _estimate(spec, hardware, stack_, plan, setup, world)
    return est.model_copy(update={"stack_rule": AUTO_RULE}) if str(stack) == "auto" else est


def estimate_plan(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], plan: Plan,
                  setup: TrainingSetup, world_size: Optional[int] = None,
                  stack: Union[str, Path, Stack, None] = None) -> Estimate:
    """Estimate a typed Plan and TrainingSetup (e.g. a row of ``advisor.plan``'s result) on ``world_size`` GPUs
    (default: the plan's dp x tp x pp), in ``stack`` (a Stack, name or path; default: the setup's, by name: a row
    of a search run on a Stack read from a file takes that Stack here)."""
    spec, hardware = load_model(model), load_hardware(hw)
    if not isinstance(plan, Plan) or not isinstance(setup, TrainingSetup):
        raise PlanError(f"estimate_plan takes an advisor.layout.Plan and an advisor.training.TrainingSetup (got "
                        f"{type(plan).__name__} and {type(setup).__name__}): or call advisor.estimate with options")
    plan, setup = checked(plan, PlanError, "plan"), checked(setup, PlanError, "setup")  # model_copy skips validation
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)):
        raise PlanError(f"world_size must be a whole number of GPUs (got {world_size!r})")
    world = resolve_world(hardware, world_size, None, plan.world_size)  # whole nodes beyond one
    resolve_precision(hardware, setup.precision.value)  # the GPU runs it
    check_setup(spec, setup)
    check_host(hardware, setup.finetune)
    asked = setup.stack if stack is None else stack
    auto = not isinstance(asked, Stack) and str(asked) == "auto"
    stack = plan_stack(asked, spec, hardware, setup, plan)
    errors = plan_errors(plan, setup, spec, hardware, world, stack)
    if errors:
        raise PlanError("invalid plan: " + "; ".join(errors))
    setup = setup.model_copy(update={"finetune": targets_as_run(spec, setup.finetune, stack)})  # a search's row: as they are
    if setup.stack != stack.name:  # the setup names the stack it was costed in, as a search's rows do
        setup = setup.model_copy(update={"stack": stack.name})
    est = _estimate(spec, hardware, stack, plan, setup, world)
    return est.model_copy(update={"stack_rule": AUTO_RULE}) if auto else est


def _estimate(spec: ModelSpec, hardware: Hardware, stack: Stack, plan: Plan, setup: TrainingSetup, world: int) -> Estimate:
    grad_accum, _ = resolve_grad_accum(setup, plan)
    w, c = Workload.of(spec, hardware, stack, setup), Candidates.of_plan(plan, setup, grad_accum)
    est = make_estimate(spec, hardware, stack.name, plan, setup, world, grad_accum, evaluate(w, c),
                        collectives=collective_picks(w, c))
    return est.model_copy(update={"pipeline": stage_note(w, c)})


def launch_config(model: Union[str, Path, ModelSpec], hw: Union[str, Path, Hardware], *, format: Optional[str] = None,
                  **options):
    """The launch config (``advisor.export.Exported``: file name, text, notes) of one plan, in a format its stack
    launches: ``format`` one of the stack profile's ``launch`` (default: its first). ``options`` are ``estimate``'s
    (``stack`` included); with no stack given, a format picks the stack that launches it, as ``advisor export``
    does. A format the stack does not launch, or a plan it cannot express, is an ExportError of one line."""
    from advisor.export import export, launching

    auto = format is not None and str(options.get("stack", "auto")) == "auto"
    try:
        spec, hardware, stack_, plan, setup, world = build_inputs(model, hw, **options)
    except AdvisorError as refused:  # a plan auto's stack refuses may run in the one that launches the format
        if not auto:
            raise
        try:
            spec, hardware, stack_, plan, setup, world = build_inputs(model, hw, **{**options, "stack": launching(format)})
        except AdvisorError:
            raise refused from None  # refused by both: estimate's words
    if auto and format not in stack_.launch:
        spec, hardware, stack_, plan, setup, world = build_inputs(model, hw, **{**options, "stack": launching(format, stack_)})
    grad_accum, _ = resolve_grad_accum(setup, plan)  # build_inputs has refused a batch that does not resolve
    return export(format, spec, hardware, plan, setup, grad_accum, world, stack_)
