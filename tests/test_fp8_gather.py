"""torchao's float8 FSDP all-gather (advisor.parallel.fp8_gather): the engine's ``fsdp_float8_gather``, its cost, its
memory and the torchtitan 0.2 job file that turns it on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from advisor import estimate
from advisor.export import export
from advisor.hardware import load_hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import load_model
from advisor.parallel import fp8_gather
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.units import GiB

# Llama 3 8B: 32 layers of 218,112,000 parameters (4096 x 6144 qkv + 4096 x 4096 wo + 3 x 4096 x 14336 + 2 x 4096
# norms), 7 Float8Linear each in torchtitan (wq, wk, wv, wo, w1, w2, w3: 0.2.2 models/llama3/model/model.py)
LAYER_PARAMS = 4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
# The H200 row of torchtitan's llama3-8b_h200_202506_trainy-whitefiber.md (reference/lowprec_runs.yaml
# tt-h200-l8b-32gpu-fp8-tensorwise), which ran enable_fsdp_float8_all_gather + precompute_float8_dynamic_scale_for_fsdp
RUN = dict(model="llama3-8b", hw="dgx-h200", gpus=32, dp=32, fsdp="full-shard", micro_batch=2, global_batch=64,
           seq=8192, recompute="selective", compile="model,loss")


def _stack(mode: str, name: str = "torchtitan-0.2"):
    st = load_stack(name)
    return st.model_copy(update={"engine": st.engine.model_copy(update={"fsdp_float8_gather": mode})})


def _est(mode: str, precision: str = "fp8-tensorwise"):
    return estimate(**RUN, precision=precision, stack=_stack(mode))


def test_shipped_torchtitan_profiles_gather_in_bf16():
    """torchtitan 0.2.2 config/job_config.py:732-735: enable_fsdp_float8_all_gather and
    precompute_float8_dynamic_scale_for_fsdp default to False; 0.3.0's Float8LinearConverter has neither."""
    for name in ("torchtitan", "torchtitan-0.2", "torchtitan-0.1"):
        assert load_stack(name).engine.fsdp_float8_gather == "off", name


def test_linears_of_a_llama_layer():
    assert load_model("llama3-8b").layer.n_params == LAYER_PARAMS == 218_112_000
    assert fp8_gather.linears_per_layer(load_model("llama3-8b").layer) == 7


@pytest.mark.parametrize("mode", ["per_gather", "precomputed"])
def test_gathered_units_held_in_float8(mode):
    """fsdp_post_all_gather wraps the gathered bytes in a Float8TrainingTensor (torchao fsdp_utils.py:253-283): a
    gathered layer takes 1 byte a parameter, not bf16's 2. torchtitan holds a layer and the LM head gathered at once
    (engine root_held: output; the head, filtered, stays bf16): the peak drops by one layer's parameters in bytes."""
    off, on = _est("off"), _est(mode)
    assert (off.memory.peak_bytes - on.memory.peak_bytes) == pytest.approx(LAYER_PARAMS, rel=1e-6)
    assert (off.memory.peak_bytes - on.memory.peak_bytes) / GiB == pytest.approx(0.203, abs=1e-3)


def test_rowwise_never_gathers_in_float8():
    """torchao float8/config.py:271-273 refuses enable_fsdp_float8_all_gather beside rowwise scaling, and torchtitan
    0.2.2 float8.py:64-67 beside any recipe_name: a rowwise run gathers in bf16 whatever the stack says."""
    off, on = _est("off", "fp8-rowwise"), _est("precomputed", "fp8-rowwise")
    assert on.step_time_s == off.step_time_s and on.memory.peak_bytes == off.memory.peak_bytes


def test_float8_gathers_move_half_the_layer_bytes():
    """The layers' all-gathers carry 1 byte a parameter instead of 2; precompute adds one all-reduce of 32 x 7 float32
    amaxes a step, per_gather 7 one-float all-reduces at each layer's gather, so precomputed <= per_gather."""
    off, pre, per = (_est(m).breakdown["comm/zero_params"] for m in ("off", "precomputed", "per_gather"))
    assert pre < off and pre < per


def _case():
    plan, setup = Plan(dp=32, zero=3), TrainingSetup(micro_batch=2, seq_len=8192, recompute="selective",
                                                     precision="fp8-tensorwise", compile="model,loss")
    ga, err = resolve_grad_accum(setup, plan)
    assert err is None
    return load_model("llama3-8b"), load_hardware("dgx-h200"), plan, setup, ga, 32


@pytest.mark.parametrize("mode, precompute", [("precomputed", "true"), ("per_gather", "false")])
def test_job_file_turns_on_what_is_costed(mode, precompute):
    """0.2.2's converter asserts no recipe_name beside enable_fsdp_float8_all_gather (float8.py:64-67): the job file
    drops recipe_name (None: Float8LinearConfig(), tensorwise) and sets the two options as costed."""
    text = export("torchtitan-toml", *_case(), _stack(mode)).text
    section = text.split("[quantize.linear.float8]")[1].split("\n[")[0]
    assert "recipe_name" not in section and "enable_fsdp_float8_all_gather = true" in section
    assert f"precompute_float8_dynamic_scale_for_fsdp = {precompute}" in section
    plain = export("torchtitan-toml", *_case(), "torchtitan-0.2").text
    assert 'recipe_name = "tensorwise"' in plain and "enable_fsdp_float8_all_gather" not in plain


_PARSE = textwrap.dedent('''
    import json, sys
    from torchtitan.config.manager import ConfigManager
    c = ConfigManager().parse_args(["--job.config_file", sys.argv[1]])
    f = c.quantize.linear.float8
    print(json.dumps([f.recipe_name, f.enable_fsdp_float8_all_gather, f.precompute_float8_dynamic_scale_for_fsdp]))
''')


@pytest.mark.slow  # ~10 s: a subprocess imports torchtitan 0.2.2's config manager
def test_job_file_read_by_torchtitan_022(tmp_path):
    """torchtitan 0.2.2's own ConfigManager reads the options back (tests/test_export_stacks.py's install)."""
    pytest.importorskip("tyro")
    root = os.environ.get("ADVISOR_TORCHTITAN_02") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".torchtitan-0.2")
    if not os.path.isfile(os.path.join(root, "torchtitan", "config", "job_config.py")):
        pytest.skip("set ADVISOR_TORCHTITAN_02 to a directory with torchtitan 0.2.2 (pip install --no-deps --target)")
    path = tmp_path / "job.toml"
    path.write_text(export("torchtitan-toml", *_case(), _stack("precomputed")).text)
    run = subprocess.run([sys.executable, "-c", _PARSE, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])})
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [None, True, True]
