"""llm-foundry: a train YAML for scripts/train/train.py (``composer train.py train.yaml``), llm-foundry 0.22.

Keys as llm-foundry's TrainConfig (llmfoundry/utils/config_utils.py) reads them: ``global_train_batch_size`` and
``device_train_microbatch_size`` (update_batch_size_info derives the per-device batch and the accumulation),
``max_seq_len``, ``precision`` (Composer's amp_bf16 ...), and Composer's ``fsdp_config`` (sharding_strategy,
mixed_precision, activation_checkpointing, limit_all_gathers). The model is foundry's own MPT (``mpt_causal_lm``)
for MPT shapes, else ``hf_causal_lm`` on the model's Hugging Face config. Data, tokenizer, optimizer and schedule
are the user's: the file carries placeholders from foundry's pretrain yamls, marked as such. Every value of the
plan comes from one row of KEYS (the key path, a function of the run giving its value or None: not written).
Refused: TP and PP (the stack profile offers neither), pure bf16 and selective recomputation (Composer keeps fp32
master weights; foundry checkpoints whole blocks). The notes are written into the YAML as comments.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.export.common import (GRADIENT_CLIP, Exported, ExportError, Precision, Run, check, commented_yaml, header,
                                   node_layout)
from advisor.model import MLPKind, NormKind, PositionKind

# Composer's Precision enum (composer/core/precision.py); its AMP_FP8 is Transformer Engine's fp8_autocast with a
# DelayedScaling recipe (mosaicml 0.32.1 get_precision_context): fp8-delayed (which fp8-mixed is: TrainingSetup)
PRECISION = {Precision.fp32: "fp32", Precision.bf16_mixed: "amp_bf16", Precision.fp16_mixed: "amp_fp16",
             Precision.fp8_delayed: "amp_fp8"}
SHARDING = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}
# Placeholders for what a run needs but the plan does not say, as in llm-foundry's scripts/train/yamls/pretrain/
# mpt-125m.yaml (tokenizer, data, optimizer, schedule): yours to replace
PLACEHOLDERS: dict[str, Any] = {
    "tokenizer": {"name": "EleutherAI/gpt-neox-20b"},
    "train_loader": {"name": "text", "dataset": {"local": "./my-copy-c4", "split": "train", "shuffle": True},
                     "drop_last": True, "num_workers": 8},
    "optimizer": {"name": "decoupled_adamw", "lr": 6.0e-4, "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.0},
    "scheduler": {"name": "cosine_with_warmup", "t_warmup": "100ba", "alpha_f": 0.1},
    "max_duration": "100ba",
}


def _is_mpt(r: Run) -> bool:
    """Shapes foundry's MPT builds: learned or ALiBi positions off, LayerNorm, a GELU MLP, no biases, tied head."""
    m = r.model
    return (m.norm in (NormKind.layernorm, NormKind.layernorm_nobias) and m.mlp is MLPKind.gelu and not m.linear_bias and m.tied_embeddings
            and m.kv_heads == m.n_heads and m.position in (PositionKind.alibi, PositionKind.learned))


# the partial policies: MPT's activation_checkpointing_target selects the checkpointed blocks by a range string or by
# block ids (modeling_mpt.py activation_checkpointing_fn -> models/utils/act_ckpt.py get_target_block_list); full
# checkpoints every MPTBlock (its default target)
PARTIAL = ("block", "every-k")


def _target(r: Run) -> dict[str, Any]:
    """MPT's activation_checkpointing_target for block (the first k blocks: "first-k") and every-k (blocks k-1, 2k-1,
    ...: every k-th counted from 1, advisor.recompute)."""
    rc, k = r.setup.recompute.value, r.setup.recompute_layers
    if rc == "block":
        return {"activation_checkpointing_target": {"MPTBlock": f"first-{k}"}}
    if rc == "every-k":
        return {"activation_checkpointing_target": {"MPTBlock": list(range(k - 1, r.model.n_layers, k))}}
    return {}


def _model(r: Run) -> dict[str, Any]:
    m = r.model
    if _is_mpt(r):
        return {"name": "mpt_causal_lm", "d_model": m.d_model, "n_heads": m.n_heads, "n_layers": m.n_layers,
                "expansion_ratio": m.d_ff / m.d_model, "max_seq_len": r.setup.seq_len, "vocab_size": m.vocab,
                "no_bias": True, "learned_pos_emb": m.position is PositionKind.learned,
                "attn_config": {"attn_impl": "flash", "alibi": m.position is PositionKind.alibi},
                **_target(r)}
    return {"name": "hf_causal_lm", "pretrained_model_name_or_path": f"PATH/TO/{m.name}", "pretrained": False}


def _fsdp(r: Run, value: Any) -> Any:
    return value if r.plan.zero >= 2 else None


