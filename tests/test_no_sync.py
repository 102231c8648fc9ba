"""FSDP1's gradient accumulation as the Trainer and accelerate run it (advisor.parallel.no_sync).

transformers 5.23 trainer.py:1896-1907 runs every micro-batch but the last under ``accelerator.no_sync(model)``, which
for FSDP1 is the model's own ``no_sync`` (accelerate 1.15 accelerator.py:1172-1178; the export's fsdp_version 1).
torch 2.13 torch/distributed/fsdp/_runtime_utils.py:743-746: the post-backward hook returns before the
reduce-scatter while ``_sync_gradients`` is False, leaving the unit's unsharded gradient on ``flat_param.grad`` in the
compute dtype (bf16 under accelerate's MixedPrecision(param_dtype=bf16)); _flat_param.py:1669-1676 keeps it for the
next backward to add into. :811-828 keeps SHARD_GRAD_OP's gathered parameters through a no_sync backward."""

from __future__ import annotations

import pytest

from advisor import estimate
from advisor.model import load_model

# llama3-8b FSDP on one DGX A100, full recomputation: 1 micro-batch a GPU, 1 or 4 a step
RUN = dict(model="llama3-8b", hw="dgx-a100", gpus=8, micro_batch=1, seq=4096, recompute="full")


def _est(zero: int, accum: int, stack: str = "hf-trainer"):
    return estimate(zero=zero, global_batch=8 * accum, stack=stack, **RUN)


@pytest.mark.parametrize("zero", [2, 3])
def test_unsharded_gradients_held_across_micro_batches(zero):
    """Under grad_accum 4 every rank holds the whole model's unsharded bf16 gradients (2 bytes x 8.03e9 parameters,
    16.06 GB) by the last micro-batch; at grad_accum 1 there is no no_sync and the gradients are sharded 8 ways."""
    n = load_model("llama3-8b").n_params
    assert _est(zero, 4).memory.parts["gradients"] == pytest.approx(2.0 * n, rel=1e-9)
    assert _est(zero, 1).memory.parts["gradients"] == pytest.approx(2.0 * n / 8, rel=1e-9)
    # 13.1 GiB more at the peak than a reduce-scatter every micro-batch would hold
    assert _est(zero, 4).memory.peak_bytes - _est(zero, 1).memory.peak_bytes == pytest.approx(2.0 * n * 7 / 8, rel=1e-6)


def test_shard_grad_op_gathers_and_reduces_once_a_step():
    """SHARD_GRAD_OP under no_sync neither frees its gathered units nor reduce-scatters before the last micro-batch:
    four micro-batches expose what one does (each exposed a gather of the first layer and the last reduce-scatter)."""
    one, four = (_est(2, a).breakdown["comm/zero_params"] for a in (1, 4))
    assert one > 0.02  # ~43 ms on NVLink: the comparison is not vacuous
    assert four == pytest.approx(one, rel=1e-9)


def test_full_shard_still_gathers_every_micro_batch():
    """FULL_SHARD frees and gathers each unit twice a micro-batch with or without no_sync; only the reduce-scatter is
    left to the last: more than one micro-batch's exposed time, less than four."""
    one, four = (_est(3, a).breakdown["comm/zero_params"] for a in (1, 4))
    assert one < four < 4 * one - 0.01


def test_deepspeed_stack_unchanged():
    """The deepspeed stack (base hf-trainer) reduces into its partitions every micro-batch: no unsharded gradients."""
    n = load_model("llama3-8b").n_params
    assert _est(3, 4, "deepspeed").memory.parts["gradients"] == pytest.approx(2.0 * n / 8, rel=1e-9)  # its bf16 partition


def test_fsdp1_hybrid_shard_all_reduces_each_unit_behind_the_backward():
    """FSDP1's HYBRID_SHARD all-reduces each unit's shard over the replicas right after its reduce-scatter, on its own
    all-reduce stream (torch 2.13 _runtime_utils.py _reduce_grad, :863-876): hidden behind the backward as the
    reduce-scatters are, not exposed whole once a step. Llama 3 8B on 2 DGX H100 nodes, 8-way shards, 2 replicas."""
    from advisor import comm
    from advisor.comm import Collective
    from advisor.hardware import load_hardware

    e = estimate("llama3-8b", "dgx-h100", gpus=16, fsdp="hybrid-shard", micro_batch=1, seq=4096,
                         recompute="full", stack="hf-trainer")
    whole = float(comm.collective_time(Collective.all_reduce, 2, e.params * 2.0 / 8, load_hardware("dgx-h100"), 1))
    assert e.breakdown["comm/zero_params"] < whole  # everything it exposes is less than that all-reduce alone (0.034 s vs 0.047)
