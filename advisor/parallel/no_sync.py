"""FSDP1's gradient accumulation under ``no_sync`` (engine.accumulation ``unsharded``), as the Trainer and accelerate
run it: every micro-batch but the last runs inside the model's ``no_sync()`` (transformers 5.23 trainer.py:1896-1907;
accelerate 1.15 accelerator.py:1172-1178 ``getattr(model, "no_sync")`` for FSDP1, and ``accumulate()`` likewise).

What torch 2.13's FSDP1 does there (torch/distributed/fsdp/_runtime_utils.py):
- ``_post_backward_hook`` (:738-745) returns before the reduce-scatter while ``_sync_gradients`` is False: each
  unit's unsharded gradient stays on its flat parameter's ``.grad`` in the dtype it was computed in (bf16 under
  accelerate's MixedPrecision(param_dtype=bf16), the model's under fp32), and the next micro-batch's backward adds
  into it (_flat_param.py:1669-1676 keeps a padded unsharded ``.grad``). By the last micro-batch every unit's is
  alive: the whole model's gradients unsharded on every rank, beside the sharded states.
- the last micro-batch's backward reduce-scatters each unit once: one reduce-scatter a step, not one a micro-batch.
- ``_should_free_in_backward`` (:811-828) keeps SHARD_GRAD_OP's gathered parameters through a no_sync backward, and
  its forward never frees them (:490-500): ZeRO-2 gathers once a step; FULL_SHARD frees and gathers as ever, twice a
  micro-batch.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from advisor.candidates import Candidates
from advisor.layout import Offload
from advisor.workload import Workload


def accumulating(w: Workload, c: Candidates, zero: Any) -> Any:
    """Where the plan's ZeRO-2/3 micro-batches before the last run under no_sync: FSDP's plans, those without TP that
    offload nothing (the stack's TP is DeepSpeed's AutoTP and its offloading ZeRO-2/3 DeepSpeed's ZeRO-Offload /
    Infinity, whose engine reduces into its partitions each micro-batch: the accelerate export writes neither as FSDP;
    FSDP1's CPUOffload is left as costed before)."""
    return ((w.stack.engine.accumulation == "unsharded") & (np.asarray(zero) >= 2) & (np.asarray(c.grad_accum) > 1)
            & (np.asarray(c.offload) == Offload.none.code) & (np.asarray(c.tp) == 1))


def unsharded_grads(w: Workload, c: Candidates, zero: Any, trained: Any, grad_bytes: Any) -> Any:
    """Bytes of the unsharded gradients no_sync keeps from the first micro-batch's backward into the last one's: every
    trained parameter of the rank's stage in the dtype the layers compute in (``grad_bytes``, the half type under
    FSDP's mixed precision); 0 where nothing accumulates so."""
    return np.where(accumulating(w, c, zero), trained * grad_bytes, 0.0)


def step_seconds(w: Workload, c: Candidates, zero: Any, exposed: Any, rs: Any, ag: Any, roots: tuple[Any, Any],
                 per_micro_batch: Callable[[Any, Any, tuple[Any, Any]], Any]) -> Any:
    """The ZeRO-2/3 collectives' exposed seconds a step: ``exposed`` (one micro-batch's, with its reduce-scatter and
    gathers) each micro-batch, but where no_sync runs the ones before the last: those reduce nothing, and ZeRO-2's
    gather nothing (``per_micro_batch(rs, ag, roots)`` costs them)."""
    on = accumulating(w, c, zero)
    every = c.grad_accum * exposed
    if not np.any(on):
        return every
    z2 = np.asarray(zero) == 2
    rest = per_micro_batch(0.0 * rs, np.where(z2, 0.0, ag), (0.0 * roots[0], np.where(z2, 0.0, roots[1])))
    return np.where(on, exposed + (c.grad_accum - 1) * rest, every)
