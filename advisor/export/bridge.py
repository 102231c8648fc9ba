"""Megatron-Bridge: a YAML file of ConfigContainer overrides, merged onto a recipe's config.

The form is the one Megatron-Bridge itself parses: megatron-bridge 0.6.2,
megatron/bridge/training/utils/omegaconf_utils.py ``process_config_with_overrides(config, config_filepath,
cli_overrides)`` converts the recipe's ConfigContainer to OmegaConf (``create_omegaconf_dict_config``), merges the YAML
file (``OmegaConf.load`` + ``OmegaConf.merge``), then any Hydra ``key=value`` overrides (``parse_hydra_overrides``),
and writes the result back (``apply_overrides``). Its override parser takes a list of strings, not a file, so the
plan is the YAML file (comments allowed) and the user's own ``key=value`` overrides stay free. ``apply_overrides`` only
warns on a key the config lacks, so every key written here is one checked in 0.6.2's source (tests/test_export_bridge.py
also runs each key through ``parse_hydra_overrides``, which refuses unknown keys): training/config.py ConfigContainer
(``model``, ``train``, ``dataset``, ``ddp``, ``optimizer``, ``dist``, ``checkpoint``, ``mixed_precision``: a recipe
name from training/mixed_precision.py), the model provider's megatron-core TransformerConfig fields, and
recipes/common.py ``_pretrain_common`` (whose defaults, e.g. the distributed optimizer and both overlaps on, are
overwritten explicitly).

The recipe gives the model's family (tokenizer, vocab, norm and activation kernels); the file writes its shape, the
parallel degrees, batch, recompute, precision recipe and data parallelism, as the Megatron-LM export does
(megatron.py: the same refusals). Data, optimizer and checkpoint paths stay the user's.
"""

from __future__ import annotations

from typing import Optional

import yaml

from advisor.export.common import Exported, ExportError, Plan, Precision, TrainingSetup, check, global_batch, header
from advisor.export.megatron import (CP_COMM_TYPE, costed_stack, layout_chunks, megatron_env, pipeline_edge_layers,
                                     refuse_unwritable)
from advisor.export.megatron_shape import (every_linear_biased, glu_fields, nope_pattern, position_type, quick_glu,
                                           rope_fields, router_fields, windows)
from advisor.hardware import Hardware
from advisor.model import MLPKind, ModelSpec, NormKind
from advisor.stack import Stack
from advisor.workload import moe_choices, tp_overlap_choice

# advisor's precision recipes as Megatron-Bridge's mixed-precision recipe names (training/mixed_precision.py
# MIXED_PRECISION_RECIPES): (name, BF16 layers it keeps at each end, whether it gathers quantised parameters, what else
# it sets beyond the advisor's costing, written as a note). megatron-bridge 0.6.2: bf16_with_fp8_current_scaling_mixed
# sets first_last_layers_bf16 with num_layers_at_start/end_in_bf16 = 1, the others leave MixedPrecisionConfig's False;
# each sets fp8_param_gather / fp4_param_gather True except the subchannel (blockwise) one (False)
BRIDGE_RECIPES = {
    "fp8-tensorwise": ("bf16_with_fp8_current_scaling_mixed", 1, True, ""),
    "fp8-delayed": ("bf16_with_fp8_delayed_scaling_mixed", 0, True, "with a 1024-step amax history"),
    "fp8-blockwise": ("bf16_with_fp8_subchannel_scaling_mixed", 0, False,
                      "uses the hybrid FP8 format (E5M2 gradients) where the Megatron-LM export writes e4m3"),
    "mxfp8": ("bf16_with_mxfp8_mixed", 0, True, "reuses the gradient buffer for the MXFP8 parameter all-gather "
                                                "(reuse_grad_buf_for_mxfp8_param_ag)"),
    "nvfp4": ("bf16_with_nvfp4_mixed", 0, True, ""),
}


