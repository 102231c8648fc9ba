"""What every validation dataset reports (validation.validate runs them): the compared points, the dataset's report,
and the helpers each dataset module shares: a profile loaded once, ``advisor.estimate`` with its refusals counted by
reason, and the percentage errors."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from functools import lru_cache
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from advisor.api import Estimate, estimate
from advisor.errors import AdvisorError
from advisor.hardware import Hardware, load_hardware


class Result(BaseModel):
    model_config = ConfigDict(frozen=True)


class Point(Result):
    """One compared row: predicted and measured values of the dataset's quantity."""

    label: str
    kind: str  # plan kind, for the error-by-kind figure
    predicted: float
    measured: float
    breakdown: dict[str, float] = Field(default_factory=dict)

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured


class Comparison(Result):
    """A measured direction of a seed: ``faster`` took less time than ``slower`` by ``measured_ratio``."""

    faster: str
    slower: str
    measured_ratio: float
    predicted_ratio: float
    direction_ok: bool
    ratio_error_pct: float  # predicted / measured - 1
    agrees: bool
    why: str


class Ranking(Result):
    groups: int
    mean_rho: float
    min_rho: float


class KindError(Result):
    n: int
    mape_pct: float
    mean_error_pct: float  # signed: > 0 the model is slow (pessimistic)


class DatasetReport(Result):
    name: str
    description: str
    quantity: str  # what the APE is of, with its unit
    rows: int
    compared: int
    mape_pct: float
    max_ape_pct: float
    memory_mape_pct: Optional[float] = None
    memory_max_ape_pct: Optional[float] = None
    spearman: dict[str, Ranking] = Field(default_factory=dict)
    comparisons: list[Comparison] = Field(default_factory=list)
    rejected: dict[str, int] = Field(default_factory=dict)
    extra: dict[str, float] = Field(default_factory=dict)
    by_kind: dict[str, KindError] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    points: list[Point] = Field(default_factory=list, exclude=True)
    secondary: dict[str, list[Point]] = Field(default_factory=dict, exclude=True)  # e.g. published step times


# --- shared helpers ---------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _hardware(name: str) -> Hardware:
    return load_hardware(name)


def _estimate(kw: dict, rejected: Counter) -> Optional[Estimate]:
    """``advisor.estimate`` with the profile loaded once; a rejected plan is counted by its reason."""
    kw = dict(kw)
    if isinstance(kw["hw"], str):
        kw["hw"] = _hardware(kw["hw"])
    try:
        return estimate(**kw)
    except AdvisorError as exc:
        rejected[str(exc).splitlines()[0]] += 1
        return None


def ape_stats(points: list[Point]) -> tuple[float, float]:
    """(mean, max) absolute percentage error; NaN when nothing was compared."""
    if not points:
        return math.nan, math.nan
    ape = np.abs([p.error_pct for p in points])
    return float(ape.mean()), float(ape.max())


def _report(name: str, description: str, quantity: str, rows: int, points: list[Point], rejected: Counter,
            **kw) -> DatasetReport:
    mape, mx = ape_stats(points)
    errors = defaultdict(list)
    for p in points:
        errors[p.kind].append(p.error_pct)
    by_kind = {k: KindError(n=len(e), mape_pct=float(np.mean(np.abs(e))), mean_error_pct=float(np.mean(e)))
               for k, e in sorted(errors.items())}
    return DatasetReport(name=name, description=description, quantity=quantity, rows=rows, compared=len(points),
                         mape_pct=mape, max_ape_pct=mx, rejected=dict(rejected), points=points, by_kind=by_kind, **kw)
