"""What megatron-core's attention keeps for backward beside its saved tables: the unfused YaRN RoPE's cos and sin
(advisor.unfused_bytes.rotary_saved), and the softmax statistics its core_attn checkpoint does not keep (the selective
tables of stack_profiles/megatron-core.yaml)."""

from __future__ import annotations

import numpy as np
import pytest

from advisor import estimate
from advisor.hardware import load_hardware
from advisor.memory import flash_output_copy
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.unfused_bytes import rotary_saved
from advisor.workload import Workload


def _workload(model: str, stack: str = "megatron-core", precision: str = "bf16", hw: str = "dgx-h100") -> Workload:
    setup = TrainingSetup(seq_len=4096, precision=precision, stack=stack)
    return Workload.of(load_model(model), load_hardware(hw), load_stack(stack), setup)


def test_yarn_rope_keeps_cos_and_sin_for_q_and_for_k_a_position():
    # GPT-OSS (YaRN, head_dim 64, every layer rotary: config.json): _apply_rotary_pos_emb_bshd makes cos_ and sin_ anew
    # for the query and for the key (megatron-core 0.19.2 rope_utils.py:133-134; attention.py:1499, 1517) and t * cos_,
    # _rotate_half(t) * sin_ save them (:136): 4 x 64 bf16 elements a position, 512 B; per token over the micro-batch
    w = _workload("gpt-oss-120b")
    assert rotary_saved(w, 1) == 512.0 and rotary_saved(w, 4) == 128.0
    assert rotary_saved(_workload("gpt-oss-120b", precision="fp32"), 1) == 1024.0  # .to(t.dtype): fp32 t, fp32 cos
    # plain RoPE runs TE's fused kernel (apply_rope_fusion), which saves only the freqs every layer shares; MLA rotates
    # in its own kernels; stacks whose profile does not say so keep nothing more
    assert rotary_saved(_workload("llama3-8b"), 1) == 0.0 and rotary_saved(_workload("deepseek-v3"), 1) == 0.0
    assert rotary_saved(_workload("gpt-oss-120b", stack="torchtitan"), 1) == 0.0


def test_yarn_rope_cos_and_sin_join_the_estimate_under_every_policy_that_runs_rope_unchecked():
    kw = dict(model="gpt-oss-120b", hw="dgx-h100", gpus=64, tp=8, sp=True, ep=8, pp=1, micro_batch=1, global_batch=64,
              seq=4096, stack="megatron-core")
    # 36 layers x 4096 tokens x 512 B, whole on every TP rank, against the same plan on a profile without the term
    st = load_stack("megatron-core")
    bare = st.model_copy(update={"kernels": st.kernels.model_copy(
        update={"rotary": st.kernels.rotary.model_copy(update={"scaled_per_position": 0.0})})})
    for recompute in ("none", "selective"):
        with_rope = estimate(**kw, recompute=recompute).memory.parts["activations"]
        without = estimate(**{**kw, "stack": bare}, recompute=recompute).memory.parts["activations"]
        assert with_rope - without == pytest.approx(36 * 4096 * 512, rel=1e-12)


@pytest.mark.parametrize("model, tp", [("llama3-8b", 1), ("llama3-8b", 4), ("qwen3-30b-a3b", 8), ("gpt2-xl", 1)])
def test_the_core_attn_checkpoint_keeps_no_softmax_statistics(model, tp):
    # megatron-core 0.19.2 CheckpointFunction runs the core under torch.no_grad() (tensor_parallel/random.py:606),
    # saving only its inputs (:618): TE's fp32 softmax_stats (backends.py:1825-1851), 4 B a head a token, not kept
    w = _workload(model)
    t = w.tables
    full, sel = (x.per_gpu(np.float64(tp), True) for x in (t.saved_layer, t.saved_selective))
    assert full - sel == pytest.approx(4 * w.layer.n_heads / tp, rel=1e-12)


def _flash(model: str, hw: str, **kw) -> dict[str, float]:
    """Activations per token per layer under no recomputation and core_attn, micro-batch 1 and 2."""
    args = dict(gpus=8, tp=8, sp=True, pp=1, global_batch=16, seq=4096, stack="megatron-core", **kw)
    layers = load_model(model).n_layers
    return {(r, b): estimate(model, hw, recompute=r, micro_batch=b, **args).memory.parts["activations"]
            / (layers * 4096 * b) for r in ("none", "selective") for b in (1, 2)}


def test_flash_attention_at_micro_batch_two_keeps_its_output_twice():
    # A100 (sm_80): Transformer Engine runs FlashAttention, whose sbhd output is .contiguous() of a transposed bshd
    # view (TE 2.20.2 backends.py:1428, 1436): a copy once b > 1, saved by linear_proj beside flash-attn's own.
    # Llama 3 8B: 32 heads of 128 at TP 8, o_dim 512 a rank, bf16: 1024 B a token a layer
    a100 = _flash("llama3-8b", "dgx-a100")
    assert a100["none", 2] - a100["none", 1] == pytest.approx(1024.0, rel=1e-12)
    # under core_attn the core runs under no_grad (tensor_parallel/random.py:606): flash's copy is dropped
    assert a100["selective", 2] == pytest.approx(a100["selective", 1], rel=1e-12)
    # H100 (sm_90): cuDNN's FusedAttention, preferred on Hopper+ (utils.py:1892-1897), returns a view (:2635-2637)
    h100 = _flash("llama3-8b", "dgx-h100")
    assert h100["none", 2] == pytest.approx(h100["none", 1], rel=1e-12)


def test_flash_attention_copy_needs_the_kernel_to_run_flash():
    a100 = _workload("llama3-8b", hw="dgx-a100")
    assert float(flash_output_copy(a100, 2, 8)) == 1024.0 and float(flash_output_copy(a100, 1, 8)) == 0.0
    # learned sinks turn FlashAttention off (utils.py:1223); below sm_80 neither flash nor cuDNN runs (:640-646); a
    # stack whose profile does not say its attention copies (torchtitan's SDPA takes bshd)
    assert float(flash_output_copy(_workload("gpt-oss-120b", hw="dgx-a100"), 2, 8)) == 0.0
    assert float(flash_output_copy(_workload("llama3-8b", hw="titan-rtx-nvlink", precision="fp32"), 2, 8)) == 0.0
    assert float(flash_output_copy(_workload("llama3-8b", stack="torchtitan", hw="dgx-a100"), 2, 8)) == 0.0
