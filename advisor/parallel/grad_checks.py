"""The checks a stack runs on the gradients before it reduces them (``engine.grad_nan_check``).

megatron-core 0.19.2's check_for_nan_in_grad (distributed_data_parallel_config.py:39, False in the config; Megatron-LM
turns it on by default, arguments.py:2735-2737 --no-check-for-nan-in-loss-and-grad store_false, handed to the DDP
config at training.py:1989; Megatron-Bridge's base recipes set it True, recipes/common.py:81, and its performance
recipes False, perf_recipes/_common.py:57): ``start_grad_sync`` (param_and_grad_buffer.py:649-653), called once the
last micro-batch's backward has made a bucket's gradients (:870), first runs ``check_grads`` (:339-365): per bucket
``grad_data.norm(p=2)``, one read of the bucket on the compute stream, then ``rerun_state_machine.validate_result``
twice (isnan, isinf), each evaluating ``rejection_func(result)`` as a Python bool (rerun_state_machine.py:517-518):
a host sync. After each sync the GPU starts on an empty queue and idles while the host issues the next op (as
advisor.host's docstring says of a synchronised loop), one op's host cost (advisor.host.op_costs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from advisor.compute import mem_time
from advisor.parallel.overlap import bucket_bytes

SYNCS_PER_BUCKET = 2.0  # validate_result for isnan, then for isinf (param_and_grad_buffer.py:348-363)


def nan_check_seconds(w: Any, mesh: Any, states: Any, zero: Any) -> Any:
    """Seconds a step spends on the gradient NaN/Inf check, where the stack runs it (its DDP wrapper: ZeRO 0-1, not
    Megatron-FSDP's ZeRO-2/3): the norm's read of the stage's gradient buffer at the element-wise rate, and per bucket
    two host syncs, each leaving the GPU idle for one op's issue. The busiest stage's buckets (the first stage's: later
    stages check their one bucket, distributed_data_parallel.py:105-106)."""
    from advisor.host import op_costs  # imported here: advisor.host imports the layer tables, not needed otherwise
    eng, hw = w.stack.engine, w.hw
    on = np.asarray(zero) <= 1
    if not eng.grad_nan_check or not np.any(on):
        return np.zeros(np.shape(on))
    size = states.dp_params * states.reduce_bytes  # the buffer's dtype: fp32 main gradients or the parameters'
    buckets = 1.0 if eng.gradient_reduction == "one_call" else np.maximum(np.ceil(size / bucket_bytes(
        w, mesh.dp, states.reduce_bytes)), 1.0)
    read = mem_time(hw, size)
    return np.where(on, read + SYNCS_PER_BUCKET * buckets * op_costs(w)[0], 0.0)
