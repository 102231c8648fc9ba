"""The config.json of well-known models as their Hugging Face repositories publish them (the repository is the
key's comment), read by the catalogue (advisor.model.catalogue) through the same adapters as any config.json, and
counted against transformers' own model in tests/test_hf_families.py.

Left out of each: keys that change neither the parameters nor the cost and that no export writes (token ids, dtype,
initializer range, dropout, transformers_version, auto_map), and the weights' quantization_config (DeepSeek-V3's fp8,
GPT-OSS's mxfp4 blocks: the parameters are the same; transformers would try to quantize on loading). Kept, though
they change neither: RoPE's base (rope_theta, Gemma 3's rope_local_base_freq; absent where the published config has
none: Falcon-7B, MPT's ALiBi), the norms' epsilon and RoPE's scaling, which the exports write
(advisor.export.megatron_shape; ModelSpec.rope_theta, norm_eps, rope_scaling). Not copied: Phi-3.5-MoE's longrope
scaling (two lists of per-dimension factors) and Llama 4's rope_scaling; no Megatron export writes those models.
Llama 4's repositories publish a multimodal config.json (model_type llama4): its ``text_config``, the language model, is
what is kept here (the vision tower and projector are not a decoder-only model's).
"""

from __future__ import annotations

_GPT_OSS_TYPES = ["sliding_attention", "full_attention"] * 18
_DEEPSEEK_V3_YARN = {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"}
# what Llama 4 Scout's and Maverick's text_config share
_LLAMA4_TEXT = {
    "model_type": "llama4_text", "attention_bias": False, "attention_chunk_size": 8192, "attn_scale": 0.1,
    "attn_temperature_tuning": True, "floor_scale": 8192, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
    "intermediate_size": 8192, "intermediate_size_mlp": 16384, "no_rope_layers": [], "num_attention_heads": 40,
    "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0, "tie_word_embeddings": False,
    "vocab_size": 202048}

HUB_CONFIGS: dict[str, dict] = {
    "mistral-7b": {  # mistralai/Mistral-7B-v0.1
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "sliding_window": 4096,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 32000},
    "mixtral-8x7b": {  # mistralai/Mixtral-8x7B-v0.1
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "num_attention_heads": 32,
        "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
        "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1e6, "router_aux_loss_coef": 0.02,
        "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000},
    "qwen2.5-7b": {  # Qwen/Qwen2.5-7B
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "hidden_size": 3584,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "use_sliding_window": False,
        "vocab_size": 152064},
    "qwen3-8b": {  # Qwen/Qwen3-8B
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "max_window_layers": 36, "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "vocab_size": 151936},
    "qwen3-30b-a3b": {  # Qwen/Qwen3-30B-A3B
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
        "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "vocab_size": 151936},
    "gemma-2-9b": {  # google/gemma-2-9b
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584,
        "intermediate_size": 14336, "max_position_embeddings": 8192, "num_attention_heads": 16,
        "num_hidden_layers": 42, "num_key_value_heads": 8, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0, "sliding_window": 4096, "sliding_window_size": 4096, "vocab_size": 256000},
    "gemma-3-1b": {  # google/gemma-3-1b-pt
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": False,
        "attn_logit_softcapping": None, "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
        "max_position_embeddings": 32768, "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6, "vocab_size": 262144},
    "phi-3-mini": {  # microsoft/Phi-3-mini-4k-instruct
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "hidden_size": 3072,
        "intermediate_size": 8192, "max_position_embeddings": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 2047,
        "tie_word_embeddings": False, "vocab_size": 32064},
    "olmo-2-7b": {  # allenai/OLMo-2-1124-7B
        "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "attention_bias": False, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-06, "rope_theta": 500000,
        "tie_word_embeddings": False, "vocab_size": 100352},
    "falcon-7b": {  # tiiuae/falcon-7b
        "architectures": ["FalconForCausalLM"], "model_type": "falcon", "alibi": False,
        "apply_residual_connection_post_layernorm": False, "bias": False, "hidden_size": 4544,
        "layer_norm_epsilon": 1e-05, "multi_query": True, "new_decoder_architecture": False,
        "num_attention_heads": 71, "num_hidden_layers": 32, "parallel_attn": True, "vocab_size": 65024},
    "gpt-neox-20b": {  # EleutherAI/gpt-neox-20b
        "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_act": "gelu_fast",
        "hidden_size": 6144, "intermediate_size": 24576, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "num_attention_heads": 64, "num_hidden_layers": 44, "rotary_emb_base": 10000, "rotary_pct": 0.25,
        "tie_word_embeddings": False, "use_parallel_residual": True, "vocab_size": 50432},
    "mpt-7b": {  # mosaicml/mpt-7b
        "architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096, "expansion_ratio": 4,
        "attn_config": {"alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0,
                        "attn_type": "multihead_attention", "attn_uses_sequence_id": False, "clip_qkv": None,
                        "prefix_lm": False, "qk_ln": False, "softmax_scale": None},
        "learned_pos_emb": True, "max_seq_len": 2048, "n_heads": 32, "n_layers": 32, "no_bias": True,
        "norm_type": "low_precision_layernorm", "vocab_size": 50432},
    "deepseek-v2-lite": {  # deepseek-ai/DeepSeek-V2-Lite
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "attention_bias": False,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
        "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
        "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
        "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400},
    "deepseek-v3": {  # deepseek-ai/DeepSeek-V3
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
        "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06, "rope_scaling": _DEEPSEEK_V3_YARN, "rope_theta": 10000, "routed_scaling_factor": 2.5,
        "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "v_head_dim": 128,
        "vocab_size": 129280},
    "gpt-oss-120b": {  # openai/gpt-oss-120b
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
        "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "intermediate_size": 2880, "layer_types": _GPT_OSS_TYPES,
        "max_position_embeddings": 131072, "num_attention_heads": 64, "num_experts_per_tok": 4,
        "num_hidden_layers": 36, "num_key_value_heads": 8, "num_local_experts": 128, "rms_norm_eps": 1e-05,
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": False, "vocab_size": 201088,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                         "rope_type": "yarn", "truncate": False}},
    # meta-llama/Llama-4-Scout-17B-16E and Llama-4-Maverick-17B-128E, config.json text_config: one shape, 16 or 128
    # experts, every layer or every second one MoE, q/k norms or none, the context they publish
    "llama4-scout": {**_LLAMA4_TEXT, "interleave_moe_layer_step": 1, "max_position_embeddings": 10485760,
                     "num_local_experts": 16, "use_qk_norm": True},
    "llama4-maverick": {**_LLAMA4_TEXT, "interleave_moe_layer_step": 2, "max_position_embeddings": 1048576,
                        "num_local_experts": 128, "use_qk_norm": False},
    "glm-4.5-air": {  # zai-org/GLM-4.5-Air (106B total, 12B active: its model card)
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
        "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 10944, "max_position_embeddings": 131072, "moe_intermediate_size": 1408,
        "n_group": 1, "n_routed_experts": 128, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 96, "num_experts_per_tok": 8, "num_hidden_layers": 46, "num_key_value_heads": 8,
        "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 1000000,
        "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "use_qk_norm": False,
        "vocab_size": 151552},
    "minimax-m2": {  # MiniMaxAI/MiniMax-M2 (230B total, 10B active: its model card)
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "head_dim": 128, "hidden_act": "silu",
        "hidden_size": 3072, "intermediate_size": 1536, "max_position_embeddings": 196608, "num_attention_heads": 48,
        "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8, "num_local_experts": 256,
        "rms_norm_eps": 1e-06, "rotary_dim": 64, "rope_theta": 5000000, "tie_word_embeddings": False,
        "use_qk_norm": True, "vocab_size": 200064},
    "smollm3-3b": {  # HuggingFaceTB/SmolLM3-3B
        "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "attention_bias": False,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 65536,
        "mlp_bias": False, "no_rope_layer_interval": 4, "num_attention_heads": 16, "num_hidden_layers": 36,
        "num_key_value_heads": 4, "pad_token_id": 128004, "rms_norm_eps": 1e-06, "rope_theta": 5000000.0,
        "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 128256},
    "phi-3.5-moe": {  # microsoft/Phi-3.5-MoE-instruct (42B total, 6.6B active: its model card)
        "architectures": ["PhimoeForCausalLM"], "model_type": "phimoe", "attention_bias": True, "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 6400, "lm_head_bias": True, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "num_local_experts": 16, "rms_norm_eps": 1e-05, "sliding_window": None, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "vocab_size": 32064},
    "ernie-4.5-21b-a3b": {  # baidu/ERNIE-4.5-21B-A3B-PT (21B total, 3B active: its model card)
        "architectures": ["Ernie4_5_MoeForCausalLM"], "model_type": "ernie4_5_moe", "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072,
        "moe_intermediate_size": 1536, "moe_k": 6, "moe_layer_end_index": 27, "moe_layer_interval": 1,
        "moe_layer_start_index": 1, "moe_num_experts": 64, "moe_num_shared_experts": 2, "num_attention_heads": 20,
        "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-05, "rope_theta": 500000,
        "tie_word_embeddings": True, "use_bias": False, "vocab_size": 103424},
    "glm-4-9b": {  # zai-org/GLM-4-9B-0414
        "architectures": ["Glm4ForCausalLM"], "model_type": "glm4", "attention_bias": True, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 13696, "max_position_embeddings": 32768,
        "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False, "vocab_size": 151552},
    "qwen3-235b-a22b": {  # Qwen/Qwen3-235B-A22B
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960,
        "max_window_layers": 94, "mlp_only_layers": [], "moe_intermediate_size": 1536, "norm_topk_prob": True,
        "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "tie_word_embeddings": False, "use_sliding_window": False,
        "vocab_size": 151936, "decoder_sparse_step": 1, "rope_theta": 1000000.0},
    "kimi-k2": {  # moonshotai/Kimi-K2-Instruct (DeepSeek-V3's architecture)
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 131072, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
        "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 64,
        "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 64, "q_lora_rank": 1536,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 50000.0, "routed_scaling_factor": 2.827,
        "tie_word_embeddings": False, "topk_group": 1, "v_head_dim": 128, "vocab_size": 163840},
}
