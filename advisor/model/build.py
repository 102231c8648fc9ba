"""From a ModelSpec to its layer table (advisor.model.layer): the linears, norms and attention windows of each
distinct layer, with how many layers it is.

Biases: ``linear_bias`` puts one on every linear; ``qkv_bias``, ``out_bias`` and ``mlp_bias`` add them where
a family has them alone. Under multi-head latent attention the attention biases sit where DeepSeek's code puts
them (transformers modeling_deepseek_v2.py, ``attention_bias``): on the q and kv down projections and on out,
never on q_b, kv_b or a full-rank q.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from advisor.model.layer import DecoderLayer, Latent, Linear, Span, Split

if TYPE_CHECKING:
    from advisor.model.spec import ModelSpec

COL, ROW, REP = Split.column, Split.row, Split.replicated
NORM_NAMES = ("input", "post_attention", "pre_feedforward", "post_feedforward")


@lru_cache(maxsize=1024)
def build_layers(m: "ModelSpec") -> tuple[DecoderLayer, ...]:
    """The model's distinct layers in order of first appearance: dense and routed layers apart, each with the
    windows its layers attend over (advisor.model.spec.LayerRun)."""
    runs = [(r.count, Span(r.window, r.chunk), r.dense) for r in m.layer_runs] or [(m.n_layers, Span(), False)]
    kinds: dict[bool, dict[Span, int]] = {}
    for count, span, dense in runs:
        windows = kinds.setdefault(m.experts is not None and not dense, {})
        windows[span] = windows.get(span, 0) + count
    return tuple(_layer(m, routed, tuple(w.items())) for routed, w in kinds.items())


def _layer(m: "ModelSpec", routed: bool, windows: tuple[tuple[Span, int], ...]) -> DecoderLayer:
    attention = _latent(m) if m.latent is not None else _attention(m)
    ffn = _experts(m) if routed else _mlp(m, m.d_ff, "mlp", "mlp", m.linear_bias or m.mlp_bias)
    d_v = m.latent.v_head_dim if m.latent is not None and m.latent.v_head_dim != m.d_head else None
    kv_heads = m.n_heads if m.latent is not None else m.kv_heads
    lat = m.latent
    widths = None if lat is None else Latent(lat.q_lora_rank or 0, lat.kv_lora_rank, lat.qk_rope_head_dim, lat.qk_nope_head_dim)
    return DecoderLayer(m.d_model, m.experts.d_ff_expert if routed else m.d_ff, m.n_heads, kv_heads, m.d_head,
                        m.mlp, m.norm, attention + ffn, _norms(m), windows, d_v,
                        m.n_heads if m.attention_sinks else 0, m.attn_softcap, widths)


def _attention(m: "ModelSpec") -> tuple[Linear, ...]:
    h, q, kv, qkv_bias = m.d_model, m.q_dim, m.kv_dim, m.linear_bias or m.qkv_bias
    return (Linear("attention/qkv", "qkv", "attention/qkv", h, q + 2 * kv, qkv_bias, COL),
            Linear("attention/out", "out", "attention/out", q, h, m.linear_bias or m.out_bias, ROW))


def _latent(m: "ModelSpec") -> tuple[Linear, ...]:
    """MLA: q (or q_a -> q_b), kv_a (the latent and the shared rope key), kv_b (keys' no-position part and
    values for every head), out. The down projections are replicated over TP ranks (megatron-core's
    ``duplicated``); q_b, kv_b split their heads."""
    lat, h, heads = m.latent, m.d_model, m.n_heads
    down_bias, grp = m.linear_bias or m.qkv_bias, "attention/qkv"
    if lat.q_lora_rank is None:
        q: tuple[Linear, ...] = (Linear("attention/q", "qkv", grp, h, heads * m.d_head, False, COL),)
    else:
        q = (Linear("attention/q_a", "qkv", grp, h, lat.q_lora_rank, down_bias, REP),
             Linear("attention/q_b", "qkv", grp, lat.q_lora_rank, heads * m.d_head, False, COL))
    return q + (
        Linear("attention/kv_a", "qkv", grp, h, lat.kv_lora_rank + lat.qk_rope_head_dim, down_bias, REP),
        Linear("attention/kv_b", "qkv", grp, lat.kv_lora_rank, heads * (lat.qk_nope_head_dim + lat.v_head_dim), False, COL),
        Linear("attention/out", "out", "attention/out", heads * lat.v_head_dim, h, m.linear_bias or m.out_bias, ROW))


def _mlp(m: "ModelSpec", d_ff: int, prefix: str, group: str, bias: bool, copies: int = 1,
         active: float = 1.0) -> tuple[Linear, ...]:
    """A plain (fc, proj) or gated (gate, up, down) MLP of width d_ff; ``copies`` of it of which ``active`` run."""
    h = m.d_model
    if m.mlp.gated:
        return (Linear(f"{prefix}/gate", "fc1", group, h, d_ff, bias, COL, copies, active),
                Linear(f"{prefix}/up", "fc1", group, h, d_ff, bias, COL, copies, active),
                Linear(f"{prefix}/down", "fc2", group, d_ff, h, bias, ROW, copies, active))
    return (Linear(f"{prefix}/fc", "fc1", group, h, d_ff, bias, COL, copies, active),
            Linear(f"{prefix}/proj", "fc2", group, d_ff, h, bias, ROW, copies, active))


def _experts(m: "ModelSpec") -> tuple[Linear, ...]:
    """The router (h -> n_experts, whole on every rank), the routed experts (every copy, top-k active) and the
    shared experts (always active) with Qwen2-MoE's sigmoid gate on them."""
    e, h = m.experts, m.d_model
    out = (Linear("mlp/router", "fc1", "mlp/router", h, e.n_experts, e.router_bias, REP),)
    out += _mlp(m, e.d_ff_expert, "mlp/experts", "mlp/experts", e.expert_bias, e.n_experts, float(e.experts_per_token))
    if e.d_ff_shared:
        out += _mlp(m, e.d_ff_shared, "mlp/shared", "mlp/shared", m.linear_bias or m.mlp_bias)
    if e.shared_gate:
        out += (Linear("mlp/shared_gate", "fc1", "mlp/shared", h, 1, False, REP),)
    return out


def _norms(m: "ModelSpec") -> tuple[tuple[str, int], ...]:
    """The d_model-wide norms, then q/k norms, then MLA's norms on its latents."""
    out = tuple((name, m.d_model) for name in NORM_NAMES[:m.norms_per_layer])
    if m.qk_norm.value == "head":
        out += (("q_norm", m.d_head), ("k_norm", m.d_head))
    elif m.qk_norm.value == "full":
        out += (("q_norm", m.q_dim), ("k_norm", m.kv_dim))
    if m.latent is not None:
        if m.latent.q_lora_rank is not None:
            out += (("q_a_norm", m.latent.q_lora_rank),)
        out += (("kv_a_norm", m.latent.kv_lora_rank),)
    return out
