"""One adapter per config.json ``model_type``: it reads that family's keys, with the defaults of its transformers
config class, into a ModelSpec that describes what transformers' model builds (tests/test_hf_families.py counts
every family's parameters against transformers' own model on the meta device); RoPE's base and scaling and the norms'
epsilon, which the exports write, are read for every family alike (advisor.model.families._constants).

Refused, in one line naming the key: an unknown model_type (listing the supported ones), an encoder or an
encoder-decoder, a value of the wrong JSON type, a missing shape key, and any key that changes the parameters
where the family's adapter never read it (a Llama config with "num_experts": 8 would otherwise load as dense).
"""

from __future__ import annotations

import re

from typing import Any, Callable

from advisor.errors import format_validation_error
from advisor.model.families import gemma, gpt, llama, moe
from advisor.model.families._config import Config, _show
from advisor.model.families._constants import constants
from advisor.model.spec import ModelError, ModelSpec

FAMILIES: dict[str, Callable[[Config], dict]] = {
    "gpt2": gpt.gpt2, "gpt_bigcode": gpt.gpt_bigcode, "gptj": gpt.gptj, "gpt_neox": gpt.gpt_neox,
    "falcon": gpt.falcon, "mpt": gpt.mpt, "bloom": gpt.bloom, "phi": gpt.phi, "starcoder2": gpt.starcoder2,
    "llama": llama.llama, "mistral": llama.mistral, "qwen2": llama.qwen2, "qwen3": llama.qwen3, "phi3": llama.phi3,
    "olmo": llama.olmo, "olmo2": llama.olmo2, "olmo3": llama.olmo3, "granite": llama.granite, "cohere": llama.cohere,
    "smollm3": llama.smollm3, "seed_oss": llama.seed_oss, "cohere2": llama.cohere2, "glm4": llama.glm4,
    "arcee": llama.arcee, "exaone4": llama.exaone4,
    "gemma": gemma.gemma, "gemma2": gemma.gemma2, "gemma3_text": gemma.gemma3_text,
    "mixtral": moe.mixtral, "qwen2_moe": moe.qwen2_moe, "qwen3_moe": moe.qwen3_moe, "olmoe": moe.olmoe,
    "deepseek_v2": moe.deepseek_v2, "deepseek_v3": moe.deepseek_v3, "gpt_oss": moe.gpt_oss,
    "llama4_text": moe.llama4_text, "glm4_moe": moe.glm4_moe, "minimax_m2": moe.minimax_m2, "phimoe": moe.phimoe,
    "ernie4_5_moe": moe.ernie4_5_moe, "granitemoe": moe.granitemoe, "granitemoeshared": moe.granitemoe, "dots1": moe.dots1,
}

ENCODERS = {"bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2", "camembert",
            "mpnet", "modernbert", "ernie", "nomic_bert", "roformer", "megatron-bert", "esm", "funnel", "longformer",
            "big_bird", "mobilebert", "squeezebert", "convbert", "xlm", "flaubert", "rembert", "luke", "ibert"}
ENCODER_DECODERS = {"t5", "mt5", "umt5", "longt5", "bart", "mbart", "pegasus", "pegasus_x", "marian", "blenderbot",
                    "blenderbot-small", "m2m_100", "nllb-moe", "fsmt", "prophetnet", "led", "plbart", "whisper",
                    "switch_transformers", "encoder-decoder", "t5gemma", "bigbird_pegasus", "mvp"}

# Keys that change a model's parameters in some family. Set (not null, false, 0 or empty) in a config whose
# family's adapter never read them, they describe weights that adapter would leave out: refused.
CHANGES_PARAMETERS = (
    "num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "n_shared_experts",
    "shared_expert_intermediate_size", "num_experts_per_tok", "experts_per_token", "q_lora_rank", "kv_lora_rank",
    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "add_cross_attention", "is_encoder_decoder",
    "qk_layernorm", "use_qk_norm", "qk_norm", "attention_bias", "mlp_bias", "qkv_bias", "use_bias", "bias",
    "parallel_attn", "use_parallel_residual", "new_decoder_architecture", "num_ln_in_parallel_attn", "head_dim",
    "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query", "n_inner", "ffn_hidden_size",
    "intermediate_size", "intermediate_size_mlp", "moe_layers", "interleave_moe_layer_step", "text_config",
    "vision_config", "audio_config", "attn_config",
)


