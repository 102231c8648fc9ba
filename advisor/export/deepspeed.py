"""DeepSpeed: a ds_config.json read by DeepSpeedConfig (DeepSpeed 0.19), launched with torchrun.

ZeRO stages map one to one; HSDP becomes ZeRO++ hpZ (DeepSpeed 0.19 has no HYBRID_SHARD); tensor
parallelism is AutoTP training; pipeline parallelism is the model's PipelineModule (1F1B only, so the
interleaved schedule is refused). The notes are written into the JSON under "_advisor_notes".
"""

from __future__ import annotations

import json
from typing import Any, Optional

from advisor.export.common import (
    Exported,
    ExportError,
    Plan,
    Precision,
    TrainingSetup,
    check,
    global_batch,
    gradient_clip,
)
from advisor.export.torchrun import torchrun_argv
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.stack import Stack

# JSON has no comments, so the notes go under a key of their own. DeepSpeedConfig 0.19.8 reads the keys it
# knows and ignores other top-level keys without a warning (checked in tests/test_export.py); a section
# (zero_optimization, bf16, ...) forbids extra keys, so the notes stay at the top level.
NOTES_KEY = "_advisor_notes"
FP16_DYNAMIC = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                "hysteresis": 2, "min_loss_scale": 1}  # loss_scale 0 = dynamic (DeepSpeed config docs)


def deepspeed_dict(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                   world_size: int, stack: Optional[Stack] = None,
                   megatron: bool = False) -> tuple[dict[str, Any], list[str]]:
    """ds_config: train_batch_size = micro x grad_accum x dp (DeepSpeedConfig asserts this identity); ``stack``: the
    one the plan was costed in, whose clipping it writes (none given: GRADIENT_CLIP); ``megatron``: the JSON beside
    Megatron-DeepSpeed's flags, which carry the tensor and pipeline degrees and the checkpointing (_model_side's
    sections and notes are a script of one's own: advisor.export.megatron_deepspeed)."""
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
        "gradient_clipping": gradient_clip(stack),
        "zero_optimization": zero,
    }
    if not cfg["gradient_clipping"]:
        _no_clip(plan, zero, notes)
    cfg.update(_precision(plan, setup, notes))
    zero.update(_offload(plan, notes))
    if plan.offload.value != "none":
        cfg["optimizer"] = json.loads(json.dumps(OFFLOAD_OPTIMIZER))
    if not megatron:
        _model_side(plan, setup, cfg, notes)
    return cfg, notes


def _model_side(plan: Plan, setup: TrainingSetup, cfg: dict[str, Any], notes: list[str]) -> None:
    """What a training script of one's own does beside deepspeed.initialize: DeepSpeed's activation checkpointing,
    AutoTP, the PipelineModule."""
    if setup.recompute != "none":
        k = setup.recompute_layers
        cfg["activation_checkpointing"] = {"partition_activations": bool(plan.sp and plan.tp > 1),
                                           "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": setup.recompute == "offload",
                                           "synchronize_checkpoint_boundary": False, "profile": False}
        where = {"full": f"around each group of {k} layer(s)", "selective": "around the attention core",
                 "block": f"around each of the first {k} layers of each stage chunk",
                 "every-k": f"around every {k}-th layer",
                 "offload": "per layer with cpu_checkpointing (its checkpoints move to host memory; the advisor "
                            "costs every saved tensor offloaded: torch.autograd.graph.save_on_cpu)"}[setup.recompute.value]
        notes.append(f"{setup.recompute} recompute: the model must call deepspeed.checkpointing.checkpoint {where}")
    if setup.compile == "model,loss":  # DeepSpeed 0.19 has no config switch for it: engine.compile() (engine.py),
        # which compiles the whole module (the HF model, its loss inside); the JSON's "compile" section is DeepCompile's
        notes.append("torch.compile as costed: call engine.compile() after deepspeed.initialize (the whole module, "
                     "its loss inside); the JSON's compile section (DeepCompile's passes) stays off")
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        notes.append(f"tp={plan.tp} via DeepSpeed AutoTP training (tensor_parallel.autotp_size); "
                     "Megatron-DeepSpeed passes its own mpu instead")
    if plan.pp > 1:
        notes.append(f"pp={plan.pp}: wrap the model in deepspeed.pipe.PipelineModule(layers, num_stages={plan.pp}"
                     + (", activation_checkpoint_interval=1" if setup.recompute == "full" else "")
                     + ") and train with engine.train_batch(); DeepSpeed runs 1F1B")
        if plan.schedule == "interleaved":
            raise ExportError("DeepSpeed's pipeline engine has no interleaved schedule", instead="megatron")


