"""Memory: the busiest GPU's memory at its peak, as a named breakdown.

Model states come from the data-parallel dimension (advisor.parallel.data: the ZeRO stage's shards, the stack's
master weights). Activations per layer and token are what the stack's layers save for backward (its profile's
``memory.saved``, advisor.stack), divided as tensor and sequence parallelism divide them; full recomputation
keeps each layer's input, selective drops the s x s scores (and keeps the fused q/k/v output where the stack's
core-attention checkpoint holds a view of it: checkpointed_qkv_kept). A pipeline stage keeps several micro-batches
in flight (advisor.parallel.in_flight): the first stage holds the most activations, the last the logits.

The peak is the largest of three moments (the activation probe's timeline): (a) the start of the loss's
backward: every activation plus the cross-entropy's buffers; (b) under full recomputation, while the last layer
is recomputed: its full activations and ~3 d_ff-sized temporaries join the kept inputs, the held logits and the
head's gradient; (c) the optimizer step: all gradients and the step's temporaries. ``peak`` is what
``torch.cuda.max_memory_allocated()`` reports; the CUDA context, NCCL buffers and allocator fragmentation are
``Overhead``, reported apart. Offloaded model states and activations (advisor/parallel/offload.py,
advisor/recompute.py) leave the GPU. Mixture of experts: the routed experts' shards and their states
(advisor.parallel.data with advisor.parallel.expert), the routed activations at top-k (advisor.parallel.expert).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional

import numpy as np

from advisor import adapters
from advisor.candidates import Candidates, Mesh
from advisor.model.spec import PositionKind, QKNorm
from advisor.parallel import context, expert, no_sync
from advisor.parallel.model_states import ModelStates
from advisor.parallel.in_flight import in_flight_layers
from advisor.precision import fp8_attention_saved
from advisor.recompute import Mix, kept_per_token, mix
from advisor.units import GiB
from advisor.unfused_bytes import rotary_saved, routed_unfused
from advisor.workload import Workload

# NCCL allocates per-communicator buffers (NCCL_BUFFSIZE 4 MiB x channels x peers); a few hundred MiB
# per process with several communicators (nvidia-smi minus torch's allocations in NCCL jobs).
NCCL_BUFFER_BYTES = 0.25 * GiB
# Allocator fragmentation, by the allocator the stack launches (engine.allocator). Default segments: reserved exceeds
# allocated by 2.5-8% in reference/h100/train_examples.jsonl (peak_reserved / peak_mem); 5% is kept as headroom in the
# `fits` verdict. expandable_segments:True: before failing an allocation the caching allocator releases its cached
# blocks, and an expandable segment unmaps their free pages one by one (c10/cuda/CUDACachingAllocator.cpp
# release_cached_blocks -> unmap of ExpandableSegment), so what a run cannot use near its limit is the page rounding of
# live blocks (2 MiB pages; a training step keeps a few hundred large blocks alive: under 1 GiB): 1% of the peak
FRAGMENTATION = {"caching": 0.05, "expandable_segments": 0.01}
# Full recomputation: the recomputed layer's MLP holds ~3 d_ff-sized temporaries beside its saved tensors
RECOMPUTE_TEMPORARIES_D_FF = 3.0
# torchtune's OffloadActivations (torchtune/training/_activation_offloading.py) copies each saved tensor to pinned CPU
# memory on a side stream and brings it back ahead of its backward: about two layers' tensors stay on the GPU (the one
# computing and the one in transfer)
OFFLOAD_LAYERS_ON_GPU = 2.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest GPU at its peak (arrays over plans)."""

    weights: Any
    gradients: Any
    optimizer_states: Any
    activations: Any
    logits_loss: Any
    transient: Any

    def parts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def peak(self) -> Any:
        return sum(self.parts().values())


