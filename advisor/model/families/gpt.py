"""GPT-2's descendants and the parallel-block families: plain (two-linear) MLPs, LayerNorm, biases.

As transformers 5.23 builds them (modeling_*.py): GPT-2 (biases everywhere, learned positions, tied; a
cross-attention block is refused), GPTBigCode (GPT-2 with multi-query attention), GPT-J (a parallel block under
one LayerNorm, bias-free attention, a biased LM head), GPT-NeoX (parallel residual with two LayerNorms where
use_parallel_residual, biased MLP, attention_bias on qkv and dense), Falcon (multi-query, or grouped under
new_decoder_architecture; a parallel block with one or two LayerNorms; ``bias`` on every linear; ALiBi or
rotary), MPT (weight-only LayerNorms, no biases, ALiBi, a 4x MLP: transformers' MptModel builds only these, so
other values of expansion_ratio, no_bias, attn_type, qk_ln and alibi are refused), BLOOM (ALiBi, an embedding
LayerNorm), Phi-1/2 (a parallel block, biases, a biased LM head, optional q/k LayerNorms), StarCoder2 (GQA,
use_bias, a sliding window on every layer where sliding_window is set).
"""

from __future__ import annotations

from advisor.model.families._common import partial_rope, rotary_dim_share, runs
from advisor.model.families._config import Config
from advisor.model.layer import MLPKind, NormKind
from advisor.model.spec import PositionKind, QKNorm

PLAIN = dict(mlp=MLPKind.gelu, norm=NormKind.layernorm)


def _gpt2_keys(c: Config, positions: int) -> dict:
    h = c.int("n_embd", "hidden_size")
    if c.bool("add_cross_attention", False):
        raise c.refuse("add_cross_attention", True, "cross-attention belongs to an encoder-decoder model; "
                       "advisor costs decoder-only language models")
    return dict(n_layers=c.int("n_layer", "num_hidden_layers"), d_model=h, n_heads=c.int("n_head", "num_attention_heads"),
                d_ff=c.int("n_inner", default=4 * h), vocab=c.int("vocab_size"),
                max_positions=c.int("n_positions", "max_position_embeddings", default=positions), **PLAIN)


def gpt2(c: Config) -> dict:
    return {**_gpt2_keys(c, 1024), "tied_embeddings": c.bool("tie_word_embeddings", True)}


def gpt_bigcode(c: Config) -> dict:
    d = _gpt2_keys(c, 1024)
    mq = c.bool("multi_query", True)
    return {**d, "n_kv_heads": 1 if mq else None, "tied_embeddings": c.bool("tie_word_embeddings", True)}


