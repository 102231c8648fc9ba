"""One plan's refusals in words: each constraint it breaks (advisor.constraints) as one line with the plan's own
figures and the smallest fix (the --dp that fills the GPUs, the tp that splits the heads, the --virtual-stages that
fill every chunk, the stacks that run what this one does not), for estimate, export and the API."""

from __future__ import annotations

from typing import Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.constraints import (ADAPTERS, BATCH_OVERLAP, FEATURE_WORDS, WORLD, adapters_refuse_model_parallel,
                                 fp32_without_fsdp, overlap_without_sp, pure_half_needs_zero, setup_violations,
                                 stack_violations, stage_micro_batches, violations)
from advisor.hardware import Hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import ModelSpec
from advisor.parallel import expert_layout, pipeline
from advisor.peft_modules import PeftTargetError, peft_targets, runs_peft
from advisor.stack import PLAN_FEATURES, Stack, list_stacks, load_stack
from advisor.training import TrainingSetup


def _current_stacks(runs) -> list[str]:
    """The shipped stacks no newer profile supersedes for which ``runs(stack)`` holds (a refusal's hint)."""
    return [n for n in list_stacks() if (st := load_stack(n)).superseded_by is None and runs(st)]


def _tp_heads(reason: str, plan: Plan, model: ModelSpec, hw: Hardware, stack: Optional[Stack]) -> str:
    """A TP-heads reason with the figures and the tp (up to the NVLink domain) that split the heads and KV heads, in
    the stack's rule (engine.tp_beyond_kv_heads; without a stack, replicated); beyond the KV heads of a stack that
    refuses them, the stacks that replicate them."""
    kv, replicate = model.kv_heads, stack is None or stack.engine.tp_beyond_kv_heads == "replicate"
    ok = [t for t in range(1, hw.domain_gpus + 1) if model.n_heads % t == 0 and (kv % t == 0 or (replicate and t % kv == 0))]
    out = (f"{reason}: tp={plan.tp}, heads={model.n_heads}, kv heads={kv} "
           f"(tp that splits them: {', '.join(map(str, ok))})")
    if replicate or plan.tp <= kv or model.n_heads % plan.tp or plan.tp % kv:
        return out
    others = _current_stacks(lambda st: st.engine.tp_beyond_kv_heads == "replicate" and "tp" in st.engine.offers)
    return (f"{out}; {stack.name} takes only a tp that divides the KV heads, replicating none: --tp {max(ok)}"
            + (f", or --stack {' or '.join(others)}, which replicates each over tp / kv ranks" if others else ""))


def _uneven_split(plan: Plan, model: ModelSpec) -> str:
    """Why --pp-split edges does not apply to this plan, and the fix."""
    if plan.pp == 1:  # the split places the embedding and the loss on pipeline stages: there are none
        return ("--pp-split edges places the embedding and the loss on pipeline stages: it needs --pp > 1 "
                "(set --pp or drop --pp-split)")
    if model.n_layers % plan.pp == 0:
        return f"{model.n_layers} layers divide evenly over pp={plan.pp}: drop --pp-split edges"
    return (f"uneven split needs layers + 2 (embedding, loss) divisible by pp x chunks: {model.n_layers} "
            f"layers + 2 on pp={plan.pp} x {plan.chunks} chunks (or the layers divide evenly: drop --pp-split)")


def _setup_reasons(plan: Plan, setup: TrainingSetup, model: ModelSpec, stack: Optional[Stack], grad_accum: int) -> list[str]:
    """The plan's reasons that come from the setup beside it (adapters, TP overlap, the stack's precision and batch
    overlap rules, LoRA targets, SP at tp 1), before its layout's own (plan_errors)."""
    reasons: list[str] = []
    if adapters_refuse_model_parallel(setup, stack) and (plan.tp > 1 or plan.pp > 1):
        reasons.append(ADAPTERS)
    if bool(overlap_without_sp(setup, plan.tp, plan.sp)):
        reasons.append(f"--tp-overlap {setup.tp_overlap} pipelines sequence parallelism's all-gathers and reduce-scatters "
                       f"with their GEMMs, and tp={plan.tp} runs without SP (all-reduces): add --sp (dropping --no-sp where "
                       "given) or use --tp-overlap none")
    refused = setup_violations(Candidates.of_plan(plan, setup, grad_accum), setup, stack)
    for why in ([fp32_without_fsdp(setup, stack), pure_half_needs_zero(setup, stack)] if stack is not None else []) + [
            BATCH_OVERLAP]:
        if why and why in refused and bool(refused[why][0]):
            reasons.append(why + (f": this plan has {', '.join(_batch_breaks(plan, setup))}" if why == BATCH_OVERLAP else ""))
    if stack is not None and runs_peft(setup.finetune, stack):  # LoRA targets its transformers modules hold apart
        try:
            peft_targets(model, setup.finetune, stack)
        except PeftTargetError as exc:
            reasons.append(str(exc))
    if plan.sp and plan.tp == 1:
        # Megatron silently turns it off at tp 1 (megatron/training/arguments.py); saying so beats costing
        # a plan the user did not mean
        reasons.append("sequence parallel needs tp > 1 (it splits activations across the TP group): drop --sp or set --tp")
    return reasons


