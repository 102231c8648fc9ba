"""Mixture-of-experts families: the routed experts, top-k, the experts' width, shared experts, dense layers.

As transformers 5.23 builds them (modeling_*.py): Mixtral (num_local_experts SwiGLU experts of
intermediate_size, top num_experts_per_tok, a bias-free router; sliding_window on every layer where set),
Qwen2-MoE (moe_intermediate_size experts, one shared expert of shared_expert_intermediate_size with a sigmoid
gate h -> 1, qkv_bias; dense layers from mlp_only_layers and decoder_sparse_step), Qwen3-MoE (no shared expert,
q/k norms), OLMoE (q/k norms over the projections), DeepSeek-V2/V3 (multi-head latent attention; n_shared_experts
shared experts as one MLP of n_shared_experts x moe_intermediate_size; the first first_k_dense_replace layers
dense of intermediate_size), GPT-OSS (biases on every expert linear and on the router, attention_bias, one sink
logit per head, local and global layers alternating from a local first), Llama 4 (one shared expert of
intermediate_size beside the routed ones; the dense layers between MoE ones, where moe_layers or
interleave_moe_layer_step leaves some, of intermediate_size_mlp; chunked local attention on the RoPE layers, global
attention on the NoPE ones; its q/k norm is a weightless L2 norm), GLM-4.5 (glm4_moe: DeepSeek-V3's experts, shared
experts and dense first layers on GQA attention with biases on q, k, v, optional q/k norms over the head), MiniMax-M2
(num_local_experts experts of intermediate_size, q/k norms over the whole projections), PhiMoE (Mixtral's experts under
LayerNorms with biases, attention_bias on q, k, v and o, lm_head_bias), ERNIE 4.5 (DeepSeek-style shared experts
and dense layers outside moe_layer_start_index..moe_layer_end_index, use_bias on every linear but the experts, the
router's score-correction bias a parameter), Granite MoE (Mixtral-like; its shared variant adds one shared MLP),
dots.llm1 (dots1: DeepSeek-V3's experts on GQA attention with per-head q/k norms).
"""

from __future__ import annotations

from advisor.model.families._common import (attention_bias, dense_layers, llama_base, partial_rope, rope_layers,
                                             rotary_dim_share, runs, typed_windows)
from advisor.model.families._config import Config
from advisor.model.families.llama import qwen_windows
from advisor.model.spec import PositionKind, QKNorm
from advisor.model.layer import MLPKind, NormKind


def _experts(c: Config, n: int, k_default: int, d_ff: int, **extra) -> dict:
    """``n`` routed experts of width d_ff, top num_experts_per_tok (``k_default`` where absent); with no routed
    experts (n = 0, which Qwen-MoE allows) every layer is dense and the keys of the experts are not read."""
    k = c.int("num_experts_per_tok", default=k_default)
    return dict(n_experts=max(n, 1), experts_per_token=k if n else 1, d_ff_expert=d_ff, **extra)


def _sigmoid_router(c: Config, scale: float, norm: bool) -> dict:
    """DeepSeek-V3's router as GLM-4.5 and dots.llm1 keep it: sigmoid scores, e_score_correction_bias (a buffer) for
    the choice alone, norm_topk_prob, routed_scaling_factor (their config classes' defaults given)."""
    return dict(score="sigmoid", choice_bias=True, top_k_norm=c.bool("norm_topk_prob", norm),
                scale=_scale(c, scale))


def _scale(c: Config, default: float) -> float:
    """routed_scaling_factor: the routed experts' weights multiplied by it (DeepSeek's routers)."""
    s = c.float("routed_scaling_factor", default)
    if not 0.0 < s <= 1e4:
        raise c.error(f"'routed_scaling_factor' must be a positive factor on the routed experts' weights, not {s:g}")
    return s


def _with_runs(d: dict, spans: list, dense: list[bool], key: str = "window") -> dict:
    d["layer_runs"] = runs(spans, dense, key)
    if all(dense):  # no layer routes: a dense model
        d["experts"], d["layer_runs"] = None, runs(spans, key=key)
    return d


