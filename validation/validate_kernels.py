"""Kernel-level checks against a second measurement harness: NVIDIA aiconfigurator's GEMM timings on A100, H100,
B200 and H200 and its NCCL 2.27 collectives on 2, 4 and 8 A100s (validation/data/aiconfigurator_*.csv, SOURCES.md).

- ``gemm_efficiency_ratio(gpu)``: for each training-sized GEMM shape timed on that GPU and on the H100, the
  fraction of its datasheet peak the GPU reaches over the fraction the H100 reaches. One harness timed both, so
  what it adds to every kernel cancels in the ratio (it sees ~3-5 us per kernel beyond the FLOPs where the
  one-call-at-a-time timing of reference/h100/kernels.jsonl sees 24 us: no launch gap). No A100, B200 or H200 was
  timed with our own harness, so the dgx-a100, aws-p6-b200 and dgx-h200 profiles' half-precision GEMM efficiency is
  the H100's fit times the median of this ratio (``GEMM_SHAPES_MIN_FLOPS``).
- ``validate_gemm``: how far each A100 shape sits from the H100's time carried over by that one ratio (the
  spread the transfer leaves), and how far both profiles' GEMM models (advisor.compute.gemm_time) sit from this
  harness: they carry the per-call harness's fixed time per kernel and its lower large-GEMM rate, so they
  are slower than it, by the same on both GPUs if the transfer holds.
- ``validate_a100_collectives``: all-reduce, all-gather, reduce-scatter and all-to-all against the dgx-a100
  comm model, whose link was fitted to all-reduce alone (the vTrain node's nccl-tests sweep): the other three
  collectives are an independent test of the bus factors and of one link fit serving every collective.

- ``kernel_floor``: the GPU's time per GEMM kernel with no launch gap (each profile's ``matmul_kernel_floor_us``),
  fitted to the thin GEMMs (m 1..768) by advisor.calibrate.compute fit_kernel_floor, what ``advisor calibrate --from``
  runs on rows marked ``"timing": "cuda_graph"``: this harness's times hold no host (its fastest GEMM, 2.5 us on every
  GPU, is below what PyTorch takes to issue one call: the profiles' kernel_launch_us 4 us alone). ``validate_gemm``
  scores those rows against the profile's thin-GEMM model with that floor (in-sample: one number per GPU).

``gemm_efficiency_ratio`` and ``kernel_floor`` are the numbers the profiles take from this data.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from advisor import comm
from advisor.calibrate.compute import FLOOR_MAX_M, GPU_TIMING, fit_kernel_floor
from advisor.compute import gemm_time
from advisor.units import MiB
from validation import datasets as ds
from validation.report import DatasetReport, Point, _hardware, _report

# Shapes of at least this many FLOPs (2mnk) enter a GPU/H100 ratio: a training step's linear layers
# (m = 1024..8192 tokens, n and k of 128..16384); below it the kernels are latency-bound, where the faster GPU
# (the H100 has 3x the A100's peak) loses more of its peak and the ratio says nothing about a step's GEMMs.
GEMM_SHAPES_MIN_FLOPS = 1e10
# The timed GPUs whose profiles take the H100's GEMM fit times their ratio: every one but the H100 itself
RATIO_GPUS = tuple(g for g in ds.GEMM_GPU_PROFILES if g != "h100")

# Collectives are scored from 8 MiB. Below it NCCL 2.27 (this data) and the NCCL of the vTrain node, to which the
# dgx-a100 link was fitted, part ways: 8 A100s all-reduce 1..4 MiB in 39..77 us here and in 93..96 us there
# (and ~100 us in Stas Bekman's A100 sweep, published_collectives.yaml): newer NCCL's small-message protocols.
COLLECTIVES_MIN_BYTES = 8 * MiB


def _shared_shapes(rows: list[ds.KernelGemmRow], gpu: str = "a100") -> list[tuple[int, int, int, float, float]]:
    """(m, n, k, the GPU's seconds, H100 seconds scaled by H100 peak / the GPU's peak) for every shape of at least
    GEMM_SHAPES_MIN_FLOPS timed on both GPUs: equal times mean equal fractions of peak."""
    time = {(r.gpu, r.m, r.n, r.k): r.time_s for r in rows}
    peak = {g: _hardware(ds.GEMM_GPU_PROFILES[g]).gpu.peak_flops_per_s("fp16") for g in ("h100", gpu)}
    return [(m, n, k, t, time[("h100", m, n, k)] * peak["h100"] / peak[gpu])
            for (g, m, n, k), t in sorted(time.items())
            if g == gpu and ("h100", m, n, k) in time and 2.0 * m * n * k >= GEMM_SHAPES_MIN_FLOPS]


def _ratio_stats(shared: list[tuple[int, int, int, float, float]]) -> tuple[float, float, float, int]:
    q = np.percentile([h100 / other for *_, other, h100 in shared], [50, 25, 75])
    return float(q[0]), float(q[1]), float(q[2]), len(shared)


def gemm_efficiency_ratio(gpu: str = "a100") -> tuple[float, float, float, int]:
    """(median, 25th, 75th percentile, shapes) of the GPU's efficiency / the H100's over the shared GEMM shapes
    of at least GEMM_SHAPES_MIN_FLOPS, each efficiency being FLOP/s over its profile's datasheet peak; ``gpu`` is
    a key of validation.datasets.GEMM_GPU_PROFILES other than "h100"."""
    if gpu not in RATIO_GPUS:
        raise ValueError(f"gpu {gpu!r}: one of {', '.join(RATIO_GPUS)}")
    return _ratio_stats(_shared_shapes(ds.load_aiconfigurator_gemm(), gpu))


def _floor_rows(gpu: str) -> list[dict]:
    """The GPU's thin-GEMM rows as calibration rows (advisor.calibrate.measurements' matmul kind), GPU-timed."""
    return [{"kind": "matmul", "m": r.m, "n": r.n, "k": r.k, "math": r.math, "time_s": r.time_s, "timing": GPU_TIMING}
            for r in ds.load_aiconfigurator_gemm_small() if r.gpu == gpu]


def kernel_floor(gpu: str):
    """(matmul_kernel_floor_us, its FitReport) of one timed GPU (a key of GEMM_GPU_PROFILES), fp16, with the shape terms
    of the GPU's profile."""
    return fit_kernel_floor(_floor_rows(gpu), _hardware(ds.GEMM_GPU_PROFILES[gpu]))["fp16"]


