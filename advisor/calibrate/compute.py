"""Calibrate the compute side of a profile: GEMM, fused-attention, memory-copy, element-wise and optimizer
efficiencies from kernel and optimizer measurements (no torch here; advisor.calibrate.measurements reads the rows).

- matmul: per precision, t = F / (peak * matmul_max * n/(n+h) * k/(k+h)) + matmul_fixed_us, on the shapes
  that are not at the host's floor (HOST_FLOOR_FACTOR);
- matmul rows timed on the GPU alone (``"timing": "cuda_graph"``: kernels replayed with no launch gap, as
  NVIDIA aiconfigurator's tables are) at thin M: matmul_kernel_floor_us (``fit_kernel_floor``);
- fused attention (sdpa_fwd rows): attention_max and attention_half_sd;
- memory_bandwidth from copies (bytes read + written / s over the datasheet);
- optimizer bandwidth from optimizer steps at 28 bytes/param for AdamW (read p, g, m, v; write p, m, v
  in fp32) and 20 for SGD with momentum (read p, g, buf; write p, buf); element-wise from the foreach
  AdamW's kernels.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from advisor.calibrate.fitting import OUTLIER_REL, FitReport, Ledger, log_r2
from advisor.hardware import ComputeEfficiency, Hardware
from advisor.calibrate.measurements import CalibrationError, _math_of
from advisor.precision import RECIPES
from advisor.units import GB

ADAMW_BYTES_PER_PARAM = 28.0  # 7 fp32 accesses: read p, g, m, v; write p, m, v
SGD_BYTES_PER_PARAM = 20.0  # 5 fp32 accesses: read p, g, buf; write p, buf


# Two parameters (max, half_dim) need a third point before the fit is checked by anything: with fewer, any
# two times are reproduced exactly and the fit says nothing.
MIN_MATMUL_POINTS = 3

# A GEMM sweep timed back to back from Python bottoms out at the host's cost of issuing one call: the
# smallest shapes all take the same time however few FLOPs they do (reference/h100/kernels.jsonl: 1024^3,
# 1024x768x2304 and 1024x3072x768 all ~34.7 us). Points within this factor of the sweep's fastest time
# measure the host, not the GPU, and are left out of the fit (counted in its report).
HOST_FLOOR_FACTOR = 1.3


def fit_matmul(rows: list[dict], hw: Hardware, skipped: Optional[list[str]] = None
               ) -> dict[str, tuple[float, float, float, FitReport]]:
    """Per precision (matmul_max, matmul_half_dim, matmul_fixed_us) from
    t = F / (peak * max * n/(n+h) * k/(k+h)) + fixed, fitted on the GPU-bound points. A precision with fewer
    points than MIN_MATMUL_POINTS is not fitted (said in ``skipped``)."""
    out: dict[str, tuple[float, float, float, FitReport]] = {}
    by_math: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "matmul" and r.get("status", "ok") == "ok" and r.get("timing") != GPU_TIMING:
            by_math.setdefault(r.get("math") or _math_of(r), []).append(r)
    for math, rs in sorted(by_math.items()):
        # a low-precision recipe's GEMMs (advisor.precision, e.g. fp8-tensorwise through torch._scaled_mm) are
        # fitted against the peak of the recipe's format, into the profile's matmul_* entries under its name
        if math not in ("fp32", "tf32", "bf16", "fp16", "fp8") and math not in RECIPES:
            raise CalibrationError(f"matmul rows with math {math!r}: expected fp32, tf32, bf16, fp16, fp8 or a recipe "
                                   f"({', '.join(RECIPES)})")
        shapes = len({tuple(float(r.get(c, 0)) for c in ("m", "k", "n")) for r in rs})  # a repeated shape: one point
        if shapes < MIN_MATMUL_POINTS:
            if skipped is not None:
                skipped.append(f"matmul {math}: {shapes} distinct shape{'s' if shapes > 1 else ''} ({len(rs)} rows), "
                               f"need at least {MIN_MATMUL_POINTS} to fit max and half_dim; kept from the base profile")
            continue
        out[math] = _fit_matmul_math(math, rs, hw.gpu.peak_flops_per_s(RECIPES[math].format if math in RECIPES else math))
    return out


def _fit_matmul_math(math: str, rs: list[dict], peak: float) -> tuple[float, float, float, FitReport]:
    from scipy.optimize import least_squares

    m, k, nn = (np.array([float(r[c]) for r in rs]) for c in ("m", "k", "n"))
    t = np.array([float(r["time_s"]) for r in rs])
    F = 2 * m * k * nn
    gpu = t > HOST_FLOOR_FACTOR * t.min()
    if gpu.sum() <= 3:  # too few GPU-bound shapes to separate the fixed time: fit the two-parameter form
        gpu = np.ones_like(t, dtype=bool)
        fixed_bound = 1e-9
    else:
        fixed_bound = 1e4

    def model(x):
        return F / (peak * x[0] * nn / (nn + x[1]) * k / (k + x[1])) + x[2] * 1e-6

    x = least_squares(lambda x: np.log(model(x)[gpu] / t[gpu]), [0.7, 64.0, 0.0],
                      bounds=([1e-6, 0.0, 0.0], [1.0, 1e5, fixed_bound])).x
    rel = model(x)[gpu] / t[gpu] - 1
    r2 = log_r2(model(x)[gpu], t[gpu])
    note = "" if gpu.all() else f"{int((~gpu).sum())} host-bound points (< {HOST_FLOOR_FACTOR} x the fastest) left out"
    rep = FitReport(f"matmul {math}", int(gpu.sum()), float(r2), float(np.abs(rel).max()), float(np.abs(rel).mean()),
                    [(int(a), int(b), int(c), round(float(e), 3)) for a, b, c, e in zip(m[gpu], k[gpu], nn[gpu], rel)
                     if abs(e) > OUTLIER_REL], note=note)
    return round(float(x[0]), 4), round(float(x[1]), 1), round(float(x[2]), 1), rep


# A matmul row timed with no host between kernels (CUDA-graph replays timed by CUDA events): its time is the GPU's alone
GPU_TIMING = "cuda_graph"
# The thin GEMMs the kernel floor is fitted on: M below the 1024 tokens a training step's dense linears start at
# (validation/data/build_from_aiconfigurator.py keeps m 1024..8192 for those), where the per-kernel time weighs most.
FLOOR_MAX_M = 1024


def fit_kernel_floor(rows: list[dict], hw: Hardware) -> dict[str, tuple[float, FitReport]]:
    """Per precision, matmul_kernel_floor_us: the ``floor`` of t = F / (peak * max * n/(n+h) * k/(k+h) * m/(m+h)) +
    floor over the GPU-timed rows (``GPU_TIMING``) of M < FLOOR_MAX_M, with the profile's own max and half dim (what
    advisor.parallel.expert costs a thin expert GEMM with), fitted in log space. The GPU's time per GEMM kernel with no
    launch gap, where a per-call sweep's matmul_fixed_us also holds the host's."""
    from scipy.optimize import least_squares

    out: dict[str, tuple[float, FitReport]] = {}
    e = hw.efficiency
    by_math: dict[str, list[dict]] = {}
    for r in rows:
        if (r.get("kind") == "matmul" and r.get("status", "ok") == "ok" and r.get("timing") == GPU_TIMING
                and float(r["m"]) < FLOOR_MAX_M):
            by_math.setdefault(r.get("math") or _math_of(r), []).append(r)
    for math, rs in sorted(by_math.items()):
        if math not in e.matmul_max or len(rs) < MIN_MATMUL_POINTS:
            continue  # no shape terms to fit it beside, or too few rows to check one parameter
        m, k, nn = (np.array([float(r[c]) for r in rs]) for c in ("m", "k", "n"))
        t = np.array([float(r["time_s"]) for r in rs])
        h = e.matmul_half_dim.get(math, 0.0)
        compute = 2 * m * k * nn / (hw.gpu.peak_flops_per_s(math) * e.matmul_max[math] * nn / (nn + h) * k / (k + h)
                                    * m / (m + h))
        x = least_squares(lambda x: np.log((compute + x[0] * 1e-6) / t), [3.0], bounds=([0.0], [1e4])).x
        pred = compute + x[0] * 1e-6
        rel = pred / t - 1
        out[math] = (round(float(x[0]), 1), FitReport(f"matmul kernel floor {math}", len(t), float(log_r2(pred, t)),
                                                      float(np.abs(rel).max()), float(np.abs(rel).mean()),
                                                      note=f"M < {FLOOR_MAX_M}, GPU-timed ({GPU_TIMING})"))
    return out


def fit_bandwidths(rows: list[dict], hw: Hardware) -> tuple[Optional[float], dict[str, float], list[str]]:
    """memory_bandwidth from copies, optimizer_bandwidth per implementation; lines saying how."""
    hbm = hw.gpu.memory_bandwidth_bytes_per_s
    notes: list[str] = []
    copies = [float(r["bytes_moved"]) / float(r["time_s"]) for r in rows
              if r.get("kind") == "copy" and r.get("status", "ok") == "ok"]
    mem = None
    if copies:
        mem = round(min(1.0, max(copies) / hbm), 4)
        notes.append(f"copy: {max(copies) / GB:.1f} GB/s (best of {len(copies)}) = {mem:.3f} of {hbm / GB:.0f} GB/s"
                     + _capped(max(copies), hbm, hw))
    opt: dict[str, float] = {}
    for impl in sorted({r.get("optimizer") for r in rows if r.get("kind") == "optimizer"} - {None}):
        per_param = SGD_BYTES_PER_PARAM if impl.startswith("sgd") else ADAMW_BYTES_PER_PARAM
        rates = [float(r["params"]) * per_param / float(r["time_s"]) for r in rows
                 if r.get("kind") == "optimizer" and r.get("optimizer") == impl and r.get("status", "ok") == "ok"]
        if rates:
            opt[impl] = round(min(1.0, float(np.median(rates)) / hbm), 4)
            notes.append(f"optimizer {impl}: {np.median(rates) / GB:.1f} GB/s at {per_param:.0f} B/param = {opt[impl]:.3f}"
                         + _capped(float(np.median(rates)), hbm, hw))
    return mem, opt, notes


def _capped(rate: float, datasheet: float, hw: Hardware) -> str:
    """A rate above the base GPU's datasheet cannot be a fraction of it: said, not silently capped at 1."""
    if rate <= datasheet:
        return ""
    return f" (above the {hw.name} datasheet's {datasheet / GB:.0f} GB/s: capped at 1.0; is --base this GPU?)"


