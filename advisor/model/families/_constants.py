"""What a family's config.json says beside the shape and that changes neither parameters nor cost, but that an export
must write or it trains another model: RoPE's base and scaling, and the norms' epsilon (ModelSpec.rope_theta,
rope_scaling, norm_eps), each as transformers 5.23 reads it, with its config class's default where absent."""

from __future__ import annotations

from typing import Optional

from advisor.model.families._config import Config
from advisor.model.spec import PositionKind

_RMS6, _RMS5 = ("rms_norm_eps", 1e-6), ("rms_norm_eps", 1e-5)
# The key each family's modeling_*.py reads its norms' epsilon from (eps=config.<key>), and its configuration_*.py
# default; OLMo's weightless LayerNorm has no key (modeling_olmo.py: eps=1e-5)
NORM_EPS: dict[str, tuple[Optional[str], float]] = {
    **dict.fromkeys(("gpt2", "gpt_bigcode", "gptj", "falcon", "mpt", "bloom"), ("layer_norm_epsilon", 1e-5)),
    **dict.fromkeys(("gpt_neox", "phi", "cohere", "cohere2"), ("layer_norm_eps", 1e-5)),
    "starcoder2": ("norm_epsilon", 1e-5), "olmo": (None, 1e-5), "glm4": ("rms_norm_eps", 1.5625e-7),
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "granite", "smollm3", "seed_oss", "gemma", "gemma2",
                     "gemma3_text", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "minimax_m2", "granitemoe",
                     "granitemoeshared", "dots1"), _RMS6),
    **dict.fromkeys(("phi3", "olmo2", "olmo3", "arcee", "exaone4", "mixtral", "olmoe", "gpt_oss", "llama4_text",
                     "glm4_moe", "phimoe", "ernie4_5_moe"), _RMS5),
}
# RoPE's base where a config class's default_theta is not RotaryEmbeddingConfigMixin's 10000 (modeling_rope_utils.py);
# Gemma 3's global layers (its local ones: rope_local_base_freq, 10000)
DEFAULT_THETA = {"olmo3": 5e5, "cohere": 5e5, "smollm3": 2e6, "mixtral": 1e6, "gpt_oss": 1.5e5, "llama4_text": 5e5,
                 "minimax_m2": 5e6, "phimoe": 1e6, "ernie4_5_moe": 5e5, "gemma3_text": 1e6}
FIXED_THETA = {"gptj": 10000.0}  # modeling_gptj.py create_sinusoidal_positions: 10000, no config key
LEGACY_THETA = {"gpt_neox": "rotary_emb_base"}  # configuration_gpt_neox.py: its top-level key, not rope_theta
# The rope types' numeric keys a RopeScaling keeps under the same names (modeling_rope_utils.py: linear and dynamic's
# factor, llama3's low and high frequency factors, YaRN's betas and mscales); longrope's factor lists are not kept
SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                "attention_factor")
LAYER_TYPES = ("full_attention", "sliding_attention")
# RoPE's scaling where a config class gives one without rope_parameters or rope_scaling (configuration_gpt_oss.py)
DEFAULT_SCALING = {"gpt_oss": {"kind": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                               "original_max_positions": 4096}}


def constants(c: Config, fields: dict) -> dict:
    """ModelSpec's rope_theta, rope_scaling and norm_eps for the adapter's ``fields``, read from ``c``."""
    key, eps = NORM_EPS.get(c.family, (None, None))
    out: dict = {"norm_eps": c.float(key, eps) if key else eps}
    if fields.get("position") is PositionKind.rotary:
        out.update(rope_theta=rope_theta(c, fields), rope_scaling=rope_scaling(c))
    return out


def _rope_parameters(c: Config) -> Config:
    """rope_parameters (transformers 5), else the legacy rope_scaling (as advisor.model.families._common reads YaRN)."""
    return c.sub("rope_parameters") if c.raw.get("rope_parameters") is not None else c.sub("rope_scaling")


def _nested(p: Config) -> bool:
    """rope_parameters given per layer type (OLMo 3's, Gemma 3's: {"full_attention": {...}, ...})."""
    return any(isinstance(p.raw.get(t), dict) for t in LAYER_TYPES)


def rope_theta(c: Config, fields: dict) -> Optional[float]:
    """RoPE's base as transformers 5.23's convert_rope_params_to_dict reads it: rope_parameters' rope_theta, else the
    top-level rope_theta (GPT-NeoX's rotary_emb_base), else the config class's default_theta. Where the layer types
    rotate with their own (OLMo 3, Gemma 3: rope_parameters per layer type, Gemma 3's rope_local_base_freq for its
    sliding layers), the one base of the model's layers, None where they differ."""
    if c.family in FIXED_THETA:
        return FIXED_THETA[c.family]
    default = DEFAULT_THETA.get(c.family, 10_000.0)
    top = c.float(LEGACY_THETA.get(c.family, "rope_theta"), None)
    p = c.sub("rope_parameters")
    if c.family not in ("olmo3", "gemma3_text"):
        inner = p.float("rope_theta", None) if not _nested(p) else None
        return _positive(c, inner if inner is not None else top if top is not None else default)
    # olmo3: the top-level key feeds the full-attention layers only (configuration_olmo3.py pops it once)
    local = c.float("rope_local_base_freq", None) if c.family == "gemma3_text" else None
    by_type = {"full_attention": top if top is not None else default,
               "sliding_attention": local if local is not None else DEFAULT_THETA["olmo3"] if c.family == "olmo3"
               else 10_000.0}
    for t in LAYER_TYPES:
        inner = p.sub(t).float("rope_theta", None) if _nested(p) else None
        by_type[t] = inner if inner is not None else by_type[t]
    used = {"sliding_attention" if r.get("window") else "full_attention" for r in fields.get("layer_runs") or ()}
    bases = {by_type[t] for t in used or {"full_attention"}}
    return _positive(c, bases.pop()) if len(bases) == 1 else None


def _positive(c: Config, theta: float) -> float:
    if theta <= 0:
        raise c.error(f"'rope_theta' must be positive, RoPE's base, not {theta:g}")
    return theta


def rope_scaling(c: Config) -> Optional[dict]:
    """RoPE's scaling (ModelSpec.rope_scaling) from rope_parameters or the legacy rope_scaling: its rope_type (the
    legacy "type"), None where "default" or absent (GPT-OSS: its config class's YaRN); per layer type, the
    full-attention layers' (OLMo 3 and Gemma 3 put a legacy rope_scaling there, their sliding layers unscaled)."""
    if c.raw.get("rope_parameters") is None and c.raw.get("rope_scaling") is None and c.family in DEFAULT_SCALING:
        return DEFAULT_SCALING[c.family]
    p = _rope_parameters(c)
    if _nested(p):
        p = p.sub("full_attention")
    kind = p.str("rope_type", "") or p.str("type", "")
    if kind in ("", "default"):
        return None
    out = {key: p.float(key, None) for key in SCALING_KEYS}
    out["original_max_positions"] = p.int("original_max_position_embeddings", default=None)
    out["truncate"] = p.bool("truncate", None)
    return {"kind": kind, **{k: v for k, v in out.items() if v is not None}}