def mixtral(c: Config) -> dict:
    d = llama_base(c, kv=8, max_positions=4096 * 32)
    d["experts"] = _experts(c, c.int("num_local_experts", default=8), 2, d["d_ff"])
    return {**d, "layer_runs": runs([c.int("sliding_window", default=None)] * d["n_layers"])}


def qwen2_moe(c: Config) -> dict:
    d = llama_base(c, max_positions=32768)
    d.update(qkv_bias=c.bool("qkv_bias", True))
    n = c.int("num_experts", default=60, minimum=0)
    d["experts"] = _experts(c, n, 4, c.int("moe_intermediate_size", default=1408),
                            d_ff_shared=c.int("shared_expert_intermediate_size", default=5632, minimum=0), shared_gate=True,
                            top_k_norm=c.bool("norm_topk_prob", False))
    windows = [r["window"] for r in qwen_windows(c, d["n_layers"], moe=True) for _ in range(r["count"])]
    return _with_runs(d, windows or [None] * d["n_layers"], dense_layers(c, d["n_layers"], n > 0))


def qwen3_moe(c: Config) -> dict:
    d = llama_base(c, kv=4, max_positions=32768)
    n = c.int("num_experts", default=128, minimum=0)
    d.update(attention_bias(c), qk_norm=QKNorm.head)
    d["experts"] = _experts(c, n, 8, c.int("moe_intermediate_size", default=768), top_k_norm=c.bool("norm_topk_prob", False))
    window = c.nullable_int("sliding_window", 4096) if c.bool("use_sliding_window", False) else None
    return _with_runs(d, [window] * d["n_layers"], dense_layers(c, d["n_layers"], n > 0))


def olmoe(c: Config) -> dict:
    d = llama_base(c, max_positions=4096)
    d.update(attention_bias(c), qk_norm=QKNorm.full)
    d["experts"] = _experts(c, c.int("num_experts", default=64), 8, d["d_ff"], top_k_norm=c.bool("norm_topk_prob", False))
    return d


def _deepseek(c: Config, v3: bool) -> dict:
    """transformers modeling_deepseek_v2.py / _v3.py; defaults of their config classes."""
    bias = c.bool("attention_bias", False)
    freq = c.int("moe_layer_freq", default=1)
    c.expect("moe_layer_freq", freq, 1, "transformers' DeepSeek models route every layer after the dense ones")
    n = c.int("num_hidden_layers")
    first = c.int("first_k_dense_replace", default=3 if v3 else 0, minimum=0)
    top_k = c.int("num_experts_per_tok", default=8) if v3 else c.int("num_experts_per_tok")
    moe_ff = c.int("moe_intermediate_size", default=2048 if v3 else 1407)
    # group-limited routing: DeepseekV3TopkRouter always picks the top topk_group of n_group groups first, whatever
    # topk_method says (it reads none); DeepseekV2TopkRouter does under group_limited_greedy, and greedy ignores the
    # groups (its forward assigns no weights under any other method: refused)
    method = c.str("topk_method", default="noaux_tc" if v3 else "greedy",
                   allowed=("greedy", "group_limited_greedy", "noaux_tc") if v3 else ("greedy", "group_limited_greedy"))
    limited = v3 or method == "group_limited_greedy"
    groups = c.int("n_group", default=8 if v3 else 1) if limited else 1
    group_topk = c.int("topk_group", default=4 if v3 else 1) if limited else 1
    d = dict(n_layers=n, d_model=c.int("hidden_size"), n_heads=c.int("num_attention_heads"),
             d_ff=c.int("intermediate_size"), vocab=c.int("vocab_size"),
             max_positions=c.int("max_position_embeddings", default=4096 if v3 else 2048),
             mlp=MLPKind.swiglu, norm=NormKind.rmsnorm, position=PositionKind.rotary,
             tied_embeddings=c.bool("tie_word_embeddings", False), linear_bias=False, qkv_bias=bias, out_bias=bias,
             mlp_bias=False if v3 else c.bool("mlp_bias", False),
             latent=dict(q_lora_rank=c.nullable_int("q_lora_rank", 1536), kv_lora_rank=c.int("kv_lora_rank", default=512),
                         qk_nope_head_dim=c.int("qk_nope_head_dim", default=128, minimum=0),
                         qk_rope_head_dim=c.int("qk_rope_head_dim", default=64, minimum=0),
                         v_head_dim=c.int("v_head_dim", default=128)),
             experts=dict(n_experts=c.int("n_routed_experts", default=256 if v3 else 64), experts_per_token=top_k,
                          d_ff_expert=moe_ff, groups=groups, group_topk=group_topk, **_deepseek_router(c, v3),
                          d_ff_shared=moe_ff * c.int("n_shared_experts", default=1 if v3 else 2, minimum=0, null=False)))
    c.int("num_key_value_heads", default=None)  # MLA expands keys and values for every head: no parameters
    c.int("head_dim", default=None)
    return _with_runs(d, [None] * n, [i < first for i in range(n)])