def bridge_overrides(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup,
                     grad_accum: int, stack: Optional[Stack] = None) -> tuple[dict, list[str]]:
    """The nested overrides ({section: {field: value}}) and the notes."""
    stack = costed_stack(setup, stack)
    refuse_unwritable(model, plan, setup, "Megatron-Bridge", "overrides", stack)
    notes: list[str] = []
    m = {"tensor_model_parallel_size": plan.tp, "pipeline_model_parallel_size": plan.pp,
         "virtual_pipeline_model_parallel_size": None, "context_parallel_size": plan.cp,
         "sequence_parallel": bool(plan.sp and plan.tp > 1), "seq_length": setup.seq_len}
    if plan.cp > 1:
        m["cp_comm_type"] = CP_COMM_TYPE[plan.cp_comm.value]
    m.update(_pipeline(model, plan, setup.mtp_layers))
    # multi-token prediction (advisor.mtp): written whatever its value, since a DeepSeek-V3 recipe sets 1 (recipes/deepseek/
    # h100/deepseek_v3.py:123) and None turns it off there ("Set to 0 or None to disable MTP")
    m["mtp_num_layers"] = setup.mtp_layers or None
    if plan.pp > 1 and plan.schedule == "gpipe":
        notes.append("Megatron has no GPipe schedule: it runs 1F1B (less activation memory than estimated)")
    m.update(_recompute(setup))
    m.update(_model_shape(model))
    m.update(_experts(model, plan, setup, notes, stack))
    if plan.sp and plan.tp > 1 and tp_overlap_choice(stack, setup) == "userbuffers":
        notes.append("the TP collectives were costed pipelined with their GEMMs: set comm_overlap.tp_comm_overlap=true "
                     "with a userbuffers config for this shape (comm_overlap.tp_comm_overlap_cfg)")
    if setup.attention.value == "eager":
        notes.append("eager attention: Megatron uses fused attention kernels; memory will be lower than estimated")
    out = {"model": m,
           "train": {"micro_batch_size": setup.micro_batch,
                     "global_batch_size": global_batch(plan, setup, grad_accum)},
           "dataset": {"seq_length": setup.seq_len}}
    out.update(_data_parallel(hw, plan, notes))
    if getattr(setup.optimizer, "value", None) == "sgd":  # costed with one momentum state (advisor.optimizer)
        out["optimizer"]["optimizer"] = "sgd"  # megatron-core optimizer_config.py:209 (default "adam", two states)
    if setup.finetune.adapters:
        out["peft"] = _peft(model, setup, notes)
    out["mixed_precision"] = _precision(setup, notes, stack)
    return out, notes


# advisor's canonical LoRA targets -> megatron-core's module names (megatron-bridge 0.6.2 peft/lora.py LoRA.target_modules:
# linear_qkv, linear_proj, linear_fc1, linear_fc2): one linear_qkv holds q, k and v, and a gated MLP's linear_fc1 its
# gate and up projections
BRIDGE_LORA_MODULES = (("qkv", "linear_qkv"), ("o", "linear_proj"), ("up", "linear_fc1"), ("gate_up", "linear_fc1"),
                       ("down", "linear_fc2"))


def _peft(model: ModelSpec, setup: TrainingSetup, notes: list[str]) -> dict:
    """ConfigContainer.peft for LoRA / DoRA adapters (training/config.py peft: Optional[PEFT]), as a _target_ the
    overrides instantiate (training/utils/omegaconf_utils.py apply_overrides): LoRA's or DoRA's target_modules, dim,
    alpha, dropout (peft/lora.py:101-106, peft/dora.py:59-65)."""
    ft = setup.finetune
    targets = set(ft.target_set)
    if targets & {"q", "k", "v"}:
        raise ExportError(f"--lora-targets {ft.targets}: megatron-core projects q, k and v as one linear_qkv, which "
                          "Bridge's LoRA adapts whole: use --lora-targets qkv (with o, gate,up, down as wanted)")
    if "head" in targets:
        raise ExportError("Bridge's LoRA adapts the decoder layers' linears, not the output layer: drop the head from "
                          "--lora-targets")
    if model.mlp.gated and ("gate" in targets) != ("up" in targets):
        raise ExportError("megatron-core's linear_fc1 holds the gate and up projections fused: target both "
                          "(gate_proj,up_proj) or neither")
    if ft.lora_alpha != int(ft.lora_alpha):
        raise ExportError(f"--lora-alpha {ft.lora_alpha:g}: Bridge's LoRA takes a whole alpha (peft/lora.py alpha: int)")
    notes.append("fine-tuning: set checkpoint.pretrained_checkpoint to the base model's Megatron checkpoint, as Bridge's "
                 "peft recipes do")
    return {"_target_": f"megatron.bridge.peft.{'dora.DoRA' if ft.dora else 'lora.LoRA'}",
            "target_modules": [name for canon, name in BRIDGE_LORA_MODULES if canon in targets],
            "dim": ft.lora_rank, "alpha": int(ft.lora_alpha), "dropout": ft.lora_dropout}


