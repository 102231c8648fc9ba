"""Candidate plans as one column table, in the plan's own vocabulary: the search evaluates a million rows at
once, and an estimate is a table of one row, so both go through the same cost model.

``Candidates`` holds what is chosen per plan (integer codes of the ``Coded`` enums for the closed sets);
``Mesh`` is what the cost model derives from it once: the named axes as floats (dp_replicate, dp_shard, tp,
cp, pp, virtual stages) and how each group's ranks sit on nodes, in Megatron's rank order (tp fastest, then
cp, then dp, then pp; megatron/core/parallel_state.py): a node holds min(tp, g) ranks of a TP group, g / tp
ranks of a CP group when TP fills less than a node, and g / tp ranks of the gradient-reduction group (dp x cp:
Megatron reduces gradients over the data-parallel group with context parallelism, so ``Mesh.dp`` is dp x cp
and every data-parallel collective and shard runs over it); a pipeline boundary crosses nodes once a stage
(tp x cp x dp ranks) fills a node, and leaves the NVLink domain once a stage fills a domain (a node, or an NVL72 rack of 18 nodes:
advisor.comm.network places groups in domains from their ranks per node).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from advisor.layout import (TWO_CHUNK_SCHEDULES, ContextParallel, DataParallelKind, Offload, PipelineSplit, Plan, Schedule,
                            shard_degree)
from advisor.training import Recompute, TrainingSetup


@dataclass(frozen=True)
class Candidates:
    """Plans + the per-plan part of the setup, one numpy array per field, all of one length."""

    dp: Any
    tp: Any
    pp: Any
    zero: Any
    hybrid: Any  # FSDP HYBRID_SHARD
    sp: Any
    schedule: Any  # Schedule codes
    virtual_stages: Any
    dp_kind: Any  # DataParallelKind codes
    overlap: Any  # gradient reduction overlapped with backward
    micro_batch: Any
    grad_accum: Any
    recompute: Any  # Recompute codes
    allow_tp_across_nodes: bool = False
    recompute_k: Any = 1  # TrainingSetup.recompute_layers (advisor/recompute.py)
    offload: Any = 0  # Offload codes (advisor/parallel/offload.py)
    ep: Any = 1  # expert parallelism (advisor.parallel.expert_layout): carved from dp x cp x tp, 1 for dense models
    etp: Any = None  # expert tensor parallelism (None: tp, Megatron's default)
    cp: Any = 1  # context-parallel ranks (advisor.parallel.context)
    cp_comm: Any = 0  # ContextParallel codes
    pp_split: Any = 0  # PipelineSplit codes

    def __post_init__(self) -> None:
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        for f in fields(self):
            if f.name not in _SCALARS:
                object.__setattr__(self, f.name, np.atleast_1d(np.asarray(getattr(self, f.name))))

    def __len__(self) -> int:
        return int(np.broadcast_shapes(*(np.shape(getattr(self, f.name)) for f in fields(self)
                                         if f.name not in _SCALARS))[0])

    @property
    def world(self) -> Any:
        return self.dp * self.cp * self.tp * self.pp

    def take(self, idx: Any) -> "Candidates":
        """The rows ``idx`` of every field (length-1 fields broadcast)."""
        out = {}
        for f in fields(self):
            val = getattr(self, f.name)
            if f.name not in _SCALARS:
                out[f.name] = val[idx] if len(val) > 1 else np.broadcast_to(val, np.shape(np.arange(len(self))[idx]))
        return replace(self, **out)

    @classmethod
    def of_plan(cls, plan: Plan, setup: TrainingSetup, grad_accum: int) -> "Candidates":
        """A table of one row: ``plan`` with the per-plan part of ``setup``."""
        return cls(dp=plan.dp, tp=plan.tp, pp=plan.pp, zero=plan.zero, hybrid=plan.hybrid_shard,
                   sp=plan.sp and plan.tp > 1, schedule=plan.schedule.code,
                   virtual_stages=plan.virtual_stages if plan.schedule is Schedule.interleaved else 1,
                   dp_kind=plan.data_parallel.code, overlap=plan.overlap_grad_reduce, micro_batch=setup.micro_batch,
                   grad_accum=grad_accum, recompute=setup.recompute.code,
                   allow_tp_across_nodes=plan.allow_tp_across_nodes, recompute_k=setup.recompute_layers,
                   offload=plan.offload.code,
                   ep=plan.ep, etp=plan.tp if plan.etp is None else plan.etp,
                   cp=plan.cp, cp_comm=(plan.cp_comm or ContextParallel.ring).code, pp_split=plan.pp_split.code)

    def plan(self, i: int) -> Plan:
        """Row ``i`` as a typed Plan."""
        return Plan(dp=int(self.dp[i]), tp=int(self.tp[i]), pp=int(self.pp[i]), zero=int(self.zero[i]),
                    hybrid_shard=bool(self.hybrid[i]), sp=bool(self.sp[i]), schedule=Schedule.of_code(self.schedule[i]),
                    virtual_stages=int(self.virtual_stages[i]), data_parallel=DataParallelKind.of_code(self.dp_kind[i]),
                    overlap_grad_reduce=bool(self.overlap[i]), allow_tp_across_nodes=self.allow_tp_across_nodes,
                    offload=Offload.of_code(self._at(self.offload, i)),
                    ep=int(self.ep[i]), etp=None if self.etp[i] == self.tp[i] else int(self.etp[i]),
                    cp=int(self.cp[i]), cp_comm=ContextParallel.of_code(self.cp_comm[i]),
                    pp_split=PipelineSplit.of_code(self.pp_split[i]))

    def setup(self, i: int, setup: TrainingSetup) -> TrainingSetup:
        """``setup`` with row ``i``'s micro batch and recomputation."""
        return setup.model_copy(update={"micro_batch": int(self.micro_batch[i]),
                                        "recompute": Recompute.of_code(self.recompute[i]),
                                        "recompute_layers": int(self._at(self.recompute_k, i))})

    @staticmethod
    def _at(col: Any, i: int) -> Any:
        """Row ``i`` of a column that may be of length 1 (broadcast)."""
        return col[i] if len(col) > 1 else col[0]


