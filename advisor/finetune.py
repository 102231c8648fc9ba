"""Fine-tuning: full, LoRA and QLoRA as PEFT, torchtune and litgpt run them: the method's parameters, and its
parameter, memory and time parts (the rest of the step is the full model's: advisor.step composes them).

LoRA (Hu et al. 2021, arXiv 2106.09685, s.4.1): each targeted linear W (out x in) keeps W frozen and learns
B A with A: r x in and B: out x r, so it adds r (in + out) trainable parameters (peft/tuners/lora/layer.py
``update_layer``: ``lora_A = nn.Linear(in, r, bias=False)``, ``lora_B = nn.Linear(r, out, bias=False)``); DoRA
(Liu et al. 2024, arXiv 2402.09353) adds a magnitude vector of ``out`` elements per target
(peft/tuners/lora/dora.py ``DoraLinearLayer.weight``). QLoRA (Dettmers et al. 2023, arXiv 2305.14314) keeps the
frozen linears in 4-bit NormalFloat: bitsandbytes quantises blocks of 64 weights, one fp32 absmax per block
(``quantize_4bit(blocksize=64)``), and double quantisation stores those absmax values in 8 bits with one fp32
constant per block of 256 of them (``quantize_blockwise(absmax, blocksize=256)``, bitsandbytes 0.41.1
functional.py); torchao's NF4Tensor (``to_nf4(block_size=64, scaler_block_size=256)``) stores the same.

Target modules are named as the libraries name them and resolved to the layer table's linear layers
(advisor.model.layer): PEFT's Hugging Face module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
down_proj, lm_head; c_attn, query_key_value, dense, fc1/fc2, ... and ``all-linear``), torchtune's
(``lora_attn_modules`` q_proj/k_proj/v_proj/output_proj, ``apply_lora_to_mlp`` w1/w2/w3, ``apply_lora_to_output``)
and litgpt's (``lora_query``, ``lora_key``, ``lora_value``, ``lora_projection``, ``lora_mlp``, ``lora_head``).

Memory (what the step keeps): the frozen base in its dtype (the precision's weight dtype, or int8/NF4 with its
constants), gradients and optimizer states only for the adapters (32-bit, bitsandbytes 8-bit, or on the CPU), a
dequantised weight per quantised linear while it runs, and activations: a frozen linear's input is not saved
(autograd saves ``mm``'s first operand only when the weight needs a gradient: torch's gen_variable_type.py
``guard_for`` -> ``grad_fn->should_compute_output(1)``), except where the quantised matmul saves it anyway
(bitsandbytes 0.41.1 ``MatMul4Bit.forward``: ``ctx.tensors = (A, B)`` whenever an input needs a gradient); each
adapter saves its A input (the dropout's output and mask where ``lora_dropout > 0``, else the base input itself) and
its A output (r elements) for B's gradient.

Time: the base forward and its input-gradient backward still run; the weight-gradient GEMMs run only for the
adapters; the adapters' own thin GEMMs; dequantisation reads the packed weight and writes a bf16 copy per linear
per pass. Deliberately left out: tensor and pipeline parallelism with adapters (refused), the time of a step on
the CPU (offloaded optimizer: adapters are small; a full fine-tune with offload is refused), prefix/prompt tuning
and litgpt's LLaMA-Adapter.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from advisor.errors import AdvisorError
from advisor.spec import Spec

if TYPE_CHECKING:  # pragma: no cover
    from advisor.model import DecoderLayer, ModelSpec

Workload = Any  # advisor.workload.Workload (which imports this module)


class FineTuneError(AdvisorError):
    pass


class Method(str, Enum):
    full = "full"  # every weight trained (pretraining's accounting)
    lora = "lora"
    qlora = "qlora"  # LoRA on a quantised base (NF4 unless --quant says otherwise)

    def __str__(self) -> str:
        return self.value


class Quant(str, Enum):
    none = "none"  # the base in the precision's weight dtype
    int8 = "int8"  # bitsandbytes LLM.int8 (Linear8bitLt): int8 weights, one fp32 scale per output row
    nf4 = "nf4"  # bitsandbytes / torchao NF4, blocks of 64

    def __str__(self) -> str:
        return self.value


class Offload(str, Enum):
    none = "none"
    optimizer = "optimizer"  # DeepSpeed ZeRO-Offload / torchtune's offload_optimizer: states and step on the CPU
    activations = "activations"  # torchtune's enable_activation_offloading (saved tensors to pinned CPU memory)
    both = "optimizer+activations"

    def __str__(self) -> str:
        return self.value


class Library(str, Enum):
    peft = "peft"
    litgpt = "litgpt"
    torchtune = "torchtune"

    def __str__(self) -> str:
        return self.value


# The canonical targets: q, k, v (parts of a fused qkv, each with its own adapter), qkv (a fused projection as one
# linear: GPT-2's c_attn, GPT-NeoX/Falcon/BLOOM's query_key_value), o (attention output), gate, up (Llama's up_proj,
# or a plain MLP's first linear), down (the MLP's last linear), head (the LM head).
LAYER_TARGETS = ("q", "k", "v", "qkv", "o", "gate", "up", "down", "gate_up")  # gate_up: one fused linear (Phi-3)
ALL_LINEAR = ("q", "k", "v", "o", "gate", "up", "down")
ALIASES: dict[str, tuple[str, ...]] = {
    # PEFT / Hugging Face module names (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING and
    # the modeling files' nn.Linear names); "all-linear" = every linear but the output layer (peft tuners_utils.py)
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",), "gate_proj": ("gate",), "up_proj": ("up",),
    "down_proj": ("down",), "lm_head": ("head",), "c_attn": ("qkv",), "query_key_value": ("qkv",), "W_pack": ("qkv",), "Wqkv": ("qkv",),
    "qkv_proj": ("qkv",), "dense": ("o",), "out_proj": ("o",), "c_fc": ("up",), "fc1": ("up",), "fc2": ("down",),
    "c_proj": ("o", "down"),  # GPT-2 names both attn.c_proj and mlp.c_proj so: PEFT's suffix match takes both
    "dense_h_to_4h": ("up",), "dense_4h_to_h": ("down",), "gate_up_proj": ("gate", "up"),
    "all-linear": ALL_LINEAR, "all_linear": ALL_LINEAR,
    # torchtune (torchtune/models/llama2/_component_builders.py lora_llama2: LORA_ATTN_MODULES, w1/w2/w3, output)
    "output_proj": ("o",), "w1": ("gate",), "w2": ("down",), "w3": ("up",), "output": ("head",),
    # litgpt (litgpt/lora.py Config: lora_query, lora_key, lora_value, lora_projection, lora_mlp, lora_head)
    "query": ("q",), "key": ("k",), "value": ("v",), "projection": ("o",), "mlp": ("gate", "up", "down"),
    "head": ("head",),
    # names of our own
    "attention": ("q", "k", "v", "o"), "all-linear+head": ALL_LINEAR + ("head",),
    **{t: (t,) for t in LAYER_TARGETS},
}


def parse_targets(text: str) -> tuple[str, ...]:
    """``q_proj,v_proj``, ``all-linear``, ``query,value,head``, ``q_proj,output_proj,w1,w2,w3,output`` -> the
    canonical targets, sorted; a name none of the libraries use is a one-line error listing them."""
    out: set[str] = set()
    if "," in str(text) and any(not item.strip() for item in str(text).split(",")):  # "q_proj,,v_proj": a slip
        raise ValueError(f"--lora-targets {str(text)!r} has an empty item: name a module between each pair of commas, "
                         "e.g. q_proj,v_proj")
    for name in str(text).replace(",", " ").split():  # "q_proj, v_proj" and "q_proj v_proj" as well
        key = name if name in ALIASES else name.lower()
        if key not in ALIASES:
            raise ValueError(f"unknown LoRA target {name!r}: use PEFT's module names (q_proj, k_proj, v_proj, o_proj, "
                             "gate_proj, up_proj, down_proj, lm_head, c_attn, query_key_value, dense, fc1, fc2, "
                             "all-linear), torchtune's (output_proj, w1, w2, w3, output) or litgpt's (query, key, "
                             "value, projection, mlp, head)")
        out.update(ALIASES[key])
    if not out:
        raise ValueError("no LoRA target given: e.g. --lora-targets q_proj,v_proj or all-linear")
    return tuple(sorted(out))


# the adapters' own options at their defaults (FineTune's fields): a full fine-tune takes none of them
ADAPTER_DEFAULTS = {"lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "targets": "q,v"}


class FineTune(Spec):
    """What is trained, and how the frozen base and the optimizer are held."""

    method: Method = Method.full
    lora_rank: int = Field(default=8, ge=1, le=65536)  # PEFT LoraConfig r=8, litgpt lora_r=8
    lora_alpha: float = Field(default=16.0, gt=0, le=1e6)  # litgpt's 16 (PEFT's default is 8): scaling only, no cost
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0)  # PEFT's default 0.0 (litgpt's 0.05)
    # canonical targets, comma-separated (any library's names are accepted): PEFT's Llama default (q_proj, v_proj)
    # and litgpt's (query, value)
    targets: str = "q,v"
    dora: bool = False
    quant: Quant | None = None  # None: nf4 for qlora, none otherwise
    double_quant: bool = True  # bitsandbytes bnb_4bit_use_double_quant (QLoRA paper s.3)
    optimizer_8bit: bool = False  # bitsandbytes AdamW8bit / PagedAdamW8bit
    paged: bool = False  # bitsandbytes paged optimizer: states in CUDA unified memory, evicted under pressure
    offload: Offload = Offload.none
    # whose adapter code runs it: peft (one LoRA module and dropout per targeted nn.Linear; bitsandbytes
    # quantisation; lm_head kept unquantised), litgpt (LoRAQKVLinear: one dropout and A for the fused qkv; every
    # nn.Linear quantised, the head too: lightning BitsandbytesPrecision; chunked logits and loss), torchtune
    # (torchao NF4, whose linear_nf4 saves no input; CEWithChunkedOutputLoss in 8 chunks)
    library: Library = Library.peft

    @field_validator("targets", mode="before")
    @classmethod
    def _targets(cls, v):
        return ",".join(parse_targets(",".join(v) if isinstance(v, (list, tuple)) else v))

    @model_validator(mode="after")
    def _consistent(self) -> FineTune:
        if self.method is Method.full and self.quant not in (None, Quant.none):
            raise ValueError(f"--quant {self.quant} freezes a quantised base: use --method qlora (or lora with "
                             "--quant int8)")
        if self.method is Method.qlora and self.quant is Quant.none:
            raise ValueError("--method qlora quantises the base: give --quant nf4 or int8, or use --method lora")
        if self.method is Method.full:  # adapter options given to a full fine-tune would be silently ignored
            given = [f"--{'lora-targets' if k == 'targets' else k.replace('_', '-')}" for k, d in ADAPTER_DEFAULTS.items()
                     if getattr(self, k) != d]
            if given:
                raise ValueError(f"{', '.join(given)} describe{'s' if len(given) == 1 else ''} LoRA adapters, which "
                                 "--method full does not train: use --method lora or qlora, or drop them")
        if self.method is Method.full and self.dora:
            raise ValueError("--dora is a LoRA variant: use --method lora or qlora")
        if self.method is Method.full and (self.optimizer_8bit or self.paged):  # costed on the adapters' states alone
            flags = " and ".join(f for f, on in (("--optimizer-8bit", self.optimizer_8bit), ("--paged", self.paged)) if on)
            raise ValueError(f"{flags}: bitsandbytes' optimizer is costed for LoRA and QLoRA adapters, not a full "
                             "fine-tune: use --method lora or qlora, or drop it")
        if self.method is Method.full and self.offload in (Offload.optimizer, Offload.both):
            raise ValueError("--adapter-offload optimizer of a full fine-tune is not costed: use --offload optimizer-cpu "
                             "(ZeRO-Offload) or --method lora/qlora")
        return self

    @property
    def target_set(self) -> tuple[str, ...]:
        return tuple(self.targets.split(","))

    @property
    def adapters(self) -> bool:
        return self.method is not Method.full

    @property
    def kind(self) -> str:
        """What a stack must run for it (engine.methods): full, lora (a half-precision base) or qlora (a quantised one:
        bitsandbytes or torchao, int8 LoRA included)."""
        return "full" if not self.adapters else "lora" if self.base_quant is Quant.none else "qlora"

    @property
    def base_quant(self) -> Quant:
        if self.quant is not None:
            return self.quant
        return Quant.nf4 if self.method is Method.qlora else Quant.none

    @property
    def offloads_optimizer(self) -> bool:
        return self.offload in (Offload.optimizer, Offload.both)

    @property
    def offloads_activations(self) -> bool:
        return self.offload in (Offload.activations, Offload.both)


FULL = FineTune()


def _linear(layer: DecoderLayer, *names: str):
    for lin in layer.linears:
        if lin.name in names:
            return lin
    return None


def target_shapes(layer: DecoderLayer, targets: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(target, in features, out features) of each adapted linear of one layer. q, k and v adapt their slices of a
    fused qkv separately (PEFT on q_proj/k_proj/v_proj; litgpt's LoRAQKVLinear enables each slice: one r x in A and
    one out_slice x r B per enabled slice); qkv adapts the fused projection as one linear."""
    qkv = _linear(layer, "attention/qkv")
    if qkv is None:
        raise FineTuneError("LoRA is costed for layers with one q/k/v projection; this model's attention (latent or "
                            "split projections) is not mapped to adapters yet")
    kv = int(round(layer.kv_dim))
    slices = {"q": layer.q_dim, "k": kv, "v": kv, "qkv": qkv.n_out}
    up = _linear(layer, "mlp/up", "mlp/fc")
    found = {"o": _linear(layer, "attention/out"), "gate": _linear(layer, "mlp/gate"), "up": up,
             "down": _linear(layer, "mlp/down", "mlp/proj")}
    out = []
    for t in targets:
        if t == "head":
            continue
        if t == "gate_up" and found["gate"] is not None and up is not None:  # gate and up as one linear, one adapter
            out.append((t, up.n_in, found["gate"].n_out + up.n_out))
        elif t in slices:
            out.append((t, qkv.n_in, slices[t]))
        elif found.get(t) is not None:
            lin = found[t]
            out.append((t, lin.n_in, lin.n_out))
    return out


