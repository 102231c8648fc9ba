"""What every candidate plan of one evaluation shares: the model, the hardware, the stack and the setup's scalar part,
the stack's tables resolved once for this model and precision (a routed layer's at the MLP width a token passes through,
advisor.parallel.expert.table_layer; soft-capping's element-wise passes added (Gemma 2): ``softcapped``), the routing
inputs (capacity factor, imbalance) and the multi-token prediction depths (advisor.mtp) riding along."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from advisor.finetune import FULL, FineTune, Library, half_base, trainable_params
from advisor.hardware import Hardware
from advisor.model import DecoderLayer, ModelSpec, PositionKind
from advisor.parallel import expert
from advisor.peft_modules import fused_targets
from advisor.precision import RecipeError, fp8_attention_choice
from advisor.selective import recomputable
from advisor.stack import Stack, StackError, StackTables, list_stacks, load_stack
from advisor.training import Attention, Mode, Optimizer, Precision, TrainingSetup, compile_parts


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    hw: Hardware
    stack: Stack
    seq_len: int
    precision: Precision
    attention: Attention
    optimizer: Optimizer
    layer: DecoderLayer
    tables: StackTables
    finetune: FineTune = FULL
    moe_capacity_factor: Optional[float] = None  # mixture of experts (advisor.parallel.expert.load)
    moe_imbalance: float = 1.0
    recompute_modules: Optional[tuple[str, ...]] = None  # --recompute-modules (advisor.recompute module_frees)
    moe_dispatcher: str = "alltoall"  # the stack's default or the one asked (advisor.parallel.expert)
    moe_overlap: str = "none"
    tp_overlap: str = "none"  # the stack's default or the one asked (advisor.parallel.tensor)
    compile: str = "none"  # what torch.compile compiles, as --compile says (the stack's compiled tables)
    mtp_layers: int = 0  # multi-token prediction depths on the last pipeline stage (advisor.mtp)
    fp8_attention: bool = False  # the attention core in FP8 (--fp8-attention; advisor.precision.FP8_ATTENTION)

    @classmethod
    def of(cls, model: ModelSpec, hw: Hardware, stack: Stack, setup: TrainingSetup) -> "Workload":
        layer = model.layer  # a dense model's layers are one DecoderLayer (their windows inside it); else the routed one
        if not runs_model(stack, model):
            others = [n for n in list_stacks() if n != stack.name and _costs(load_stack(n), model, setup)]
            hint = f"use --stack {' or '.join(others[:3])}" if others else "no shipped stack builds it"
            raise StackError(f"stack {stack.name}'s model code does not build {model.name}, which has "
                             f"{', '.join(lacked(stack, model))}: {hint}")
        sel = stack.engine.selective
        if sel is not None:
            known = recomputable(layer.linears)
            unknown = [op for op in sel.ops(layer.linears) if op not in known]
            if unknown and setup.recompute_modules is None:
                raise StackError(f"stack {stack.name}: its selective recomputation reruns {', '.join(unknown)}, which "
                                 f"{model.name}'s layer does not have (it has {', '.join(sorted(known))})")
        if setup.recompute_modules is not None:
            check_modules(model, layer, stack, setup.recompute_modules)
        if model.experts is None:  # how routed tokens travel, asked of a model that routes none
            asked = [f for f, v in (("--moe-capacity-factor", setup.moe_capacity_factor is not None),
                                    ("--moe-imbalance", setup.moe_imbalance != 1.0),
                                    ("--moe-dispatcher", setup.moe_dispatcher is not None),
                                    ("--moe-overlap", setup.moe_overlap is not None)) if v]
            if asked:
                raise StackError(f"{', '.join(asked)}: {model.name} has no routed experts (a dense model): drop "
                                 f"{'it' if len(asked) == 1 else 'them'}")
        elif setup.moe_overlap == "shared_experts" and not model.experts.d_ff_shared:
            raise StackError(f"--moe-overlap shared-experts: {model.name} has no shared experts to run beside the "
                             "all-to-alls: use --moe-overlap none or batch")
        elif setup.moe_imbalance > (most := model.experts.n_experts / model.experts.experts_per_token):
            raise StackError(f"--moe-imbalance {setup.moe_imbalance:g}: a rank of {model.name}'s experts takes at most "
                             f"E / k = {most:g}x the balanced share ({model.experts.n_experts} experts, top-"
                             f"{model.experts.experts_per_token}): use a value from 1 to {most:g}")
        trains_in(stack, setup, model)
        experts = stack.engine.expert_recipes
        if model.experts is not None and setup.precision.recipe is not None and experts is not None \
                and setup.precision.value not in experts:
            raise StackError(f"stack {stack.name} does not run {setup.precision.value} on a mixture of experts (it runs "
                             f"{', '.join(experts) or 'no recipe'} there): use --precision bf16-mixed or another --stack")
        ft = setup.finetune
        if ft.kind not in stack.engine.methods:
            others = [n for n in runs_method(ft.kind) if runs_model(load_stack(n), model)]  # that build the model too
            raise StackError(f"stack {stack.name} does not run {ft.kind} fine-tuning (it runs {', '.join(stack.engine.methods)})"
                             + (f": use --stack {' or '.join(others)}" if others else f"; no shipped stack runs it on {model.name}"))
        # the tables last: what the stack does not run is said before what advisor has not measured
        tables = stack.tables(_mode(stack, setup).value, setup.attention.value, expert.table_layer(layer), setup.compile)
        if ft.adapters:
            trainable_params(model, ft)  # a one-line error where no target exists in this model
            adapter_targets(stack, setup)
            if half_base(ft, setup.precision, stack):  # a half-precision base: its activations as the half mode's
                tables = stack.tables(Mode.half.value, setup.attention.value, expert.table_layer(layer), setup.compile)
            tables = chunked_loss(tables, ft, setup.precision.activation_bytes)
        return cls(model, hw, stack, setup.seq_len, setup.precision, setup.attention, stack_setup(setup, stack).optimizer, layer,
                   softcapped(tables, model, setup.precision.activation_bytes), ft, setup.moe_capacity_factor,
                   setup.moe_imbalance, setup.recompute_modules, *moe_choices(stack, setup, hw),
                   tp_overlap_choice(stack, setup, hw), setup.compile, setup.mtp_layers, fp8_attention_choice(stack, setup, hw, model))

    def fsdp_variant(self) -> Optional["Workload"]:
        """ZeRO-2/3's workload where the stack's FSDP gathers half parameters under mixed precision: the half tables."""
        if self.stack.engine.fsdp_param_dtype != "half" or self.precision.mode is not Mode.mixed:
            return None
        tables = self.stack.tables(Mode.half.value, self.attention.value, expert.table_layer(self.layer), self.compile)
        return replace(self, tables=softcapped(tables, self.model, self.precision.activation_bytes))

    @property
    def selective_recomputes(self) -> tuple[str, ...]:
        """What the stack's selective recomputation reruns (empty: it offers none)."""
        sel = self.stack.engine.selective
        return sel.ops(self.layer.linears, self.recompute_modules) if sel is not None else ()

    @property
    def bf16_edge_layers(self) -> int:
        """Decoder layers at each end run in BF16 under the run's low-precision recipe: the stack's choice where its
        profile states one, else the recipe's (0 without a recipe)."""
        return self.stack.engine.edge_layers_in_bf16(self.precision.recipe)

    @property
    def bf16_share(self) -> float:
        """The share of the decoder layers run in BF16 under the recipe, spread over all layers (a per-layer mean)."""
        return self.stack.engine.bf16_layers(self.precision.recipe, self.model.n_layers) / self.model.n_layers

    @property
    def math(self) -> str:
        return self.precision.math

    @property
    def act_bytes(self) -> float:
        return self.precision.activation_bytes

    @property
    def eager(self) -> bool:
        return self.attention is Attention.eager


