"""`advisor probe`: a training stack's own model code, run on CPU, measured into the part of its stack profile that
can be measured there (advisor.probe).

    advisor probe --stack torchtitan --out frag.yaml
    advisor probe --stack hf-trainer --model gpt2        # a model family, or a model whose family the stack builds
"""

from __future__ import annotations

import click

from advisor.errors import AdvisorError

TORCH_HINT = "torch is not installed: pip install 'advisor[calibrate]' (install the torch build for your machine first)"


def family_of(adapter, model: str | None) -> str:
    """The adapter's family for --model: a family name, or a catalogue model whose MLP one of its families has."""
    if model is None or model in adapter.families:
        return model or adapter.default_family
    from advisor.model.catalogue import load_model
    from advisor.probe import ProbeError

    mlp = load_model(model).mlp.value
    for name, fam in adapter.families.items():
        if fam.mlp == mlp:
            return name
    raise ProbeError(f"stack {adapter.stack} probes {', '.join(sorted(adapter.families))}; none has the {mlp} MLP "
                     f"of {model}")


@click.command("probe")
@click.option("--stack", "stack", required=True, help="the stack profile to measure (advisor stacks)")
@click.option("--model", "model", default=None,
              help="model family (e.g. llama, gpt2) or a model whose family the stack builds (default: the stack's)")
@click.option("--out", "out", default="-", show_default=True, type=click.Path(dir_okay=False, allow_dash=True),
              help="YAML fragment to write ('-': stdout)")
def probe_command(stack, model, out):
    """Build the stack's model code for small configs, run forward and backward on CPU, and write the measured part
    of its stack profile (saved bytes per layer and outside it, aten ops per layer, element-wise bytes)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise AdvisorError(TORCH_HINT) from None
    from advisor.io import writable, write_atomic
    from advisor.probe import adapter_for

    if out != "-":
        writable(out)  # before the probe's minutes, not after
    from advisor.probe.core import probe
    from advisor.probe.fragment import to_yaml
    from advisor.stack import StackError, load_stack

    adapter = adapter_for(stack)
    adapter.version()  # a one-line error naming the pip command when the library is missing
    family = family_of(adapter, model)
    try:
        shipped = load_stack(adapter.stack)
    except StackError:
        shipped = None
    text = to_yaml(probe(adapter, family), shipped, adapter.split_note)
    if out == "-":
        click.echo(text, nl=False)
    else:
        write_atomic(out, text)
        click.echo(f"wrote {out}", err=True)
