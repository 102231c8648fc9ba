"""Issue 18's reproducers that concern the options, the command line and the ranking: each failed before."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import advisor
from advisor.cli import cli, main
from advisor.errors import AdvisorError

from _robust import tried


def run(args: list[str]) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, args, catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def one_line_exit_2(args: list[str], capsys) -> str:
    tried("cli")
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args, needle", [
    # --zero 1 --fsdp full-shard used to cost ZeRO-3 silently
    (["--zero", "1", "--fsdp", "full-shard", "--gpus", "8"], "--zero 1 contradicts --fsdp full-shard"),
    # --virtual-stages 3 with a 1F1B schedule used to be ignored
    (["--pp", "2", "--virtual-stages", "3"], "--virtual-stages 3 needs --schedule interleaved"),
])
def test_contradicting_options_are_refused(args, needle, capsys):
    assert needle in one_line_exit_2(["estimate", "--model", "gpt2", "--hw", "dgx-a100", *args], capsys)


def test_estimate_without_gpus_runs_on_dp_x_tp_x_pp():
    # `estimate --tp 8` without --gpus ran on one GPU though the help says dp x tp x pp
    e = advisor.estimate("llama3-8b", "dgx-h100", tp=8)
    assert e.world_size == 8 and e.plan.tp == 8 and e.plan.dp == 1
    assert advisor.estimate("llama3-8b", "dgx-h100", tp=2, pp=2, dp=2).world_size == 8


@pytest.mark.parametrize("kw, needle", [
    (dict(gpus=np.uint8(8)), None),  # used to overflow: np.uint8(8) is 8 GPUs
    (dict(gpus=8.5), "--gpus: must be a whole number of GPUs"),  # used to return an empty result on 8.5 GPUs
    (dict(gpus=True), "--gpus: must be a number, not true"),  # used to run on one GPU
    (dict(top=8.0), None),  # used to raise TypeError
    (dict(gpuz=8), "unknown option 'gpuz': did you mean gpus?"),  # used to name an internal function
    (dict(objective="speed"), "--objective"),
    (dict(tokens="12X"), "is not a token count"),
])
def test_python_api_validates_at_the_boundary(kw, needle):
    tried("plans")
    if needle is None:
        res = advisor.plan("gpt2", "dgx-a100", **kw)
        assert res.world_size == 8 and res.plans
        return
    with pytest.raises(AdvisorError) as exc:
        advisor.plan("gpt2", "dgx-a100", **kw)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_estimate_api_refuses_a_misspelt_keyword_in_its_own_words():
    tried("plans")
    with pytest.raises(AdvisorError, match="estimate: unknown option 'micro_bach': did you mean micro_batch"):
        advisor.estimate("gpt2", "dgx-a100", micro_bach=2)


def test_help_shows_the_real_parameters():
    import inspect

    for fn, names in ((advisor.plan, {"gpus", "objective", "tokens", "stack", "memory_headroom"}),
                      (advisor.estimate, {"gpus", "tp", "zero", "fsdp", "recompute", "stack"})):
        params = set(inspect.signature(fn).parameters)
        assert names <= params, params
        assert fn.__doc__ and "AdvisorError" in fn.__doc__
    assert isinstance(advisor.plan("gpt2", "dgx-a100", top=1).plans[0].estimate.plan, advisor.Plan)


def test_plan_out_without_export_writes_the_ranking(tmp_path):
    # `advisor plan --out x.json` without --export used to write nothing
    out = tmp_path / "plans.json"
    code, _, err = run(["plan", "--model", "gpt2", "--hw", "dgx-a100", "--top", "2", "--json", "--out", str(out)])
    assert code == 0 and f"wrote the ranking (JSON) to {out}" in err
    assert len(json.loads(out.read_text())["plans"]) == 2


def test_objectives_over_a_range_of_gpu_counts_mean_different_things():
    # `--objective cost` and `throughput` ranked exactly like `time` (a fixed GPU count cannot tell them apart):
    # over 8..64 GPUs the fastest plan uses more GPUs, the cheapest uses each GPU best.
    kw = dict(gpus="8:64", seq=2048, top=1, tokens="1T")
    fast = advisor.plan("llama3-8b", "aws-p4d", objective="time", **kw)
    cheap = advisor.plan("llama3-8b", "aws-p4d", objective="cost", **kw)
    assert fast.worlds == [8, 16, 32, 64] and fast.global_batch % 64 == 0
    f, c = fast.plans[0].estimate, cheap.plans[0].estimate
    assert f.world_size > c.world_size and f.step_time_s < c.step_time_s
    assert c.usd_per_million_tokens < f.usd_per_million_tokens
    assert cheap.train_cost_usd(c) < fast.train_cost_usd(f) and fast.train_time_s(f) < cheap.train_time_s(c)
    assert cheap.train_time_s(c) == pytest.approx(1e12 / c.tokens_per_s)
    row = cheap.to_json()["plans"][0]
    # p4d.24xlarge on demand: 32.77 USD/h for 8 GPUs (the profile's 4.1 per GPU-hour)
    # whole steps: ceil(budget / tokens a step) of them (a budget below one step still takes one)
    steps = math.ceil(1e12 / c.tokens_per_step)
    assert row["train_cost_usd"] == pytest.approx(4.1 * c.world_size * steps * c.step_time_s / 3600, rel=1e-12)
    text = CliRunner().invoke(cli, ["plan", "--model", "llama3-8b", "--hw", "aws-p4d", "--gpus", "8:64", "--seq", "2048",
                                    "--objective", "cost", "--tokens", "1T", "--top", "1"]).stdout
    text = " ".join(text.split())
    assert "GPUs" in text and "train cost" in text and "USD per million tokens" in text
    assert "budget 1T tokens" in text  # as --tokens takes it, not '1e+12'


def test_a_range_must_be_whole_nodes(capsys):
    assert "12 GPUs is not a whole number of 8-GPU nodes" in one_line_exit_2(
        ["plan", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "6:64"], capsys)


def test_default_sequence_is_the_models_context_and_is_said():
    # the default used to be 1024 for every model, Llama 3 included
    assert advisor.estimate("llama3-8b", "dgx-h100", gpus=8).setup.seq_len == 8192
    assert advisor.estimate("llama2-7b", "dgx-h100", gpus=8).setup.seq_len == 4096
    assert advisor.estimate("gpt2", "dgx-h100").setup.seq_len == 1024
    res = advisor.plan("gpt3-175b", "dgx-a100", gpus=64, top=1)
    assert res.seq_len == 2048 and "seq 2048 (default: the model's context length" in res.header()


def test_the_table_fits_the_terminal_and_never_cuts_a_label():
    # labels were cut at 40 characters (two interleaved plans printed the same) and lines reached 326 characters
    from advisor.render import render_plan

    res = advisor.plan("gpt3-175b", "dgx-a100", gpus=1536, global_batch=1536, seq=2048, top=8)
    text = render_plan(res, width=110)
    for p in res.plans:
        assert p.estimate.label in text
    rows = [line for line in text.splitlines() if line[:2].strip().isdigit()]
    assert len(rows) == 8 and all(len(line) <= 110 for line in text.splitlines())


def test_memory_is_said_in_gib_everywhere():
    res = advisor.plan("gpt2", "dgx-a100", top=3)
    assert all("GiB" in p.reason and " GB" not in p.reason for p in res.plans)


def test_a_plugin_command_that_cannot_load_says_so(monkeypatch, capsys):
    # a broken optional command used to become "No such command"
    from advisor import cli as cli_module

    class Broken:
        name = "validate"

        def load(self):
            raise ImportError("No module named 'scipy'")

    monkeypatch.setattr(cli_module._Commands, "_plugins", staticmethod(lambda: {"validate": Broken()}))
    err = one_line_exit_2(["validate"], capsys)
    assert "the 'validate' command cannot be loaded (ImportError: No module named 'scipy')" in err


def test_a_token_budget_below_one_step_takes_one_step():
    """--tokens 1K on a 0.5M-token step trained in 11.5 us (budget / throughput): a step is the least a run takes."""
    from advisor.search import plan

    found = plan(model="llama3-8b", hw="dgx-h100", gpus=8, tokens=1000, top=1)
    e = found.plans[0].estimate
    assert found.train_time_s(e) == pytest.approx(e.step_time_s)


def test_one_plan_is_costed_in_one_stack_and_booleans_are_booleans():
    """--stack any (plan's: every stack's rows together) given to estimate or export was 'unknown stack profile'; a
    boolean option given "no" or 1 was read by pydantic as false / true."""
    with pytest.raises(AdvisorError, match="one plan is costed in one stack"):
        advisor.estimate("llama3-8b", "dgx-h100", gpus=8, stack="any")
    for bad in ("no", 1):
        with pytest.raises(AdvisorError, match=f"--sp: must be true or false, not {bad!r}"):
            advisor.estimate("llama3-8b", "dgx-h100", gpus=8, tp=2, sp=bad)
