"""torchrun: the launch line (torch.distributed.run's flags), single node standalone or c10d rendezvous."""

from __future__ import annotations

import shlex

from advisor.export.common import (RDZV_PORT, Exported, ExportError, Plan, TrainingSetup, check, header, hf_recompute_note,
                                   node_layout)
from advisor.hardware import Hardware
from advisor.model import ModelSpec


def torchrun_argv(hw: Hardware, world_size: int, script: str = "train.py") -> list[str]:
    """torchrun arguments; multi-node uses c10d rendezvous on node 0 ($MASTER_ADDR), shared $JOB_ID. The flags in
    their underscore forms, which every torchrun parses (torch 1.11's run.py has only those; 2.x adds the dashed)."""
    lay = node_layout(hw, world_size)
    argv = ["torchrun", "--nnodes", str(lay.nnodes), "--nproc_per_node", str(lay.nproc_per_node)]
    if lay.nnodes == 1:
        argv.append("--standalone")
    else:
        argv += ["--rdzv_backend", "c10d", "--rdzv_endpoint", f"$MASTER_ADDR:{RDZV_PORT}", "--rdzv_id", "$JOB_ID"]
    return argv + [script]


def torchrun_command(model: ModelSpec, hw: Hardware, plan: Plan, setup: TrainingSetup, grad_accum: int,
                     world_size: int) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    lay = node_layout(hw, world_size)
    where = ("one node" if lay.nnodes == 1 else
             f"each of the {lay.nnodes} nodes; MASTER_ADDR = node 0's address, JOB_ID = any id shared by the nodes")
    line = " ".join(a if a.startswith("$") else shlex.quote(a) for a in torchrun_argv(hw, world_size))
    # torchrun starts the processes and sets nothing else: a plan's model parallelism is the script's to build, or
    # every rank would train as a data-parallel replica
    split = [f"{name}={n}" for name, n in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp)) if n > 1]
    notes = ((f"the plan's {' and '.join(split)} {'is' if len(split) == 1 else 'are'} not set by torchrun, which only "
              f"starts the {world_size} processes: "
              "train.py builds them (for TP, transformers' from_pretrained(tp_plan='auto'))",) if split else ())
    if plan.offload.value != "none":  # a launch line holds no engine config
        raise ExportError(f"torchrun starts the processes only; the plan's {plan.offload.value} offload is an engine's "
                          "configuration: use --format deepspeed (ZeRO-Offload) or accelerate")
    sharded = {1: "ZeRO-1 is not set by torchrun either: train.py shards the optimizer states (DeepSpeed's stage 1, "
                  "torch's ZeroRedundancyOptimizer)",
               2: "FSDP SHARD_GRAD_OP (ZeRO-2) is not set by torchrun either: train.py wraps the model in FSDP",
               3: f"FSDP {'HYBRID_SHARD (HSDP' if plan.hybrid_shard else 'FULL_SHARD (ZeRO-3'}) is not set by torchrun "
                  "either: train.py wraps the model in FSDP"}
    if plan.zero in sharded:
        notes += (f"the plan's {sharded[plan.zero]}"
                  + (", a unit per decoder layer as it was costed" if plan.zero >= 2 else ""),)
    if (recompute := hf_recompute_note(setup)) is not None:
        notes += (recompute,)
    text = (f"# {header(model, hw, plan, setup, grad_accum, world_size)}\n# run on {where}\n"
            + "".join(f"# note: {n}\n" for n in notes) + f"{line}\n")
    return Exported("torchrun.sh", text, notes)
