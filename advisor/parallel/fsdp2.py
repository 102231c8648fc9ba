"""What an FSDP2 stack (torch's fully_shard, as torchtitan runs it) does around each unit's collectives that the
collectives themselves do not say: the copies on the compute stream, FSDP2 on a one-rank mesh, and HSDP's all-reduce
of the replicas in every micro-batch (advisor.parallel.data costs the collectives and their overlap)."""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.candidates import Candidates
from advisor.compute import mem_time
from advisor.parallel.model_states import ModelStates
from advisor.workload import Workload


def unit_copy_seconds(w: Workload, states: ModelStates, zero: Any) -> Any:
    """Per micro-batch, the memory-bound copies an FSDP2 stack runs around each unit's collectives on the compute
    stream (``unit_copies``; torch 2.13 torch/distributed/fsdp/_fully_shard/): ``foreach_all_gather_copy_out`` (from
    ``FSDPParamGroup.wait_for_unshard``) copies each gathered byte into the parameters (split_with_sizes_copy: read +
    write), and ``foreach_reduce`` builds the reduce-scatter input with ``chunk_cat`` (read the gradient, write it in
    the reduce dtype) before it switches streams. ZeRO-3 gathers a unit twice per micro-batch (reshard_after_forward
    without PP: torchtitan's fsdp_reshard_after_forward "default", distributed/fsdp.py), ZeRO-2 once; the copy-in
    (1/dp_shard of it, its own stream) is left out, and a recomputed forward reuses the backward's gather."""
    if not w.stack.engine.unit_copies or w.stack.engine.zero_collectives != "per_unit":
        return 0.0
    gathers = np.where(zero >= 3, 2.0, 1.0)
    gathered = states.params * states.weight_bytes * 2.0 * gathers
    reduced = states.trained * (states.grad_bytes + states.reduce_bytes)
    return np.where(zero >= 2, mem_time(w.hw, gathered + reduced), 0.0)


def one_rank_copies(w: Workload, c: Candidates, states: ModelStates, zero: Any, active: Any) -> Any:
    """Per step, the unit copies of a stack that wraps every unit in FSDP2 where nothing shards (engine.fsdp_at_one):
    a one-rank FSDP2 skips the all-gather but casts and copies each unit's parameters on the compute stream (torch
    2.13 _fsdp_param_group.py wait_for_unshard), its replicas' too (HSDP of one-rank shards, costed as DDP plans):
    twice a micro-batch without PP; under a pipeline once a step, where torch's pipelining keeps the units unsharded and
    their gradients unreduced until the last micro-batch (pipelining/stage.py set_reshard_after_backward(False),
    set_requires_gradient_sync(False))."""
    if not w.stack.engine.fsdp_at_one:
        return 0.0
    active, piped = np.asarray(active, dtype=bool), np.asarray(c.pp) > 1
    per_pass = unit_copy_seconds(w, states, np.where(piped, 2, 3))
    one_rank = (~active & (zero >= 1)) | (active & (zero == 0))
    return np.where(one_rank, np.where(piped, 1.0, c.grad_accum) * per_pass, 0.0)


def replica_passes(w: Workload, c: Candidates) -> Any:
    """How many times a step the DDP-costed replicas of an FSDP2-everywhere stack all-reduce their gradients: each
    micro-batch's post-backward (replica_all_reduce per_micro_batch; HSDP of one-rank shards), once under a pipeline
    (its last micro-batch), else once (DDP's no_sync accumulation)."""
    eng = w.stack.engine
    if not eng.fsdp_at_one or eng.replica_all_reduce != "per_micro_batch":
        return 1.0
    return np.where(np.asarray(c.pp) > 1, 1.0, c.grad_accum)


def replicas_per_micro_batch(w: Workload, states: ModelStates, rs: Any, roots: tuple[Any, Any],
                             hsdp: Any) -> tuple[Any, tuple[Any, Any], Any]:
    """(the reduce-scatters of a pass, their roots, HSDP's all-reduce left for once a step): an FSDP2 stack's HSDP
    all-reduces each unit's reduced shard over the replicas in every micro-batch's post-backward, behind its
    reduce-scatter on the same stream (torch 2.13 _fsdp_collectives.py foreach_reduce; torchtitan never calls
    set_requires_all_reduce(False)), so it hides behind the backward as they do, once per micro-batch
    (engine.replica_all_reduce "per_micro_batch"; FSDP1 likewise, per unit on its all-reduce stream, in the micro-batches
    that reduce: advisor.parallel.no_sync drops the rest); else once a step, exposed."""
    if w.stack.engine.replica_all_reduce != "per_micro_batch":
        return rs, roots, hsdp
    root_share = states.params_outside_layers / np.maximum(states.params, 1.0)
    return rs + hsdp, (roots[0] + hsdp * root_share, roots[1]), 0.0