def plan_errors(plan: Plan, setup: TrainingSetup, model: ModelSpec, hw: Hardware, world_size: int,
                stack: Optional[Stack] = None) -> list[str]:
    """One-line reasons a single plan is invalid (empty when valid)."""
    grad_accum, batch_err = resolve_grad_accum(setup, plan)
    reasons = ([batch_err] if batch_err else []) + _setup_reasons(plan, setup, model, stack, grad_accum)
    bad = violations(Candidates.of_plan(plan, setup, grad_accum), model, hw, world_size, stack, setup.seq_len,
                     setup.attention.value == "eager")
    for reason, flag in bad.items():
        if bool(flag[0]):
            if reason == WORLD:
                reason = _world_fix(plan, world_size, hw.gpus_per_node)
            elif reason.startswith("tp ") and "heads" in reason:  # one line for the heads, with the tp that divide them
                if any(r.startswith("tp ") and "heads" in r for r in reasons):
                    continue
                reason = _tp_heads(reason, plan, model, hw, stack)
            elif "heads" in reason:
                cp = f", cp={plan.cp}" if plan.cp > 1 else ""
                reason = f"{reason}: tp={plan.tp}{cp}, heads={model.n_heads}, kv heads={model.kv_heads}"
            elif reason.startswith("sequence not divisible"):
                reason = f"--seq {setup.seq_len} is not divisible into 2 x cp = {2 * plan.cp} chunks: choose --cp or --seq"
            elif reason.startswith("sequence parallelism needs"):
                no_sp = "" if stack is not None and stack.engine.sequence_parallel == "always" else ", or --no-sp"
                joint = stack is not None and stack.engine.sequence_split == "tp_times_cp" and plan.cp > 1
                reason = (f"{reason}: --seq {setup.seq_len}{f' / cp={plan.cp}' if plan.cp > 1 else ''} over tp={plan.tp} "
                          f"(choose --seq a multiple of tp x {'2 x cp' if joint else 'cp'}{no_sp})")
            elif reason.startswith("uneven split"):
                reason = _uneven_split(plan, model)
            elif reason.startswith("tp spans"):
                reason = f"tp={plan.tp} > {hw.domain_gpus} GPUs per NVLink domain: {reason}"
            elif reason.startswith("pp >"):
                reason = f"pp={plan.pp} > {model.n_layers} layers: give --pp at most {model.n_layers}"
            elif reason.startswith("interleaved schedule needs pp > 1"):
                reason = f"{reason}: {_interleave_fix(plan, model)}"
            elif reason.startswith("interleaved schedule needs the micro-batch count"):
                reason = (f"{reason}: {grad_accum} micro-batches a step on pp={plan.pp} (set --grad-accum, or "
                          "--global-batch to micro-batch x dp x a multiple of pp)")
            elif reason.startswith("DualPipeV needs 2 x pp") and stack is not None and bool(
                    bad.get(stage_micro_batches(stack), [False])[0]):
                continue  # the stack's own rule says it with the figures and the fix (torchtitan's: torch's raise)
            elif stack is not None and reason == stage_micro_batches(stack):
                reason = pipeline.too_few_micro_batches(plan, setup.micro_batch, grad_accum, stack.name)
            elif stack is not None and reason == f"{stack.name} does not run the {plan.schedule.value} schedule":
                others = _current_stacks(lambda st: plan.schedule.value in st.engine.zero_bubble)
                reason = (f"{reason}: --schedule 1f1b or interleaved" + (f", or --stack {' or '.join(others)}" if others
                          else f" (no shipped stack runs {plan.schedule.value}: a profile's engine.zero_bubble lists it)"))
            elif stack is not None and reason.startswith(f"{stack.name} does not offload "):
                what, one = reason.rsplit(" ", 1)[-1], Candidates.of_plan(plan, setup, grad_accum)
                others = _current_stacks(lambda st: what in st.engine.offloads and not any(
                    bool(np.asarray(v).any()) for v in stack_violations(one, st).values()))
                reason = f"{reason}: --stack {' or '.join(others)} offload{'s' if len(others) == 1 else ''} it" if others else reason
            elif stack is not None and reason in (f"{stack.name} does not run {w}" for w in FEATURE_WORDS.values()):
                from advisor.workload import runs_model  # (workload imports the parallel modules this one does)

                runs = ", ".join(FEATURE_WORDS[f] for f in PLAN_FEATURES if f in stack.engine.offers)
                feature = next(f for f, w in FEATURE_WORDS.items() if reason.endswith(f"does not run {w}"))
                others = _current_stacks(lambda st: st.name != stack.name and feature in st.engine.offers
                                         and runs_model(st, model))
                reason = f"{reason} (it runs {runs}: use those, or {' or '.join(f'--stack {n}' for n in others) or 'another --stack'})"
            reasons.append(reason)
    reasons += _expert_figures(plan, Candidates.of_plan(plan, setup, grad_accum), model, stack, reasons)
    return list(dict.fromkeys(reasons))  # two checks may name the same fix (the uneven split's): once


