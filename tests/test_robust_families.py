"""Bad config.json files of the families advisor reads (advisor/model/families/) are refused in one line naming
the key and what is supported, exit 2; and a mixture-of-experts model, described exactly, is refused by estimate
and plan rather than costed as a dense one (issue 17).

Each bad config below was loaded wrong before the family adapters: BERT as a decoder, "n_embd": "64" as 100B
parameters, the string "false" as true, Mixtral as a dense 7.24B. Decision on booleans: only JSON true/false are
booleans; strings ("false", "true") and numbers (0, 1) are refused, as transformers' strict configs refuse them.
"""

from __future__ import annotations

import json

import pytest

from _robust import assert_one_line_error, run_main, tried
from advisor.api import estimate
from advisor.model import load_model, model_from_hf_config
from advisor.model.hub_configs import HUB_CONFIGS

LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
         "intermediate_size": 96, "vocab_size": 1000}
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}


def _with(base: dict, **changes) -> dict:
    return {**base, **changes}


BAD = [
    ({"model_type": "bert", "hidden_size": 768}, ["model_type 'bert' is an encoder", "not a decoder-only", "llama"]),
    ({"model_type": "t5", "d_model": 512}, ["model_type 't5' is an encoder-decoder", "gpt_oss"]),
    (_with(LLAMA, is_encoder_decoder=True), ["is an encoder-decoder"]),
    ({"model_type": "mamba", "hidden_size": 768}, ["model_type 'mamba' is not supported", "supported: arcee, bloom,", "qwen3_moe"]),
    ({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}}, ["'gemma3' is not supported", "multimodal",
                                                                               "gemma3_text"]),
    # transformers' CONFIG_MAPPING is lower-case with underscores: a model_type spelt otherwise is named as it spells it
    (_with(LLAMA, model_type="Llama"), ["model_type 'Llama' is not supported (did you mean 'llama'?"]),
    (_with(LLAMA, model_type="qwen2-moe"), ["model_type 'qwen2-moe' is not supported (did you mean 'qwen2_moe'?"]),
    ({key: v for key, v in LLAMA.items() if key != "model_type"}, ["lacks 'model_type'", "supported: "]),
    ({"model_type": 7}, ["'model_type' must be a string, not 7"]),
    (_with(GPT2, n_embd="64"), ["'n_embd' must be an integer, not the string '64'"]),  # was 100B parameters
    (_with(GPT2, tie_word_embeddings="false"), ["'tie_word_embeddings' must be true or false", "the string 'false'"]),
    (_with(GPT2, tie_word_embeddings="true"), ["'tie_word_embeddings' must be true or false"]),
    (_with(GPT2, tie_word_embeddings=0), ["'tie_word_embeddings' must be true or false (a JSON boolean), not 0"]),
    (_with(LLAMA, attention_bias="no"), ["'attention_bias' must be true or false"]),
    (_with(LLAMA, hidden_act="relu"), ["'hidden_act' = 'relu' is not supported for llama", "silu"]),
    (_with(LLAMA, num_experts=8), ["'num_experts' = 8 changes the model's parameters", "llama"]),  # was dense
    (_with(LLAMA, q_lora_rank=1536), ["'q_lora_rank' = 1536 changes the model's parameters"]),
    (_with(GPT2, add_cross_attention=True), ["'add_cross_attention' = true is not supported", "decoder-only"]),
    (_with(GPT2, num_key_value_heads=2), ["'num_key_value_heads' = 2 changes the model's parameters", "gpt2"]),
    ({**{k: v for k, v in LLAMA.items() if k != "hidden_size"}}, ["lacks 'hidden_size', which a llama model needs"]),
    (_with(LLAMA, model_type="mistral", sliding_window="4096"), ["'sliding_window' must be an integer"]),
    (_with(LLAMA, model_type="gemma2", layer_types=["full_attention"]), ["'layer_types' has 1 entries for 2 layers"]),
    (_with(LLAMA, model_type="gemma2", layer_types=["linear_attention", "full_attention"]),
     ["'layer_types' holds 'linear_attention'", "full_attention and sliding_attention"]),
    (_with(LLAMA, model_type="gemma3_text", use_bidirectional_attention=True), ["'use_bidirectional_attention' = true"]),
    (_with(LLAMA, model_type="gemma2", attn_logit_softcapping=-1.0), ["'attn_logit_softcapping' must be positive"]),
    ({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 1000, "expansion_ratio": 8},
     ["'expansion_ratio' = 8 is not supported", "a 4 x d_model MLP"]),
    ({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 1000,
      "attn_config": {"attn_type": "multiquery_attention"}}, ["'attn_config.attn_type' = the string 'multiquery_attention'"]),
    ({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 1000, "attn_config": [1]},
     ["'attn_config' must be a JSON object"]),
    (_with(HUB_CONFIGS["deepseek-v3"], moe_layer_freq=2), ["'moe_layer_freq' = 2 is not supported"]),
    (_with(HUB_CONFIGS["deepseek-v3"], q_lora_rank=0), ["'q_lora_rank' must be at least 1, got 0"]),
    (_with(HUB_CONFIGS["gpt-oss-120b"], experts_per_token=2), ["'experts_per_token' = 2 is not supported",
                                                                "num_experts_per_tok (4)"]),
    # a per-layer list of 10^20 entries was built before n_layers' bound was checked (OverflowError, or no end)
    (_with(HUB_CONFIGS["gemma-3-1b"], num_hidden_layers=10**20), ["'num_hidden_layers' must be at most 100,000"]),
    (_with(LLAMA, model_type="mistral", num_hidden_layers=10**9), ["'num_hidden_layers' must be at most 100,000"]),
    (_with(LLAMA, num_hidden_layers=int("9" * 400)), ["'num_hidden_layers' must be at most 100,000, got a number of 400"]),
    (_with(HUB_CONFIGS["gpt-oss-120b"], swiglu_limit=-7.0), ["'swiglu_limit' must be a positive clamp"]),
    (_with(HUB_CONFIGS["gpt-oss-120b"], swiglu_limit="7"), ["'swiglu_limit' must be a finite number"]),
    (_with(HUB_CONFIGS["mixtral-8x7b"], num_experts_per_tok=16), ["experts_per_token=16 exceeds n_experts=8"]),
    (_with(HUB_CONFIGS["qwen3-30b-a3b"], mlp_only_layers=["0"]), ["'mlp_only_layers' must be a list of integers"]),
    ({"model_type": "falcon", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
      "intermediate_size": 96}, ["'intermediate_size' = 96 changes the model's parameters", "falcon"]),  # ffn_hidden_size
    # Llama 4's repositories publish the multimodal config: the language model is its text_config
    ({"model_type": "llama4", "text_config": HUB_CONFIGS["llama4-scout"]},
     ["model_type 'llama4' is not supported (a multimodal config: its text_config, model_type 'llama4_text', is supported"]),
    ({"model_type": "llama4", "text_config": {"model_type": ["llama4_text"]}},
     ["model_type 'llama4' is not supported (a multimodal config: give its text model's config.json)"]),
    (_with(HUB_CONFIGS["llama4-scout"], attention_chunk_size="8192"), ["'attention_chunk_size' must be an integer"]),
    (_with(HUB_CONFIGS["llama4-scout"], no_rope_layers=[2] * 48), ["'no_rope_layers' must hold a 0 (NoPE) or 1 (RoPE)"]),
    # the router's weighing and the share of a head RoPE rotates (no parameters; another model in an export)
    (_with(HUB_CONFIGS["deepseek-v3"], routed_scaling_factor=-2.5), ["'routed_scaling_factor' must be a positive factor"]),
    (_with(HUB_CONFIGS["deepseek-v3"], routed_scaling_factor="2.5"), ["'routed_scaling_factor' must be a finite number"]),
    # transformers 5.23 modeling_deepseek_v3.py:212 multiplies moe_intermediate_size by it (v2 alike, :126): no default
    (_with(HUB_CONFIGS["deepseek-v3"], n_shared_experts=None), ["'n_shared_experts' must be an integer, not null"]),
    (_with(HUB_CONFIGS["glm-4.5-air"], norm_topk_prob="true"), ["'norm_topk_prob' must be true or false"]),
    (_with(HUB_CONFIGS["glm-4.5-air"], partial_rotary_factor=0), ["'partial_rotary_factor' must be in (0, 1]"]),
    (_with(HUB_CONFIGS["gpt-neox-20b"], rotary_pct=1.5), ["'partial_rotary_factor' (or 'rotary_pct') must be in (0, 1]"]),
    (_with(HUB_CONFIGS["minimax-m2"], rotary_dim=512), ["'rotary_dim' = 512 exceeds the head's width 128"]),
]