def _pipeline(model: ModelSpec, plan: Plan, mtp: int = 0) -> dict:
    """The uneven split (account_for_*_in_pipeline_split or first/last stage layers) and interleaving, as
    megatron.py writes them (TransformerConfig field names)."""
    if plan.pp <= 1:
        return {}
    out: dict = {}
    chunks = layout_chunks(model.n_layers, plan)
    if chunks is not None:  # TransformerConfig.pipeline_model_parallel_layout as a list of chunks (as Bridge's recipes)
        return {"pipeline_model_parallel_layout": [["embedding"] * (i == 0) + ["decoder"] * n
                                                   + (["mtp"] * mtp + ["loss"]) * (i == len(chunks) - 1)
                                                   for i, n in enumerate(chunks)],
                "virtual_pipeline_model_parallel_size": plan.virtual_stages if plan.schedule == "interleaved" else None}
    if plan.pp_split.value == "edges":
        out = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    else:
        edges = pipeline_edge_layers(model.n_layers, plan.pp)  # where none realise the split: a layout (above)
        if edges is not None:
            out = {"num_layers_in_first_pipeline_stage": edges[0], "num_layers_in_last_pipeline_stage": edges[1]}
    if plan.schedule == "interleaved":
        # TransformerConfig has no layers-per-virtual-stage field: the virtual size is written (the same split
        # --num-layers-per-virtual-pipeline-stage gives when the stages divide the layers)
        if plan.pp_split.value != "edges" and model.n_layers % (plan.pp * plan.virtual_stages):
            raise ExportError(f"{model.n_layers} layers do not split into pp={plan.pp} x {plan.virtual_stages} "
                              "virtual stages evenly: use --pp-split edges or other --virtual-stages")
        out["virtual_pipeline_model_parallel_size"] = plan.virtual_stages
    return out


def _recompute(setup: TrainingSetup) -> dict:
    """recompute_granularity / recompute_method / recompute_num_layers (TransformerConfig), as megatron.py."""
    r, k = setup.recompute.value, setup.recompute_layers
    if r in ("full", "block"):
        return {"recompute_granularity": "full", "recompute_method": "uniform" if r == "full" else "block",
                "recompute_num_layers": k}
    if r == "selective":
        return {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None,
                "recompute_modules": list(setup.recompute_modules or ("core_attn",))}
    none = {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}
    if r == "offload":  # Transformer Engine's CPU offload of the first k layers (as the GB200/GB300 Llama recipes set it)
        return {**none, "cpu_offloading": True, "cpu_offloading_num_layers": k}
    if r != "none":
        raise ExportError(f"Megatron has no {r} checkpointing: use --recompute full, block, selective or offload, or "
                          "another --format")
    return none


