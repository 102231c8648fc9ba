"""The fine-tuning method's parts that need the optimizer and the compute model (advisor.finetune owns the method,
its parameters): what a LoRA/QLoRA step saves, its's model states, and the time its adapters and dequantisation add
to a layer. advisor.parallel.data and advisor.step call these; see advisor.finetune's docstring for the sources."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from advisor import optimizer
from advisor.compute import LayerTimes, gemm_time, mem_time
from advisor.finetune import (
    STATE_8BIT_BYTES,
    FineTune,
    Library,
    Quant,
    adapter_params_per_layer,
    half_base,
    head_adapter_params,
    head_quantised,
    paged_params,
    quant_bytes_per_weight,
    quantised_weights,
    target_shapes,
    trainable_params,
)
from advisor.model.layer import Split
from advisor.peft_modules import HF_FUSED_GATE_UP, HF_FUSED_QKV
from advisor.training import Optimizer
from advisor.workload import Workload


def quant_saves_input(ft: FineTune) -> bool:
    """bitsandbytes 0.41.1 MatMul4Bit keeps the input A for backward whenever an input needs a gradient (module
    docstring); torchao's linear_nf4 (torchao/dtypes/nf4tensor.py ``LinearNF4``) keeps only the NF4 weight."""
    return ft.base_quant is not Quant.none and ft.library is not Library.torchtune


def dequant_cast(w: Workload) -> bool:
    """bitsandbytes 0.41 dequantises into fp16 and casts that to a bf16 compute dtype (the stack's engine.nf4_dequant_dtype:
    bitsandbytes 0.41.1 nn/modules.py Params4bit.cuda quantises ``self.data.contiguous().half()``, functional.py
    dequantize_4bit allocates its output in the quant state's dtype, autograd/_functions.py MatMul4Bit casts it with
    ``.to(A.dtype)`` in forward and ``.to(grad_output.dtype)`` in backward): one more read and write of 2 bytes a weight
    each time, and the fp16 copy beside the cast one while it runs."""
    fp16_compute = w.precision.value.startswith("fp16")
    return w.finetune.base_quant is not Quant.none and w.stack.engine.nf4_dequant_dtype == "fp16" and not fp16_compute


def dequant_buffer(w: Workload) -> float:
    """Bytes of the half-precision weight a quantised linear dequantises into while its GEMM runs (bitsandbytes
    ``F.dequantize_4bit(B, state).to(A.dtype)`` in MatMul4Bit forward and backward; torchao ``weight.to(dtype)``),
    one linear at a time; DoRA also builds W + s B A to take its column norm (peft dora.py ``get_weight_norm``)."""
    ft = w.finetune
    biggest = max(lin.weights for lin in w.layer.linears)
    if head_quantised(ft):
        biggest = max(biggest, w.model.vocab * w.model.d_model)
    out = biggest * (4.0 if dequant_cast(w) else 2.0) if ft.base_quant is not Quant.none else 0.0
    if ft.dora:
        # the layers' adapted linears, and the head where adapted (DoRA on lm_head alone has no layer target)
        head = w.model.vocab * w.model.d_model if "head" in ft.target_set else 0
        out += max([n_in * n_out for _, n_in, n_out in target_shapes(w.layer, ft.target_set)] + [head]) * 2.0
    return out


def peft_fp32_adapters(w: Workload) -> bool:
    """PEFT keeps a half-precision model's adapters in fp32 (get_peft_model's autocast_adapter_dtype=True, peft 0.21
    mapping_func.py) and casts each adapter's input to their dtype (tuners/lora/layer.py Linear.forward
    ``_cast_input_dtype``): costed in the pure half mode (--precision bf16/fp16), where a probe of PEFT's LoRA on
    transformers' Llama agrees to the byte (tests/test_stack_methods.py); under autocast the adapters' GEMMs run on
    autocast's own half-precision casts of that input, not costed apart."""
    return w.finetune.library is Library.peft and not w.precision.autocast and w.act_bytes < 4.0


