"""Every config.json family's parameter count equals what transformers builds from the same config: the model
``AutoModelForCausalLM.from_config`` makes, on the meta device (no memory allocated), counted parameter by
parameter. Small configs switch every feature on (GQA/MQA, biases, sliding windows, q/k norms, parallel blocks,
MLA with and without a q low rank, routed and shared experts, dense layers among MoE ones); the real configs are
those advisor.model.hub_configs cites (and the catalogue reads), plus BLOOM's and GPT-2's own config.json.

Source of truth: transformers 5.23.0 (the test extra pins it), modeling_*.py of each family."""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from advisor.model import CATALOGUE, load_model
from advisor.model.families import FAMILIES
from advisor.model.hf import model_from_hf_dict
from advisor.model.hub_configs import HUB_CONFIGS

transformers.logging.set_verbosity_error()

B = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=1000)
F = {k: v for k, v in B.items() if k != "intermediate_size"}  # Falcon's MLP width is ffn_hidden_size
SMALL = {
 "gpt2": [dict(n_layer=2, n_embd=64, n_head=4, n_inner=96, vocab_size=1000, n_positions=128),
          dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, tie_word_embeddings=False)],
 "gpt_bigcode": [dict(n_layer=2, n_embd=64, n_head=4, n_inner=96, vocab_size=1000, n_positions=128),
                 dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128, multi_query=False)],
 "gptj": [dict(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_inner=96, vocab_size=1000, n_positions=128)],
 "gpt_neox": [dict(B), dict(B, attention_bias=False, use_parallel_residual=False, tie_word_embeddings=True)],
 "falcon": [dict(F, ffn_hidden_size=96),
            dict(F, new_decoder_architecture=True, num_kv_heads=2, bias=True, alibi=True),
            dict(F, parallel_attn=False, multi_query=False, bias=True, tie_word_embeddings=False),
            dict(F, num_ln_in_parallel_attn=2)],
 "mpt": [dict(d_model=64, n_heads=4, n_layers=2, vocab_size=1000, max_seq_len=128)],
 "bloom": [dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000), dict(n_embed=64, n_layer=2, num_attention_heads=4, vocab_size=1000, tie_word_embeddings=False)],
 "phi": [dict(B, num_key_value_heads=2, qk_layernorm=True), dict(B)],
 "starcoder2": [dict(B, num_key_value_heads=2, sliding_window=16), dict(B, use_bias=False, tie_word_embeddings=False)],
 "llama": [dict(B, num_key_value_heads=2, attention_bias=True, mlp_bias=True, head_dim=32, tie_word_embeddings=True), dict(B)],
 "granite": [dict(B, num_key_value_heads=2, attention_bias=True, mlp_bias=True, embedding_multiplier=12.0)],
 "mistral": [dict(B, num_key_value_heads=2, head_dim=32, sliding_window=16)],
 "qwen2": [dict(B, num_hidden_layers=3, num_key_value_heads=2, use_sliding_window=True, sliding_window=16, max_window_layers=1, tie_word_embeddings=True)],
 "qwen3": [dict(B, num_key_value_heads=2, head_dim=24, attention_bias=True, tie_word_embeddings=True)],
 "phi3": [dict(B, num_key_value_heads=2, sliding_window=16, pad_token_id=0)],
 "olmo": [dict(B, num_key_value_heads=2, attention_bias=True, clip_qkv=8.0)],
 "olmo2": [dict(B, num_key_value_heads=2, attention_bias=True)],
 "olmo3": [dict(B, num_hidden_layers=4, num_key_value_heads=2, sliding_window=16)],
 "cohere": [dict(B, num_key_value_heads=2, use_qk_norm=True, attention_bias=True), dict(B)],
 "gemma": [dict(B, num_key_value_heads=1, head_dim=24, attention_bias=True)],
 "gemma2": [dict(B, num_hidden_layers=3, num_key_value_heads=2, head_dim=24, sliding_window=16, attention_bias=True, tie_word_embeddings=False)],
 "gemma3_text": [dict(B, num_hidden_layers=7, num_key_value_heads=2, head_dim=24, sliding_window=16)],
 "mixtral": [dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=16)],
 "qwen2_moe": [dict(B, num_hidden_layers=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2, mlp_only_layers=[0])],
 "qwen3_moe": [dict(B, num_hidden_layers=3, num_key_value_heads=2, head_dim=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[1], attention_bias=True)],
 "olmoe": [dict(B, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, intermediate_size=32, attention_bias=True)],
 "deepseek_v2": [dict(B, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, attention_bias=True, mlp_bias=True),
                 dict(B, num_hidden_layers=2, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)],
 "deepseek_v3": [dict(B, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12, n_group=2, topk_group=1, attention_bias=True)],
 "gpt_oss": [dict(B, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=16)],
 "smollm3": [dict(B, num_hidden_layers=8, num_key_value_heads=2, use_sliding_window=True, sliding_window=16, attention_bias=True, pad_token_id=0),
             dict(B, num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0], mlp_bias=True, tie_word_embeddings=False, pad_token_id=0)],
 "seed_oss": [dict(B, num_key_value_heads=2, head_dim=24, attention_out_bias=True, mlp_bias=True),
              dict(B, num_key_value_heads=2, head_dim=16, attention_bias=False)],
 "glm4_moe": [dict(B, num_hidden_layers=3, num_key_value_heads=2, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, attention_bias=True, use_qk_norm=True, n_group=2, topk_group=1),
              dict(B, num_hidden_layers=2, num_key_value_heads=4, head_dim=8, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2)],
 "minimax_m2": [dict(B, num_key_value_heads=2, head_dim=24, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)],
 "phimoe": [dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, attention_bias=True, lm_head_bias=True, sliding_window=16),
            dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)],
 "cohere2": [dict(B, num_hidden_layers=5, num_key_value_heads=2, sliding_window=16, attention_bias=True, pad_token_id=0),
             dict(B, num_hidden_layers=4, layer_types=["full_attention"] * 4, tie_word_embeddings=False, pad_token_id=0)],
 "glm4": [dict(B, num_key_value_heads=2, head_dim=24, attention_bias=True, pad_token_id=0), dict(B, num_key_value_heads=4, attention_bias=False, pad_token_id=0)],
 "ernie4_5_moe": [dict(B, num_hidden_layers=4, num_key_value_heads=2, moe_intermediate_size=32, moe_num_experts=4, moe_k=2, moe_num_shared_experts=1, use_bias=True, moe_layer_start_index=1, moe_layer_end_index=2, pad_token_id=0),
                  dict(B, num_hidden_layers=4, num_key_value_heads=2, moe_intermediate_size=32, moe_num_experts=4, moe_k=2, moe_layer_interval=2, tie_word_embeddings=False, pad_token_id=0)],
 "granitemoe": [dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, attention_bias=True, embedding_multiplier=12.0)],
 "granitemoeshared": [dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48),
                      dict(B, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)],
 "arcee": [dict(B, num_key_value_heads=2, head_dim=24, attention_bias=True, mlp_bias=True), dict(B)],
 "exaone4": [dict(B, num_hidden_layers=5, num_key_value_heads=2, sliding_window=16), dict(B, num_key_value_heads=2, head_dim=24, sliding_window=16, layer_types=["full_attention", "sliding_attention"])],
 "dots1": [dict(B, num_hidden_layers=3, num_key_value_heads=2, moe_intermediate_size=32, n_routed_experts=4, n_shared_experts=2, num_experts_per_tok=2, first_k_dense_replace=1, attention_bias=True, sliding_window=16, max_window_layers=2)],
 "llama4_text": [dict(B, num_hidden_layers=6, num_key_value_heads=2, head_dim=24, intermediate_size=32, intermediate_size_mlp=48, num_local_experts=4, num_experts_per_tok=2, moe_layers=[1, 2, 5], attention_bias=True, no_rope_layer_interval=3, attention_chunk_size=16),
                 dict(B, num_hidden_layers=4, num_key_value_heads=2, intermediate_size=32, num_local_experts=4, interleave_moe_layer_step=2, use_qk_norm=False, tie_word_embeddings=True)],
}


