"""The plan: how a training step is laid out on GPUs.

``Plan`` is what a user chooses (the options of ``advisor estimate``): data-parallel degree and ZeRO stage
or FSDP mode, tensor parallelism with or without sequence parallelism, a pipeline with its schedule and
virtual stages, DDP or nn.DataParallel, whether the gradient reduction overlaps backward. ``Layout`` is the
same plan as the named axes of its device mesh, one validated value (as torchtitan's ParallelDims):

    world_size = dp_replicate x dp_shard x cp x tp x pp

dp_replicate copies the model states (DDP, nn.DataParallel, and HSDP across nodes), dp_shard shards them
(the ZeRO stage says which: optimizer states, gradients, parameters). HYBRID_SHARD shards inside a node
and replicates across nodes. Ranks are ordered as Megatron orders them: tp fastest, then dp, then pp
(megatron/core/parallel_state.py), so a node holds whole TP groups and the first ranks of each DP group.

Context parallelism (cp, advisor.parallel.context) splits each sequence over cp ranks; they sit between tp and
dp in the rank order (tp, cp, dp, pp: megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp"), and gradients
are reduced over dp x cp. Pipelines may split layers unevenly (``pp_split``, advisor.parallel.pipeline).

Mixture of experts: ``ep`` and ``etp`` are not factors of the world size. Megatron carves the experts' own mesh
etp x ep x edp from the same dp x cp x tp ranks of a pipeline stage (megatron-core parallel_state: edp = world / (etp x
ep x pp)); advisor.parallel.expert owns it.

Megatron's constraints (seed 002): world_size = tp x cp x pp x dp; global batch divisible by micro_batch x dp.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from pydantic import Field, model_validator

from advisor.spec import ApiSpec, Spec
from advisor.training import Coded, TrainingSetup


class Schedule(Coded):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"
    # zero-bubble schedules (advisor.parallel.pipeline: each bubble formula cited there); a stack runs those its
    # profile lists (engine.offers)
    zb_h1 = "zb-h1"  # Qi et al. 2023 (arXiv 2401.10241) s.3: backward split into B (input) and W (weights)
    zb_v = "zb-v"  # ibid. s.6: two chunks per rank in a V; torch.distributed.pipelining ScheduleZBVZeroBubble
    dualpipe_v = "dualpipev"  # DeepSeek-V3 report (arXiv 2412.19437) s.3.2.1, cut in half: ScheduleDualPipeV


# schedules that give each rank two model chunks (v = 2) whatever --virtual-stages says
TWO_CHUNK_SCHEDULES = ("zb-v", "dualpipev")


class ContextParallel(Coded):
    """How a context-parallel group computes attention over a sequence split cp ways (advisor.parallel.context)."""

    ring = "ring"  # Megatron / Transformer Engine --cp-comm-type p2p: K, V passed around the ring, overlapped
    all_gather = "all-gather"  # torchtitan / torch CP, Llama 3: all-gather K and V, reduce-scatter dK, dV
    ulysses = "ulysses"  # DeepSpeed-Ulysses: all-to-all sequence <-> heads around the attention core


class PipelineSplit(Coded):
    """How layers are split over the pipeline ranks (advisor.parallel.pipeline)."""

    even = "even"  # ceil(L / pp) layers on the busiest rank; the embedding and the LM head on top
    edges = "edges"  # the embedding and the loss count as a layer each: (L + 2) / pp units per rank (Megatron
    # --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split; torchtitan's default
    # input_weight = output_weight = 1; Llama 3 405B's one layer fewer on the first and the last stage)


class DataParallelKind(Coded):
    ddp = "ddp"  # torch DistributedDataParallel: one process per GPU, bucketed all-reduce
    dp = "dp"  # torch.nn.DataParallel: one process, scatter/replicate/gather through GPU 0


class Offload(Coded):
    """Where model states live besides the GPU (advisor/parallel/offload.py); codes are positions, only appended."""

    none = "none"
    optimizer_cpu = "optimizer-cpu"  # ZeRO-Offload: fp32 master + Adam states and the step on the CPU
    optimizer_nvme = "optimizer-nvme"  # ZeRO-Infinity: the same states on NVMe, staged through host memory
    params_cpu = "params-cpu"  # ZeRO-3 offload_param cpu / FSDP CPUOffload(offload_params=True): parameters too
    params_nvme = "params-nvme"  # ZeRO-Infinity offload_param nvme

    @property
    def params(self) -> bool:
        return self in (Offload.params_cpu, Offload.params_nvme)


FSDP_TO_ZERO = {"full-shard": 3, "shard-grad-op": 2, "hybrid-shard": 3, "no-shard": 0}
ZERO_NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


class Layout(Spec):
    """The named axes of a plan's device mesh; their product is the world size."""

    dp_replicate: int = Field(default=1, ge=1)
    dp_shard: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    virtual_stages: int = Field(default=1, ge=1, description="model chunks per pipeline rank (interleaved)")
    world_size: int = Field(ge=1)
    ep: int = Field(default=1, ge=1, description="expert parallelism: carved from dp_shard x dp_replicate x tp "
                                                 "(advisor.parallel.expert), not a factor of the world size")
    etp: int = Field(default=1, ge=1, description="expert tensor parallelism: the routed experts' own TP degree")
    cp: int = Field(default=1, ge=1, description="context-parallel ranks one sequence is split over")

    @model_validator(mode="after")
    def _product(self) -> "Layout":
        product = self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp
        if product != self.world_size:
            cp = f" x cp({self.cp})" if self.cp > 1 else ""
            raise ValueError(f"dp_replicate({self.dp_replicate}) x dp_shard({self.dp_shard}){cp} x tp({self.tp}) x "
                             f"pp({self.pp}) = {product} != world_size({self.world_size})")
        return self

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