def _model_shape(model: ModelSpec) -> dict:
    """The model's shape as the provider's TransformerConfig fields (activation_func by its activation_map name).

    RoPE's base and scaling and the norms' epsilon are not overridden: megatron-bridge 0.6.2's recipes build their
    provider from the model's Hugging Face config (AutoBridge.from_hf_pretrained(...).to_megatron_provider, as all but
    a few hand-built ones do), which maps rms_norm_eps to layernorm_epsilon and rope_theta to rotary_base
    (models/conversion/model_bridge.py CONFIG_MAPPING, rope_theta_from_hf), YaRN's rope_scaling
    (YARN_ROPE_SCALING_MAPPING, MLA_ROPE_SCALING_MAPPING) and Llama 3.1's (models/llama/llama_bridge.py): the
    model's own recipe already carries them (the header asks for it)."""
    quick = quick_glu(model)
    m = {"num_layers": model.n_layers, "hidden_size": model.d_model, "ffn_hidden_size": model.d_ff,
         "num_attention_heads": model.n_heads, "num_query_groups": model.kv_heads,
         "gated_linear_unit": model.mlp is MLPKind.swiglu or quick,
         # megatron-bridge 0.6.2 utils/activation_map.py ACTIVATION_FUNC_MAP: "silu", "gelu", "quick_gelu" (megatron-core
         # fused_bias_geglu.quick_gelu, GPT-OSS's experts' x sigmoid(1.702 x), with glu_linear_offset 1 below)
         "activation_func": "quick_gelu" if quick else "silu" if model.mlp is MLPKind.swiglu else "gelu",
         "normalization": "RMSNorm" if model.norm is NormKind.rmsnorm else "LayerNorm",
         # the recipe's own YaRN (e.g. GPT-OSS's provider: yarn, gpt_oss_bridge.py:65) kept, not overwritten by rope
         "position_embedding_type": position_type(model),
         "add_bias_linear": every_linear_biased(model),
         "add_qkv_bias": bool(model.qkv_bias and not every_linear_biased(model)),
         "share_embeddings_and_output_weights": bool(model.tied_embeddings)}
    if model.head_dim is not None and model.head_dim * model.n_heads != model.d_model:
        m["kv_channels"] = model.head_dim
    m.update(glu_fields(model))  # GPT-OSS's offset and clamp (megatron_shape.mlp_flags' fields)
    if model.attention_sinks:  # a learned logit a head beside the keys (dot_product_attention.py:126)
        m["softmax_type"] = "learnable"
    size, skip = windows(model)  # megatron_shape.windows
    if size is not None:
        m.update(window_size=list(size), **({} if skip is None else {"window_attn_skip_freq": skip}))
    if model.nope_layers:
        m["no_rope_freq"] = nope_pattern(model)
    return {**m, **rope_fields(model)}  # partial and interleaved RoPE, q/k L2 norms (megatron_shape)


def _experts(model: ModelSpec, plan: Plan, setup: TrainingSetup, notes: list[str], stack: Stack) -> dict:
    """Mixture of experts (TransformerConfig moe_* fields), as megatron.py's _experts."""
    e = model.experts
    if e is None:
        return {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": None}
    m = {"num_moe_experts": e.n_experts, "moe_ffn_hidden_size": e.d_ff_expert, "moe_router_topk": e.experts_per_token,
         "expert_model_parallel_size": plan.ep, "expert_tensor_parallel_size": plan.tp if plan.etp is None else plan.etp,
         "moe_grouped_gemm": True, "moe_token_dispatcher_type": "alltoall"}
    dispatcher, overlap = moe_choices(stack, setup)  # as the plan was costed
    if dispatcher == "flex":  # on the SMs costed (engine.flex_dispatcher_sms), the field the perf recipes set
        m.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                 moe_hybridep_num_sms=stack.engine.flex_dispatcher_sms)
    if e.d_ff_shared:
        m["moe_shared_expert_intermediate_size"] = e.d_ff_shared
    if e.groups > 1:  # group-limited routing (TransformerConfig moe_router_num_groups / moe_router_group_topk)
        m.update(moe_router_num_groups=e.groups, moe_router_group_topk=e.group_topk)
    m.update(router_fields(e))  # score function, expert bias, pre-softmax, scaling (megatron_shape)
    m["moe_shared_expert_overlap"] = bool(overlap == "shared_experts" and e.d_ff_shared and plan.ep > 1)
    if overlap == "batch" and plan.ep > 1:  # comm_overlap's field (training/comm_overlap.py CommOverlapConfig)
        notes.append("the all-to-alls were costed beside another micro-batch's compute: set "
                     "comm_overlap.overlap_moe_expert_parallel_comm=true")
    runs = [(r.count, r.dense) for r in model.layer_runs] or [(model.n_layers, False)]
    if any(dense for _, dense in runs):  # a list: 0 a dense layer, 1 an MoE layer (TransformerConfig moe_layer_freq)
        m["moe_layer_freq"] = [int(not dense) for count, dense in runs for _ in range(count)]
    if setup.moe_capacity_factor is not None:
        m.update(moe_expert_capacity_factor=setup.moe_capacity_factor, moe_token_drop_policy="probs")
    if setup.moe_imbalance != 1.0:
        notes.append(f"the estimate assumed routing {setup.moe_imbalance:g}x imbalanced on the busiest expert rank; "
                     "Megatron's router balances by its auxiliary loss (model.moe_aux_loss_coeff)")
    return m


