"""Gemma, Gemma 2 and Gemma 3 (text): GeGLU MLPs, RMSNorms with (1 + weight) (the same parameters), head_dim 256
by default, tied embeddings scaled by sqrt(hidden) (no parameters).

Gemma 2 (transformers modeling_gemma2.py): four norms a layer (before and after attention and MLP), local
sliding-window and global layers alternating from a local first, attention logits and final logits soft-capped
(tanh(x / c) c: no parameters, a cost). Gemma 3 text: the same norms and q/k RMSNorms over the head dim, five
local layers to one global (``sliding_window_pattern``, 6), no soft-capping by default. Bidirectional attention
(``use_bidirectional_attention``, an encoder's) is refused: advisor costs causal language models.
"""

from __future__ import annotations

from advisor.model.families._common import attention_bias, llama_base, runs, typed_windows
from advisor.model.families._config import Config
from advisor.model.spec import QKNorm


def gemma(c: Config) -> dict:
    d = llama_base(c, kv=16, head_dim=256, tied=True, max_positions=8192, act="gelu_pytorch_tanh")
    _causal(c)
    return {**d, **attention_bias(c)}


def gemma2(c: Config) -> dict:
    d = llama_base(c, kv=4, head_dim=256, tied=True, max_positions=8192, act_key="hidden_activation",
                   act="gelu_pytorch_tanh")
    _causal(c)
    c.float("query_pre_attn_scalar", None)  # scales the queries: no parameters
    n, window = d["n_layers"], c.nullable_int("sliding_window", 4096)
    default = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    return {**d, **attention_bias(c), "norms_per_layer": 4, "layer_runs": runs(typed_windows(c, n, window, default)),
            "attn_softcap": _cap(c, "attn_logit_softcapping", 50.0),
            "logit_softcap": _cap(c, "final_logit_softcapping", 30.0)}


def gemma3_text(c: Config) -> dict:
    d = llama_base(c, kv=4, head_dim=256, tied=True, max_positions=131_072, act_key="hidden_activation",
                   act="gelu_pytorch_tanh")
    _causal(c)
    c.float("query_pre_attn_scalar", None)
    n, window = d["n_layers"], c.nullable_int("sliding_window", 4096)
    every = c.int("sliding_window_pattern", default=6)
    default = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    return {**d, **attention_bias(c), "norms_per_layer": 4, "qk_norm": QKNorm.head,
            "layer_runs": runs(typed_windows(c, n, window, default)),
            "attn_softcap": _cap(c, "attn_logit_softcapping", None),
            "logit_softcap": _cap(c, "final_logit_softcapping", None)}


def _cap(c: Config, key: str, default):
    """A soft-cap: absent gives the family's default, null none."""
    if key not in c.raw:
        c.read.add(key)
        return default
    cap = c.float(key, None)
    if cap is not None and cap <= 0:
        raise c.error(f"{key!r} must be positive (or null for none), got {cap}")
    return cap


def _causal(c: Config) -> None:
    if c.bool("use_bidirectional_attention", False):
        raise c.refuse("use_bidirectional_attention", True, "advisor costs causal (decoder-only) language models")