def shard_degree(dp: Any, zero: Any, hybrid: Any, gpus_per_node: int) -> Any:
    """Ranks one copy of the model states is sharded over (arrays or scalars): none without ZeRO, all of dp,
    or under HYBRID_SHARD the data-parallel ranks of one node."""
    sharded = np.where(hybrid, np.minimum(dp, gpus_per_node), dp)
    return np.where(np.asarray(zero) >= 1, sharded, 1)


class Plan(ApiSpec):
    dp: int = Field(default=1, ge=1, le=10_000_000)
    tp: int = Field(default=1, ge=1, le=1_000_000)
    pp: int = Field(default=1, ge=1, le=1_000_000)
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage; FSDP FULL_SHARD=3, SHARD_GRAD_OP=2")
    hybrid_shard: bool = Field(default=False, description="FSDP HYBRID_SHARD: shard inside a node, replicate across")
    sp: bool = Field(default=False, description="Megatron sequence parallelism (needs tp > 1)")
    schedule: Schedule = Schedule.one_f_one_b
    virtual_stages: int = Field(default=1, ge=1, le=1024)
    data_parallel: DataParallelKind = DataParallelKind.ddp
    overlap_grad_reduce: bool = Field(
        default=True, description="gradient reduction overlapped with backward (PyTorch DDP: on; Megatron default: off)"
    )
    allow_tp_across_nodes: bool = False
    offload: Offload = Field(default=Offload.none, description="model states held in host memory or on NVMe")
    ep: int = Field(default=1, ge=1, le=1_000_000, description="expert parallelism: routed experts split over ep "
                                                               "ranks of the data-parallel x tensor-parallel ranks")
    etp: Optional[int] = Field(default=None, ge=1, le=1_000_000,
                               description="expert tensor parallelism of the routed experts (None: tp, Megatron's default)")
    cp: int = Field(default=1, ge=1, le=1_000_000, description="context parallelism: ranks one sequence is split over")
    cp_comm: Optional[ContextParallel] = Field(default=None, description="how the cp ranks exchange K and V (None at "
                                                                         "cp 1; ring where cp > 1 and none is named)")
    pp_split: PipelineSplit = Field(default=PipelineSplit.even, description="how layers are split over pipeline ranks")

    @model_validator(mode="before")
    @classmethod
    def _cp_comm(cls, data: Any) -> Any:
        """At cp 1 nothing is exchanged: no cp_comm (None, whatever a plan recorded before said), so that a plan's JSON
        passes back to estimate, whose --cp-comm needs --cp > 1 (advisor.options); ring where cp > 1 names none."""
        if not isinstance(data, dict):
            return data
        try:
            one = float(data.get("cp", 1)) == 1.0
        except (TypeError, ValueError):
            return data  # the field's own validation names the bad value
        if one:
            return {**data, "cp_comm": None}
        return data if data.get("cp_comm") is not None else {**data, "cp_comm": ContextParallel.ring}

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline rank: v under interleaving, 2 under ZB-V and DualPipeV, else 1."""
        if self.schedule is Schedule.interleaved:
            return self.virtual_stages
        return 2 if self.schedule.value in TWO_CHUNK_SCHEDULES else 1

    def layout(self, gpus_per_node: int, world_size: Optional[int] = None) -> Layout:
        """The named axes (raises ValueError, one line, when they do not multiply to ``world_size``)."""
        shard = int(shard_degree(self.dp, self.zero, self.hybrid_shard, gpus_per_node))
        return Layout(dp_replicate=max(self.dp // shard, 1), dp_shard=shard, tp=self.tp, pp=self.pp,
                      virtual_stages=self.chunks, cp=self.cp,
                      world_size=self.world_size if world_size is None else world_size, ep=self.ep,
                      etp=self.tp if self.etp is None else self.etp)

    def label(self) -> str:
        parts = []
        if self.data_parallel is DataParallelKind.dp and self.dp > 1:
            parts.append(f"nn.DataParallel {self.dp}")
        elif self.dp > 1 or (self.tp == 1 and self.pp == 1) or (self.cp > 1 and self.zero > 0):
            parts.append(f"{'HSDP' if self.hybrid_shard else ZERO_NAMES[self.zero]} dp={self.dp}")
        if self.tp > 1:
            parts.append(f"TP={self.tp}" + ("+SP" if self.sp else ""))
        if self.cp > 1:
            parts.append(f"CP={self.cp} {(self.cp_comm or ContextParallel.ring).value}")
        if self.pp > 1:
            sched = self.schedule.value + (f"(v={self.virtual_stages})" if self.schedule is Schedule.interleaved else "")
            split = " uneven" if self.pp_split is PipelineSplit.edges else ""
            parts.append(f"PP={self.pp}{split} {sched}")
        if self.offload is not Offload.none:
            parts.append(f"offload {self.offload.value}")
        if self.ep > 1 or self.etp not in (None, self.tp):
            parts.append(f"EP={self.ep}" + (f" ETP={self.etp}" if self.etp not in (None, self.tp) else ""))
        return " x ".join(parts)


def resolve_grad_accum(setup: TrainingSetup, plan: Plan) -> tuple[int, Optional[str]]:
    """Gradient-accumulation steps (= pipeline micro-batches per step) and an error if the batch doesn't divide."""
    if setup.grad_accum is not None:
        return setup.grad_accum, None
    if setup.global_batch is None:
        return 1, None
    per_step = setup.micro_batch * plan.dp
    if setup.global_batch % per_step:
        return 1, (
            f"global batch {setup.global_batch} is not divisible by micro_batch x dp = "
            f"{setup.micro_batch} x {plan.dp} = {per_step}: give --global-batch a multiple of {per_step} (e.g. "
            f"{-(-setup.global_batch // per_step) * per_step})"
        )
    return setup.global_batch // per_step, None
