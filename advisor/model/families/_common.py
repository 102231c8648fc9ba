"""What several families' adapters share: the Llama-style keys, the gated MLP's activation, layer runs (which
layers attend over a sliding window, which are dense) and the experts' keys."""

from __future__ import annotations

from typing import Optional

from advisor.model.families._config import Config
from advisor.model.layer import MLPKind, NormKind
from advisor.model.spec import PositionKind

GATED = {"silu": MLPKind.swiglu, "swish": MLPKind.swiglu, "gelu": MLPKind.geglu, "gelu_new": MLPKind.geglu,
         "gelu_pytorch_tanh": MLPKind.geglu, "gelu_fast": MLPKind.geglu, "gelu_python": MLPKind.geglu}
LAYER_TYPES = ("full_attention", "sliding_attention")


def gated(c: Config, key: str = "hidden_act", default: str = "silu") -> MLPKind:
    """The gated MLP's kind from its activation: SiLU gates (SwiGLU) or GELU gates (GeGLU)."""
    return GATED[c.str(key, default, tuple(GATED))]


def llama_base(c: Config, *, kv: Optional[int] = None, head_dim: Optional[int] = None, tied: bool = False,
               max_positions: int = 2048, act_key: str = "hidden_act", act: str = "silu", gate: bool = True) -> dict:
    """The keys Llama's config.json and its descendants share: a gated MLP, RMSNorm, rotary positions, no biases.
    ``kv`` and ``head_dim`` are the family's defaults where the keys are absent (None: the head count, and
    hidden_size / heads); ``gate=False``: an up and a down projection around any activation (Arcee)."""
    heads = c.int("num_attention_heads")
    return dict(
        n_layers=c.int("num_hidden_layers"), d_model=c.int("hidden_size"), n_heads=heads,
        n_kv_heads=c.int("num_key_value_heads", default=kv or heads), head_dim=c.int("head_dim", default=head_dim),
        d_ff=c.int("intermediate_size"), vocab=c.int("vocab_size"),
        max_positions=c.int("max_position_embeddings", default=max_positions),
        mlp=gated(c, act_key, act) if gate else MLPKind.gelu, norm=NormKind.rmsnorm, position=PositionKind.rotary,
        tied_embeddings=c.bool("tie_word_embeddings", tied), linear_bias=False)


def partial_rope(c: Config, default: float, legacy: str = "partial_rotary_factor", interleaved: bool = False) -> dict:
    """The share of each head that RoPE rotates, as transformers 5.23's configs read it: rope_parameters'
    partial_rotary_factor, else the family's top-level key (``legacy``: partial_rotary_factor, GPT-NeoX's rotary_pct,
    whose config reads no other: convert_rope_params_to_dict), else its default; a number in (0, 1].
    ``interleaved``: the family rotates interleaved pairs (RoFormer's, GLM-4's)."""
    inner = c.sub("rope_parameters").float("partial_rotary_factor", None)
    top = c.float(legacy, None)
    if legacy != "partial_rotary_factor":
        c.float("partial_rotary_factor", None)  # read, and ignored as the family's config ignores it
    share = inner if inner is not None else top if top is not None else default
    if not 0.0 < share <= 1.0:
        keys = "'partial_rotary_factor'" + (f" (or {legacy!r})" if legacy != "partial_rotary_factor" else "")
        raise c.error(f"{keys} must be in (0, 1], the share of a head RoPE rotates, not {share:g}")
    return dict(rotary_fraction=share, rotary_interleaved=interleaved)


def rotary_dim_share(c: Config, head_dim: int, default: Optional[int]) -> Optional[float]:
    """``rotary_dim`` (GPT-J's, MiniMax-M2's legacy key) as a share of the head: None where absent and no default;
    refused above the head's width, which RoPE cannot rotate."""
    dim = c.int("rotary_dim", default=default)
    if dim is not None and dim > head_dim:
        raise c.error(f"'rotary_dim' = {dim} exceeds the head's width {head_dim}: RoPE rotates part of a head at most")
    return None if dim is None else dim / head_dim


def attention_bias(c: Config, default: bool = False) -> dict:
    """Llama's ``attention_bias``: biases on q, k, v and o."""
    bias = c.bool("attention_bias", default)
    return dict(qkv_bias=bias, out_bias=bias)


def runs(spans: list[Optional[int]], dense: Optional[list[bool]] = None, key: str = "window") -> tuple[dict, ...]:
    """Per-layer attention spans (sliding windows; ``key="chunk"``: Llama 4's chunks; None: every earlier key) and
    dense flags as runs of alike consecutive layers; () where every layer is global and none is dense, the ModelSpec
    default."""
    dense = dense or [False] * len(spans)
    if all(w is None for w in spans) and not any(dense):
        return ()
    out: list[dict] = []
    for w, d in zip(spans, dense):
        if out and out[-1][key] == w and out[-1]["dense"] == d:
            out[-1]["count"] += 1
        else:
            out.append({"count": 1, key: w, "dense": d})
    return tuple(out)


def rope_layers(c: Config, n_layers: int) -> list[int]:
    """Llama 4's and SmolLM3's ``no_rope_layers``: 1 where a layer applies RoPE, 0 where it does not (NoPE); absent
    or empty, a NoPE layer every no_rope_layer_interval-th (transformers' configuration_llama4.py / _smollm3.py)."""
    interval = c.int("no_rope_layer_interval", default=4)
    rope = c.list("no_rope_layers", int) or [int((i + 1) % interval != 0) for i in range(n_layers)]
    if len(rope) != n_layers or any(r not in (0, 1) for r in rope):
        raise c.error(f"'no_rope_layers' must hold a 0 (NoPE) or 1 (RoPE) for each of the {n_layers} layers, not "
                      f"{rope[:4]}...")
    return rope


def typed_windows(c: Config, n_layers: int, window: Optional[int], default: list[str]) -> list[Optional[int]]:
    """Each layer's window from ``layer_types`` (the config's, or the family's default pattern): ``window`` on
    sliding_attention layers, none on full_attention ones."""
    types = c.list("layer_types", str, n_layers) or default
    for t in types:
        if t not in LAYER_TYPES:
            raise c.error(f"'layer_types' holds {t[:40]!r}: advisor reads {' and '.join(LAYER_TYPES)} layers "
                          "(no linear-attention, recurrent or chunked layers)")
    if window is None and "sliding_attention" in types:
        raise c.error("'layer_types' has sliding_attention layers but 'sliding_window' is null")
    return [window if t == "sliding_attention" else None for t in types]


def dense_layers(c: Config, n_layers: int, has_experts: bool) -> list[bool]:
    """Qwen-MoE's dense layers (transformers modeling_qwen2_moe.py): a layer routes to experts unless it is in
    ``mlp_only_layers``, or unless (index + 1) is not a multiple of ``decoder_sparse_step``."""
    step = c.int("decoder_sparse_step", default=1)
    only = c.list("mlp_only_layers", int) or []
    return [i in only or not has_experts or (i + 1) % step != 0 for i in range(n_layers)]