# What the real configs have, as transformers 5.23 builds them (and as the cited model cards round them: Mistral
# 7.24B, Mixtral 46.7B, Qwen2.5 7.61B, Qwen3 8.19B, Qwen3-30B-A3B 30.5B, Gemma 2 9.24B, DeepSeek-V2-Lite 15.7B,
# DeepSeek-V3 671B without its multi-token-prediction module, gpt-oss-120b 116.8B, Llama 4 Scout's and Maverick's
# language models 107.8B and 400.7B of their 109B and 400B with the vision tower, 17B active; GLM-4.5-Air 106B,
# MiniMax-M2 230B (229B), SmolLM3 3B (3.08B), Phi-3.5-MoE 42B (41.9B), ERNIE-4.5-21B-A3B 21.8B, GLM-4-9B 9.4B, Qwen3-235B-A22B 235B, Kimi K2 1.03T (1T)).
HUB_PARAMS = {
    "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704, "qwen2.5-7b": 7_615_616_512,
    "qwen3-8b": 8_190_735_360, "qwen3-30b-a3b": 30_532_122_624, "gemma-2-9b": 9_241_705_984,
    "gemma-3-1b": 999_885_952, "phi-3-mini": 3_821_079_552, "olmo-2-7b": 7_298_617_344,
    "falcon-7b": 6_921_720_704, "gpt-neox-20b": 20_554_567_680, "mpt-7b": 6_649_286_656,
    "deepseek-v2-lite": 15_706_484_224, "deepseek-v3": 671_026_404_352, "gpt-oss-120b": 116_829_156_672,
    "llama4-scout": 107_769_861_120, "llama4-maverick": 400_711_848_960, "glm-4.5-air": 106_852_245_504,
    "minimax-m2": 228_689_748_992, "smollm3-3b": 3_075_098_624, "phi-3.5-moe": 41_873_153_344,
    "ernie-4.5-21b-a3b": 21_825_437_888, "glm-4-9b": 9_400_279_040, "qwen3-235b-a22b": 235_093_634_560,
    "kimi-k2": 1_026_408_209_408,
}
OWN_CONFIGS = {
    "bloom-176b": {  # bigscience/bloom: n_layer/n_head keys, once refused by advisor
        "model_type": "bloom", "apply_residual_connection_post_layernorm": False, "hidden_size": 14336,
        "n_head": 112, "n_inner": None, "n_layer": 70, "offset_alibi": 100, "pretraining_tp": 4,
        "slow_but_exact": False, "vocab_size": 250880},
    "gpt2": {  # openai-community/gpt2
        "model_type": "gpt2", "activation_function": "gelu_new", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "vocab_size": 50257},
}


