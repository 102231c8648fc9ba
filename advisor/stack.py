"""A training stack's profile: what the stack's kernels move, what its layers save for backward, and how its
training engine holds and reduces model states, read as data (YAML in stack_profiles/, like hardware profiles).

Each stack is one file (``advisor stacks`` lists those shipped; ``base:`` inherits another's); the cost model reads
a stack's numbers and choices and never asks which stack it is.

Measured tables are keyed by what they depend on: ``mode`` (how activations are held: fp32, mixed, half;
advisor.training.Mode), ``attention`` (sdpa, eager), ``mlp`` (gelu, swiglu) and ``compile`` (eager, or the
stack's torch.compile: a table of compiled kernels says ``compiled``, one that compile leaves as it is ``any``;
unsaid, a table is eager's); ``any`` matches every value and the first matching entry of a list is taken. What a
stack compiles at all is its profile's ``compile`` list. Bytes per token are linear forms in the layer's dimensions
(d_model, d_ff, q_dim, kv_dim, heads, d_head, and a constant), split as tensor parallelism splits them:
``split`` over the TP ranks, ``sequence`` over them only under sequence parallelism (LayerNorms, dropouts,
residuals: Korthikanti et al. 2022, s.4.2.2), ``whole`` never; ``scores`` are bytes per head per key of the
s x s attention scores (eager attention only), split over the TP ranks. Every entry may say its ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, model_validator

from advisor.engine import PLAN_FEATURES, Engine, RecipeName, Zero3Calls  # noqa: F401 (the engine's part; read from here too)
from advisor.errors import AdvisorError
from advisor.forms import NO_BYTES, Form, LayerBytes, PerLayerBytes, form_value  # noqa: F401 (read from here too)
from advisor.launch import LaunchFormat
from advisor.model.layer import DecoderLayer
from advisor.model.spec import ModelSpec, PositionKind
from advisor.profiles import ProfileKind, to_yaml
from advisor.unfused import Passes, RoutedUnfused, Rotary  # noqa: F401 (the profile's parts; read from here too)
from advisor.spec import ProfileName, Spec, checked
from advisor.training import Precision, compile_parts

STACK_DIR = Path(__file__).resolve().parent.parent / "stack_profiles"
_PACKAGED_STACK_DIR = Path(__file__).resolve().parent / "stack_profiles"


class StackError(AdvisorError):
    """A stack profile that cannot be found, read, or does not cover the case asked; one line."""


class Entry(Spec):
    """What a measured table's entry applies to, and where its numbers come from."""

    mode: Literal["fp32", "mixed", "half", "any"] = "any"
    attention: Literal["sdpa", "eager", "any"] = "any"
    mlp: Literal["gelu", "swiglu", "any"] = "any"
    compile: Literal["eager", "compiled", "any"] = "eager"
    source: Optional[str] = None

    def matches(self, mode: str, attention: str, mlp: str, compile: str = "eager") -> bool:
        return all(mine in ("any", want) for mine, want in ((self.mode, mode), (self.attention, attention), (self.mlp, mlp),
                                                            (self.compile, compile)))


class HostOps(Entry):
    """aten ops one layer issues per micro-batch, and the host's CPU time per op before its launch."""

    forward_ops: int = Field(ge=0, le=100_000)
    backward_ops: int = Field(ge=0, le=100_000)
    cpu_us_per_op: float = Field(ge=0, le=1e4)


class HeadOps(Entry):
    """aten ops outside the layers per micro-batch: embedding, final norm, LM head, loss."""

    forward_ops: int = Field(ge=0, le=100_000)
    backward_ops: int = Field(ge=0, le=100_000)


class Traffic(Entry):
    """Bytes per token one layer's element-wise kernels read and write, forward and backward."""

    forward: PerLayerBytes
    backward: PerLayerBytes


class PerElement(Entry):
    """Bytes moved per element (an attention score, a logit), forward and backward."""

    forward: float = Field(ge=0, le=1e4)
    backward: float = Field(ge=0, le=1e4)


class Saved(Entry):
    """What autograd keeps for backward, per token: one layer, one layer under full recomputation (its
    input), under the stack's selective recomputation (default: the layer without the s x s scores), outside the
    layers (logits excluded), and bytes per element of eager attention's b x s x s mask."""

    layer: PerLayerBytes
    full_recompute: PerLayerBytes
    selective: Optional[PerLayerBytes] = None
    outside_layers: Form = Field(default_factory=dict)
    attention_mask: float = Field(default=0.0, ge=0, le=64)
    # of ``layer``, what is kept only for the norms' weight gradients (a norm computing weight * x_normed keeps
    # x_normed for the weight's gradient alone): not kept where the norms are frozen, as under LoRA (advisor.adapters)
    norm_weight_inputs: Form = Field(default_factory=dict)