def _thin_points(gpu: str, floor_us: float) -> list[Point]:
    """The thin GEMMs against the profile's routed-expert model: shape terms, M / (M + h0), one kernel at ``floor_us``."""
    hw = _hardware(ds.GEMM_GPU_PROFILES[gpu])
    rs = _floor_rows(gpu)
    m, n, k, t = (np.array([r[c] for r in rs], dtype=float) for c in ("m", "n", "k", "time_s"))
    h0 = hw.efficiency.matmul_half_dim["fp16"]
    pred = gemm_time(hw, "fp16", 2.0 * m * n * k / (m / (m + h0)), n, k, kernels=0.0) + floor_us * 1e-6
    return [Point(label=f"{gpu} {int(a)}x{int(b)}x{int(c)}", kind=f"{gpu} m < {FLOOR_MAX_M} (kernel floor)",
                  predicted=float(p), measured=float(x)) for a, b, c, p, x in zip(m, n, k, pred, t)]


def validate_gemm() -> DatasetReport:
    """How well one number carries the H100's GEMM timings to the A100: per training-sized shape, the A100 time
    predicted as the H100's x (H100 peak / A100 peak) / the median ratio, against the A100's measured time; and
    (extras, notes) how far both profiles' GEMM models sit from this harness."""
    rows = ds.load_aiconfigurator_gemm()
    shared = _shared_shapes(rows)
    med, lo, hi, shapes = _ratio_stats(shared)
    points = []
    for m, n, k, t, h100_scaled in shared:
        flops = 2.0 * m * n * k
        kind = "1e10-1e11 FLOPs" if flops < 1e11 else ("1e11-1e12 FLOPs" if flops < 1e12 else ">= 1e12 FLOPs")
        points.append(Point(label=f"{m}x{n}x{k}", kind=kind, predicted=h100_scaled / med, measured=t))
    gap = {}
    for gpu, prof in ds.GEMM_GPU_PROFILES.items():
        hw = _hardware(prof)
        rs = [r for r in rows if r.gpu == gpu and 2.0 * r.m * r.n * r.k >= GEMM_SHAPES_MIN_FLOPS]
        m, n, k, t = (np.array([getattr(r, c) for r in rs], dtype=float) for c in ("m", "n", "k", "time_s"))
        pred = gemm_time(hw, "fp16", 2.0 * m * n * k, n, k)
        fixed = hw.efficiency.matmul_fixed_us["fp16"] * 1e-6
        gap[gpu] = (100.0 * float(np.median(pred / t - 1.0)), 100.0 * float(np.median((pred - fixed) / t - 1.0)))
    extra = {"a100_over_h100_efficiency_median": med, "a100_over_h100_efficiency_p25": lo,
             "a100_over_h100_efficiency_p75": hi, "ratio_shapes": shapes,
             "a100_profile_median_error_pct": gap["a100"][0], "h100_profile_median_error_pct": gap["h100"][0],
             "a100_profile_median_error_without_fixed_pct": gap["a100"][1],
             "h100_profile_median_error_without_fixed_pct": gap["h100"][1]}
    others = {g: _ratio_stats(_shared_shapes(rows, g)) for g in RATIO_GPUS if g != "a100"}
    for g, (m_, lo_, hi_, n_) in others.items():  # after the A100's: what it prints stays first and unchanged
        extra.update({f"{g}_over_h100_efficiency_median": m_, f"{g}_over_h100_efficiency_p25": lo_,
                      f"{g}_over_h100_efficiency_p75": hi_, f"{g}_ratio_shapes": n_,
                      f"{g}_profile_median_error_pct": gap[g][0], f"{g}_profile_median_error_without_fixed_pct": gap[g][1]})
    floors = {g: kernel_floor(g) for g in ds.GEMM_GPU_PROFILES}
    for g, (floor, rep) in floors.items():
        points += _thin_points(g, floor)
        hw = _hardware(ds.GEMM_GPU_PROFILES[g])
        extra.update({f"{g}_kernel_floor_us": floor, f"{g}_kernel_floor_mape_pct": 100.0 * rep.mean_rel_err,
                      f"{g}_profile_kernel_floor_us": hw.efficiency.kernel_floor_us("fp16")})
    notes = [f"one harness timed both GPUs: the A100 reaches {med:.3f}x the H100's fraction of peak (median of {shapes} "
             f"shapes >= {GEMM_SHAPES_MIN_FLOPS:.0e} FLOPs, quartiles {lo:.3f}..{hi:.3f}), so dgx-a100's GEMM "
             "efficiency is dgx-h100's fit times that median; the points are the per-shape spread around it",
             "the profiles' GEMM models carry reference/h100's per-call timing (a fixed ~24 us per kernel and a lower "
             "large-GEMM rate) and are slower than this harness (no launch gap in its times): median "
             f"A100 {gap['a100'][0]:+.0f}%, H100 {gap['h100'][0]:+.0f}%; without the fixed time A100 {gap['a100'][1]:+.1f}%, "
             f"H100 {gap['h100'][1]:+.1f}%: the same rate gap on both GPUs, which is what the transfer needs"]
    notes += [f"the same harness on the {g.upper()}: {m_:.3f}x the H100's fraction of peak (median of {n_} shapes, "
              f"quartiles {lo_:.3f}..{hi_:.3f}), which {ds.GEMM_GPU_PROFILES[g]}'s half-precision GEMM rate takes; its "
              f"profile sits {gap[g][0]:+.0f}% from this harness ({gap[g][1]:+.1f}% without the fixed time)"
              for g, (m_, lo_, hi_, n_) in others.items()]
    notes.append("thin GEMMs (m 1..768, aiconfigurator_gemm_small.csv; GPU-timed, no launch gap): per-kernel floor "
                 + ", ".join(f"{g.upper()} {f:.1f} us" for g, (f, _) in floors.items())
                 + f" (fit_kernel_floor, with each profile's shape terms and M / (M + h0); in-sample), against the "
                 f"profiles' per-call matmul_fixed_us {_hardware('dgx-h100').efficiency.matmul_fixed_us['fp16']:.1f} us")
    return _report("gemm", "aiconfigurator fp16 GEMMs on A100, H100, B200, H200 (one harness): the A100 from the H100 "
                   "by one ratio; thin GEMMs at each GPU's kernel floor", "GEMM time (s)", len(rows) +
                   len(ds.load_aiconfigurator_gemm_small()), points, Counter(), extra=extra, notes=notes)


