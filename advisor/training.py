"""The training setup: what is trained, whatever the parallel plan (micro batch, global batch or gradient
accumulation, sequence length, precision, optimizer, attention kernel, activation recomputation, the stack).

Closed sets are enums. ``Coded`` enums also number their members, so that a table of candidate plans
(advisor.candidates) stores them as small integers and the cost model compares against ``Member.code``.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from advisor.finetune import FULL, FineTune
from advisor.precision import Recipe, recipe
from advisor.spec import ApiSpec


class Name(str, Enum):
    """A str enum that prints as its value ("full", not "Recompute.full"), as the CLI and the configs spell it."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Coded(Name):
    """A str enum whose members also have a fixed integer code (their position), for numpy columns."""

    @property
    def code(self) -> int:
        return list(type(self)).index(self)

    @classmethod
    def of_code(cls, code: int) -> "Coded":
        return list(cls)[int(code)]


class Mode(Name):
    """How a precision holds activations, the key of a stack's measured tables (advisor.stack)."""

    fp32 = "fp32"  # fp32 activations
    mixed = "mixed"  # half-precision activations under mixed precision (autocast, or half weights + fp32 master)
    half = "half"  # pure half precision: half weights, gradients and optimizer states


class Precision(Name):
    fp32 = "fp32"
    bf16_mixed = "bf16-mixed"
    fp16_mixed = "fp16-mixed"
    bf16 = "bf16"
    fp8_mixed = "fp8-mixed"  # the one FP8 switch before issue 21: a TrainingSetup takes it as fp8-delayed (_fp8_switch)
    # low-precision recipes as the stacks run them (advisor.precision: which GEMMs run low, scaling, cast kernels)
    fp8_tensorwise = "fp8-tensorwise"
    fp8_delayed = "fp8-delayed"
    fp8_rowwise = "fp8-rowwise"
    fp8_rowwise_gw_hp = "fp8-rowwise-gw-hp"
    fp8_blockwise = "fp8-blockwise"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"

    @property
    def recipe(self) -> "Optional[Recipe]":
        """The low-precision recipe (advisor.precision), None for the plain precisions and fp8-mixed."""
        return recipe(self.value)

    @property
    def math(self) -> str:
        """The GEMMs' math precision. fp32: PyTorch's default, TF32 off for matmuls
        (torch.backends.cuda.matmul.allow_tf32). A recipe: its format (fp8, fp4) for the GEMMs it runs low."""
        r = self.recipe
        if r is not None:
            return r.format
        return {"fp32": "fp32", "bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "bf16", "fp8-mixed": "fp8"}[self.value]

    @property
    def activation_bytes(self) -> float:
        """Bytes per activation element. fp8: GEMM inputs are cast per GEMM, activations stay bf16
        (Transformer Engine)."""
        return 4.0 if self is Precision.fp32 else 2.0

    @property
    def mode(self) -> Mode:
        if self is Precision.fp32:
            return Mode.fp32
        return Mode.half if self is Precision.bf16 else Mode.mixed

    @property
    def autocast(self) -> bool:
        """Mixed precision, which torch.autocast runs on fp32 weights unless the stack keeps half weights."""
        return self in (Precision.bf16_mixed, Precision.fp16_mixed, Precision.fp8_mixed) or self.recipe is not None


class Optimizer(Name):
    adamw = "adamw"  # torch.optim.AdamW default: foreach implementation
    adamw_fused = "adamw-fused"
    sgd = "sgd"  # with momentum


class Attention(Name):
    sdpa = "sdpa"  # fused flash/memory-efficient kernel: no s x s matrix stored
    eager = "eager"  # softmax(QK^T)V in separate kernels, s x s scores kept for backward


class Recompute(Coded):
    none = "none"
    selective = "selective"  # Korthikanti et al. 2022: recompute the attention core only
    full = "full"  # keep only each layer's input; rerun the layer forward in backward
    # (the policies below: advisor/recompute.py; codes are positions, so they are only ever appended)
    block = "block"  # Megatron --recompute-method block: the first recompute_layers layers of each stage chunk full
    every_k = "every-k"  # every recompute_layers-th layer full, the rest kept (torchtitan's selective layer AC)
    offload = "offload"  # every saved tensor copied to host memory and back (torch.autograd.graph.save_on_cpu)


# megatron-core 0.19 transformer_config.py recompute_modules (--recompute-modules): the sub-modules a selective policy
# may rerun; a stack lists those it costs (engine.selective.modules)
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")


class TrainingSetup(ApiSpec):
    seq_len: int = Field(default=1024, ge=1, le=10_000_000)
    micro_batch: int = Field(default=1, ge=1, le=1_000_000)
    global_batch: Optional[int] = Field(default=None, ge=1, le=1_000_000_000)
    grad_accum: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    precision: Precision = Precision.bf16_mixed
    optimizer: Optional[Optimizer] = None  # None: the stack's default, the first of its engine.optimizers
    attention: Attention = Attention.sdpa
    recompute: Recompute = Recompute.none
    recompute_layers: int = Field(default=1, ge=1, le=100_000, description=(
        "full: layers per checkpointed group (Megatron --recompute-method uniform --recompute-num-layers); block: "
        "layers recomputed per stage chunk; every-k: k"))
    stack: str = Field(default="auto", min_length=1, max_length=4096,
                       description="training stack profile (advisor stacks) or a path to one; auto: see advisor.api")
    finetune: FineTune = FULL  # what is trained: every weight (full), or adapters on a frozen base (advisor.finetune)
    moe_capacity_factor: Optional[float] = Field(
        default=None, gt=0, le=1000, description="mixture of experts: tokens an expert takes at most, as a multiple of "
                                                 "its balanced share (the rest dropped); None: dropless")
    moe_imbalance: float = Field(
        default=1.0, ge=1.0, le=1000, description="mixture of experts: the busiest expert-parallel rank's routed tokens "
                                                  "over the balanced share (1: balanced, as the published benchmarks force)")
    moe_dispatcher: Optional[Literal["alltoall", "flex"]] = Field(
        default=None, description="mixture of experts: the token dispatcher (advisor.parallel.expert); None: the stack's")
    moe_overlap: Optional[Literal["none", "shared_experts", "batch"]] = Field(
        default=None, description="mixture of experts: what the all-to-alls run beside; None: the stack's default")
    compile: Literal["none", "model", "loss", "model,loss"] = Field(default="none", description=(
        "what torch.compile compiles, as the stack applies it (torchtitan's compile.components: model, its blocks; "
        "loss): the profile's compiled tables (kernels fused, what the partitioner saves); none: eager"))
    tp_overlap: Optional[Literal["none", "userbuffers", "async", "linear-async"]] = Field(
        default=None, description="tensor parallelism: the sequence-parallel collectives exposed or pipelined with "
                                  "their GEMMs (advisor.parallel.tensor); None: the stack's default")

    mtp_layers: int = Field(default=0, ge=0, le=64, description=(
        "multi-token prediction depths trained beside the model (Megatron's --mtp-num-layers; advisor.mtp): 0, none"))
    fp8_attention: bool = Field(default=False, description=(
        "the attention core (softmax(QK^T)V) in FP8 under an FP8 recipe (megatron-core's fp8_dot_product_attention, no "
        "Megatron-LM flag: arguments.py:2250; "
        "Transformer Engine's fp8_dpa, advisor.precision.FP8_ATTENTION), where the stack runs it; False: BF16"))
    recompute_modules: Optional[tuple[Literal[RECOMPUTE_MODULES], ...]] = Field(  # type: ignore[valid-type]
        default=None, max_length=len(RECOMPUTE_MODULES), description="selective recomputation: the sub-modules "
        "rerun (Megatron's --recompute-modules); None: the stack's selective policy")

    @field_validator("precision", mode="before")
    @classmethod
    def _fp8_switch(cls, v):
        """fp8-mixed, the one FP8 switch before recipes were inputs, is what every stack's FP8 switch launches:
        Transformer Engine's default recipe, DelayedScaling (accelerate's fp8 with the TE backend, Megatron-LM's
        --fp8-format without --fp8-recipe, Composer's amp_fp8), costed and exported as fp8-delayed."""
        return Precision.fp8_delayed if v == Precision.fp8_mixed else v  # (a str Enum: "fp8-mixed" as well)

    @model_validator(mode="after")
    def _batch(self) -> "TrainingSetup":
        if self.global_batch is not None and self.grad_accum is not None:
            raise ValueError("give --global-batch or --grad-accum, not both")
        if self.recompute_modules is not None and self.recompute is not Recompute.selective:
            raise ValueError(f"--recompute-modules {','.join(self.recompute_modules)} chooses what selective "
                             f"recomputation reruns: add --recompute selective (not {self.recompute.value})")
        if self.recompute_layers != 1 and self.recompute in (Recompute.none, Recompute.selective):
            raise ValueError(f"--recompute-layers {self.recompute_layers} counts the layers of full, block, every-k or "
                             f"offload checkpointing: add one of them (not --recompute {self.recompute.value}) or drop it")
        if self.recompute_modules is not None and len(set(self.recompute_modules)) != len(self.recompute_modules):
            raise ValueError(f"--recompute-modules {','.join(self.recompute_modules)} names a module twice")
        quant = self.finetune.base_quant.value
        if quant != "none" and self.precision.recipe is not None:
            # bitsandbytes 0.49.0 nn/modules.py:555 and :1094: Linear4bit multiplies through bnb.matmul_4bit in its
            # compute dtype (bf16 here), Linear8bitLt through bnb.matmul in int8; an FP8/FP4 recipe converts plain
            # weights (torchao Float8Linear.from_float, Transformer Engine's te.Linear), not a packed quantised one
            raise ValueError(f"--precision {self.precision.value} with a quantised base (--method "
                             f"{self.finetune.method.value}, {quant}): bitsandbytes multiplies it in its compute dtype, "
                             "never in the recipe's format: use --precision bf16-mixed, or --method lora on a bf16 base")
        return self


def compile_parts(text: str) -> tuple[str, ...]:
    """--compile's value (none, model, loss, model,loss) as the parts torch.compile compiles."""
    return () if text == "none" else tuple(text.split(","))