class Logits(Entry):
    """Bytes per logit of the logits and the loss's buffers: alive at the end of forward, and at the peak; per token
    besides, a linear form (a chunked loss's hidden-state copies and gradient accumulator: not divided by TP); and at
    the peak per element of a TP rank's LM head (a chunked loss's unsharded head gradient and reduce-scatter input)."""

    held: float = Field(ge=0, le=1e3)
    peak: float = Field(ge=0, le=1e3)
    held_per_token: Form = Field(default_factory=dict)
    peak_per_token: Form = Field(default_factory=dict)
    peak_per_head_weight: float = Field(default=0.0, ge=0, le=100)


class Kernels(Spec):
    vocab_padding: int = Field(default=0, ge=0, le=1_000_000, description="the vocabulary is padded to a multiple of "
                               "this x tp (0: not padded): its logits GEMM runs aligned; the padded rows themselves (under "
                               "0.3% of a vocabulary at 128 x 8) are not costed")
    attention_efficiency: float = Field(
        default=1.0, ge=0.01, le=2.0, description="the stack's fused attention kernel's rate as a fraction of the one the "
                                               "hardware profile's attention_max was fitted on (SDPA / FlashAttention-2)")
    host: list[HostOps]
    host_outside_layers: list[HeadOps]
    elementwise: list[Traffic]
    attention_scores: list[PerElement]
    loss: list[PerElement]
    routed_unfused: RoutedUnfused = Field(default_factory=RoutedUnfused)
    rotary: Rotary = Field(default_factory=Rotary)
    # multi-head latent attention's own element-wise kernels, where the stack makes MLA's q, k and v with them in
    # place of the q/k/v layout copies and output merge its elementwise tables count on q_dim and kv_dim: a latent
    # layer's tables drop those terms and take these (empty: the tables as they are)
    latent: list[Traffic] = Field(default_factory=list)


class FlashOutputCopy(Spec):
    """Where the stack's fused attention runs FlashAttention (on GPUs of compute capability in [``from_cc``,
    ``below_cc``)) and hands back a contiguous copy of its output in another layout at micro-batch > 1, which the
    output projection saves beside the copy the kernel keeps (advisor.memory flash_output_copy)."""

    from_cc: float = Field(ge=1.0, le=100.0)
    below_cc: float = Field(ge=1.0, le=100.0)
    max_head_dim: int = Field(default=256, ge=1, le=100_000)  # FlashAttention's widest (padded) head
    source: Optional[str] = None


class Memory(Spec):
    saved: list[Saved]
    logits: list[Logits]
    flash_output_copy: Optional[FlashOutputCopy] = None


# the --precision values each activation mode of the tables serves (advisor.precision: half is bf16 / fp16 throughout,
# mixed the -mixed recipes and the low-precision ones, fp32 fp32)
PRECISIONS_OF_MODE = {"half": "bf16", "mixed": "bf16-mixed", "fp32": "fp32"}