def _module_inputs(w: Workload) -> dict[str, tuple[int, int]]:
    """Per layer-table module (qkv, out, fc1, fc2): (input width, copies autograd would save for the weight
    gradients). Under autocast each linear casts its input on its own (the stack profile: q/k/v and gate/up each
    cast the norm output); in one dtype the linears of a module share one input tensor."""
    out: dict[str, tuple[int, int]] = {}
    for lin in w.layer.linears:
        width, n = out.get(lin.module, (lin.n_in, 0))
        out[lin.module] = (width, n + 1)
    mixed = w.precision.autocast and not half_base(w.finetune, w.precision, w.stack)
    return {k: (width, n if mixed else 1) for k, (width, n) in out.items()}


TARGET_MODULE = {"q": "qkv", "k": "qkv", "v": "qkv", "qkv": "qkv", "o": "out", "gate": "fc1", "up": "fc1", "gate_up": "fc1",
                 "down": "fc2"}
DROPOUT_MASK_BYTES = 1.0  # torch.native_dropout's mask is bool, one byte per element


def _row_parallel(w: Workload) -> set[str]:
    """The layer table's modules whose linears split their input over the TP ranks (out, fc2); the others' input, the
    norms' output, is split only under SP."""
    return {lin.module for lin in w.layer.linears if lin.split is Split.row}


def dropped_inputs(w: Workload) -> list[str]:
    """The layer-table modules whose input a frozen base no longer keeps (no weight gradient wants it): all but those
    the quantised matmul keeps (bitsandbytes), or an adapter's A keeps as its own input (no dropout, no fp32 cast),
    or a fused attention kernel's output that the out projection reads: torch's SDPA returns (b, heads, s, d) laid
    out as (b, s, heads, d), so transformers' transpose(1, 2).contiguous() and litgpt's transpose(1, 2).contiguous()
    .view() copy nothing (torch.contiguous returns self), and the kernel keeps that tensor for its own backward."""
    ft = w.finetune
    if not ft.adapters:
        return []
    if quant_saves_input(ft):
        return []
    adapted = {TARGET_MODULE[t] for t, _, _ in target_shapes(w.layer, ft.target_set)}
    kept_by_a = ft.lora_dropout == 0.0 and not peft_fp32_adapters(w)
    return [m for m in _module_inputs(w) if not (m in adapted and kept_by_a) and not (m == "out" and not w.eager)]


def saved_delta_per_token(w: Workload, tp: Any = 1, sp: Any = False) -> Any:
    """Bytes one layer saves per token on one TP rank beyond (+) or below (-) the stack's full-fine-tune table (module
    docstring): a frozen linear's input is not kept (unless the quantised matmul keeps it, or an adapter without
    dropout keeps the same tensor), each adapter keeps its dropout's output and mask and its A output (r wide, whole
    on every rank: Megatron-Bridge gathers it). A module's input is split as the layer table splits it."""
    ft = w.finetune
    if not ft.adapters:
        return 0.0
    seq, row = np.where(np.asarray(sp, dtype=bool), tp, 1.0), _row_parallel(w)

    def split(module: str) -> Any:
        return tp if module in row else seq
    a, r = w.act_bytes, ft.lora_rank
    fp32 = peft_fp32_adapters(w)
    ab = 4.0 if fp32 else a  # the adapters' activations: their own input copy (fp32 under PEFT's cast) and A's output
    shapes = target_shapes(w.layer, ft.target_set)
    # the norms' weights are frozen: what a layer keeps only for their gradients is not kept (the stack's tables)
    delta = -w.tables.saved_norm_weight_inputs / seq
    inputs = _module_inputs(w)
    for module in dropped_inputs(w):
        width, copies = inputs[module]
        delta = delta - copies * width * a / split(module)
    dropouts = {TARGET_MODULE[t] if (ft.library is Library.litgpt and t in "qkv") else t: n_in for t, n_in, _ in shapes}
    if ft.lora_dropout > 0.0:
        delta = delta + sum(n_in * (ab + DROPOUT_MASK_BYTES) / split(TARGET_MODULE[t]) for t, n_in in dropouts.items())
    elif fp32:  # no dropout: A keeps the fp32 cast of its input, one per adapter (each casts its own)
        delta = delta + sum(n_in * ab / split(TARGET_MODULE[t]) for t, n_in, _ in shapes)
    delta = delta + sum(r * ab for _ in shapes)
    qkv_slices = [n_out for t, _, n_out in shapes if t in ("q", "k", "v")]
    if ft.library is Library.litgpt and 0 < len(qkv_slices) < 3:
        # litgpt's LoRAQKVLinear.zero_pad scatters the enabled slices' B output into the fused width with index_copy,
        # whose backward keeps its source (litgpt 0.5.13 lora.py:326, lit_gpt 0.1.0.dev1 lora.py:339-341; torch 2.1
        # derivatives.yaml:836-841); with q, k and v all adapted zero_pad returns early (lora.py:309): nothing kept
        delta = delta + sum(qkv_slices) * a
    if ft.dora:  # DoRA rescales the output: (base + lora) x magnitude / norm keeps an out-wide product per target
        delta = delta + sum(n_out * a for _, _, n_out in shapes)
    return delta


