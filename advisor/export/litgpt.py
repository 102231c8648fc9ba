"""litgpt: a config YAML for ``litgpt finetune_lora`` / ``litgpt finetune_full`` (litgpt 0.5.13), the file its CLI
reads with ``--config`` (litgpt/__main__.py: jsonargparse's CLI over the ``setup`` functions of litgpt/finetune/lora.py
and full.py: their arguments are the keys, ``train`` the nested litgpt.args.TrainArgs).

What litgpt runs, from those two files, decides what it can be given:
- one device: Fabric's ``strategy="auto"``, no activation checkpointing, ``quantize`` (bitsandbytes through
  Lightning's BitsandbytesPrecision: bnb.nf4, bnb.nf4-dq, bnb.int8-training) only here, and only under a ``-true``
  precision ("Quantization and mixed precision is not supported");
- several devices: LoRA shards with FSDP2 (``ModelParallelStrategy``, ``parallelize_fn``: every Block and trainable
  Linear ``fully_shard``-ed, every Block wrapped in ``checkpoint_wrapper``), full fine-tuning with FSDP
  (``FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})``, FULL_SHARD): ZeRO-3 with
  full recomputation, nothing else;
- no tensor, pipeline, context or expert parallelism, no offload.
LoRA's targets are litgpt's six switches (lora_query, lora_key, lora_value, lora_projection, lora_mlp: every MLP
linear, lora_head). Data, optimizer schedule and the checkpoint's path are the user's: the file names them as
placeholders. The notes are written into the YAML as comments.
"""

from __future__ import annotations

from typing import Any

from advisor.export.common import Exported, ExportError, Precision, Run, check, commented_yaml, header, node_layout
from advisor.finetune import Library, Method, Quant

# Lightning Fabric's precision names (lightning/fabric/connector.py _PRECISION_INPUT) for advisor's precisions
PRECISION = {Precision.bf16: "bf16-true", Precision.bf16_mixed: "bf16-mixed", Precision.fp32: "32-true",
             Precision.fp16_mixed: "16-mixed"}
COMMANDS = {Method.lora: "finetune_lora", Method.qlora: "finetune_lora", Method.full: "finetune_full"}


def _quantize(r: Run) -> Any:
    ft = r.setup.finetune
    if ft.method is not Method.qlora:
        return None
    quant = ft.quant or Quant.nf4
    if quant is Quant.int8:
        return "bnb.int8-training"
    return "bnb.nf4-dq" if ft.double_quant else "bnb.nf4"


def _switches(r: Run) -> dict[str, bool]:
    """litgpt's six LoRA switches for the run's targets; a subset of the MLP's linears litgpt cannot adapt alone."""
    targets = set(r.setup.finetune.targets.split(","))
    mlp = {"up", "down"} | ({"gate"} if any(lin.name.endswith("gate") for lin in r.model.layer.linears) else set())
    chosen = targets & {"gate", "up", "down"}
    if chosen and chosen != mlp:
        raise ExportError(f"LoRA targets {','.join(sorted(chosen))}: litgpt's lora_mlp adapts every MLP linear "
                          f"({','.join(sorted(mlp))}) or none; use --lora-targets with all of them or none")
    return {"lora_query": bool(targets & {"q", "qkv"}), "lora_key": bool(targets & {"k", "qkv"}),
            "lora_value": bool(targets & {"v", "qkv"}), "lora_projection": "o" in targets, "lora_mlp": bool(chosen),
            "lora_head": "head" in targets}


