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
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
from pydantic import Field, field_validator, model_validator

from advisor.errors import AdvisorError
from advisor.spec import Spec

if TYPE_CHECKING:  # pragma: no cover
    from advisor.model import DecoderLayer, ModelSpec
    from advisor.workload import Workload


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
LAYER_TARGETS = ("q", "k", "v", "qkv", "o", "gate", "up", "down")
ALL_LINEAR = ("q", "k", "v", "o", "gate", "up", "down")
ALIASES: dict[str, tuple[str, ...]] = {
    # PEFT / Hugging Face module names (peft/utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING and
    # the modeling files' nn.Linear names); "all-linear" = every linear but the output layer (peft tuners_utils.py)
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",), "gate_proj": ("gate",), "up_proj": ("up",),
    "down_proj": ("down",), "lm_head": ("head",), "c_attn": ("qkv",), "query_key_value": ("qkv",), "W_pack": ("qkv",),
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
    for raw in str(text).replace(" ", ",").split(","):
        name = raw.strip()
        if not name:
            continue
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
    quant: Optional[Quant] = None  # None: nf4 for qlora, none otherwise
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
    def _consistent(self) -> "FineTune":
        if self.method is Method.full and self.quant not in (None, Quant.none):
            raise ValueError(f"--quant {self.quant} freezes a quantised base: use --method qlora (or lora with "
                             "--quant int8)")
        if self.method is Method.qlora and self.quant is Quant.none:
            raise ValueError("--method qlora quantises the base: give --quant nf4 or int8, or use --method lora")
        if self.method is Method.full and self.dora:
            raise ValueError("--dora is a LoRA variant: use --method lora or qlora")
        if self.method is Method.full and self.offload in (Offload.optimizer, Offload.both):
            raise ValueError("--offload optimizer of a full fine-tune (ZeRO-Offload's CPU step) is not costed yet: "
                             "use --method lora/qlora or drop --offload")
        return self

    @property
    def target_set(self) -> tuple[str, ...]:
        return tuple(self.targets.split(","))

    @property
    def adapters(self) -> bool:
        return self.method is not Method.full

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


# --- parameters ------------------------------------------------------------------------------------------------
def _linear(layer: "DecoderLayer", *names: str):
    for lin in layer.linears:
        if lin.name in names:
            return lin
    return None


def target_shapes(layer: "DecoderLayer", targets: tuple[str, ...]) -> list[tuple[str, int, int]]:
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
        if t in slices:
            out.append((t, qkv.n_in, slices[t]))
        elif found.get(t) is not None:
            lin = found[t]
            out.append((t, lin.n_in, lin.n_out))
    return out


def _check_targets(model: "ModelSpec", ft: FineTune) -> None:
    layer = model.layer
    if layer.routed:
        raise FineTuneError("LoRA on mixture-of-experts layers is not costed")
    if not target_shapes(layer, ft.target_set) and "head" not in ft.target_set:
        raise FineTuneError(f"none of the LoRA targets {ft.targets} exists in {model.name} "
                            "(a plain MLP has no gate)")


def adapter_params_per_layer(layer: "DecoderLayer", ft: FineTune) -> int:
    """Trainable parameters of one layer's adapters: r (in + out) per target, + out with DoRA's magnitude."""
    r = ft.lora_rank
    return sum(r * (n_in + n_out) + (n_out if ft.dora else 0) for _, n_in, n_out in target_shapes(layer, ft.target_set))


def head_adapter_params(model: "ModelSpec", ft: FineTune) -> int:
    if "head" not in ft.target_set:
        return 0
    return ft.lora_rank * (model.d_model + model.vocab) + (model.vocab if ft.dora else 0)


def trainable_params(model: "ModelSpec", ft: FineTune) -> int:
    """What PEFT's ``get_nb_trainable_parameters()`` reports (every parameter for a full fine-tune)."""
    if not ft.adapters:
        return model.n_params
    _check_targets(model, ft)
    return model.n_layers * adapter_params_per_layer(model.layer, ft) + head_adapter_params(model, ft)


def quantised_weights(model: "ModelSpec", ft: FineTune, head_quantised: bool) -> int:
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


def half_base(ft: FineTune, precision: Any) -> bool:
    """Whether a mixed-precision adapter run holds its frozen base in half precision: PEFT's recipes load the model
    with ``torch_dtype=torch.bfloat16`` and train the adapters in fp32 under autocast (peft ``autocast_adapter_dtype``
    casts them up), torchtune loads bf16; litgpt's bf16-mixed keeps fp32 weights (Lightning's MixedPrecision casts
    nothing: its tutorial's bf16-mixed LoRA rows use ~2.8x the memory of bf16-true). Activations then flow in half
    precision as in the stack's half mode (the residual stream is the base's dtype)."""
    return ft.adapters and precision.autocast and ft.library is not Library.litgpt


def head_quantised(ft: FineTune) -> bool:
    return ft.library is Library.litgpt


def quant_saves_input(ft: FineTune) -> bool:
    """bitsandbytes 0.41.1 MatMul4Bit keeps the input A for backward whenever an input needs a gradient (module
    docstring); torchao's linear_nf4 (torchao/dtypes/nf4tensor.py ``LinearNF4``) keeps only the NF4 weight."""
    return ft.base_quant is not Quant.none and ft.library is not Library.torchtune


# bitsandbytes' 8-bit optimizers hold each state in 8 bits with one fp32 absmax per block of 2048 elements
# (bitsandbytes/optim/optimizer.py Optimizer8bit, ``percentile_clipping``-free blockwise update:
# functional.optimizer_update_8bit_blockwise, blocksize 2048)
STATE_8BIT_BYTES = 1.0 + 4.0 / 2048


# --- memory ------------------------------------------------------------------------------------------------------
def model_states(w: "Workload", c: Any, mesh: Any, layers: Any, full: Any) -> Any:
    """The ModelStates of a LoRA/QLoRA step (module docstring), from the full fine-tune's ``full`` (the same plan):
    base weights frozen in their dtype or quantised, gradients and optimizer states for the adapters alone."""
    from dataclasses import replace

    from advisor import optimizer
    from advisor.training import Optimizer

    ft, m = w.finetune, w.model
    zero, shard = np.asarray(c.zero), mesh.dp_shard
    wb, gb = full.weight_bytes, full.grad_bytes
    half = half_base(ft, w.precision)
    base_wb = 2.0 if half else wb  # the frozen base's bytes per weight; the adapters keep wb (fp32 under autocast)
    n_params = full.params  # tp = pp = 1 (adapters refuse both): every parameter of the model
    quant = float(quantised_weights(m, ft, head_quantised(ft)))
    qb = quant_bytes_per_weight(ft, m.d_model)
    per_layer = float(adapter_params_per_layer(m.layer, ft))
    trainable = m.n_layers * per_layer + head_adapter_params(m, ft)
    base = (n_params - quant) * base_wb + quant * qb
    stored = base / n_params  # bytes per base parameter as held (and as ZeRO-3 gathers it)
    z3 = np.where(zero >= 3, shard, 1.0)
    if ft.offloads_optimizer:
        states = np.zeros(np.shape(z3))
    elif ft.optimizer_8bit and w.optimizer is not Optimizer.sgd:
        states = trainable * (2.0 * STATE_8BIT_BYTES + np.where(full.master, 4.0, 0.0)) / shard
    else:
        states = trainable * optimizer.state_bytes(w, full.master) / shard
    p_layer = float(m.layer.n_params)
    gathered = np.where(zero >= 3, np.minimum(2.0 * p_layer * stored, base * (1.0 - 1.0 / shard)), 0.0)
    if ft.library is Library.litgpt:
        # litgpt's finetune scripts load the checkpoint after fabric.setup_module: Fabric's FSDP load_raw loads a full
        # state dict under _get_full_state_dict_context(rank0_only=False) (lightning/fabric/strategies/fsdp.py
        # _load_raw_module_state), so every rank holds every weight unsharded beside its own shard once, at start
        gathered = np.where((zero >= 3) & (shard > 1), np.maximum(gathered, base), gathered)
    grads = trainable * gb / np.where(zero >= 2, shard, 1.0)
    ddp = np.asarray(full.bucket_copy) > 0
    return replace(
        full, grad_params=trainable, weight_bytes=stored, weights=(base + trainable * wb) / z3, grads=grads,
        optimizer_states=states, gathered=gathered + dequant_buffer(w) + np.zeros(np.shape(z3)),
        grad_buffer=np.where(zero >= 2, per_layer * gb, 0.0),
        bucket_copy=np.where(ddp, trainable * gb, 0.0),
        autocast_copy=0.0 if half else optimizer.autocast_weights(w, full.master) * (n_params - quant) * 2.0,
        step_temporaries=0.0 if ft.offloads_optimizer else optimizer.step_temporaries(w, trainable / shard),
        head_grads=np.minimum(head_adapter_params(m, ft) * gb, grads))


def dequant_buffer(w: "Workload") -> float:
    """Bytes of the half-precision weight a quantised linear dequantises into while its GEMM runs (bitsandbytes
    ``F.dequantize_4bit(B, state).to(A.dtype)`` in MatMul4Bit forward and backward; torchao ``weight.to(dtype)``),
    one linear at a time; DoRA also builds W + s B A to take its column norm (peft dora.py ``get_weight_norm``)."""
    ft = w.finetune
    biggest = max(lin.weights for lin in w.layer.linears)
    if head_quantised(ft):
        biggest = max(biggest, w.model.vocab * w.model.d_model)
    out = biggest * 2.0 if ft.base_quant is not Quant.none else 0.0
    if ft.dora:
        out += max(n_in * n_out for _, n_in, n_out in target_shapes(w.layer, ft.target_set)) * 2.0
    return out


def _module_inputs(w: "Workload") -> dict[str, tuple[int, int]]:
    """Per layer-table module (qkv, out, fc1, fc2): (input width, copies autograd would save for the weight
    gradients). Under autocast each linear casts its input on its own (the stack profile: q/k/v and gate/up each
    cast the norm output); in one dtype the linears of a module share one input tensor."""
    out: dict[str, tuple[int, int]] = {}
    for lin in w.layer.linears:
        width, n = out.get(lin.module, (lin.n_in, 0))
        out[lin.module] = (width, n + 1)
    mixed = w.precision.autocast and not half_base(w.finetune, w.precision)
    return {k: (width, n if mixed else 1) for k, (width, n) in out.items()}


TARGET_MODULE = {"q": "qkv", "k": "qkv", "v": "qkv", "qkv": "qkv", "o": "out", "gate": "fc1", "up": "fc1", "down": "fc2"}
DROPOUT_MASK_BYTES = 1.0  # torch.native_dropout's mask is bool, one byte per element


def saved_delta_per_token(w: "Workload") -> float:
    """Bytes one layer saves per token beyond (+) or below (-) the stack's full-fine-tune table (module docstring):
    a frozen linear's input is not kept (unless the quantised matmul keeps it, or an adapter without dropout keeps
    the same tensor), each adapter keeps its dropout's output and mask and its A output (r wide)."""
    ft = w.finetune
    if not ft.adapters:
        return 0.0
    a, r = w.act_bytes, ft.lora_rank
    shapes = target_shapes(w.layer, ft.target_set)
    adapted = {TARGET_MODULE[t] for t, _, _ in shapes}
    keeps_input = quant_saves_input(ft)
    delta = 0.0
    for module, (width, copies) in _module_inputs(w).items():
        if keeps_input or (module in adapted and ft.lora_dropout == 0.0):
            continue  # the quantised matmul, or the adapter's A, keeps the input itself
        if module == "out" and not w.eager:
            # a fused kernel's output, which it keeps for its backward, is the out projection's input: torch's SDPA
            # returns (b, heads, s, d) laid out as (b, s, heads, d), so transformers' transpose(1, 2).contiguous() and
            # litgpt's transpose(1, 2).contiguous().view() copy nothing (torch.contiguous returns self)
            continue
        delta -= copies * width * a
    dropouts = {TARGET_MODULE[t] if (ft.library is Library.litgpt and t in "qkv") else t: n_in for t, n_in, _ in shapes}
    if ft.lora_dropout > 0.0:
        delta += sum(n_in * (a + DROPOUT_MASK_BYTES) for n_in in dropouts.values())
    delta += sum(r * a for _ in shapes)
    if ft.dora:  # DoRA rescales the output: (base + lora) x magnitude / norm keeps an out-wide product per target
        delta += sum(n_out * a for _, _, n_out in shapes)
    return delta


# --- time --------------------------------------------------------------------------------------------------------
def layer_extra_times(w: "Workload", tokens: Any) -> tuple[Any, Any]:
    """(forward, backward) GPU seconds one layer's adapters and dequantisation add for ``tokens`` tokens: each
    adapter's two thin GEMMs (backward: input and weight gradients, 2x), its dropout (read x, write the output and
    the mask; backward the same), the scaled add of its output; every quantised weight read packed and written
    in half precision once per forward and once per backward; DoRA's weight norm (forward: W + s B A, its norm)."""
    from advisor.compute import gemm_time, mem_time

    ft, hw, a, r = w.finetune, w.hw, w.act_bytes, w.finetune.lora_rank
    if not ft.adapters:
        return 0.0, 0.0
    fwd = 0.0
    for _, n_in, n_out in target_shapes(w.layer, ft.target_set):
        fwd = fwd + gemm_time(hw, w.math, 2.0 * tokens * n_in * r, r, n_in) + gemm_time(hw, w.math, 2.0 * tokens * r * n_out, n_out, r)
        fwd = fwd + mem_time(hw, tokens * n_out * 3.0 * a)  # out += s * (B A x): read, read, write
        if ft.lora_dropout > 0.0:
            fwd = fwd + mem_time(hw, tokens * n_in * (2.0 * a + DROPOUT_MASK_BYTES))
        if ft.dora:
            fwd = fwd + gemm_time(hw, w.math, 2.0 * n_out * r * n_in, n_out, r) + mem_time(hw, 3.0 * a * n_in * n_out)
    bwd = 2.0 * fwd
    if ft.base_quant is not Quant.none:
        packed = sum(lin.weights for lin in w.layer.linears)
        deq = mem_time(hw, packed * (quant_bytes_per_weight(ft, w.model.d_model) + 2.0))
        fwd, bwd = fwd + deq, bwd + deq
    return fwd, bwd


def weight_grad_share(w: "Workload") -> float:
    """The base GEMMs' weight gradients: 1 (a full fine-tune computes them) or 0 (frozen)."""
    return 0.0 if w.finetune.adapters else 1.0


# Activation offload moves each saved tensor to pinned host memory during forward and back during backward over the
# GPU's host link: PCIe 4.0 x16 (31.5 GB/s per direction, PCI-SIG) on every GPU of the fine-tuning profiles; pinned
# cudaMemcpyAsync reaches ~80% of it (CUDA samples' bandwidthTest, pinned, ~25-26 GB/s on Gen4 x16). The profiles
# carry no host-link field yet: this is the Gen4 x16 figure for all of them.
HOST_LINK_BYTES_PER_S = 31.5e9 * 0.8


def activation_offload_exposed(w: "Workload", saved_bytes: Any, fwd_s: Any, bwd_s: Any) -> tuple[Any, Any]:
    """(forward, backward) seconds per micro-batch that activation offload adds: torchtune copies on a side stream
    (OffloadActivations, use_streams=True), so only what outlasts the pass it overlaps is exposed."""
    if not w.finetune.offloads_activations:
        return 0.0, 0.0
    t = saved_bytes / HOST_LINK_BYTES_PER_S
    return np.maximum(t - fwd_s, 0.0), np.maximum(t - bwd_s, 0.0)
