"""nanotron: the YAML config its ``run_train.py --config-file FILE`` reads, for nanotron 0.4 as published on PyPI (the
version stack_profiles/nanotron.yaml names; file:line below are that wheel's ``nanotron/`` package).

The trainer parses the file with ``get_config_from_file`` (config/config.py:382-415): dacite with ``strict=True``
(:364-379) over ``Config`` (:289-303): ``general`` GeneralArgs (:133-164), ``parallelism`` ParallelismArgs
(config/parallelism_config.py:14-49), ``model`` ModelArgs (:174-191) with ``model_config`` a LlamaConfig
(config/models_config.py:18-47) and ``init_method`` RandomInit (:6-8), ``tokenizer`` TokenizerArgs (:194-200),
``checkpoints`` CheckpointsArgs (:111-130), ``logging`` LoggingArgs (:45-79), ``tokens`` TokensArgs (:203-214),
``optimizer`` OptimizerArgs (:254-268) with its LRSchedulerArgs (:217-251), ``data`` DataArgs (:98-108). Strict:
a key the dataclasses lack is an error, so only 0.4's keys are written. nanotron's git main (HEAD 2411b02, as
shared/stacks/llm-foundry-and-nanotron.md B.0 cites it) has keys 0.4 lacks (ParallelismArgs ``recompute_layer``,
``tp_recompute_allgather``) and moved the Adam settings into an AdamWOptimizerArgs: 0.4's parser rejects the one,
main's the other, so a file is for one of them; only 0.4 installs (and so is checked) here.

What 0.4 runs decides what it can be given: DDP or ZeRO-1 (``zero_stage`` 0/1), TP with (``tp_mode``
REDUCE_SCATTER) or without (ALL_REDUCE) sequence parallelism, the AFAB (GPipe) or 1F1B ``pp_engine``, bf16 weights
with fp32 gradient accumulation and master weights, torch's AdamW, its Llama (RMSNorm, SwiGLU, RoPE with base 10000,
no biases, GQA). Refused in one line: ZeRO-2/3, FSDP, HSDP, offload, CP, EP, other schedules, any recomputation
(0.4 checkpoints nothing: models/llama.py has no layer checkpoint and ParallelismArgs no ``recompute_layer``),
other precisions and optimizers, adapters, shapes its LlamaForTraining cannot build. Optimizer settings, steps,
data, tokenizer and checkpoint path are the user's: the file carries clearly marked placeholders that 0.4's parser
accepts (it requires them present). The notes are written into the YAML as comments.
"""

from __future__ import annotations

from typing import Any, Optional

from advisor.export.common import (
    GRADIENT_CLIP,
    Exported,
    ExportError,
    Precision,
    Run,
    check,
    commented_yaml,
    header,
)
from advisor.export.torchrun import torchrun_argv
from advisor.layout import Schedule
from advisor.model import ModelSpec
from advisor.stack import Stack, load_stack
from advisor.workload import tp_overlap_choice

VERSION = "0.4"
STACK = "nanotron"  # the shipped profile of nanotron 0.4 (stack_profiles/nanotron.yaml), what an export without one costs
# pp_engine names (config/utils_config.py:94-100 cast_str_to_pipeline_engine): AllForwardAllBackward is GPipe
# (parallel/pipeline_parallel/engine.py:165), OneForwardOneBackward 1F1B (:222)
PP_ENGINES = {Schedule.gpipe: "afab", Schedule.one_f_one_b: "1f1b"}
# nanotron's RotaryEmbedding and flash_attn's FlashRotaryEmbedding rotate with base 10000, not configurable in 0.4
# (models/llama.py:57, :324)
ROPE_BASE = 10000.0
# rms_norm_eps written, with a note, where the model's (ModelSpec.norm_eps) is not known: Llama 2's and 3's 1e-5
# (LlamaConfig's own default is 1e-6, config/models_config.py:38)
DEFAULT_EPS = 1e-5
# Placeholders: what a run needs and the plan does not say (the project leaves optimizer, schedule, steps, data and
# checkpoints to the user): usual Llama pretraining values (AdamW 0.9/0.95, weight decay 0.1, lr 3e-4 to 3e-5 cosine
# after a linear warm-up), which 0.4's parser requires present
TRAIN_STEPS = 1000
PLACEHOLDER_OPTIMIZER: dict[str, Any] = {
    "weight_decay": 0.1, "adam_eps": 1.0e-8, "adam_beta1": 0.9, "adam_beta2": 0.95,
    # LRSchedulerArgs checks lr_warmup_style before defaulting it (config/config.py:238-243): it must be written
    "learning_rate_scheduler": {"learning_rate": 3.0e-4, "lr_warmup_steps": 100, "lr_warmup_style": "linear",
                                "lr_decay_style": "cosine", "min_decay_lr": 3.0e-5},
}
INIT_STD = 0.02  # RandomInit.std (models/llama.py init_model_randomly); Llama's initializer_range
SEED = 42  # config/config.py DEFAULT_SEED


