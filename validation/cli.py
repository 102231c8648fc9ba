"""`advisor validate`: run the cost model on every measured dataset and print how close it is.

The command lives here, in ``validation`` (which imports advisor, never the reverse), and reaches the
``advisor`` command line through the ``advisor.commands`` entry point (pyproject.toml). Thin: run
``validation.validate.run``, render a table per dataset, or ``--json``, and ``--plot DIR`` for PNGs.
Everything heavy (scipy, matplotlib, the datasets) is imported inside the command.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import click

DATASETS = ("titan", "dgx", "vtrain", "nccl", "collectives", "a100-collectives", "multinode", "gemm", "h100", "published",
            "modern", "lowprec", "bridge", "finetune", "bridge-moe")


def _f(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def render(report, goals: dict) -> str:
    """One table per dataset, then the goals (validation.validate.GOALS)."""
    out = []
    for d in report.datasets:
        out += [f"== {d.name}: {d.description}",
                f"  rows {d.rows}, compared {d.compared}; {d.quantity}: MAPE {_f(d.mape_pct)}%, max APE {_f(d.max_ape_pct)}%"]
        if d.memory_mape_pct is not None:
            out.append(f"  peak memory: MAPE {_f(d.memory_mape_pct)}%, max APE {_f(d.memory_max_ape_pct)}%")
        for g, rk in d.spearman.items():
            out.append(f"  Spearman {g}: mean {_f(rk.mean_rho, '.3f')}, min {_f(rk.min_rho, '.3f')} over {rk.groups} groups")
        for k, v in d.extra.items():
            out.append(f"  {k}: {_f(v, '.3g')}")
        if d.compared > 12 and len(d.by_kind) > 1:
            out.append("  by plan kind: " + "; ".join(f"{k} n={e.n} MAPE {e.mape_pct:.0f}% bias {e.mean_error_pct:+.0f}%"
                                                      for k, e in d.by_kind.items()))
        if d.compared <= 12:
            out.append(f"  {'row':40s} {'kind':26s} {'predicted':>10s} {'measured':>10s} {'error':>8s}")
            for p in d.points:
                out.append(f"  {p.label[:40]:40s} {p.kind[:26]:26s} {p.predicted:10.4g} {p.measured:10.4g} {p.error_pct:+7.1f}%")
        for c in d.comparisons:
            out.append(f"  [{'ok' if c.agrees else 'NO'}] {c.faster} faster than {c.slower}: measured x{c.measured_ratio:.3f}, "
                       f"predicted x{c.predicted_ratio:.3f} ({c.ratio_error_pct:+.0f}%)")
            if not c.agrees:
                out.append(f"       why: {c.why}")
        for reason, count in d.rejected.items():
            out.append(f"  rejected {count}: {reason}")
        out += [f"  note: {n}" for n in d.notes] + [""]
    out.append("goals:")
    for goal, (value, threshold, met) in report.goals().items():
        sense = "<=" if goals[goal].sense == "max" else ">="
        out.append(f"  [{'met' if met else 'NOT MET':7s}] {goal}: {_f(value, '.3g')} (goal {sense} {threshold:g})")
    out.append(f"validated in {report.wall_s:.1f} s")
    return "\n".join(out)


@click.command("validate")
@click.option("--dataset", "names", type=click.Choice(DATASETS), multiple=True,
              help="validate only these datasets (repeatable) [default: all]")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="write PNG figures into this directory")
@click.option("--points", "with_points", is_flag=True,
              help="with --json: every compared row too (label, kind, predicted, measured, the time breakdown)")
def validate(names: tuple[str, ...], as_json: bool, plot_dir: Optional[str], with_points: bool = False) -> None:
    """Compare the model with measured runs (seeds, vTrain, nccl-tests, H100 steps, published tables)."""
    from validation import validate as v

    if plot_dir is not None:  # made before the run: a --plot that cannot be a folder is one line, not a traceback
        if not plot_dir.strip():  # Path("") is "." : the figures would land wherever one stands
            raise click.UsageError("--plot needs a directory name (it is created), e.g. --plot figures")
        plot_dir = Path(plot_dir)
        if plot_dir.exists() and not plot_dir.is_dir():
            raise click.UsageError(f"--plot {plot_dir} exists and is not a directory: give a directory (it is created)")
        try:
            plot_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise click.UsageError(f"--plot {plot_dir}: {exc.strerror or exc}: give a directory (it is created)") from None
    report = v.run(list(names) or None)
    written = []
    if plot_dir is not None:
        from validation.plots import write_figures

        written = write_figures(report, plot_dir)
    if with_points and not as_json:
        raise click.UsageError("--points adds every compared row to --json's output: give --json too")
    if as_json:
        # schema 1: {schema, datasets: [DatasetReport (+ points with --points)], wall_s, goals, figures}
        doc = {"schema": 1, **report.model_dump(mode="json")}
        if with_points:
            for d, r in zip(doc["datasets"], report.datasets):
                d["points"] = [p.model_dump(mode="json") for p in r.points]
        doc["goals"] = {k: {"value": val, "threshold": thr, "met": met} for k, (val, thr, met) in report.goals().items()}
        doc["figures"] = [str(p) for p in written]
        click.echo(json.dumps(_nan_to_none(doc), indent=2))
        return
    click.echo(render(report, v.GOALS))
    for p in written:
        click.echo(f"wrote {p}")


def _nan_to_none(x):
    """JSON has no NaN: a quantity that could not be computed (no rows compared) is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x
