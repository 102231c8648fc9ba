"""`advisor export`: write the launch configuration of one plan in a format its stack launches (accelerate,
DeepSpeed, Megatron-LM, Megatron-Bridge, torchrun, torchtitan, llm-foundry, litgpt, nanotron; the stack profile's
``launch:``, its first by default).

Thin: the plan options are ``advisor estimate``'s (advisor/cli_options.py) and go through the same
``advisor.api.build_inputs``, so both commands take the same plans with the same defaults and refuse the
same ones with the same one-line messages. The text goes to stdout (also for ``--out -``) or to --out,
written by ``advisor.io.write_atomic`` (what it refuses is in its docstring), notes to stderr. Input
errors are one line on stderr with exit code 2, also when the command is invoked on its own.
``--json`` is refused: the output is the launcher's own format (--format deepspeed is already JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from advisor.cli_options import common_plan_options, single_plan_options
from advisor.export import KINDS


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2)


def refuse_out_over_an_input(out, model, hw, stack) -> None:
    """Refuse an --out that is the --model, --hw or --stack file the command reads (its output would overwrite it)."""
    import os

    from advisor.io import is_file

    if out is None or str(out) == "-" or not is_file(out):
        return
    for option, value in (("--model", model), ("--hw", hw), ("--stack", stack)):
        if isinstance(value, (str, os.PathLike)) and is_file(value) and os.path.samefile(out, value):
            _fail(f"--out {out} is the {option} file this command reads: write the output elsewhere")


@click.command("export")
@common_plan_options
@single_plan_options
@click.option("--format", "kind", type=click.Choice(KINDS), default=None,
              help="the launch format; one the stack launches (advisor stacks show NAME: launch) [default: the stack's first]")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="write here instead of stdout (atomically; - is stdout; devices, FIFOs, links refused)")
def export_command(as_json: bool, kind: str, out: Optional[Path], **kw) -> None:
    """Write the launch configuration of one plan in a format its stack launches (without --format: the stack's usual one).

    The plan options are `advisor estimate`'s; --json is refused (the config is in the launcher's format).
    """
    from advisor.api import launch_config
    from advisor.errors import AdvisorError
    from advisor.io import write_atomic

    if out is not None and str(out) == "-":  # --out - : stdout, as without --out
        out = None
    refuse_out_over_an_input(out, kw.get("model"), kw.get("hw"), kw.get("stack"))
    if as_json:
        _fail("--json does not apply to export: the config is written in its own format (--format deepspeed is JSON)")
    try:
        result = launch_config(kw.pop("model"), kw.pop("hw"), format=kind, **kw)
        if out is not None:  # written before the notes: a bad --out is then one line, not notes and an error
            write_atomic(out, result.text)
    except AdvisorError as exc:
        _fail(str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if out is None:
        click.echo(result.text, nl=False)
    else:
        click.echo(f"wrote {out} ({result.kind} for stack {result.stack}; suggested name {result.filename})", err=True)


export = export_command  # the name advisor/cli.py registers
