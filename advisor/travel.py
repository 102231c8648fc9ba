"""What a mixture-of-experts plan would gain from the stack's other ways of moving its tokens.

A search costs every plan with one token dispatcher and one all-to-all overlap: the ones asked, else the stack's
defaults (megatron-core: NCCL's all-to-all, beside the shared experts). Where the stack also runs others (its
profile's ``moe_dispatchers`` and ``ep_alltoall_overlaps``: HybridEP's flex dispatcher, the batch-level overlap) and
the user named none, the best plan's layout is estimated again under each pair the stack runs, and the fastest that
beats it is named with the flags that select it: computed, not guessed (advisor.parallel.expert costs each).
"""

from __future__ import annotations

from itertools import product
from typing import Optional

from advisor.errors import AdvisorError


# what the all-to-alls run beside under each overlap, in the note's words
BESIDE = {"none": "nothing", "shared_experts": "the shared experts", "batch": "another micro-batch"}


def faster_travel(result, asked_dispatcher: Optional[str] = None, asked_overlap: Optional[str] = None) -> Optional[str]:
    """A one-line note: the best plan's step under the stack's fastest other dispatcher and overlap, where one beats
    it by more than 1%; None for a dense model, a plan without EP, a stack with one way, or both chosen by the user."""
    if not result.plans or (asked_dispatcher and asked_overlap):
        return None
    best = result.plans[0].estimate
    if not result.model_spec.routed or best.plan.ep <= 1:
        return None
    from advisor.api import estimate_plan  # the note re-runs the API's own estimate

    stack = result.stack_named(best.stack)  # a --stack FILE's profile is not found again by its name
    eng = stack.engine
    dispatchers = [asked_dispatcher] if asked_dispatcher else list(eng.moe_dispatchers)
    overlaps = [asked_overlap] if asked_overlap else eng.ep_overlaps()
    now = (best.setup.moe_dispatcher or eng.moe_dispatchers[0], best.setup.moe_overlap or eng.ep_alltoall_overlap)
    found = []
    for d, o in product(dispatchers, overlaps):
        if (d, o) == now:
            continue
        setup = best.setup.model_copy(update={"moe_dispatcher": d, "moe_overlap": o, "stack": best.stack})
        try:
            est = estimate_plan(result.model_spec, result.hardware, best.plan, setup, best.world_size, stack)
        except AdvisorError:  # Megatron refuses the pair for this plan
            continue
        if est.fits:
            found.append((est.step_time_s, d, o))
    if not found:
        return None
    step, d, o = min(found)
    if step >= 0.99 * best.step_time_s:
        return None
    flags = ([] if asked_dispatcher else [f"--moe-dispatcher {d}"]) + ([] if asked_overlap else
                                                                       [f"--moe-overlap {o.replace('_', '-')}"])
    return (f"{best.stack} also runs {d} token dispatch with the all-to-alls beside {BESIDE[o]}: the best plan "
            f"would take {step:.3f} s a step instead of {best.step_time_s:.3f} s ({100 * (step / best.step_time_s - 1):+.0f}%); "
            f"search with {' '.join(flags)}")
