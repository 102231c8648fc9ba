"""`advisor plan --precision auto`: the plan search run once per precision a GPU has, the recipes ranked by the
fastest plan each finds, each with what it runs low and what its casts cost (advisor.precision)."""

from __future__ import annotations

from typing import Optional

from advisor.api import resolve_precision
from advisor.errors import AdvisorError
from advisor.hardware import Hardware, load_hardware
from advisor.ranking import PlanSearch
from advisor.search import plan
from advisor.workload import Workload


def auto_precisions(hardware: Hardware, stack=None) -> list[str]:
    """What ``--precision auto`` compares on a GPU: its default half precision (in a named stack, the stack's own:
    api.resolve_precision) and every low-precision recipe it runs (advisor.precision; the legacy fp8-mixed switch is
    left out: the recipes say what it meant)."""
    from advisor.precision import RECIPES, check_gpu

    gpu = hardware.gpu
    out = [resolve_precision(hardware, None, stack)]
    return out + [name for name, r in RECIPES.items() if check_gpu(r, gpu.name, gpu.peak_tflops, gpu.block_scaling) is None]


def rank_precisions(model, hw, **kw) -> tuple[PlanSearch, list[tuple[str, Optional[PlanSearch], str]]]:
    """``advisor plan --precision auto``: the plan search run once per precision the GPU has (auto_precisions);
    returns the search whose best plan is fastest, and every precision's (name, search or None, why) fastest first.
    The why names what the recipe runs low, its cast kernels' share of the step, and its speed and memory against
    the default precision's best plan."""
    from advisor.precision import recipe

    hardware = load_hardware(hw)
    runs: list[tuple[str, Optional[PlanSearch], str]] = []
    errors: list[AdvisorError] = []
    for name in auto_precisions(hardware, kw.get("stack")):
        try:
            runs.append((name, plan(model, hardware, precision=name, **kw), ""))
        except AdvisorError as exc:
            runs.append((name, None, str(exc).splitlines()[0]))
            errors.append(exc)
    if len(errors) == len(runs):  # no precision has a search to rank: the default precision's reason, as plan gives it
        raise errors[0]

    def best(res: Optional[PlanSearch]):
        return res.plans[0].estimate if res is not None and res.plans else None
    base = best(runs[0][1])
    ranked = []
    for name, res, err in runs:
        e = best(res)
        if e is None:
            ranked.append((name, res, err or "no plan fits"))
            continue
        r = recipe(name)
        what = "every GEMM in " + name
        if r is not None:  # the best plan's workload: its stack's BF16 edge layers and its casts' share
            w = Workload.of(res.model_spec, res.hardware, res.stack_named(e.stack), e.setup)
            edges, tail = w.bf16_edge_layers, r.name in w.stack.engine.bf16_tail
            kept = (f", the last {w.stack.engine.bf16_layers(r, w.model.n_layers)} layers in BF16" if tail
                    else f", {edges} layer at each end in BF16" if edges else "")
            what = (f"{'/'.join(r.low)} in {r.format.upper()} ({r.granularity})" + kept
                    + f"; attention and the output layer in BF16; casts {100 * _cast_share(w, res, e):.1f}% of the step")
        vs = ""
        if base is not None and name != runs[0][0]:
            # another stack's best (a recipe only torchtitan runs against megatron-core's BF16) says so: the ratio
            # is the stacks' as much as the recipes'
            other = f" (in {base.stack}; this in {e.stack})" if e.stack != base.stack else ""
            vs = (f"; x{e.tokens_per_s / base.tokens_per_s:.2f} the tokens/s of {runs[0][0]}{other}, peak memory "
                  f"{e.memory.peak_bytes / base.memory.peak_bytes:.2f}x")
        ranked.append((name, res, f"{e.tokens_per_s / e.world_size:,.0f} tokens/s per GPU ({e.label}): {what}{vs}"))
    ranked.sort(key=lambda t: -(best(t[1]).tokens_per_s if best(t[1]) is not None else -1.0))
    top = next((res for _, res, _ in ranked if best(res) is not None), runs[0][1])
    return top, ranked


def _cast_share(w: Workload, res: PlanSearch, e) -> float:
    """The share of a plan's step its recipe's quantisation kernels take (every layer of every micro-batch, one TP
    rank, recomputation aside), from advisor.compute.cast_seconds; ``w``: the plan's workload."""
    from advisor.compute import cast_seconds

    per_layer = float(cast_seconds(w, e.setup.micro_batch * e.setup.seq_len, e.plan.tp))
    return per_layer * res.model_spec.n_layers / e.plan.pp * e.grad_accum / e.step_time_s
