"""torchtitan's ZeRO-1 is FSDP2 under a pipeline schedule (stack_profiles/torchtitan.yaml zero1): each unit's backward
upcasts its unsharded bf16 gradient into an fp32 accumulator (torch 2.13 fsdp/_fully_shard/_fsdp_param.py:802-813,
reduce_dtype fp32) that lives until perform_reduce_grad (distributed/pipelining/stage.py:1168-1191). Those gradients
are made in backward, so at one micro-batch (GPipe: torch's Schedule1F1B refuses fewer micro-batches than stages,
schedules.py:1020-1024) none is held through the forward; from two on they are."""

import pytest

from advisor import estimate

GiB = 2**30
# qwen3-8b: 8,190,735,360 parameters; tp 4 x pp 2 keeps 1,023,841,408 a GPU (its 2,047,682,816 bf16 weight bytes)
FP32_GRADS_GIB = 1_023_841_408 * 4 / GiB  # 3.81


def _run(grad_accum):
    return estimate("qwen3-8b", "dgx-h100", tp=4, pp=2, dp=2, zero=1, precision="bf16", grad_accum=grad_accum,
                    schedule="gpipe", stack="torchtitan")


def test_one_micro_batch_holds_no_fp32_gradients_through_the_forward():
    one, two = _run(1), _run(2)
    assert two.memory.parts['gradients'] / GiB == pytest.approx(FP32_GRADS_GIB, abs=0.01)  # held from the first backward on
    assert one.memory.parts['gradients'] == 0.0  # the peak is in forward-backward, before backward makes them
    assert one.memory.peak_bytes / GiB == pytest.approx(12.69, abs=0.01)  # 16.50 GiB when counted as persisting
