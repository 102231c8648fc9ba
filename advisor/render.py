"""Human-readable tables for estimates and plan searches (the CLI's default output)."""

from __future__ import annotations

import shutil
import textwrap
from functools import lru_cache

from advisor.options import DEFAULT_HEADROOM
from advisor.units import fmt_bytes, fmt_duration, fmt_seconds


RECIPE_PEAK = ", the recipe's GEMM format"  # MFU under a low-precision recipe: against its format's peak


def _method_lines(e) -> list[str]:
    """The fine-tuning method and its trainable parameters (PEFT's print_trainable_parameters() line)."""
    ft = e.setup.finetune
    if not ft.adapters:
        return []
    quant = ft.base_quant.value
    base = {"none": e.setup.precision.value, "nf4": f"NF4{' + double quant' if ft.double_quant else ''}",
            "int8": "int8"}[quant]
    return [f"method: {ft.method} r={ft.lora_rank} alpha={ft.lora_alpha:g} dropout={ft.lora_dropout:g} targets "
            f"{ft.targets}{' DoRA' if ft.dora else ''} ({ft.library}); frozen base in {base}",
            f"trainable params: {e.trainable_params:,} || all params: {e.params + e.trainable_params:,} || "
            f"trainable%: {100 * e.trainable_params / (e.params + e.trainable_params):.4f}"]


def _passes(e) -> str:
    """How the MFU counts the backward (advisor/step.py, README): 3 x forward; under LoRA or QLoRA the frozen linears
    skip their weight gradient (2 x forward), the adapters 3 x."""
    return "frozen linears 2 x forward, adapters 3 x" if e.setup.finetune.adapters else "3 x forward"