def tp_collectives(w: Workload, sp: Any) -> Any:
    """Tensor-parallel collectives the adapters add per layer and micro-batch, in the units advisor.parallel.tensor
    counts a layer's in (an all-reduce, or under SP an all-gather and a reduce-scatter of the layer's activations).
    Megatron-Bridge's ParallelLinearAdapter.forward (peft/utils.py): under SP a column-parallel target's adapter gathers
    the norm output's sequence itself (gather_from_sequence_parallel_region: all-gather forward, reduce-scatter
    backward) and a row-parallel target's gathers its B output (gather_output) and scatters it back to the sequence
    (all-gather backward): one unit per adapted module; without SP only the row-parallel one's forward all-gather,
    half a unit. A's r-wide gathers and all-reduces are left out (r / d_model of these: 16 / 8,192 for Llama 3 70B)."""
    if not w.finetune.adapters:
        return 0.0
    modules = {TARGET_MODULE[t] for t, _, _ in target_shapes(w.layer, w.finetune.target_set)}
    row = len(modules & _row_parallel(w))
    return np.where(np.asarray(sp, dtype=bool), float(len(modules)), 0.5 * row)


def host_link_bytes_per_s(hw) -> float:
    """Bytes per second one GPU copies to or from pinned host memory: the profile's host link (host.pcie_GBps), over
    which activation offload moves each saved tensor during forward and back during backward. A profile without a host
    side costs no offload (advisor.api.check_host refuses --adapter-offload there, as --offload is refused)."""
    if hw.host is None:
        raise ValueError(f"hardware profile {hw.name} has no host side: no host link to offload over")
    return hw.host.pcie_bytes_per_s


def activation_offload_exposed(w: Workload, saved_bytes: Any, fwd_s: Any, bwd_s: Any) -> tuple[Any, Any]:
    """(forward, backward) seconds per micro-batch that activation offload adds: torchtune copies on a side stream
    (OffloadActivations, use_streams=True), so only what outlasts the pass it overlaps is exposed."""
    if not w.finetune.offloads_activations:
        return 0.0, 0.0
    t = saved_bytes / host_link_bytes_per_s(w.hw)
    return np.maximum(t - fwd_s, 0.0), np.maximum(t - bwd_s, 0.0)


