"""Dense descendants of Llama: a gated MLP, RMSNorm (or another norm), rotary positions, GQA.

Each adapter reads its family's keys with the defaults of its transformers 5.23 config class (configuration_*.py)
and describes what its modeling_*.py builds: Llama (attention_bias on q, k, v and o; mlp_bias), Mistral (a
sliding window on every layer, 4096 where the key is absent), Qwen2 (biases on q, k, v only; sliding windows
from max_window_layers on, when use_sliding_window), Qwen3 (q/k RMSNorms over the head dim, 128 by default),
Phi-3 (fused qkv and gate_up: the same parameters), OLMo (LayerNorms without parameters), OLMo 2 and 3 (norms after
attention and MLP only, q/k norms over the whole projections; OLMo 3 sliding windows), Granite (Llama with
scaling multipliers, no parameters), Cohere (a parallel block with one weight-only LayerNorm, optional q/k norms),
SmolLM3 (Llama with a NoPE layer every no_rope_layer_interval-th: RoPE has no parameters; sliding windows on the NoPE
layers when use_sliding_window), Seed-OSS (biases on q, k, v, and on o and the MLP where attention_out_bias and
mlp_bias say), Cohere 2 (Cohere's parallel block, sliding windows on three layers of four and RoPE on those only),
GLM-4 (Gemma 2's four norms a layer around GQA with q/k/v biases), Arcee (an ungated MLP, up and down around
ReLU^2), EXAONE 4 (norms after attention and MLP, per-head q/k norms, sliding windows on three layers of four and RoPE
on those only).
"""

from __future__ import annotations

from typing import Optional

from advisor.model.families._common import attention_bias, llama_base, partial_rope, rope_layers, runs, typed_windows
from advisor.model.families._config import Config
from advisor.model.layer import NormKind
from advisor.model.spec import QKNorm


def llama(c: Config) -> dict:
    return {**llama_base(c), **attention_bias(c), "mlp_bias": c.bool("mlp_bias", False)}


def granite(c: Config) -> dict:
    return llama(c)


def mistral(c: Config) -> dict:
    d = llama_base(c, kv=8, max_positions=4096 * 32)
    window = c.nullable_int("sliding_window", 4096)
    return {**d, "layer_runs": runs([window] * d["n_layers"])}


def qwen_windows(c: Config, n_layers: int, moe: bool = False) -> tuple[dict, ...]:
    """Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on attend over sliding_window keys
    (transformers configuration_qwen2.py); Qwen2-MoE puts the windows on the odd layers below max_window_layers."""
    use = c.bool("use_sliding_window", False)
    window = c.nullable_int("sliding_window", 4096)
    first = c.int("max_window_layers", default=28, minimum=0)
    if moe:
        default = ["sliding_attention" if use and (i + 1) % 2 and i < first else "full_attention" for i in range(n_layers)]
    else:
        default = ["sliding_attention" if use and window is not None and i >= first else "full_attention"
                   for i in range(n_layers)]
    return runs(typed_windows(c, n_layers, window if use else None, default) if use else [None] * n_layers)


def qwen2(c: Config) -> dict:
    d = llama_base(c, max_positions=32768)
    return {**d, "qkv_bias": True, "layer_runs": qwen_windows(c, d["n_layers"])}


def qwen3(c: Config) -> dict:
    d = llama_base(c, head_dim=128, max_positions=32768)
    return {**d, **attention_bias(c), "qk_norm": QKNorm.head, "layer_runs": qwen_windows(c, d["n_layers"])}


def phi3(c: Config) -> dict:
    d = llama_base(c, max_positions=4096)
    window = c.int("sliding_window", default=None)
    return {**d, "layer_runs": runs([window] * d["n_layers"]), **partial_rope(c, 1.0)}


def olmo(c: Config) -> dict:
    return {**llama_base(c), **attention_bias(c), "norm": NormKind.nonparametric}


def olmo2(c: Config) -> dict:
    return {**llama_base(c), **attention_bias(c), "qk_norm": QKNorm.full}


def olmo3(c: Config) -> dict:
    d = olmo2(c)
    n = d["n_layers"]
    window = c.nullable_int("sliding_window", 4096)
    # transformers configuration_olmo3.py: every fourth layer global, the others sliding
    default = ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]
    return {**d, "layer_runs": runs(typed_windows(c, n, window, default))}


def cohere(c: Config) -> dict:
    d = llama_base(c, tied=True, max_positions=8192)
    c.float("logit_scale", None)  # scales the logits: no parameters
    return {**d, **attention_bias(c), "norm": NormKind.layernorm_nobias, "parallel_block": True,
            "norms_per_layer": 1, "qk_norm": QKNorm.full if c.bool("use_qk_norm", False) else QKNorm.none}