# torch.optim.AdamW(foreach=True) step = 8 foreach kernels over the parameters (mul_ for weight decay 8 B,
# lerp_ 12, mul_ 8, addcmul_ 12, sqrt 8, div_ 8, add_ 8, addcdiv_ 16: 80 bytes per fp32 parameter, read
# from torch/optim/adam.py _multi_tensor_adam): a measurement of PyTorch's element-wise kernels on
# parameter-sized tensors, which is what activations' element-wise work runs on too.
FOREACH_ADAMW_KERNEL_BYTES = 80.0


def fit_elementwise(rows: list[dict], hw: Hardware) -> tuple[Optional[float], list[str]]:
    rates = [float(r["params"]) * FOREACH_ADAMW_KERNEL_BYTES / float(r["time_s"]) for r in rows
             if r.get("kind") == "optimizer" and r.get("optimizer") in ("adamw", "adamw-foreach", "foreach")
             and r.get("status", "ok") == "ok"]
    if not rates:
        return None, []
    hbm = hw.gpu.memory_bandwidth_bytes_per_s
    frac = round(min(1.0, float(np.median(rates)) / hbm), 4)
    return frac, [f"element-wise (foreach AdamW at {FOREACH_ADAMW_KERNEL_BYTES:.0f} B/param): {np.median(rates) / GB:.1f} GB/s "
                  f"= {frac:.3f}" + _capped(float(np.median(rates)), hbm, hw)]