def model_states(w: Workload, c: Any, mesh: Any, layers: Any, full: Any) -> Any:
    """The ModelStates of a LoRA/QLoRA step (module docstring), from the full fine-tune's ``full`` (the same plan):
    base weights frozen in their dtype or quantised, gradients and optimizer states for the adapters alone."""
    ft, m = w.finetune, w.model
    zero, shard = np.asarray(c.zero), mesh.dp_shard
    wb, gb = full.weight_bytes, full.grad_bytes
    half = half_base(ft, w.precision, w.stack)
    # the frozen base's bytes per weight: half precision, or the recipe's format where the stack holds weights in it
    # (Megatron's fp8 parameters: full.weight_bytes); the adapters keep wb (fp32 under autocast)
    low = w.precision.recipe is not None and bool(w.stack.engine.low_precision_params)
    # a base in the parameters' own dtype (engine.adapter_base params: torchtitan's fp32 under FSDP2), gathered in bf16
    own = w.stack.engine.adapter_base == "params" and w.precision.autocast and not low
    base_wb = wb if low else (2.0 if half else 4.0 if own else wb)
    if low:  # the adapters themselves stay in the parameters' own dtype
        wb = optimizer.weight_grad_bytes(w.precision, full.master)[0]
    n_params = full.params  # this rank's: its stage's layers, split over the TP ranks
    # a quantised base runs with data parallelism only (every stack that runs QLoRA: engine.adapters_parallel data)
    quant = float(quantised_weights(m, ft, head_quantised(ft)))
    qb = quant_bytes_per_weight(ft, m.d_model)
    per_layer = float(adapter_params_per_layer(m.layer, ft))
    # under TP each adapter's A and B are split like its linear (Megatron-Bridge ParallelLinearAdapter); the head's
    # adapter counted on every stage (a few vocab x r weights)
    trainable = (layers * per_layer + head_adapter_params(m, ft)) / mesh.tp
    base = (n_params - quant) * base_wb + quant * qb
    stored = base / n_params  # bytes per base parameter as held (and as ZeRO-3 gathers it, but the own dtype's: bf16)
    gathers = np.where(own, 2.0, stored)
    z3 = np.where(zero >= 3, shard, 1.0)
    if ft.offloads_optimizer:
        states = np.zeros(np.shape(z3))
    elif ft.optimizer_8bit and w.optimizer is not Optimizer.sgd:
        states = trainable * (2.0 * STATE_8BIT_BYTES + np.where(full.master, 4.0, 0.0)) / shard
    else:
        states = trainable * optimizer.state_bytes(w, full.master) / shard
    if ft.paged:  # a paged optimizer's large states live in unified memory, outside the allocator's peak (finetune.py)
        states = states * (1.0 - paged_params(m, ft) / max(trainable_params(m, ft), 1))
    p_layer = float(m.layer.n_params) / mesh.tp
    # two units gathered (current + prefetch); bf16 copies of an fp32 base are new tensors even on one rank
    gathered = np.where(zero >= 3, np.where(own, 2.0 * p_layer * gathers,
                                            np.minimum(2.0 * p_layer * gathers, base * (1.0 - 1.0 / shard))), 0.0)
    # an own-dtype base under FSDP2 that keeps its units gathered from forward to backward (ZeRO-2, and ZeRO-1 where
    # the stack runs it as FSDP under a pipeline): the fp32 shards, and every unit's bf16 copy held at the peak
    kept = own & ((zero == 2) | ((zero == 1) & (w.stack.engine.zero1 == "fsdp_under_pipeline")))
    gathered = np.where(kept, (n_params - quant) * 2.0, gathered)
    base_shard = np.where(kept, shard, z3)
    if ft.library is Library.litgpt:
        # litgpt's finetune scripts load the checkpoint after fabric.setup_module: Fabric's FSDP load_raw loads a full
        # state dict under _get_full_state_dict_context(rank0_only=False) (lightning/fabric/strategies/fsdp.py
        # _load_raw_module_state), so every rank holds every weight unsharded beside its own shard once, at start
        gathered = np.where((zero >= 3) & (shard > 1), np.maximum(gathered, base), gathered)
    if peft_fp32_adapters(w):  # PEFT's fp32 adapters on a half-precision base: fp32 weights and gradients
        wb, gb = 4.0, 4.0
    grads = trainable * gb / np.where(zero >= 2, shard, 1.0)
    ddp = np.asarray(full.bucket_copy) > 0
    return replace(
        full, grad_params=trainable, weight_bytes=gathers, weights=base / base_shard + trainable * wb / z3, grads=grads,
        # ZeRO-2/3's all-gather moves the quantised base as held (data.ModelStates.zero_payloads reads gather_bytes,
        # which the full fine-tune's states set to its half-precision or float8 layers); an unquantised base: theirs
        gather_bytes=gathers if quant > 0 else full.gather_bytes,
        optimizer_states=states, gathered=gathered + dequant_buffer(w) + np.zeros(np.shape(z3)),
        grad_buffer=np.where(zero >= 2, per_layer / mesh.tp * gb, 0.0),
        bucket_copy=np.where(ddp, trainable * gb, 0.0),
        autocast_copy=0.0 if half else optimizer.autocast_weights(w, full.master) * (n_params - quant) * 2.0,
        step_temporaries=0.0 if ft.offloads_optimizer else optimizer.step_temporaries(w, trainable / shard),
        head_grads=np.minimum(head_adapter_params(m, ft) * gb, grads))