def smollm3(c: Config) -> dict:
    """transformers configuration_smollm3.py: no_rope_layers (default a 0 every no_rope_layer_interval-th layer) only
    drops RoPE there; with use_sliding_window and a sliding_window, the NoPE layers are the sliding ones."""
    d = {**llama_base(c, kv=4, tied=True, max_positions=32768), **attention_bias(c), "mlp_bias": c.bool("mlp_bias", False)}
    n = d["n_layers"]
    rope = rope_layers(c, n)
    window = c.nullable_int("sliding_window", None)
    use = c.bool("use_sliding_window", False)
    default = ["sliding_attention" if use and window is not None and not r else "full_attention" for r in rope]
    types = typed_windows(c, n, window, default)
    return {**d, "layer_runs": runs([w if use else None for w in types]),
            "nope_layers": tuple(i for i, r in enumerate(rope) if not r)}


def seed_oss(c: Config) -> dict:
    d = llama_base(c, kv=8, head_dim=128, max_positions=524288)
    return {**d, "qkv_bias": c.bool("attention_bias", True), "out_bias": c.bool("attention_out_bias", False),
            "mlp_bias": c.bool("mlp_bias", False)}


def cohere2(c: Config) -> dict:
    """transformers modeling_cohere2.py: Cohere's parallel block and weight-only LayerNorm, tied embeddings; layer_types
    (default: every sliding_window_pattern-th layer full, the others sliding) picks the mask, and only the sliding
    layers apply RoPE (Cohere2Attention: ``if self.sliding_window is not None``)."""
    d = llama_base(c, tied=True, max_positions=8192)
    heads, hidden = d["n_heads"], d["d_model"]
    if d["head_dim"] is not None:  # Cohere2Config.__post_init__ overwrites it
        c.expect("head_dim", d["head_dim"], hidden // heads, f"Cohere2Config sets it to hidden_size / heads ({hidden // heads})")
        d["head_dim"] = None
    c.float("logit_scale", None)  # scales the logits: no parameters
    return {**d, **attention_bias(c), "norm": NormKind.layernorm_nobias, "parallel_block": True, "norms_per_layer": 1,
            **_sliding_with_global_nope(c, d["n_layers"], c.nullable_int("sliding_window", 4096))}


def glm4(c: Config) -> dict:
    """transformers modeling_glm4.py: input, post-attention, post-self-attention and post-MLP RMSNorms (four a layer),
    q/k/v biased by attention_bias, o never; gate and up fused (the same parameters)."""
    d = llama_base(c, kv=2, head_dim=128, max_positions=131072)
    # half of each head rotated (Glm4Config's default), in interleaved pairs (modeling_glm4.py rotate_half)
    return {**d, "qkv_bias": c.bool("attention_bias", True), "norms_per_layer": 4, **partial_rope(c, 0.5, interleaved=True)}


def arcee(c: Config) -> dict:
    """transformers modeling_arcee.py: up_proj, activation (relu2 by default), down_proj, no gate; attention_bias on
    q, k, v and o; mlp_bias."""
    d = llama_base(c, gate=False, max_positions=4096)
    c.str("hidden_act", "relu2")  # any activation: the same two linears
    return {**d, **attention_bias(c), "mlp_bias": c.bool("mlp_bias", False)}


def exaone4(c: Config) -> dict:
    """transformers modeling_exaone4.py: post-attention and post-feed-forward RMSNorms only (as OLMo 2), per-head q/k
    norms; with a sliding_window, layer_types (default: every sliding_window_pattern-th layer full) picks the mask
    and only the sliding layers apply RoPE ("global NoPE"); without one, every layer is full with RoPE."""
    d = llama_base(c, max_positions=2048)
    window = c.nullable_int("sliding_window", 4096)
    if window is None:
        return {**d, "qk_norm": QKNorm.head}
    return {**d, "qk_norm": QKNorm.head, **_sliding_with_global_nope(c, d["n_layers"], window)}


def _sliding_with_global_nope(c: Config, n: int, window: Optional[int]) -> dict:
    """Cohere 2's and EXAONE 4's layers: ``layer_types`` (default: every sliding_window_pattern-th layer full, the
    others sliding) picks each mask, and only the sliding layers apply RoPE: the full ones are NoPE."""
    pattern = c.int("sliding_window_pattern", default=4)
    default = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    windows = typed_windows(c, n, window, default)
    return {"layer_runs": runs(windows), "nope_layers": tuple(i for i, w in enumerate(windows) if w is None)}