def _expert_figures(plan: Plan, one: Candidates, model: ModelSpec, stack: Optional[Stack], reasons: list[str]) -> list[str]:
    """The EP layout's figures, one line, where one of ``reasons`` is an expert-layout refusal (else none)."""
    own = expert_layout.stack_violations(one, stack.engine, stack.name) if stack is not None and model.routed else {}
    if not any(r in expert_layout.violations(one, model) or r in own for r in reasons):
        return []
    etp = plan.tp if plan.etp is None else plan.etp  # Megatron's --expert-tensor-parallel-size defaults to tp's
    unset = " (tp's: --etp not given; --etp 1 keeps each expert whole)" if plan.etp is None and plan.tp > 1 else ""
    experts = (f"{model.experts.n_experts} experts of width {model.experts.d_ff_expert}" if model.experts
               else "no routed experts")
    across = plan.cp > 1 and not any(r in own for r in reasons)  # the stage's ranks EP is carved from
    ranks = plan.dp * plan.tp * (plan.cp if across else 1)
    stage = f"dp x cp x tp = {ranks}" if across else f"dp x tp = {ranks}"
    # the expert-parallel degrees the two divisibility rules (expert_layout.violations) leave at this etp
    fits = [e for e in range(2, ranks // etp + 1) if model.experts and model.experts.n_experts % e == 0
            and ranks % (e * etp) == 0]
    fix = f"give --ep {', '.join(map(str, fits[:-1])) + ' or ' if len(fits) > 1 else ''}{fits[-1]}; " if fits and (
        plan.ep not in fits) else ""
    return [f"ep={plan.ep}, etp={etp}{unset}, {stage}, {experts} ({fix}--ep 1 turns expert parallelism off)"]


def _batch_breaks(plan: Plan, setup: TrainingSetup) -> list[str]:
    """Which of BATCH_OVERLAP's conditions (advisor.constraints.setup_violations) the plan breaks, as its options say."""
    out = [f"--ep {plan.ep}"] if plan.ep <= 1 else []
    out += [f"--pp {plan.pp} without virtual stages"] if plan.pp > 1 and plan.chunks <= 1 else []
    out += [f"--recompute {setup.recompute.value}"] if setup.recompute.value in ("full", "block", "every-k") else []
    out += ["--recompute-modules moe"] if "moe" in (setup.recompute_modules or ()) else []
    out += [f"--mtp-layers {setup.mtp_layers}"] if setup.mtp_layers > 1 else []
    return out + ([f"--precision {setup.precision.value}"] if setup.precision.mode.value == "fp32" else [])


def _world_fix(plan: Plan, world_size: int, per_node: int) -> str:
    """The plan's degrees against ``world_size``, with the --dp that fills it with the other degrees, where it divides,
    or the --gpus the plan needs, where they are whole nodes (api.resolve_world); else degrees whose product it is."""
    rest, n = plan.world_size // plan.dp, plan.world_size
    fixes = ([f"--dp {world_size // rest}"] if world_size % rest == 0 else []) + (
        [f"--gpus {n}"] if n <= per_node or n % per_node == 0 else [])
    cp = f" x cp({plan.cp})" if plan.cp > 1 else ""
    return (f"dp({plan.dp}){cp} x tp({plan.tp}) x pp({plan.pp}) = {n} != world size {world_size}: "
            + (f"give {' or '.join(fixes)}" if fixes else f"give degrees whose product is {world_size}"))


def _interleave_fix(plan: Plan, model: ModelSpec) -> str:
    """What to give an interleaved schedule that leaves a model chunk without a layer (pipeline.layout_fills)."""
    if plan.pp == 1:
        return "set --pp > 1"
    fill = [v for v in range(2, model.n_layers // plan.pp + 1) if pipeline.layout_fills(model.n_layers, plan.pp * v)]
    return (f"{model.n_layers} layers in pp x v = {plan.pp} x {plan.virtual_stages} chunks leave a chunk empty: give "
            f"--virtual-stages {' or '.join(map(str, fill[:6]))}" if fill else
            f"{model.n_layers} layers on pp={plan.pp} fill no two chunks a rank: use --schedule 1f1b")