class Stack(Spec):
    name: ProfileName
    description: str = ""
    source: str = Field(min_length=1, description="the library versions and files the numbers come from")
    launch: list[LaunchFormat] = Field(default_factory=list, max_length=16, description="the launch formats the stack "
                                       "is started with, its usual one first (advisor export --format); none listed: advisor export refuses")
    superseded_by: Optional[str] = Field(
        default=None, min_length=1, description="a dated profile (a release as published runs ran it): the shipped "
        "stack that runs its code today; an export given a format and no stack takes an undated stack first")

    @model_validator(mode="after")
    def _a_shipped_successor(self) -> "Stack":
        v = self.superseded_by
        if v is not None and v not in list_stacks():  # the profile folders read only where a successor is named
            raise ValueError(f"superseded_by {v!r} is no shipped stack: name one of {', '.join(list_stacks())}")
        if v == self.name:
            raise ValueError(f"superseded_by names the stack itself ({self.name}): name the stack that runs its code today")
        eng, needs = self.engine, {"sp": "tp", "gpipe": "pp", "interleaved": "pp"}  # a feature that runs on another
        lacking = [f"{f} without {n}" for f, n in needs.items() if f in eng.offers and n not in eng.offers]
        if eng.zero_bubble and "pp" not in eng.offers:
            lacking.append(f"zero_bubble {', '.join(eng.zero_bubble)} without pp")
        if eng.sequence_parallel == "always" and "tp" in eng.offers and "sp" not in eng.offers:
            lacking.append("sequence_parallel always without sp")  # every TP plan would be refused
        if "selective" in eng.checkpointing and eng.selective is None:
            lacking.append("checkpointing selective without engine.selective (what it reruns)")
        for p in eng.precisions or ():  # a precision whose mode no table measures would be refused on every plan
            mode = "half" if (m := Precision(p).mode.value) == "mixed" and eng.module_dtype == "half" else m
            if not all(any(e.mode in (mode, "any") for e in es) for es in (self.kernels.elementwise, self.memory.saved)):
                lacking.append(f"precision {p} without kernels.elementwise and memory.saved entries for mode {mode}")
        if lacking:  # loaded, the search would drop the plans without a word
            raise ValueError(f"engine offers {'; '.join(lacking)}: add what it needs, or drop it")
        return self

    # the --compile values the stack runs and has tables for (torchtitan's compile.components; the Trainer's
    # torch_compile, which compiles the model with its loss inside); empty: eager only
    compile: list[Literal["model", "loss", "model,loss"]] = Field(default_factory=list, max_length=3)
    kernels: Kernels
    memory: Memory
    engine: Engine

    def compile_refusal(self, asked: str) -> Optional[str]:
        """Why the stack does not run ``--compile asked`` (none, model, loss, model,loss), one line; None where it
        does: its profile's ``compile`` lists what its torch.compile can compile (the Trainer, say, compiles the
        model with its loss inside, never one alone)."""
        if asked == "none" or asked in self.compile:
            return None
        if self.compile:
            return (f"--compile {asked}: stack {self.name} compiles {' or '.join(self.compile)} (its profile's compile:): "
                    f"use --compile {self.compile[0]}")
        others = [n for n in list_stacks() if asked in load_stack(n).compile]
        return (f"--compile {asked}: stack {self.name}'s profile has no torch.compile measured: drop it"
                + (f", or use --stack {' or '.join(others)}" if others else ""))

    def mtp_refusal(self, model: Optional[ModelSpec], depths: int) -> Optional[str]:
        """Why the stack does not train ``depths`` multi-token prediction depths (advisor.mtp; on the model, where
        given), one line; None where it does: its profile's engine.mtp."""
        if not depths:
            return None
        if not self.engine.mtp:
            others = [n for n in list_stacks() if load_stack(n).engine.mtp]
            return (f"--mtp-layers {depths}: stack {self.name} does not train multi-token prediction: use --stack "
                    f"{' or '.join(others) or 'one whose profile sets engine.mtp'}, or --mtp-layers 0")
        if model is not None and model.position is not PositionKind.rotary:
            # Megatron-LM arguments.py:856-860: MTP with rope or no position embedding only
            return (f"--mtp-layers {depths}: Megatron trains MTP with rotary positions only, and {model.name} has "
                    f"{model.position.value} positions: use --mtp-layers 0")
        return None

    def _describing(self, what: str, mode: str, attention: str, mlp: str, how: str) -> list[str]:
        """The current shipped stacks (none superseded) whose ``what`` table (kernels.elementwise, memory.saved, ...) has
        an entry for the case."""
        part, key = what.split(".")
        return [n for n in list_stacks() if n != self.name and (st := load_stack(n)).superseded_by is None and any(
            e.matches(mode, attention, mlp, how) for e in getattr(getattr(st, part), key))]

    def tables(self, mode: str, attention: str, layer: DecoderLayer, compile: str = "none") -> "StackTables":
        """Every measured table of this stack resolved for one case and evaluated on one layer's dimensions: eager
        kernels, or those of its torch.compile for the parts ``compile`` names (--compile: model, the blocks; loss)."""
        mlp = layer.mlp.kernels  # GeGLU reads SwiGLU's entries (advisor.model.layer.MLPKind.kernels)
        refusal = self.compile_refusal(compile)
        if refusal:
            raise StackError(refusal)
        parts = compile_parts(compile)

        def pick(entries: list, what: str, part: str = "model"):
            how = "compiled" if part in parts else "eager"
            for e in entries:
                if e.matches(mode, attention, mlp, how):
                    return e
            # the precisions whose mode the stack has measured for this attention and MLP, as --precision names them
            held = [m for m in ("half", "mixed", "fp32") if m != mode and any(e.matches(m, attention, mlp, how) for e in entries)]
            hint = f"use --precision {' or '.join(PRECISIONS_OF_MODE[m] for m in held)}, " if held else ""
            mlps = sorted({e.mlp for e in entries} - {"any"})
            if mlps and mlp not in mlps:  # a profile of one model family (llm-foundry's MPT): its MLPs, not this one
                raise StackError(f"stack {self.name}'s profile describes {' and '.join(mlps)} MLPs only ({what}), not a "
                                 f"{mlp} MLP: use --stack {' or '.join(self._describing(what, mode, attention, mlp, how))}")
            raise StackError(f"stack {self.name} has no {what} entry for mode {mode}, {attention} attention and a "
                             f"{mlp} MLP{' compiled' if how == 'compiled' else ''}: {hint}add one to its profile or "
                             f"choose another --stack")

        k, mem = self.kernels, self.memory
        host, head = pick(k.host, "kernels.host"), pick(k.host_outside_layers, "kernels.host_outside_layers")
        ew, sc = pick(k.elementwise, "kernels.elementwise"), pick(k.attention_scores, "kernels.attention_scores")
        loss, saved = pick(k.loss, "kernels.loss", "loss"), pick(mem.saved, "memory.saved")
        lg = pick(mem.logits, "memory.logits", "loss")
        ew_fwd, ew_bwd, lat = ew.forward, ew.backward, None
        if k.latent and layer.latent is not None:  # MLA's kernels in place of the q/k/v layout terms (Kernels.latent)
            lat = pick(k.latent, "kernels.latent")
            ew_fwd, ew_bwd = ew_fwd.replacing_heads(lat.forward), ew_bwd.replacing_heads(lat.backward)
        full = LayerBytes.of(saved.layer, layer, kv_groups=True)  # the saved k and v: whole KV heads a rank
        selective = (LayerBytes.of(saved.selective, layer, kv_groups=True) if saved.selective is not None
                     else full.without_scores())
        return StackTables(
            host.forward_ops, host.backward_ops, host.cpu_us_per_op, head.forward_ops, head.backward_ops,
            LayerBytes.of(ew_fwd, layer), LayerBytes.of(ew_bwd, layer), sc.forward, sc.backward,
            loss.forward, loss.backward, full, LayerBytes.of(saved.full_recompute, layer, kv_groups=True), selective,
            form_value(saved.outside_layers, layer), saved.attention_mask, lg.held, lg.peak, k.vocab_padding,
            k.attention_efficiency, form_value(saved.norm_weight_inputs, layer), form_value(lg.held_per_token, layer),
            form_value(lg.peak_per_token, layer), lg.peak_per_head_weight,
            LayerBytes.of(lat.forward, layer) if lat is not None else NO_BYTES)



