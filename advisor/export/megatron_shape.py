"""Megatron-LM's model-shape flags (megatron/training/arguments.py spelling): the architecture of a catalogue or
config.json model as pretrain_gpt.py's flags, and the features no flag here describes (a script without them would
train another model: the Megatron exports refuse those models). RoPE's base and scaling and the norms' epsilon, which
change neither parameters nor cost, are flags too (constant_flags), with a note where one is not known or not
written."""

from __future__ import annotations

from advisor.model import Experts, MLPKind, ModelSpec, NormKind, PositionKind, RopeScaling

MLA = "multi-head latent attention"


def quick_glu(model: ModelSpec) -> bool:
    """Whether the experts run GPT-OSS's quick-GELU GLU (advisor.model.spec Experts.quick_glu): Megatron's
    --quick-geglu, Bridge's activation_func quick_gelu, each with glu_linear_offset 1 (glu_fields)."""
    return model.experts is not None and model.experts.quick_glu


def unwritten(model: ModelSpec) -> list[str]:
    """The shape features of a config.json family that model_shape has no flag for (a script without them
    would train another model)."""
    # --qk-layernorm norms each head's query and key (megatron-core 0.19 attention.py: q_layernorm built with
    # hidden_size_per_attention_head), as Qwen3's q_norm / k_norm do; OLMo 2's norms over the whole width have no flag
    found = {"parallel attention + MLP blocks": model.parallel_block, "full-width q/k norms": model.qk_norm.value == "full",
             f"{model.norms_per_layer} norms per layer": model.norms_per_layer != 2,
             MLA: model.latent is not None,
             "shared experts with a gate": model.experts is not None and model.experts.shared_gate,
             "biases on the experts or the router": model.experts is not None and (
                 model.experts.expert_bias or model.experts.router_bias) and not every_linear_biased(model),
             "sliding windows of several sizes": len({r.window for r in model.layer_runs if r.window}) > 1,
             "chunked attention": any(r.chunk for r in model.layer_runs),
             "a GeGLU MLP": model.mlp is MLPKind.geglu,
             f"{model.norm.value} norms": model.norm not in (NormKind.layernorm, NormKind.rmsnorm),
             "biases on some linears only": (not model.linear_bias and (model.out_bias or model.mlp_bias)
                                             and not every_linear_biased(model)),
             "soft-capping": model.attn_softcap is not None or model.logit_softcap is not None,
             "an LM-head bias": model.lm_head_bias,
             # --quick-geglu sets every MLP's activation (argument_utils.py:323-326): experts only where no layer is dense
             "a quick-GELU GLU on the experts beside dense SwiGLU layers": (
                 quick_glu(model) and any(r.dense for r in model.layer_runs)),
             # --qk-l2-norm puts megatron-core's L2Norm on every layer's q and k (gpt_layer_specs.py)
             "L2 q/k norms on the RoPE layers alone": model.qk_l2_norm and bool(model.nope_layers),
             **({} if model.experts is None else router_unwritten(model.experts))}
    return [name for name, present in found.items() if present]


def every_linear_biased(model: ModelSpec) -> bool:
    """Whether every linear of every layer has a bias (the LM head aside), as Megatron's add_bias_linear, its default,
    builds them: q/k/v and the output projection, the router (moe/router.py:64) and each expert's two linears, the
    dense MLP's where a layer is dense (GPT-OSS: attention_bias, GptOssTopKRouter's and GptOssExperts' biases)."""
    if model.linear_bias:
        return True
    e = model.experts
    dense_mlp = model.mlp_bias or (e is not None and not any(r.dense for r in model.layer_runs))
    return (model.qkv_bias and model.out_bias and dense_mlp
            and (e is None or (e.expert_bias and e.router_bias)))


def router_unwritten(e: Experts) -> dict[str, bool]:
    """What megatron-core 0.19's router (moe_utils.py topk_routing_with_score_function, group_limited_topk) cannot
    weigh as the model does: its softmax takes the top k logits and renormalises them, or with --moe-router-pre-softmax
    keeps the chosen probabilities of all experts (k = 1 needs the latter: transformer_config.py); its sigmoid always
    renormalises k > 1 (with or without --moe-router-enable-expert-bias, which it refuses beside softmax); a group
    scores the sum of its top k / group_topk experts."""
    per_group = e.experts_per_token // e.group_topk
    return {"PhiMoE's sparsemixer routing": e.score == "sparsemixer",
            "a choice bias on softmax router scores": e.score == "softmax" and e.choice_bias,
            "top-1 softmax routing renormalised to 1": e.score == "softmax" and e.top_k_norm and e.experts_per_token == 1,
            "sigmoid router weights not renormalised": e.score == "sigmoid" and not e.top_k_norm and e.experts_per_token > 1,
            "sigmoid top-1 routing renormalised to 1": e.score == "sigmoid" and e.top_k_norm and e.experts_per_token == 1,
            "routing groups ranked by their best expert": e.groups > 1 and per_group != (1 if e.group_score == "max" else 2),
            # experts.py: moe_apply_probs_on_input "only works with moe_router_topk=1"
            "router weights on the expert input beyond top-1": e.weights_on_input and e.experts_per_token > 1}


