"""Megatron-Bridge's performance recipes run Transformer Engine's fused cross-entropy, not megatron-core's
vocab-parallel one on fp32 logits: Bridge's GPTModelProvider sets cross_entropy_loss_fusion True
(models/gpt_provider.py:204) and _benchmark_common cross_entropy_fusion_impl "te" (perf_recipes/_common.py:68), which
megatron-core's language_module.py:168-187 runs as te_parallel_cross_entropy (stack_profiles/megatron-bridge-perf.yaml).
TE 2.14's triton kernels read the bf16 logits twice and write the gradient into them in forward (6 bytes a logit), and
scale it in place in backward (4), where the native loss moves 38 and 14 (megatron-deepspeed.yaml's kernels.loss);
they keep 2 bytes a logit, not an fp32 copy (4 held, 8 at the peak)."""

import pytest

from advisor import estimate

LOGITS = 8192 * 128_256  # Llama 3 8B: one micro-batch of 8,192 tokens over its 128,256-entry vocabulary (TP 1)
ELEMENTWISE = 3350e9 * 0.757  # H100 SXM datasheet 3.35 TB/s x dgx-h100's element-wise share


def test_bridge_perf_loss_is_te_fused_cross_entropy(tmp_path):
    native = tmp_path / "native.yaml"  # the same stack with megatron-core's native loss put back
    native.write_text("base: megatron-bridge-perf\nname: native\ndescription: t\nkernels:\n  loss:\n"
                      "  - {forward: 38, backward: 14}\nmemory:\n  logits:\n  - {held: 4, peak: 8}\n")
    kw = dict(gpus=8, zero=1, micro_batch=1, global_batch=64, seq=8192)  # 8 micro-batches a rank
    te = estimate("llama3-8b", "dgx-h100", stack="megatron-bridge-perf", **kw)
    old = estimate("llama3-8b", "dgx-h100", stack=str(native), **kw)
    assert te.memory.parts["logits_loss"] == LOGITS * 2 and old.memory.parts["logits_loss"] == LOGITS * 8
    saved_fwd = old.breakdown["compute/forward"] - te.breakdown["compute/forward"]
    saved_bwd = old.breakdown["compute/backward"] - te.breakdown["compute/backward"]
    assert saved_fwd == pytest.approx(8 * LOGITS * (38 - 6) / ELEMENTWISE, rel=1e-6)  # 106.1 ms a step
    assert saved_bwd == pytest.approx(8 * LOGITS * (14 - 4) / ELEMENTWISE, rel=1e-6)  # 33.1 ms
    assert te.step_time_s < old.step_time_s