def fit_attention(rows: list[dict], hw: Hardware, fixed_us: float) -> Optional[tuple[float, float, FitReport]]:
    """(attention_max, attention_half_sd) from causal fused-attention forward times:
    t = (4 b h s^2 d / 2) / (peak_bf16 * max * s*d / (s*d + half_sd)) + fixed, where ``fixed`` is the bf16
    GEMM fit's per-kernel time (one kernel; too few shapes are measured to fit it apart)."""
    from scipy.optimize import least_squares

    rs = [r for r in rows if r.get("kind") == "sdpa_fwd" and r.get("status", "ok") == "ok"
          and all(c in r for c in ("b", "heads", "s", "d"))]
    if len({tuple(float(r[c]) for c in ("b", "heads", "s", "d")) for r in rs}) < 3:  # two parameters: a third
        return None  # distinct shape is the first that checks them
    b, h, sq, d = (np.array([float(r[c]) for r in rs]) for c in ("b", "heads", "s", "d"))
    t = np.array([float(r["time_s"]) for r in rs])
    F = 4.0 * b * h * sq * sq * d / 2.0
    peak = hw.gpu.peak_flops_per_s("bf16")

    def model(x):
        return F / (peak * x[0] * sq * d / (sq * d + x[1])) + fixed_us * 1e-6

    x = least_squares(lambda x: np.log(model(x) / t), [0.6, 6e4], bounds=([1e-6, 0.0], [1.0, 1e9])).x
    rel = model(x) / t - 1
    r2 = log_r2(model(x), t)
    rep = FitReport("attention (fused, causal, forward)", len(t), float(r2), float(np.abs(rel).max()),
                    float(np.abs(rel).mean()), note=f"with the bf16 GEMM's {fixed_us:.1f} us per kernel")
    return round(float(x[0]), 4), round(float(x[1]), -1), rep