def router_fields(e: Experts) -> dict:
    """The router's weighing as megatron-core's TransformerConfig fields, the defaults left out (router_unwritten()
    lists what they cannot say)."""
    m: dict = {}
    if e.score == "sigmoid":
        m.update(moe_router_score_function="sigmoid", **({"moe_router_enable_expert_bias": True} if e.choice_bias else {}))
    elif not e.top_k_norm:  # softmax over every expert, the chosen k kept as they are
        m["moe_router_pre_softmax"] = True
    m.update({"moe_apply_probs_on_input": True} if e.weights_on_input else {})
    return {**m, **({"moe_router_topk_scaling_factor": e.scale} if e.scale != 1.0 else {})}


def rope_fields(model: ModelSpec) -> dict:
    """Partial and interleaved RoPE and the weightless q/k L2 norm as TransformerConfig fields, the defaults left out
    (MLA's RoPE width is its own: --qk-pos-emb-head-dim)."""
    m: dict = {}
    if model.position is PositionKind.rotary and model.latent is None:
        m.update({"rotary_percent": model.rotary_fraction} if model.rotary_fraction != 1.0 else {},
                 **({"rotary_interleaved": True} if model.rotary_interleaved else {}))
    return {**m, **({"qk_l2_norm": True} if model.qk_l2_norm else {})}


def as_flags(fields: dict) -> list:
    """TransformerConfig fields as Megatron-LM's flags (arguments.py builds them from the dataclass: a true bool is
    the bare flag)."""
    return [x for k, v in fields.items() for x in (["--" + k.replace("_", "-")] + ([] if v is True else [v]))]


def router_flags(e: Experts) -> list:
    """router_fields() as Megatron-LM's flags."""
    return as_flags(router_fields(e))


def unwritten_by(model: ModelSpec, fmt: str) -> list[str]:
    """unwritten() for one Megatron format: Megatron-LM's flags write MLA (model_shape), Bridge's overrides do not."""
    return [f for f in unwritten(model) if not (f == MLA and fmt == "megatron")]


def model_shape(model: ModelSpec) -> list:
    """The architecture flags: layers, widths, heads and groups, MLP, norm, positions, biases, tying."""
    a: list = ["--num-layers", model.n_layers, "--hidden-size", model.d_model, "--ffn-hidden-size", model.d_ff,
               "--num-attention-heads", model.n_heads]
    if model.kv_heads != model.n_heads:
        a += ["--group-query-attention", "--num-query-groups", model.kv_heads]
    if model.head_dim is not None and model.head_dim * model.n_heads != model.d_model and model.latent is None:
        a += ["--kv-channels", model.head_dim]
    if model.latent is not None:  # MLATransformerConfig (megatron-core transformer_config.py); no --q-lora-rank: a full q
        x = model.latent
        a += ["--multi-latent-attention", "--kv-lora-rank", x.kv_lora_rank, "--qk-head-dim", x.qk_nope_head_dim,
              "--qk-pos-emb-head-dim", x.qk_rope_head_dim, "--v-head-dim", x.v_head_dim]
        a += ["--q-lora-rank", x.q_lora_rank] if x.q_lora_rank else []
    if model.qk_norm.value == "head":
        a.append("--qk-layernorm")
    a += mlp_flags(model)
    a += ["--normalization", "RMSNorm" if model.norm is NormKind.rmsnorm else "LayerNorm",
          "--position-embedding-type", position_type(model)]
    a += as_flags(rope_fields(model))
    if not every_linear_biased(model):
        a.append("--disable-bias-linear")
        if model.qkv_bias:
            a.append("--add-qkv-bias")
    if model.attention_sinks:  # a learned logit a head beside the keys (dot_product_attention.py:126, GPT-OSS's sinks)
        a += ["--softmax-type", "learnable"]
    a += window_flags(model)
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    return a


