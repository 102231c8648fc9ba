"""Export a chosen plan as a launch configuration: accelerate YAML, DeepSpeed JSON, Megatron-LM arguments, torchrun.

Each exporter is a pure function of the three inputs (model, hardware, plan + training setup) and the
resolved ``grad_accum`` / ``world_size``; it returns an ``Exported`` (file name, text, notes). What a
format cannot express is refused with one ``ExportError`` line rather than approximated silently;
where the mapping is close but not exact, the difference is said in ``notes``, which every format that has
notes also writes into the file (comments in the YAML and the script, "_advisor_notes" in the JSON).

One module per format (accelerate.py, deepspeed.py, megatron.py, torchrun.py) and one for what they
share (common.py: checks, header, node layout, ``Exported``, ``ExportError``).

Names follow the libraries as checked on CPU (tests/test_export.py loads every export with the
library's own parser): accelerate 1.15 (ClusterConfig, FSDP1 ``fsdp_reshard_after_forward``),
DeepSpeed 0.19 (DeepSpeedConfig), megatron-core 0.16 (TransformerConfig, DistributedDataParallelConfig,
OptimizerConfig) with Megatron-LM's ``megatron/training/arguments.py`` flag spelling, torch 2.x
``torch.distributed.run``.

Deliberately left out: optimizer / learning-rate settings, data paths, checkpointing, CPU offload.
"""

from __future__ import annotations

from advisor.export.accelerate import ACCELERATE_PRECISION, accelerate_config, accelerate_dict
from advisor.export.common import (
    GRADIENT_CLIP,
    RDZV_PORT,
    Exported,
    ExportError,
    Layout,
    Plan,
    TrainingSetup,
    global_batch,
    node_layout,
)
from advisor.export.deepspeed import FP16_DYNAMIC, NOTES_KEY, deepspeed_config, deepspeed_dict
from advisor.export.megatron import megatron_args, megatron_config, megatron_env
from advisor.export.torchrun import torchrun_argv, torchrun_command
from advisor.hardware import Hardware
from advisor.model import ModelSpec

__all__ = ["ACCELERATE_PRECISION", "EXPORTERS", "FP16_DYNAMIC", "GRADIENT_CLIP", "KINDS", "NOTES_KEY", "RDZV_PORT",
           "ExportError", "Exported", "Layout", "accelerate_config", "accelerate_dict", "deepspeed_config",
           "deepspeed_dict", "export", "export_config", "global_batch", "megatron_args", "megatron_config",
           "megatron_env", "node_layout", "torchrun_argv", "torchrun_command"]

KINDS = ("accelerate", "deepspeed", "megatron", "torchrun")
EXPORTERS = {"accelerate": accelerate_config, "deepspeed": deepspeed_config, "megatron": megatron_config,
             "torchrun": torchrun_command}


ZERO_BUBBLE = ("zb-h1", "zb-v", "dualpipev")


def export(kind: str, model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
           world_size: int) -> Exported:
    """The launch config of one plan in format ``kind`` (one of KINDS); ExportError if it cannot be expressed."""
    if kind not in EXPORTERS:
        raise ExportError(f"unknown export format {kind!r}: use one of {', '.join(KINDS)}")
    if kind in ("accelerate", "deepspeed") and (plan.cp > 1 or plan.pp_split.value != "even" or plan.schedule.value in ZERO_BUBBLE):
        what = (f"context parallelism (cp={plan.cp})" if plan.cp > 1 else f"the {plan.schedule.value} schedule"
                if plan.schedule.value in ZERO_BUBBLE else "an uneven pipeline split")
        raise ExportError(f"the {kind} export does not write {what}: use --format megatron")
    return EXPORTERS[kind](model, hw, plan, setup, grad_accum, world_size)


def export_config(kind: str, model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                  world_size: int) -> tuple[str, str]:
    """(suggested file name, file text) for one launcher; see ``export`` for the notes as well."""
    out = export(kind, model, hw, plan, setup, grad_accum, world_size)
    return out.filename, out.text
