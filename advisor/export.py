"""Export a chosen plan as a launch configuration: accelerate YAML, DeepSpeed JSON, Megatron-LM arguments, torchrun.

Each exporter is a pure function of the three inputs (model, hardware, plan + training setup) and the
resolved ``grad_accum`` / ``world_size``; it returns an ``Exported`` (file name, text, notes). What a
format cannot express is refused with one ``ExportError`` line rather than approximated silently;
where the mapping is close but not exact, the difference is said in ``notes``.

Names follow the libraries as checked on CPU (tests/test_export.py loads every export with the
library's own parser): accelerate 1.15 (ClusterConfig, FSDP1 ``fsdp_reshard_after_forward``),
DeepSpeed 0.19 (DeepSpeedConfig), megatron-core 0.16 (TransformerConfig, DistributedDataParallelConfig,
OptimizerConfig) with Megatron-LM's ``megatron/training/arguments.py`` flag spelling, torch 2.x
``torch.distributed.run``.

Deliberately left out: optimizer / learning-rate settings, data paths, checkpointing, CPU offload.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from advisor.errors import AdvisorError
from advisor.hardware import Hardware
from advisor.model import MLPKind, ModelSpec, NormKind, PositionKind
from advisor.constraints import plan_errors
from advisor.layout import Plan, resolve_grad_accum
from advisor.training import Precision, TrainingSetup

KINDS = ("accelerate", "deepspeed", "megatron", "torchrun")
RDZV_PORT = 29500  # torchrun / accelerate default rendezvous port
GRADIENT_CLIP = 1.0  # Megatron-LM's --clip-grad default; written into DeepSpeed too so both clip alike


class ExportError(AdvisorError):
    """A plan the requested launcher cannot express; one line naming what to change."""


@dataclass(frozen=True)
class Exported:
    filename: str
    text: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Layout:
    """How many nodes the world spans and processes per node (torchrun needs the same count on each)."""

    nnodes: int
    nproc_per_node: int


def node_layout(hw: Hardware, world_size: int) -> Layout:
    g = hw.gpus_per_node
    if world_size <= g:
        return Layout(1, world_size)
    if world_size % g:
        raise ExportError(f"world size {world_size} is not a multiple of {g} GPUs per node ({hw.name}): "
                          "launchers start the same number of processes on every node")
    return Layout(world_size // g, g)


def _check(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
           world_size: int) -> None:
    """Refuse plans no launcher should be given: invalid ones, and nn.DataParallel (single process)."""
    if plan.data_parallel == "dp" and plan.dp > 1:
        raise ExportError("nn.DataParallel runs in one process: there is no launcher config; "
                          "run `python train.py` or export the DDP plan (--data-parallel ddp)")
    errors = plan_errors(plan, setup, model, hw, world_size)
    if errors:
        raise ExportError(f"plan {plan.label()} is invalid: {errors[0]}")
    resolved, _ = resolve_grad_accum(setup, plan)
    if (setup.grad_accum is not None or setup.global_batch is not None) and resolved != grad_accum:
        raise ExportError(f"grad_accum={grad_accum} disagrees with the setup's batch ({resolved})")
    node_layout(hw, world_size)


def global_batch(plan: Plan, setup: TrainingSetup, grad_accum: int) -> int:
    """Sequences per optimizer step: micro_batch x grad_accum x dp (Megatron / DeepSpeed identity)."""
    return setup.micro_batch * grad_accum * plan.dp


def _header(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
            world_size: int) -> str:
    return (f"advisor export: {model.name}, {plan.label()} on {world_size} GPUs ({hw.name}); "
            f"micro_batch={setup.micro_batch} grad_accum={grad_accum} "
            f"global_batch={global_batch(plan, setup, grad_accum)} seq_len={setup.seq_len} "
            f"precision={setup.precision.value} recompute={setup.recompute}")


# -- torchrun ------------------------------------------------------------------------------------
def torchrun_argv(hw: Hardware, world_size: int, script: str = "train.py") -> list[str]:
    """torchrun arguments; multi-node uses c10d rendezvous on node 0 ($MASTER_ADDR), shared $JOB_ID."""
    lay = node_layout(hw, world_size)
    argv = ["torchrun", "--nnodes", str(lay.nnodes), "--nproc-per-node", str(lay.nproc_per_node)]
    if lay.nnodes == 1:
        argv.append("--standalone")
    else:
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"$MASTER_ADDR:{RDZV_PORT}", "--rdzv-id", "$JOB_ID"]
    return argv + [script]


def torchrun_command(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                     world_size: int) -> Exported:
    _check(model, hw, plan, setup, grad_accum, world_size)
    lay = node_layout(hw, world_size)
    where = ("one node" if lay.nnodes == 1 else
             f"each of the {lay.nnodes} nodes; MASTER_ADDR = node 0's address, JOB_ID = any id shared by the nodes")
    line = " ".join(a if a.startswith("$") else shlex.quote(a) for a in torchrun_argv(hw, world_size))
    text = f"# {_header(model, hw, plan, setup, grad_accum, world_size)}\n# run on {where}\n{line}\n"
    return Exported("torchrun.sh", text)


# -- accelerate ----------------------------------------------------------------------------------
ACCELERATE_PRECISION = {Precision.fp32: "no", Precision.bf16_mixed: "bf16", Precision.fp16_mixed: "fp16",
                        Precision.bf16: "no", Precision.fp8_mixed: "fp8"}


def accelerate_dict(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                    world_size: int) -> tuple[dict[str, Any], list[str]]:
    """accelerate ClusterConfig keys: DDP -> MULTI_GPU, ZeRO-1 -> DeepSpeed plugin, ZeRO-2/3 -> FSDP."""
    if plan.tp > 1 or plan.pp > 1:
        raise ExportError(f"accelerate cannot express tp={plan.tp} x pp={plan.pp} without its Megatron-LM plugin "
                          "(which needs the Megatron-LM repo): use --format megatron")
    lay, notes = node_layout(hw, world_size), []
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False,
                           "mixed_precision": ACCELERATE_PRECISION[setup.precision]}
    if setup.precision is Precision.bf16 and plan.zero == 1:  # DeepSpeed plugin: bf16 with fp32 master weights
        cfg["mixed_precision"] = "bf16"
        notes.append("pure bf16 through accelerate's DeepSpeed plugin keeps fp32 master weights: "
                     "more memory than the advisor's estimate (the DeepSpeed export can drop them)")
    elif setup.precision is Precision.bf16:
        notes.append("pure bf16: mixed_precision is 'no'; cast the model with model.to(torch.bfloat16) "
                     "before accelerator.prepare")
    if setup.precision is Precision.fp8_mixed:
        cfg["fp8_config"] = {"backend": "TE", "fp8_format": "HYBRID"}
    if world_size == 1 and plan.zero == 0:
        cfg["distributed_type"] = "NO"
    elif plan.zero == 0:
        cfg["distributed_type"] = "MULTI_GPU"
    elif plan.zero == 1:
        notes.append("FSDP has no ZeRO-1 (optimizer-only) sharding: ZeRO-1 goes through accelerate's DeepSpeed plugin")
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"zero_stage": 1, "gradient_accumulation_steps": grad_accum,
                                   "gradient_clipping": GRADIENT_CLIP, "offload_optimizer_device": "none",
                                   "offload_param_device": "none", "zero3_init_flag": False,
                                   "deepspeed_multinode_launcher": "standard"}
    else:
        strategy = "HYBRID_SHARD" if plan.hybrid_shard else {3: "FULL_SHARD", 2: "SHARD_GRAD_OP"}[plan.zero]
        cfg["distributed_type"] = "FSDP"
        # accelerate 1.15's launcher always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and FSDP1 reads it
        # before fsdp_reshard_after_forward, so the strategy must be given under both keys.
        cfg["fsdp_config"] = {"fsdp_version": 1, "fsdp_sharding_strategy": strategy,
                              "fsdp_reshard_after_forward": strategy,
                              "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_offload_params": False,
                              "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                              "fsdp_use_orig_params": True, "fsdp_sync_module_states": True,
                              "fsdp_cpu_ram_efficient_loading": True,
                              "fsdp_activation_checkpointing": setup.recompute == "full"}
    if setup.recompute == "selective":
        notes.append("selective recompute is chosen in the model code (checkpoint the attention core); "
                     "accelerate has no switch for it")
    if setup.recompute == "full" and cfg["distributed_type"] != "FSDP":
        notes.append("full recompute: call model.gradient_checkpointing_enable() (Hugging Face) in the script")
    cfg.update({"num_machines": lay.nnodes, "num_processes": world_size, "machine_rank": 0,
                "main_training_function": "main", "rdzv_backend": "static" if lay.nnodes == 1 else "c10d",
                "same_network": True, "use_cpu": False})
    if lay.nnodes > 1:
        cfg.update({"main_process_ip": "MASTER_ADDR", "main_process_port": RDZV_PORT})
    return cfg, notes


def accelerate_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                      world_size: int) -> Exported:
    _check(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = accelerate_dict(model, hw, plan, setup, grad_accum, world_size)
    lay = node_layout(hw, world_size)
    launch = "accelerate launch --config_file accelerate_config.yaml"
    if lay.nnodes > 1:
        launch += f" --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port {RDZV_PORT}"
    head = [f"# {_header(model, hw, plan, setup, grad_accum, world_size)}",
            f"# launch: {launch} train.py"]
    if lay.nnodes > 1:
        head.append("# machine_rank and main_process_ip are placeholders: the command-line flags above override them")
    head.append(f"# the script's dataloader batch size per process = micro_batch = {setup.micro_batch}; "
                f"Accelerator(gradient_accumulation_steps={grad_accum})")
    body = yaml.safe_dump(cfg, sort_keys=False, width=100)
    return Exported("accelerate_config.yaml", "\n".join(head) + "\n" + body, tuple(notes))


# -- DeepSpeed -----------------------------------------------------------------------------------
FP16_DYNAMIC = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                "hysteresis": 2, "min_loss_scale": 1}  # loss_scale 0 = dynamic (DeepSpeed config docs)


def deepspeed_dict(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                   world_size: int) -> tuple[dict[str, Any], list[str]]:
    """ds_config: train_batch_size = micro x grad_accum x dp (DeepSpeedConfig asserts this identity)."""
    notes = []
    zero: dict[str, Any] = {"stage": plan.zero}
    if plan.zero >= 1:
        zero["overlap_comm"] = bool(plan.overlap_grad_reduce)
        zero["contiguous_gradients"] = True
    if plan.hybrid_shard:
        zero["zero_hpz_partition_size"] = hw.gpus_per_node
        notes.append("DeepSpeed has no HYBRID_SHARD (MiCS was removed in 0.19): ZeRO++ hpZ keeps a node-local "
                     "secondary parameter shard, so memory differs from the advisor's HSDP estimate")
    cfg: dict[str, Any] = {
        "train_batch_size": global_batch(plan, setup, grad_accum),
        "train_micro_batch_size_per_gpu": setup.micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": GRADIENT_CLIP,
        "zero_optimization": zero,
    }
    p = setup.precision
    if p is Precision.fp16_mixed:
        cfg["fp16"] = dict(FP16_DYNAMIC)
    elif p in (Precision.bf16_mixed, Precision.fp8_mixed):
        cfg["bf16"] = {"enabled": True}
    elif p is Precision.bf16:
        cfg["bf16"] = {"enabled": True}
        if plan.zero >= 1:
            cfg["bf16"].update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
        else:
            notes.append("pure bf16 without ZeRO: DeepSpeed keeps fp32 master weights (its bf16 master option needs ZeRO>=1)")
    if p is Precision.fp8_mixed:
        notes.append("fp8: the JSON enables bf16; FP8 GEMMs come from Transformer Engine layers in the model")
    if setup.recompute != "none":
        cfg["activation_checkpointing"] = {"partition_activations": bool(plan.sp and plan.tp > 1),
                                           "contiguous_memory_optimization": False, "cpu_checkpointing": False,
                                           "synchronize_checkpoint_boundary": False, "profile": False}
        notes.append(f"{setup.recompute} recompute: the model must call deepspeed.checkpointing.checkpoint "
                     + ("per layer" if setup.recompute == "full" else "around the attention core"))
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        notes.append(f"tp={plan.tp} via DeepSpeed AutoTP training (tensor_parallel.autotp_size); "
                     "Megatron-DeepSpeed passes its own mpu instead")
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: wrap the model in deepspeed.pipe.PipelineModule(layers, num_stages={plan.pp}"
                     + (", activation_checkpoint_interval=1" if setup.recompute == "full" else "")
                     + ") and train with engine.train_batch(); DeepSpeed runs 1F1B")
        if plan.schedule == "interleaved":
            raise ExportError("DeepSpeed's pipeline engine has no interleaved schedule: use --format megatron")
    return cfg, notes


def deepspeed_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                     world_size: int) -> Exported:
    _check(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = deepspeed_dict(model, hw, plan, setup, grad_accum, world_size)
    launch = " ".join(torchrun_argv(hw, world_size)) + " --deepspeed ds_config.json"
    notes.append(f"launch: {launch} (deepspeed.initialize(config='ds_config.json'))")
    return Exported("ds_config.json", json.dumps(cfg, indent=2) + "\n", tuple(notes))


# -- Megatron-LM ---------------------------------------------------------------------------------
def megatron_args(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup,
                  grad_accum: int) -> tuple[list[str], list[str]]:
    """Megatron-LM pretrain_gpt.py flags (megatron/training/arguments.py spelling) and notes."""
    if model.position is PositionKind.alibi:
        raise ExportError(f"Megatron-LM has no ALiBi position embedding ({model.name}); "
                          "BLOOM-style models need Megatron-DeepSpeed: use --format deepspeed")
    if model.position is PositionKind.learned and setup.seq_len > model.max_positions:
        raise ExportError(f"seq_len={setup.seq_len} exceeds {model.name}'s {model.max_positions} learned positions")
    notes: list[str] = []
    a = ["--tensor-model-parallel-size", plan.tp, "--pipeline-model-parallel-size", plan.pp]
    if plan.sp and plan.tp > 1:
        a.append("--sequence-parallel")
    if plan.pp > 1 and plan.schedule == "interleaved":
        a += ["--num-layers-per-virtual-pipeline-stage", model.n_layers // (plan.pp * plan.virtual_stages)]
    if plan.pp > 1 and plan.schedule == "gpipe":
        notes.append("Megatron has no GPipe schedule: it runs 1F1B (less activation memory than estimated)")
    if setup.recompute == "full":
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    elif setup.recompute == "selective":
        a += ["--recompute-granularity", "selective"]
    a += ["--micro-batch-size", setup.micro_batch, "--global-batch-size", global_batch(plan, setup, grad_accum),
          "--seq-length", setup.seq_len, "--max-position-embeddings", max(model.max_positions, setup.seq_len),
          "--num-layers", model.n_layers, "--hidden-size", model.d_model, "--ffn-hidden-size", model.d_ff,
          "--num-attention-heads", model.n_heads]
    if model.kv_heads != model.n_heads:
        a += ["--group-query-attention", "--num-query-groups", model.kv_heads]
    if model.head_dim is not None and model.head_dim * model.n_heads != model.d_model:
        a += ["--kv-channels", model.head_dim]
    if model.mlp is MLPKind.swiglu:
        a.append("--swiglu")
    a += ["--normalization", "RMSNorm" if model.norm is NormKind.rmsnorm else "LayerNorm",
          "--position-embedding-type", "rope" if model.position is PositionKind.rotary else "learned_absolute"]
    if not model.linear_bias:
        a.append("--disable-bias-linear")
        if model.qkv_bias:
            a.append("--add-qkv-bias")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    a += _megatron_precision(setup, notes) + _megatron_data_parallel(hw, plan, notes)
    a += ["--clip-grad", GRADIENT_CLIP]
    if setup.attention.value == "eager":
        notes.append("eager attention: Megatron uses fused attention kernels; memory will be lower than estimated")
    return [str(x) for x in a], notes


def _megatron_precision(setup: TrainingSetup, notes: list[str]) -> list[str]:
    p = setup.precision
    if p is Precision.fp16_mixed:
        return ["--fp16"]  # no --loss-scale: dynamic loss scaling (Megatron's default)
    if p is Precision.fp8_mixed:
        return ["--bf16", "--fp8-format", "hybrid"]  # Transformer Engine: e4m3 forward, e5m2 gradients
    if p is Precision.bf16:
        notes.append("pure bf16: Megatron's --bf16 keeps fp32 main params; add --use-precision-aware-optimizer "
                     "--main-params-dtype bf16 ... to match the advisor's estimate")
    return ["--bf16"] if p in (Precision.bf16_mixed, Precision.bf16) else []


def _megatron_data_parallel(hw: Hardware, plan: Plan, notes: list[str]) -> list[str]:
    """ZeRO-1 = distributed optimizer; ZeRO-2/3 = Megatron-FSDP sharding strategy; HSDP = optimizer instances."""
    a: list[str] = []
    if plan.zero >= 1:
        a.append("--use-distributed-optimizer")
    if plan.zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", strategy]
        notes.append(f"ZeRO-{plan.zero} maps to Megatron-FSDP ({strategy}); it also wants --ckpt-format fsdp_dtensor")
    if plan.hybrid_shard:
        a += ["--num-distributed-optimizer-instances", str(plan.dp // hw.gpus_per_node)]
        notes.append("HSDP: Megatron-FSDP shards inside each distributed-optimizer instance (one per node) "
                     "and replicates across instances")
    if plan.overlap_grad_reduce and plan.dp > 1:
        a.append("--overlap-grad-reduce")
    return a


def megatron_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                    world_size: int) -> Exported:
    _check(model, hw, plan, setup, grad_accum, world_size)
    args, notes = megatron_args(model, hw, plan, setup, grad_accum)
    lines = ["#!/bin/bash", f"# {_header(model, hw, plan, setup, grad_accum, world_size)}",
             "# Megatron-LM arguments (megatron/training/arguments.py); data, optimizer and checkpoint flags are yours.",
             f"# vocab: the tokenizer sets it ({model.vocab} here; Megatron pads it to a multiple of 128 x tp):",
             "#   e.g. --tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH,",
             f"#   or for synthetic data --tokenizer-type NullTokenizer --vocab-size {model.vocab - 1} --mock-data"
             " (NullTokenizer adds one EOD token)",
             "MEGATRON_ARGS=("]
    i = 0
    while i < len(args):  # one flag per line, with its value when it has one
        take = 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        lines.append("    " + " ".join(shlex.quote(x) for x in args[i:i + take]))
        i += take
    lines += [")", " ".join(torchrun_argv(hw, world_size, "pretrain_gpt.py")) + ' "${MEGATRON_ARGS[@]}" "$@"']
    lines += [f"# note: {n}" for n in notes]
    return Exported("megatron_args.sh", "\n".join(lines) + "\n", tuple(notes))


# -- dispatch ------------------------------------------------------------------------------------
EXPORTERS = {"accelerate": accelerate_config, "deepspeed": deepspeed_config, "megatron": megatron_config,
             "torchrun": torchrun_command}


def export(kind: str, model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
           world_size: int) -> Exported:
    if kind not in EXPORTERS:
        raise ExportError(f"unknown export format {kind!r}: use one of {', '.join(KINDS)}")
    return EXPORTERS[kind](model, hw, plan, setup, grad_accum, world_size)


def export_config(kind: str, model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                  world_size: int) -> tuple[str, str]:
    """(suggested file name, file text) for one launcher; see ``export`` for the notes as well."""
    out = export(kind, model, hw, plan, setup, grad_accum, world_size)
    return out.filename, out.text