def render_estimate(e, stack=None) -> str:
    """``stack``: the Stack the estimate was costed in where a name does not find it (a --stack FILE's profile)."""
    lines = [
        f"{e.model} ({e.params / 1e9:.3f}B params) on {e.world_size}x {e.hw} ({e.nodes} node{'s' if e.nodes > 1 else ''})",
        f"plan: {e.label}   micro batch {e.setup.micro_batch} x grad accum {e.grad_accum} x dp {e.plan.dp} = "
        f"global batch {e.global_batch}, seq {e.setup.seq_len}, {e.setup.precision.value}, {e.setup.attention.value}, "
        f"recompute {policy(e.setup, stack or e.stack)}, {e.setup.optimizer.value}"
        + (f", torch.compile of {e.setup.compile.replace(',', ' and ')}" if e.setup.compile != "none" else "")
        + (f", {e.setup.mtp_layers} MTP depth{'s' if e.setup.mtp_layers > 1 else ''}" if e.setup.mtp_layers else "")
        + (", FP8 attention" if e.setup.fp8_attention else ""),  # costed at the FP8 rate: say so, as the header does MTP
        f"stack: {e.stack}   layout: " + " x ".join(f"{k} {v}" for k, v in e.layout.model_dump().items()
                                                 if k != "world_size" and not (k == "cp" and v == 1)),
        *([f"       ({e.stack_rule})"] if getattr(e, "stack_rule", None) else []),
        *_method_lines(e),
        "",
        f"step time      {fmt_seconds(e.step_time_s)}",
        f"throughput     {_rate(e.tokens_per_s)} tokens/s   {_rate(e.samples_per_s, 2)} samples/s",
        f"MFU            {e.mfu * 100:.1f}%  (model FLOPs: {_passes(e)}, causal attention, no embedding lookup; / the "
        f"{e.setup.precision.math} peak{RECIPE_PEAK if e.setup.precision.recipe else ''})",
        f"HFU            {e.hfu * 100:.1f}%  (+ recomputation and eager attention's masked scores)",
        f"TFLOP/s/GPU    {e.tflops_per_gpu:.1f} model, {e.hw_tflops_per_gpu:.1f} with recomputation",
        *([f"cost           {e.usd_per_million_tokens:.3f} USD per million tokens (at the profile's price_per_gpu_hour_usd, "
           f"${e.usd_per_million_tokens * e.tokens_per_s * 3600 / 1e6 / e.world_size:.2f} a GPU-hour)"]
          if e.usd_per_million_tokens is not None else []),
        *([e.moe] if e.moe else []),
        *([e.pipeline] if getattr(e, "pipeline", "") else []),
        *([e.positions] if getattr(e, "positions", "") else []),
        "",
        "time breakdown (per step):",
    ]
    total = e.step_time_s
    for k, v in e.breakdown.items():
        if v > 0:
            lines.append(f"  {k:22s} {fmt_seconds(v):>12s}  {100 * v / total:5.1f}%")
    lines.append(f"  {'total':22s} {fmt_seconds(total):>12s}")
    if e.collectives:
        lines += ["", "collectives (the link or NCCL algorithm each runs on, at one call's size):"]
        lines += [f"  {k:10s} {v}" for k, v in e.collectives.items()]
    m = e.memory
    lines += ["", "memory per GPU (busiest GPU, peak of max_memory_allocated):"]
    for k, v in m.parts.items():
        if v > 0:
            lines.append(f"  {k:22s} {fmt_bytes(v):>12s}")
    lines.append(f"  {'peak':22s} {fmt_bytes(m.peak_bytes):>12s}")
    lines.append(f"  {'+ overhead':22s} {fmt_bytes(m.overhead_bytes):>12s}  (" + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m.overhead.items() if v) + ")")
    verdict = "fits" if m.fits else "DOES NOT FIT"
    # plan ranks a plan only with --memory-headroom (5% by default) of the GPU free beyond this: say where that parts them
    margin = (f"; under plan's {DEFAULT_HEADROOM:.0%} --memory-headroom, which plan keeps free: it ranks this plan only "
              "with a smaller one" if m.fits and m.headroom_bytes < DEFAULT_HEADROOM * m.capacity_bytes else "")
    lines.append(f"  {'capacity':22s} {fmt_bytes(m.capacity_bytes):>12s}  -> {verdict} (headroom {fmt_bytes(m.headroom_bytes)}"
                 f"{margin})")
    if e.host_memory_bytes > 0:
        lines.append(f"  {'host memory per node':22s} {fmt_bytes(e.host_memory_bytes):>12s}  (offloaded states and "
                     "activations of the node's ranks)" + ("" if e.fits else " -> DOES NOT FIT the host" if m.fits else ""))
    return "\n".join(lines)


def _rate(x: float, decimals: int = 0) -> str:
    """A rate with its thousands and ``decimals`` (1,234,567), or three significant figures below 10^(2 - decimals)
    (not a 0 for 0.0017)."""
    return f"{x:,.{decimals}f}" if x >= 10.0 ** (2 - decimals) else f"{x:.3g}"


@lru_cache(maxsize=None)
def _offloads_first_k(stack: str) -> bool:
    """Whether the stack offloads the first k layers' activations (Megatron's --cpu-offloading-num-layers k)."""
    from advisor.stack import load_stack

    return load_stack(stack).engine.activation_offload == "first_k"


def policy(setup, stack=None) -> str:
    """The checkpointing policy with its k where it takes one (advisor/recompute.py): under activation offload, where
    the stack (a Stack, or a built-in name) offloads the first k layers, k too (a search offloads half of them;
    estimate's default is 1)."""
    r, k = setup.recompute.value, setup.recompute_layers
    if setup.recompute_modules is not None:
        return f"{r}({','.join(setup.recompute_modules)})"
    first_k = (stack.engine.activation_offload == "first_k" if hasattr(stack, "engine")
               else bool(stack) and _offloads_first_k(stack))
    if r == "offload" and first_k:
        return f"{r}({k})"
    return f"{r}({k})" if r in ("block", "every-k") or (r == "full" and k > 1) else r