@pytest.mark.parametrize("cfg,needles", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_family_configs_are_one_line_exit_2(cfg, needles, tmp_path):
    tried("models")
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    assert_one_line_error(["estimate", "--model", str(f), "--hw", "dgx-a100"], str(f), *needles)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "deepseek-v2-lite"])
def test_moe_models_are_costed_as_moe(name):
    """Issue 17: once refused in one line, they are now costed with their experts (never a silently dense estimate):
    every parameter held, the active ones counted in the FLOPs, the routing said in the output."""
    tried("models", 2)
    m = load_model(name)
    assert m.routed and m.active_params < m.n_params
    code, out, err = run_main(["estimate", "--model", name, "--hw", "dgx-h100", "--gpus", "8", "--zero", "1"])
    assert code == 0, err
    assert f"{m.active_params / 1e9:.2f}B of {m.n_params / 1e9:.2f}B parameters active" in out
    assert "balanced routing" in out and "dropless" in out


def test_moe_costed_through_the_api_too(tmp_path):
    tried("models")
    f = tmp_path / "config.json"
    f.write_text(json.dumps(HUB_CONFIGS["mixtral-8x7b"]))
    assert model_from_hf_config(f).n_params == 46_702_792_704
    e = estimate(str(f), "dgx-h100", gpus=8, ep=8, zero=1, stack="megatron-deepspeed")
    assert e.params == 46_702_792_704 and e.layout.ep == 8 and "12.88B of 46.70B" in e.moe