@dataclass(frozen=True)
class StackTables:
    """A stack's tables resolved for one precision mode, attention kernel and model (advisor.stack.Stack.tables)."""

    host_forward_ops: int
    host_backward_ops: int
    cpu_us_per_op: float
    head_forward_ops: int
    head_backward_ops: int
    elementwise_forward: LayerBytes
    elementwise_backward: LayerBytes
    score_forward: float  # bytes per attention score element (eager)
    score_backward: float
    loss_forward: float  # bytes per logit
    loss_backward: float
    saved_layer: LayerBytes
    saved_full_recompute: LayerBytes
    saved_selective: LayerBytes
    saved_outside_layers: float  # per token
    attention_mask: float  # bytes per b x s x s mask element (eager)
    logits_held: float  # bytes per logit
    logits_peak: float
    vocab_padding: int
    attention_efficiency: float
    saved_norm_weight_inputs: float = 0.0  # per token and layer: kept only for trainable norm weights
    logits_held_per_token: float = 0.0  # the loss's bytes per token besides the logits (not split by TP)
    logits_peak_per_token: float = 0.0
    logits_peak_head: float = 0.0  # per element of the LM head's weight on a TP rank
    latent_forward: LayerBytes = NO_BYTES  # MLA's own kernels, forward (Kernels.latent): what mla_up_proj reruns


def stack_dirs() -> list[Path]:
    return [d for d in (STACK_DIR, _PACKAGED_STACK_DIR) if d.is_dir()]


STACKS = ProfileKind("stack profile", stack_dirs, StackError, "advisor stacks", reserved=frozenset({"auto", "any"}))


def list_stacks() -> list[str]:
    return STACKS.names()


def load_stack(name_or_path: str | Path | Stack) -> Stack:
    """A stack profile by built-in name (``megatron-deepspeed``) or by path to a YAML file."""
    if isinstance(name_or_path, Stack):  # built in Python (model_copy skips validation): checked again
        return checked(name_or_path, StackError, f"stack {name_or_path.name}")
    return STACKS.load(name_or_path, Stack)


def stack_from_yaml(text: str, origin: str = "<yaml>", path: str | Path | None = None) -> Stack:
    return STACKS.from_yaml(text, Stack, origin, path)


def stack_to_yaml(stack: Stack) -> str:
    """YAML that ``load_stack`` accepts back unchanged (round trip tested)."""
    return to_yaml(stack)
