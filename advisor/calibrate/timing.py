"""Timing a call on every rank of a group alike, for `advisor calibrate`'s microbenchmarks (torch inside the functions).
"""

from __future__ import annotations

import time
from typing import Any


def call_times(fn, group, cfg: Any, device) -> list[float]:
    """Seconds of each timed call of ``fn`` on this rank (``cfg.warmup`` untimed first, then ``cfg.iters``), the group
    lined up before each."""
    import torch.distributed as dist

    times = []
    for i in range(cfg.warmup + cfg.iters):
        dist.barrier(group=group)
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        if i >= cfg.warmup:
            times.append(time.perf_counter() - t0)
    return times


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
