"""How every command-line entry point answers a failure: `advisor ...` (advisor.cli) and `python -m
advisor.cli_calibrate` (what torchrun starts on every rank) alike. Bad input is one line on stderr and exit code 2;
a bug is one line and exit code 1; Ctrl-C is 130; ``--debug`` re-raises, for the traceback.
"""

from __future__ import annotations

import sys

import click

EXIT_USAGE = 2


def fail(msg: str, label: str = "") -> None:
    """``error: msg`` (``label`` after ``error``, e.g. the torchrun rank that says it) and exit code 2."""
    click.echo(f"error{label}: {msg}", err=True)
    sys.exit(EXIT_USAGE)


def _first_line(exc: BaseException, empty: str) -> str:
    return str(exc).splitlines()[0] if str(exc).strip() else empty


def run(command: click.Command, args: list[str], prog_name: str, debug: bool, label: str = "") -> None:
    """``command`` on ``args`` (``--debug`` already taken out of them by the caller) with one-line errors."""
    from advisor.errors import AdvisorError

    try:
        command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:  # `advisor` or a group alone: the help, as click shows it
        click.echo(exc.format_message())
        sys.exit(0)
    except click.ClickException as exc:  # one line, not click's usage block
        if debug:
            raise
        msg = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if isinstance(exc, click.UsageError) and ctx is not None else ""
        fail(msg + hint, label)
    except AdvisorError as exc:
        if debug:
            raise
        fail(_first_line(exc, exc.__class__.__name__), label)
    except (ValueError, OverflowError, MemoryError, RecursionError) as exc:
        if debug:
            raise
        fail(f"{exc.__class__.__name__}: {_first_line(exc, 'invalid input')} (rerun with --debug for the traceback)", label)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a bug: say so in one line, traceback only with --debug
        if debug:
            raise
        click.echo(f"internal error{label}: {exc.__class__.__name__}: {_first_line(exc, '')} (rerun with --debug and "
                   "report it)", err=True)
        sys.exit(1)


def take_debug(args: list[str], command: click.Command) -> tuple[list[str], bool]:
    """``args`` without ``--debug`` wherever it stands as a flag (before the command or after it: `advisor calibrate
    --debug ...`), and whether it did. A ``--debug`` that is the value of an option of ``command`` (or of the
    sub-command named) taking one (`--out --debug`: click takes the next token whole, core.py _match_long_opt), or
    that follows ``--``, is an argument, and stays."""
    out, debug, values, i = [], False, _value_options(command), 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return out + args[i:], debug
        if a == "--debug":
            debug, i = True, i + 1
            continue
        if isinstance(command, click.Group) and a in command.commands:  # the sub-command: its own options from here
            command = command.commands[a]
            values = _value_options(command)
        take = 1 + values.get(a, 0)
        out, i = out + args[i:i + take], i + take
    return out, debug


def _value_options(command: click.Command) -> dict[str, int]:
    """The option names of ``command`` that take values -> how many tokens each takes (not flags or counts)."""
    return {name: p.nargs for p in command.params if isinstance(p, click.Option) and not (p.is_flag or p.count)
            for name in p.opts}
