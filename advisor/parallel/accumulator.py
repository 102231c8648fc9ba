"""An fp32 gradient accumulator beside the half-precision ``.grad`` (the stack's ``engine.grad_accumulator``
``beside_half``) and a ZeRO-1 that all-reduces its flat buffer (``engine.zero1_reduction``), read from nanotron 0.4
(the wheel's ``nanotron/`` package):

- FP32GradientAccumulator.backward (optim/gradient_accumulator.py:204-210) runs ``loss.backward()``, which leaves a
  bf16 ``.grad`` on every parameter, then adds each into the contiguous fp32 buffer (:171-173, one buffer for all
  parameters, ZeRO-1 included: :67-70) and sets ``.grad = None`` (:212-223): at each backward's end the stage's half
  gradients (2 bytes a parameter) sit beside the fp32 buffer, the activations gone (the step's moment, memory's (c)).
- ZeRO-1 with fp32 accumulation builds no DDP (trainer.py:608-610); after the pipeline's backward the trainer
  all-reduces the whole fp32 buffer in one blocking call (trainer.py:342-350 ``reduce_scatter=False``;
  gradient_accumulator.py:155), beside nothing. After the step ZeroDistributedOptimizer gathers the updated weights
  (optim/zero.py:119, :218-250) through all_gather_coalesced, which flattens this rank's slices and allocates one
  flat output per rank, the whole weights' size, before copying them back (distributed.py:195-220).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np


def all_reduces(w: Any, zero: Any) -> Any:
    """Where ZeRO-1 all-reduces the gradients after the backward instead of reduce-scattering them beside it."""
    return (np.asarray(zero) == 1) & (w.stack.engine.zero1_reduction == "all_reduce_after_backward")


def apply(w: Any, c: Any, mesh: Any, states: Any) -> Any:
    """``states`` (advisor.parallel.model_states.ModelStates) with the backward's end in ``step_temporaries`` where the stack
    accumulates beside the half gradients: the largest of the stage's half ``.grad``, the step's own temporaries and,
    under ZeRO-1 over several ranks, all_gather_coalesced's flat input slice and outputs (after the step has freed
    its temporaries: zero.py:99-119)."""
    if w.stack.engine.grad_accumulator != "beside_half":
        return states
    half = 2.0  # bytes of a bf16 .grad: the stack trains bf16 weights (its profile's precisions)
    zero, shard = np.asarray(c.zero), mesh.dp_shard
    gather = np.where((zero == 1) & (shard > 1), states.params * states.weight_bytes * (1.0 + 1.0 / shard), 0.0)
    step = np.maximum(np.maximum(states.trained * half, states.step_temporaries), gather)
    return replace(states, step_temporaries=step)