_SCALARS = ("allow_tp_across_nodes",)
_TWO_CHUNK_CODES = [Schedule(s).code for s in TWO_CHUNK_SCHEDULES]


def chunks(c: Candidates) -> Any:
    """Model chunks per pipeline rank: v under interleaving, 2 under ZB-V and DualPipeV, else 1."""
    two = np.isin(c.schedule, _TWO_CHUNK_CODES)
    return np.where(c.schedule == Schedule.interleaved.code, c.virtual_stages, np.where(two, 2, 1))


@dataclass(frozen=True)
class Mesh:
    """The named axes of every candidate as floats, and how their groups sit on nodes (module docstring)."""

    dp: Any
    dp_shard: Any  # ranks one copy of the model states is sharded over (1 without ZeRO)
    dp_replicate: Any  # copies of the model states: dp under DDP, 1 under ZeRO, across nodes under HSDP
    tp: Any
    pp: Any
    v: Any  # virtual stages (1 unless interleaved)
    tp_per_node: Any
    dp_per_node: Any
    shard_per_node: Any
    stage_crosses_nodes: Any  # a pipeline boundary crosses nodes
    stage_crosses_domains: Any = None  # ... and NVLink domains (the network carries it)
    ep: Any = 1.0  # expert parallelism, and how the expert groups sit (advisor.parallel.expert)
    etp: Any = 1.0
    edp: Any = 1.0  # expert data parallelism: dp x cp x tp / (ep x etp) ranks hold the same experts (dp: with cp)
    ep_per_node: Any = 1.0
    cp: Any = 1.0  # context-parallel ranks (Mesh.dp already counts them: dp x cp reduce gradients together)
    cp_per_node: Any = 1.0  # ranks of a CP group in one node
    cp_domains: Any = 1.0  # NVLink domains a CP group spans (1: its ring stays on NVLink)

    @classmethod
    def of(cls, c: Candidates, gpus_per_node: int, domain_gpus: int | None = None) -> "Mesh":
        tp, pp, cp = (np.asarray(x, dtype=float) for x in (c.tp, c.pp, c.cp))
        dp = np.asarray(c.dp, dtype=float) * cp  # the gradient-reduction group: dp x cp
        v = chunks(c).astype(float)
        shard = np.asarray(shard_degree(dp, c.zero, c.hybrid, gpus_per_node), dtype=float)
        dp_per_node = members_per_node(gpus_per_node, tp, dp)
        ep, etp = np.asarray(c.ep, dtype=float), np.asarray(c.etp, dtype=float)
        domain = domain_gpus or gpus_per_node
        return cls(dp=dp, dp_shard=shard, dp_replicate=dp / shard, tp=tp, pp=pp, v=v,
                   tp_per_node=np.minimum(tp, gpus_per_node), dp_per_node=dp_per_node,
                   shard_per_node=np.minimum(dp_per_node, shard), stage_crosses_nodes=tp * dp >= gpus_per_node,
                   stage_crosses_domains=tp * dp >= domain, cp=cp,
                   cp_per_node=members_per_node(gpus_per_node, tp, cp), cp_domains=np.ceil(tp * cp / domain),
                   ep=ep, etp=etp, edp=dp * tp / (ep * etp), ep_per_node=members_per_node(gpus_per_node, etp, ep))


def members_per_node(gpus_per_node: int, stride: Any, n: Any) -> Any:
    """GPUs of a group per node when its ranks sit ``stride`` apart (the degrees ordered before it: TP for DP and
    CP, ETP for EP, ETP x EP for the experts' data parallelism): a node's share, or below 1 where the stride is wider
    than a node (one rank every stride / gpus_per_node nodes; advisor.comm.network.domain_groups)."""
    stride = np.asarray(stride, dtype=float)
    share = np.where(stride >= gpus_per_node, gpus_per_node / stride, np.floor(gpus_per_node / stride))
    return np.minimum(share, np.maximum(np.asarray(n, dtype=float), 1.0))


def concat(parts: list[Candidates]) -> Candidates:
    """The rows of ``parts`` one after another (length-1 fields broadcast; the scalars are the first part's)."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for f in fields(Candidates):
        if f.name not in _SCALARS:
            out[f.name] = np.concatenate([np.broadcast_to(getattr(p, f.name), (len(p),)) for p in parts])
    return replace(parts[0], **out)
