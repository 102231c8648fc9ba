"""Command line: parse, call the library, render. Every input error is one line and exit code 2.

The heavy modules (numpy, pydantic models, the search) are imported inside the commands so that
``advisor --help`` answers at once; torch is never imported here.
"""

from __future__ import annotations

import json
import sys

import click

from advisor.cli_errors import fail as _fail  # one line, exit code 2
from advisor.cli_options import common_plan_options, fixed_plan_options, single_plan_options
from advisor.export import KINDS as EXPORT_KINDS  # `plan --export` offers what `export --format` does


class _Commands(click.Group):
    """advisor's commands and those installed packages add through the ``advisor.commands`` entry points
    (validate, from validation/: advisor never imports it). A plugin is loaded only when it is run or listed
    in the help, and one that cannot load says why when run instead of vanishing."""

    @staticmethod
    def _plugins() -> dict:
        from importlib.metadata import entry_points

        return {ep.name: ep for ep in entry_points(group="advisor.commands")}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugins()))

    def get_command(self, ctx: click.Context, name: str):
        cmd = super().get_command(ctx, name)
        ep = self._plugins().get(name) if cmd is None else None
        if ep is None:
            return cmd
        try:
            cmd = ep.load()
        except Exception as exc:  # a broken plugin is reported when it is run, never silently dropped
            return _broken(name, exc)
        return cmd if isinstance(cmd, click.Command) else _broken(name, TypeError("not a click command"))


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="show tracebacks (for bug reports)")
@click.version_option("0.1.0", prog_name="advisor")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """advisor: which parallel plan trains your model fastest on your GPUs, and why."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


@cli.command()
@common_plan_options
@single_plan_options
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="write the estimate to this file instead of stdout; - is stdout")
def estimate(as_json: bool, out, **kw) -> None:
    """Estimate one plan: step time, throughput, MFU, memory, and the full breakdown."""
    from advisor.api import estimate as run_estimate
    from advisor.cli_export import refuse_out_over_an_input
    from advisor.render import render_estimate

    model, hw = kw.pop("model"), kw.pop("hw")
    refuse_out_over_an_input(out, model, hw, kw.get("stack"))
    result = run_estimate(model, hw, **kw)
    asked = str(kw.get("stack") or "auto")  # a --stack FILE: its profile, which the result's name does not find again
    text = (json.dumps(result.model_dump(mode="json"), indent=2) if as_json
            else render_estimate(result, None if asked in ("auto", "any") else asked))
    _emit(out, text + "\n", "the estimate")


@cli.command()
@common_plan_options
@click.option("--gpus", default=None, help="total GPUs, or a range A:B searched as A, 2A, 4A, ... <= B [default: one node]")
@click.option("--tokens", default=None, help="a token budget (e.g. 1T, 300B): each plan's time and cost to train it")
@click.option("--global-batch", type=int, default=None, help="sequences per step [default: stated in the output]")
# advisor.options.DEFAULT_HEADROOM, literal here: the command line imports no pydantic before a command runs
@click.option("--memory-headroom", type=float, default=0.05, show_default=True, help="fraction of GPU memory kept free beyond the modelled overheads")
@click.option("--objective", type=click.Choice(["time", "throughput", "memory", "cost"]), default="time", show_default=True)
@click.option("--top", type=int, default=10, show_default=True)
@click.option("--explain", is_flag=True, help="also show rejected plans counted by reason")
@click.option("--export", "export_kind", type=click.Choice(EXPORT_KINDS),
              default=None, help="write the launch config of the top plan, in a format its stack launches")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="write the ranking (or with --export the launch config) to this file instead of stdout; - is stdout")
@click.option("--allow-tp-across-nodes", is_flag=True)
@fixed_plan_options
def plan(as_json: bool, top: int, explain: bool, export_kind, out, **kw) -> None:
    """Search every valid plan and rank them (fastest first), each with the reason for its rank."""
    from advisor.render import render_plan
    from advisor.search import plan as run_plan

    model, hw = kw.pop("model"), kw.pop("hw")
    from advisor.cli_export import refuse_out_over_an_input

    refuse_out_over_an_input(out, model, hw, kw.get("stack"))
    if export_kind and as_json:  # as `advisor export` refuses it
        _fail("--json does not apply with --export: the config is written in its own format (drop --json; or drop --export "
              "for the ranking as JSON)")
    if export_kind and str(kw.get("stack")) == "any":  # a ranking over every stack, a file for one of them
        from advisor.export import stacks_launching

        _fail(f"--stack any ranks every stack's plans, and {export_kind} launches only some: --export {export_kind} "
              f"with --stack {' or '.join(stacks_launching(export_kind))} (or none: the format picks its stack)")
    from advisor.precision_search import rank_precisions

    recipes = None
    if kw.get("precision") == "auto":  # every precision the GPU has, ranked by their best plans (advisor.search)
        kw.pop("precision")
        result, recipes = rank_precisions(model, hw, top=top, **kw)
    else:
        result = run_plan(model, hw, top=top, **kw)
    if export_kind and str(kw.get("stack") or "auto") == "auto" and result.plans:
        from advisor.export import launching  # no stack given: search the stack that launches the format
        from advisor.stack import load_stack

        chosen = load_stack(result.plans[0].estimate.stack)
        if export_kind not in chosen.launch:  # under --precision auto, every precision again in that stack
            kw = {**kw, "stack": launching(export_kind, chosen)}
            result, recipes = (rank_precisions(model, hw, top=top, **kw) if recipes is not None
                               else (run_plan(model, hw, top=top, **kw), None))
    suggestion = ""
    if not result.plans:
        from advisor.suggest import suggest_fix

        suggestion = suggest_fix(result, run_plan)
    if export_kind:
        if not result.plans:
            _fail("no plan fits, nothing to export: " + suggestion)
        others = [r for _, r, _ in recipes or () if r is not None and r is not result and r.plans and
                  r.setup.stack == result.setup.stack]  # --precision auto: the next precisions, in the same stack
        return _export_best(result, export_kind, kw, out, others)
    from advisor.travel import faster_travel  # a mixture of experts: the stack's other ways to move tokens

    travel = faster_travel(result, kw.get("moe_dispatcher"), kw.get("moe_overlap")) if (as_json or result.plans) else None
    if as_json:
        _emit(out, json.dumps({**result.to_json(), "moe_travel_note": travel}, indent=2) + "\n", "the ranking (JSON)")
    elif result.plans or explain:
        text = render_plan(result, explain=explain, suggestion=suggestion) + "\n"
        if travel:
            text += f"note: {travel}\n"
        if recipes is not None:
            text += "\nprecisions ranked (--precision auto; the best plan of each):\n" + "".join(
                f"  {i}. {name:18s} {why}\n" for i, (name, _, why) in enumerate(recipes, 1))
        _emit(out, text, "the ranking")
    if not result.plans:  # a cluster no plan fits is an input problem: say what would fit, exit 2
        method = getattr(result, "method_choice", None)  # --method auto: the method the suggestion is for
        said = f" ({method['lines'][0].removeprefix('method auto: ')})" if method and method.get("lines") else ""
        _fail(f"no plan fits {result.model_spec.name} on {result.world_size:,}x {result.hardware.name}{said}: {suggestion}")


def _export_best(result, export_kind: str, kw: dict, out, others=()) -> None:
    """plan --export: the best ranked plan the format writes (a TP plan accelerate cannot, a stack that does not
    launch it: the next), said where it is not plan 1; under --precision auto, where no plan of the fastest precision
    exports (a recipe the format has no config for), the next precision's (``others``, fastest first), said; where
    none does, the first refusal in plan's own flags."""
    from advisor.errors import AdvisorError
    from advisor.export import export as export_plan

    first_error, written = None, None
    for search in (result, *others):
        for rank, row in enumerate(search.plans, 1):
            best = row.estimate
            try:
                written = export_plan(export_kind, search.model_spec, search.hardware, best.plan, best.setup,
                                      best.grad_accum, best.world_size,
                                      best.stack if str(kw.get("stack") or "auto") == "auto" else kw["stack"])
                break
            except AdvisorError as exc:
                first_error = first_error or exc
        if written is not None:
            break
    said = str(first_error).replace("--format ", "--export ")  # plan's flag for the format
    if written is None:
        _fail(f"{said} (none of the {len(result.plans)} plans ranked exports as {export_kind}: --top "
              f"{4 * len(result.plans)} ranks more)")
    _emit(out, written.text, f"{export_kind} config for '{best.label}'")  # first: a bad --out is one line
    if search is not result:
        click.echo(f"note: the best plan in {best.setup.precision.value}, the fastest precision {export_kind} writes "
                   f"(plan 1 in {result.setup.precision.value}, {result.plans[0].estimate.label}: {said})", err=True)
    elif rank > 1:
        click.echo(f"note: plan {rank} of the ranking, the best {export_kind} writes (plan 1, "
                   f"{result.plans[0].estimate.label}: {said})", err=True)
    for note in written.notes:
        click.echo(f"note: {note}", err=True)