@dataclass(frozen=True)
class Overhead:
    """Bytes outside torch's tensor allocations, reported beside the peak."""

    cuda_context: Any
    comm_buffers: Any
    fragmentation: Any

    def parts(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def total(self) -> Any:
        return sum(self.parts().values())


def policy_mix(w: Workload, c: Candidates, mesh: Mesh, layers: Any) -> Mix:
    """Each plan's checkpointing policy over its stage's layers (advisor.recompute)."""
    return mix(c.recompute, c.recompute_k, layers, mesh.v, w.model.n_layers, w.stack.engine.activation_offload == "first_k")


def gathered_inputs(w: Workload, tp: Any, sp: Any) -> Any:
    """Bytes per token a layer keeps beyond memory.saved where its column linears save their gathered input, not the
    sequence shard the table counts (engine.gathered_inputs_bytes): under SP without the linear-async overlap."""
    b = w.stack.engine.gathered_inputs_bytes
    if not b or w.tp_overlap == "linear-async":
        return 0.0
    tp = np.asarray(tp, dtype=float)
    return np.where(np.asarray(sp, dtype=bool) & (tp > 1), b * w.model.d_model * (1.0 - 1.0 / tp), 0.0)


def saved_per_token(w: Workload, c: Candidates, mesh: Mesh, m: Mix) -> tuple[Any, Any]:
    """(bytes one layer keeps per token on the GPU under each plan's policy, bytes with none) on one TP rank."""
    t, sp = w.tables, np.asarray(c.sp, dtype=bool)
    scores = w.layer.n_heads * w.seq_len if w.eager else 0.0
    full = t.saved_layer.per_gpu(mesh.tp, sp, scores)
    less = quantised_inputs_saving(w, mesh.tp, sp)  # NVFP4's 4-bit saved GEMM inputs (advisor.precision)
    delta = adapters.saved_delta_per_token(w, mesh.tp, sp)  # a frozen base's inputs not kept, the adapters' kept
    # FP8 attention's quantised Q, K, V (and O) in place of BF16 attention's (advisor.precision fp8_attention_saved);
    # under CP, Transformer Engine's context-parallel functions save their own mix (context_parallel.py:2319-2354), kept
    # at the table's
    fp8_core = w.fp8_attention & (np.asarray(mesh.cp) <= 1)
    core = np.where(fp8_core, fp8_attention_saved(w, mesh.tp), 0.0)
    rope = rotary_saved(w, c.micro_batch)  # the unfused YaRN RoPE's cos and sin, outside every checkpointed module
    flash = flash_output_copy(w, c.micro_batch, mesh.tp)  # an unchecked core's output twice (not under core_attn)
    full = full - less + delta + gathered_inputs(w, mesh.tp, sp) + core + rope + flash
    modules = w.recompute_modules
    base = t.saved_selective if modules is None or "core_attn" in modules else t.saved_layer
    # what a routed MLP's unfused steps keep (advisor.unfused_bytes.routed_unfused)
    unfused = routed_unfused(w, mesh.tp, mesh.ep, mesh.etp) if w.layer.routed else None
    # core_attn's checkpoint keeps the BF16 q, k, v and runs the core without saving: the table's selective entry
    fp8_core = fp8_core & (base is t.saved_layer)
    if base is t.saved_selective:  # the core reruns: linear_proj's quantised copy of its output is the only one
        less = quantised_inputs_saving(w, mesh.tp, sp, core_rerun=True)
    selective = (base.per_gpu(mesh.tp, sp, scores if base is t.saved_layer else 0.0) - less + delta
                 + np.where(fp8_core, core, 0.0)
                 + (checkpointed_qkv_kept(w, mesh.tp) if base is t.saved_selective else flash) + rope
                 - module_frees(w, mesh.tp, sp, mesh.ep, unfused.clamp_kept if unfused else 0.0, fp8_core))
    if unfused is not None:  # the permuted copies, the experts' outputs and the router's (advisor.parallel.expert)
        routed = expert.routed_saved(w, mesh, sp)
        full = full + routed + unfused.clamp_kept + unfused.bias_kept
        sel = w.stack.engine.selective
        if sel is not None and sel.routed == "kept":  # a policy that reruns none of the routed path keeps them all
            selective = selective + routed + unfused.clamp_kept + unfused.bias_kept
        elif sel is not None:  # only what the all-to-alls delivered
            selective = selective + np.where(mesh.ep > 1, expert.routed_saved(w, mesh, sp, exchanged=True), 0.0)
    kept = kept_per_token(m, full, t.saved_full_recompute.per_gpu(mesh.tp, sp), selective)
    return kept, full


def checkpointed_qkv_kept(w: Workload, tp: Any) -> Any:
    """Bytes per token on one TP rank that the core attention's checkpoint keeps beyond the saved tables' q, k and v,
    where it keeps its inputs as they come (engine.selective.core_inputs "fused_views"). megatron-core 0.19.2:
    _checkpointed_attention_forward (transformer/attention.py:445-496) hands query, key and value to
    tensor_parallel.checkpoint, whose CheckpointFunction saves them (tensor_parallel/random.py:618 save_for_backward);
    the value is a split view of linear_qkv's output (attention.py:1867, 1901-1903), so that output stays whole,
    q + 2 kv elements (every head where TP exceeds the KV heads: attention.py:1852-1859 all-gathers it, then slices).
    Beside it the query and key made anew: RoPE's outputs (rope_utils.py:136-137; Transformer Engine 2.20.2's fused
    kernel alike, attention/rope.py:142), the grouped query's reshape copy (attention.py:1906), the q/k norms'.
    Unchecked, TE's attention copies the strided value (dot_product_attention/utils.py:2963-2965: no layout fits,
    .contiguous()) and linear_qkv's output is freed: the tables. MLA makes its q, k and v anew: nothing more."""
    m, layer, sel = w.model, w.layer, w.stack.engine.selective
    if sel is None or sel.core_inputs != "fused_views" or m.latent is not None:
        return 0.0
    tp = np.asarray(tp, dtype=float)
    rotated = 1.0 - len(m.nope_layers) / m.n_layers if m.position is PositionKind.rotary else 0.0
    normed = m.qk_norm is not QKNorm.none
    q_new = 1.0 if normed or layer.kv_heads < layer.n_heads else rotated
    k_new = 1.0 if normed else rotated
    qkv, kv = layer.qkv_dim, layer.kv_dim / np.minimum(tp, layer.kv_heads)  # a rank's k (or v)
    fused = qkv / np.where(tp > layer.kv_heads, 1.0, tp)
    return w.act_bytes * (fused + q_new * layer.q_dim / tp + k_new * kv - (layer.q_dim / tp + 2.0 * kv))


def flash_output_copy(w: Workload, micro_batch: Any, tp: Any) -> Any:
    """Bytes per token on one TP rank of the attention output's second copy, where the stack's fused attention runs
    FlashAttention (its profile's memory.flash_output_copy: the GPU's compute capability in its range, heads no wider
    than the kernel takes, no learned sinks, which turn FlashAttention off) at micro-batch > 1: Transformer Engine's
    FlashAttention.forward returns output.view(b, s, -1).transpose(0, 1).contiguous() for sbhd (2.20.2
    attention/dot_product_attention/backends.py:1428, 1436; 2.14.0 :1135, 1143), a new tensor once b > 1 (a view at
    b = 1), which linear_proj saves while flash-attn keeps its own bshd output for its backward. Not where the output
    projection keeps a quantised copy in place of its input (engine.quantised_inputs original_not_under)."""
    f, cc, layer = w.stack.memory.flash_output_copy, w.hw.gpu.compute_capability, w.layer
    if f is None or cc is None or w.eager or not f.from_cc <= cc < f.below_cc or w.model.attention_sinks:
        return 0.0
    if max(layer.d_head, layer.v_head) > f.max_head_dim:
        return 0.0
    r, qi = w.precision.recipe, w.stack.engine.quantised_inputs
    if r is not None and qi is not None and r.name in qi.original_not_under:
        return 0.0
    out = w.act_bytes * layer.n_heads * layer.v_head / np.asarray(tp, dtype=float)
    return np.where(np.asarray(micro_batch) > 1, out, 0.0)


def module_frees(w: Workload, tp: Any, sp: Any, ep: Any = None, clamp_kept: Any = 0.0, fp8_core: Any = False) -> Any:
    """Bytes per token one layer stops keeping under --recompute-modules, on one TP rank: each module's ``frees``
    (engine.selective.modules) at the layer's widths, in the activation dtype; d_model and MLA's latents split under
    sequence parallelism, the rest over TP; and ``clamp_kept``, what a routed activation's unfused clamp keeps
    (advisor.unfused_bytes.routed_unfused), where a module reruns the activation. Where ``fp8_core`` (FP8 attention keeps its
    own quantised q, k and v: advisor.precision fp8_attention_saved), the BF16 q, k and v mla_up_proj's checkpoint
    discards were kept by nothing: their widths free nothing."""
    if w.recompute_modules is None:
        return 0.0
    layer, sel = w.layer, w.stack.engine.selective
    routed = layer.d_ff * expert.routed_copies(w, ep) if layer.routed else 0.0
    attn = np.where(fp8_core, 0.0, 1.0)
    width = {"d_model": w.model.d_model, "q_dim": attn * layer.q_dim, "kv_dim": attn * layer.kv_dim,
             "d_ff": 0.0 if layer.routed else layer.d_ff, "routed_d_ff": routed, "latents": layer.latent_widths()["latents"]}
    on_sequence = np.where(np.asarray(sp, dtype=bool), tp, 1.0)
    # k and v whole KV heads a rank (advisor.forms LayerBytes: min(tp, kv heads))
    split = {"d_model": on_sequence, "latents": on_sequence, "kv_dim": np.minimum(tp, layer.kv_heads)}
    # a module rerunning the routed activation reruns its unfused clamp, whose copies it then does not keep either
    # (once, whichever modules name it; kept at all only where the policy keeps the routed path: saved_per_token)
    rerun = any("mlp/act" in sel.modules[m].recomputes for m in w.recompute_modules) and sel.routed == "kept"
    return sum(w.act_bytes * n * width[k] / split.get(k, tp) for m in w.recompute_modules
               for k, n in sel.modules[m].frees.items()) + (clamp_kept if rerun else 0.0)


def quantised_inputs_saving(w: Workload, tp: Any, sp: Any, core_rerun: bool = False) -> Any:
    """Bytes per token one layer saves less where its linears keep their inputs quantised for the wgrad GEMM
    instead of in BF16, on one TP rank: where the recipe does (advisor.precision ``saves_quantised_inputs``: NVFP4)
    or the stack's linears do under every recipe (its engine's ``quantised_inputs``: Transformer Engine). Each
    sub-module's input once (q/k/v and gate/up share theirs), a row-parallel input split over TP, a column-parallel
    one split only under sequence parallelism; a sub-module the stack keeps the half-precision input of saves nothing,
    or keeps a quantised copy beside it. Spread over the layers as the BF16 edge layers are. ``core_rerun``: the
    attention core is checkpointed (core_attn), so no op saves its half-precision output: a quantised copy of it that
    sat beside it (``original_not_under``) is then the only one (Transformer Engine 2.20.2 linear.py:693-717 keeps the
    quantised input, not the original, where save_original_input is off, as it is under delayed scaling :395-422)."""
    r = w.precision.recipe
    qi = w.stack.engine.quantised_inputs
    if r is None or not (r.saves_quantised_inputs or qi is not None):
        return 0.0
    original = set(qi.original) if qi is not None else set()
    extra_copy = qi is not None and r.name in qi.original_not_under
    # the stack's rule reads dense sub-modules only: a routed MoE block's inputs are its permuted copies
    # (advisor.parallel.expert routed_saved), what its grouped linears keep of them is not modelled
    routed = {lin.module for lin in w.layer.linears if lin.copies > 1 or lin.split.value == "replicated"}
    saving: Any = 0.0
    seen: set[str] = set(adapters.dropped_inputs(w))  # a frozen linear keeps no input to quantise (adapters)
    for lin in w.layer.linears:
        if lin.module in seen or (qi is not None and lin.module in routed):
            continue
        seen.add(lin.module)
        split = (lin.split.value == "row") | ((lin.split.value == "column") & np.asarray(sp, dtype=bool))
        elements = lin.n_in / np.where(split, tp, 1.0)
        if lin.module in original and not (extra_copy and core_rerun):
            saving = saving - (r.stored_bytes * elements if extra_copy else 0.0)
        else:
            saving = saving + (w.act_bytes - r.stored_bytes) * elements
    share = 1.0 - w.bf16_share
    return share * saving


def breakdown(w: Workload, c: Candidates, mesh: Mesh, states: ModelStates, tokens: Any, layers: Any,
              m: Optional[Mix] = None, in_flight: Any = None,
              saved: Optional[tuple[Any, Any]] = None) -> tuple[MemoryBreakdown, Overhead]:
    """The memory parts of each plan (``m``, ``in_flight``, ``saved``: its policy_mix, in_flight_layers and
    saved_per_token under ``m``, where the caller has them already)."""
    t, pp = w.tables, mesh.pp
    m = policy_mix(w, c, mesh, layers) if m is None else m
    kept, full = saved_per_token(w, c, mesh, m) if saved is None else saved
    outside = t.saved_outside_layers * tokens
    if w.eager:  # one b x s x s causal mask for the whole model, where the stack builds one
        outside = outside + t.attention_mask * c.micro_batch * w.seq_len ** 2
    if in_flight is None:
        in_flight = in_flight_layers(w.model.n_layers, pp, mesh.v, c.schedule, c.grad_accum, c.pp_split, w.mtp_layers)
    if w.finetune.offloads_activations:  # the layer running and the one being copied stay; the rest wait on the CPU
        in_flight = np.minimum(in_flight, OFFLOAD_LAYERS_ON_GPU)
    first = kept * tokens * in_flight + outside  # the first stage holds the most micro-batches
    loss = layers is not None  # None: the first of two ranks costed apart (advisor.step._staged), the loss the last's
    last = kept * tokens * layers + outside if loss else outside  # the last holds the logits
    logits = tokens * w.model.vocab / mesh.tp
    held = logits * t.logits_held + tokens * t.logits_held_per_token
    # the head's own gradient where it trains (a frozen base's head has none: LoRA)
    head_trains = 0.0 if w.finetune.adapters else t.logits_peak_head
    at_peak = logits * t.logits_peak + tokens * t.logits_peak_per_token + head_trains * w.model.vocab * w.model.d_model / mesh.tp
    # each multi-token prediction depth's logits and loss run before the main ones (gpt_model.py process_mtp_loss) and keep
    # what the main loss keeps until backward: the last stage holds 1 + D times the logits, the last at its loss's peak
    held, at_peak = (held * (1 + w.mtp_layers), at_peak + w.mtp_layers * held) if loss else (0.0, 0.0)
    piped = pp > 1
    loss_peak = np.where(piped, np.maximum(first, last + at_peak), first + at_peak)
    # while a checkpoint is rerun its group's layers hold their full activations; under every layer's activation
    # offload the layer being brought back does (the first k layers' come back within the other layers' room)
    back = np.where(m.offload & (m.offloaded >= 1.0), full * tokens, 0.0)
    # the head's gradient, made before any checkpoint reruns, where gradients are not already held throughout
    head = np.where(states.grads_persist, 0.0, states.head_grads)
    # selective recomputation reruns eager attention's core in each layer's backward, whose s x s scores are held again
    # meanwhile (a full rerun's are in ``full``)
    rerun = w.eager and (w.recompute_modules is None or "core_attn" in w.recompute_modules)
    scores = t.saved_layer.scores * w.layer.n_heads * w.seq_len / mesh.tp * tokens if rerun else 0.0
    rc_extra = np.where(m.full > 0, m.group * full * tokens + RECOMPUTE_TEMPORARIES_D_FF * w.model.d_ff / mesh.tp
                        * w.act_bytes * tokens + head, back + np.where(m.selective, scores, 0.0))
    rc_peak = np.where(piped, np.maximum(first, last + held), first + held) + rc_extra
    fb = np.maximum(loss_peak, rc_peak)
    fixed = states.gathered + states.grad_buffer + states.autocast_copy + states.bucket_copy
    gathered_kv = context.transient_bytes(w, c, mesh, tokens)  # CP: gathered K and V, or the ring's partial outputs
    fixed = fixed + gathered_kv if np.ndim(gathered_kv) else fixed
    # under FSDP1's no_sync every unit's unsharded gradient is alive by the last micro-batch (advisor.parallel.no_sync)
    unsharded = no_sync.unsharded_grads(w, c, c.zero, states.trained, states.grad_bytes)
    grads_fb = np.where(states.grads_persist, np.maximum(states.grads, unsharded), 0.0)
    opt_phase = states.grads + states.step_temporaries + states.bucket_copy
    in_fb = fb + fixed + grads_fb >= opt_phase
    lg = np.where(loss_peak >= rc_peak, np.where(piped, np.where(last + at_peak > first, at_peak, 0.0), at_peak),
                  np.where(piped, np.where(last + held > first, held, 0.0), held))
    mem = MemoryBreakdown(
        weights=states.weights, gradients=np.where(in_fb, grads_fb, states.grads), optimizer_states=states.optimizer_states,
        activations=np.where(in_fb, fb - lg, 0.0), logits_loss=np.where(in_fb, lg, 0.0),
        transient=np.where(in_fb, fixed, states.step_temporaries + states.bucket_copy))
    peak = mem.peak
    shape = np.shape(peak)
    over = Overhead(cuda_context=np.full(shape, w.hw.efficiency.framework_overhead_GiB * GiB),
                    comm_buffers=np.where((mesh.dp > 1) | (mesh.tp > 1) | piped, NCCL_BUFFER_BYTES, 0.0) * np.ones(shape),
                    fragmentation=FRAGMENTATION[w.stack.engine.allocator] * peak)
    return mem, over
