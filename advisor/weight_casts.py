"""When a low-precision recipe's weights are quantised (advisor.engine ``weight_casts``): the share of a step's
micro-batches that cast them, and the share a recomputed forward casts again (advisor.compute layer_times,
weight_cast_time). Transformer Engine keeps the quantised copy from a step's first micro-batch: megatron-core passes
is_first_microbatch (extensions/transformer_engine.py:1082-1089: True on the step's first forward, False after it,
reset once a step by pipeline_parallel/schedules.py), so later micro-batches and every recomputed forward, which runs
after its own forward, use the copy; except under ZeRO-3, which frees the gathered weight after use, unless the weights
are held quantised (low_precision_params: the optimizer step makes the copy). A stack that casts in every forward
(torchao's Float8Linear: ``per_micro_batch``) casts in each rerun too."""

from __future__ import annotations

from typing import Any

import numpy as np


def _kept(w: Any, zero: Any) -> Any:
    """Whether the step's quantised copy outlives its first use (module docstring)."""
    return (np.asarray(zero) < 3) | w.stack.engine.low_precision_params


def share(w: Any, zero: Any, grad_accum: Any) -> Any:
    """The share of a step's micro-batches that quantise the weights: all of them, or one in ``grad_accum`` where the
    copy is kept."""
    if w.precision.recipe is None or w.stack.engine.weight_casts == "per_micro_batch":
        return 1.0
    return np.where(_kept(w, zero), 1.0 / np.asarray(grad_accum, dtype=float), 1.0)


def rerun_share(w: Any, zero: Any) -> Any:
    """The share of one cast a recomputed forward pays: none where the copy is kept (the rerun passes
    is_first_microbatch False), one where the stack casts in every forward or ZeRO-3 freed the weight."""
    if w.precision.recipe is None or w.stack.engine.weight_casts == "per_micro_batch":
        return 1.0
    return np.where(_kept(w, zero), 0.0, 1.0)