def _refuse(r: Run) -> None:
    p, s, m = r.plan, r.setup, r.model
    unbuildable = m.llama_departures()
    if unbuildable:
        raise ExportError(f"{m.name} has {', '.join(unbuildable)}, which nanotron {VERSION}'s Llama (models/llama.py) "
                          "does not build: choose a Llama-shaped model (RMSNorm, SwiGLU, RoPE, no biases) or another "
                          "--stack")
    if s.finetune.adapters:
        raise ExportError(f"--method {s.finetune.method.value}: nanotron trains every weight (no adapters): "
                          "use --method full")
    if s.precision is not Precision.bf16_mixed:
        raise ExportError(f"--precision {s.precision.value}: nanotron trains bf16 weights with fp32 master weights and "
                          "gradient accumulation (dtype bfloat16, accumulate_grad_in_fp32): use --precision bf16-mixed")
    if s.optimizer.value not in ("adamw", "adamw-fused"):
        raise ExportError(f"--optimizer {s.optimizer.value}: nanotron {VERSION} builds torch.optim.AdamW only "
                          "(helpers.py:165-176): use --optimizer adamw or adamw-fused")
    if p.zero > 1 or p.hybrid_shard:
        what = "HSDP" if p.hybrid_shard else f"ZeRO-{p.zero}"
        raise ExportError(f"{what}: nanotron's zero_stage is 0 or 1 (ZeroDistributedOptimizer shards optimizer states "
                          "only, optim/zero.py): use --zero 0 or 1")
    if p.offload.value != "none":
        raise ExportError(f"--offload {p.offload.value}: nanotron keeps every state on the GPU: use --offload none")
    if p.cp > 1 or p.ep > 1 or p.etp not in (None, p.tp):
        what = f"context parallelism (cp={p.cp})" if p.cp > 1 else f"expert parallelism (ep={p.ep}, etp={p.etp})"
        raise ExportError(f"{what}: nanotron {VERSION} splits over dp, tp and pp only (ParallelismArgs): "
                          "use --cp 1 --ep 1")
    if p.pp > 1 and p.schedule not in PP_ENGINES:
        raise ExportError(f"the {p.schedule.value} schedule: nanotron's pp_engine is afab (--schedule gpipe) or 1f1b "
                          "(--schedule 1f1b)")
    if p.pp > 1 and p.pp_split.value != "even":
        raise ExportError(f"--pp-split {p.pp_split.value}: nanotron places layers by its own cost balance "
                          "(models/base.py:180-198): use --pp-split even")
    if p.pp > 1 and p.schedule is Schedule.one_f_one_b and r.grad_accum < p.pp - 1:
        raise ExportError(f"grad_accum={r.grad_accum}: nanotron's 1F1B needs at least pp - 1 = {p.pp - 1} "
                          "micro-batches (parallel/pipeline_parallel/engine.py:236-238): raise --grad-accum or use "
                          "--schedule gpipe")
    if s.recompute.value == "full":
        raise ExportError(f"--recompute full: nanotron {VERSION} recomputes nothing (ParallelismArgs has no "
                          "recompute_layer; LlamaDecoderLayer checkpoints nothing): use --recompute none")
    if s.recompute.value != "none":
        raise ExportError(f"--recompute {s.recompute.value}: nanotron has no {s.recompute.value} checkpointing: "
                          "use --recompute none")
    if m.n_heads % p.tp or m.kv_heads % p.tp:
        raise ExportError(f"tp={p.tp}: nanotron splits the {m.n_heads} query and {m.kv_heads} key/value heads over TP "
                          "ranks (models/llama.py:268-276): use a tp that divides both")


