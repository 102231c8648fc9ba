"""A stack profile given by path (--stack FILE, README: "`--stack` takes a name or a YAML path; `base:` works as for
hardware") runs every command a built-in name runs: the rows of a search and an estimate name their stack, and the
parts that looked a stack up again by that name (the mixture-of-experts dispatch note, --precision auto's ranking,
the activation-offload column) refused the file's name as an unknown built-in profile after the search had run.

A copy of megatron-core under another name must answer as megatron-core does, figure for figure."""

import json

from click.testing import CliRunner

from advisor.cli import cli

COPY = "name: my-mc\ndescription: megatron-core under another name\nbase: megatron-core\n"


def run(args):
    return CliRunner().invoke(cli, args)


def _copy(tmp_path):
    path = tmp_path / "my-mc.yaml"
    path.write_text(COPY)
    return str(path)


def test_moe_plan_note_runs_on_a_stack_file(tmp_path):
    """The best plan splits the experts (EP 8): the note re-estimates it under the stack's other dispatchers; it read
    the stack by the row's name, 'my-mc', which no built-in profile has (exit 2 before the fix)."""
    args = ["plan", "--model", "qwen3-30b-a3b", "--hw", "dgx-h100", "--top", "1"]
    mine, shipped = run(args + ["--stack", _copy(tmp_path)]), run(args + ["--stack", "megatron-core"])
    assert mine.exit_code == 0 and shipped.exit_code == 0, mine.output
    note = [line for line in mine.output.splitlines() if line.startswith("note: my-mc also runs flex")]
    assert note and note[0].replace("my-mc", "megatron-core") in shipped.output.splitlines()


def test_precision_auto_runs_on_a_stack_file(tmp_path):
    """--precision auto's ranking builds each recipe's workload in the stack of its best row."""
    args = ["plan", "--model", "llama3-8b", "--hw", "dgx-h100", "--top", "1", "--precision", "auto"]
    mine, shipped = run(args + ["--stack", _copy(tmp_path)]), run(args + ["--stack", "megatron-core"])
    assert mine.exit_code == 0 and shipped.exit_code == 0, mine.output
    ranked = [line for line in mine.output.splitlines() if line.startswith("  1. ")]
    assert ranked and ranked[0] in shipped.output.splitlines()  # fp8-delayed first, the same tokens/s


def test_activation_offload_column_on_a_stack_file(tmp_path):
    """megatron-core offloads the first k layers' activations (engine.activation_offload first_k): the policy says k."""
    args = ["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--dp", "8", "--recompute", "offload",
            "--recompute-layers", "2"]
    mine = run(args + ["--stack", _copy(tmp_path)])
    assert mine.exit_code == 0, mine.output
    assert "recompute offload(2), adamw-fused" in mine.output
    js = json.loads(run(args + ["--stack", _copy(tmp_path), "--json"]).output)
    ref = json.loads(run(args + ["--stack", "megatron-core", "--json"]).output)
    assert js["step_time_s"] == ref["step_time_s"] and js["stack"] == "my-mc"