def fit_efficiency(rows: list[dict], hw: Hardware, ledger: Optional[Ledger] = None) -> tuple[ComputeEfficiency, list[str]]:
    """The base profile's ComputeEfficiency with every measured field replaced, and report lines; ``ledger``
    (advisor.calibrate.profile) is told what was fitted, what could not be and which fits explain nothing."""
    led = Ledger()
    eff = hw.efficiency.model_dump()
    skipped: list[str] = []
    for math, (mx, half, fixed, rep) in fit_matmul(rows, hw, skipped).items():
        led.lines.append(f"{rep.line()}: max {mx:.3f}, half_dim {half:.0f}, fixed {fixed:.1f} us per kernel")
        if rep.explains_nothing:
            led.reject(f"efficiency.matmul {math}", rep, hw.name)
            continue
        eff["matmul_max"][math], eff["matmul_half_dim"][math], eff["matmul_fixed_us"][math] = mx, half, fixed
        led.fitted.append(f"efficiency.matmul {math}")
    for why in skipped:
        led.skip(why)
    for math, (floor, rep) in fit_kernel_floor(rows, hw).items():
        led.lines.append(f"{rep.line()}: {floor:.1f} us per kernel")
        if rep.explains_nothing:
            led.reject(f"efficiency.matmul_kernel_floor {math}", rep, hw.name)
            continue
        eff["matmul_kernel_floor_us"][math] = floor
        led.fitted.append(f"efficiency.matmul_kernel_floor {math}")
    att = fit_attention(rows, hw, eff["matmul_fixed_us"].get("bf16", 0.0))
    if att is not None:
        led.lines.append(f"{att[2].line()}: max {att[0]:.3f}, half_sd {att[1]:.0f}")
        if att[2].explains_nothing:
            led.reject("efficiency.attention", att[2], hw.name)
        else:
            eff["attention_max"], eff["attention_half_sd"] = att[0], att[1]
            led.fitted.append("efficiency.attention")
    mem, opt, notes = fit_bandwidths(rows, hw)
    if mem is not None:
        eff["memory_bandwidth"] = max(mem, 1e-6)
        led.fitted.append("efficiency.memory_bandwidth")
    eff["optimizer_bandwidth"].update({k: max(v, 1e-6) for k, v in opt.items()})
    led.fitted += [f"efficiency.optimizer_bandwidth {k}" for k in opt]
    ew, ew_notes = fit_elementwise(rows, hw)
    if ew is not None:
        eff["elementwise_bandwidth"] = ew
        led.fitted.append("efficiency.elementwise_bandwidth")
    if ledger is not None:
        ledger.fitted += led.fitted
        ledger.skipped += led.skipped
        ledger.rejected.update(led.rejected)
    return ComputeEfficiency(**eff), led.lines + notes + ew_notes