def _emit(out, text: str, what: str) -> None:
    """``text`` to stdout, or atomically to the file ``out`` (``-``: stdout), saying on stderr what went where."""
    if out is None or out == "-":
        click.echo(text, nl=False)
        return
    from advisor.io import write_atomic

    write_atomic(out, text)
    click.echo(f"wrote {what} to {out}", err=True)


@cli.group(invoke_without_command=True)
@click.pass_context
def profiles(ctx: click.Context) -> None:
    """List the hardware profiles (`advisor profiles show NAME` prints one)."""
    if ctx.invoked_subcommand is None:
        from advisor.hardware import list_profiles, load_hardware

        for name in list_profiles():
            hw = load_hardware(name)
            click.echo(f"{name:18s} {hw.gpus_per_node}x {hw.gpu.name:16s} {hw.intra_node.kind.value}, {hw.inter_node.kind.value}  {hw.description}")


@profiles.command("show")
@click.argument("name")
def profiles_show(name: str) -> None:
    """Print a profile as YAML that --hw accepts back unchanged."""
    from advisor.hardware import hardware_to_yaml, load_hardware

    click.echo(hardware_to_yaml(load_hardware(name)), nl=False)


@cli.group(invoke_without_command=True)
@click.pass_context
def stacks(ctx: click.Context) -> None:
    """List the training-stack profiles (`advisor stacks show NAME` prints one)."""
    if ctx.invoked_subcommand is None:
        from advisor.stack import list_stacks, load_stack

        for name in list_stacks():
            click.echo(f"{name:20s} {load_stack(name).description}")


