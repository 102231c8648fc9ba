"""Where expert parallelism (EP) sits among the ranks: the constraints on ep and etp, and the (ep, etp) pairs the
search tries. advisor.parallel.expert costs what runs on that layout.

megatron-core 0.19.2 (parallel_state.py initialize_model_parallel) decomposes the same ranks twice, in its default
order "tp-cp-ep-dp-pp" (:617), tp fastest: the dense layers as tp x cp x dp x pp (ep=1, :859-868), the experts as
etp x ep x edp x pp (cp=1, :887-896), with edp = world / (etp x ep x pp) and world % (etp x ep x pp) == 0 required
(:874-884). EP is thus carved from a pipeline stage's dp x cp x tp ranks, not from its dp x tp: an EP group is ep
blocks of etp consecutive ranks, so where ep x etp exceeds tp it takes in the context-parallel peers (tp apart) before
the data-parallel ones. On 8 GPUs at tp 1, cp 2, dp 4, ep 4: CP groups [0, 1] [2, 3] ..., EP groups [0..3] [4..7],
expert data-parallel groups [0, 4] [1, 5] [2, 6] [3, 7] (RankGenerator; tests/test_expert_layout.py runs it). The EP
ranks sit etp apart whatever cp is (``Mesh.ep_per_node`` = min(ep, g / etp)), the edp ranks etp x ep apart.

CP peers hold different slices of a sequence: the alltoall dispatcher sends each rank's own permuted tokens over the
EP group (moe/token_dispatcher.py:698-699, its hidden states [s / cp (/ tp under SP), b, h]), so the all-to-all bytes,
the expert GEMMs' rows and the routed activations are those of one rank's micro-batch tokens (mb x s / cp,
advisor.step) whether or not the group spans CP. The gradients: DDP reduces the dense ones over dp x cp (dp_cp_group)
and the experts' over the expert data-parallel group, edp = dp x cp x tp / (ep x etp) ranks, both scaled to average
over dp x cp (distributed/distributed_data_parallel.py:195-224); the distributed optimizer and Megatron-FSDP shard
them over the same two groups (``Mesh.edp``, advisor.parallel.data).

torchtitan 0.3.0 carves EP the same way (its sparse mesh pp x dp_replicate x efsdp x ep, efsdp = dp_shard x cp x tp
/ ep: distributed/parallel_dims.py:279, :336-339, ep innermost). A stack whose profile says ``ep_ranks: dp_tp``
(DeepSpeed-MoE's groups, from the data-parallel ranks alone) keeps ep x etp dividing dp x tp.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from advisor.candidates import Candidates
from advisor.layout import DataParallelKind
from advisor.model import ModelSpec


def violations(c: Candidates, model: ModelSpec) -> dict[str, Any]:
    """Constraint -> where a plan breaks it (module docstring; num_experts % ep: Megatron-LM arguments.py:1602)."""
    ep, etp, split = np.asarray(c.ep), np.asarray(c.etp), uses_ep(c)
    if not model.routed:
        return {"expert parallelism on a model without routed experts": split}
    e = model.experts
    tp, sp = np.asarray(c.tp), np.asarray(c.sp, dtype=bool)
    stage = np.asarray(c.dp) * np.asarray(c.cp) * tp  # a pipeline stage's ranks (parallel_state.py:874-884)
    return {
        "ep does not divide the routed experts": (e.n_experts % ep) != 0,
        "ep x etp does not divide dp x cp x tp (EP is carved from a pipeline stage's ranks)": (stage % (ep * etp)) != 0,
        "etp does not divide the experts' FFN width": (e.d_ff_expert % etp) != 0,
        "experts split over TP ranks otherwise than attention need sequence parallelism": (tp > 1) & ~sp & (
            (ep > 1) | (etp != tp)),
        "expert parallelism with HYBRID_SHARD or nn.DataParallel is not costed (DDP, ZeRO-1/2/3 and FSDP are)": split & (
            np.asarray(c.hybrid, dtype=bool) | (c.dp_kind == DataParallelKind.dp.code)),
    }


def stack_violations(c: Candidates, engine, name: str) -> dict[str, Any]:
    """A stack that carves EP from dp x tp alone (``engine.ep_ranks``): ep x etp across the CP ranks refused."""
    if engine.ep_ranks != "dp_tp":
        return {}
    ep, etp, cp = np.asarray(c.ep), np.asarray(c.etp), np.asarray(c.cp)
    return {f"{name} carves EP from the data- and tensor-parallel ranks, not the context-parallel ones: ep x etp must "
            "divide dp x tp (--cp 1, or a smaller --ep)": (cp > 1) & (((np.asarray(c.dp) * np.asarray(c.tp)) % (ep * etp)) != 0)}


def uses_ep(c: Candidates) -> Any:
    """Where a plan splits the experts otherwise than tensor parallelism alone would (ep > 1, or etp != tp)."""
    return (np.asarray(c.ep) > 1) | (np.asarray(c.etp) != np.asarray(c.tp))


def ep_choices(model: ModelSpec, dp: int, tp: int, fixed: Optional[int] = None, cp: int = 1) -> list[tuple[int, int]]:
    """(ep, etp) pairs the search tries for a (dp, tp, cp) layout: every ep dividing the experts and dp x cp x tp,
    with the experts split as attention is (etp = tp, Megatron's default) or unsplit (etp 1), or at ``fixed`` alone
    (--etp); (1, tp) alone for a dense model. Every ep is a divisor of the experts: a handful (256 experts: 9)."""
    if not model.routed:
        return [(1, tp)]
    n, stage = model.experts.n_experts, dp * cp * tp
    return [(ep, etp) for etp in (sorted({1, tp}, reverse=True) if fixed is None else [fixed]) if model.experts.d_ff_expert % etp == 0
            for ep in range(1, n + 1) if n % ep == 0 and stage % (ep * etp) == 0]
