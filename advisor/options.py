"""The options of ``advisor estimate`` / ``export`` and ``advisor plan``, validated once at the boundary, for the
command line and the Python API alike: a wrong type, a fractional GPU count, a boolean for a number, a numpy
integer that would overflow, a misspelt keyword or two options that contradict each other are one line of
``AdvisorError`` naming the option and the fix, never a Python TypeError from deep inside.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import Field, field_validator, model_validator

from advisor.errors import AdvisorError, format_validation_error, plain
from advisor.spec import Spec

MAX_WORLD = 10_000_000  # the largest cluster the search accepts (10x today's largest training clusters)


class OptionError(AdvisorError):
    pass


class _Options(Spec):
    @field_validator("*", mode="before")
    @classmethod
    def _numpy_scalars(cls, v):
        """numpy scalars (np.uint8(8), np.float64(8.5), np.bool_) as the Python values they hold, checked as those."""
        return v.item() if isinstance(v, np.generic) else v

    @field_validator("lora_targets", mode="before", check_fields=False)
    @classmethod
    def _target_list(cls, v):
        """LoRA targets as PEFT's target_modules list (["q_proj", "v_proj"]) as well as the command line's "q_proj,v_proj"."""
        return ",".join(v) if isinstance(v, (list, tuple)) and all(isinstance(t, str) for t in v) else v

    @classmethod
    def of(cls, values: dict[str, Any], unknown: dict[str, Any], what: str):
        """Validated options, or one line naming the first bad one (and, for a misspelt keyword, the close ones)."""
        for key in unknown:
            close = difflib.get_close_matches(key, list(cls.model_fields), n=2, cutoff=0.6)
            hint = f": did you mean {' or '.join(close)}?" if close else f" (it takes {', '.join(cls.model_fields)})"
            raise OptionError(f"{what}: unknown option {key!r}{hint}")
        try:
            return cls(**values)
        except Exception as exc:  # pydantic's ValidationError, as one line naming the option as the CLI spells it
            raise OptionError(f"{what}: {_first_error(exc)}") from None


def _first_error(exc: Exception) -> str:
    """``--gpus must be at least 1 (got 0)``: the first problem, in the words of a bound where pydantic has one."""
    errors = getattr(exc, "errors", None)
    if not callable(errors) or not errors():
        return format_validation_error(exc)
    err = errors()[0]
    loc = err.get("loc") or ()
    name = f"--{str(loc[0]).replace('_', '-')} " if loc else ""
    ctx, kind = err.get("ctx") or {}, err.get("type", "")
    words = {"greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
             "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
             "finite_number": "must be a finite number"}
    if kind in words:  # bounds with separators, never as 1e+18 (--tokens' le=1e18)
        msg = words[kind].format(**{k: plain(v, ",") for k, v in ctx.items()})
    else:
        msg = format_validation_error(exc).partition(": ")[2] if loc else format_validation_error(exc)
        return f"{name.strip()}: {msg}" if loc else msg
    return f"{name}{msg} (got {plain(err.get('input'))})"


class Common(_Options):
    gpus: Optional[int] = Field(default=None, ge=1, le=MAX_WORLD)
    nodes: Optional[int] = Field(default=None, ge=1, le=MAX_WORLD)
    seq: Optional[int] = Field(default=None, ge=1, le=10_000_000)
    global_batch: Optional[int] = Field(default=None, ge=1, le=1_000_000_000)
    precision: Optional[str] = None
    attention: str = "sdpa"
    optimizer: Optional[str] = None  # None: the stack's default (engine.optimizers, its default first)
    stack: Union[str, Any] = "auto"
    allow_tp_across_nodes: bool = False
    # fine-tuning (advisor.finetune): the method and its adapters
    method: str = "full"
    lora_rank: int = Field(default=8, ge=1, le=65536)
    lora_alpha: float = Field(default=16.0, gt=0, le=1e6)
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    lora_targets: Optional[str] = None
    dora: bool = False
    quant: Optional[str] = None
    double_quant: bool = True
    optimizer_8bit: bool = False
    paged: bool = False
    adapter_offload: str = "none"  # a fine-tune's CPU offload (torchtune, DeepSpeed); plans' --offload is advisor.parallel.offload's
    lora_library: Optional[str] = None  # None: the stack's own (engine.adapter_library), PEFT's where none is named

    def finetune(self, method: Optional[str] = None, model=None, library: str = "peft"):
        """The FineTune these options describe (``method`` overrides theirs: plan's ``auto`` tries each; ``library``:
        the stack's adapter code where --lora-library is not given); without --lora-targets, PEFT's own default for the
        ``model``'s family (advisor.peft_modules: its fused qkv on GPT-2, Falcon, BLOOM, MPT) where PEFT adapts it,
        else q and v."""
        from advisor.finetune import FineTune
        from advisor.peft_modules import default_targets

        library = self.lora_library or library
        given = dict(method=method or self.method, lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                     lora_dropout=self.lora_dropout, dora=self.dora, quant=self.quant, double_quant=self.double_quant,
                     optimizer_8bit=self.optimizer_8bit, paged=self.paged, offload=self.adapter_offload,
                     library=library)
        if self.lora_targets is not None:
            given["targets"] = self.lora_targets
        elif model is not None and library == "peft" and given["method"] in ("lora", "qlora"):
            given["targets"] = default_targets(model)
        return FineTune(**given)
    moe_capacity_factor: Optional[float] = Field(default=None, gt=0, le=1000)
    moe_imbalance: float = Field(default=1.0, ge=1.0, le=1000)
    moe_dispatcher: Optional[Literal["alltoall", "flex"]] = None
    moe_overlap: Optional[Literal["none", "shared-experts", "shared_experts", "batch"]] = None
    tp_overlap: Optional[Literal["none", "userbuffers", "async", "linear-async"]] = None
    compile: Literal["none", "model", "loss", "model,loss"] = "none"
    mtp_layers: int = Field(default=0, ge=0, le=64)
    fp8_attention: bool = False


class EstimateOptions(Common):
    """``advisor estimate``'s options (and ``export``'s)."""

    dp: Optional[int] = Field(default=None, ge=1, le=MAX_WORLD)
    tp: int = Field(default=1, ge=1, le=1_000_000)
    pp: int = Field(default=1, ge=1, le=1_000_000)
    zero: Optional[int] = Field(default=None, ge=0, le=3)
    fsdp: Optional[Literal["full-shard", "shard-grad-op", "hybrid-shard", "no-shard"]] = None
    sp: Optional[bool] = None  # None: the stack's default (engine.sequence_parallel)
    schedule: str = "1f1b"
    virtual_stages: Optional[int] = Field(default=None, ge=1, le=1024)
    cp: int = Field(default=1, ge=1, le=1_000_000)
    cp_comm: Optional[Literal["ring", "all-gather", "ulysses"]] = None
    pp_split: Literal["even", "edges"] = "even"
    micro_batch: int = Field(default=1, ge=1, le=1_000_000)
    grad_accum: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    recompute: str = "none"
    recompute_layers: int = Field(default=1, ge=1, le=100_000)
    recompute_modules: Optional[str] = Field(default=None, min_length=1, max_length=200)
    offload: str = "none"
    overlap_grad_reduce: Optional[bool] = None
    data_parallel: str = "ddp"
    ep: int = Field(default=1, ge=1, le=1_000_000)
    etp: Optional[int] = Field(default=None, ge=1, le=1_000_000)

    @model_validator(mode="after")
    def _no_contradiction(self) -> "EstimateOptions":
        from advisor.layout import FSDP_TO_ZERO

        if self.fsdp is not None and self.zero is not None and self.zero != FSDP_TO_ZERO[self.fsdp]:
            raise ValueError(f"--zero {self.zero} contradicts --fsdp {self.fsdp} (ZeRO-{FSDP_TO_ZERO[self.fsdp]}): "
                             "give one of them")
        if self.cp_comm is not None and self.cp == 1:
            raise ValueError(f"--cp-comm {self.cp_comm} needs --cp > 1 (one rank holds the whole sequence)")
        from advisor.layout import TWO_CHUNK_SCHEDULES

        chunks = 2 if self.schedule in TWO_CHUNK_SCHEDULES else 1  # a plan's JSON reports ZB-V's and DualPipeV's 2
        if self.virtual_stages not in (None, chunks) and self.schedule != "interleaved":
            raise ValueError(f"--virtual-stages {self.virtual_stages} needs --schedule interleaved "
                             f"(the {self.schedule} schedule has {'two model chunks' if chunks == 2 else 'one model chunk'}"
                             " per pipeline rank)")
        if self.global_batch is not None and self.grad_accum is not None:
            raise ValueError("give --global-batch or --grad-accum, not both")
        return self


# The share of GPU memory a search keeps free beyond the modelled overheads (--memory-headroom), and with which the
# stack auto picks for a plan decides whether the model fits one GPU, in plan and estimate alike (api.plan_stack)
DEFAULT_HEADROOM = 0.05


class PlanOptions(Common):
    """``advisor plan``'s options."""

    gpus: Optional[Union[int, tuple[int, int]]] = None  # a count, or (lo, hi) for the ladder lo, 2 lo, ... <= hi
    memory_headroom: float = Field(default=DEFAULT_HEADROOM, ge=0.0, lt=1.0)
    objective: Literal["time", "throughput", "memory", "cost"] = "time"
    top: int = Field(default=10, ge=1, le=10_000_000)
    tokens: Optional[float] = Field(default=None, ge=1, le=1e18, description="a token budget to train")
    cp: Optional[int] = Field(default=None, ge=1, le=1_000_000, description="only plans of this context-parallel degree")
    # as estimate's (EstimateOptions): only selective plans, rerunning these; every expert-parallel plan at this etp
    recompute_modules: Optional[str] = Field(default=None, min_length=1, max_length=200)
    etp: Optional[int] = Field(default=None, ge=1, le=1_000_000, description="expert tensor parallelism fixed")

    @field_validator("gpus", mode="before")
    @classmethod
    def _range(cls, v):
        if isinstance(v, float):
            if not v.is_integer():
                raise ValueError("must be a whole number of GPUs")
            v = int(v)
        if isinstance(v, str) and ":" not in v:
            try:
                return int(v)
            except ValueError:
                raise ValueError("must be a whole number of GPUs, or a range A:B such as 64:1024") from None
        if isinstance(v, str):
            lo, _, hi = v.partition(":")
            try:
                v = (int(lo), int(hi))
            except ValueError:
                raise ValueError(f"{v!r} is not a range of GPU counts: give A:B, e.g. 64:1024") from None
        if isinstance(v, (tuple, list)):
            if len(v) != 2 or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) for x in v):
                raise ValueError("a range of GPU counts is two whole numbers, e.g. 64:1024")
            lo, hi = (int(x) for x in v)
            if not 1 <= lo <= hi <= MAX_WORLD:
                raise ValueError(f"{lo}:{hi}: give 1 <= A <= B <= {MAX_WORLD:,}")
            return (lo, hi)
        return v

    @field_validator("gpus", mode="after")
    @classmethod
    def _count(cls, v):
        if isinstance(v, int) and not 1 <= v <= MAX_WORLD:
            raise ValueError(f"must be a GPU count in [1, {MAX_WORLD:,}]")
        return v

    @field_validator("tokens", mode="before")
    @classmethod
    def _budget(cls, v):
        return parse_count(v) if isinstance(v, str) else v


SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_count(text: str) -> float:
    """``1T``, ``300B``, ``2.5e12``, ``500M`` as a number (K, M, B or G, T, P: powers of 1000)."""
    t = text.strip().upper()
    scale = SUFFIXES.get(t[-1:], 1.0)
    try:
        return float(t[:-1] if t[-1:] in SUFFIXES else t) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a token count: give e.g. 1T, 300B, 2.5e12") from None


def stack_name(stack) -> str:
    """A --stack value's name (a Stack object's own)."""
    return stack if isinstance(stack, str) else getattr(stack, "name", str(stack))


def moe_setup(o) -> dict:
    """The routing, all-to-all, TP-overlap and torch.compile options of a TrainingSetup, from estimate's or plan's."""
    overlap = o.moe_overlap.replace("-", "_") if o.moe_overlap else None
    return dict(moe_capacity_factor=o.moe_capacity_factor, moe_imbalance=o.moe_imbalance, compile=o.compile,
                moe_dispatcher=o.moe_dispatcher, moe_overlap=overlap, tp_overlap=o.tp_overlap, mtp_layers=o.mtp_layers,
                fp8_attention=o.fp8_attention)


def modules_of(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """--recompute-modules' comma-separated names; one that megatron-core does not name is refused here, as the option
    is spelt (TrainingSetup's own error named its field, "recompute_modules.0")."""
    from advisor.training import RECOMPUTE_MODULES

    if text is None:
        return None
    names = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in names if m not in RECOMPUTE_MODULES]
    if unknown:
        raise OptionError(f"--recompute-modules {text}: unknown sub-module {unknown[0]!r}: use "
                          f"{', '.join(RECOMPUTE_MODULES)} (megatron-core's --recompute-modules names)")
    return names