# Soft-capping as transformers runs it in eager code (modeling_gemma2.py: eager_attention_forward and
# Gemma2ForCausalLM.forward): x / c, tanh, * c, three element-wise kernels over the scores (or logits) that each
# read and write them: 6 accesses forward; backward, the product's and the quotient's gradients (read, write:
# 2 each) and tanh's (the gradient and the saved output read, one written: 3), 7; tanh's output is kept for
# backward, one more element. A fused attention kernel applies the cap in registers (flash-attention >= 2.6
# ``softcap``): nothing more there. Elements are in the activation dtype.
SOFTCAP_FORWARD_ACCESSES, SOFTCAP_BACKWARD_ACCESSES, SOFTCAP_SAVED = 6.0, 7.0, 1.0


def softcapped(t: StackTables, model: ModelSpec, act_bytes: float) -> StackTables:
    """The stack's tables with soft-capping's passes over eager attention's scores and over the logits added."""
    if model.attn_softcap is not None:
        t = replace(t, score_forward=t.score_forward + SOFTCAP_FORWARD_ACCESSES * act_bytes,
                    score_backward=t.score_backward + SOFTCAP_BACKWARD_ACCESSES * act_bytes,
                    saved_layer=replace(t.saved_layer, scores=t.saved_layer.scores + SOFTCAP_SAVED * act_bytes))
    if model.logit_softcap is not None:
        t = replace(t, loss_forward=t.loss_forward + SOFTCAP_FORWARD_ACCESSES * act_bytes,
                    loss_backward=t.loss_backward + SOFTCAP_BACKWARD_ACCESSES * act_bytes,
                    logits_held=t.logits_held + SOFTCAP_SAVED * act_bytes,
                    logits_peak=t.logits_peak + SOFTCAP_SAVED * act_bytes)
    return t


