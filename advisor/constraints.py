"""The constraints a plan must meet, gathered from each dimension in one order (the search counts a rejected
plan under the first it breaks): the layout's world size, then tensor, pipeline and data parallelism.

Megatron's constraints (seed 002): world_size = tp x pp x dp; global batch divisible by micro_batch x dp.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.hardware import Hardware
from advisor.layout import ContextParallel, DataParallelKind, PipelineSplit, Schedule
from advisor.model import ModelSpec
from advisor.parallel import context, data, expert_layout, offload, pipeline, tensor
from advisor.stack import PLAN_FEATURES, Stack
from advisor.training import Recompute, TrainingSetup

WORLD = "dp x tp x pp != world size"
# the fine-tuning recipes of PEFT (with accelerate/DeepSpeed), torchtune and litgpt shard adapters with data
# parallelism (DDP, FSDP, ZeRO); Megatron's run under TP and PP too (the stack's engine.adapters_parallel)
ADAPTERS = "LoRA/QLoRA run with data parallelism only in this stack (DDP, ZeRO, FSDP): use --tp 1 --pp 1"


def adapters_refuse_model_parallel(setup: TrainingSetup, stack: Optional[Stack]) -> bool:
    """Adapters under TP or PP are refused: the stack runs them with data parallelism only (without a stack, as an
    export format's own check after the stack's, nothing stack-specific is refused)."""
    return setup.finetune.adapters and stack is not None and stack.engine.adapters_parallel == "data"


# A TP overlap pipelines sequence parallelism's all-gathers and reduce-scatters with the GEMMs beside them; TP without
# SP all-reduces and has none. Megatron-LM asserts it (megatron/training/arguments.py:1401-1402, "Tensor parallel
# communication/GEMM overlap can happen only when sequence parallelism is enabled"); async TP is torch's micro-pipeline
# pass, which rewrites all_gather_into_tensor -> mm and mm -> reduce_scatter_tensor only (torch 2.13
# _inductor/fx_passes/micro_pipeline_tp.py find_all_gather_patterns:91, find_reduce_scatter_patterns:340; torchtitan
# 0.3.0 models/common/dist_gemm.py:104 refuses its fused TP GEMMs without SP for the same reason). Asked for with such
# a plan it would cost nothing (nanotron's async linears: its row linear raises under ALL_REDUCE, tensor_parallel/
# nn.py:133-134): estimate refuses it and the search leaves such plans out. A stack's default overlap
# (setup.tp_overlap None) is not asked for: plans without SP run without it (advisor.parallel.tensor.overlaps).
def overlap_without_sp(setup: TrainingSetup, tp: Any, sp: Any) -> Any:
    """Where an explicitly asked TP overlap (userbuffers, async, linear-async) meets tensor parallelism without SP."""
    return (setup.tp_overlap in ("userbuffers", "async", "linear-async")) & (np.asarray(tp) > 1) & ~np.asarray(sp, dtype=bool)


def fp32_without_fsdp(setup: TrainingSetup, stack: Stack) -> str:
    """Why the stack's TP or PP plans without FSDP are refused under a mixed precision: it runs them in fp32
    (engine.mixed_without_fsdp), which its tables do not cost; "" where it runs them mixed."""
    if stack.engine.mixed_without_fsdp == "any" or setup.precision.mode.value != "mixed":
        return ""
    return (f"{stack.name} trains TP or PP without FSDP in fp32 (no autocast there), which it does not cost: add "
            "data-parallel ranks it shards (--dp 2 or more, --zero 1, 2 or 3), or use another --stack")


def pure_half_needs_zero(setup: TrainingSetup, stack: Stack) -> str:
    """Why the stack's plans without ZeRO are refused under --precision bf16: its DeepSpeed keeps bf16 master weights
    only under ZeRO 1-3 (deepspeed 0.19.8 runtime/config.py:706-709; zero_buffers.half_master) and otherwise runs
    its FP16_Optimizer over fp32 masters and moments (engine.py:2318-2321, 2360-2362): the bf16-mixed run, the same
    JSON; "" where the stack runs it."""
    zb = stack.engine.zero_buffers
    if zb is None or not zb.half_master or setup.precision.value != "bf16":
        return ""
    return (f"{stack.name} trains pure bf16 only under ZeRO 1-3 (DeepSpeed's bf16_master_weights_and_grads); without "
            "ZeRO it keeps fp32 master weights and moments: --zero 1, 2 or 3, or --precision bf16-mixed")


BATCH_OVERLAP = ("--moe-overlap batch (--overlap-moe-expert-parallel-comm) runs with EP, virtual stages under a pipeline, "
                 "at most one MTP depth (--mtp-layers 0 or 1), a bf16 or fp16 model (not fp32) and no full, block or "
                 "every-k recomputation or moe recompute module (megatron-core asserts)")


def setup_violations(c: Candidates, setup: TrainingSetup, stack: Optional[Stack]) -> dict[str, Any]:
    """What the setup's explicit choices refuse of the candidates (the search's reasons; plan_errors says them in full):
    TP and PP where the stack runs adapters with data parallelism only; TP without SP under an asked TP overlap."""
    out = {ADAPTERS: (c.tp > 1) | (c.pp > 1)} if adapters_refuse_model_parallel(setup, stack) else {}
    if setup.tp_overlap in ("userbuffers", "async", "linear-async"):
        out[f"--tp-overlap {setup.tp_overlap} needs sequence parallelism: TP without SP"] = overlap_without_sp(
            setup, c.tp, c.sp)
    if setup.recompute_modules is not None:  # plan's --recompute-modules: what selective reruns, so selective plans only
        out[f"--recompute-modules {','.join(setup.recompute_modules)}: selective recomputation only"] = (
            np.asarray(c.recompute) != Recompute.selective.code)
    if setup.moe_overlap == "batch":  # megatron-core 0.19.2 transformer_config.py:2669-2713 asserts these away
        out[BATCH_OVERLAP] = (((c.pp > 1) & (c.virtual_stages <= 1)) | (np.asarray(c.ep) <= 1) | np.isin(
            c.recompute, [Recompute.full.code, Recompute.block.code, Recompute.every_k.code]) | bool(setup_wide(setup)))
    if stack is not None and (why := pure_half_needs_zero(setup, stack)):
        out[why] = np.asarray(c.zero) == 0
    if stack is not None and (why := fp32_without_fsdp(setup, stack)):
        out[why] = ((c.tp > 1) | (c.pp > 1)) & (c.dp == 1) & (c.cp == 1)  # at dp > 1: FSDP, or DDP (stack_violations)
    return {k: np.broadcast_to(np.asarray(v, dtype=bool), (len(c),)) for k, v in out.items()}


def setup_wide(setup: TrainingSetup) -> list[str]:
    """The setup_violations reasons the setup breaks whatever the plan (a search's every plan rejected by them, though
    the tally counts each plan under the first reason it breaks): --moe-overlap batch with a setup megatron-core asserts
    away (transformer_config.py:2701-2704 a bf16 or fp16 model, :2710-2713 mtp_num_layers <= 1; the moe module's
    recompute)."""
    batch = setup.moe_overlap == "batch" and ("moe" in (setup.recompute_modules or ()) or setup.mtp_layers > 1
                                              or setup.precision.mode.value == "fp32")
    return [BATCH_OVERLAP] if batch else []


def drop_setup_violations(c: Candidates, setup: TrainingSetup, stack: Optional[Stack],
                          rejected: dict[str, int]) -> Candidates:
    """The candidates that break no setup_violations, each dropped one counted in ``rejected`` under its first."""
    ok = np.ones(len(c), dtype=bool)
    for reason, bad in setup_violations(c, setup, stack).items():
        if (bad & ok).any():
            rejected[reason] = rejected.get(reason, 0) + int((bad & ok).sum())
        ok &= ~bad
    return c if ok.all() else c.take(np.nonzero(ok)[0])


def violations(c: Candidates, model: ModelSpec, hw: Hardware, world_size: Any,
               stack: Optional[Stack] = None, seq_len: Optional[int] = None, eager: bool = False,
               layout_only: bool = False) -> dict[str, Any]:
    """Constraint name -> boolean array, True where the plan breaks it (short reasons users see); with a stack,
    also the plan features it does not run; with the sequence length, context parallelism's chunking.
    ``layout_only``: ``c`` holds layouts with placeholders for the rest (advisor.space.pair_violations): the reasons
    that depend on the rest are kept, all False, so that the keys are those of a full check, in its order."""
    ones = np.ones(len(c), dtype=bool)
    # layout-level reasons (tensor, context, the pipeline's first) come before those that depend on the rest of the plan
    beyond_kv = stack.engine.tp_beyond_kv_heads if stack is not None else "replicate"  # no stack: no stack's rule
    out = {WORLD: c.world != world_size, **tensor.violations(c, model, hw, beyond_kv), **context.violations(
               c, model, seq_len, eager, stack.engine.sequence_split if stack else "cp_then_tp"),
           **pipeline.violations(c, model), **data.violations(c, hw), **offload.violations(c, hw, stack),
           **expert_layout.violations(c, model),
           **(stack_violations(c, stack, layout_only, model.n_layers, model.tied_embeddings, model.routed)
              if stack is not None else {})}
    return {k: np.asarray(v, dtype=bool) & ones for k, v in out.items()}


FEATURE_WORDS = {"ddp": "DDP", "dataparallel": "nn.DataParallel", "zero1": "ZeRO-1", "zero2": "ZeRO-2 / SHARD_GRAD_OP",
                 "zero3": "ZeRO-3 / FULL_SHARD", "hsdp": "HYBRID_SHARD", "tp": "tensor parallelism",
                 "sp": "sequence parallelism", "pp": "pipeline parallelism", "gpipe": "a GPipe schedule",
                 "interleaved": "an interleaved schedule", "ep": "expert parallelism"}


def features(c: Candidates) -> dict[str, Any]:
    """Which plan features (advisor.stack.PLAN_FEATURES) each candidate uses."""
    hybrid, dp_single = np.asarray(c.hybrid, dtype=bool), c.dp_kind == DataParallelKind.dp.code
    group = c.dp * np.asarray(c.cp)  # gradients are reduced, and ZeRO shards, over dp x cp
    return {"ddp": (group > 1) & (c.zero == 0) & ~dp_single, "dataparallel": dp_single & (c.dp > 1),
            "zero1": (group > 1) & (c.zero == 1), "zero2": (group > 1) & (c.zero == 2),
            "zero3": (group > 1) & (c.zero == 3) & ~hybrid, "hsdp": hybrid, "tp": c.tp > 1,
            "sp": np.asarray(c.sp, dtype=bool), "pp": c.pp > 1, "gpipe": (c.pp > 1) & (c.schedule == Schedule.gpipe.code),
            "interleaved": c.schedule == Schedule.interleaved.code, "ep": expert_layout.uses_ep(c)}


def stack_violations(c: Candidates, stack: Stack, layout_only: bool = False, n_layers: Optional[int] = None,
                     tied: bool = False, routed: bool = False) -> dict[str, Any]:
    """The plan features the stack does not run, and selective recomputation where it offers none; a stack that runs
    several devices only sharded and checkpointed (engine.distributed), the rest (not where ``layout_only``);
    ``tied``: the model ties its embeddings."""
    used = features(c)
    out = {f"{stack.name} does not run {FEATURE_WORDS[f]}": used[f] for f in PLAN_FEATURES if f not in stack.engine.offers}
    if routed:  # EP across the CP ranks, where the stack carves it from dp x tp alone (advisor.parallel.expert_layout)
        out.update(expert_layout.stack_violations(c, stack.engine, stack.name))
    if routed and stack.engine.moe_tp_needs_sp:  # megatron-core's MoELayer.forward raises in training
        out[f"{stack.name}'s MoE layer needs sequence parallelism under TP: add --sp"] = (c.tp > 1) & ~np.asarray(
            c.sp, dtype=bool)
    if tied and stack.engine.tied_pipeline == "refused":  # torchtitan 0.3.0 models/common/decoder.py:139
        out[f"{stack.name} does not run pipeline parallelism on tied embeddings: --pp 1, or another --stack"] = used["pp"]
    if stack.engine.mixed_without_fsdp == "data_parallel_only":  # torchtitan 0.2.2 models/llama3/infra/parallelize.py
        out[f"{stack.name} runs no DDP beside TP or PP (\"DDP has not supported > 1D parallelism\"): shard the "
            "data-parallel ranks (--zero 1, 2 or 3)"] = (used["tp"] | used["pp"]) & used["ddp"] & (c.cp == 1) & (not layout_only)
    if stack.engine.zero1 == "fsdp_under_pipeline":
        out[f"{stack.name}'s ZeRO-1 is its FSDP under a pipeline schedule (--pp 2 or more); without one, shard with "
            "--zero 2 or 3"] = (
            used["zero1"] & (c.pp == 1))
    if stack.engine.expert_tp == "without_ep":  # torchtitan: EP takes the TP ranks' experts whole (moe_sharding.py)
        ep, etp = np.asarray(c.ep), np.asarray(c.etp)
        out[f"{stack.name} splits experts over the TP ranks without EP only: --etp 1 with --ep, none without"] = (
            ((ep > 1) & (etp != 1)) | ((ep == 1) & (etp != c.tp)))
        # and carves EP from the sharded ranks only: its sparse mesh (pp, dp_replicate, efsdp, ep) takes efsdp =
        # dp_shard x cp x tp / ep (torchtitan 0.3.0 distributed/parallel_dims.py); DDP's replicas are not dp_shard
        shard = np.where(np.asarray(c.zero) >= 1, c.dp, 1) * np.asarray(c.cp) * np.asarray(c.tp)
        out[f"{stack.name} carves EP from its FSDP, CP and TP ranks (efsdp = dp_shard x cp x tp / ep): --ep must "
            "divide them (shard the data-parallel ranks: --zero 2 or 3)"] = (ep > 1) & ((shard % ep) != 0)
    if stack.engine.accumulation == "none":  # torch 1.11 fully_sharded_data_parallel.py _prep_grads_for_backward
        out[f"{stack.name}'s FSDP keeps no gradients across micro-batches: one micro-batch a step under ZeRO-2/3 "
            "(raise --micro-batch or the GPUs, or lower --global-batch)"] = (
            (used["zero2"] | used["zero3"] | used["hsdp"]) & (c.grad_accum > 1) & (not layout_only))
    if stack.engine.sequence_parallel == "always":
        out[f"{stack.name}'s tensor parallelism always shards the sequence: drop --no-sp"] = (
            (c.tp > 1) & ~np.asarray(c.sp, bool) & (not layout_only))  # sp is a placeholder in layouts
    if stack.engine.selective is None:
        out[f"{stack.name} has no selective recomputation"] = c.recompute == Recompute.selective.code
    for policy in Recompute:  # the checkpointing policies its profile lists (advisor/recompute.py)
        if policy.value not in stack.engine.checkpointing and policy is not Recompute.selective:
            runs = " or ".join(stack.engine.checkpointing)
            out[f"{stack.name} does not run {policy.value} checkpointing: use --recompute {runs}"] = (
                c.recompute == policy.code)
    if stack.engine.activation_offload == "first_k":  # megatron-core 0.19 transformer_config.py __post_init__
        off = c.recompute == Recompute.offload.code
        out[f"{stack.name}'s CPU offloading runs without pipeline parallelism: --pp 1"] = off & (np.asarray(c.pp) > 1)
        if n_layers is not None:
            out[f"{stack.name} offloads fewer layers than the model's {n_layers}: --recompute-layers below {n_layers}"] = (
                off & (np.asarray(c.recompute_k) >= n_layers))
    eng, cp_on = stack.engine, np.asarray(c.cp) > 1
    for kind in ContextParallel:
        if kind.value not in eng.context_parallel:
            why = "no context parallelism" if not eng.context_parallel else f"no {kind.value} context parallelism"
            out[f"{stack.name} runs {why}"] = out.get(f"{stack.name} runs {why}", False) | (cp_on & (c.cp_comm == kind.code))
    for sched in (Schedule.zb_h1, Schedule.zb_v, Schedule.dualpipe_v):
        if sched.value not in eng.zero_bubble:
            out[f"{stack.name} does not run the {sched.value} schedule"] = c.schedule == sched.code
    if eng.stage_micro_batches:  # torch 2.13 pipelining/schedules.py:1020-1024 (1F1B), :3440-3444 (DualPipeV) raise
        named = np.isin(c.schedule, [Schedule(s).code for s in eng.stage_micro_batches]) & (np.asarray(c.pp) > 1)
        out[stage_micro_batches(stack)] = named & (c.grad_accum < c.pp * pipeline.v_chunks(c.schedule)) & (not layout_only)
    if "layout" not in eng.pipeline_splits and n_layers is not None:
        out[f"{stack.name} interleaves only layers that divide pp x virtual stages (no pipeline layout)"] = (
            (c.schedule == Schedule.interleaved.code) & (c.pp_split != PipelineSplit.edges.code)
            & ((n_layers % np.maximum(np.asarray(c.pp) * c.virtual_stages, 1)) != 0))
    if PipelineSplit.edges.value not in eng.pipeline_splits:
        out[f"{stack.name} does not split pipelines unevenly"] = c.pp_split == PipelineSplit.edges.code
    if "even" not in eng.pipeline_splits:  # a custom profile's: every shipped stack splits evenly by default
        out[f"{stack.name} lists no even pipeline split (engine.pipeline_splits): add even to its profile, or use "
            "--pp-split edges where the layers + 2 divide pp"] = (np.asarray(c.pp) > 1) & (c.pp_split != PipelineSplit.edges.code)
    if eng.distributed == "fsdp_checkpointed":
        many = (np.asarray(c.world) > 1) & (not layout_only)  # a pipeline or context group is several devices too
        out[f"{stack.name} runs several devices only sharded (ZeRO-3 / FSDP)"] = many & (np.asarray(c.zero) < 3)
        out[f"{stack.name} checkpoints every layer on several devices and none on one: --recompute full on several, "
            "none on one"] = (not layout_only) & np.where(
            many, c.recompute != Recompute.full.code, c.recompute != Recompute.none.code)
    return {k: np.broadcast_to(np.asarray(v, dtype=bool), (len(c),)) for k, v in out.items()}


def stage_micro_batches(stack: Stack) -> str:
    """The reason a schedule of the stack's engine.stage_micro_batches is refused with fewer micro-batches a step
    than pipeline stages (the search's tally; plan_errors adds the figures)."""
    many = len(stack.engine.stage_micro_batches) > 1
    return (f"{stack.name}'s {' and '.join(stack.engine.stage_micro_batches)} schedule{'s need' if many else ' needs'} at "
            "least as many micro-batches a step as pipeline stages (torch.distributed.pipelining raises at launch)")