def _columns(result) -> list[tuple[str, str, object]]:
    """(heading, alignment, value of an Estimate) of the ranking table; GPUs, efficiency and budget columns
    appear where the search has them."""
    cols = [("mb", ">", lambda e: str(e.setup.micro_batch)), ("ga", ">", lambda e: str(e.grad_accum)),
            ("recompute", ">", lambda e: policy(e.setup, result.stack_named(e.stack)))]
    if len(result.worlds) > 1:
        cols.insert(0, ("GPUs", ">", lambda e: f"{e.world_size:,}"))
    if len(result.stacks) > 1:
        cols.insert(0, ("stack", "<", lambda e: e.stack))
    cols += [("step", ">", lambda e: fmt_seconds(e.step_time_s)), ("tok/s", ">", lambda e: f"{e.tokens_per_s:,.0f}")]
    if len(result.worlds) > 1 or result.objective in ("throughput", "cost"):
        cols.append(("tok/s/GPU", ">", lambda e: f"{e.tokens_per_s / e.world_size:,.0f}"))
    cols += [("MFU", ">", lambda e: f"{e.mfu * 100:.1f}%"),
             ("mem/GPU", ">", lambda e: fmt_bytes(e.memory.peak_bytes + e.memory.overhead_bytes))]
    if result.hardware.price_per_gpu_hour_usd is not None and (result.objective == "cost" or result.tokens):
        cols.append(("$/Mtok", ">", lambda e: f"{e.usd_per_million_tokens:.3f}"))
    if result.tokens is not None:
        cols.append(("train time", ">", lambda e: fmt_duration(result.train_time_s(e))))
        if result.hardware.price_per_gpu_hour_usd is not None:
            cols.append(("train cost", ">", lambda e: f"${result.train_cost_usd(e):,.0f}"))
    return cols


def render_plan(result, explain: bool = False, suggestion: str = "", width: int = 0) -> str:
    """The ranking as a table that fits ``width`` columns (default: the terminal's): labels are never cut (the
    plan column is as wide as its longest label), and each plan's reason is wrapped on the lines below it."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    lines = textwrap.wrap(result.header(), width=max(width, 40), subsequent_indent="  ")
    if not result.plans:
        lines.append("no plan fits: " + suggestion)
    else:
        cols = _columns(result)
        ests = [p.estimate for p in result.plans]
        labels = [e.label for e in ests]
        cells = [[f(e) for _, _, f in cols] for e in ests]
        widths = [max(len(h), *(len(r[j]) for r in cells)) for j, (h, _, _) in enumerate(cols)]
        lw = max(4, *(len(x) for x in labels))
        rank_w = len(str(len(ests)))
        head = f"{'#':>{rank_w}} {'plan':<{lw}} " + " ".join(f"{h:{a}{w}}" for (h, a, _), w in zip(cols, widths))
        lines.append(head)
        indent = " " * (rank_w + 3)
        for i, (p, label, row) in enumerate(zip(result.plans, labels, cells), 1):
            lines.append(f"{i:>{rank_w}} {label:<{lw}} " + " ".join(f"{c:{a}{w}}" for c, (_, a, _), w in zip(row, cols, widths)))
            lines += textwrap.wrap(p.reason, width=max(width, 40), initial_indent=indent, subsequent_indent=indent)
    lines += [""] + [w for n in result.notes() for w in textwrap.wrap(n, width=max(width, 40), subsequent_indent="  ")]
    if explain:
        lines += ["", f"rejected plans ({sum(result.rejected.values()):,} of {result.candidates:,}):"]
        for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:>9,}  {reason}")
        lines += offload_notes(result)
    return "\n".join(lines)


def offload_notes(result) -> list[str]:
    """Why a search proposed no offload plans, where it did not (advisor/parallel/offload.py)."""
    hw = result.hardware
    if hw.host is None:
        return [f"offload: profile {hw.name} has no host side (host memory, PCIe, CPU Adam rate, NVMe): no CPU/NVMe "
                "offload plans were costed; add host: to the profile (as in dgx-h100)"]
    none = [s.name for s in result.stacks if not s.engine.offloads]
    return [f"offload: {', '.join(none)} offloads nothing (its profile's engine.offloads)"] if none else []