def layer_extra_times(w: Workload, tokens: Any, tp: Any = 1) -> tuple[Any, Any]:
    """(forward, backward) GPU seconds one layer's adapters and dequantisation add for ``tokens`` tokens on one TP
    rank: each adapter's two thin GEMMs (backward: input and weight gradients, 2x), its dropout (read x, write the
    output and the mask; backward the same), the scaled add of its output, each split over the TP ranks; every
    quantised weight read packed and written in half precision once per forward and once per backward; DoRA's weight
    norm (forward: W + s B A, its norm)."""
    ft, hw, a, r = w.finetune, w.hw, w.act_bytes, w.finetune.lora_rank
    if not ft.adapters:
        return 0.0, 0.0
    fwd = 0.0
    for _, n_in, n_out in target_shapes(w.layer, ft.target_set):
        fwd = fwd + (gemm_time(hw, w.math, 2.0 * tokens * n_in * r / tp, r, n_in)
                     + gemm_time(hw, w.math, 2.0 * tokens * r * n_out / tp, n_out, r))
        fwd = fwd + mem_time(hw, tokens * n_out * 3.0 * a / tp)  # out += s * (B A x): read, read, write
        if ft.lora_dropout > 0.0:
            fwd = fwd + mem_time(hw, tokens * n_in * (2.0 * a + DROPOUT_MASK_BYTES) / tp)
        if ft.dora:
            fwd = fwd + gemm_time(hw, w.math, 2.0 * n_out * r * n_in, n_out, r) + mem_time(hw, 3.0 * a * n_in * n_out)
    bwd = 2.0 * fwd
    if ft.base_quant is not Quant.none:
        packed = sum(lin.weights for lin in w.layer.linears)
        cast = 4.0 if dequant_cast(w) else 0.0  # the fp16 output read back and written in bf16 (dequant_cast)
        deq = mem_time(hw, packed * (quant_bytes_per_weight(ft, w.model.d_model) + 2.0 + cast))
        fwd, bwd = fwd + deq, bwd + deq
    return fwd, bwd


def with_adapters(w: Workload, lt: LayerTimes, tokens: Any, pol: Any, tp: Any = 1) -> LayerTimes:
    """A layer's times with its adapters' and dequantisation's added (a full recomputation reruns them)."""
    if not w.finetune.adapters:
        return lt
    fwd, bwd = layer_extra_times(w, tokens, tp)
    rc = pol.full * fwd  # the checkpointed share of the layers reruns the adapters too (advisor.recompute.Mix)
    return replace(lt, fwd_s=lt.fwd_s + fwd, bwd_s=lt.bwd_s + bwd, recompute_s=lt.recompute_s + rc)


def offloaded_step_time(w: Workload, states: Any, dp_shard: Any) -> Any:
    """Seconds of an optimizer step on the CPU (DeepSpeed offload_optimizer, torchtune offload_optimizer): this GPU's
    share of the gradients goes to the host and the updated weights come back over the host link. The CPU's Adam
    itself is not costed: a lower bound, small for adapters (millions of parameters, where the CPU steps billions a
    second: host.cpu_adam_Gparams_per_s)."""
    shard = states.trained / dp_shard
    return shard * 2.0 * states.grad_bytes / host_link_bytes_per_s(w.hw)  # an adapter weight is held as its gradient is


