"""The overlap measurement of `advisor calibrate`: a GEMM loop timed alone and beside an all-gather started on NCCL's
stream, over the groups data parallelism runs (the whole node; every GPU across nodes), so that
advisor.calibrate.profile can fit the SMs NCCL's thread blocks hold beside the compute (a link's ``nccl_channels``,
advisor.comm.held_sms). torch is imported inside the functions only.
"""

from __future__ import annotations

import statistics
from typing import Any

from advisor.calibrate.timing import call_times


def overlap_plan(cfg: Any, world: int, local: int) -> list[tuple[str, list[int], int]]:
    """(link, ranks, size) of the overlap measurements: an all-gather (FSDP's and ZeRO-3's gather) over the groups data
    parallelism runs, the whole node and, across nodes, every GPU, at the sizes from OVERLAP_FROM_BYTES (where the
    collective runs on all its channels), else the largest swept."""
    if not cfg.overlap or local < 2:
        return []
    sizes = [s for s in cfg.sizes if s >= OVERLAP_FROM_BYTES] or [max(cfg.sizes)]
    groups = [("intra", list(range(local)))] + ([("world", list(range(world)))] if world > local else [])
    return [(link, ranks, size) for link, ranks in groups for size in sizes]


# 64 MiB: at and above it NCCL's rings run on every channel (bandwidth-bound; the fitted links' size ramps are spent
# by then on every shipped profile), which is what the overlapped FSDP gathers of a layer (hundreds of MiB) hold
OVERLAP_FROM_BYTES = 64 << 20
# the GEMM loop lasts this many times the collective alone, so that the collective runs beside it from start to end
OVERLAP_OUTLAST = 3.0


def time_overlap(link: str, size: int, group, ranks: list[int], cfg: Any, device) -> dict:
    """An all-gather of ``size`` started asynchronously (NCCL's own stream) with a GEMM loop queued behind it on the
    compute stream: the seconds of the loop alone (``compute_s``), of the collective alone and of the loop beside the
    collective (``time_s``), each the slowest rank's median. On a GPU the loop is timed by CUDA events around it on
    the compute stream, so the host's issue of the collective before it is not counted; on CPU, the call. The loop,
    OVERLAP_OUTLAST times the collective, ends last, so beside - alone = collective x the share of the SMs (or cores)
    its kernels held (advisor.comm.beside)."""
    import torch
    import torch.distributed as dist

    n = len(ranks)
    count = max(n, size // 4 // n * n)
    out = torch.empty(count, dtype=torch.float32, device=device)
    shard = torch.ones(count // n, dtype=torch.float32, device=device)
    gpu = device.type == "cuda"
    dim = 4096 if gpu else 256
    a, b = (torch.randn(dim, dim, dtype=torch.bfloat16 if gpu else torch.float32, device=device) for _ in range(2))

    def median_of(fn) -> float:
        return statistics.median(call_times(fn, group, cfg, device))

    def seconds(fn, before=lambda: None, after=lambda started: None) -> float:
        """Median seconds of ``fn``, with ``before`` run before it in each call and ``after`` given what ``before``
        returned after it: on a GPU by CUDA events around ``fn`` alone on the current stream (a blocking collective's
        wait is on that stream), so that the host's issue of anything is in no figure; on CPU the whole call's."""
        spans = []

        def call():
            started = before()
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if gpu else []
            if ends:
                ends[0].record()
            fn()
            if ends:
                ends[1].record()
                spans.append(ends)
            after(started)

        wall = call_times(call, group, cfg, device)
        return statistics.median([s.elapsed_time(e) / 1e3 for s, e in spans[cfg.warmup:]] if gpu else wall)

    def slowest(*values: float) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return t.tolist()

    coll_s, mm_s = slowest(seconds(lambda: dist.all_gather_into_tensor(out, shard, group=group)), median_of(lambda: a @ b))
    reps = max(1, int(OVERLAP_OUTLAST * coll_s / mm_s + 0.5))  # the same on every rank: both are the slowest rank's

    def loop():
        for _ in range(reps):
            a @ b

    def start():  # the all-gather on NCCL's stream, the loop queued behind it on the compute stream
        return dist.all_gather_into_tensor(out, shard, group=group, async_op=True)

    compute_s, both_s = slowest(seconds(loop), seconds(loop, start, lambda work: work.wait()))
    sms = torch.cuda.get_device_properties(device).multi_processor_count if gpu else None
    return {"kind": "overlap", "link": link, "collective": "all_gather", "n_ranks": n, "size_bytes": size,
            "time_s": both_s, "compute_s": compute_s, "collective_s": coll_s, "sm_count": sms, "status": "ok"}
