"""Megatron-DeepSpeed: Megatron's pretrain_gpt.py under the DeepSpeed engine (a stack that launches both the megatron
and the deepspeed formats: stack_profiles/megatron-deepspeed.yaml, vTrain's and SC21's runs). Its plans are costed as
DeepSpeed's ZeRO (advisor.zero_engine), so its script launches that engine: the Megatron flags without megatron-core's
own data parallelism (--use-distributed-optimizer, Megatron-FSDP, --overlap-grad-reduce), DeepSpeed's launch
arguments, and the deepspeed format's JSON (the same dict, advisor.export.deepspeed.deepspeed_dict) written beside the
script before it launches.

A flag megatron-core grew after the fork branched is refused (FORK_LACKS), never written for a parser that lacks it.
"""

from __future__ import annotations

import json
from typing import Optional

from advisor.export.common import ExportError, Plan, TrainingSetup, argv_lines
from advisor.export.deepspeed import NOTES_KEY, deepspeed_dict
from advisor.hardware import Hardware
from advisor.model import ModelSpec
from advisor.stack import Stack

CONFIG = "ds_config.json"
# the heredoc's end word: a line the JSON (json.dumps, indent 2: every line but the braces indented) cannot hold
END = "ADVISOR_DS_CONFIG"

# The Megatron flags advisor writes whose megatron-core field (or GPTModel argument) megatron-core 0.8.0 (July 2024,
# after the 2023 fork this stack profiles) does not have: its transformer/transformer_config.py and
# model_parallel_config.py dataclasses and models/gpt/gpt_model.py GPTModel.__init__ (position_embedding_type
# learned_absolute / rope / none, rotary_percent, rotary_base, seq_len_interpolation_factor; no rope_scaling) lack
# each field named here, which megatron-core 0.16.1's have (tests/test_export_megatron_deepspeed.py). The fork's own
# parser is not on PyPI: what 0.8 still had (e.g. --window-size, --num-experts) is not refused, though the fork's
# DeepSpeed-MoE may name it otherwise.
FORK_LACKS = {
    # multi-head latent attention (MLATransformerConfig, absent from 0.8)
    "--multi-latent-attention": "multi_latent_attention", "--kv-lora-rank": "kv_lora_rank",
    "--q-lora-rank": "q_lora_rank", "--qk-head-dim": "qk_head_dim", "--qk-pos-emb-head-dim": "qk_pos_emb_head_dim",
    "--v-head-dim": "v_head_dim", "--rotary-scaling-factor": "rotary_scaling_factor", "--mscale": "mscale",
    "--mscale-all-dim": "mscale_all_dim",
    # GPT-OSS's learned sinks and clamped GLU; NoPE layers, windows on some layers, L2 q/k norms; Llama 3.1's scaling
    "--softmax-type": "softmax_type", "--glu-linear-offset": "glu_linear_offset",
    "--activation-func-clamp-value": "activation_func_clamp_value", "--no-rope-freq": "no_rope_freq",
    "--window-attn-skip-freq": "window_attn_skip_freq", "--qk-l2-norm": "qk_l2_norm", "--use-rope-scaling": "rope_scaling",
    # megatron-core's MoE beyond 0.8's (the fork's MoE is DeepSpeed-MoE's)
    "--moe-ffn-hidden-size": "moe_ffn_hidden_size", "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
    "--moe-layer-freq": "moe_layer_freq", "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
    "--moe-router-num-groups": "moe_router_num_groups", "--moe-router-group-topk": "moe_router_group_topk",
    "--moe-router-score-function": "moe_router_score_function",
    "--moe-router-enable-expert-bias": "moe_router_enable_expert_bias",
    "--moe-router-topk-scaling-factor": "moe_router_topk_scaling_factor",
    "--moe-apply-probs-on-input": "moe_apply_probs_on_input", "--moe-shared-expert-overlap": "moe_shared_expert_overlap",
    "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
    "--moe-flex-dispatcher-backend": "moe_flex_dispatcher_backend", "--moe-hybridep-num-sms": "moe_hybridep_num_sms",
    # plan flags: CP's flavour, selective modules, multi-token prediction, uneven pipelines, FP8 / FP4 recipes
    "--cp-comm-type": "cp_comm_type", "--recompute-modules": "recompute_modules", "--mtp-num-layers": "mtp_num_layers",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
    "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--fp8-recipe": "fp8_recipe", "--fp4-recipe": "fp4_recipe", "--first-last-layers-bf16": "first_last_layers_bf16",
}