def _check_targets(model: ModelSpec, ft: FineTune) -> None:
    layer = model.layer
    if layer.routed:
        raise FineTuneError(f"--method {ft.method}: adapters on {model.name}, a mixture of experts, are not costed "
                            f"(on any target, attention too: --lora-targets {ft.targets}); use --method full")
    if not target_shapes(layer, ft.target_set) and "head" not in ft.target_set:
        raise FineTuneError(f"none of the LoRA targets {ft.targets} exists in {model.name} "
                            "(a plain MLP has no gate)")
    if ft.lora_rank > model.d_model:  # A is r x in, B out x r: past the width they adapt, more adapter than weight
        raise FineTuneError(f"--lora-rank {ft.lora_rank} is above {model.name}'s hidden size {model.d_model}: a rank "
                            f"that wide adapts nothing a full fine-tune would not; give at most {model.d_model} "
                            "(ranks of 8-256 are usual)")


def adapter_params_per_layer(layer: DecoderLayer, ft: FineTune) -> int:
    """Trainable parameters of one layer's adapters: r (in + out) per target, + out with DoRA's magnitude."""
    r = ft.lora_rank
    return sum(r * (n_in + n_out) + (n_out if ft.dora else 0) for _, n_in, n_out in target_shapes(layer, ft.target_set))