def stage_layers(model: ModelSpec, pp: int, tp: int = 1) -> list[int]:
    """Decoder layers nanotron places on each pipeline rank (models/base.py:180-198 build_model): blocks in order,
    each on the current rank, which moves on once the cumulative cost passes (rank + 1) / pp of the total; a layer
    costs 4 h^2 + 3 h d_ff, the LM head vocab x h (the vocabulary padded to a multiple of tp first, trainer.py:504,
    helpers.py:48-61), the rest nothing (models/llama.py:775-787 get_block_compute_costs)."""
    vocab = -(-model.vocab // tp) * tp
    layer, head = 4 * model.d_model * model.d_model + 3 * model.d_ff * model.d_model, vocab * model.d_model
    costs = [0] + [layer] * model.n_layers + [0, head, 0, 0]  # embedding, layers, final norm, lm_head, fp32 cast, loss
    total, cumulative, rank, out = sum(costs), 0, 0, [0] * pp
    for i, cost in enumerate(costs):
        cumulative += cost
        if 1 <= i <= model.n_layers:
            out[rank] += 1
        if cumulative > total * (rank + 1) / pp:
            rank += 1
    return out


def _model_config(m: ModelSpec) -> tuple[dict[str, Any], Optional[float]]:
    """LlamaConfig (config/models_config.py:18-47) of the model, and its RoPE base where advisor knows it (the
    catalogue's and config.json's rope_theta and rms_norm_eps: ModelSpec.rope_theta, norm_eps)."""
    eps, theta = m.norm_eps if m.norm_eps is not None else DEFAULT_EPS, m.rope_theta
    return {
        "is_llama_config": True,  # the field that makes dacite pick LlamaConfig in NanotronConfigs' Union
        "hidden_size": m.d_model,
        "intermediate_size": m.d_ff,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.kv_heads,
        "vocab_size": m.vocab,
        # a randomly initialised run sets it to tokens.sequence_length (trainer.py:510-528)
        "max_position_embeddings": m.max_positions,
        "rms_norm_eps": eps,
        "hidden_act": "silu",  # GLUActivation(hidden_act): SwiGLU
        "initializer_range": INIT_STD,
        "tie_word_embeddings": m.tied_embeddings,
    }, theta


def nanotron_dict(r: Run, stack: Optional[Stack] = None) -> tuple[dict[str, Any], list[str]]:
    """The config's mapping and the notes; ``stack``: the one the plan was costed in (None: setup.stack's, else the
    shipped nanotron profile), whose TP overlap the async linears follow."""
    _refuse(r)
    p, s, m = r.plan, r.setup, r.model
    sp = p.tp > 1 and p.sp
    stack = stack or load_stack(s.stack if s.stack not in ("auto", "any") else STACK)
    asynchronous = sp and tp_overlap_choice(stack, s) == "linear-async"
    model_config, theta = _model_config(m)
    cfg: dict[str, Any] = {
        "general": {"project": "advisor", "run": f"{m.name}-dp{p.dp}-tp{p.tp}-pp{p.pp}", "seed": SEED},
        "parallelism": {
            "dp": p.dp, "tp": p.tp, "pp": p.pp,
            # pp = 1: 1f1b, whose warm-up (pp - rank - 1 = 0 forwards, engine.py:249) holds one micro-batch's
            # activations, as the estimate costs a single stage; afab would hold all grad_accum of them
            "pp_engine": PP_ENGINES[p.schedule] if p.pp > 1 else "1f1b",
            # REDUCE_SCATTER: column linears all-gather their sequence shard, row linears reduce-scatter (SP)
            "tp_mode": "REDUCE_SCATTER" if sp else "ALL_REDUCE",
            # as the estimate costs it: off (nanotron's default, the profile's tp_comm_overlap none), on under SP
            # with --tp-overlap linear-async. The async column linear saves the sequence shard and re-gathers it in
            # backward (parallel/tensor_parallel/functional.py:144, :283); the sync one saves the gathered input
            # (:352-359), as the profile's gathered_inputs_bytes costs. Under ALL_REDUCE o_proj would raise
            # (tensor_parallel/nn.py:133-134)
            "tp_linear_async_communication": asynchronous,
        },
        "model": {
            "model_config": model_config,
            "init_method": {"std": INIT_STD},  # placeholder: RandomInit; ExistingCheckpointInit {path: ...} to load
            "dtype": "bfloat16",
            "make_vocab_size_divisible_by": 1,  # the profile's vocab_padding 0 (config/config.py:181)
            "ddp_bucket_cap_mb": 25,  # the profile's bucket_MiB (config/config.py:182)
        },
        "tokenizer": {"tokenizer_name_or_path": None},  # placeholder: set it with data.dataset
        "checkpoints": {"checkpoints_path": f"checkpoints/{m.name}", "checkpoint_interval": TRAIN_STEPS,
                        "save_initial_state": False},
        "logging": {"log_level": "info", "log_level_replica": "info", "iteration_step_info_interval": 1},
        "tokens": {"sequence_length": s.seq_len, "train_steps": TRAIN_STEPS, "micro_batch_size": s.micro_batch,
                   "batch_accumulation_per_replica": r.grad_accum},
        "optimizer": {
            "zero_stage": p.zero,
            "clip_grad": GRADIENT_CLIP,
            # the profile's fp32 main_grads and master weights (optim/gradient_accumulator.py)
            "accumulate_grad_in_fp32": True,
            # advisor's adamw is torch's default (foreach) kernel, adamw-fused the fused one (helpers.py:174)
            "torch_adam_is_fused": s.optimizer.value == "adamw-fused",
            **PLACEHOLDER_OPTIMIZER,
        },
        # dataset null: placeholder (run_train.py's dummy_infinite_data_generator, dataloader.py:183: random tokens)
        "data": {"dataset": None, "seed": SEED, "num_loading_workers": 1},
    }
    notes = ["placeholders, not advisor's choice: tokens.train_steps, optimizer (weight_decay, adam_*, "
             "learning_rate_scheduler), model.init_method.std, checkpoints, general; data.dataset null trains on "
             "random tokens: set data.dataset.hf_dataset_or_datasets and tokenizer.tokenizer_name_or_path for real "
             "data"]
    if p.pp > 1:
        layers = stage_layers(m, p.pp, p.tp)
        if len(set(layers)) > 1:
            notes.append(f"nanotron places layers by its cost balance, the LM head counted (models/base.py:180-198): "
                         f"stages hold {layers} layers, not the estimate's {m.n_layers / p.pp:g} each")
    if m.norm_eps is None:
        notes.append(f"{m.name}'s norm epsilon is not known here: rms_norm_eps {DEFAULT_EPS:g} is written; set the "
                     "model's own")
    if theta != ROPE_BASE:
        known = f"{m.name}'s is {theta:g}" if theta else f"check {m.name}'s rope_theta"
        notes.append(f"nanotron {VERSION} rotates with base {ROPE_BASE:g} (models/llama.py:57, :324; no rope_theta "
                     f"key): {known}; the cost is the same, the positions differ")
    if s.attention.value != "sdpa":
        notes.append(f"{s.attention.value} attention was costed; nanotron runs flash-attn: memory will be lower")
    if sp and not asynchronous:
        notes.append("tp_linear_async_communication false (nanotron's default): the q/k/v and gate_up linears save "
                     "their all-gathered input, not its sequence shard (functional.py:352-359), as the estimate costs")
    if asynchronous:
        notes.append(f"tp_linear_async_communication true (--tp-overlap linear-async): nanotron {VERSION}'s async row "
                     "linear computes its input gradient from its own rows before gathering it (parallel/"
                     "tensor_parallel/functional.py:417, :439): o_proj's and down_proj's input gradients for the other "
                     "ranks' rows are wrong; check a fixed nanotron before training with it")
    if p.dp > 1 and p.zero == 0 and not p.overlap_grad_reduce:
        notes.append("nanotron's DDP overlaps the gradient all-reduce with backward: faster than estimated")
    return cfg, notes


def nanotron_config(model, hw, plan, setup, grad_accum: int, world_size: int, stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    run = Run(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = nanotron_dict(run, stack)
    env = "CUDA_DEVICE_MAX_CONNECTIONS=1 " if cfg["parallelism"]["tp_linear_async_communication"] else ""
    launch = " ".join(torchrun_argv(hw, world_size, "run_train.py"))
    head = [f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
            f"# launch: {env}{launch} --config-file nanotron_config.yaml (nanotron {VERSION}'s run_train.py; on "
            "several nodes, on each)"]
    if env:
        head.append("# CUDA_DEVICE_MAX_CONNECTIONS=1: async TP communication asserts it "
                    "(nanotron/parallel/utils.py:11-22)")
    head.append("# placeholders (yours): tokens.train_steps, optimizer lr/schedule/decay/betas, init std, checkpoints, "
                "data, tokenizer")
    return commented_yaml("nanotron_config.yaml", head, cfg, notes)
