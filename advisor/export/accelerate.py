"""accelerate: a ClusterConfig YAML for `accelerate launch --config_file` (accelerate 1.15).

DDP -> MULTI_GPU; ZeRO-1 -> the DeepSpeed plugin (FSDP has no optimizer-only sharding); ZeRO-2/3 and
HSDP -> FSDP1 (SHARD_GRAD_OP, FULL_SHARD, HYBRID_SHARD). Tensor and pipeline parallelism are refused:
accelerate expresses them only through its Megatron-LM plugin, which needs the Megatron-LM repository.
The notes (what the script must do itself) are written into the YAML as comments.
"""

from __future__ import annotations

from typing import Any, Optional

from advisor.export.common import (
    RDZV_PORT,
    Exported,
    ExportError,
    Plan,
    Precision,
    TrainingSetup,
    check,
    commented_yaml,
    gradient_clip,
    header,
    hf_recompute_note,
    node_layout,
)
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.stack import Stack

ACCELERATE_PRECISION = {Precision.fp32: "no", Precision.bf16_mixed: "bf16", Precision.fp16_mixed: "fp16",
                        Precision.bf16: "no"}


# The DeepSpeed plugin cannot say "no clipping": `accelerate launch` exports the YAML's gradient_clipping as
# ACCELERATE_GRADIENT_CLIPPING (accelerate 1.15 utils/launch.py:571-572), DeepSpeedPlugin writes it into the ds config
# only where truthy (utils/dataclasses.py:1233-1235, 1321-1322), and DeepSpeedConfig's default is 1.0 (deepspeed 0.19.8
# runtime/constants.py:203, config.py:269): 0.0 clips at 1.0. Its ds_config.json says 0.0 itself
NO_CLIP_PLUGIN = ("the plan was costed without gradient clipping, which accelerate's DeepSpeed plugin (ZeRO-1) cannot "
                  "write (gradient_clipping 0 leaves the key out and DeepSpeed then clips at its default 1.0; a "
                  "ds_config.json says 0.0)")


# accelerate 1.15's fp8_config backends (utils/dataclasses.py): TERecipeKwargs (Transformer Engine's DelayedScaling,
# fp8_format HYBRID; MXFP8BlockScaling where use_mxfp8_block_scaling, :406, 435-436 and utils/transformer_engine.py:165-177)
# and AORecipeKwargs (torchao Float8LinearConfig(), i.e. tensorwise). `accelerate launch` turns each fp8_config key
# into ACCELERATE_FP8_<KEY> (commands/launch.py:1272-1277, utils/launch.py:82-97), which the recipe kwargs read
ACCELERATE_FP8 = {"fp8-delayed": {"backend": "TE", "fp8_format": "HYBRID"}, "fp8-tensorwise": {"backend": "AO"},
                  "mxfp8": {"backend": "TE", "use_mxfp8_block_scaling": True}}


def accelerate_dict(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                    world_size: int, stack: Optional[Stack] = None) -> tuple[dict[str, Any], list[str]]:
    """accelerate ClusterConfig keys: DDP -> MULTI_GPU, ZeRO-1 -> DeepSpeed plugin, ZeRO-2/3 -> FSDP; ``stack``: the one
    the plan was costed in, whose clipping it writes (none given: GRADIENT_CLIP)."""
    if plan.tp > 1 or plan.pp > 1:
        raise ExportError(f"accelerate cannot express tp={plan.tp} x pp={plan.pp} without its Megatron-LM plugin "
                          "(which needs the Megatron-LM repo)", instead="megatron")
    lay, notes = node_layout(hw, world_size), []
    recipe = setup.precision.recipe
    if recipe is not None and recipe.name not in ACCELERATE_FP8:
        raise ExportError(f"--precision {recipe.name}: accelerate's fp8_config runs Transformer Engine's delayed "
                          "scaling or MXFP8 or torchao's tensorwise float8 only: use fp8-delayed, mxfp8 or "
                          "fp8-tensorwise, or --format megatron")
    cfg: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False,
                           "mixed_precision": "fp8" if recipe is not None else ACCELERATE_PRECISION[setup.precision]}
    if setup.precision is Precision.bf16 and plan.zero == 1:  # DeepSpeed plugin: bf16 with fp32 master weights
        cfg["mixed_precision"] = "bf16"
        notes.append("pure bf16 through accelerate's DeepSpeed plugin keeps fp32 master weights: "
                     "more memory than the advisor's estimate (the DeepSpeed export can drop them)")
    elif setup.precision is Precision.bf16:
        notes.append("pure bf16: mixed_precision is 'no'; cast the model with model.to(torch.bfloat16) "
                     "before accelerator.prepare")
    if setup.precision.autocast and plan.zero == 0 and not setup.finetune.adapters:
        # transformers 5.23 from_pretrained takes dtype "auto" where none is given (modeling_utils.py:4177-4178): a bf16
        # checkpoint loads in bf16, and DDP under autocast would train it in pure bf16, not the fp32 weights costed
        notes.append("load the model with from_pretrained(..., dtype=torch.float32): transformers 5 loads a checkpoint "
                     "in its config's dtype by default (bf16 for Llama 3, Qwen3, Mistral), and DDP under "
                     f"{setup.precision.value} would then train pure bf16 (--precision bf16 costs that)")
    if recipe is not None:
        cfg["fp8_config"] = dict(ACCELERATE_FP8[recipe.name])
    cfg.update(_distributed(plan, setup, grad_accum, world_size, notes, gradient_clip(stack)))
    if setup.compile != "none":  # accelerate's TorchDynamoPlugin compiles the prepared model whole, its loss inside
        if setup.compile != "model,loss":
            raise ExportError(f"--compile {setup.compile}: accelerate compiles the whole model, its loss inside "
                              "(dynamo_config): export --compile model,loss")
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR", "dynamo_mode": "default", "dynamo_use_fullgraph": False,
                                "dynamo_use_dynamic": False}
    recompute = hf_recompute_note(setup)  # under FSDP its fsdp_activation_checkpointing sets full recomputation
    if recompute is not None and not (setup.recompute == "full" and cfg["distributed_type"] == "FSDP"):
        notes.append(recompute)
    cfg.update({"num_machines": lay.nnodes, "num_processes": world_size, "machine_rank": 0,
                "main_training_function": "main", "rdzv_backend": "static" if lay.nnodes == 1 else "c10d",
                "same_network": True, "use_cpu": False})
    if lay.nnodes > 1:
        cfg.update({"main_process_ip": "MASTER_ADDR", "main_process_port": RDZV_PORT})
    return cfg, notes