# bitsandbytes pages a state only for a tensor of >= 1e5 elements (optim/optimizer.py Optimizer8bit.get_state_buffer),
# in CUDA unified memory (functional.get_paged: cudaMallocManaged), outside PyTorch's allocator and max_memory_allocated
PAGED_MIN_ELEMENTS = 100_000


def paged_params(model: ModelSpec, ft: FineTune) -> int:
    """The adapters' parameters whose states a paged optimizer (--paged) keeps in unified memory, evicted to the host
    under memory pressure: each A (r x in) and B (out x r) of at least PAGED_MIN_ELEMENTS elements."""
    r, big = ft.lora_rank, lambda n: n if n >= PAGED_MIN_ELEMENTS else 0
    per = sum(big(r * n_in) + big(r * n_out) for _, n_in, n_out in target_shapes(model.layer, ft.target_set))
    head = big(r * model.d_model) + big(r * model.vocab) if "head" in ft.target_set else 0
    return model.n_layers * per + head if ft.adapters and ft.paged else 0


def head_adapter_params(model: ModelSpec, ft: FineTune) -> int:
    if "head" not in ft.target_set:
        return 0
    return ft.lora_rank * (model.d_model + model.vocab) + (model.vocab if ft.dora else 0)


def trainable_params(model: ModelSpec, ft: FineTune) -> int:
    """What PEFT's ``get_nb_trainable_parameters()`` reports (every parameter for a full fine-tune)."""
    if not ft.adapters:
        return model.n_params
    _check_targets(model, ft)
    return model.n_layers * adapter_params_per_layer(model.layer, ft) + head_adapter_params(model, ft)


