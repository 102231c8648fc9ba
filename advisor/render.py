"""Human-readable tables for estimates and plan searches (the CLI's default output)."""

from __future__ import annotations

from advisor.units import fmt_bytes, fmt_seconds


def render_estimate(e) -> str:
    lines = [
        f"{e.model} ({e.params / 1e9:.3f}B params) on {e.world_size}x {e.hw} ({e.nodes} node{'s' if e.nodes > 1 else ''})",
        f"plan: {e.label}   micro batch {e.setup.micro_batch} x grad accum {e.grad_accum} x dp {e.plan.dp} = "
        f"global batch {e.global_batch}, seq {e.setup.seq_len}, {e.setup.precision.value}, {e.setup.attention.value}, "
        f"recompute {e.setup.recompute.value}, {e.setup.optimizer.value}",
        f"stack: {e.stack}   layout: " + " x ".join(f"{k} {v}" for k, v in e.layout.model_dump().items() if k != "world_size"),
        "",
        f"step time      {fmt_seconds(e.step_time_s)}",
        f"throughput     {e.tokens_per_s:,.0f} tokens/s   {e.samples_per_s:,.2f} samples/s",
        f"MFU            {e.mfu * 100:.1f}%  (model FLOPs: 3 x forward, causal attention, no embedding lookup; / peak)",
        f"HFU            {e.hfu * 100:.1f}%  (+ recomputation and eager attention's masked scores)",
        f"TFLOP/s/GPU    {e.tflops_per_gpu:.1f} model, {e.hw_tflops_per_gpu:.1f} with recomputation",
        *([f"cost           {e.usd_per_million_tokens:.3f} USD per million tokens (profile price per GPU-hour)"]
          if e.usd_per_million_tokens is not None else []),
        "",
        "time breakdown (per step):",
    ]
    total = e.step_time_s
    for k, v in e.breakdown.items():
        if v > 0:
            lines.append(f"  {k:22s} {fmt_seconds(v):>12s}  {100 * v / total:5.1f}%")
    lines.append(f"  {'total':22s} {fmt_seconds(total):>12s}")
    m = e.memory
    lines += ["", "memory per GPU (busiest GPU, peak of max_memory_allocated):"]
    for k, v in m.parts.items():
        if v > 0:
            lines.append(f"  {k:22s} {fmt_bytes(v):>12s}")
    lines.append(f"  {'peak':22s} {fmt_bytes(m.peak_bytes):>12s}")
    lines.append(f"  {'+ overhead':22s} {fmt_bytes(m.overhead_bytes):>12s}  (" + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in m.overhead.items() if v) + ")")
    verdict = "fits" if m.fits else "DOES NOT FIT"
    lines.append(f"  {'capacity':22s} {fmt_bytes(m.capacity_bytes):>12s}  -> {verdict} (headroom {fmt_bytes(m.headroom_bytes)})")
    return "\n".join(lines)


def render_plan(result, explain: bool = False, suggestion: str = "") -> str:
    lines = [result.header()]
    if not result.plans:
        lines.append("no plan fits: " + suggestion)
    else:
        lines.append(f"{'#':>3} {'plan':38s} {'mb':>3} {'ga':>4} {'recomp':>9} {'step':>10} {'tok/s':>11} {'MFU':>6} {'mem/GPU':>10}  why")
        for i, p in enumerate(result.plans, 1):
            e = p.estimate
            lines.append(
                f"{i:>3} {e.label[:38]:38s} {e.setup.micro_batch:>3} {e.grad_accum:>4} {e.setup.recompute.value:>9} "
                f"{fmt_seconds(e.step_time_s):>10} {e.tokens_per_s:>11,.0f} {e.mfu * 100:5.1f}% {fmt_bytes(e.memory.peak_bytes + e.memory.overhead_bytes):>10}  {p.reason}"
            )
    lines += ["", *result.notes()]
    if explain:
        lines += ["", f"rejected plans ({sum(result.rejected.values()):,} of {result.candidates:,}):"]
        for reason, n in sorted(result.rejected.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {n:>9,}  {reason}")
    return "\n".join(lines)
