"""Model: a decoder-only transformer spec, its layers described once, the built-in catalogue, HF config.json loading
(one adapter per model_type in advisor.model.families)."""

from advisor.model.catalogue import ALIASES, CATALOGUE, catalogue_twin, gpt2_like, list_models, llama_like, load_model
from advisor.model.hf import model_from_hf_config, model_from_hf_dict
from advisor.model.layer import DecoderLayer, Linear, MLPKind, NormKind, Span, Split, keys_per_query
from advisor.model.spec import (Experts, LatentAttention, LayerRun, ModelError, ModelSpec, PositionKind, QKNorm,
                                 RopeScaling)

__all__ = ["ALIASES", "CATALOGUE", "DecoderLayer", "catalogue_twin", "Experts", "LatentAttention", "LayerRun", "Linear", "MLPKind",
           "ModelError", "ModelSpec", "NormKind", "PositionKind", "QKNorm", "RopeScaling", "Span", "Split", "gpt2_like",
           "keys_per_query", "list_models", "llama_like", "load_model", "model_from_hf_config", "model_from_hf_dict"]
