"""What every launch-config writer shares: the refusal type, the result, the checks, the header, the node layout.

This is the one module of ``advisor.export`` that imports the plan types (``Plan``, ``Precision``,
``TrainingSetup``, ``plan_errors``, ``resolve_grad_accum``); the writers take them from here, so moving
those types is one import line. Writers read plan fields only by name (dp, tp, pp, zero, hybrid_shard, sp,
schedule, virtual_stages, data_parallel, overlap_grad_reduce) and setup fields likewise (seq_len,
micro_batch, global_batch, grad_accum, precision, optimizer, attention, recompute).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Optional

from advisor.errors import AdvisorError
from advisor.hardware import Hardware
from advisor.model import ModelSpec, catalogue_twin
from advisor.plan_errors import plan_errors
from advisor.layout import Plan, resolve_grad_accum
from advisor.training import Precision, TrainingSetup

__all__ = ["GRADIENT_CLIP", "gradient_clip", "RDZV_PORT", "ExportError", "Exported", "Layout", "Plan", "Precision", "Run", "TrainingSetup",
           "argv_lines", "check", "commented_yaml", "global_batch", "header", "node_layout"]

RDZV_PORT = 29500  # torchrun / accelerate default rendezvous port
GRADIENT_CLIP = 1.0  # Megatron-LM's --clip-grad default; written into DeepSpeed too so both clip alike


def gradient_clip(stack=None) -> float:
    """The clipping threshold the plan was costed with: GRADIENT_CLIP where the stack's step clips
    (engine.clip_grad_norm; no stack given: the exporter's own default), else 0.0, which Megatron-LM takes as no
    norm at all (megatron-core 0.19.2 optimizer/optimizer.py:830, 1319: clip_grad > 0.0) and DeepSpeed as no clip
    (deepspeed 0.19.8 zero/stage_1_and_2.py:3194-3199: clip_grad > 0.)."""
    return GRADIENT_CLIP if stack is None or stack.engine.clip_grad_norm else 0.0


class ExportError(AdvisorError):
    """A plan the requested launcher cannot express; one line naming what to change. ``instead``: a format that writes
    it, named at the end ("use --format X"), which advisor.export.export replaces where the stack does not launch X."""

    def __init__(self, reason: str, instead: Optional[str] = None):
        super().__init__(f"{reason}: use --format {instead}" if instead else reason)
        self.reason, self.instead = reason, instead


@dataclass(frozen=True)
class Exported:
    """One launch config: the suggested file name, its text, and the notes (also written into the text)."""

    filename: str
    text: str
    notes: tuple[str, ...] = ()
    kind: str = ""  # the format and the stack it was written for (set by advisor.export.export)
    stack: str = ""


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


def argv_lines(args: list[str]) -> list[str]:
    """A launch script's bash array of arguments: one option a line, with its value where it has one (the next word
    is not an option), each word shell-quoted."""
    lines, i = [], 0
    while i < len(args):
        take = 2 if i + 1 < len(args) and not args[i + 1].startswith("--") else 1
        lines.append("    " + " ".join(shlex.quote(x) for x in args[i:i + take]))
        i += take
    return lines


def check(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
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


def commented_yaml(filename: str, head: list[str], mapping: dict, notes: list[str]) -> Exported:
    """A YAML launch config: the comment lines ``head`` (each with its "# "), the mapping in key order, then every
    note as a comment (what the file alone cannot do: said in it, not only on stderr)."""
    import yaml

    body = yaml.safe_dump(mapping, sort_keys=False, width=100)
    tail = "".join(f"# note: {n}\n" for n in notes)
    return Exported(filename, "\n".join(head) + "\n" + body + tail, tuple(notes))


def global_batch(plan: Plan, setup: TrainingSetup, grad_accum: int) -> int:
    """Sequences per optimizer step: micro_batch x grad_accum x dp (Megatron / DeepSpeed identity)."""
    return setup.micro_batch * grad_accum * plan.dp


@dataclass(frozen=True)
class Run:
    """One export's inputs together, as the key tables of torchtitan.py and foundry.py read them: a table row is
    (the format's key, a function of a Run giving its value or None for "not written"), so that a plan or setup
    field added later (context parallelism, a recompute policy, offload, a precision recipe) is one row per format."""

    model: ModelSpec
    hw: Hardware
    plan: Plan
    setup: TrainingSetup
    grad_accum: int
    world_size: int

    @property
    def axes(self):
        """The plan's named axes (advisor.layout.Layout: dp_replicate, dp_shard, tp, pp, virtual_stages)."""
        return self.plan.layout(self.hw.gpus_per_node, self.world_size)

    def field(self, name: str, default):
        """A plan or setup field by name, ``default`` where neither has it (a field another change adds)."""
        return getattr(self.plan, name, getattr(self.setup, name, default))


def header(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
           world_size: int, peft: bool = True) -> str:
    """One line saying what was exported: model, plan, GPUs and the batch, as every format's first comment; with
    ``peft``, what a LoRA/QLoRA script must build (a format that writes its own adapters says method= only)."""
    method = (finetune_note(setup, model) if peft else f"method={setup.finetune.method}") if setup.finetune.adapters else ""
    return (f"advisor export: {model.name}, {plan.label()} on {world_size} GPUs ({hw.name}); "
            f"micro_batch={setup.micro_batch} grad_accum={grad_accum} "
            f"global_batch={global_batch(plan, setup, grad_accum)} seq_len={setup.seq_len} "
            f"precision={setup.precision.value} recompute={setup.recompute}"
            + (f"({','.join(setup.recompute_modules)})" if setup.recompute_modules else "")
            + (f"; {method}" if method else "")
            + (f"; stack {setup.stack}" if setup.stack not in ("auto", "any") else ""))


def finetune_note(setup: TrainingSetup, model: ModelSpec) -> str:
    """What the script must build for a LoRA/QLoRA plan: PEFT's LoraConfig (and bitsandbytes' quantisation config)
    with the options the plan was costed with (the launcher configs cannot say it), its target_modules as the model's
    family names them in transformers (advisor.peft_modules)."""
    ft = setup.finetune
    from advisor.finetune import Quant
    from advisor.peft_modules import target_modules

    targets = ", ".join(repr(name) for name in target_modules(model, ft.target_set))
    out = (f"method={ft.method}: wrap the model with peft.get_peft_model(model, LoraConfig(r={ft.lora_rank}, "
           f"lora_alpha={ft.lora_alpha:g}, lora_dropout={ft.lora_dropout:g}, target_modules=[{targets}]"
           f"{', use_dora=True' if ft.dora else ''}))")
    if ft.base_quant is Quant.nf4:
        out += (" on a base loaded with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                f"bnb_4bit_use_double_quant={ft.double_quant}, bnb_4bit_compute_dtype=torch.bfloat16)")
    elif ft.base_quant is Quant.int8:
        out += " on a base loaded with BitsAndBytesConfig(load_in_8bit=True)"
    if ft.optimizer_8bit or ft.paged:
        out += f"; optimizer bitsandbytes.optim.{'Paged' if ft.paged else ''}AdamW{'8bit' if ft.optimizer_8bit else ''}"
    if ft.offload.value != "none":
        out += f"; offload {ft.offload} to CPU (DeepSpeed offload_optimizer / torchtune enable_activation_offloading)"
    return out


def hf_recompute_note(setup: TrainingSetup) -> Optional[str]:
    """What a script training a Hugging Face model calls for the plan's recomputation, which no launcher config sets
    (transformers 5.23 PreTrainedModel.activation_checkpointing_enable(every_n_layers, offload); its older name
    gradient_checkpointing_enable is a deprecated alias); None without recomputation."""
    k = setup.recompute_layers
    return {"full": "full recompute: call model.activation_checkpointing_enable() (transformers) in the script",
            "every-k": f"every-k recompute: model.activation_checkpointing_enable(every_n_layers={k}) (transformers) in "
                       "the script",
            "block": f"block recompute: checkpoint the first {k} layers in the script",
            "selective": "selective recompute is chosen in the model code (checkpoint the attention core); no launcher "
                         "config has a switch for it",
            "offload": "activation offload: wrap the forward in torch.autograd.graph.save_on_cpu(pin_memory=True) in the "
                       "script (every saved tensor on the host, nothing recomputed; transformers' "
                       "activation_checkpointing_enable(offload=True) also recomputes: another plan)",
            }.get(setup.recompute.value)


def catalogued(model: ModelSpec, names) -> tuple[ModelSpec, list[str]]:
    """``model`` under the catalogue name of its shape, where a format keys its settings by that name (torchtitan's
    config functions) and the model's own is not among ``names`` (a config.json named after its folder), with a note
    saying so; else ``model`` as it is."""
    twin = catalogue_twin(model) if model.name not in names else None
    if twin is None or twin not in names:
        return model, []
    return model.model_copy(update={"name": twin}), [f"{model.name} has the catalogue's {twin} shape (every field "
                                                     f"of its config): written with {twin}'s config"]
