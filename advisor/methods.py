"""``advisor plan --method auto``: which fine-tuning method fits the GPUs, and which is fastest.

The rule people follow (the seeds' decision tree, single-GPU branch, extended with fine-tuning methods; PEFT's and
QLoRA's READMEs): train every weight if it fits; else LoRA adapters on a frozen half-precision base; else QLoRA (NF4
base with double quantisation); else QLoRA with the optimizer and the activations offloaded to the CPU
(torchtune's enable_activation_offloading, DeepSpeed offload_optimizer). Each method is searched as ``plan`` searches
one (same plans, same stack rule); the first that has a fitting plan is the answer, and the fastest fitting method is
said beside it (a frozen base skips the weight-gradient GEMMs, so LoRA's step is often faster than a full one). For the
answer's best plan: the largest micro-batch that fits at the sequence length searched, and the longest sequence that
fits at micro-batch 1 (doubling, then bisecting; at most the model's positions where they are learned).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from advisor.errors import AdvisorError
from advisor.units import fmt_seconds_3g

# the order of the rule, each with the options it sets
LADDER = (("full", {}), ("lora", {}), ("qlora", {}), ("qlora+offload", {"adapter_offload": "optimizer+activations"}))
MAX_SEQ_SEARCH = 1 << 20  # the longest sequence the search for it tries (1M tokens)


# how many plans a rung's search keeps, so that its best plan without offload is among them (an offloaded plan can be
# the faster one: a larger micro-batch in the memory it frees)
RUNG_TOP = 200


def plan_auto(plan: Callable[..., Any], model: Any, hw: Any, given: dict[str, Any]):
    """The PlanSearch of the method the rule picks (each searched by ``plan``: advisor.search.plan), with
    ``method_choice`` saying what fit and why. Offload comes last (issue 22: "full if it fits, else LoRA, else QLoRA,
    else offload"): a rung fits where a plan offloading nothing (model states or activations) fits; only where none
    does, the first rung whose offloaded plans fit (ZeRO-Offload / ZeRO-Infinity, and QLoRA with its optimizer and
    activations offloaded, the last rung)."""
    results, steps, plain = {}, {}, {}
    top = int(given.get("top") or 10)
    for name, extra in LADDER:
        kw = {**given, **extra, "method": name.split("+")[0], "top": max(top, RUNG_TOP)}
        if name == "full":  # the adapters' options are the LoRA rungs'; a full fine-tune refuses them
            kw = {k: v for k, v in kw.items() if not k.startswith("lora_") or k == "lora_library"}
        try:
            res = plan(model, hw, **kw)
        except AdvisorError as exc:  # e.g. a model the adapters cannot target: say why that rung was skipped
            steps[name] = f"not costed: {exc}"
            continue
        results[name] = res
        steps[name] = res.plans[0].estimate.step_time_s if res.plans else None
        kept = _unloaded(res.plans)
        plain[name] = kept[0].estimate.step_time_s if kept and "+" not in name else None
    unloaded = [n for n, _ in LADDER if isinstance(plain.get(n), float)]
    fitting = unloaded or [n for n, _ in LADDER if isinstance(steps.get(n), float)]
    for name, res in results.items():  # the answer's rows as the rule counts them, at the top asked
        if unloaded and name in unloaded:
            res.plans = _unloaded(res.plans)
        res.plans = res.plans[:top]
    if not fitting:
        if not results:
            raise AdvisorError("--method auto: no method could be costed for this model: " + "; ".join(
                f"{n}: {s}" for n, s in steps.items()))
        from advisor.suggest import min_fitting_world  # (it imports the step, which this module needs not)

        # the search answered with the method that fits on the fewest GPUs, whose suggestion the user is shown (a
        # data-parallel-only QLoRA may need thousands where a full fine-tune with TP and CP needs hundreds)
        worlds = {n: w for n, r in results.items() if (w := min_fitting_world(r)) is not None}
        pick = min(worlds, key=lambda n: worlds[n][0]) if worlds else list(results)[-1]
        last = results[pick]
        fewest = f"; the fewest GPUs: {pick} on --gpus {worlds[pick][0]:,}" if worlds else ""
        last.method_choice = {"chosen": None, "steps_s": steps,
                              "lines": [f"method auto: {_none_fits(steps)}{fewest}"]}
        return last
    if unloaded:  # each rung's best step without offload; one that fits only offloaded said so
        steps = {n: plain[n] if n in unloaded else f"fits only offloaded ({fmt_seconds_3g(s)})"
                 if isinstance(s, float) and "+" not in n else s for n, s in steps.items()}
    chosen, fastest = fitting[0], min(fitting, key=lambda n: steps[n])
    res = results[chosen]
    best = res.plans[0].estimate
    mb, seq = largest_micro_batch(res.model_spec, res.hardware, best), longest_seq(res.model_spec, res.hardware, best)
    why = {"full": "every weight trains: the most capable update, and it fits",
           "lora": "full fine-tuning does not fit (weights, gradients and optimizer states of every parameter); "
                   "adapters on a frozen base do",
           "qlora": "neither full fine-tuning nor LoRA on a half-precision base fits; an NF4 base does",
           "qlora+offload": "only with the optimizer and the activations on the CPU does QLoRA fit"}[chosen]
    if not unloaded and chosen != "qlora+offload":
        why = (f"no method fits without offload; {chosen} fits with {best_offload(res)} on the CPU or "
               "NVMe (offload last, as the rule goes)")
    skipped, skip_why = _skipped(steps)

    def fmt(n: str) -> str:
        s = steps.get(n)
        return (f"{n} {fmt_seconds_3g(s)}" if isinstance(s, float) else f"{n} does not fit" if s is None
                else f"{n} not costed" if n in skipped else f"{n} {s}")
    # where a rung fits without offload, the offloaded rungs are not candidates for the fastest (issue 22: offload
    # last), though their steps are printed: the line says so, or a faster qlora+offload would contradict it
    lines = [f"method auto: {chosen} ({why}); fastest that fits{' without offload' if unloaded else ''}: {fastest}",
             "methods (best step of each): " + ", ".join(fmt(n) for n, _ in LADDER)
             + (f" ({skip_why})" if skipped else ""),
             f"{chosen} on {best.label}: largest micro-batch that fits at seq {best.setup.seq_len}: {mb}; "
             f"longest sequence that fits at micro-batch 1: {seq:,}"]
    res.method_choice = {"chosen": chosen, "fastest": fastest, "steps_s": steps, "largest_micro_batch": mb,
                         "longest_seq": seq, "lines": lines}
    return res


def _skipped(steps: dict) -> tuple[list[str], str]:
    """The rungs not costed (a mixture of experts: adapters on it are not costed, so its LoRA rungs are skipped, not
    tried and found too large) and why, in the first one's words."""
    skipped = [n for n, s in steps.items() if isinstance(s, str) and s.startswith("not costed")]
    why = re.sub(r"^--method \S+: ", "", steps[skipped[0]].removeprefix("not costed: ").split("; use ")[0]) if skipped else ""
    return skipped, why


def _none_fits(steps: dict) -> str:
    """Why no rung answered: every one costed and none fits, or the rungs that fit nowhere and those not costed."""
    skipped, why = _skipped(steps)
    if not skipped:
        return "nothing fits, not even QLoRA with CPU offload"
    costed = [n for n in steps if n not in skipped]
    fit = (f"{' and '.join(costed)} {'does' if len(costed) == 1 else 'do'} not fit; " if costed else "")
    return f"{fit}{', '.join(skipped)} not costed: {why}"


def _unloaded(plans: list) -> list:
    """The ranked plans that offload nothing: no model states (ZeRO-Offload / -Infinity) and no activations (--recompute
    offload's saved tensors on the host count as offload too: the rule's last resort)."""
    return [p for p in plans if p.estimate.plan.offload.value == "none" and p.estimate.setup.recompute.value != "offload"]


def best_offload(res) -> str:
    """What the best plan of a search offloads, in words."""
    if not res.plans:
        return "model states"
    est = res.plans[0].estimate
    if est.plan.offload.value == "none" and est.setup.recompute.value == "offload":
        return "the activations"
    return {"optimizer-cpu": "the optimizer states", "optimizer-nvme": "the optimizer states",
            "params-cpu": "the parameters and optimizer states", "params-nvme": "the parameters and optimizer states"}.get(
        est.plan.offload.value, "model states")


def _fits(model, hw, est, **update) -> bool:
    from advisor.api import estimate_plan

    setup = est.setup.model_copy(update={"grad_accum": None, "global_batch": None, **update})
    try:
        return estimate_plan(model, hw, est.plan, setup, est.world_size).fits
    except AdvisorError:
        return False


def largest_micro_batch(model, hw, est, limit: int = 4096) -> int:
    """The largest micro-batch of ``est``'s plan that fits (doubling from its own, then bisecting)."""
    return _largest(lambda v: _fits(model, hw, est, micro_batch=v), est.setup.micro_batch, limit)


def longest_seq(model, hw, est) -> int:
    """The longest sequence of ``est``'s plan at micro-batch 1 that fits."""
    cap = model.max_positions if model.position.value == "learned" else MAX_SEQ_SEARCH
    return _largest(lambda v: _fits(model, hw, est, micro_batch=1, seq_len=v), min(est.setup.seq_len, cap), cap)


def _largest(ok, start: int, limit: int) -> int:
    if not ok(start):
        return 0
    lo, hi = start, start
    while hi < limit and ok(min(2 * hi, limit)):
        lo = hi = min(2 * hi, limit)
    if hi >= limit:
        return limit
    hi = min(2 * hi, limit)  # lo fits, hi does not
    while hi - lo > max(1, lo // 64):  # within 1.5%
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