def _deepseek_router(c: Config, v3: bool) -> dict:
    """V3 (DeepseekV3TopkRouter): sigmoid scores, e_score_correction_bias (a buffer) on them for the choice alone, the
    chosen renormalised where norm_topk_prob, times routed_scaling_factor. V2 (DeepseekV2Moe): softmax scores, the
    chosen never renormalised (5.23 reads norm_topk_prob into the config only), times routed_scaling_factor, groups
    ranked by their best expert."""
    if v3:
        return _sigmoid_router(c, 2.5, True)
    c.bool("norm_topk_prob", False)  # read, and ignored as DeepseekV2TopkRouter ignores it
    return dict(top_k_norm=False, scale=_scale(c, 1.0), group_score="max")


def deepseek_v2(c: Config) -> dict:
    return _deepseek(c, v3=False)


def deepseek_v3(c: Config) -> dict:
    return _deepseek(c, v3=True)


def gpt_oss(c: Config) -> dict:
    d = llama_base(c, kv=8, head_dim=64, max_positions=131072)
    k = c.int("num_experts_per_tok", default=4)
    if "experts_per_token" in c.raw:  # OpenAI's own key beside transformers': they must agree
        c.expect("experts_per_token", c.int("experts_per_token"), k, f"it must equal num_experts_per_tok ({k})")
    n, bias = d["n_layers"], c.bool("attention_bias", True)
    window = c.nullable_int("sliding_window", 128)
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    clamp = c.float("swiglu_limit", 7.0)  # GptOssConfig's default
    if clamp is not None and not 0.0 < clamp <= 1e6:
        raise c.error(f"'swiglu_limit' must be a positive clamp on the experts' GLU input, not {clamp:g}")
    d["experts"] = _experts(c, c.int("num_local_experts", default=128), 4, d["d_ff"], router_bias=True,
                            expert_bias=True, act_clamp=clamp, quick_glu=True)
    return {**d, "qkv_bias": bias, "out_bias": bias, "attention_sinks": True,
            "layer_runs": runs(typed_windows(c, n, window, default))}


LLAMA4_LAYER_TYPES = ("chunked_attention", "full_attention")


