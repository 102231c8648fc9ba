"""Microbenchmarks for `advisor calibrate` (torch.distributed; nccl on GPUs, gloo on CPU).

Collectives are measured as nccl-tests measures them (doc/PERFORMANCE.md): ``size`` is the buffer each
rank contributes (all-reduce), or the full output (all-gather) / full input (reduce-scatter), or each rank's whole
send buffer (all-to-all);
``algbw = size / time``, ``busbw = algbw * advisor.comm.bus_factor(collective, n)`` (the model's table).
Each measurement: ``warmup`` untimed calls, then ``iters`` timed calls; a call's time is the slowest
rank's (max over the group), and the median and spread (min, max) of the calls are kept.

Groups: inside a node, groups of 2, 4, ... ranks and the whole node; across nodes, one rank per node
(the inter-node link alone) and every rank ("world": all-reduce, all-gather, reduce-scatter and all-to-all over
every GPU of every node, what data, ZeRO and expert parallelism run). With one node only the intra-node link is
measured. Then the overlap measurements (advisor.calibrate.overlap: a GEMM loop beside an all-gather, the SMs NCCL
holds), then rank 0's kernels. Every rank walks the plan rank 0 read from its results file (what is left).

Started by ``advisor calibrate`` (advisor.calibrate.launch), or run in every rank under torchrun
(``torchrun ... -m advisor.cli_calibrate``). Every row is appended and flushed to the results JSONL as soon as
it is measured (rank 0 writes).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from advisor.calibrate.lifeline import bind_to_parent
from advisor.calibrate.overlap import overlap_plan, time_overlap
from advisor.calibrate.timing import call_times, sync
from advisor.comm import bus_factor

# all-to-all too: expert parallelism and Ulysses sequence parallelism send it, and across nodes it runs on each GPU's
# own NICs where the others aggregate them (advisor.comm.network): a sweep of it checks that apart
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
# transformer-shaped GEMMs (m = tokens, k/n = d_model or d_ff) and squares; CPU runs use the first few
MATMUL_SHAPES = ((256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                 (8192, 4096, 4096), (8192, 4096, 16384), (8192, 16384, 4096))


@dataclass
class BenchConfig:
    sizes: list[int]
    collectives: tuple[str, ...] = COLLECTIVES
    warmup: int = 3
    iters: int = 10
    backend: str = "gloo"
    out: str = "results.jsonl"
    compute: bool = True
    overlap: bool = True  # a GEMM loop beside a data-parallel collective: the SMs NCCL holds (overlap_plan)
    p2p: bool = True
    timeout_s: float = 120.0
    skip: list = field(default_factory=list)  # (link, collective or "overlap", n, size) already measured (resume)


def measurement_plan(cfg: BenchConfig, world: int, local: int) -> list[tuple[str, list[int], str, int]]:
    """(link, ranks, collective, size) in sweep order: what every rank walks through in lockstep."""
    nodes = max(1, world // local)
    intra_sizes = sorted({g for g in (2, 4, 8, 16, 32, 64, local) if 2 <= g <= local})
    groups = [("intra", list(range(g))) for g in intra_sizes]
    if nodes > 1:
        groups.append(("inter", [k * local for k in range(nodes)]))  # one GPU per node: the network alone
        groups.append(("world", list(range(world))))  # every GPU: what data parallelism across nodes runs
    plan = []
    for link, ranks in groups:
        for coll in cfg.collectives:
            for size in cfg.sizes:
                plan.append((link, ranks, coll, size))
        if cfg.p2p:
            for size in cfg.sizes:
                plan.append((link, ranks[:2], "send_recv", size))
    return plan


def time_collective(coll: str, size: int, group, ranks: list[int], cfg: BenchConfig, device) -> list[float]:
    """Per-call seconds (slowest rank per call) of one collective at one size."""
    import torch
    import torch.distributed as dist

    n = len(ranks)
    elem = 4  # float32, as nccl-tests' default
    count = max(n, size // elem // n * n)
    x = torch.ones(count, dtype=torch.float32, device=device)
    me = dist.get_rank()
    if coll == "all_reduce":
        call = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif coll == "all_gather":
        shard = x[: count // n].clone()
        call = lambda: dist.all_gather_into_tensor(x, shard, group=group)  # noqa: E731
    elif coll == "reduce_scatter":
        shard = torch.empty(count // n, dtype=torch.float32, device=device)
        call = lambda: dist.reduce_scatter_tensor(shard, x, group=group)  # noqa: E731
    elif coll == "all_to_all":  # nccl-tests' alltoall: size = each rank's whole send buffer, size / n to each peer
        out = torch.empty_like(x)
        call = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
    else:  # send_recv: ranks[0] sends to ranks[1]
        peer = ranks[1] if me == ranks[0] else ranks[0]
        call = (lambda: dist.send(x, peer)) if me == ranks[0] else (lambda: dist.recv(x, peer))  # noqa: E731
    t = torch.tensor(call_times(call, group, cfg, device), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.tolist()


def collective_row(link: str, coll: str, n: int, size: int, times: list[float], per_node: int | None = None) -> dict:
    med = statistics.median(times)
    algbw = size / med
    row = {"kind": "collective", "link": link, "collective": coll, "n_ranks": n, "size_bytes": size,
           "time_s": med, "time_min_s": min(times), "time_max_s": max(times), "iters": len(times),
           "algbw_GBps": algbw / 1e9, "busbw_GBps": algbw * float(bus_factor(coll, n)) / 1e9, "status": "ok"}
    if per_node:
        row["per_node"] = per_node
    return row


def compute_rows(device, cpu: bool) -> list[dict]:
    """Matmul TFLOP/s per precision and shape, device copy bandwidth, optimizer step rates."""
    import torch

    rows = []
    shapes = MATMUL_SHAPES[:3] if cpu else MATMUL_SHAPES
    # fp16 measured beside bf16, not assumed equal: the same tensor-core peak on every GPU since Ampere, but a cuBLAS
    # heuristic or a clock can part them, and a refit of bf16 alone left fp16-mixed plans on the base profile's rate
    precisions = [("fp32", torch.float32, False)] + ([] if cpu else [("tf32", torch.float32, True), ("bf16", torch.bfloat16, False),
                                                                    ("fp16", torch.float16, False)])
    for math, dtype, tf32 in precisions:
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = tf32
        for m, k, n in shapes:
            a = torch.randn(m, k, dtype=dtype, device=device)
            b = torch.randn(k, n, dtype=dtype, device=device)
            t = _median_time(lambda: a @ b, device, 2 if cpu else 10)
            rows.append({"kind": "matmul", "math": math, "m": m, "k": k, "n": n, "time_s": t,
                         "TFLOPs": 2 * m * k * n / t / 1e12, "status": "ok"})
    if not cpu:
        rows += fp8_matmul_rows(device, shapes)
    nbytes = (64 if cpu else 1024) << 20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = _median_time(lambda: dst.copy_(src), device, 3 if cpu else 20)
    rows.append({"kind": "copy", "bytes_moved": 2 * nbytes, "time_s": t, "GBps": 2 * nbytes / t / 1e9, "status": "ok"})
    rows += optimizer_rows(device, params=(2 << 20) if cpu else (200 << 20))
    return rows


def fp8_matmul_rows(device, shapes) -> list[dict]:
    """The FP8 recipes' GEMMs as the stacks call them, on a GPU with FP8 tensor cores (sm_89+): torch._scaled_mm on
    pre-quantised e4m3 operands with one scale per tensor (fp8-tensorwise: Transformer Engine's current scaling and
    torchao's TENSORWISE call this cuBLAS kernel) and one per row / column (fp8-rowwise: torchao's AXISWISE, the
    CUTLASS row-wise kernel), bf16 out. Quantisation is not timed: advisor.compute costs it apart, as memory-bound
    work. Nothing where the GPU or the PyTorch build lacks them."""
    import torch

    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9) or not hasattr(torch, "_scaled_mm"):
        return []
    rows = []
    for math, rowwise in (("fp8-tensorwise", False), ("fp8-rowwise", True)):
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLAS's FP8 needs
            sa = torch.ones((m, 1) if rowwise else (), device=device)
            sb = torch.ones((1, n) if rowwise else (), device=device)
            try:
                t = _median_time(lambda: torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16), device, 10)
            except (RuntimeError, TypeError):  # a shape or scaling this build's kernels refuse
                continue
            rows.append({"kind": "matmul", "math": math, "m": m, "k": k, "n": n, "time_s": t,
                         "TFLOPs": 2 * m * k * n / t / 1e12, "status": "ok"})
    return rows


def optimizer_rows(device, params: int) -> list[dict]:
    import torch

    rows = []
    impls = [("adamw", dict(foreach=True)), ("sgd", dict(foreach=True))]
    if device.type == "cuda":
        impls.insert(1, ("adamw-fused", dict(fused=True)))
    per = 8 << 20 if params >= 8 << 20 else params
    ps = [torch.zeros(per, device=device, requires_grad=True) for _ in range(max(1, params // per))]
    for p in ps:
        p.grad = torch.ones_like(p)
    for name, kw in impls:
        opt = (torch.optim.SGD(ps, lr=1e-3, momentum=0.9, **kw) if name == "sgd"
               else torch.optim.AdamW(ps, lr=1e-3, **kw))
        t = _median_time(opt.step, device, 3)
        rows.append({"kind": "optimizer", "optimizer": name, "params": per * len(ps), "time_s": t, "status": "ok"})
    return rows


def _median_time(fn, device, iters: int) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def lockstep(dist, ranks: list[int], world: int) -> None:
    """Every rank meets after a measurement of a sub-group (the 2 GPUs of an intra-node pair, one GPU a node): the
    ranks outside it wait one measurement, not the group's whole sweep, which on a busy CPU outlasts the process
    group's timeout (--timeout): gloo then closes the pair, and the ranks that ran ahead record every later
    collective as failed and die at the closing barrier."""
    if len(ranks) < world:
        dist.barrier()


def run_worker(cfg: BenchConfig, progress_dir: str | None = None) -> None:
    """One rank: join the process group (env:// rendezvous), walk the plan, rank 0 appends rows. Started by
    advisor.calibrate.launch, the rank dies with the launcher (advisor.calibrate.lifeline)."""
    bind_to_parent()
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if cfg.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank % local)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    dist.init_process_group(cfg.backend, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    # what is left to measure, as rank 0 read it from its results file: under torchrun on several nodes each rank read
    # its own copy (or none), and ranks that walk different plans wait on each other's collectives for ever
    decided = [cfg.skip, cfg.overlap] if rank == 0 else [None, None]
    dist.broadcast_object_list(decided, src=0)
    cfg = replace(cfg, skip=decided[0], overlap=decided[1])
    plan = measurement_plan(cfg, world, local)
    groups = {}
    for ranks in [e[1] for e in plan] + [e[1] for e in overlap_plan(cfg, world, local)]:  # every rank, in one order
        if tuple(ranks) not in groups:
            groups[tuple(ranks)] = dist.new_group(ranks) if len(ranks) < world else dist.group.WORLD
    out = open(cfg.out, "a") if rank == 0 else None
    skip = {tuple(s) for s in cfg.skip}
    beat = Path(progress_dir) / f"rank{rank}" if progress_dir else None

    def emit(row: dict) -> None:  # rank 0 appends each row as it is measured
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()

    try:
        for i, (link, ranks, coll, size) in enumerate(plan):
            if beat:
                beat.write_text(f"{i} {len(plan)} {time.time()}")
            if (link, coll, len(ranks), size) in skip:
                continue
            if rank in ranks:
                try:
                    times = time_collective(coll, size, groups[tuple(ranks)], ranks, cfg, device)
                    row = collective_row(link, coll, len(ranks), size, times, local if link == "world" else None)
                except RuntimeError as exc:  # e.g. out of memory at the largest sizes: recorded, not dropped
                    row = {"kind": "collective", "link": link, "collective": coll, "n_ranks": len(ranks),
                           "size_bytes": size, "status": "failed", "error": str(exc).splitlines()[0][:200]}
                emit(row)
            lockstep(dist, ranks, world)
        for j, (link, ranks, size) in enumerate(overlap_plan(cfg, world, local)):
            if beat:  # a beat per measurement: the launcher takes a silent rank for a hung one
                beat.write_text(f"{len(plan)} {len(plan)} {time.time()} overlap {j}")
            if (link, "overlap", len(ranks), size) in skip:
                continue
            if rank in ranks:
                try:
                    row = time_overlap(link, size, groups[tuple(ranks)], ranks, cfg, device)
                except RuntimeError as exc:
                    row = {"kind": "overlap", "link": link, "collective": "all_gather", "n_ranks": len(ranks),
                           "size_bytes": size, "status": "failed", "error": str(exc).splitlines()[0][:200]}
                if link == "world":
                    row["per_node"] = local
                emit(row)
            lockstep(dist, ranks, world)
        if cfg.compute and rank == 0:
            for row in compute_rows(device, cpu=device.type == "cpu"):
                emit(row)
        if beat:
            beat.write_text(f"{len(plan)} {len(plan)} {time.time()} done")
        dist.barrier()
    finally:
        if out:
            out.close()
        dist.destroy_process_group()
