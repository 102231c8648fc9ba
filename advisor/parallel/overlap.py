"""What the data-parallel collectives hide behind: the GPU's work per phase of a micro-batch and its idle time behind
a host-bound host (``Windows``), and how exposed seconds pool that idle time (``hidden``). While a collective runs beside
the compute, NCCL's thread blocks hold some of the SMs (advisor.comm.held_sms, advisor.comm.beside): the collectives
of advisor.parallel.data pass that share along with what they hide behind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from advisor import comm
from advisor.units import MiB


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


def bucket_bytes(w: Any, dp: Any, reduce_bytes: Any) -> Any:
    """Bytes of the stack's gradient bucket over ``dp`` gradient-reducing ranks (dp x cp): ``engine.bucket_elements``
    (floor, per rank) where the profile sizes it in elements of the buffer's dtype, as megatron-core does
    (distributed_data_parallel.py:68-69 and training.py:1561-1562: max(40,000,000, 1,000,000 x dp_cp) elements:
    152.6 MiB of fp32 gradients, 76.3 MiB of bf16 ones, more beyond 40 ranks), else ``bucket_MiB``."""
    eng = w.stack.engine
    if eng.bucket_elements is None:
        return eng.bucket_MiB * MiB
    floor, per_rank = eng.bucket_elements
    return np.maximum(floor, per_rank * np.asarray(dp, dtype=float)) * reduce_bytes


def edge_bucket_share(w: Any, tp: Any, params: Any, reduce_bytes: Any, dp: Any) -> Any:
    """The share of the ``params`` a stage reduces over data parallelism in its edge bucket: the one backward fills
    last, reduced only once the backward has ended, which under an overlapped parameter gather is also the one the next
    forward waits for first. A bucketed stack fills buckets in reverse parameter order up to its bucket size, and a
    parameter is never split: the input embedding, registered first and its gradient made last, closes the last bucket
    (megatron-core 0.19.2 param_and_grad_buffer.py:975-989 _compute_default_per_buffer_param_layout, params[::-1]; torch
    DDP's reducer alike), so the bucket is the stack's bucket or the V x h / tp table, the larger (the table's gradient
    is none under LoRA: a frozen base). The next forward's pre-hook on the embedding waits for that bucket's gather and
    only then dispatches the next bucket's (distributed_data_parallel.py:431-466 _make_forward_pre_hook,
    param_and_grad_buffer.py:532-567 finish_param_sync)."""
    bucket = bucket_bytes(w, dp, reduce_bytes)
    embedding = 0.0 if w.finetune.adapters else w.model.vocab * w.model.d_model / tp * reduce_bytes
    return np.minimum(1.0, np.maximum(bucket, embedding) / np.maximum(params * reduce_bytes, 1.0))


def zero1_edges(w: Any, mesh: Any, states: Any, on: Any) -> tuple[Any, Any]:
    """Seconds of ZeRO-1's (reduce-scatter, all-gather) of the edge bucket (``edge_bucket_share``), each one call over
    the shard group, where the plans are ``on``. The reduce-scatter's is the floor of the overlapped reduction where
    an optimizer-sharding engine reduce-scatters bucket by bucket from the backward's hooks (Megatron's distributed
    optimizer: finish_grad_sync waits for the last bucket, megatron-core 0.19.2 param_and_grad_buffer.py:781), as DDP's
    last all-reduce (advisor.parallel.data ddp_exposed); 0 elsewhere (DeepSpeed's own buffers:
    advisor.parallel.zero_buffers). The all-gather's is what the next forward waits for under an overlapped gather."""
    eng = w.stack.engine
    bucketed = eng.gradient_reduction == "buckets" and eng.zero_buffers is None and eng.zero1 == "optimizer_sharding"
    edge = states.dp_params * edge_bucket_share(w, mesh.tp, states.dp_params, states.reduce_bytes, mesh.dp)
    rs = comm.collective_time(comm.Collective.reduce_scatter, mesh.dp_shard, edge * states.reduce_bytes, w.hw,
                              mesh.shard_per_node, where=on & bucketed)
    ag = comm.collective_time(comm.Collective.all_gather, mesh.dp_shard, edge * states.weight_bytes, w.hw,
                              mesh.shard_per_node, where=on & eng.param_gather_overlap)
    return rs, ag


def overlaps(c: Any, hw: Any) -> Any:
    """Where the gradient reduction may overlap the backward: the plan asks for it, and peer-to-peer works. Without it
    (PCIe, NCCL_P2P_DISABLE=1) NCCL's SHM transport stages every chunk through pinned host memory with SM-driven
    copies that contend with the backward kernels for SMs and PCIe: no overlap."""
    return np.asarray(c.overlap, dtype=bool) & (hw.intra_node.kind.value != "pcie")