def test_a_moe_config_with_every_layer_dense_is_a_dense_model(tmp_path):
    """Qwen2-MoE with num_experts 0 builds dense MLPs everywhere (transformers modeling_qwen2_moe.py): costed."""
    cfg = {"model_type": "qwen2_moe", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 96, "vocab_size": 1000, "num_experts": 0}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    m = model_from_hf_config(f)
    assert not m.routed and m.experts is None
    assert estimate(m, "dgx-a100", gpus=1, seq=128).step_time_s > 0


def test_router_and_rope_keys_are_read_as_transformers_reads_them():
    """transformers 5.23: Qwen3MoeTopKRouter renormalises the top k only where norm_topk_prob (its config's default
    false); DeepseekV3TopkRouter multiplies by routed_scaling_factor; rope_parameters' partial_rotary_factor wins over
    the legacy top-level key (Glm4MoeConfig: kwargs.setdefault); GPT-NeoX's rotary_pct defaults to 0.25."""
    from advisor.model.hf import model_from_hf_dict

    def spec(base: str, **changes):
        return model_from_hf_dict({**HUB_CONFIGS[base], **changes}, "t", "test")

    assert spec("qwen3-30b-a3b").experts.top_k_norm and not spec("qwen3-30b-a3b", norm_topk_prob=False).experts.top_k_norm
    assert not model_from_hf_dict({k: v for k, v in HUB_CONFIGS["qwen3-30b-a3b"].items() if k != "norm_topk_prob"},
                                  "t", "test").experts.top_k_norm
    assert spec("deepseek-v3", routed_scaling_factor=1.5).experts.scale == 1.5
    assert spec("glm-4.5-air", rope_parameters={"partial_rotary_factor": 0.25, "rope_theta": 1e6}).rotary_fraction == 0.25
    assert model_from_hf_dict({k: v for k, v in HUB_CONFIGS["gpt-neox-20b"].items() if k != "rotary_pct"},
                              "t", "test").rotary_fraction == 0.25
    # GPTNeoXConfig's convert_rope_params_to_dict reads rotary_pct, never a top-level partial_rotary_factor;
    # MiniMaxM2Config sets partial_rotary_factor from rotary_dim only where none is given (kwargs.setdefault)
    assert spec("gpt-neox-20b", partial_rotary_factor=0.5).rotary_fraction == 0.25
    assert spec("minimax-m2").rotary_fraction == 0.5 and spec("minimax-m2", partial_rotary_factor=1.0).rotary_fraction == 1.0
    # DeepseekV3TopkRouter groups whatever topk_method says; DeepseekV2TopkRouter assigns no weights under noaux_tc
    assert (spec("deepseek-v3", topk_method="greedy").experts.groups, spec("deepseek-v3").experts.group_topk) == (8, 4)
    with pytest.raises(Exception, match="'topk_method' = 'noaux_tc' is not supported for deepseek_v2"):
        spec("deepseek-v2-lite", topk_method="noaux_tc")
    # Llama4TextMoe scales the tokens by the router's sigmoid before the experts; its q/k L2 norms have no weights
    scout = load_model("llama4-scout")
    assert scout.experts.weights_on_input and scout.qk_l2_norm and not spec("llama4-scout", use_qk_norm=False).qk_l2_norm