def _data_parallel(hw: Hardware, plan: Plan, notes: list[str]) -> dict:
    """ZeRO-1 = distributed optimizer, ZeRO-2/3 = Megatron-FSDP (ddp + dist use_megatron_fsdp, sharding strategy,
    fsdp_dtensor checkpoints: training/config.py _validate_and_apply_megatron_fsdp_configs), HSDP = optimizer
    instances. Both DDP and optimizer flags are written (config.py _validate_and_sync_distributed_optimizer_settings
    turns both on if either is)."""
    zero1, overlap = plan.zero >= 1, plan.dp > 1
    ddp = {"use_distributed_optimizer": zero1, "overlap_grad_reduce": bool(plan.overlap_grad_reduce and overlap),
           "overlap_param_gather": zero1 and overlap, "use_megatron_fsdp": plan.zero >= 2}
    out = {"ddp": ddp, "optimizer": {"use_distributed_optimizer": zero1, "overlap_param_gather": zero1 and overlap},
           "dist": {"use_megatron_fsdp": plan.zero >= 2}}
    if plan.offload.value == "optimizer-cpu":  # megatron-core's HybridDeviceOptimizer (megatron.py refuse_unwritable)
        out["optimizer"].update(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                                use_precision_aware_optimizer=True)
    if plan.zero >= 2:
        strategy = {2: "optim_grads", 3: "optim_grads_params"}[plan.zero]
        ddp["data_parallel_sharding_strategy"] = strategy
        out["checkpoint"] = {"ckpt_format": "fsdp_dtensor"}
        notes.append(f"ZeRO-{plan.zero} maps to Megatron-FSDP ({strategy}); it saves checkpoints only as fsdp_dtensor")
    if plan.hybrid_shard:
        ddp["num_distributed_optimizer_instances"] = plan.dp // hw.gpus_per_node
        notes.append("HSDP: Megatron-FSDP shards inside each distributed-optimizer instance (one per node) "
                     "and replicates across instances")
    return out