def validate_a100_collectives() -> DatasetReport:
    """NCCL 2.27.3 all-reduce / all-gather / reduce-scatter / all-to-all on 2, 4, 8 A100s vs the dgx-a100 comm model."""
    rows = ds.load_aiconfigurator_nccl_a100()
    hw = _hardware("dgx-a100")
    points, small = [], defaultdict(list)
    pred = np.empty(len(rows))
    for coll in {r.collective for r in rows}:  # one vectorised call per collective
        at = [i for i, r in enumerate(rows) if r.collective == coll]
        n = np.array([rows[i].n_gpus for i in at], dtype=float)
        pred[at] = comm.collective_time(coll, n, np.array([rows[i].size_bytes for i in at], dtype=float), hw, n)
    for r, t in zip(rows, pred):
        p = Point(label=f"{r.collective} {r.n_gpus} GPUs {r.size_bytes} B", kind=f"{r.collective} {r.n_gpus} GPUs",
                  predicted=float(t), measured=r.time_s)
        if r.size_bytes >= COLLECTIVES_MIN_BYTES:
            points.append(p)
        else:
            small[r.collective].append(p.error_pct)
    notes = [f"scored from {int(COLLECTIVES_MIN_BYTES // MiB)} MiB; below it ({sum(map(len, small.values()))} sizes) the "
             "model is slower, median " + ", ".join(f"{c} {np.median(e):+.0f}%" for c, e in sorted(small.items()))
             + ": the profile's small-message floor is the vTrain node's older NCCL (95 us on 8 GPUs at 1..4 MiB; "
             "NCCL 2.27 here: 39..77 us)",
             "the dgx-a100 link was fitted to all-reduce only: all-gather, reduce-scatter and all-to-all test the "
             "bus factors (n-1)/n and one link fit serving every collective"]
    return _report("a100-collectives", "NCCL 2.27.3 collectives on 2/4/8 A100-SXM4-80GB (aiconfigurator), half precision",
                   "collective time (s)", len(rows), points, Counter(), notes=notes)


if __name__ == "__main__":
    for gpu in RATIO_GPUS:
        med, lo, hi, shapes = gemm_efficiency_ratio(gpu)
        print(f"{gpu.upper()} / H100 fraction of fp16 peak, {shapes} GEMM shapes >= {GEMM_SHAPES_MIN_FLOPS:.0e} FLOPs: "
              f"median {med:.4f}, quartiles {lo:.4f} .. {hi:.4f}")
