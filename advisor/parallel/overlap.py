"""What the data-parallel collectives hide behind: the GPU's work per phase of a micro-batch and its idle time behind
a host-bound host (``Windows``), and how exposed seconds pool that idle time (``hidden``). While a collective runs beside
the compute, NCCL's thread blocks hold some of the SMs (advisor.comm.held_sms, advisor.comm.beside): the collectives
of advisor.parallel.data pass that share along with what they hide behind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Windows:
    """What the data-parallel collectives hide behind, per micro-batch on the busiest stage: the GPU's work per
    phase, and its idle time behind a host-bound host (advisor.host, charged once per micro-batch), which hides the
    collectives already issued once, pooled over them (``hidden``; the gradient reduction, after the forward, pools
    only the idle that is not the forward's; ZeRO-1's gather, in the next forward, that forward's). Pooled, whatever
    a faster GPU or host exposes is at most what it shortened."""

    fwd_s: Any  # the layers' forward with their TP collectives in line
    bwd_s: Any  # the layers' backward and recomputation with their TP collectives
    last_backward_s: Any  # the last micro-batch's backward, which the gradient reduction can hide behind
    idle_forward_s: Any = 0.0  # the GPU's idle seconds per micro-batch behind a host-bound forward
    idle_backward_s: Any = 0.0  # and the rest of them (advisor.host.idle_per_micro_batch)

    @property
    def idle_s(self) -> Any:
        return self.idle_forward_s + self.idle_backward_s


def hidden(floors: Any, needs: list[Any], idle: Any) -> list[Any]:
    """Exposed seconds of collectives, each ``max(c - window, floor)`` written as ``floor + need``, once the GPU's
    idle seconds have hidden what they can of the needs, first to last."""
    out = []
    for floor, need in zip(floors, needs):
        out.append(floor + np.maximum(need - idle, 0.0))
        idle = np.maximum(idle - need, 0.0)
    return out
