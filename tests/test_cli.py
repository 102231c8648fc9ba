"""CLI: exit codes, key lines, --json parses, one-line errors."""

import json
import resource
import subprocess
import sys

import pytest
from click.testing import CliRunner

from advisor.cli import cli, main


def run(args):
    return CliRunner().invoke(cli, args)


def test_help_is_fast_and_light():
    # CPU seconds the child used, not wall time: on a loaded machine the wall clock measures the neighbours
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", "import sys; from advisor.cli import main; sys.argv=['advisor','--help']; main()"],
                         capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0 and "estimate" in out.stdout
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 3.0  # generous; typically ~0.3 s (a torch or scipy import alone costs more than 1 s)
    mods = subprocess.run([sys.executable, "-c", "import sys, advisor.cli; print('torch' in sys.modules)"], capture_output=True, text=True)
    assert mods.stdout.strip() == "False"


def test_models_and_profiles():
    assert "gpt2-xl" in run(["models"]).output
    out = run(["profiles"]).output
    assert "dgx-a100" in out and "titan-rtx-pcie" in out
    assert "memory_GiB" in run(["profiles", "show", "dgx-h100"]).output


def test_estimate_table():
    res = run(["estimate", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "8", "--micro-batch", "4"])
    assert res.exit_code == 0, res.output
    assert "step time" in res.output and "MFU" in res.output and "fits" in res.output


@pytest.mark.parametrize("args,needle", [
    (["estimate", "--model", "gpt9", "--hw", "dgx-a100"], "unknown model"),
    (["estimate", "--model", "gpt2", "--hw", "dgx-a1000"], "unknown hardware profile"),
    (["estimate", "--model", "gpt2", "--hw", "dgx-a100", "--gpus", "8", "--tp", "3"], "not divisible"),
    (["estimate", "--model", "gpt2", "--hw", "dgx-a100", "--micro-batch", "-1"], "--micro-batch"),
    (["estimate", "--model", "gpt2", "--hw", "dgx-a100", "--seq", "0"], "--seq"),
    (["estimate", "--model", "gpt2", "--hw", "dgx-a100", "--seq", "4096"], "learned positions"),
])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_plan_json():
    res = run(["plan", "--model", "gpt2-xl", "--hw", "dgx-a100", "--json", "--top", "3"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["candidates"] > 1000 and data["plans"] and isinstance(data["rejected"], dict)
    p = data["plans"][0]
    assert {"plan", "step_time_s", "memory", "breakdown", "reason"} <= set(p)


def test_a_tiny_throughput_is_not_printed_as_zero():
    """A rate under 100 tokens/s (or 1 sample/s) keeps three significant figures: a 10,000-layer model printed
    'throughput 0 tokens/s   0.00 samples/s'."""
    from advisor.render import _rate

    assert (_rate(276555.4), _rate(270.07, 2), _rate(0.00169), _rate(8.23e-07, 2)) == ("276,555", "270.07", "0.00169",
                                                                                        "8.23e-07")