# Chunked cross-entropy: litgpt computes the logits in chunks of 128 tokens (lm_head_chunk_size=128) and the loss chunk
# by chunk (litgpt/utils.py chunked_cross_entropy, chunk_size=128). Lightning Fabric's half-precision plugins cast the
# model's output to the default dtype (fabric/wrappers.py _FabricModule.forward -> convert_output; plugins/precision
# half.py, bitsandbytes.py, fsdp.py: torch.get_default_dtype(), fp32), so the chunks are fp32 and each keeps its fp32
# log-softmax for backward, the list of logits alive through it (finetune/lora.py fit): 8 bytes a logit at the loss
# (probed on CPU: 8.04 a logit per token at backward's start; two chunks' fp32 gradients beside them at the peak, 8 x 128
# / seq more, left out). The loss's backward runs before any layer's (its nodes are the newest) and frees each
# log-softmax as it goes: while checkpointed layers recompute only the fp32 list is held, 4 bytes a logit (probed on CPU
# with saved-tensor hooks, 2026-11-29: the saved bytes at the last layer's backward are the checkpoints alone).
# torchtune's CEWithChunkedOutputLoss (num_output_chunks=8) upcasts one chunk in eight at a time: an fp32 copy and its
# log-softmax (8 bytes) of 1/8 of the logits beside the half-precision logits.
CHUNKED_LOSS = {Library.litgpt: (4.0, 4.0), Library.torchtune: (None, 8.0 / 8)}  # (held, peak beyond held); None: act bytes


def chunked_loss(t: StackTables, ft: FineTune, act_bytes: float) -> StackTables:
    """The logits' bytes per element where the fine-tuning library chunks the loss (CHUNKED_LOSS)."""
    if ft.library not in CHUNKED_LOSS:
        return t
    held, extra = CHUNKED_LOSS[ft.library]  # (None: the activation dtype's)
    return replace(t, logits_held=held or act_bytes, logits_peak=(held or act_bytes) + extra)


def stack_modules(stack: Stack, modules: tuple[str, ...]):
    """The stack's selective policy where it costs every one of --recompute-modules' ``modules`` (else a StackError)."""
    sel = stack.engine.selective
    if sel is None or not sel.modules:
        raise StackError(f"stack {stack.name} has no --recompute-modules (its selective recomputation is fixed): drop it")
    if unknown := [m for m in modules if m not in sel.modules]:
        raise StackError(f"--recompute-modules {','.join(unknown)}: stack {stack.name} costs {', '.join(sel.modules)}")
    return sel


def check_modules(model: ModelSpec, layer: DecoderLayer, stack: Stack, modules: tuple[str, ...]) -> None:
    """--recompute-modules: each a sub-module the stack costs, on a layer that has it (one line otherwise)."""
    sel = stack_modules(stack, modules)
    has = {"routed": layer.routed, "latent": model.latent is not None, "dense": not layer.routed}
    for m in modules:
        need = sel.modules[m].needs
        if need is not None and not has[need]:
            what = {"routed": "routed experts", "latent": "multi-head latent attention",
                    "dense": "dense MLP layers (its MoE layers are costed as routed)"}[need]
            raise StackError(f"--recompute-modules {m} needs {what}, which {model.name} does not have")


def _mode(stack, setup: TrainingSetup) -> Mode:
    """The precision mode the stack's kernels run: a stack that casts the model itself runs mixed as half."""
    mode = setup.precision.mode
    return Mode.half if stack.engine.module_dtype == "half" and mode is Mode.mixed else mode


def _costs(stack, model: ModelSpec, setup: TrainingSetup) -> bool:
    """Whether the stack builds the model and its profile has kernel tables for it (a hint's candidates)."""
    try:
        return runs_model(stack, model) and stack.tables(_mode(stack, setup).value, setup.attention.value,
                                                         expert.table_layer(model.layer), setup.compile) is not None
    except StackError:
        return False