def transformers_count(cfg: dict) -> int:
    cfg = dict(cfg)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    return sum(p.numel() for p in model.parameters())


CASES = [pytest.param({"model_type": t, **c}, id=f"{t}-{i}") for t, cs in SMALL.items() for i, c in enumerate(cs)]


def test_every_family_has_a_small_config():
    assert set(SMALL) == set(FAMILIES)


@pytest.mark.parametrize("cfg", CASES)
def test_small_configs_count_what_transformers_builds(cfg):
    assert model_from_hf_dict(cfg, "small").n_params == transformers_count(cfg)


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_real_configs_count_what_transformers_builds(name):
    ours = model_from_hf_dict(HUB_CONFIGS[name], name).n_params
    assert ours == HUB_PARAMS[name] == transformers_count(HUB_CONFIGS[name])


@pytest.mark.parametrize("name", sorted(OWN_CONFIGS))
def test_own_config_json_equals_the_catalogue(name):
    cfg = OWN_CONFIGS[name]
    assert model_from_hf_dict(cfg, name).n_params == load_model(name).n_params == transformers_count(cfg)


def test_catalogue_entries_from_cited_configs():
    for name, cfg in HUB_CONFIGS.items():
        assert CATALOGUE[name].n_params == HUB_PARAMS[name], name