KEYS: list[tuple[str, Callable[[Run], Any]]] = [
    ("max_seq_len", lambda r: r.setup.seq_len),
    ("global_train_batch_size", lambda r: r.setup.micro_batch * r.grad_accum * r.plan.dp),
    ("device_train_microbatch_size", lambda r: r.setup.micro_batch),
    ("device_eval_batch_size", lambda r: r.setup.micro_batch),
    ("precision", lambda r: PRECISION[r.setup.precision]),
    ("model", _model),
    ("fsdp_config.sharding_strategy",
     lambda r: _fsdp(r, "HYBRID_SHARD" if r.plan.hybrid_shard else SHARDING.get(r.plan.zero))),
    # PURE: parameters gathered, computed and gradients reduced in bf16 (the llm-foundry profile's reduce_dtype:
    # compute; composer/distributed/mosaic_parallelism.py get_mixed_precision)
    ("fsdp_config.mixed_precision", lambda r: _fsdp(r, "PURE" if r.setup.precision.autocast else "FULL")),
    ("fsdp_config.activation_checkpointing", lambda r: _fsdp(r, r.setup.recompute.value in ("full", *PARTIAL))),
    ("fsdp_config.activation_checkpointing_reentrant", lambda r: _fsdp(r, False)),
    ("fsdp_config.limit_all_gathers", lambda r: _fsdp(r, True)),  # at most two all-gathers in flight
    # as every MPT pretrain YAML sets it (shared/stacks/llm-foundry-and-nanotron.md A.0) and the llm-foundry profiles
    # cost it (engine.clip_grad_norm): without it Composer adds no GradientClipping algorithm and nothing clips
    ("algorithms.gradient_clipping", lambda r: {"clipping_type": "norm", "clipping_threshold": GRADIENT_CLIP}),
]


def _refuse(r: Run) -> None:
    if r.plan.tp > 1 or r.plan.pp > 1:
        raise ExportError(f"llm-foundry's train YAML has no tp={r.plan.tp} x pp={r.plan.pp} (Composer FSDP or DDP only)")
    if r.setup.precision is Precision.bf16:
        raise ExportError("Composer keeps fp32 master weights: there is no pure bf16; use --precision bf16-mixed")
    if r.setup.precision not in PRECISION:
        raise ExportError(f"Composer's precisions are {', '.join(sorted(set(PRECISION.values())))} (amp_fp8: Transformer "
                          f"Engine's delayed scaling): {r.setup.precision.value} has none; use --precision fp8-delayed")
    rc = r.setup.recompute.value
    if rc == "selective":
        raise ExportError("llm-foundry checkpoints whole blocks (fsdp_config.activation_checkpointing): use "
                          "--recompute full or none")
    if rc in ("full", *PARTIAL) and r.plan.zero < 2:
        raise ExportError(f"llm-foundry checkpoints activations through FSDP: --recompute {rc} needs --zero 2 or 3")
    if rc in PARTIAL and not _is_mpt(r):
        raise ExportError(f"--recompute {rc}: llm-foundry selects blocks to checkpoint in its MPT only "
                          "(activation_checkpointing_target); a Hugging Face model checkpoints every block: --recompute full")
    if rc not in ("none", "full", *PARTIAL):
        raise ExportError(f"--recompute {rc}: llm-foundry checkpoints none, all (full) or some blocks (block, every-k)")


def foundry_dict(r: Run) -> tuple[dict[str, Any], list[str]]:
    """The train YAML's mapping (placeholders first, then the plan's keys) and the notes."""
    _refuse(r)
    cfg: dict[str, Any] = dict(PLACEHOLDERS)
    for path, value_of in KEYS:
        value = value_of(r)
        if value is None:
            continue
        *parents, leaf = path.split(".")
        node = cfg
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    notes = []
    if not _is_mpt(r):
        notes.append(f"{r.model.name} is not an MPT shape: hf_causal_lm builds it from its Hugging Face config; "
                     "set pretrained_model_name_or_path")
    if PRECISION.get(r.setup.precision) == "amp_fp8":
        notes.append("amp_fp8 runs FP8 only in Transformer Engine layers: set model.fc_type: te")
    if r.plan.zero == 0 and r.plan.dp > 1:
        notes.append("no fsdp_config: Composer wraps the model in PyTorch DDP")
    return cfg, notes


def foundry_config(model, hw, plan, setup, grad_accum: int, world_size: int) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = foundry_dict(Run(model, hw, plan, setup, grad_accum, world_size))
    lay = node_layout(hw, world_size)
    launch = "composer" + (f" --world_size {world_size} --node_rank $NODE_RANK --master_addr $MASTER_ADDR"
                           if lay.nnodes > 1 else "") + " train.py train.yaml"
    head = [f"# {header(model, hw, plan, setup, grad_accum, world_size)}",
            f"# launch (llm-foundry scripts/train): {launch}",
            "# tokenizer, train_loader, optimizer, scheduler and max_duration are placeholders "
            "(llm-foundry's yamls/pretrain/mpt-125m.yaml): yours"]
    return commented_yaml("train.yaml", head, cfg, notes)