def lacked(stack, model: ModelSpec) -> list[str]:
    """What of the model's decoder the stack's model code cannot build (engine.lacks), in words."""
    has = {"parallel_blocks": lambda: ["parallel attention + MLP blocks"] if model.parallel_block else [],
           "alibi": lambda: ["ALiBi positions"] if model.position is PositionKind.alibi else [],
           "learned_positions": lambda: ["learned positions"] if model.position is PositionKind.learned else [],
           "beyond_llama": model.llama_departures,
           "chunked_attention": lambda: ["chunked attention"] if any(r.chunk for r in model.layer_runs) else [],
           "llama4_experts": lambda: (["Llama 4's routed experts as routed (transformers 5.23 Llama4TextExperts runs every "
                                      "expert on every token, one dense bmm)"] if model.family == "llama4_text" else [])}
    return list(dict.fromkeys(w for k in stack.engine.lacks for w in has[k]()))


def stack_setup(setup: TrainingSetup, stack, model: Optional[ModelSpec] = None) -> TrainingSetup:
    """The setup as the stack runs it: the stack named where auto or any chose it, its default optimizer (the first
    of engine.optimizers: transformers 5.23's adamw_torch_fused, torchtitan's "fused", Megatron's FusedAdam; torch's
    foreach AdamW in litgpt, llm-foundry, nanotron) where none was asked, and with the model, LoRA targets as PEFT
    adapts its transformers modules where the stack runs PEFT (advisor.peft_modules; a one-line PlanError), gate and up
    as one adapter where the stack's modules fuse them (engine.adapter_modules: Megatron's linear_fc1)."""
    update = {"stack": stack.name} if setup.stack in ("auto", "any") else {}
    if setup.optimizer is None:
        update["optimizer"] = Optimizer(stack.engine.optimizers[0])
    if model is not None:
        from advisor.peft_modules import targets_as_run

        ft = targets_as_run(model, setup.finetune, stack)
        if ft is not setup.finetune:
            update["finetune"] = ft
    return setup.model_copy(update=update) if update else setup


def runs_model(stack, model: ModelSpec) -> bool:
    """Whether the stack's model code builds the model's decoder (engine.lacks)."""
    return not lacked(stack, model)


def runs_method(kind: str) -> list[str]:
    """The shipped stacks that run fine-tuning method ``kind`` (engine.methods)."""
    return [n for n in list_stacks() if kind in load_stack(n).engine.methods]


def moe_choices(stack, setup, hw=None) -> tuple[str, str]:
    """(dispatcher, overlap) of a workload: the ones asked, else the stack's defaults; one a stack does not run, a flex
    dispatcher taking every SM of the GPU (a custom stack profile), or a capacity factor on dropless routers: one line."""
    eng = stack.engine
    if setup.moe_capacity_factor is not None and not eng.moe_capacity:  # dropless routers (engine.moe_capacity)
        ok = " or ".join(n for n in list_stacks() if load_stack(n).engine.moe_capacity) or "another"
        raise StackError(f"--moe-capacity-factor {setup.moe_capacity_factor:g}: stack {stack.name}'s MoE routing is "
                         f"dropless (no expert capacity): drop it, or use --stack {ok}")
    dispatcher = setup.moe_dispatcher or eng.moe_dispatchers[0]
    overlap = setup.moe_overlap or eng.ep_alltoall_overlap
    if dispatcher not in eng.moe_dispatchers:
        raise StackError(f"stack {stack.name} has no {dispatcher} token dispatcher: use --moe-dispatcher "
                         f"{' or '.join(eng.moe_dispatchers)}")
    if overlap not in eng.ep_overlaps():
        raise StackError(f"stack {stack.name} does not overlap the expert all-to-alls with {overlap.replace('_', '-')}: "
                         f"use --moe-overlap {' or '.join(o.replace('_', '-') for o in eng.ep_overlaps())}")
    sms, n = (hw.gpu.sm_count if hw is not None else None), eng.flex_dispatcher_sms
    if dispatcher == "flex" and sms and n and n >= sms:
        raise StackError(f"stack {stack.name}'s flex dispatcher takes {n} SMs and the {hw.gpu.name} has {sms}: lower "
                         f"engine.flex_dispatcher_sms below {sms}")
    return dispatcher, overlap