@pytest.mark.parametrize("model_type", sorted(SMALL))
def test_which_families_keep_q_k_and_v_as_one_module(model_type):
    """advisor.adapters.HF_FUSED_QKV (the QLoRA host work counts a Linear4bit per module): the families whose
    modeling file keeps one fused projection, against the modules transformers builds, on the meta device."""
    from advisor.adapters import HF_FUSED_GATE_UP, HF_FUSED_QKV

    cfg = dict(SMALL[model_type][0])
    cfg.pop("architectures", None)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg))
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    apart = {"q_proj", "k_proj", "v_proj"} <= leaves
    latent = "kv_a_proj_with_mqa" in leaves  # multi-head latent attention: its own projections, none fused
    assert apart or latent or model_type in HF_FUSED_QKV
    assert not (apart and model_type in HF_FUSED_QKV)
    dense_mlp = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if ".mlp." in name and "expert" not in name}
    assert ("gate_up_proj" in dense_mlp) == (model_type in HF_FUSED_GATE_UP), sorted(dense_mlp)


def _transformers_config(cfg: dict):
    cfg = dict(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoConfig.for_model(cfg.pop("model_type"), **{k: v for k, v in cfg.items() if k != "architectures"})


@pytest.mark.parametrize("cfg", CASES + [pytest.param(c, id=n) for n, c in sorted(HUB_CONFIGS.items())])
def test_rope_base_scaling_and_norm_epsilon_are_transformers_own(cfg):
    """ModelSpec.rope_theta, rope_scaling and norm_eps (what the exports write: advisor.export.megatron_shape) equal
    what transformers' config class makes of the same config.json: the epsilon its modeling file reads
    (advisor.model.families._constants.NORM_EPS), rope_parameters' rope_theta (per layer type where nested: one base,
    or None where the model's layer types rotate with two) and rope_type; GPT-J's base is modeling_gptj.py's 10000."""
    from advisor.model.families._constants import NORM_EPS

    spec, t = model_from_hf_dict(cfg, "x"), _transformers_config(cfg)
    key, eps = NORM_EPS[cfg["model_type"]]
    assert spec.norm_eps == (getattr(t, key) if key else eps)
    if spec.position.value != "rotary":
        assert spec.rope_theta is None and spec.rope_scaling is None
        return
    if cfg["model_type"] == "gptj":
        assert spec.rope_theta == 10000.0 and spec.rope_scaling is None
        return
    params = t.rope_parameters
    types = set(getattr(t, "layer_types", None) or ()) & set(params)
    bases = {params[k]["rope_theta"] for k in types} or {params["rope_theta"]}
    assert spec.rope_theta == (bases.pop() if len(bases) == 1 else None)
    scaled = params.get("full_attention", params) if types else params
    kind = scaled.get("rope_type", "default")
    assert (spec.rope_scaling.kind if spec.rope_scaling else "default") == kind
    if kind != "default":
        assert spec.rope_scaling.factor == scaled.get("factor")


@pytest.mark.parametrize("change, message", [
    ({"rope_theta": "1e6"}, "'rope_theta' must be a finite number, not the string"),
    ({"rope_parameters": {"rope_theta": -1.0}}, "'rope_theta' must be positive"),
    ({"rms_norm_eps": True}, "'rms_norm_eps' must be a finite number, not true"),
    ({"rms_norm_eps": 0}, r"rms_norm_eps / layer_norm_eps .*\(norm_eps\)"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": "8"}}, "'rope_scaling.factor' must be a finite number"),
])
def test_rope_base_and_norm_epsilon_of_the_wrong_type_are_refused_in_one_line(change, message):
    from advisor.model import ModelError

    with pytest.raises(ModelError, match=message) as err:
        model_from_hf_dict({"model_type": "llama", **B, **change}, "x")
    assert "\n" not in str(err.value)
