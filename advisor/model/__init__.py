"""Model: a decoder-only transformer spec, its layer described once, the built-in catalogue, HF config.json loading."""

from advisor.model.catalogue import ALIASES, CATALOGUE, gpt2_like, list_models, llama_like, load_model
from advisor.model.hf import model_from_hf_config
from advisor.model.layer import DecoderLayer, Linear, MLPKind, NormKind, Split
from advisor.model.spec import ModelError, ModelSpec, PositionKind

__all__ = ["ALIASES", "CATALOGUE", "DecoderLayer", "Linear", "MLPKind", "ModelError", "ModelSpec", "NormKind",
           "PositionKind", "Split", "gpt2_like", "list_models", "llama_like", "load_model", "model_from_hf_config"]
