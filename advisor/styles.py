"""Kernel styles: the setup fields shared by every candidate plan, and per-plan dispatch between the
Hugging Face module style and Megatron's fused kernels (``compute.Workload.framework``)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import numpy as np

from advisor.compute import LayerTimes, Workload
from advisor.plans import Precision, TrainingSetup


@dataclass(frozen=True)
class Scalars:
    """Setup fields that are the same for every candidate plan."""

    seq_len: int
    precision: Precision
    attention: Any
    optimizer: str
    framework: str  # auto | hf | megatron

    @classmethod
    def of(cls, setup: TrainingSetup) -> "Scalars":
        return cls(setup.seq_len, setup.precision, setup.attention, setup.optimizer.value, setup.framework)


def per_style(megatron: Any, sc: Scalars, fn: Callable[[Workload], Any]) -> Any:
    """``fn(workload)`` for the kernel style of each plan: HF eager modules or Megatron's fused kernels.

    Only the style(s) present are evaluated (a search runs one style); with both, the results - arrays,
    tuples of arrays or a LayerTimes - are merged plan by plan.
    """
    w_hf, w_mg = (Workload(sc.seq_len, sc.precision, sc.attention, style) for style in ("hf", "megatron"))
    if megatron.all():
        return fn(w_mg)
    if not megatron.any():
        return fn(w_hf)
    return merge(megatron, fn(w_hf), fn(w_mg))


def merge(megatron: Any, hf: Any, mg: Any) -> Any:
    if isinstance(hf, LayerTimes):
        return LayerTimes(*(merge(megatron, getattr(hf, f.name), getattr(mg, f.name)) for f in fields(LayerTimes)))
    if isinstance(hf, tuple):
        return tuple(merge(megatron, a, b) for a, b in zip(hf, mg))
    return np.where(megatron, mg, hf)