def llama4_text(c: Config) -> dict:
    """transformers modeling_llama4.py (Llama4TextConfig's defaults are Scout's): Llama4TextMoe is num_local_experts
    SwiGLU experts of intermediate_size (no biases) and one shared expert of the same width, its router a bias-free
    h -> experts linear; a layer not in ``moe_layers`` (default: every interleave_moe_layer_step-th, from the
    step's first) is a dense SwiGLU of intermediate_size_mlp. ``layer_types`` (default: chunked_attention where
    ``no_rope_layers`` is 1, full_attention where 0, and that default a NoPE layer every no_rope_layer_interval-th)
    picks each layer's mask: chunks of attention_chunk_size, or every earlier key. use_qk_norm's Llama4TextL2Norm
    has no weights, and the NoPE layers' attention temperature is element-wise: neither changes the parameters."""
    d = llama_base(c, kv=8, head_dim=128, max_positions=4096 * 32)
    n, ff = d["n_layers"], d["d_ff"]
    d.update(attention_bias(c), d_ff=c.int("intermediate_size_mlp", default=16384))
    d["qk_l2_norm"] = c.bool("use_qk_norm", True)
    experts = c.int("num_local_experts", default=16)
    # Llama4Router: sigmoid of the chosen logits, unnormalised; Llama4TextMoe scales the tokens before the experts
    d["experts"] = _experts(c, experts, 1, ff, d_ff_shared=ff, score="sigmoid", top_k_norm=False, weights_on_input=True)
    step = c.int("interleave_moe_layer_step", default=1)
    moe = c.list("moe_layers", int)
    moe = list(range(step - 1, n, step)) if moe is None else moe
    if any(not 0 <= i < n for i in moe):
        raise c.error(f"'moe_layers' holds {[i for i in moe if not 0 <= i < n][:3]}: layer indices run from 0 to {n - 1}")
    rope = rope_layers(c, n)
    types = c.list("layer_types", str, n) or ["chunked_attention" if r else "full_attention" for r in rope]
    for t in types:
        if t not in LLAMA4_LAYER_TYPES:
            raise c.error(f"'layer_types' holds {t[:40]!r}: a llama4_text model has {' and '.join(LLAMA4_LAYER_TYPES)} layers")
    chunk = c.nullable_int("attention_chunk_size", 8192)
    if chunk is None and "chunked_attention" in types:
        raise c.error("'layer_types' has chunked_attention layers but 'attention_chunk_size' is null")
    d["nope_layers"] = tuple(i for i, r in enumerate(rope) if not r)
    chunks = [chunk if t == "chunked_attention" else None for t in types]
    routed = set(moe)  # a set: a list made this quadratic in the layers (100,000 took a minute)
    return _with_runs(d, chunks, [i not in routed for i in range(n)], key="chunk")


def glm4_moe(c: Config) -> dict:
    """transformers modeling_glm4_moe.py: q/k/v biased by attention_bias, o never; Glm4MoeRMSNorm q/k norms of head_dim
    where use_qk_norm; layers from first_k_dense_replace on route to n_routed_experts of moe_intermediate_size beside
    n_shared_experts as one MLP; the router's e_score_correction_bias is a buffer; the num_nextn_predict_layers
    multi-token-prediction layers are not built (as DeepSeek-V3's)."""
    d = llama_base(c, kv=8, max_positions=131072)
    n, moe_ff = d["n_layers"], c.int("moe_intermediate_size", default=1408)
    d.update(qkv_bias=c.bool("attention_bias", False), qk_norm=QKNorm.head if c.bool("use_qk_norm", False) else QKNorm.none)
    d.update(partial_rope(c, 0.5))  # Glm4MoeConfig's default half of each head, its two halves rotated
    groups = c.int("n_group", default=1)
    d["experts"] = _experts(c, c.int("n_routed_experts", default=128), 8, moe_ff,
                            d_ff_shared=moe_ff * c.int("n_shared_experts", default=1, minimum=0, null=False), groups=groups,
                            group_topk=c.int("topk_group", default=1), **_sigmoid_router(c, 1.0, True))
    first = c.int("first_k_dense_replace", default=1, minimum=0)
    return _with_runs(d, [None] * n, [i < first for i in range(n)])


def minimax_m2(c: Config) -> dict:
    """transformers modeling_minimax_m2.py: MiniMaxM2Attention's q_norm and k_norm span all heads (RMSNorm of
    heads x head_dim), built whatever use_qk_norm says; every layer routes to num_local_experts experts of
    intermediate_size, no shared expert, a bias-free router (its e_score_correction_bias a buffer)."""
    d = llama_base(c, kv=8, head_dim=128, max_positions=196608)
    c.bool("use_qk_norm", True)
    d.update(qk_norm=QKNorm.full)
    # released checkpoints give rotary_dim (64 of head_dim 128), which MiniMaxM2Config turns into the factor where
    # neither rope_parameters nor the top level sets partial_rotary_factor (kwargs.setdefault)
    share = rotary_dim_share(c, d["head_dim"] or 128, None)
    d.update(partial_rope(c, 1.0 if share is None else share))
    d["experts"] = _experts(c, c.int("num_local_experts", default=256), 8, d["d_ff"], score="sigmoid", choice_bias=True)
    return d