def _precision(setup: TrainingSetup, notes: list[str], stack: Stack) -> str:
    """The mixed_precision recipe name (training/mixed_precision.py); where the recipe runs otherwise than the stack
    the plan was costed in (BF16 edge layers, quantised parameters, fp32 gradient reduction), a note. The YAML cannot
    override the recipe's fields: ConfigContainer's mixed-precision setup writes them over the model's and DDP's."""
    p, eng = setup.precision, stack.engine
    if p.recipe is not None:
        if p.value not in BRIDGE_RECIPES:
            raise ExportError(f"--precision {p.value}: Megatron-Bridge has no matching mixed-precision recipe "
                              f"(torchao's): pick one of {', '.join(BRIDGE_RECIPES)} or --format megatron")
        name, edges, quantised, extra = BRIDGE_RECIPES[p.value]
        costed = eng.edge_layers_in_bf16(p.recipe)
        if edges != costed:
            if p.value == "nvfp4":  # the model's layers would differ from the estimate's, not only a note's worth
                raise ExportError(f"--precision nvfp4: {name} runs every layer in NVFP4, the estimate ({stack.name}) "
                                  f"kept {costed} at each end in BF16: export it from --stack megatron-bridge-perf, or "
                                  "--format megatron (--first-last-layers-bf16)")
            notes.append(f"{name} {_edges(edges, p.recipe.format)} (first_last_layers_bf16); the estimate "
                         f"({stack.name}) {_edges(costed, p.recipe.format)}")
        if quantised != eng.low_precision_params:
            flag = f"{p.recipe.format}_param_gather"
            notes.append(f"{name} keeps and gathers the layers' weights in {p.recipe.format.upper()} ({flag}); the "
                         f"estimate ({stack.name}) in BF16" if quantised else
                         f"{name} keeps the layers' weights in BF16; the estimate ({stack.name}) in "
                         f"{p.recipe.format.upper()}")
        if extra:
            notes.append(f"{name} {extra}")
        if setup.fp8_attention:  # the recipe's False overwrites the model's (mixed_precision.py:138-156)
            notes.append(f"FP8 attention was costed: set cfg.mixed_precision.fp8_dot_product_attention = True in the recipe "
                         f"(as perf_recipes/qwen/common.py:57 does); {name}, which this file names, keeps it False")
        _reduce_note(name, eng, stack.name, notes)
        return name
    if p is Precision.fp16_mixed:
        return "fp16_mixed"
    if p is Precision.bf16:
        # Megatron-LM's --main-params-dtype, which sets it, takes fp32 or fp16 (arguments.py)
        notes.append("pure bf16 was costed (no fp32 master weights): bf16_mixed keeps fp32 main params (the "
                     "precision-aware optimizer's main_params_dtype is fp32 or fp16), so the run holds more memory than "
                     "estimated")
    if p in (Precision.bf16_mixed, Precision.bf16):
        _reduce_note("bf16_mixed", eng, stack.name, notes)
        return "bf16_mixed"
    raise ExportError(f"--precision {p.value}: Megatron-Bridge's recipes train in bf16 or fp16 mixed precision "
                      "(mixed_precision: null leaves the recipe's model dtype)", instead="megatron")


def _edges(n: int, fmt: str) -> str:
    return (f"runs every layer in {fmt.upper()}" if n == 0 else "keeps the first and the last layer in BF16" if n == 1
            else f"keeps {n} layers at each end in BF16")


def _reduce_note(name: str, eng, stack: str, notes: list[str]) -> None:
    """Every Bridge recipe reduces gradients in fp32 (MixedPrecisionConfig.grad_reduce_in_fp32 True), except where
    the perf recipes turn it off (perf_recipes/_common.py)."""
    if eng.reduce_dtype != "fp32" or eng.main_grads != "fp32":
        notes.append(f"{name} accumulates and reduces gradients in fp32 (grad_reduce_in_fp32); the estimate ({stack}) "
                     "in bf16, as Megatron-Bridge's perf recipes set it")


def bridge_config(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                  world_size: int, stack: Optional[Stack] = None) -> Exported:
    """The overrides file of one plan; ``stack``: the stack it was costed in (None: ``setup.stack``, a shipped name)."""
    check(model, hw, plan, setup, grad_accum, world_size)
    overrides, notes = bridge_overrides(model, hw, plan, setup, grad_accum, stack)
    lines = [f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
             "# Megatron-Bridge ConfigContainer overrides (megatron-bridge 0.6.2): merge onto a pretrain recipe with",
             "#   process_config_with_overrides(cfg, config_filepath=THIS_FILE, cli_overrides=[...])",
             "#   (megatron/bridge/training/utils/omegaconf_utils.py): it merges this YAML, then Hydra key=value overrides.",
             f"# The recipe sets the family: pick {model.name}'s (tokenizer, vocab {model.vocab}); data, optimizer and",
             f"# checkpoint settings are yours. Launch {world_size} ranks, {hw.gpus_per_node} a node (torchrun).",
             *(f"# environment: export {k}={v}" if v else f"# environment: unset {k} (Megatron-FSDP refuses 1)"
               for k, v in megatron_env(plan, notes).items()),
             *(f"# note: {n}" for n in notes)]
    body = yaml.safe_dump(overrides, sort_keys=False, default_flow_style=False, width=120)
    return Exported("bridge_overrides.yaml", "\n".join(lines) + "\n" + body, tuple(notes))