def quantised_weights(model: ModelSpec, ft: FineTune, head_quantised: bool) -> int:
    """Weights held quantised: every linear of the layers (bitsandbytes replaces each nn.Linear; HF keeps lm_head in
    its dtype: llm_int8_skip_modules), and the head where the stack quantises it (litgpt converts every nn.Linear)."""
    if ft.base_quant is Quant.none:
        return 0
    layers = model.n_layers * sum(lin.weights for lin in model.layer.linears)
    return layers + (model.vocab * model.d_model if head_quantised else 0)


def quant_bytes_per_weight(ft: FineTune, n_in: int = 4096) -> float:
    """Bytes per quantised weight with its constants (module docstring)."""
    q = ft.base_quant
    if q is Quant.nf4:
        if ft.double_quant:  # 4 bits, an 8-bit absmax per 64, an fp32 constant per 64 x 256
            return 0.5 + 1.0 / 64 + 4.0 / (64 * 256)
        return 0.5 + 4.0 / 64  # 4 bits and an fp32 absmax per block of 64
    if q is Quant.int8:  # bitsandbytes Int8Params: int8 weight + SCB, one fp32 per output row
        return 1.0 + 4.0 / n_in
    return 0.0


def half_base(ft: FineTune, precision: Any, stack: Any = None) -> bool:
    """Whether a mixed-precision adapter run holds its frozen base in half precision: PEFT's recipes load the model
    with ``torch_dtype=torch.bfloat16`` and train the adapters in fp32 under autocast (peft ``autocast_adapter_dtype``
    casts them up), torchtune loads bf16; litgpt's bf16-mixed keeps fp32 weights (Lightning's MixedPrecision casts
    nothing: its tutorial's bf16-mixed LoRA rows use ~2.8x the memory of bf16-true), and so does a ``stack`` whose
    engine.adapter_base is "params" (torchtitan 0.3.0's base in training.dtype float32). Activations
    then flow in half precision as in the stack's half mode (the residual stream is the base's dtype)."""
    own = stack is not None and stack.engine.adapter_base == "params"
    return ft.adapters and precision.autocast and ft.library is not Library.litgpt and not own


def head_quantised(ft: FineTune) -> bool:
    return ft.library is Library.litgpt


# bitsandbytes' 8-bit optimizers hold each state in 8 bits with one fp32 absmax per block of 2048 elements
# (optim/optimizer.py Optimizer8bit; functional.optimizer_update_8bit_blockwise, blocksize 2048)
STATE_8BIT_BYTES = 1.0 + 4.0 / 2048


def weight_grad_share(w: Workload) -> float:
    """The base GEMMs' weight gradients: 1 (a full fine-tune computes them) or 0 (frozen)."""
    return 0.0 if w.finetune.adapters else 1.0
