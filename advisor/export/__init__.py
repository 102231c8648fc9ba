"""Export a chosen plan as a launch configuration: accelerate YAML, DeepSpeed JSON, Megatron-LM arguments, Megatron-Bridge
ConfigContainer overrides (YAML), torchrun, torchtitan's arguments, an llm-foundry train YAML, a litgpt config YAML,
a nanotron config YAML.

Only the costed stack's own formats are written: a stack profile lists them (``launch:``, its usual one first), and
``export`` refuses any other in one line naming the ones it has (``resolve_launch``); without a format it writes
the stack's first. Stack ``auto`` with a format takes the shipped stack whose usual format it is.

Each exporter is a pure function of the three inputs (model, hardware, plan + training setup) and the
resolved ``grad_accum`` / ``world_size``; it returns an ``Exported`` (file name, text, notes). What a
format cannot express is refused with one ``ExportError`` line rather than approximated silently;
where the mapping is close but not exact, the difference is said in ``notes``, which every format that has
notes also writes into the file (comments in the YAML and the script, "_advisor_notes" in the JSON).

One module per format (accelerate.py, deepspeed.py, megatron.py, bridge.py, torchrun.py, torchtitan.py, foundry.py,
litgpt.py, nanotron.py) and one for what they share (common.py: checks, header, node layout, ``Run``, ``Exported``,
``ExportError``).

Names follow the libraries as checked on CPU (tests/test_export.py loads every export with the
library's own parser): accelerate 1.15 (ClusterConfig, FSDP1 ``fsdp_reshard_after_forward``),
DeepSpeed 0.19 (DeepSpeedConfig), megatron-core 0.16 (TransformerConfig, DistributedDataParallelConfig,
OptimizerConfig) with Megatron-LM's ``megatron/training/arguments.py`` flag spelling (its parse_args and
validate_args, as shipped in megatron-core 0.19.2, pass every Megatron case: tests/test_export_stacks.py), torch 2.x
``torch.distributed.run``, torchtitan 0.3.0 (ConfigManager) and 0.2.2 (its TOML job file, its ConfigManager), llm-foundry 0.22 (TrainConfig key names), megatron-bridge
0.6.2 (ConfigContainer field names; its omegaconf_utils merge: tests/test_export_bridge.py), litgpt 0.5.13 (its CLI's
jsonargparse: tests/test_export_litgpt.py), nanotron 0.4 (get_config_from_file: tests/test_export_nanotron.py).

Deliberately left out: optimizer / learning-rate settings, data paths, checkpointing, CPU offload (where a format's
parser requires them, as llm-foundry's and nanotron's do, the file carries placeholders marked as such).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Union

from advisor.export.accelerate import ACCELERATE_PRECISION, accelerate_config, accelerate_dict
from advisor.export.bridge import bridge_config
from advisor.export.common import (
    GRADIENT_CLIP,
    RDZV_PORT,
    Exported,
    ExportError,
    Layout,
    catalogued,
    Plan,
    TrainingSetup,
    global_batch,
    node_layout,
)
from advisor.export.deepspeed import FP16_DYNAMIC, NOTES_KEY, deepspeed_config, deepspeed_dict
from advisor.export.foundry import foundry_config, foundry_dict
from advisor.export.litgpt import litgpt_config, litgpt_dict
from advisor.export.megatron import megatron_args, megatron_config, megatron_env
from advisor.export.megatron_shape import unwritten_by
from advisor.export.nanotron import nanotron_config, nanotron_dict
from advisor.export.torchrun import torchrun_argv, torchrun_command
from advisor.export.torchtitan import CONFIGS as TORCHTITAN_CONFIGS, torchtitan_args, torchtitan_config
from advisor.export.torchtitan_toml import torchtitan_toml_config
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.plan_errors import plan_errors
from advisor.launch import LAUNCH_FORMATS
from advisor.stack import Stack, StackError, list_stacks, load_stack
from advisor.workload import Workload, runs_model, stack_setup

__all__ = ["ACCELERATE_PRECISION", "EXPORTERS", "bridge_config", "FP16_DYNAMIC", "GRADIENT_CLIP", "KINDS", "NOTES_KEY", "RDZV_PORT",
           "ExportError", "Exported", "Layout", "accelerate_config", "accelerate_dict", "deepspeed_config",
           "deepspeed_dict", "export", "export_config", "global_batch", "megatron_args", "megatron_config",
           "megatron_env", "node_layout", "torchrun_argv", "torchrun_command", "torchtitan_args", "torchtitan_config", "torchtitan_toml_config",
           "foundry_config", "foundry_dict", "litgpt_config", "litgpt_dict", "nanotron_config", "nanotron_dict", "launch_formats", "launching", "resolve_launch", "stacks_launching"]

KINDS = LAUNCH_FORMATS  # the formats a stack profile may list (advisor.launch.LaunchFormat)
EXPORTERS = {"accelerate": accelerate_config, "deepspeed": deepspeed_config, "megatron": megatron_config,
             "megatron-bridge": bridge_config,
             "torchrun": torchrun_command, "torchtitan": torchtitan_config, "torchtitan-toml": torchtitan_toml_config,
             "llm-foundry": foundry_config,
             "litgpt": litgpt_config, "nanotron": nanotron_config}


# the formats that build the model with Megatron's own layers from flags (megatron_shape.unwritten names what their
# flags cannot say); every other format launches the Hugging Face modules of the model's config.json
MEGATRON_FORMATS = ("megatron", "megatron-bridge")
# the formats that write no LoRA adapters (Megatron-LM's pretrain_gpt.py has none; no torchtitan override reaches its
# LoRAConverter): their exporters refuse an adapter plan, whatever the stack runs
NO_ADAPTERS = ("megatron", "torchtitan")
# the formats whose exporter takes the costed stack itself (the others read setup.stack's name only)
TAKE_STACK = ("megatron", "megatron-bridge", "torchtitan", "torchtitan-toml", "nanotron", "deepspeed", "accelerate")
# the formats that may be given an expert-parallel plan (the others refuse it below)
EP_FORMATS = ("megatron", "megatron-bridge", "torchtitan", "torchtitan-toml", "nanotron", "deepspeed")


def unwritable(stack: Stack, model: ModelSpec) -> list[str]:
    """What of the model none of the stack's launch formats writes (an export would train another model, or none):
    Megatron-LM's flags and Bridge's overrides both lack, say, OLMo 2's full-width q/k norms (the flags write MLA,
    megatron_shape.model_shape; the overrides do not); torchtitan runs the config functions of its registries only
    (torchtitan.CONFIGS). Empty where a format launches Hugging Face modules."""
    formats = [f for f in stack.launch if f in EXPORTERS]
    if formats == ["torchtitan"] and catalogued(model, TORCHTITAN_CONFIGS)[0].name not in TORCHTITAN_CONFIGS:
        return [f"no torchtitan config function (its registries: {', '.join(TORCHTITAN_CONFIGS)})"]
    if not formats or any(f not in MEGATRON_FORMATS for f in formats):
        return []
    each = [unwritten_by(model, fmt) for fmt in formats]
    return [f for f in each[0] if all(f in other for other in each[1:])]


def launch_formats(stack: Stack) -> tuple[str, ...]:
    """The formats a stack is launched with (its profile's ``launch``, each one advisor writes: advisor.launch
    LaunchFormat), its usual one first."""
    if not stack.launch:
        raise ExportError(f"stack {stack.name} lists no launch format: add launch: [...] ({', '.join(KINDS)}) "
                          "to its profile")
    return tuple(stack.launch)


def stacks_launching(kind: str) -> list[str]:
    """The shipped stacks that launch ``kind``, those whose usual format it is first, a profile superseded by another
    that launches it last (torchtitan-0.1 after 0.2, whose TOML format both write)."""
    found = [(load_stack(n), n) for n in list_stacks()]
    launching = {n for s, n in found if kind in s.launch}
    return [n for *_, n in sorted((s.superseded_by in launching, s.superseded_by is not None, s.launch.index(kind), n)
                                  for s, n in found if kind in s.launch)]


def launching(kind: str, auto_choice: Optional[Stack] = None) -> str:
    """The stack an export in ``kind`` is costed in when none was given: the auto rule's choice if it launches
    ``kind``, else (or without one) the shipped stack whose usual format ``kind`` is."""
    if auto_choice is not None and kind in auto_choice.launch:
        return auto_choice.name
    names = stacks_launching(kind)
    if not names:
        raise ExportError(f"no stack profile launches {kind}: add it to a profile's launch: list")
    return names[0]


def resolve_launch(kind: Optional[str], stack: Union[str, Stack, None]) -> tuple[Stack, str]:
    """(the stack, the format) of an export: ``kind`` must be one of the stack's launch formats (None: its usual
    one). Stack ``auto`` (or None) with a format: the shipped stack whose usual format it is."""
    if kind is not None and kind not in EXPORTERS:
        raise ExportError(f"unknown export format {kind!r}: use one of {', '.join(KINDS)}")
    if stack is None or (isinstance(stack, str) and stack in ("auto", "any")):
        if kind is None:
            raise ExportError("no stack to take the launch format from: give --stack or --format")
        return load_stack(launching(kind)), kind
    stack = load_stack(stack)
    formats = launch_formats(stack)
    if kind is None:
        return stack, formats[0]
    if kind not in formats:
        others = [n for n in stacks_launching(kind) if n != stack.name]
        hint = f"; {kind} is launched by --stack {' or '.join(others)}" if others else ""
        raise ExportError(f"stack {stack.name} does not launch {kind}: it launches {', '.join(formats)} "
                          f"(--format {formats[0]}){hint}")
    return stack, kind


ZERO_BUBBLE = ("zb-h1", "zb-v", "dualpipev")
# the formats that write torch.compile as costed (accelerate's dynamo_config, torchtitan's compile.*), and those whose
# notes tell the script to (DeepSpeed: engine.compile(), no config switch)
COMPILE_FORMATS = ("accelerate", "torchtitan", "torchtitan-toml")
SCRIPT_COMPILE = ("deepspeed",)


def export(kind: Optional[str], model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
           world_size: int, stack: Union[str, Stack, None] = None) -> Exported:
    """The launch config of one plan in format ``kind`` (one of KINDS; None: the first of the stack's launch formats
    that expresses the plan, its usual one first), for the stack it was costed in (``stack``, default
    ``setup.stack``); ExportError, one line, if the stack does not launch that format or the format cannot express
    the plan (without a format: the usual one's reason, when none of them can)."""
    stack_, first = resolve_launch(kind, setup.stack if stack is None else stack)
    setup = stack_setup(setup, stack_)  # the stack's default optimizer where none was asked, as it was costed
    args = (model, hw, plan, setup, grad_accum, world_size, stack_)
    if kind is None:  # e.g. hf-trainer's DeepSpeed ZeRO-Offload plan: accelerate cannot, deepspeed can
        out, reason = _first_written(launch_formats(stack_), *args)
        if out is None:
            raise reason
        return out
    try:
        return _export(first, *args)
    except ExportError as exc:  # it names a format the stack does not launch: the stack's that writes the plan instead
        if exc.instead is None or exc.instead in stack_.launch:
            raise
        out, _ = _first_written([f for f in launch_formats(stack_) if f != first], *args)
        # the stack named too: without one, a format picks the stack that launches it first, which may not run the plan
        given = stack if isinstance(stack, (str, Path)) else stack_.name  # a profile file by the path given
        hint = f"use --stack {given} --format {out.kind}" if out is not None else _elsewhere(stack_, (exc.instead,))
        raise ExportError(f"{exc.reason}: {hint}") from None


def _first_written(formats, *args) -> tuple[Optional[Exported], Optional[ExportError]]:
    """(the export in the first of ``formats`` that writes the plan, or None; the first refusal met)."""
    reason = None
    for fmt in formats:
        try:
            return _export(fmt, *args), None
        except ExportError as exc:
            reason = reason or exc
    return None, reason


def _export(kind: str, model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
            world_size: int, stack_: Stack) -> Exported:
    errors = plan_errors(plan, setup, model, hw, world_size, stack_)  # what the stack does not run, too
    if errors:
        raise ExportError(f"plan {plan.label()} is invalid under stack {stack_.name}: {errors[0]}")
    setup = setup.model_copy(update={"stack": stack_.name})  # the header names the stack
    if setup.finetune.kind not in stack_.engine.methods:  # a file without the adapters would train every weight
        raise ExportError(f"--method {setup.finetune.method}: stack {stack_.name} does not run {setup.finetune.kind} "
                          f"fine-tuning (it runs {', '.join(stack_.engine.methods)}): "
                          f"{_running(kind, model, setup.finetune.kind)}, or --method full")
    if kind in ("accelerate", "deepspeed") and (plan.cp > 1 or plan.pp_split.value != "even" or plan.schedule.value in ZERO_BUBBLE):
        what = (f"context parallelism (cp={plan.cp})" if plan.cp > 1 else f"the {plan.schedule.value} schedule"
                if plan.schedule.value in ZERO_BUBBLE else "an uneven pipeline split")
        raise ExportError(f"the {kind} export does not write {what}: " + _elsewhere(stack_, ("megatron",)))
    if kind == "megatron" and setup.finetune.adapters:
        raise ExportError(f"--method {setup.finetune.method}: Megatron-LM's pretrain_gpt.py has no LoRA adapters; "
                          "export --format megatron-bridge (Bridge's LoRA), or accelerate, deepspeed or torchrun with "
                          "--stack hf-trainer (PEFT)")
    if setup.compile != "none" and kind not in COMPILE_FORMATS + SCRIPT_COMPILE:  # it would launch an eager run
        raise ExportError(f"--compile {setup.compile}: the {kind} export has no torch.compile setting: "
                          + _elsewhere(stack_, COMPILE_FORMATS) + ", or --compile none")
    if kind not in EP_FORMATS and (plan.ep > 1 or plan.etp not in (None, plan.tp)):
        # a config without it would launch another plan: DeepSpeed-MoE and transformers set it in the model's code
        raise ExportError(f"expert parallelism (ep={plan.ep}) is written only as Megatron's and torchtitan's flags: "
                          + _elsewhere(stack_, ("megatron", "torchtitan")) + f", or --ep 1 for a {kind} config")
    # the Megatron formats and torchtitan's take the stack itself: the Bridge overrides compare the recipe they name
    # with its engine, the Megatron ones write the dispatcher and overlaps the plan was costed with, torchtitan's notes
    # compare its loss with 0.3.0's (a profile file has no name to load it back by)
    out = (EXPORTERS[kind](model, hw, plan, setup, grad_accum, world_size, stack_)
           if kind in TAKE_STACK else EXPORTERS[kind](model, hw, plan, setup, grad_accum, world_size))
    if kind == "deepspeed" and plan.zero == 3 and stack_.engine.zero3_overlap != "per_submodule":
        deepspeed = stacks_launching("deepspeed")[0]
        out = _noted(out, f"costed as {stack_.name} runs ZeRO-3 (a decoder layer a unit, its gathers prefetched); "
                          f"DeepSpeed's stage 3 this file starts gathers and frees sub-module by sub-module: --stack "
                          f"{deepspeed} costs it so")
    try:  # what estimate costs it with: where the stack's tables do not describe the setup, the file says so
        Workload.of(model, hw, stack_, setup)
    except StackError as exc:
        out = _noted(out, f"not a costed plan: {exc} (advisor estimate refuses it; the file writes the layout alone)")
    return dataclasses.replace(out, kind=kind, stack=stack_.name)


def _running(kind: str, model: ModelSpec, method: str) -> str:
    """The current stacks that launch ``kind`` and run ``method`` on ``model`` (--stack ...), else those that run it
    with their usual format (--stack ... --format ...)."""
    def runs(name: str) -> bool:
        st = load_stack(name)
        return st.superseded_by is None and method in st.engine.methods and runs_model(st, model)

    same = [n for n in stacks_launching(kind) if runs(n) and kind not in NO_ADAPTERS]
    if same:
        return f"--stack {' or '.join(same)}"
    other = [f"--stack {n} --format {f}" for n in list_stacks() if runs(n)
             for f in [next((f for f in load_stack(n).launch if f not in NO_ADAPTERS), None)] if f]
    return " or ".join(other) or f"no shipped stack runs {method} on {model.name}"


def _noted(out: Exported, note: str) -> Exported:
    """``out`` with one more note, in its notes and its text: the DeepSpeed JSON's notes key, else a comment line."""
    if out.text.lstrip().startswith("{"):
        cfg = json.loads(out.text)
        cfg[NOTES_KEY] = [*cfg.get(NOTES_KEY, []), note]
        text = json.dumps(cfg, indent=2) + "\n"
    else:
        text = out.text + f"# note: {note}\n"
    return dataclasses.replace(out, text=text, notes=out.notes + (note,))


def _elsewhere(stack: Stack, formats: tuple[str, ...]) -> str:
    """Where a plan one format cannot write goes: another format of the same stack, else a stack that launches one."""
    own = [f for f in formats if f in stack.launch]
    if own:
        return f"use --format {' or '.join(own)}"
    others = [f"--stack {stacks_launching(f)[0]} --format {f}" for f in formats if stacks_launching(f)]
    return f"{stack.name} launches none of {', '.join(formats)}: cost the plan in " + " or ".join(others)


def export_config(kind: Optional[str], model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup,
                  grad_accum: int, world_size: int, stack: Union[str, Stack, None] = None) -> tuple[str, str]:
    """(suggested file name, file text) for one launcher; see ``export`` for the notes as well."""
    out = export(kind, model, hw, plan, setup, grad_accum, world_size, stack)
    return out.filename, out.text
