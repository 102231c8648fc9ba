"""The layer table's new shapes (advisor/model/layer.py, build.py) and the cost model reading them: sliding
windows, multi-head latent attention, replicated linears, experts (parameters count every expert, FLOPs the
active ones), soft-capping. Counts are checked against transformers in tests/test_hf_families.py; here the FLOPs,
the attention core and the estimates."""

from __future__ import annotations

import pytest

from advisor.api import estimate
from advisor.compute import attention_core_time
from advisor.hardware import load_hardware
from advisor.model import CATALOGUE, load_model
from advisor.model.hf import model_from_hf_dict
from advisor.model.hub_configs import HUB_CONFIGS
from advisor.model.layer import Span, Split, keys_per_query
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload


@pytest.mark.parametrize("s,w", [(1, None), (7, None), (7, 3), (64, 16), (100, 1), (10, 10), (10, 50)])
def test_keys_per_query_is_the_mean_of_min_p_w(s, w):
    """Query p (1-based) sees min(p, w) keys (HF's sliding_window counts the query's own key): brute force."""
    brute = sum(min(p, w or p) for p in range(1, s + 1)) / s
    assert keys_per_query(s, w) == pytest.approx(brute, rel=1e-12)  # float sums in another order
    assert keys_per_query(s, w, causal=False) == s


def test_a_window_does_about_w_keys_per_query_for_long_sequences():
    assert keys_per_query(131072, 128) == pytest.approx(128, rel=1e-3)  # (w(w+1)/2 + (s-w)w)/s -> w


def test_mistral_attention_core_flops_follow_its_window():
    m = load_model("mistral-7b")  # sliding_window 4096 on every layer (mistralai/Mistral-7B-v0.1)
    s = 32768
    assert m.layer.core_flops_per_token(s) == 4.0 * keys_per_query(s, 4096) * m.q_dim
    assert m.layer.core_flops_per_token(4096) == 4.0 * (4096 + 1) / 2 * m.q_dim  # window >= s: plain causal


def test_gemma2_layers_alternate_local_and_global():
    m = load_model("gemma-2-9b")
    (layer,) = m.layers  # one layer shape, its 42 layers split over two windows
    assert dict(layer.windows) == {Span(window=4096): 21, Span(): 21}
    s = 8192
    mean = (keys_per_query(s, 4096) + keys_per_query(s)) / 2
    assert layer.core_flops_per_token(s) == pytest.approx(4.0 * mean * m.q_dim, rel=1e-12)


@pytest.mark.parametrize("s,c", [(1, 4), (7, 3), (9, 3), (64, 16), (100, 7), (10, 10), (10, 50)])
def test_chunked_keys_are_the_mean_of_the_position_in_the_chunk(s, c):
    """Chunked attention (Llama 4, transformers' create_chunked_causal_mask): query p (0-based) sees the
    (p mod c) + 1 keys of its chunk up to itself: brute force."""
    brute = sum(p % c + 1 for p in range(s)) / s
    assert keys_per_query(s, chunk=c) == pytest.approx(brute, rel=1e-12)
    assert Span(chunk=c).keys(s) == keys_per_query(s, chunk=c)
    assert Span(chunk=c).keys(s, causal=False) == s  # eager attention computes all s x s scores
    assert Span(chunk=c).extent(s) == min(s, c)


def test_llama4_scout_attends_in_chunks_on_three_layers_of_four():
    """meta-llama/Llama-4-Scout-17B-16E: chunks of 8,192 on its RoPE layers, a NoPE global layer every 4th (the
    default no_rope_layers of transformers' Llama4TextConfig), 16 experts top-1 beside a shared one on every layer."""
    m = load_model("llama4-scout")
    (layer,) = m.layers
    assert dict(layer.windows) == {Span(chunk=8192): 36, Span(): 12}
    assert layer.core_flops_per_token(8192) == 4.0 * (8192 + 1) / 2 * m.q_dim  # chunk = s: plain causal
    s = 32768  # four chunks: (8192 + 1) / 2 keys on the chunked layers, (s + 1) / 2 on the global ones
    mean = (36 * (8192 + 1) / 2 + 12 * (s + 1) / 2) / 48
    assert layer.core_flops_per_token(s) == pytest.approx(4.0 * mean * m.q_dim, rel=1e-12)
    e = m.experts
    assert (e.n_experts, e.experts_per_token, e.d_ff_expert, e.d_ff_shared) == (16, 1, 8192, 8192)
    assert m.active_params == pytest.approx(17.17e9, rel=1e-3)  # "17B active parameters" (the model card)
    assert m.nope_layers == tuple(range(3, 48, 4)) and "layers without RoPE" in m.llama_departures()
    assert load_model("smollm3-3b").nope_layers == tuple(range(3, 36, 4))  # SmolLM3's default no_rope_layers
    maverick = load_model("llama4-maverick")  # dense layers of intermediate_size_mlp between MoE ones
    dense, routed = maverick.layers
    assert (dense.count, dense.d_ff, routed.count, routed.d_ff) == (24, 16384, 24, 8192)