def _no_clip(plan: Plan, zero: dict[str, Any], notes: list[str]) -> None:
    """Costed without clipping (engine.clip_grad_norm false): gradient_clipping 0 skips the clip, and ZeRO-1/2 skip the
    norm with compute_grad_norm false (deepspeed 0.19.8 zero/config.py:143, :390-392: stages 1 and 2 only, no optimizer
    offload: stage_1_and_2.py:212-219); elsewhere DeepSpeed still takes the norm (stage_1_and_2.py:3032-3039)."""
    if plan.zero in (1, 2) and plan.offload.value == "none":
        zero["compute_grad_norm"] = False
    else:
        notes.append(f"gradient_clipping 0 as costed (no clipping); at ZeRO-{plan.zero}"
                     + (" with optimizer offload" if plan.offload.value != "none" else "")
                     + " DeepSpeed still takes the gradient norm every step, which the estimate does not count")
    notes.append("without clipping: under the Trainer pass --max_grad_norm 0 (transformers integrations/deepspeed.py:161 "
                 "refuses a gradient_clipping other than max_grad_norm)")


def _offload(plan: Plan, notes: list[str]) -> dict[str, Any]:
    """ZeRO-Offload / ZeRO-Infinity: offload_optimizer and offload_param (deepspeed/runtime/zero/offload_config.py;
    pin_memory on, as DeepSpeed defaults it); NVMe needs nvme_path, a mount on the node's NVMe drives."""
    o = plan.offload.value
    if o == "none":
        return {}
    device = "nvme" if o.endswith("nvme") else "cpu"
    section = {"device": device, "pin_memory": True}
    if device == "nvme":
        section["nvme_path"] = "/local_nvme"
        notes.append("offload to NVMe: set nvme_path to a directory on the node's local NVMe drives (/raid on a DGX)")
    out = {"offload_optimizer": dict(section)}
    if plan.offload.params:
        out["offload_param"] = dict(section)
    notes.append("the optimizer runs on the CPU: DeepSpeedCPUAdam (deepspeed.ops.adam), which DeepSpeed builds from the "
                 "JSON's optimizer section (a client optimizer, as the Trainer's own, is refused under offload); the "
                 "Trainer fills its 'auto' values from TrainingArguments, a script of its own sets them")
    return out


# Under offload_optimizer DeepSpeed 0.19.8 refuses a client optimizer that is not its CPU Adam
# (zero_force_ds_cpu_optimizer defaults to true: runtime/engine.py:2342-2346, constants.py:42), and the Trainer passes
# its own (transformers integrations/deepspeed.py deepspeed_optim_sched) unless the JSON names one: so the JSON names
# AdamW, which the engine builds as DeepSpeedCPUAdam(adamw_mode=True) there (engine.py:2384-2400). "auto" is the
# Trainer's placeholder for its TrainingArguments (trainer_config_process fills optimizer.params.*)
OFFLOAD_OPTIMIZER = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


def _precision(plan: Plan, setup: TrainingSetup, notes: list[str]) -> dict[str, Any]:
    """The fp16 / bf16 sections: dynamic loss scaling for fp16; bf16 master weights only with ZeRO."""
    p = setup.precision
    if p is Precision.fp16_mixed:
        return {"fp16": dict(FP16_DYNAMIC)}
    if p.recipe is not None:
        notes.append(f"{p.value}: the JSON enables bf16; the {p.recipe.format.upper()} GEMMs come from the model's "
                     f"Transformer Engine or torchao layers under that recipe ({_first_clause(p.recipe.source)})")
        return {"bf16": {"enabled": True}}
    if p is Precision.bf16_mixed:
        return {"bf16": {"enabled": True}}
    if p is Precision.bf16:
        if plan.zero >= 1:
            return {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
        notes.append("pure bf16 without ZeRO: DeepSpeed keeps fp32 master weights (its bf16 master option needs ZeRO>=1)")
        return {"bf16": {"enabled": True}}
    return {}


def deepspeed_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                     world_size: int, stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = deepspeed_dict(model, hw, plan, setup, grad_accum, world_size, stack)
    launch = " ".join(torchrun_argv(hw, world_size)) + " --deepspeed ds_config.json"
    notes.append(f"launch: {launch} (deepspeed.initialize(config='ds_config.json'))")
    if setup.finetune.adapters:
        from advisor.export.common import finetune_note

        notes.append(finetune_note(setup, model))
    cfg[NOTES_KEY] = notes
    return Exported("ds_config.json", json.dumps(cfg, indent=2) + "\n", tuple(notes))


def _first_clause(text: str) -> str:
    """``text`` up to its first ';' outside parentheses (a recipe's first source: its parentheses kept whole)."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            return text[:i]
    return text