def phimoe(c: Config) -> dict:
    """transformers modeling_phimoe.py: nn.LayerNorm (weight and bias) before attention, before the MoE and at the end;
    q, k, v and o biased by attention_bias; num_local_experts experts of intermediate_size, top num_experts_per_tok, a
    bias-free router; lm_head_bias; a sliding window on every layer where sliding_window is set."""
    d = llama_base(c, kv=8, max_positions=4096 * 32)
    d.update(attention_bias(c), norm=NormKind.layernorm, lm_head_bias=c.bool("lm_head_bias", False))
    d["experts"] = _experts(c, c.int("num_local_experts", default=16), 2, d["d_ff"], score="sparsemixer")
    return {**d, "layer_runs": runs([c.nullable_int("sliding_window", None)] * d["n_layers"])}


def ernie4_5_moe(c: Config) -> dict:
    """transformers modeling_ernie4_5_moe.py: use_bias on q, k, v, o, the dense and shared MLPs and the LM head (the
    experts have none); layers (index + 1) % moe_layer_interval == 0 within moe_layer_start_index..end route to
    moe_num_experts experts of moe_intermediate_size, top moe_k, beside moe_num_shared_experts as one MLP; the
    router's e_score_correction_bias is an nn.Parameter (one per expert, counted as a router bias)."""
    d = llama_base(c, kv=4, tied=True, max_positions=131072)
    n, bias = d["n_layers"], c.bool("use_bias", False)
    d.update(linear_bias=bias, lm_head_bias=bias)
    moe_ff, experts = c.int("moe_intermediate_size", default=1536), c.int("moe_num_experts", "num_experts", default=64)
    k = c.int("moe_k", "num_experts_per_tok", default=6)
    d["experts"] = dict(n_experts=experts, experts_per_token=k, d_ff_expert=moe_ff, router_bias=True, choice_bias=True,
                        d_ff_shared=moe_ff * c.int("moe_num_shared_experts", default=2, minimum=0))
    start, interval = c.int("moe_layer_start_index", default=1, minimum=0), c.int("moe_layer_interval", default=1)
    end = c.int("moe_layer_end_index", default=-1, minimum=-1)
    end = n - 1 if end == -1 else end
    return _with_runs(d, [None] * n, [not ((i + 1) % interval == 0 and start <= i <= end) for i in range(n)])


def granitemoe(c: Config) -> dict:
    """transformers modeling_granitemoe.py: Mixtral-like experts of intermediate_size (GraniteMoeParallelExperts, a
    bias-free router) under Granite's multipliers (no parameters); q, k, v and o biased by attention_bias; the shared
    variant (granitemoeshared) adds one shared MLP of shared_intermediate_size (0: none)."""
    d = llama_base(c, max_positions=2048)
    for key in ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"):
        c.float(key, None)
    d.update(attention_bias(c))
    shared = c.int("shared_intermediate_size", default=0, minimum=0) if c.family == "granitemoeshared" else 0
    d["experts"] = _experts(c, c.int("num_local_experts", default=8), 2, d["d_ff"], d_ff_shared=shared)
    return d


def dots1(c: Config) -> dict:
    """transformers modeling_dots1.py: q, k, v and o biased by attention_bias, per-head q/k RMSNorms; layers from
    first_k_dense_replace on route to n_routed_experts of moe_intermediate_size beside n_shared_experts as one MLP (the
    router's e_score_correction_bias a buffer); sliding windows from max_window_layers on (layer_types)."""
    d = llama_base(c, max_positions=2048)
    n, moe_ff = d["n_layers"], c.int("moe_intermediate_size", default=1408)
    d.update(attention_bias(c), qk_norm=QKNorm.head)
    d["experts"] = _experts(c, c.int("n_routed_experts"), 8, moe_ff, groups=c.int("n_group", default=1),
                            d_ff_shared=moe_ff * c.int("n_shared_experts", minimum=0), group_topk=c.int("topk_group", default=1),
                            **_sigmoid_router(c, 1.0, False))
    window, first_window = c.nullable_int("sliding_window", 4096), c.int("max_window_layers", default=62, minimum=0)
    default = ["sliding_attention" if window is not None and i >= first_window else "full_attention" for i in range(n)]
    first = c.int("first_k_dense_replace", default=0, minimum=0)
    return _with_runs(d, typed_windows(c, n, window, default), [i < first for i in range(n)])