# Host work an adapted or quantised linear adds to a layer per pass, as (ops, GEMM calls) the host model (advisor.host)
# prices, read from the code. A LoRA adapter (PEFT 0.21 tuners/lora/layer.py Linear.forward; litgpt lora.py
# LoRALinear.forward): lora_A and lora_B (2 GEMM calls), the scaling's mul and the add, and the dropout where p > 0;
# backward: each GEMM's input and weight gradients (4 calls), the mul's and the add's, the dropout's. PEFT's QLoRA layer
# (tuners/lora/bnb.py Linear4bit.forward) adds a clone and a cast, not counted. A bitsandbytes 0.41.1 NF4 weight
# (autograd/_functions.py MatMul4Bit, functional.py dequantize_4bit) in forward and again in backward: the autograd
# Function's own dispatch, torch.empty, the ctypes kernel launch, .to(A.dtype), .t(): 5; double quantisation first
# dequantises the absmax (dequantize_blockwise: torch.empty, code.to(device), its kernel; then absmax += offset): 4 more.
# litgpt's QLoRA runs on the fine-tuning rows measured +28 us (Llama 2 7B), +27 (13B), +31 (Phi-1.5) and +23
# (StableLM 3B) a dequantisation with double quantisation than without (validation/data/finetune_runs.yaml): 4 ops.
# torchao's NF4 (torchtune) is not read here: its dequantisation's host work is not counted. The quantised linears are
# the layer table's where the stack's model code fuses projections as the table does (engine.base_modules fused:
# litgpt's qkv); transformers' modeling files (hf-trainer) hold q, k and v as three modules (q_proj, k_proj, v_proj:
# each its own Linear4bit) except in HF_FUSED_QKV (transformers 5: GPT-2's and GPTBigCode's c_attn, GPT-NeoX's,
# Falcon's and BLOOM's query_key_value, MPT's Wqkv, Phi-3's qkv_proj; "gpt" is the catalogue's GPT-2 and GPT-3), and
# gate and up as two but in HF_FUSED_GATE_UP (Phi-3's and GLM-4's gate_up_proj); checked on the meta device
# (tests/test_hf_families.py). A mixture of experts' every expert is not counted apart (transformers 5 holds them as
# fused 3-D parameters, which bitsandbytes does not quantise).
LORA_HOST = ((2, 2), (2, 4))  # (forward ops, forward GEMM calls), (backward ops, backward GEMM calls) an adapter
NF4_HOST_OPS, DOUBLE_QUANT_HOST_OPS = 5, 4


def base_modules(layer, family: str, held: str) -> int:
    """The modules a layer's quantised base is held in: its table's linears (``held`` fused), or transformers'
    modules for the family (``held`` transformers: the comment above)."""
    if held == "fused":
        return len(layer.linears)
    apart = family not in HF_FUSED_QKV
    return sum(3 if apart and lin.name == "attention/qkv" else 0 if lin.name == "mlp/up" and family in HF_FUSED_GATE_UP
               else 1 for lin in layer.linears)


def host_work(layer, ft, family: str = "gpt", held: str = "fused") -> tuple[tuple[float, float], tuple[float, float]]:
    """((forward ops, forward GEMM calls), (backward ops, backward GEMM calls)) a layer's adapters and the
    dequantisation of its quantised linears add to what the host issues (the comment above)."""
    if not ft.adapters:
        return (0.0, 0.0), (0.0, 0.0)
    n = len(target_shapes(layer, ft.target_set))
    drop = 1.0 if ft.lora_dropout > 0.0 else 0.0
    (fo, fg), (bo, bg) = LORA_HOST
    deq = 0.0
    if ft.base_quant is Quant.nf4 and ft.library is not Library.torchtune:
        deq = base_modules(layer, family, held) * (NF4_HOST_OPS + (DOUBLE_QUANT_HOST_OPS if ft.double_quant else 0))
    return (n * (fo + drop) + deq, n * fg), (n * (bo + drop) + deq, n * bg)
