"""What megatron-core's core-attention checkpoint (--recompute-granularity selective, recompute_modules ["core_attn"])
keeps of the fused q/k/v projection: the value is a split view of linear_qkv's output (megatron-core 0.19.2
transformer/attention.py:1867, 1901-1903), and CheckpointFunction saves its inputs as they come
(tensor_parallel/random.py:618), so the whole output stays beside the query and key RoPE made anew
(models/common/embeddings/rope_utils.py:136-137). Unchecked, Transformer Engine's attention copies the strided value
(TE 2.20.2 dot_product_attention/utils.py:2963-2965) and saves q, k and v alone: the saved table, unchanged."""

from __future__ import annotations

import pytest

from advisor import estimate
from advisor.hardware import load_hardware
from advisor.memory import checkpointed_qkv_kept
from advisor.model import load_model
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload

KW = dict(hw="dgx-h100", gpus=8, pp=1, zero=1, micro_batch=1, global_batch=8, seq=8192, stack="megatron-core")


def _per_token(model: str, layers: int, **kw) -> dict[str, float]:
    """Activations per token per layer on one GPU under no recomputation and under selective."""
    args = {**KW, **kw}
    return {r: estimate(model=model, **args, recompute=r).memory.parts["activations"] / (layers * args["seq"])
            for r in ("none", "selective")}


@pytest.mark.parametrize("tp, sp, more", [(1, False, 10240.0 - 128.0), (4, True, 2560.0 - 32.0)])
def test_llama3_8b_keeps_its_whole_qkv_output_under_the_core_attn_checkpoint(tp, sp, more):
    # Llama 3 8B: 32 query heads, 8 KV heads of 128 (config.json): q 4096, k and v 1024 elements a token, bf16.
    # Kept: linear_qkv's output 2 x (4096 + 2 x 1024) = 12,288 B, RoPE's q 8192 and k 2048; the table counts q, k, v
    # (12,288): 10,240 B more a token at TP 1, a quarter of it at TP 4 (heads split; the output split with them); less
    # the fp32 softmax statistics the checkpointed core does not keep (4 B a head: 32 heads, 8 a rank at TP 4;
    # megatron-core.yaml memory.saved selective)
    got = _per_token("llama3-8b", 32, tp=tp, sp=sp)
    assert got["none"] == {1: 139400.0, 4: 34850.0}[tp]  # the saved table, megatron-core.yaml (sdpa, swiglu)
    assert got["selective"] - got["none"] == pytest.approx(more, rel=1e-12)


def test_learned_positions_with_one_kv_head_a_query_head_keep_nothing_more():
    # GPT's attention (learned positions, 25 KV heads for 25 query heads): q, k and v are all views of the output
    # (the reshape of a one-head group is a view), which is exactly the three tensors the table counts; the core run
    # under no_grad keeps no softmax statistics (tensor_parallel/random.py:606): 25 heads x 4 B fp32 less
    got = _per_token("gpt2-xl", 48, tp=1, seq=1024)
    assert got["none"] - got["selective"] == 25 * 4


def _workload(model: str) -> Workload:
    setup = TrainingSetup(seq_len=8192, precision="bf16", stack="megatron-core", recompute="selective")
    return Workload.of(load_model(model), load_hardware("dgx-h100"), load_stack("megatron-core"), setup)


def test_beyond_the_kv_heads_the_all_gathered_output_stays_whole():
    # Llama 3 70B: 64 query heads, 8 KV heads of 128. At TP 16 attention.py:1852-1859 all-gathers linear_qkv's output
    # (8192 + 2 x 1024 = 10,240 elements) and slices one group's view of it: all of it kept, beside q (8192 / 16 = 512)
    # and one group's k (128), less the table's q, k, v at TP 16 (q 512, one whole group's k and v 2 x 128:
    # attention.py:353-367, advisor.forms LayerBytes): 2 x 10,240 B
    assert checkpointed_qkv_kept(_workload("llama3-70b"), 16) == pytest.approx(2 * (10240 + 512 + 128 - 768), rel=1e-12)
    assert checkpointed_qkv_kept(_workload("llama3-70b"), 8) == pytest.approx(2 * (8192 + 1024) / 8, rel=1e-12)


def test_mla_and_stacks_that_copy_their_inputs_keep_nothing_more():
    # MLA's fused RoPE kernels write new key and value tensors (fusions/fused_mla_yarn_rope_apply.py): no view kept
    assert checkpointed_qkv_kept(_workload("deepseek-v2-lite"), 1) == 0.0
    # megatron-deepspeed's profile does not say its checkpoint keeps views (core_inputs "tensors", the default)
    assert load_stack("megatron-deepspeed").engine.selective.core_inputs == "tensors"
    assert load_stack("megatron-bridge-perf").engine.selective.core_inputs == "fused_views"  # megatron-core's, inherited