def _refuse(r: Run) -> None:
    p, s, ft = r.plan, r.setup, r.setup.finetune
    if p.tp > 1 or p.pp > 1 or p.cp > 1 or p.ep > 1:
        raise ExportError(f"litgpt fine-tunes with data parallelism only: no tp={p.tp}, pp={p.pp}, cp={p.cp}, "
                          f"ep={p.ep}; export accelerate or deepspeed, or plan with --stack litgpt")
    if p.offload.value != "none":
        raise ExportError(f"litgpt has no offload ({p.offload.value}): export deepspeed")
    if s.precision not in PRECISION:
        raise ExportError(f"--precision {s.precision.value}: litgpt trains in bf16-true (--precision bf16), "
                          "bf16-mixed, 16-mixed or 32-true")
    if ft.method is Method.qlora and s.precision.autocast:
        raise ExportError(f"--precision {s.precision.value} with QLoRA: litgpt quantises only under a -true "
                          "precision; use --precision bf16")
    many = r.world_size > 1
    if many and ft.method is Method.qlora:
        raise ExportError("litgpt quantises only on one device (finetune/lora.py: not supported for multi-GPU "
                          "training): --gpus 1, or --method lora")
    if many and (p.zero < 3 or p.hybrid_shard):
        raise ExportError(f"litgpt shards every Block on several devices (FSDP full shard): --zero 3, not "
                          f"{'HSDP' if p.hybrid_shard else f'ZeRO-{p.zero}'}")
    want = "full" if many else "none"
    if s.recompute.value != want:
        raise ExportError(f"--recompute {s.recompute.value}: litgpt checkpoints every Block " +
                          ("on several devices: use --recompute full" if many else
                           "only on several devices: use --recompute none on one"))
    if ft.adapters and ft.method not in COMMANDS:
        raise ExportError(f"--method {ft.method.value}: litgpt's config here is LoRA, QLoRA or full fine-tuning")
    if ft.adapters and ft.dora:
        raise ExportError("--dora: litgpt's LoRA has no weight-decomposed variant (litgpt/lora.py); export accelerate "
                          "(PEFT's use_dora)")
    if ft.adapters and float(ft.lora_alpha) != int(ft.lora_alpha):
        raise ExportError(f"--lora-alpha {ft.lora_alpha}: litgpt's lora_alpha is an integer")


def litgpt_dict(r: Run) -> tuple[dict[str, Any], list[str]]:
    """The config's mapping and the notes."""
    _refuse(r)
    s, ft = r.setup, r.setup.finetune
    lay = node_layout(r.hw, r.world_size)
    cfg: dict[str, Any] = {
        "checkpoint_dir": f"checkpoints/{r.model.name}",  # placeholder: `litgpt download` writes checkpoints/<repo id>
        "out_dir": f"out/finetune/{ft.method.value}-{r.model.name.split('/')[-1]}",
        "precision": PRECISION[s.precision],
        "devices": lay.nproc_per_node,
        "num_nodes": lay.nnodes,
    }
    if ft.adapters:
        quantize = _quantize(r)
        if quantize is not None:
            cfg["quantize"] = quantize
        cfg.update(lora_r=ft.lora_rank, lora_alpha=int(ft.lora_alpha), lora_dropout=ft.lora_dropout, **_switches(r))
    cfg["train"] = {"global_batch_size": s.micro_batch * r.grad_accum * r.plan.dp, "micro_batch_size": s.micro_batch,
                    "max_seq_length": s.seq_len}
    cfg["optimizer"] = "SGD" if s.optimizer.value == "sgd" else "AdamW"
    notes = []
    if ft.adapters and ft.library is not Library.litgpt:
        notes.append(f"the estimate costed {ft.library.value}'s LoRA modules; litgpt's fuse q, k and v into one "
                     "LoRAQKVLinear with one dropout (--lora-library litgpt costs them)")
    if ft.adapters and r.world_size > 1:
        notes.append("litgpt 0.5.13 shards LoRA runs with FSDP2 (ModelParallelStrategy: fully_shard per Block and "
                     "per trainable Linear); the litgpt profile costs lit-gpt's FSDP of its resource tables (one "
                     "unit per Block)")
    if s.optimizer.value == "adamw-fused":
        notes.append("litgpt builds torch.optim.AdamW with its defaults (foreach, not fused): the estimate's fused "
                     "step is a little faster")
    return cfg, notes


def litgpt_config(model, hw, plan, setup, grad_accum: int, world_size: int) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    run = Run(model, hw, plan, setup, grad_accum, world_size)
    cfg, notes = litgpt_dict(run)
    command = COMMANDS.get(setup.finetune.method, "finetune_full")
    name = {"finetune_lora": "qlora" if setup.finetune.method is Method.qlora else "lora"}.get(command, "full")
    head = [f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
            f"# launch: litgpt {command} --config {name}.yaml (litgpt 0.5.13; on several nodes, on each)",
            "# checkpoint_dir is a placeholder (`litgpt download <repo id>` writes checkpoints/<repo id>); data is "
            "litgpt's default (Alpaca): --data to change it"]
    return commented_yaml(f"{name}.yaml", head, cfg, notes)
