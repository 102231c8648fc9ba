"""Megatron-LM: a bash script with pretrain_gpt.py's arguments (megatron/training/arguments.py spelling).

Model shape (and a mixture of experts' --num-experts, --moe-*; RoPE's base and scaling and the norms' epsilon, a note
where one is not known), parallel degrees (with
--expert-model-parallel-size), batch, precision, recompute and data parallelism (distributed optimizer for ZeRO-1, Megatron-FSDP for ZeRO-2/3, optimizer instances for HSDP; DeepSpeed's ZeRO for Megatron-DeepSpeed: megatron_deepspeed.py) become flags; data, tokenizer,
optimizer and checkpoint paths stay the user's. The environment Megatron-LM's validate_args checks
(CUDA_DEVICE_MAX_CONNECTIONS) is set in the script. The notes are written into the script as comments.
"""

from __future__ import annotations

import itertools
import shlex
from typing import Optional

from advisor.export.common import (
    gradient_clip,
    Exported,
    ExportError,
    Plan,
    Precision,
    TrainingSetup,
    argv_lines,
    check,
    global_batch,
    header,
)
from advisor.export.megatron_deepspeed import deepspeed_lines, fork_context_parallel, refuse_for_fork, runs_deepspeed
from advisor.export.megatron_shape import MLA, constant_flags, model_shape, router_flags, unwritten_by
from advisor.export.torchrun import torchrun_argv
from advisor.hardware import Hardware
from advisor.model import ModelSpec, PositionKind
from advisor.parallel import offload
from advisor.stack import Stack, load_stack
from advisor.workload import moe_choices, tp_overlap_choice


def refuse_unwritable(model: ModelSpec, plan: Plan, setup: TrainingSetup, product: str, writes: str,
                      stack: Optional[Stack] = None) -> None:
    """What a Megatron export (``product``'s ``writes``: Megatron-LM's flags, Megatron-Bridge's overrides, the same
    megatron-core underneath) cannot write, as one ExportError line (``stack``: the one the plan was costed in)."""
    if model.position is PositionKind.alibi:
        raise ExportError(f"{product} has no ALiBi position embedding ({model.name}); "
                          "BLOOM-style models need Megatron-DeepSpeed: use --format deepspeed")
    if model.position is PositionKind.learned and setup.seq_len > model.max_positions:
        raise ExportError(f"seq_len={setup.seq_len} exceeds {model.name}'s {model.max_positions} learned positions")
    missing = unwritten_by(model, "megatron" if product == "Megatron-LM" else "megatron-bridge")
    if missing:
        hint = "megatron" if missing == [MLA] else "accelerate or torchrun (--stack hf-trainer)"
        raise ExportError(f"{model.name} has {', '.join(missing)}, which the {product} {writes} advisor writes do not "
                          f"describe: use --format {hint}")
    if plan.schedule.value in ("zb-h1", "zb-v", "dualpipev"):
        raise ExportError(f"Megatron-Core 0.16.1 has no {plan.schedule.value} schedule: use 1f1b or interleaved")
    if plan.zero >= 2 and stack is not None and stack.engine.zero3_calls is not None and not runs_deepspeed(stack):
        # ZeRO-2/3 are written as Megatron-FSDP (_data_parallel), megatron-core's engine; a stack whose profile costs
        # DeepSpeed's coordinator (engine.zero3_calls: megatron-deepspeed's stage3.py per-tensor gathers) would launch
        # another engine than the estimate's, at other times and memory
        why = (f"stack {stack.name} costs ZeRO-{plan.zero} as DeepSpeed's engine runs it; the {product} {writes} would "
               "launch Megatron-FSDP instead")
        if plan.cp > 1:  # nor does the DeepSpeed JSON write it (advisor.export._export): no format to send it to
            raise ExportError(f"{why}, and the deepspeed JSON has no context parallelism: use --zero 1 or --cp 1")
        raise ExportError(why, instead="deepspeed")
    if plan.offload.value != "none" and not (offload.hybrid(stack) and plan.offload.value == "optimizer-cpu"):
        # the DeepSpeed JSON writes the offload but not context parallelism (advisor.export._export): name both ways out
        hint = (f"the deepspeed JSON has no context parallelism: drop --offload or --cp {plan.cp}" if plan.cp > 1
                else "use --format deepspeed")
        raise ExportError(f"the advisor costs {plan.offload.value} offload as DeepSpeed's ZeRO-Offload/Infinity or FSDP "
                          f"run it; Megatron's optimizer CPU offload is another engine: {hint}")


