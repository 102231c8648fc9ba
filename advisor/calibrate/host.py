"""The host side a node offers offload (advisor.hardware.Host), measured on this machine with torch:

- the CPU Adam rate: parameters a second one AdamW step updates on the CPU, torch's fused CPU kernel (vectorised
  as DeepSpeed's CPU Adam is) over every thread torch uses, and per core (one thread);
- the pinned host<->device copy: a 256 MiB pinned tensor copied to the GPU and back (cudaMemcpyAsync), the PCIe
  link one GPU gets; without a GPU it cannot be measured, and the caller says so;
- host memory and cores from the operating system.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from advisor.units import GiB

COPY_BYTES = 256 * 2**20  # large enough that the copy's fixed cost is < 1% (PCIe latency is ~10 us)


def cpu_adam_params_per_s(n_params: int = 20_000_000, iters: int = 3, threads: Optional[int] = None) -> float:
    """Parameters per second one AdamW step on the CPU updates (fp32 states), best of ``iters`` after a warm-up."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        p = torch.nn.Parameter(torch.zeros(n_params))
        p.grad = torch.randn(n_params)
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
            opt.step()
        except (RuntimeError, TypeError):  # a torch without the fused CPU kernel
            opt = torch.optim.AdamW([p], lr=1e-4, foreach=True)
            opt.step()
        best = float("inf")
        for _ in range(iters):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
        return n_params / best
    finally:
        torch.set_num_threads(before)


def pinned_copy_GBps(nbytes: int = COPY_BYTES, iters: int = 5) -> Optional[tuple[float, float]]:
    """(host to device, device to host) GB/s of a pinned copy on GPU 0; None where no GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        return None
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = []
    for src, dst in ((host, dev), (dev, host)):
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out.append(nbytes * iters / (time.perf_counter() - t0) / 1e9)
    return out[0], out[1]


def host_memory_GiB() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB


def measure(base_host, gpus_per_node: int, n_params: int = 20_000_000) -> tuple[dict, list[str]]:
    """The measured host fields over ``base_host``'s (a Host or None), and a line per measurement for the user."""
    from advisor.errors import AdvisorError

    copy = pinned_copy_GBps()
    if copy is None and base_host is None:  # said before a measurement that takes seconds
        raise AdvisorError("no GPU to measure the host<->device copy and the base profile has no host side: give "
                           "--base a profile with one (e.g. dgx-h100)")
    cores = os.cpu_count() or 1
    per_core = cpu_adam_params_per_s(n_params, threads=1)
    node = max(cpu_adam_params_per_s(n_params), per_core)  # a loaded machine's threads may only contend
    lines = [f"CPU Adam (torch fused AdamW, fp32): {per_core / 1e9:.3f} G params/s on one core, {node / 1e9:.3f} G "
             f"params/s on {cores} threads"]
    fields = dict(base_host.model_dump()) if base_host is not None else {}
    fields.update(memory_GiB=round(host_memory_GiB(), 1), cpu_cores=cores, cpu_adam_Gparams_per_s=round(node / 1e9, 4))
    if copy is None:
        lines.append("pinned host<->device copy: cannot be measured here (no GPU visible); pcie_GBps stays the base "
                     "profile's")
    else:
        fields["pcie_GBps"] = round(min(copy), 2)
        lines.append(f"pinned host<->device copy: {copy[0]:.1f} GB/s to the GPU, {copy[1]:.1f} GB/s back (the lower "
                     f"is pcie_GBps; {gpus_per_node} GPUs a node share the host)")
    fields["source"] = "measured by advisor calibrate --host on this machine"
    return fields, lines