def _distributed(plan: Plan, setup: TrainingSetup, grad_accum: int, world_size: int,
                 notes: list[str], clip: float) -> dict[str, Any]:
    """distributed_type and its plugin's keys: NO, MULTI_GPU, DEEPSPEED (ZeRO-1) or FSDP (ZeRO-2/3, HSDP). ``clip``:
    the costed threshold, 0.0 for none: DeepSpeed's plugin takes it from the YAML, the others from the script."""
    if not clip and plan.zero == 1:
        raise ExportError(NO_CLIP_PLUGIN, instead="deepspeed")
    if not clip:  # DDP and FSDP clip in the script: the Trainer's accelerator.clip_grad_norm_ (trainer.py:1930-1931)
        notes.append("no gradient clipping, as costed: pass --max_grad_norm 0 to the Trainer (its default 1.0, "
                     "transformers training_args.py:866, clips every step), or call no clip_grad_norm_ in the script")
    if world_size == 1 and plan.zero == 0:
        return {"distributed_type": "NO"}
    if plan.offload.value not in ("none", "params-cpu") or (plan.offload.value == "params-cpu" and plan.zero != 3):
        raise ExportError(f"accelerate's FSDP offloads parameters to the CPU only (fsdp_offload_params), not "
                          f"{plan.offload.value}: use --format deepspeed")
    if plan.zero == 0:
        return {"distributed_type": "MULTI_GPU"}
    if plan.zero == 1:
        notes.append("FSDP has no ZeRO-1 (optimizer-only) sharding: ZeRO-1 goes through accelerate's DeepSpeed plugin")
        return {"distributed_type": "DEEPSPEED",
                "deepspeed_config": {"zero_stage": 1, "gradient_accumulation_steps": grad_accum,
                                     "gradient_clipping": clip, "offload_optimizer_device": "none",
                                     "offload_param_device": "none", "zero3_init_flag": False,
                                     "deepspeed_multinode_launcher": "standard"}}
    strategy = "HYBRID_SHARD" if plan.hybrid_shard else {3: "FULL_SHARD", 2: "SHARD_GRAD_OP"}[plan.zero]
    # accelerate 1.15's launcher always exports FSDP_SHARDING_STRATEGY (default FULL_SHARD) and FSDP1 reads it
    # before fsdp_reshard_after_forward, so the strategy must be given under both keys.
    return {"distributed_type": "FSDP",
            "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": strategy,
                            "fsdp_reshard_after_forward": strategy,
                            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                            # FSDP's CPUOffload(offload_params=True): parameters, gradients and the optimizer step on
                            # the CPU (the advisor's params-cpu)
                            "fsdp_offload_params": plan.offload.value == "params-cpu",
                            "fsdp_backward_prefetch": "BACKWARD_PRE", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                            "fsdp_use_orig_params": True, "fsdp_sync_module_states": True,
                            "fsdp_cpu_ram_efficient_loading": True,
                            "fsdp_activation_checkpointing": setup.recompute == "full"}}


def accelerate_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                      world_size: int, stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = accelerate_dict(model, hw, plan, setup, grad_accum, world_size, stack)
    lay = node_layout(hw, world_size)
    launch = "accelerate launch --config_file accelerate_config.yaml"
    if lay.nnodes > 1:
        launch += f" --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port {RDZV_PORT}"
    head = [f"# {header(model, hw, plan, setup, grad_accum, world_size)}",
            f"# launch: {launch} train.py"]
    if lay.nnodes > 1:
        head.append("# machine_rank and main_process_ip are placeholders: the command-line flags above override them")
    head.append(f"# the script's dataloader batch size per process = micro_batch = {setup.micro_batch}; "
                f"Accelerator(gradient_accumulation_steps={grad_accum})")
    return commented_yaml("accelerate_config.yaml", head, cfg, notes)