@stacks.command("show")
@click.argument("name")
def stacks_show(name: str) -> None:
    """Print a stack profile as YAML that --stack accepts back unchanged."""
    from advisor.stack import load_stack, stack_to_yaml

    click.echo(stack_to_yaml(load_stack(name)), nl=False)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json: bool) -> None:
    """List the built-in models with their parameter counts."""
    from advisor.model import CATALOGUE

    if as_json:
        click.echo(json.dumps({n: {"params": m.n_params, "active_params": m.active_params, **m.model_dump(mode="json")}
                               for n, m in CATALOGUE.items()}, indent=2))
        return
    for name, m in CATALOGUE.items():
        click.echo(f"{name:16s} {m.n_params / 1e9:8.3f}B  {_model_line(m)}")


def _model_line(m) -> str:
    """A catalogue model's shape in one line: family, widths, heads (GQA, MLA), MLP or experts, windows."""
    attn = f" kv_heads={m.kv_heads}" if m.kv_heads != m.n_heads and m.latent is None else ""
    if m.latent is not None:
        attn = f" mla(kv_rank={m.latent.kv_lora_rank}, q_rank={m.latent.q_lora_rank})"
    mlp = f"d_ff={m.d_ff} {m.mlp.value}"
    if m.experts is not None:
        e = m.experts
        shared = f" +shared d_ff={e.d_ff_shared}" if e.d_ff_shared else ""
        mlp = f"experts={e.n_experts} top-{e.experts_per_token} d_ff={e.d_ff_expert}{shared} {m.mlp.value} " \
              f"({m.active_params / 1e9:.3f}B active)"
    windows = sorted({r.window for r in m.layer_runs if r.window})
    window = f" window={'/'.join(map(str, windows))}" if windows else ""
    chunks = sorted({r.chunk for r in m.layer_runs if r.chunk})
    window += f" chunk={'/'.join(map(str, chunks))}" if chunks else ""
    return f"{m.family:12s} layers={m.n_layers} d_model={m.d_model} heads={m.n_heads}{attn} {mlp} vocab={m.vocab}{window}"


def _broken(name: str, exc: Exception) -> click.Command:
    """A command whose module cannot be loaded: listed as usual, and it says why when run (exit 2)."""
    why = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def run() -> None:
        _fail(f"the '{name}' command cannot be loaded ({why}); reinstall advisor (pip install -e .)")

    return click.Command(name, callback=run, help=f"(cannot be loaded: {why})", context_settings={"ignore_unknown_options": True})


def _register_commands() -> None:
    """Commands in their own modules: calibrate and export (advisor's own)."""
    from advisor.cli_calibrate import calibrate
    from advisor.cli_export import export_command

    cli.add_command(calibrate)
    cli.add_command(export_command)
    cli.add_command(__import__("advisor.cli_probe", fromlist=["probe_command"]).probe_command)


_register_commands()


def main(argv=None) -> None:
    """Entry point: one-line errors with exit code 2 for bad input; --debug (before or after the command) shows
    tracebacks (advisor.cli_errors)."""
    from advisor import allocator
    from advisor.cli_errors import run, take_debug

    allocator.tune()  # the search's temporaries reused, not page-faulted in anew (advisor/allocator.py)
    args, debug = take_debug(list(sys.argv[1:] if argv is None else argv), cli)
    run(cli, ["--debug", *args] if debug else args, "advisor", debug)


if __name__ == "__main__":
    main()