def runs_deepspeed(stack: Optional[Stack]) -> bool:
    """Whether the stack's Megatron flags run under the DeepSpeed engine: it launches the deepspeed format beside the
    megatron one (Megatron-DeepSpeed; megatron-core launches megatron and megatron-bridge)."""
    return stack is not None and {"megatron", "deepspeed"} <= set(stack.launch)


def fork_context_parallel(plan: Plan, args: list) -> list:
    """The plan's context parallelism as the profile says the fork runs it (stack_profiles/megatron-deepspeed.yaml
    context_parallel): the ring as --context-parallel-size alone (megatron-core 0.8.0's one flavour: its config has
    context_parallel_size and no cp_comm_type), the Ulysses all-to-all as DeepSpeed-Ulysses' --ds-sequence-parallel-size
    (the fork's own flag, its megatron/arguments.py: not checkable here) in place of both."""
    if plan.cp <= 1:
        return args
    i = args.index("--context-parallel-size")  # followed by its size, --cp-comm-type and its value (_context_parallel)
    cp = ["--ds-sequence-parallel-size", plan.cp] if plan.cp_comm.value == "ulysses" else ["--context-parallel-size", plan.cp]
    return args[:i] + cp + args[i + 4:]


def refuse_for_fork(model: ModelSpec, plan: Plan, args: list, stack: Stack) -> None:
    """One ExportError line for what the fork's pretrain_gpt.py cannot launch as costed: a flag it lacks (FORK_LACKS),
    the interleaved schedule (its pipeline is DeepSpeed's PipelineModule, which runs none)."""
    lacking = [str(f) for f in args if str(f) in FORK_LACKS]
    if lacking:
        raise ExportError(f"the {stack.name} script of {model.name} would pass {', '.join(lacking)}, which Megatron-"
                          f"DeepSpeed's 2023 fork lacks (megatron-core 0.8.0 had no such field): use --stack "
                          "megatron-core")
    if plan.pp > 1 and plan.schedule == "interleaved":
        raise ExportError(f"{stack.name} pipelines with DeepSpeed's PipelineModule (Megatron-DeepSpeed's GPTModelPipe), "
                          "whose engine has no interleaved schedule: use --schedule 1f1b, or --stack megatron-core")


def deepspeed_args(plan: Plan) -> list[str]:
    """DeepSpeed's launch arguments and the fork's ZeRO flags."""
    # --deepspeed, --deepspeed_config: deepspeed.add_config_arguments (deepspeed 0.19.8 __init__.py:648), which adds them
    # in _add_core_arguments (:628, :633); Megatron-DeepSpeed's parse_args extends its parser with it
    a = ["--deepspeed", "--deepspeed_config", CONFIG, "--zero-stage", str(plan.zero)]
    if plan.pp == 1:  # the fork builds GPTModelPipe, DeepSpeed's PipelineModule, without it; DeepSpeed's
        # PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" (runtime/pipe/engine.py:77)
        a.append("--no-pipeline-parallel")
    return a


def deepspeed_lines(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                    world_size: int, stack: Stack, notes: list[str]) -> list[str]:
    """The script's lines that write ds_config.json (deepspeed_dict's, its notes also the script's) and DEEPSPEED_ARGS."""
    cfg, ds_notes = deepspeed_dict(model, hw, plan, setup, grad_accum, world_size, stack, megatron=True)
    notes += ds_notes
    cfg[NOTES_KEY] = ds_notes + [f"read by Megatron-DeepSpeed's pretrain_gpt.py (--deepspeed_config {CONFIG})"]
    text = json.dumps(cfg, indent=2)
    lines = [f"# DeepSpeed's engine runs ZeRO-{plan.zero}, as costed: its JSON, written beside the run",
             f"cat > {CONFIG} <<'{END}'", *text.splitlines(), END,
             "# --deepspeed --deepspeed_config: DeepSpeed's own (deepspeed.add_config_arguments); --zero-stage (for "
             "deepspeed.zero.Init at stage 3)",
             "# and --no-pipeline-parallel are the Megatron-DeepSpeed fork's flags (its megatron/arguments.py), not "
             "Megatron-LM's",
             "DEEPSPEED_ARGS=("]
    return lines + argv_lines(deepspeed_args(plan)) + [")"]