def glu_fields(model: ModelSpec) -> dict:
    """GPT-OSS's experts' GLU beyond its activation as TransformerConfig fields: glu_linear_offset 1 (experts.py:862-872:
    activation_func(x_glu) x (x_linear + glu_linear_offset)) and a clamp on the GLU input, activation_func_clamp_value
    (the same lines: the gate half clamped above, the linear half both ways, as GptOssExperts clamps them at
    swiglu_limit); the defaults left out."""
    e = model.experts
    m: dict = {"glu_linear_offset": 1.0} if quick_glu(model) else {}
    return {**m, **({} if e is None or e.act_clamp is None else {"activation_func_clamp_value": e.act_clamp})}


def mlp_flags(model: ModelSpec) -> list:
    """The MLP's activation: --swiglu (SiLU GLU), or GPT-OSS's experts' --quick-geglu (quick_gelu gated:
    argument_utils.py:323-326), with glu_fields() as flags."""
    a: list = ["--quick-geglu"] if quick_glu(model) else ["--swiglu"] if model.mlp is MLPKind.swiglu else []
    return a + as_flags(glu_fields(model))


def position_type(model: ModelSpec) -> str:
    """megatron-core's position_embedding_type: learned_absolute, rope, or yarn where a non-MLA model's YaRN has flags
    (_yarn_flags; MLA's YaRN rides its own fields under rope)."""
    if model.position is not PositionKind.rotary:
        return "learned_absolute"
    return "yarn" if _yarn_flags(model) else "rope"


def windows(model: ModelSpec) -> tuple[tuple[int, int] | None, list[int] | None]:
    """Sliding-window attention as megatron-core's TransformerConfig (transformer_config.py window_size,
    window_attn_skip_freq; utils.py is_layer_window_attention): a window of W keys, the query's own among them (Hugging
    Face's mask keeps keys with q - k < W), is Megatron's (W - 1, 0), as Megatron-Bridge's GPT-OSS bridge writes it;
    where some layers attend to every earlier key, a list with 1 for each windowed layer. (None, None) without
    windows or with several sizes (unwritten)."""
    per_layer = [r.window for r in model.layer_runs for _ in range(r.count)]
    sizes = {w for w in per_layer if w}
    if len(sizes) != 1:
        return None, None
    return (sizes.pop() - 1, 0), (None if all(per_layer) else [int(bool(w)) for w in per_layer])


def nope_pattern(model: ModelSpec) -> list[int] | None:
    """megatron-core's no_rope_freq (transformer_config.py; attention.py skips RoPE where it is 1): one entry a layer,
    1 where the model applies no rotary embedding; None where every layer has it."""
    return [int(i in model.nope_layers) for i in range(model.n_layers)] if model.nope_layers else None


def window_flags(model: ModelSpec) -> list:
    """windows() as Megatron-LM's --window-size and --window-attn-skip-freq (its tuple_type and moe_freq_type parse
    them)."""
    size, skip = windows(model)
    a = [] if size is None else ["--window-size", f"{size[0]},{size[1]}"]
    nope = nope_pattern(model)  # Megatron-LM's no_rope_freq_type evaluates a "[...]" pattern
    a += [] if nope is None else ["--no-rope-freq", "[" + ",".join(map(str, nope)) + "]"]
    return a + ([] if skip is None else ["--window-attn-skip-freq", "[" + ",".join(map(str, skip)) + "]"])


# megatron-core 0.19.2's Llama 3.1 scaling (rotary_pos_embedding.py RotaryEmbedding._apply_scaling): low_freq_factor 1,
# high_freq_factor 4 and original_max_position_embeddings 8192 fixed, its factor GPTModelConfig.rope_scaling_factor's
# 8.0 (megatron/training/models/gpt.py; argument_utils.py gpt_config_from_args passes --use-rope-scaling, not
# --rope-scaling-factor)
MEGATRON_LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_positions": 8192}


