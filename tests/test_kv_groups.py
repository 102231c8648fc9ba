"""Tensor parallelism beyond the KV heads: megatron-core 0.19.2 gives each TP rank one whole KV group when
num_query_groups < tp (transformer/attention.py:353-367: num_query_groups_per_partition = 1; :1852-1903 all-gathers
linear_qkv's output and slices one group's k and v), so the k and v a rank's attention saves are kv_dim over
min(tp, kv heads), not over tp (advisor.forms LayerBytes.kv)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from advisor.hardware import load_hardware
from advisor.model import load_model
from advisor.precision import fp8_attention_saved
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload


def _workload(model: str, precision: str = "bf16", hw: str = "dgx-h100", fp8_attention: bool = False) -> Workload:
    setup = TrainingSetup(seq_len=4096, precision=precision, stack="megatron-core", fp8_attention=fp8_attention)
    return Workload.of(load_model(model), load_hardware(hw), load_stack("megatron-core"), setup)


@pytest.mark.parametrize("model, tp, kept", [
    # Qwen3-30B-A3B: 4 KV heads of 128 (config.json). TP 8: one group a rank, k and v 2 x 128 elements, 2 B each;
    # TP 4 the same; TP 2 two groups each
    ("qwen3-30b-a3b", 8, 512.0), ("qwen3-30b-a3b", 4, 512.0), ("qwen3-30b-a3b", 2, 1024.0),
    # Gemma 3 1B: multi-query, 1 KV head of 256: every rank keeps it whole, 2 x 256 x 2 B
    ("gemma-3-1b", 4, 1024.0), ("gemma-3-1b", 2, 1024.0),
    # Llama 3 8B: 8 KV heads of 128 at TP 8, one each: kv_dim / tp as before
    ("llama3-8b", 8, 512.0)])
def test_a_rank_saves_k_and_v_of_whole_kv_groups(model, tp, kept):
    for t in (_workload(model).tables.saved_layer, _workload(model).tables.saved_selective):
        without_kv = replace(t, kv=0.0)
        assert t.per_gpu(tp, True) - without_kv.per_gpu(tp, True) == pytest.approx(kept, rel=1e-12)


def test_the_kv_term_is_the_saved_tables_alone():
    # megatron-core.yaml memory.saved (sdpa, swiglu, bf16): kv_dim 4 bytes (k and v, 2 B each); the element-wise
    # traffic tables (time) keep dividing by tp, and so does the full-recompute input (no kv term)
    t = _workload("qwen3-30b-a3b").tables
    assert (t.saved_layer.kv, t.saved_layer.kv_heads) == (4 * 4 * 128, 4)
    assert t.elementwise_forward.kv == 0.0 and t.saved_full_recompute.kv == 0.0


def test_fp8_attention_quantises_a_ranks_whole_kv_group():
    # MXFP8 FP8 attention on B200 keeps Q, K, V in two orientations with E8M0 scales, 2 x (1 + 1/32) B an element in
    # place of BF16's 2 (advisor.precision fp8_attention_saved): Qwen3-30B-A3B at TP 8 quantises its 4 query heads
    # (4096 / 8 = 512 elements) and one whole KV group's k and v (2 x 128): 768 elements, not (4096 + 1024) / 8 = 640
    w = _workload("qwen3-30b-a3b", precision="mxfp8", hw="dgx-b200", fp8_attention=True)
    assert fp8_attention_saved(w, 8) == pytest.approx((1.0 - w.bf16_share) * 768 * (2 * (1 + 1 / 32) - 2), rel=1e-12)
    assert fp8_attention_saved(w, 2) == pytest.approx((1.0 - w.bf16_share) * (2048 + 512) * 0.0625, rel=1e-12)



def _comm_tp(model: str, tp: int) -> tuple[float, str]:
    from advisor.api import estimate
    est = estimate(model=model, hw="dgx-h100", gpus=tp, tp=tp, sp=True, stack="megatron-core", seq=4096)
    return est.breakdown["comm/tp"], est.collectives["tp"]


# Qwen3-30B-A3B (config.json): 32 query heads and 4 KV heads of 128, 48 layers: linear_qkv's output is 4096 + 2 x 512
# = 5120 elements a token; 4096 tokens of 2 B: 40 MiB, all-gathered whole where tp 8 > 4 KV heads
QWEN_QKV_BYTES = 4096 * 5120 * 2


def _mesh(tp: int):
    from advisor.candidates import Candidates, Mesh
    from advisor.layout import Plan
    setup = TrainingSetup(seq_len=4096, precision="bf16", stack="megatron-core")
    return Mesh.of(Candidates.of_plan(Plan(tp=tp), setup, 1), 8)


def test_tp_beyond_the_kv_heads_regathers_the_qkv_output():
    # attention.py:1839-1858: linear_qkv's output [s, b, (q + 2 kv) / tp] all-gathered along its last dimension, its
    # gradient reduce-scattered in backward (tensor_parallel/mappings.py:393-401)
    from advisor import comm
    from advisor.comm import Collective
    from advisor.parallel import tensor
    w = _workload("qwen3-30b-a3b")
    assert QWEN_QKV_BYTES == 40 * 2 ** 20
    ag, rs = (np.ravel(x)[0] for x in tensor.kv_group_gathers(w, 8.0, 4096.0, _mesh(8)))
    assert float(ag) == pytest.approx(float(comm.collective_time(Collective.all_gather, 8, QWEN_QKV_BYTES, w.hw, 8)),
                                      rel=1e-12)
    assert float(rs) == pytest.approx(float(comm.collective_time(Collective.reduce_scatter, 8, QWEN_QKV_BYTES, w.hw, 8)),
                                      rel=1e-12)
    assert float(ag) > 0 and float(rs) > 0
    # tp 4: every rank holds its KV group whole; Llama 3 8B (8 KV heads) at tp 8 too: no re-gather
    assert np.all(tensor.kv_group_gathers(w, 4.0, 4096.0, _mesh(4))[0] == 0.0)
    assert np.all(tensor.kv_group_gathers(_workload("llama3-8b"), 8.0, 4096.0, _mesh(8))[1] == 0.0)


def test_the_regather_is_on_the_step_and_named():
    # each of the 48 layers adds one all-gather and one reduce-scatter of 40 MiB (no recomputation) to the step's TP time
    from advisor import comm
    from advisor.comm import Collective
    from advisor.parallel import tensor
    w = _workload("qwen3-30b-a3b")
    one = float(comm.collective_time(Collective.all_gather, 8, QWEN_QKV_BYTES, w.hw, 8)
                + comm.collective_time(Collective.reduce_scatter, 8, QWEN_QKV_BYTES, w.hw, 8))
    with_it, named = _comm_tp("qwen3-30b-a3b", 8)
    assert "re-gathered whole" in named and "40.00 MiB" in named
    saved = tensor.kv_group_gathers
    try:
        tensor.kv_group_gathers = lambda *a: (0.0, 0.0)
        without, _ = _comm_tp("qwen3-30b-a3b", 8)
    finally:
        tensor.kv_group_gathers = saved
    assert with_it - without == pytest.approx(48 * one, rel=1e-9)
    assert "re-gathered" not in _comm_tp("qwen3-30b-a3b", 4)[1]
