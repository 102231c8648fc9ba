"""Sequence-parallel collectives issued asynchronously by the linears' own autograd functions (``tp_overlap``
linear-async): nanotron 0.4's ``tp_linear_async_communication`` under ``tp_mode`` REDUCE_SCATTER, whose column and
row linears (parallel/tensor_parallel/functional.py _ColumnLinearAsyncCommunication, _RowLinearAsyncCommunication,
adapted from Megatron-LM's layers.py) launch NCCL collectives with ``async_op=True`` and run a GEMM before waiting:

- column linear forward (:161-206): the input's all-gather beside the GEMM of the rank's own sequence shard, 1/tp of
  the linear's GEMM; the other tp - 1 shards' GEMMs wait for it;
- column linear backward (:283-293, :315-331): the input, saved as its shard (:144), re-gathered beside the dgrad
  GEMM; the input gradient reduce-scattered beside the wgrad GEMM;
- row linear forward (:375-378): the GEMM, then its output reduce-scattered synchronously: exposed;
- row linear backward (:415-458): the output gradient's all-gather beside a dgrad GEMM on the rank's own sequence
  shard (``grad_output.matmul(weight)`` before the gather completes: 1/tp of the dgrad), then that input gradient
  all-gathered, [s, b, n_in / tp] (the extra gather), beside the wgrad GEMM.

The NCCL kernels hold SMs while they run beside a GEMM (advisor.comm.beside, held_sms). The GEMMs are costed at their
full size (advisor.compute); what the row linear's dgrad computes on 1/tp of the rows is left out of the compute.
Not modelled here: the LM head's column linear (its collectives stay costed as exposed, advisor.parallel.tensor).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor import comm
from advisor.comm import Collective
from advisor.model.layer import Split
from advisor.workload import Workload


def sub_blocks(w: Workload, gemms: dict) -> list[list]:
    """[column GEMM s, row GEMM s, row input width] of each sub-block (attention, MLP) of the layer table."""
    blocks: dict[str, list] = {}
    for lin in w.layer.linears:
        if lin.copies == 1 and lin.split in (Split.column, Split.row):
            b = blocks.setdefault(lin.name.split("/")[0], [0.0, 0.0, 0])
            if lin.split is Split.column:
                b[0] = b[0] + gemms[lin.name]
            else:
                b[1], b[2] = b[1] + gemms[lin.name], b[2] + lin.n_in
    return list(blocks.values())


def linear_async_share(w: Workload, gemms: dict, ag_f: Any, ag_b: Any, rs: Any, tp: Any, tokens: Any,
                       per_node: Any) -> Any:
    """The share of a layer's sequence-parallel collectives (4 all-gather + reduce-scatter pairs, as
    advisor.parallel.tensor counts them) left exposed under the linears' async collectives (module docstring), per
    sub-block: forward max(AG - G_col / tp, 0) + RS; backward AG beside G_row / tp, the extra input-gradient gather
    beside G_row, AG beside G_col and RS beside G_col, each as advisor.comm.beside costs it. It may pass 1 where
    the extra gather and the SMs held cost more than the overlap saves."""
    hw, on = w.hw, (np.asarray(tp) > 1) & (ag_f + rs > 0)
    held = comm.held_sms(tp, per_node, hw)
    blocks = sub_blocks(w, gemms)
    exposed = 0.0
    for g_col, g_row, n_in in blocks:
        extra = comm.collective_time(Collective.all_gather, tp, tokens * n_in / tp * w.act_bytes, hw, per_node, where=on)
        exposed = exposed + comm.beside(ag_f, g_col / tp, held) + rs  # forward
        exposed = exposed + (comm.beside(ag_b, g_row / tp, held) + comm.beside(extra, g_row, held)
                             + comm.beside(ag_f, g_col, held) + comm.beside(rs, g_col, held))  # backward
    n = max(len(blocks), 1)
    return np.where(on, exposed / np.maximum(n * (ag_f + ag_b + 2.0 * rs), 1e-30), 1.0)
