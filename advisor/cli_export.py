"""`advisor export`: write the launch configuration (accelerate, DeepSpeed, Megatron-LM, torchrun) for one plan.

Thin: parse options into ModelSpec / Hardware / Plan / TrainingSetup, call advisor.export, write the
text to stdout or --out, notes to stderr. Input errors are one line on stderr with exit code 2.
The options are defined here until the shared option set in advisor/cli.py lands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click
from pydantic import ValidationError

from advisor.errors import AdvisorError, format_validation_error
from advisor.export import KINDS
from advisor.export import export as export_plan
from advisor.hardware import load_hardware
from advisor.io import write_atomic
from advisor.model import load_model
from advisor.plans import Plan, Precision, TrainingSetup, resolve_grad_accum


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2)


@click.command("export")
@click.option("--model", "model_name", required=True, help="catalogue name or path to a Hugging Face config.json")
@click.option("--hw", "hw_name", required=True, help="hardware profile name or YAML path")
@click.option("--gpus", type=int, required=True, help="world size")
@click.option("--dp", type=int, default=None, help="data-parallel degree (default: gpus / (tp x pp))")
@click.option("--tp", type=int, default=1, show_default=True)
@click.option("--pp", type=int, default=1, show_default=True)
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True, help="ZeRO stage")
@click.option("--hybrid-shard", is_flag=True, help="FSDP HYBRID_SHARD (ZeRO-3 inside a node, replicas across)")
@click.option("--sp", is_flag=True, help="Megatron sequence parallelism")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved"]), default="1f1b", show_default=True)
@click.option("--virtual-stages", type=int, default=1, show_default=True)
@click.option("--no-overlap-grad-reduce", is_flag=True, help="do not overlap gradient reduction with backward")
@click.option("--micro-batch", type=int, default=1, show_default=True)
@click.option("--global-batch", type=int, default=None)
@click.option("--grad-accum", type=int, default=None)
@click.option("--seq", "seq_len", type=int, default=1024, show_default=True)
@click.option("--precision", type=click.Choice([p.value for p in Precision]), default="bf16-mixed", show_default=True)
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True)
@click.option("--format", "kind", type=click.Choice(KINDS), required=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write here instead of stdout")
def export_command(model_name: str, hw_name: str, gpus: int, dp: Optional[int], tp: int, pp: int, zero: int,
                   hybrid_shard: bool, sp: bool, schedule: str, virtual_stages: int, no_overlap_grad_reduce: bool,
                   micro_batch: int, global_batch: Optional[int], grad_accum: Optional[int], seq_len: int,
                   precision: str, recompute: str, kind: str, out: Optional[Path]) -> None:
    """Write the launch configuration of one plan (accelerate YAML, DeepSpeed JSON, Megatron-LM args, torchrun)."""
    try:
        model, hw = load_model(model_name), load_hardware(hw_name)
        if dp is None:
            if tp < 1 or pp < 1 or gpus % (tp * pp):
                _fail(f"--gpus {gpus} is not divisible by tp x pp = {tp} x {pp}: give --dp")
            dp = gpus // (tp * pp)
        plan = Plan(dp=dp, tp=tp, pp=pp, zero=zero, hybrid_shard=hybrid_shard, sp=sp, schedule=schedule,
                    virtual_stages=virtual_stages, overlap_grad_reduce=not no_overlap_grad_reduce)
        setup = TrainingSetup(seq_len=seq_len, micro_batch=micro_batch, global_batch=global_batch,
                              grad_accum=grad_accum, precision=Precision(precision), recompute=recompute)
        steps, err = resolve_grad_accum(setup, plan)
        if err:
            _fail(err)
        result = export_plan(kind, model, hw, plan, setup, steps, gpus)
    except ValidationError as exc:
        _fail(format_validation_error(exc))
    except AdvisorError as exc:
        _fail(str(exc))
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if out is None:
        click.echo(result.text, nl=False)
    else:
        write_atomic(out, result.text)
        click.echo(f"wrote {out} ({kind}; suggested name {result.filename})", err=True)


export = export_command  # the name advisor/cli.py registers
