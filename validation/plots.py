"""Figures for ``advisor validate --plot DIR`` (matplotlib, Agg backend, PNG).

- predicted_vs_measured.png: one log-log panel per quantity (step time, TFLOP/s per GPU, all-reduce
  time), every dataset in its own colour, the y = x line and a +-10% band.
- error_by_kind.png: signed percentage error per plan kind, a box per kind, per dataset.
- seed_breakdown.png: the predicted time breakdown of each seed run as stacked bars, with the
  measured step time beside it.
Figures draw what ``validation.validate`` computed; they compute nothing of their own.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from validation.report import Point  # noqa: E402
from validation.validate import Report  # noqa: E402

BAND = 0.10  # the +-10% band drawn around y = x
DPI = 130
_MPL = tuple(int(x) for x in matplotlib.__version__.split(".")[:2])


def _panels(report: Report) -> dict[str, dict[str, list[Point]]]:
    """Quantity (axis label) -> dataset name -> points."""
    out: dict[str, dict[str, list[Point]]] = {}
    for d in report.datasets:
        for quantity, pts in [(d.quantity, d.points), *d.secondary.items()]:
            out.setdefault(quantity, {})[d.name] = pts
    return {q: v for q, v in out.items() if any(v.values())}


def predicted_vs_measured(report: Report, path: Path) -> Path:
    panels = _panels(report)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.8), squeeze=False)
    for ax, (quantity, by_name) in zip(axes[0], panels.items()):
        lo, hi = np.inf, 0.0
        for name, pts in by_name.items():
            if not pts:
                continue
            m = np.array([p.measured for p in pts])
            pr = np.array([p.predicted for p in pts])
            lo, hi = min(lo, m.min(), pr.min()), max(hi, m.max(), pr.max())
            ax.scatter(m, pr, s=10 if len(pts) > 50 else 36, alpha=0.5 if len(pts) > 50 else 0.9,
                       label=f"{name} ({len(pts)})")
        x = np.geomspace(lo / 1.5, hi * 1.5, 50)
        ax.plot(x, x, color="black", lw=1, label="predicted = measured")
        ax.fill_between(x, x * (1 - BAND), x * (1 + BAND), color="grey", alpha=0.2, label=f"+-{BAND:.0%}")
        ax.set(xscale="log", yscale="log", xlabel=f"measured {quantity}", ylabel=f"predicted {quantity}",
               title=quantity.split(" (")[0])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("advisor validate: predicted vs measured")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def error_by_kind(report: Report, path: Path) -> Path:
    data, labels = [], []
    for d in report.datasets:
        if d.name in ("titan", "dgx"):
            continue  # seeds: see seed_breakdown.png
        kinds = {}
        for p in d.points:
            kinds.setdefault(p.kind, []).append(p.error_pct)
        for k, e in sorted(kinds.items()):
            data.append(e)
            labels.append(f"{d.name}: {k} ({len(e)})")
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(labels) + 1.6))
    horizontal = {"orientation": "horizontal"} if _MPL >= (3, 10) else {"vert": False}  # `vert` deprecated in 3.10
    ax.boxplot(data, showfliers=True, flierprops={"markersize": 2}, **horizontal)
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.axvline(0, color="black", lw=1)
    ax.axvspan(-100 * BAND, 100 * BAND, color="grey", alpha=0.2, label=f"+-{BAND:.0%}")
    ax.set(xlabel="signed error, (predicted - measured) / measured (%)", title="error by plan kind (rows per kind)")
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def seed_breakdown(report: Report, path: Path) -> Path:
    seeds = [d for d in report.datasets if d.comparisons and d.points]
    if not seeds:
        return None
    fig, axes = plt.subplots(1, len(seeds), figsize=(6.5 * len(seeds), 5.0), squeeze=False)
    for ax, d in zip(axes[0], seeds):
        parts = [k for k in d.points[0].breakdown if any(p.breakdown.get(k, 0) > 0 for p in d.points)]
        x = np.arange(len(d.points))
        bottom = np.zeros(len(d.points))
        for k in parts:
            vals = np.array([p.breakdown.get(k, 0.0) for p in d.points]) * 1e3
            ax.bar(x - 0.2, vals, 0.4, bottom=bottom, label=k)
            bottom += vals
        ax.bar(x + 0.2, [p.measured * 1e3 for p in d.points], 0.4, color="black", alpha=0.7, label="measured step")
        ax.set_xticks(x, [p.label.replace("_", "\n", 2) for p in d.points], fontsize=7)
        ax.set(ylabel="time per optimizer step (ms)", title=f"{d.name}: predicted breakdown (left) vs measured (right)")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def write_figures(report: Report, out_dir: Path) -> list[Path]:
    """Write every figure that has data into ``out_dir`` (created if missing); return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [predicted_vs_measured(report, out_dir / "predicted_vs_measured.png"),
               error_by_kind(report, out_dir / "error_by_kind.png"),
               seed_breakdown(report, out_dir / "seed_breakdown.png")]
    return [p for p in written if p is not None]
