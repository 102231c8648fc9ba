"""A DeepSpeed-style ZeRO engine's own calls and buffers, as a stack profile's engine describes them (advisor.engine):
how its ZeRO-3 coordinator issues gathers and reduce-scatters (advisor.parallel.zero3), and its optimizer's buckets,
step copies and overlap (advisor.parallel.zero_buffers)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from advisor.spec import Spec


class Zero3Calls(Spec):
    """How a DeepSpeed-style ZeRO-3 coordinator issues its gathers and reduce-scatters, read from its source: one
    call per parameter tensor (DeepSpeed 0.3: ``_allgather_param`` per tensor, ``_reduce_scatter_gradient`` per
    tensor) or per bucket of tensors (DeepSpeed >= 0.6: ``all_gather_coalesced`` of a fetch or a prefetch bucket,
    ``reduce_scatter_coalesced`` of an IPG bucket). Each call pays the collective's start-up over every rank of the
    group (advisor.comm), and a call made with per-rank tensor lists also pays host ops per rank."""

    gathers: Literal["per_tensor", "per_bucket"]
    gather_bucket_elements: float = Field(default=0.0, ge=0, le=1e13, description="per_bucket: elements one gather "
                                          "call carries at most (stage3_prefetch_bucket_size); a larger tensor is one call")
    reduces: Literal["per_tensor", "per_bucket"]
    reduce_bucket_elements: float = Field(default=0.0, ge=0, le=1e13, description="per_bucket: elements one "
                                          "reduce-scatter call carries (reduce_bucket_size)")
    persistence_elements: float = Field(ge=0, le=1e13, description="tensors with fewer elements are never "
                                        "partitioned, so never gathered (stage3_param_persistence_threshold)")
    max_live_elements: float = Field(gt=0, le=1e15, description="no prefetch while this many gathered elements are "
                                     "live (stage3_max_live_parameters): a sub-module this large is fetched blocking")
    max_reuse_elements: float = Field(default=0.0, ge=0, le=1e15, description="a fetched parameter is not released "
                                      "when the trace reuses it within this many elements (stage3_max_reuse_distance): "
                                      "the model's tail stays gathered from the forward into the backward")
    host_ops_per_rank_gather: int = Field(default=0, ge=0, le=100, description="host ops one gather call issues per "
                                          "rank of its group (list-form all_gather: a slice and a copy per rank)")
    host_ops_per_rank_reduce: int = Field(default=0, ge=0, le=100, description="the same for one reduce-scatter call")
    device_sync_per_fetch: bool = Field(description="each fetch synchronises the device (torch.cuda.synchronize), so "
                                        "a sub-module's reduce-scatter cannot overlap the next one's compute")
    source: Optional[str] = None


class ZeroBuffers(Spec):
    """An optimizer-sharding ZeRO engine's own buffers and gradient reduction beyond its model states, read from its
    source (DeepSpeed's DeepSpeedZeroOptimizer for stages 1/2, DeepSpeedZeroOptimizer_Stage3)."""

    ipg_elements: float = Field(gt=0, le=1e13, description="the IPG bucket (reduce_bucket_size), a flat buffer in the "
                                "gradients' dtype: ZeRO-1/2 allocate it for each backward (twice under overlap_comm) "
                                "and all-reduce a flat copy of each filled bucket; ZeRO-3 allocates one for good")
    grad_all_reduce: bool = Field(description="ZeRO-1/2 all-reduce each bucket (use_multi_rank_bucket_allreduce) where "
                                  "a reduce-scatter would move half the bytes")
    zero2_gather_per_step: bool = Field(description="ZeRO-2 keeps the half-precision weights whole: it all-gathers "
                                        "the updated partitions once a step after the optimizer step, as ZeRO-1")
    sub_group_elements: float = Field(gt=0, le=1e15, description="ZeRO-3 steps its partition in sub-groups of this "
                                      "many elements (sub_group_size), each flattened and upcast to fp32 in turn")
    stages: list[Literal[1, 2, 3]] = Field(default=[1, 2, 3], min_length=1, description="the ZeRO stages the stack "
                                           "runs on this engine (the Trainer's ZeRO-1 through accelerate's DeepSpeed "
                                           "plugin; its ZeRO-2/3 are FSDP's)")
    half_master: bool = Field(default=False, description="under --precision bf16 the stack's DeepSpeed config keeps "
                              "bf16 master weights, gradients and optimizer states (bf16_master_weights_and_grads, "
                              "bf16_optimizer_states): what ZeRO-Offload holds and copies (advisor.parallel.zero_offload)")
    overlap_comm: Optional[bool] = Field(default=None, description="None: as the plan's --overlap-grad-reduce, which "
                                         "the stack's export writes as overlap_comm; False: never (a launcher that "
                                         "writes none, below stage 3 DeepSpeed's default: config.py overlap_comm_valid)")
    source: Optional[str] = None
