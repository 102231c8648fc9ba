"""The nanotron stack's gradients as nanotron 0.4 (the PyPI wheel's ``nanotron/`` package) keeps and reduces them
(engine.zero1_reduction, engine.grad_accumulator: advisor/parallel/accumulator.py): ZeRO-1's blocking fp32 all-reduce,
the bf16 DDP buckets, the half .grad beside the fp32 buffer and ZeRO-1's flattened gather."""

from __future__ import annotations

import pytest

import advisor
from advisor import comm
from advisor.comm import Collective
from advisor.hardware import load_hardware

FP32, BF16 = 4.0, 2.0
KW = dict(model="llama3-8b", hw="dgx-h100", stack="nanotron", micro_batch=1)


def _est(**kw):
    e = advisor.estimate(**KW, **kw)
    d = e.model_dump(mode="json")
    return e, d["breakdown"], d["memory"]["parts"]


def test_zero1_all_reduces_the_fp32_buffer_after_the_backward():
    """ZeRO-1 with accumulate_grad_in_fp32 builds no DDP (trainer.py:608-610), so the trainer calls
    sync_gradients_across_dp(reduce_scatter=False) after the whole pipeline's backward (trainer.py:342-350), one
    dist.all_reduce of the contiguous fp32 buffer (optim/gradient_accumulator.py:155): Llama 3 8B's 8.03e9 fp32
    gradients over 8 H100s, exposed whole (it was a reduce-scatter hidden behind the backward: 7.95 ms, now 131 ms).
    The updated bf16 weights are then all-gathered once (optim/zero.py:119, :218-250), exposed whole."""
    e, b, _ = _est(gpus=8, zero=1, seq=4096, grad_accum=4)
    hw, n = load_hardware("dgx-h100"), e.params
    assert b["comm/dp_grad"] == pytest.approx(float(comm.collective_time(Collective.all_reduce, 8, n * FP32, hw, 8)), rel=1e-9)
    assert b["comm/zero_params"] == pytest.approx(float(comm.collective_time(Collective.all_gather, 8, n * BF16, hw, 8)),
                                                  rel=1e-9)
    assert "all-reduce of 29.92 GiB over 8 GPUs" in e.collectives["zero"]


def test_zero1_step_holds_the_flattened_gather_beside_the_fp32_gradients():
    """After the step (optim/zero.py:99-119) all_gather_coalesced flattens this rank's slices into a new input and
    allocates one flat output per rank, the whole bf16 weights (distributed.py:195-220), while the fp32 gradient
    buffer is still alive (zero_grad comes after): 2 P (1 + 1/8) bytes. Llama 3 8B on 8 H100s at seq 1024: that
    moment is the peak, 14.96 + 29.92 + 11.22 + 16.83 GiB (the activations' moment was 62.46 GiB)."""
    e, _, parts = _est(gpus=8, zero=1, seq=1024, grad_accum=4)
    assert parts["activations"] == 0.0
    assert parts["transient"] == pytest.approx(e.params * BF16 * (1 + 1 / 8), rel=1e-9)
    assert parts["gradients"] == pytest.approx(e.params * FP32, rel=1e-9)  # one fp32 buffer for all (:67-70)


def test_ddp_buckets_are_bf16_and_the_half_grads_join_them_at_the_backwards_end():
    """DDP's buckets hold the bf16 parameters' gradients (trainer.py:665-674, bucket_cap_mb 25), not the fp32 buffer's
    4 bytes: 2 bytes a parameter beside the fp32 buffer through the step. At each backward's end every parameter's bf16
    .grad (FP32GradientAccumulator.backward, optim/gradient_accumulator.py:204-223) is alive too, before it is added
    in and freed: 2 bytes a parameter more (Llama 3 8B on TP 4 x DP 2: 2.0e9 parameters a GPU, 3.74 GiB each)."""
    e, _, parts = _est(gpus=8, tp=4, zero=0, seq=4096, grad_accum=4)
    p = parts["weights"] / BF16  # the GPU's bf16 parameters
    assert parts["activations"] > 0  # the activations' moment: the buckets alone, 3.74 GiB (was 7.48)
    assert parts["transient"] == pytest.approx(p * BF16, rel=1e-9)
    assert parts["gradients"] == pytest.approx(p * FP32, rel=1e-9)
    # short sequences: the backward's end is the peak; torch's fused AdamW (torch_adam_is_fused) keeps no temporaries,
    # where the foreach one's (4 bytes a parameter) outweigh the half gradients
    _, _, step = _est(gpus=8, tp=4, zero=0, seq=128, grad_accum=4, optimizer="adamw-fused")
    assert step["activations"] == 0.0
    assert step["transient"] == pytest.approx(p * BF16 + p * BF16, rel=1e-9)
    _, _, foreach = _est(gpus=8, tp=4, zero=0, seq=128, grad_accum=4)
    assert foreach["transient"] == pytest.approx(p * BF16 + p * FP32, rel=1e-9)