def tp_overlap_choice(stack, setup, hw=None) -> str:
    """The TP overlap asked, else the stack's; one it does not run, or userbuffers taking every SM: one line."""
    eng = stack.engine
    overlap = setup.tp_overlap or eng.tp_comm_overlap
    if overlap not in eng.tp_overlaps():
        raise StackError(f"stack {stack.name} does not overlap its TP collectives with {overlap}: use --tp-overlap "
                         f"{' or '.join(eng.tp_overlaps())}")
    # async TP is Inductor's micro-pipeline pass (torch/_inductor/fx_passes/micro_pipeline_tp.py): torchtitan's
    # CompileConfig refuses it without compile.enable and "model" in compile.components
    if overlap == "async" and "model" not in compile_parts(setup.compile):
        raise StackError("--tp-overlap async is a pass of torch.compile (Inductor's micro-pipeline TP): add --compile "
                         "model,loss (or model), or use --tp-overlap none")
    sms = hw.gpu.sm_count if hw is not None else None
    if overlap == "userbuffers" and sms and max(eng.userbuffers.pipeline_sms, eng.userbuffers.bulk_sms) >= sms:
        raise StackError(f"stack {stack.name}'s userbuffers take {max(eng.userbuffers.pipeline_sms, eng.userbuffers.bulk_sms)} "
                         f"SMs from a GEMM and the {hw.gpu.name} has {sms}: lower engine.userbuffers' SMs below {sms}")
    return overlap


def adapter_targets(stack, setup) -> None:
    """LoRA targets the stack's adapters cannot take (engine.adapter_modules fused), as a one-line StackError."""
    ft = setup.finetune
    if not ft.adapters or stack.engine.adapter_modules != "fused":
        return
    t = set(ft.target_set)
    if t & {"q", "k", "v"} or ("gate" in t) != ("up" in t) or "head" in t:
        raise StackError(f"--lora-targets {ft.targets}: stack {stack.name}'s LoRA adapts whole fused modules (q, k and v as"
                         f" one qkv; gate with up) and not the head: use --lora-targets {fused_targets(t)}, or --stack hf-trainer")


def trains_in(stack, setup, model: Optional[ModelSpec] = None) -> None:
    """The setup's MTP depths, precision and optimizer where the stack does not train in them (engine.mtp, precisions,
    optimizers), as a one-line StackError naming the stacks that do (and build ``model``)."""
    held, optimizers, asked = stack.engine.precisions, stack.engine.optimizers, setup.precision.value
    if (no_mtp := stack.mtp_refusal(model, setup.mtp_layers)) is not None:
        raise StackError(no_mtp)
    if held is not None and asked not in held:
        kin = [p for p in held if p.split("-")[0] == asked.split("-")[0] and p != "fp8-mixed"]  # the same kind first
        instead = kin[0] if kin else "bf16-mixed" if "bf16-mixed" in held else held[0]
        others = [n for n in list_stacks() if (st := load_stack(n)).superseded_by is None and (model is None or runs_model(
                  st, model)) and (st.engine.precisions is None or asked in st.engine.precisions)]
        raise StackError(f"stack {stack.name} does not train in {asked} (it trains in {', '.join(held)}): use --precision "
                         f"{instead}, or --stack {' or '.join(others) or 'another'}")
    if setup.optimizer is not None and setup.optimizer.value not in optimizers:
        raise StackError(f"stack {stack.name} does not train with {setup.optimizer.value} (it trains with "
                         f"{', '.join(optimizers)}): use --optimizer {optimizers[0]}")


def why_not(stack, setup) -> Optional[str]:
    """Why the stack does not run the setup's explicit choices (its fine-tuning method, precision, optimizer, MTP, token
    dispatcher, all-to-all and TP overlaps, recomputed sub-modules, torch.compile, FP8 attention), one line; None where it runs them."""
    if setup.finetune.kind not in stack.engine.methods:
        return f"stack {stack.name} does not run --method {setup.finetune.kind}"
    if refusal := stack.compile_refusal(setup.compile):
        return refusal
    try:
        trains_in(stack, setup), moe_choices(stack, setup), tp_overlap_choice(stack, setup), adapter_targets(stack, setup)
        fp8_attention_choice(stack, setup)
        if setup.recompute_modules is not None:
            stack_modules(stack, setup.recompute_modules)
    except (StackError, RecipeError) as exc:
        return str(exc)
    return None


def stack_runs(stack, setup) -> bool:
    """Whether the stack runs the setup's explicit choices (why_not; --stack auto picks a stack that does)."""
    return why_not(stack, setup) is None