def constant_flags(model: ModelSpec) -> tuple[list, list[str]]:
    """RoPE's base and scaling and the norms' epsilon as Megatron-LM's flags (arguments.py: --rotary-base, type=int,
    default 10000, which GPTModel's RotaryEmbedding and MLATransformerConfig.rotary_base take; --norm-epsilon,
    TransformerConfig.layernorm_epsilon's flag, default 1e-5, every LayerNorm / RMSNorm), and a note for each value
    the model does not give (Megatron's default runs) or the flags cannot say."""
    a: list = []
    notes: list[str] = []
    if model.norm_eps is None:
        notes.append(f"{model.name}'s norm epsilon is not known here: Megatron's default --norm-epsilon 1e-5 runs; add "
                     "--norm-epsilon with the model's own")
    else:
        a += ["--norm-epsilon", repr(model.norm_eps)]
    if model.position is not PositionKind.rotary:
        return a, notes
    theta = model.rope_theta
    if theta is None:
        notes.append(f"{model.name}'s RoPE base is not known here (or not one value): Megatron's default --rotary-base "
                     "10000 runs; add --rotary-base with the model's rope_theta")
    elif theta != int(theta):
        notes.append(f"{model.name} rotates with base {theta:g}, which Megatron-LM's --rotary-base (an integer) cannot "
                     "take: the run's RoPE differs")
    else:
        a += ["--rotary-base", int(theta)]
    scaling, why = rope_scaling_flags(model)
    return a + scaling, notes + ([why] if why else [])


def rope_scaling_flags(model: ModelSpec) -> tuple[list, str]:
    """RoPE's scaling as Megatron-LM's flags, or why none are written (a note): Llama 3.1's as --use-rope-scaling where
    its parameters are megatron-core's fixed ones (MEGATRON_LLAMA3_SCALING); linear interpolation by a whole factor as
    --rotary-seq-len-interpolation-factor (type=int; RotaryEmbedding divides the positions by it); under MLA, YaRN as
    --rotary-scaling-factor, --mscale and --mscale-all-dim (the "mla" group; MLATransformerConfig's rope_type yarn,
    original_max_position_embeddings 4096, beta_fast 32, beta_slow 1 have no flag there)."""
    s: RopeScaling | None = model.rope_scaling
    if s is None:
        return [], ""
    mla = model.latent is not None
    if s.kind == "llama3" and not mla and all(getattr(s, k) == v for k, v in MEGATRON_LLAMA3_SCALING.items()):
        return ["--use-rope-scaling"], ""
    if s.kind == "linear" and not mla and s.factor is not None and s.factor == int(s.factor):
        return ["--rotary-seq-len-interpolation-factor", int(s.factor)], ""
    if s.kind == "yarn" and not mla and (yarn := _yarn_flags(model)):
        return yarn, ""
    if (s.kind == "yarn" and mla and s.factor is not None and s.original_max_positions == 4096
            and s.beta_fast in (None, 32.0) and s.beta_slow in (None, 1.0)
            and (s.mscale is None) == (s.mscale_all_dim is None)):
        # both mscales or neither: megatron-core's _yarn_get_concentration_factor and MLA's softmax scale then equal
        # transformers' (get_mscale(factor) where either is absent, which --mscale 1 and --mscale-all-dim 0 give)
        mscales = [] if s.mscale is None else ["--mscale", s.mscale, "--mscale-all-dim", s.mscale_all_dim]
        return ["--rotary-scaling-factor", s.factor, *mscales], ""
    told = ", ".join(f"{k} {v:g}" for k, v in s.model_dump(exclude_none=True).items() if k != "kind")
    return [], (f"{model.name} scales RoPE ({s.kind}: {told}), which the Megatron-LM flags advisor writes cannot say "
                "(megatron_shape.rope_scaling_flags): the run rotates unscaled")


def _yarn_flags(model: ModelSpec) -> list:
    """A non-MLA model's YaRN as Megatron-LM's flags (--position-embedding-type yarn: argument_utils.py
    _apply_yarn_config_from_args, defaults original 4096, betas 32 / 1, mscale 1, mscale_all_dim 0, rounded correction
    range), where they say what transformers computes: its factor (or max positions / the original context), no stated
    attention_factor (megatron-core's _yarn_get_concentration_factor has none), the mscales only where both are set
    (transformers takes their ratio then, else get_mscale(factor), which Megatron's defaults give); [] otherwise."""
    s = model.rope_scaling
    if s is None or s.kind != "yarn" or model.latent is not None or s.attention_factor is not None:
        return []
    original = s.original_max_positions or 4096
    factor = s.factor if s.factor is not None else model.max_positions / original
    a = ["--rotary-scaling-factor", factor, "--yarn-original-max-position-embeddings", original,
         "--yarn-beta-fast", s.beta_fast or 32.0, "--yarn-beta-slow", s.beta_slow or 1.0]
    a += ["--mscale", s.mscale, "--mscale-all-dim", s.mscale_all_dim] if s.mscale and s.mscale_all_dim else []
    return a + (["--no-yarn-correction-range-round-to-int"] if s.truncate is False else [])
