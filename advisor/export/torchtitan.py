"""torchtitan: a bash script running ``torchtitan.train`` with its own arguments (torchtitan 0.3.0).

torchtitan 0.3.0 reads no TOML job file any more: a run is a config function of a model's registry
(``--module llama3 --config llama3_8b``, models/*/config_registry.py) plus ``--<section>.<key>`` overrides, parsed by
tyro in torchtitan/config/manager.py (ConfigManager.parse_args), with activation checkpointing chosen by a subcommand
(``activation-checkpoint:none|full|selective|memory-budget``). So the export is that argument list, one
override per line, in a script; tests/test_export_stacks.py parses it with ConfigManager itself.

Every key comes from one row of KEYS (the format's key, a function of the run giving its value or None: not
written); a plan or setup field added later is one row. Refused: models torchtitan has no config function for,
fp16 (TrainingConfig's dtypes are bfloat16 and float32) and the FP8 / MXFP8 / NVFP4 recipes (model converters of a
config function, not overrides), ZeRO-1 without a pipeline (FSDP2 has no optimizer-only sharding; under a pipeline
schedule FSDP runs as ZeRO-1), nn.DataParallel.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from advisor.export.common import Exported, ExportError, Precision, Run, argv_lines, catalogued, check, header
from advisor.export.torchrun import torchrun_argv
from advisor.layout import PipelineSplit, Schedule
from advisor.stack import Stack, load_stack

# advisor model -> (torchtitan module, config function): the dense and MoE configs of torchtitan 0.3.0's registries
# (torchtitan/models/{llama3,qwen3,gpt_oss,deepseek_v3}/config_registry.py) whose shapes are the catalogue's
CONFIGS = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
           "llama3-405b": ("llama3", "llama3_405b"), "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
           "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b")}
# The config functions whose converters run a low-precision recipe (0.3.0 models/llama3/config_registry.py): a base
# config function's own (llama3_405b: Float8LinearConverter, rowwise, lm_head filtered), and the recipe variants
OWN_RECIPE = {"llama3-405b": "fp8-rowwise"}
RECIPE_CONFIGS = {("llama3-8b", "mxfp8"): "llama3_8b_mxfp8", ("llama3-8b", "nvfp4"): "llama3_8b_first_85_pct_layers_nvfp4"}
# Schedule names of torch.distributed.pipelining (schedules.py get_schedule_class), as torchtitan passes them on
SCHEDULES = {Schedule.gpipe: "GPipe", Schedule.one_f_one_b: "1F1B", Schedule.interleaved: "Interleaved1F1B",
             Schedule.zb_v: "ZBVZeroBubble", Schedule.dualpipe_v: "DualPipeV"}  # torch 2.13 get_schedule_class names
OPTIMIZER = {"adamw": "foreach", "adamw-fused": "fused"}
# CUDA graphs: off. The profile costs the host launching every aten op (kernels.host, mid-2024 torchtitan);
# 0.3.0 captures forward + backward in a CUDA graph unless training.disable_cuda_graphs (trainer.py:613), and
# refuses the capture under pipeline parallelism (trainer.py:180-186)
CUDA_GRAPHS = False
# the stack profile of the torchtitan this format runs (0.3.0)
STACK = "torchtitan"
# run_train.sh exports it (stack_profiles/torchtitan.yaml engine.allocator); torchrun alone would not
ALLOC_CONF = "expandable_segments:True"


def _pp(r: Run, value: Any) -> Any:
    return value if r.plan.pp > 1 else None


def _local_batch(r: Run) -> int:
    """Sequences per DP rank per step: with PP the pipeline splits them into micro-batches; without, a step
    accumulates global / (local x dp) of them (torchtitan/trainer.py gradient_accumulation_steps)."""
    return r.setup.micro_batch * r.grad_accum if r.plan.pp > 1 else r.setup.micro_batch


def _edges(r: Run) -> int:
    """1 where the plan counts the embedding and the output as a layer each (pp_split edges), else 0: torchtitan's
    pipeline_parallel_first/last_stage_less_layers (generate_llm_fqn_per_model_part's input and output weights)."""
    return 1 if r.plan.pp_split is PipelineSplit.edges else 0


# the schedules that run one stage a rank (torch.distributed.pipelining PipelineScheduleSingle); the others two or more
SINGLE_STAGE = (Schedule.gpipe, Schedule.one_f_one_b)


def _layers_per_stage(r: Run) -> Optional[int]:
    """Layers a stage holds, where the plan's stages a rank are not torchtitan's default for its schedule (1 for a
    single-stage schedule, else 2: pipeline_parallel.py), which spreads the units over pp x that many stages, the first
    ones a layer more where they do not divide, as advisor's busiest rank holds ceil(L / (pp v)) a chunk. Given a value,
    torchtitan makes ceil((L + weights) / it) stages: refused where no value gives pp x v."""
    if r.plan.pp == 1 or r.axes.virtual_stages == (1 if r.plan.schedule in SINGLE_STAGE else 2):
        return None
    stages, units = r.plan.pp * r.axes.virtual_stages, r.model.n_layers + 2 * _edges(r)
    per = -(-units // stages)
    if -(-units // per) != stages:
        also = " + the embedding and the output" if _edges(r) else ""
        raise ExportError(f"{units} pipeline units ({r.model.n_layers} layers{also}) make no {stages} torchtitan stages "
                          "of equal size but one: choose another --pp or --virtual-stages")
    return per


def _async_tp(r: Run) -> bool:
    """The plan's sequence-parallel collectives pipelined by async TP (its stack runs none by default)."""
    return r.setup.tp_overlap == "async" and r.plan.tp > 1 and bool(r.plan.sp)


def config_function(r: Run) -> tuple[str, str]:
    """(module, config function) of the run: the model's own, or its variant whose converters run the plan's recipe."""
    module, config = CONFIGS[r.model.name]
    want = r.setup.precision.value if r.setup.precision.recipe is not None else None
    return module, (config if want == OWN_RECIPE.get(r.model.name) else RECIPE_CONFIGS[(r.model.name, want)])


def _converts(r: Run) -> bool:
    """Whether the config function converts linears to a recipe (it turns compile on for them, and so stays)."""
    return r.setup.precision.recipe is not None


def _param_dtype(r: Run) -> str:
    return "float32" if r.setup.precision is Precision.fp32 else "bfloat16"


# (key, value of the run or None: not written), the keys torchtitan 0.2's job file and 0.3.0's overrides share (0.2.2
# config/job_config.py, 0.3.0 config/configs.py: the same section and field names). Flags with a bool value are written
# --key / --section.no-key here, true / false in 0.2's TOML (advisor.export.torchtitan_toml).
SHARED_KEYS: list[tuple[str, Callable[[Run], Any]]] = [
    ("parallelism.data_parallel_replicate_degree", lambda r: r.axes.dp_replicate),
    ("parallelism.data_parallel_shard_degree", lambda r: r.axes.dp_shard),
    # ZeRO-2: FSDP2 keeps the gathered parameters from forward to backward (reshard_after_forward=False)
    ("parallelism.fsdp_reshard_after_forward", lambda r: "never" if r.plan.zero == 2 else None),
    ("parallelism.tensor_parallel_degree", lambda r: r.plan.tp),
    ("parallelism.context_parallel_degree", lambda r: r.field("cp", 1) if r.field("cp", 1) > 1 else None),
    # written for every MoE model: the config functions set their own (deepseek_v3_671b: 2; ParallelismConfig: 1)
    ("parallelism.expert_parallel_degree", lambda r: r.plan.ep if r.model.routed else None),
    ("parallelism.pipeline_parallel_degree", lambda r: r.plan.pp),
    ("parallelism.pipeline_parallel_schedule", lambda r: _pp(r, SCHEDULES[r.plan.schedule])),
    ("parallelism.pipeline_parallel_microbatch_size", lambda r: _pp(r, r.setup.micro_batch)),
    # the even split leaves the embedding and the output head out of the count; edges counts them a layer each
    ("parallelism.pipeline_parallel_layers_per_stage", _layers_per_stage),
    ("parallelism.pipeline_parallel_first_stage_less_layers", lambda r: _pp(r, _edges(r))),
    ("parallelism.pipeline_parallel_last_stage_less_layers", lambda r: _pp(r, _edges(r))),
    ("training.local_batch_size", _local_batch),
    ("training.global_batch_size", lambda r: r.setup.micro_batch * r.grad_accum * r.plan.dp),
    ("training.seq_len", lambda r: r.setup.seq_len),
    # pure bf16: bf16 parameters and optimizer states (TrainingConfig.dtype); mixed: fp32 parameters sharded,
    # gathered in bf16, gradients reduced in fp32 (FSDP2 MixedPrecisionPolicy, parallelism/fsdp.py)
    ("training.dtype", lambda r: "bfloat16" if r.setup.precision is Precision.bf16 else "float32"),
    ("training.mixed_precision_param", _param_dtype),
    ("training.mixed_precision_reduce", lambda r: "float32"),
    # AdamW as costed: advisor's adamw is torch's default foreach kernel, adamw-fused the fused one (torchtitan's
    # default implementation is fused: 0.2.2 job_config.py Optimizer, 0.3.0 OptimizersContainer.Config)
    ("optimizer.implementation", lambda r: OPTIMIZER[r.setup.optimizer.value]),
]
KEYS: list[tuple[str, Callable[[Run], Any]]] = SHARED_KEYS + [
    ("parallelism.enable_sequence_parallel", lambda r: bool(r.plan.sp) if r.plan.tp > 1 else None),
    ("training.disable_cuda_graphs", lambda r: not CUDA_GRAPHS),
    # torch.compile as costed (--compile: the profile's compiled tables), written whatever the config function sets
    # (the recipes' turn it on); async TP needs it with "model" (0.3.0 config/configs.py CompileConfig.__post_init__),
    # which advisor.workload asks of the plan
    ("compile.enable", lambda r: r.setup.compile != "none"),
    # a comma-separated list, as ConfigManager reads list options ("model loss" leaves "loss" unrecognised)
    ("compile.components", lambda r: r.setup.compile if r.setup.compile != "none" else None),
    # always written: llama3_405b turns it on
    ("compile.enable_async_tensor_parallel", _async_tp),
]
RECOMPUTE = {"none": "activation-checkpoint:none", "full": "activation-checkpoint:full",
             "selective": "activation-checkpoint:selective"}  # selective = torchtitan's per-op SAC (SelectiveAC)


def refuse_common(r: Run, release: str, recompute: tuple[str, ...]) -> None:
    """What neither torchtitan release runs (fp16, ZeRO-1 outside a pipeline, SGD) or ``release`` does not checkpoint."""
    if r.setup.precision is Precision.fp16_mixed:
        raise ExportError(f"torchtitan has no {r.setup.precision.value} setting (its dtypes are bfloat16 and float32; "
                          "float8 is a model converter): use --precision bf16-mixed or a recipe")
    if r.plan.zero == 1 and r.plan.pp == 1:
        raise ExportError("FSDP2 has no ZeRO-1 (optimizer-only) sharding outside a pipeline: use --zero 2 or 3")
    if r.setup.recompute.value not in recompute:
        raise ExportError(f"--recompute {r.setup.recompute.value}: torchtitan {release} checkpoints "
                          f"{' | '.join(recompute)}: use --recompute full or selective")
    if r.setup.optimizer.value not in OPTIMIZER:
        raise ExportError(f"torchtitan trains AdamW, not {r.setup.optimizer.value}: use --optimizer adamw or adamw-fused")


def shared_notes(r: Run) -> list[str]:
    """What both torchtitan formats say of a run: SDPA where eager attention was costed, and what ZeRO-1 is there."""
    out = []
    if r.setup.attention.value != "sdpa":
        out.append(f"{r.setup.attention.value} attention was costed; torchtitan runs SDPA: memory will be lower")
    if r.plan.zero == 1:
        out.append("ZeRO-1 is FSDP2 under the pipeline schedule: parameters and gradients stay unsharded from the "
                   "first micro-batch to the last, reduce-scattered once a step")
    return out


def _refuse(r: Run) -> None:
    if r.model.name not in CONFIGS:
        raise ExportError(f"torchtitan 0.3.0 has no config function for {r.model.name}: its registries cover "
                          f"{', '.join(CONFIGS)}")
    refuse_common(r, "0.3.0", tuple(RECOMPUTE))
    if r.setup.finetune.adapters:  # a script without the converter would train every weight: another plan
        raise ExportError(f"--method {r.setup.finetune.method}: torchtitan 0.3.0 trains LoRA through a config function's "
                          "LoRAConverter (components/lora.py), which no override reaches, and only a debug model's config "
                          f"function sets one: add LoRAConverter.Config to {CONFIGS[r.model.name][1]}'s converters, or "
                          "export --method full")
    p = r.setup.precision.value if r.setup.precision.recipe is not None else None
    if p == OWN_RECIPE.get(r.model.name) or (r.model.name, p) in RECIPE_CONFIGS:
        return
    if p is None:  # the model's config function converts: a bf16 plan would run another
        raise ExportError(f"torchtitan 0.3.0's {CONFIGS[r.model.name][1]} trains {OWN_RECIPE[r.model.name]} (its "
                          f"converter): export --precision {OWN_RECIPE[r.model.name]}, or cost the plan in --stack "
                          "torchtitan-0.2 (--format torchtitan-toml)")
    # a script without the converter would train in bf16: another plan
    have = ", ".join([f"{c} ({v})" for (_, v), c in RECIPE_CONFIGS.items()]
                     + [f"{CONFIGS[m][1]} ({v})" for m, v in OWN_RECIPE.items()])
    raise ExportError(f"torchtitan 0.3.0 has no config function for {r.model.name} that runs {p} (a recipe is a config "
                      f"function's converter, which no override reaches; it has {have}): export --precision bf16-mixed, or "
                      "cost the plan in --stack torchtitan-0.2 (--format torchtitan-toml)")


def torchtitan_args(r: Run, stack: Optional[Stack] = None) -> tuple[list[str], list[str]]:
    """torchtitan.train's arguments (module, config, overrides; the activation-checkpoint subcommand follows them:
    RECOMPUTE) and notes, for a plan costed in ``stack`` (default: torchtitan 0.3.0's profile)."""
    _refuse(r)
    module, config = config_function(r)
    args, notes = ["--module", module, "--config", config], []
    for key, value_of in KEYS:
        value = value_of(r)
        if value is None:
            continue
        section, name = key.split(".")
        flag = f"--{section}.{name.replace('_', '-')}"
        if isinstance(value, bool):
            args.append(flag if value else f"--{section}.no-{name.replace('_', '-')}")
        else:
            args += [flag, str(value)]
    notes += shared_notes(r)
    if _converts(r) and r.setup.compile == "none":
        notes.append(f"{config} converts the linears to {r.setup.precision.value} and turns torch.compile on; the plan "
                     "was costed eager, as written here (--compile.no-enable): add --compile model,loss to cost and "
                     "export the compiled run")
    if (r.model.name, r.setup.precision.value) == ("llama3-8b", "mxfp8"):
        notes.append("llama3_8b_mxfp8's converter takes every Linear (MXFP8LinearConverter with no fqns), the output "
                     "layer too, which advisor costs in BF16")
    if r.plan.pp > 1:
        notes.append("the embedding and the output head count as a layer each of the first and last stage, as costed"
                     if _edges(r) else "pipeline stages hold n_layers / stages layers each (the first ones a layer more "
                     "where they do not divide); the embedding and the output head sit on the first and last stage "
                     "beside them")
    if stack is not None and stack.memory.logits != load_stack(STACK).memory.logits:
        notes.append(f"costed as stack {stack.name}, whose loss differs from torchtitan 0.3.0's (the loss in sequence "
                     "chunks), which this command runs: its peak memory will be lower than estimated")
    if r.plan.pp == 1:  # under PP 0.3.0 requires the flag (trainer.py:183-187): nothing to choose, nothing to note
        notes.append("CUDA graphs off (--training.disable-cuda-graphs), as costed: the host launches every kernel; "
                     "dropping that line may run faster than estimated")
    if r.plan.ep > 1:
        notes.append(f"expert parallelism {r.plan.ep} borrows its ranks from FSDP and TP (efsdp = dp_shard x cp x tp / "
                     "ep); tokens travel by the standard all-to-all dispatcher, as costed")
    if r.plan.zero == 2:
        notes.append("ZeRO-2 is FSDP2 with fsdp_reshard_after_forward=never: parameters stay gathered from "
                     "forward to backward")
    return args, notes


def torchtitan_config(model, hw, plan, setup, grad_accum: int, world_size: int, stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    twin, said = catalogued(model, CONFIGS)
    run = Run(twin, hw, plan, setup, grad_accum, world_size)
    args, notes = torchtitan_args(run, stack)
    notes = said + notes
    lines = ["#!/bin/bash", f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
             "# torchtitan 0.3.0: a config function of the model's registry plus overrides (torchtitan/config/"
             "manager.py);", "# data, tokenizer (--hf-assets-path), optimizer and checkpoint options are yours.",
             "# the allocator torchtitan's own launcher (run_train.sh) sets, which the memory estimate assumes",
             f"export PYTORCH_ALLOC_CONF={ALLOC_CONF}", "TORCHTITAN_ARGS=(", *argv_lines(args)]
    launch = torchrun_argv(hw, world_size, "-m")
    # the activation-checkpoint subcommand comes last: tyro reads the options before it
    lines += [")", " ".join(launch) + f' torchtitan.train "${{TORCHTITAN_ARGS[@]}}" "$@" {RECOMPUTE[setup.recompute.value]}']
    lines += [f"# note: {n}" for n in notes]
    return Exported("torchtitan_train.sh", "\n".join(lines) + "\n", tuple(notes))
