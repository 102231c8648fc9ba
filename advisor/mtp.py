"""Multi-token prediction (MTP) as megatron-core 0.19.2 trains it (--mtp-num-layers D; DeepSeek-V3, Liu et al. 2024,
arXiv 2412.19437 s.2.2): a training choice of the stack, not a part of the Hugging Face model (transformers' DeepseekV3
drops the num_nextn_predict_layers weights), so an input (TrainingSetup.mtp_layers) that the stacks whose profile says
``engine.mtp`` run and the rest refuse in one line (advisor.stack Stack.mtp_refusal).

Each depth k (transformer/multi_token_prediction.py MultiTokenPredictionLayer) looks the shared embedding up again for
the tokens k ahead, norms it and the previous depth's hidden states (enorm, hnorm: RMSNorm or LayerNorm as the model's,
:983-993), concatenates the two and projects 2h -> h (eh_proj, column-parallel, no bias, gathered over TP after it:
:1000-1012, :1139-1147), runs one transformer layer of the kind of the model's last decoder layer (models/gpt/
gpt_layer_specs.py:766-768: ``spec.layer_specs[-1]``; DeepSeek-V3's is routed, with MLA), a final norm (:1049), and
the shared output layer again: a second full-vocabulary logits and loss (gpt_model.py process_mtp_loss, :836-878), its
loss scaled by mtp_loss_scaling_factor / D (0.1 by default, transformer_config.py:75), which changes no cost.

Where it sits: every depth on the last pipeline stage, the last virtual chunk (multi_token_prediction.py:616-660
mtp_on_this_rank, :1671-1676; a layout may name another stage, which Megatron-Bridge's DeepSeek-V3 recipes do not: they
put "mtp" beside the loss, recipes/deepseek/h100/deepseek_v3.py:66). So the last stage runs D more layers, D more
heads, and holds D more layers' and projections' weights and D more logits (advisor.step, advisor.memory).

Parameters of a depth: the layer's, eh_proj's 2h x h and three norms; the output layer is the model's own (its second
logits run through self.output_layer, gpt_model.py:762), and so is the embedding without a pipeline; under one the last
stage builds a copy of the embedding for the depths (gpt_model.py:167-175, ``pre_process or mtp_process``), a second
V x h table beside an untied output layer, with its gradient and optimizer states, its gradient all-reduced with the
first stage's (``last_stage_outside_params``; advisor.step costs the last rank's memory with them). Model FLOPs, as Megatron-LM counts them (training.py
num_floating_point_operations: the MTP layer as the last layer's kind, 3 x 2 x (3h + 2h^2) for its norms and eh_proj,
the logits x (1 + D)): the layer, eh_proj's GEMM and the logits, the norms left out as everywhere in advisor.
"""

from __future__ import annotations

from advisor.model import DecoderLayer, ModelSpec

NORMS = 3  # enorm, hnorm, final_layernorm (multi_token_prediction.py:983-993, :1049-1053)
# the element-wise passes of a depth outside its layer, h-wide elements a token: the embedding lookup (1 write), three
# norms (each 1 read + 1 write), the concatenation (2h read, 2h written: 4) and the gather's copy after eh_proj (2);
# backward about twice (each norm's input gradient reads its input and the output gradient and writes one)
FORWARD_ACCESSES, BACKWARD_ACCESSES = 1.0 + 2.0 * NORMS + 4.0 + 2.0, 2.0 * (2.0 * NORMS + 4.0 + 2.0)


def layer(model: ModelSpec) -> DecoderLayer:
    """The transformer layer of a depth: the kind of the model's last decoder layer (routed or dense), as described once
    for the decoder (advisor.model.build)."""
    runs = model.layer_runs
    routed = model.experts is not None and not (runs[-1].dense if runs else False)
    return next((k for k in model.layers if k.routed == routed), model.layer)


def params_per_depth(model: ModelSpec) -> int:
    """Parameters of one depth: its layer, eh_proj (2h x h, no bias) and its three norms."""
    return layer(model).n_params + outside_params(model, 1)


def outside_params(model: ModelSpec, depths: int) -> int:
    """Parameters of the depths outside their layers (eh_proj and the norms), which the last stage holds beside its
    layers; the layers are counted as decoder layers (advisor.parallel.pipeline)."""
    h = model.d_model
    return depths * (2 * h * h + NORMS * model.layer.norm_params)


def last_stage_outside_params(model: ModelSpec, depths: int) -> int:
    """Parameters outside the layers that ``depths`` > 0 MTP depths add to the last pipeline stage: their eh_proj and
    norms, and, where the model's output layer is untied, a copy of the word embedding (V x h) the depths look the
    tokens up in: megatron-core builds an embedding wherever ``pre_process or mtp_process`` (gpt_model.py:167-175) and
    keeps the copy in step with the first stage's by an all-reduce of its gradient (language_module.py:247-289,
    distributed/finalize_model_grads.py:146); a tied model's last stage holds that table already, as its output layer."""
    if not depths:
        return 0
    copy = 0 if model.tied_embeddings else model.vocab * model.d_model
    return outside_params(model, depths) + copy


def forward_flops_per_token(model: ModelSpec, depths: int, seq_len: int, kept: float = 1.0) -> float:
    """Forward model FLOPs a token of the depths: each its layer (routed experts at top-k, ``kept``: the share of routed
    tokens an expert's capacity keeps), eh_proj's 2 x 2h x h and the logits' 2 x h x V (module docstring)."""
    if not depths:
        return 0.0
    k, h = layer(model), model.d_model
    routed = sum(lin.flops_per_token for lin in k.linears if lin.copies > 1)
    per = sum(k.flops_per_token(seq_len, causal=True).values()) - (1.0 - kept) * routed
    return depths * (per + 2.0 * 2 * h * h + 2.0 * h * model.vocab)