def test_llama4_configs_refuse_what_transformers_does_not_build():
    base = dict(HUB_CONFIGS["llama4-scout"])
    with pytest.raises(Exception, match="'layer_types' holds 'sliding_attention'"):
        model_from_hf_dict({**base, "layer_types": ["sliding_attention"] * 48}, "x")
    with pytest.raises(Exception, match="'moe_layers' holds \\[48\\]"):
        model_from_hf_dict({**base, "moe_layers": [0, 48]}, "x")
    with pytest.raises(Exception, match="'no_rope_layers' must hold a 0 \\(NoPE\\) or 1 \\(RoPE\\) for each of the 48"):
        model_from_hf_dict({**base, "no_rope_layers": [2] * 48}, "x")
    with pytest.raises(Exception, match="chunked_attention layers but 'attention_chunk_size' is null"):
        model_from_hf_dict({**base, "attention_chunk_size": None}, "x")
    with pytest.raises(Exception, match="'intermediate_size_mlp' = 16384 changes the model's parameters"):
        model_from_hf_dict({**HUB_CONFIGS["mistral-7b"], "intermediate_size_mlp": 16384}, "x")


def test_mla_core_and_linears():
    """DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite): 16 heads, q/k width 128 + 64, v width 128, no q rank."""
    m = load_model("deepseek-v2-lite")
    dense, routed = m.layers
    assert (dense.count, routed.count) == (1, 26)
    assert routed.core_flops_per_token(1) == 2.0 * 16 * (192 + 128)  # one key: QK^T at 192, PV at 128
    shapes = {lin.name: (lin.n_in, lin.n_out, lin.split) for lin in routed.linears if lin.name.startswith("attention")}
    assert shapes == {"attention/q": (2048, 16 * 192, Split.column),
                      "attention/kv_a": (2048, 512 + 64, Split.replicated),
                      "attention/kv_b": (512, 16 * (128 + 128), Split.column),
                      "attention/out": (16 * 128, 2048, Split.row)}


def test_experts_count_every_copy_in_parameters_and_top_k_in_flops():
    m = load_model("mixtral-8x7b")  # 8 experts, top 2 (mistralai/Mixtral-8x7B-v0.1)
    layer = m.layer
    experts = [lin for lin in layer.linears if lin.group == "mlp/experts"]
    assert [lin.copies for lin in experts] == [8, 8, 8] and all(lin.active == 2 for lin in experts)
    one_expert = 3 * 4096 * 14336
    assert layer.params()["mlp/experts"] == 8 * one_expert
    assert layer.flops_per_token(1)["mlp/experts"] == 2 * 2 * one_expert
    assert m.n_params - m.active_params == 32 * 6 * one_expert  # 6 of 8 experts idle per token, 32 layers


def test_deepseek_v3_dense_first_layers_and_shared_expert():
    m = load_model("deepseek-v3")
    dense, routed = m.layers
    assert (dense.count, routed.count) == (3, 58) and not dense.routed and routed.routed
    assert dense.params()["mlp"] == 3 * 7168 * 18432
    assert routed.params()["mlp/shared"] == 3 * 7168 * 2048 and routed.params()["mlp/router"] == 7168 * 256


def test_replicated_linears_are_whole_on_every_tp_rank():
    cfg = dict(HUB_CONFIGS["deepseek-v2-lite"], first_k_dense_replace=27)  # every layer dense: a dense MLA model
    m = model_from_hf_dict(cfg, "dense-mla")
    assert not m.routed
    rep = sum(lin.params for lin in m.layer.linears if lin.split is Split.replicated)
    assert rep == 2048 * 576
    assert m.layer.rank_params(4) == (m.layer.n_params - rep) / 4 + rep
    assert estimate(m, "dgx-h100", gpus=8, tp=4, dp=2, seq=4096).step_time_s > 0


def _core(model, seq, attention="sdpa"):
    setup = TrainingSetup(seq_len=seq, global_batch=8, attention=attention)
    w = Workload.of(model, load_hardware("dgx-h100"), load_stack("megatron-deepspeed"), setup)
    return attention_core_time(w, tokens=seq, tp=1)


def test_a_window_shortens_the_fused_attention_core_and_not_the_eager_one():
    windowed = load_model("mistral-7b")
    full = windowed.model_copy(update={"layer_runs": ()})
    fused_w, fused_f = _core(windowed, 32768)[0], _core(full, 32768)[0]
    frac = keys_per_query(32768, 4096) / keys_per_query(32768)  # 3,840 of 16,384.5 keys per query
    # fewer keys, each at the lower efficiency of a 4096-key span (and the kernel's fixed time): a little more
    assert frac < fused_w / fused_f < 1.25 * frac
    assert _core(windowed, 32768, "eager") == _core(full, 32768, "eager")  # eager computes all s x s scores
    assert _core(windowed, 4096) == _core(full, 4096)  # window >= s


def test_softcapping_costs_eager_passes_and_logit_passes():
    gemma = load_model("gemma-2-9b")
    uncapped = gemma.model_copy(update={"attn_softcap": None, "logit_softcap": None})
    kw = dict(gpus=8, tp=8, dp=1, seq=4096, stack="hf-trainer")
    assert estimate(gemma, "dgx-h100", attention="eager", **kw).step_time_s > \
        estimate(uncapped, "dgx-h100", attention="eager", **kw).step_time_s
    assert _core(gemma, 4096) == _core(uncapped, 4096)  # a fused kernel caps in registers


@pytest.mark.parametrize("name", [n for n, m in CATALOGUE.items() if not m.routed])
def test_every_dense_catalogue_model_estimates(name):
    e = estimate(name, "dgx-h100", gpus=8, seq=min(1024, load_model(name).max_positions))
    assert 0 < e.step_time_s and 0 < e.mfu <= e.hfu <= 1