def megatron_args(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup,
                  grad_accum: int, stack: Optional[Stack] = None) -> tuple[list[str], list[str]]:
    """Megatron-LM pretrain_gpt.py flags (megatron/training/arguments.py spelling) and notes; ``stack``: the one the
    plan was costed in (costed_stack), whose defaults the overlaps and dispatcher not asked for take."""
    stack = costed_stack(setup, stack)
    refuse_unwritable(model, plan, setup, "Megatron-LM", "flags", stack)
    notes: list[str] = []
    a = ["--tensor-model-parallel-size", plan.tp, "--pipeline-model-parallel-size", plan.pp]
    if plan.sp and plan.tp > 1:
        a.append("--sequence-parallel")
        if tp_overlap_choice(stack, setup) == "userbuffers":  # Transformer Engine's userbuffers (advisor.parallel.tensor)
            a.append("--tp-comm-overlap")
    a += _context_parallel(plan)
    layout = interleaved_layout(model.n_layers, plan, setup.mtp_layers)  # chunks pp x v does not divide: as Bridge's recipes
    a += ["--pipeline-model-parallel-layout", layout] if layout is not None else _pipeline_split(model, plan)
    if layout is None and plan.pp > 1 and plan.schedule == "interleaved" and plan.pp_split.value == "edges":
        # Megatron-LM's flag for a virtual-stage count (arguments.py: --num-virtual-stages-per-pipeline-rank; its
        # --num-layers-per-virtual-pipeline-stage cannot go with the uneven first/last stage counts)
        a += ["--num-virtual-stages-per-pipeline-rank", plan.virtual_stages]
    elif layout is None and plan.pp > 1 and plan.schedule == "interleaved":
        a += ["--num-layers-per-virtual-pipeline-stage", model.n_layers // (plan.pp * plan.virtual_stages)]
    if plan.pp > 1 and plan.schedule == "gpipe":
        notes.append("Megatron has no GPipe schedule: it runs 1F1B (less activation memory than estimated)")
    a += _recompute(model, plan, setup)
    if setup.mtp_layers:  # multi-token prediction (advisor.mtp), on the last stage: in the layout's last chunk, else there
        a += ["--mtp-num-layers", setup.mtp_layers]
    a += ["--micro-batch-size", setup.micro_batch, "--global-batch-size", global_batch(plan, setup, grad_accum),
          "--seq-length", setup.seq_len, "--max-position-embeddings", max(model.max_positions, setup.seq_len)]
    constants, unknown = constant_flags(model)  # RoPE's base and scaling, the norms' epsilon
    a += model_shape(model) + constants + _experts(model, plan, setup, notes, stack)
    notes += unknown
    # under DeepSpeed's engine (Megatron-DeepSpeed) ZeRO, its overlap and hpZ are the JSON's (megatron_deepspeed)
    a += _precision(setup, notes) + ([] if runs_deepspeed(stack) else _data_parallel(hw, plan, notes))
    a += ["--clip-grad", gradient_clip(stack)]  # as costed: 0.0 where the stack does not clip
    if not stack.engine.grad_nan_check and stack.engine.bucket_elements is not None:  # megatron-core's DDP, costed
        # without its per-bucket NaN check (megatron-bridge-perf): Megatron-LM runs it unless told (arguments.py:2735-2737)
        a.append("--no-check-for-nan-in-loss-and-grad")
    if getattr(setup.optimizer, "value", None) == "sgd":  # costed with one momentum state (advisor.optimizer)
        a += ["--optimizer", "sgd"]  # arguments.py:2776 (default adam, two states; --sgd-momentum 0.9)
    elif getattr(setup.optimizer, "value", None) == "adamw":  # megatron/core/optimizer/__init__.py:11-33
        notes.append("torch's foreach AdamW was costed; Megatron-LM's --optimizer adam is Transformer Engine's FusedAdam "
                     "(apex's without TE; torch's AdamW only without either): its step runs faster than estimated")
    if setup.attention.value == "eager":
        notes.append("eager attention: Megatron uses fused attention kernels; memory will be lower than estimated")
    if runs_deepspeed(stack):
        a = fork_context_parallel(plan, a)
        refuse_for_fork(model, plan, a, stack)
    return [str(x) for x in a], notes


# advisor's context-parallel flavours as Megatron's --cp-comm-type (megatron-core 0.16.1 transformer_config.py
# cp_comm_type: "p2p" (TE's ring), "all_gather", "a2a" (DeepSpeed-Ulysses' exchange), "a2a+p2p")
CP_COMM_TYPE = {"ring": "p2p", "all-gather": "all_gather", "ulysses": "a2a"}


def _context_parallel(plan: Plan) -> list:
    """--context-parallel-size and its --cp-comm-type (Megatron-LM arguments.py; CP needs TE's fused attention,
    which Megatron's --transformer-impl transformer_engine default gives)."""
    if plan.cp <= 1:
        return []
    return ["--context-parallel-size", plan.cp, "--cp-comm-type", CP_COMM_TYPE[plan.cp_comm.value]]


def layout_chunks(n_layers: int, plan: Plan) -> list[int] | None:
    """Layers of each of the pp x v interleaved chunks where pp x v does not divide them (advisor.parallel.pipeline
    layout_fills): ceil(L / (pp v)) each, the rest in the last; without interleaving, where no first/last stage sizes
    give the even split (pipeline_edge_layers), ceil(L / pp) on the first stages and one fewer on the rest (the
    busiest stage as costed); None where the plan needs no layout."""
    chunks, per = plan.pp * plan.virtual_stages, -(-n_layers // (plan.pp * plan.virtual_stages))
    if plan.pp <= 1 or plan.pp_split.value != "even" or n_layers % chunks == 0:
        return None
    if plan.schedule == "interleaved":
        return [per] * (chunks - 1) + [n_layers - per * (chunks - 1)]
    full = n_layers - plan.pp * (per - 1)  # stages holding ceil(L / pp)
    return None if pipeline_edge_layers(n_layers, plan.pp) else [per] * full + [per - 1] * (plan.pp - full)


def interleaved_layout(n_layers: int, plan: Plan, mtp: int = 0) -> str | None:
    """--pipeline-model-parallel-layout for layout_chunks (megatron-core transformer/pipeline_parallel_layer_layout.py
    syntax: E the embedding, t a decoder layer, L the loss, | between chunks in order, (x)*n repeats), e.g. DeepSeek-V3's
    61 layers on 16 chunks "Et*4|(t*4|)*14t*1L", as set_deepseek_v3_pipeline_model_parallel_layout builds it; ``mtp``
    multi-token prediction depths as "m" before the loss ("...t*1mL": validate_layer_layout counts them against
    --mtp-num-layers, pipeline_parallel_layer_layout.py:111-113)."""
    chunks = layout_chunks(n_layers, plan)
    if chunks is None:
        return None
    runs = [(n, len(list(g))) for n, g in itertools.groupby(chunks[1:-1])]
    return f"Et*{chunks[0]}|" + "".join(f"(t*{n}|)*{k}" for n, k in runs) + f"t*{chunks[-1]}" + "m" * mtp + "L"


def pipeline_edge_layers(n_layers: int, pp: int) -> tuple[int, int] | None:
    """(first, last) stage layers giving an even split pp does not divide: ceil(L / pp) on every middle stage, the rest
    on the first and the last, the last (with the LM head) no larger (megatron-core 0.16.1 transformer_config.py)."""
    if pp <= 1 or n_layers % pp == 0:
        return None
    per = -(-n_layers // pp)
    rest = n_layers - per * (pp - 2)
    first, last = rest - rest // 2, rest // 2
    if pp == 2:
        first, last = per, n_layers - per
    return (first, last) if 1 <= last <= first <= per else None


def _pipeline_split(model: ModelSpec, plan: Plan) -> list:
    if plan.pp <= 1:
        return []
    if plan.pp_split.value == "edges":
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    edges = pipeline_edge_layers(model.n_layers, plan.pp)  # else a layout (layout_chunks)
    return [] if edges is None else ["--decoder-first-pipeline-num-layers", edges[0],
                                     "--decoder-last-pipeline-num-layers", edges[1]]


def _recompute(model: ModelSpec, plan: Plan, setup: TrainingSetup) -> list:
    """The plan's checkpointing policy (megatron/core/transformer/transformer_block.py: uniform checkpoints groups of k
    layers, block the first k of each stage chunk; offload Transformer Engine's CPU offload of the first k layers)."""
    r, k = setup.recompute.value, setup.recompute_layers
    if r == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", k]
    if r == "block":
        return ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", k]
    if r == "selective":  # --recompute-modules: a list (transformer_config.py recompute_modules; default core_attn)
        return ["--recompute-granularity", "selective", *(["--recompute-modules", *setup.recompute_modules]
                                                           if setup.recompute_modules else [])]
    if r == "offload":  # model_parallel_config.py cpu_offloading_num_layers (arguments.py turns cpu_offloading on)
        return ["--cpu-offloading-num-layers", k]
    if r != "none":
        raise ExportError(f"Megatron has no {r} checkpointing: use --recompute full, block, selective or offload, or another --format")
    return []


# Megatron-LM's low-precision flags (megatron-core 0.16.1 transformer_config.py: fp8 -> --fp8-format e4m3|hybrid,
# fp8_recipe tensorwise|delayed|mxfp8|blockwise, fp4 -> --fp4-format e2m1, fp4_recipe nvfp4, first_last_layers_bf16).
# The FP8 format is Transformer Engine's default for each recipe: HYBRID for delayed and current scaling, E4M3 for
# MXFP8BlockScaling and Float8BlockScaling (TE recipe/__init__.py).
MEGATRON_RECIPES = {
    "fp8-tensorwise": ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "fp8-delayed": ["--fp8-format", "hybrid", "--fp8-recipe", "delayed"],
    "fp8-blockwise": ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "mxfp8": ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "nvfp4": ["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4", "--first-last-layers-bf16"],
}


def costed_stack(setup: TrainingSetup, stack: Optional[Stack] = None) -> Stack:
    """The stack the plan was costed in: the one given (advisor.export passes it), else the setup's, else megatron-core
    (the stack whose flags these are)."""
    if stack is not None:
        return stack
    return load_stack(setup.stack if setup.stack not in ("auto", "any") else "megatron-core")


def _experts(model: ModelSpec, plan: Plan, setup: TrainingSetup, notes: list[str], stack: Stack) -> list:
    """Mixture of experts (megatron/training/arguments.py _add_moe_args): the experts, their width, top-k, the
    dense first layers as --moe-layer-freq's list, the expert-parallel and expert tensor-parallel degrees, grouped
    GEMMs and the all-to-all dispatcher (what advisor.parallel.expert costs), dropless or a capacity factor."""
    e = model.experts
    if e is None:
        return []
    etp = plan.tp if plan.etp is None else plan.etp
    a: list = ["--num-experts", e.n_experts, "--moe-ffn-hidden-size", e.d_ff_expert, "--moe-router-topk",
               e.experts_per_token, "--expert-model-parallel-size", plan.ep, "--expert-tensor-parallel-size", etp,
               "--moe-grouped-gemm"]
    dispatcher, overlap = moe_choices(stack, setup)  # as costed: flex as HybridEP (Megatron-Bridge's recipes' backend)
    sms = ["--moe-hybridep-num-sms", stack.engine.flex_dispatcher_sms] if stack.engine.flex_dispatcher_sms else []
    a += (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep", *sms]
          if dispatcher == "flex" else ["--moe-token-dispatcher-type", "alltoall"])
    a += ["--moe-shared-expert-intermediate-size", e.d_ff_shared] if e.d_ff_shared else []
    a += ["--moe-router-num-groups", e.groups, "--moe-router-group-topk", e.group_topk] if e.groups > 1 else []
    a += router_flags(e)
    if overlap == "shared_experts" and e.d_ff_shared and plan.ep > 1:
        a.append("--moe-shared-expert-overlap")
    if overlap == "batch" and plan.ep > 1:
        a.append("--overlap-moe-expert-parallel-comm")
    runs = [(r.count, r.dense) for r in model.layer_runs] or [(model.n_layers, False)]
    if any(dense for _, dense in runs):
        # a Python list expression, as Megatron-LM's moe_freq_type parses it: 0 a dense layer, 1 an MoE layer
        a += ["--moe-layer-freq", "[" + ",".join(str(int(not dense)) for count, dense in runs for _ in range(count)) + "]"]
    if setup.moe_capacity_factor is not None:
        a += ["--moe-expert-capacity-factor", setup.moe_capacity_factor, "--moe-token-drop-policy", "probs"]
    if setup.moe_imbalance != 1.0:
        notes.append(f"the estimate assumed routing {setup.moe_imbalance:g}x imbalanced on the busiest expert rank; "
                     "Megatron's router balances by its auxiliary loss (--moe-aux-loss-coeff)")
    return a


def _precision(setup: TrainingSetup, notes: list[str]) -> list[str]:
    p = setup.precision
    if setup.fp8_attention:  # TransformerConfig.fp8_dot_product_attention has no flag: arguments.py:2224,2250 exclude it
        notes.append("FP8 attention was costed; Megatron-LM's arguments.py has no --fp8-dot-product-attention (0.19: "
                     "fp8_dot_product_attention is among the TransformerConfig fields with no CLI argument): the run's "
                     "attention core stays BF16 (slower than estimated) unless a model provider sets it")
    if p.recipe is not None:
        if p.value not in MEGATRON_RECIPES:
            raise ExportError(f"--precision {p.value} is torchao's recipe, which Megatron-LM does not run (its "
                              f"--fp8-recipe: tensorwise, delayed, mxfp8, blockwise; --fp4-recipe nvfp4): pick one of "
                              f"{', '.join(MEGATRON_RECIPES)}")
        return ["--bf16"] + MEGATRON_RECIPES[p.value]
    if p is Precision.fp16_mixed:
        return ["--fp16"]  # no --loss-scale: dynamic loss scaling (Megatron's default)
    if p is Precision.bf16:
        # arguments.py: --main-params-dtype takes fp32 or fp16 only; --megatron-fsdp-main-params-dtype also bf16
        notes.append("pure bf16 was costed (no fp32 master weights): Megatron's --bf16 keeps fp32 main params "
                     "(--main-params-dtype takes fp32 or fp16; under Megatron-FSDP --megatron-fsdp-main-params-dtype bf16 "
                     "drops them), so the run holds more memory than estimated")
    return ["--bf16"] if p in (Precision.bf16_mixed, Precision.bf16) else []


def _data_parallel(hw: Hardware, plan: Plan, notes: list[str]) -> list[str]:
    """ZeRO-1 = distributed optimizer; ZeRO-2/3 = Megatron-FSDP sharding strategy; HSDP = optimizer instances."""
    a: list[str] = []
    if plan.zero >= 1:
        a.append("--use-distributed-optimizer")
    if plan.offload.value == "optimizer-cpu":  # HybridDeviceOptimizer (refuse_unwritable): every state on the CPU
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0", "--use-precision-aware-optimizer"]
    if plan.zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]
        # validate_args asserts ckpt_format == "fsdp_dtensor" under Megatron-FSDP (its default is torch_dist)
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy, "--ckpt-format", "fsdp_dtensor"]
        notes.append(f"ZeRO-{plan.zero} maps to Megatron-FSDP ({strategy}); it saves checkpoints only as "
                     "fsdp_dtensor (--ckpt-format fsdp_dtensor)")
    if plan.hybrid_shard:
        a += ["--num-distributed-optimizer-instances", str(plan.dp // hw.gpus_per_node)]
        notes.append("HSDP: Megatron-FSDP shards inside each distributed-optimizer instance (one per node) "
                     "and replicates across instances")
    if plan.overlap_grad_reduce and plan.dp > 1:
        a.append("--overlap-grad-reduce")
    return a


def megatron_env(plan: Plan, notes: list[str], fsdp: bool = True) -> dict[str, str | None]:
    """Environment the launch needs (None = unset): CUDA_DEVICE_MAX_CONNECTIONS, as validate_args checks it.

    Tensor parallelism without FSDP: 1, so that each TP collective is queued ahead of the GEMM it overlaps
    (validate_args requires it before Blackwell; from Blackwell on it is no longer required, and 1 is still
    accepted). Megatron-FSDP: not 1 (validate_args asserts "FSDP always requires CUDA_DEVICE_MAX_CONNECTIONS
    value large than one"), so it is unset, leaving CUDA's default of 8, in case the user's shell exports 1.
    ``fsdp`` False: ZeRO-2/3 are DeepSpeed's (Megatron-DeepSpeed), Megatron's tensor parallelism the same.
    """
    if plan.zero >= 2 and fsdp:
        if plan.tp > 1 or plan.cp > 1:
            notes.append(f"Megatron-FSDP with tp={plan.tp}, cp={plan.cp}: TP/CP overlap wants CUDA_DEVICE_MAX_CONNECTIONS=1 but "
                         "Megatron-FSDP refuses 1, so it is unset; TP communication may overlap less with compute")
        return {"CUDA_DEVICE_MAX_CONNECTIONS": None}
    if plan.tp > 1 or plan.cp > 1:  # validate_args: "tensor model parallelism or context parallelism require ..."
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    return {}


def _env_lines(env: dict[str, str | None]) -> list[str]:
    why = {"1": "# tensor or context parallelism: Megatron-LM's validate_args wants one CUDA hardware queue (before Blackwell)",
           None: "# Megatron-FSDP: validate_args refuses CUDA_DEVICE_MAX_CONNECTIONS=1 (unset: CUDA's default)"}
    lines = []
    for name, value in env.items():
        lines += [why[value], f"unset {name}" if value is None else f"export {name}={shlex.quote(value)}"]
    return lines


def megatron_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                    world_size: int, stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    stack = costed_stack(setup, stack)
    args, notes = megatron_args(model, hw, plan, setup, grad_accum, stack)
    env = megatron_env(plan, notes, fsdp=not runs_deepspeed(stack))
    ds = deepspeed_lines(model, hw, plan, setup, grad_accum, world_size, stack, notes) if runs_deepspeed(stack) else []
    lines = ["#!/bin/bash", f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
             "# Megatron-LM arguments (megatron/training/arguments.py); data, optimizer and checkpoint flags are yours.",
             f"# vocab: the tokenizer sets it ({model.vocab} here; Megatron pads it to a multiple of 128 x tp):",
             "#   e.g. --tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH,",
             f"#   or for synthetic data --tokenizer-type NullTokenizer --vocab-size {model.vocab - 1} --mock-data"
             " (NullTokenizer adds one EOD token)",
             "MEGATRON_ARGS=(", *argv_lines(args)]
    lines += [")", *ds, *_env_lines(env), " ".join(torchrun_argv(hw, world_size, "pretrain_gpt.py"))
              + ' "${MEGATRON_ARGS[@]}"' + (' "${DEEPSPEED_ARGS[@]}"' if ds else "") + ' "$@"']
    lines += [f"# note: {n}" for n in notes]
    return Exported("megatron_args.sh", "\n".join(lines) + "\n", tuple(notes))