def gptj(c: Config) -> dict:
    d = _gpt2_keys(c, 2048)
    # GPTJConfig rotary_dim (default 64) of each head's width, rotated in interleaved pairs (rotate_every_two)
    share = rotary_dim_share(c, d["d_model"] // d["n_heads"], 64)
    return {**d, "position": PositionKind.rotary, "rotary_fraction": share, "rotary_interleaved": True,
            "tied_embeddings": c.bool("tie_word_embeddings", False), "linear_bias": False, "mlp_bias": True,
            "lm_head_bias": True, "parallel_block": True, "norms_per_layer": 1}


def gpt_neox(c: Config) -> dict:
    bias = c.bool("attention_bias", True)
    return dict(n_layers=c.int("num_hidden_layers"), d_model=c.int("hidden_size"), n_heads=c.int("num_attention_heads"),
                d_ff=c.int("intermediate_size"), vocab=c.int("vocab_size"),
                max_positions=c.int("max_position_embeddings", default=2048), position=PositionKind.rotary,
                tied_embeddings=c.bool("tie_word_embeddings", False), linear_bias=False, qkv_bias=bias, out_bias=bias,
                mlp_bias=True, parallel_block=c.bool("use_parallel_residual", True), **PLAIN,
                **partial_rope(c, 0.25, legacy="rotary_pct"))


def falcon(c: Config) -> dict:
    """transformers modeling_falcon.py: qkv is h + 2 head_dim under multi_query, (heads + 2 kv) head_dim under
    new_decoder_architecture, else 3h; a parallel block has ln_attn and ln_mlp (num_ln_in_parallel_attn = 2, the
    default of the new architecture) or one input_layernorm."""
    h, heads = c.int("hidden_size", "n_embed"), c.int("num_attention_heads")
    new = c.bool("new_decoder_architecture", False)
    mq = c.bool("multi_query", True)
    kv = c.int("num_kv_heads", default=heads)  # read by transformers only under the new architecture
    kv = kv if new else (1 if mq else heads)
    parallel = c.bool("parallel_attn", True)
    n_ln = c.int("num_ln_in_parallel_attn", default=2 if new else 1)
    if parallel and n_ln not in (1, 2):
        raise c.refuse("num_ln_in_parallel_attn", n_ln, "a parallel block has 1 or 2 LayerNorms")
    return dict(n_layers=c.int("num_hidden_layers"), d_model=h, n_heads=heads, n_kv_heads=kv,
                d_ff=c.int("ffn_hidden_size", default=4 * h), vocab=c.int("vocab_size"),
                max_positions=c.int("max_position_embeddings", default=2048),
                position=PositionKind.alibi if c.bool("alibi", False) else PositionKind.rotary,
                tied_embeddings=c.bool("tie_word_embeddings", True), linear_bias=c.bool("bias", False),
                parallel_block=parallel, norms_per_layer=n_ln if parallel else 2, **PLAIN)


def mpt(c: Config) -> dict:
    a = c.sub("attn_config")
    why = "transformers' MptModel builds only {}"
    c.expect("expansion_ratio", c.int("expansion_ratio", default=4), 4, why.format("a 4 x d_model MLP"))
    c.expect("no_bias", c.bool("no_bias", True), True, why.format("bias-free linears and norms"))
    a.expect("attn_type", a.str("attn_type", "multihead_attention"), "multihead_attention",
             why.format("multi-head attention"))
    a.expect("qk_ln", a.bool("qk_ln", False), False, why.format("attention without q/k LayerNorms"))
    a.expect("alibi", a.bool("alibi", True), True, why.format("ALiBi positions"))
    c.bool("learned_pos_emb", True)  # llm-foundry drops it under ALiBi, and transformers never builds it
    h = c.int("d_model", "hidden_size")
    return dict(n_layers=c.int("n_layers", "num_hidden_layers"), d_model=h, n_heads=c.int("n_heads", "num_attention_heads"),
                d_ff=4 * h, vocab=c.int("vocab_size"), max_positions=c.int("max_seq_len", default=2048),
                mlp=MLPKind.gelu, norm=NormKind.layernorm_nobias, position=PositionKind.alibi,
                tied_embeddings=c.bool("tie_word_embeddings", True), linear_bias=False)


def bloom(c: Config) -> dict:
    h = c.int("hidden_size", "n_embed")
    return dict(n_layers=c.int("n_layer", "num_hidden_layers"), d_model=h, n_heads=c.int("n_head", "num_attention_heads"),
                d_ff=4 * h, vocab=c.int("vocab_size"), max_positions=c.int("seq_length", default=2048),
                position=PositionKind.alibi, embedding_norm=True, tied_embeddings=c.bool("tie_word_embeddings", True),
                **PLAIN)


def phi(c: Config) -> dict:
    heads = c.int("num_attention_heads")
    return dict(n_layers=c.int("num_hidden_layers"), d_model=c.int("hidden_size"), n_heads=heads,
                n_kv_heads=c.int("num_key_value_heads", default=heads), d_ff=c.int("intermediate_size"),
                vocab=c.int("vocab_size"), max_positions=c.int("max_position_embeddings", default=2048),
                position=PositionKind.rotary, tied_embeddings=c.bool("tie_word_embeddings", False), lm_head_bias=True,
                parallel_block=True, norms_per_layer=1,
                qk_norm=QKNorm.head if c.bool("qk_layernorm", False) else QKNorm.none, **PLAIN, **partial_rope(c, 0.5))


def starcoder2(c: Config) -> dict:
    n = c.int("num_hidden_layers")
    return dict(n_layers=n, d_model=c.int("hidden_size"), n_heads=c.int("num_attention_heads"),
                n_kv_heads=c.int("num_key_value_heads", default=2), d_ff=c.int("intermediate_size"),
                vocab=c.int("vocab_size"), max_positions=c.int("max_position_embeddings", default=4096),
                position=PositionKind.rotary, tied_embeddings=c.bool("tie_word_embeddings", True),
                linear_bias=c.bool("use_bias", True), layer_runs=runs([c.int("sliding_window", default=None)] * n),
                **PLAIN)