def supported() -> str:
    return ", ".join(sorted(FAMILIES))


def spec_from_config(cfg: dict, name: str, origin: str) -> ModelSpec:
    """The ModelSpec a config.json object describes (the module docstring says what is refused)."""
    mtype = cfg.get("model_type")
    if mtype is None:
        raise ModelError(f"{origin}: config.json lacks 'model_type', which names the model's family "
                         f"(supported: {supported()})")
    if not isinstance(mtype, str):
        raise ModelError(f"{origin}: 'model_type' must be a string, not {_show(mtype)}")
    _decoder_only(cfg, mtype, origin)
    adapter = FAMILIES.get(mtype)
    if adapter is None:
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
        inner = text.get("model_type") if text is not None else None
        hint = "" if text is None else " (a multimodal config: give its text model's config.json)"
        spelt = mtype.strip().lower().replace("-", "_")
        if text is None and spelt in FAMILIES:  # transformers' CONFIG_MAPPING keys are lower-case, with underscores
            hint = f" (did you mean {spelt!r}? transformers spells model_type so)"
        if isinstance(inner, str) and inner in FAMILIES:  # Llama 4's repositories: the language model is text_config
            hint = (f" (a multimodal config: its text_config, model_type {inner!r}, is supported: save that object as "
                    "a config.json of its own to cost the language model)")
        raise ModelError(f"{origin}: model_type {mtype[:60]!r} is not supported{hint}; supported: {supported()}")
    c = Config(cfg, origin, mtype)
    fields = adapter(c)
    fields.update(constants(c, fields))  # RoPE's base and scaling, the norms' epsilon: what an export must write
    check_unread(c)
    try:
        return ModelSpec(name=name, family=mtype, **fields)
    except Exception as exc:  # pydantic's validation of the values read, named by the config keys they came from
        text = format_validation_error(exc)
        for field, key in CONFIG_KEYS.items():
            text = re.sub(rf"(^|; ){field}: ", rf"\g<1>{key} ({field}): ", text)
        raise ModelError(f"{origin}: {text}") from None


# ModelSpec's fields as config.json names them (the Llama-style key first; GPT-2's and others' own besides)
CONFIG_KEYS = {"vocab": "vocab_size", "d_model": "hidden_size / n_embd", "n_layers": "num_hidden_layers / n_layer",
               "n_heads": "num_attention_heads / n_head", "n_kv_heads": "num_key_value_heads",
               "d_ff": "intermediate_size / n_inner / ffn_hidden_size", "max_positions": "max_position_embeddings / n_positions",
               "head_dim": "head_dim", "norm_eps": "rms_norm_eps / layer_norm_eps / layer_norm_epsilon / norm_epsilon",
               "rope_theta": "rope_theta", "rope_scaling": "rope_parameters / rope_scaling"}


def _decoder_only(cfg: dict, mtype: str, origin: str) -> None:
    if mtype in ENCODERS:
        raise ModelError(f"{origin}: model_type {mtype!r} is an encoder (a masked language model), not a "
                         f"decoder-only language model; advisor costs decoder-only models ({supported()})")
    if mtype in ENCODER_DECODERS or cfg.get("is_encoder_decoder") is True:
        raise ModelError(f"{origin}: model_type {mtype[:60]!r} is an encoder-decoder, not a decoder-only language "
                         f"model; advisor costs decoder-only models ({supported()})")


def _set(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def check_unread(c: Config) -> None:
    """Refuse a key that changes the parameters in some family and that this family's adapter did not read."""
    for key in CHANGES_PARAMETERS:
        if key in c.raw and key not in c.read and _set(c.raw[key]):
            raise c.error(f"{key!r} = {_show(c.raw[key])} changes the model's parameters, and a {c.family} model "
                          f"as transformers builds it has no such weights: remove the key, or check model_type")
