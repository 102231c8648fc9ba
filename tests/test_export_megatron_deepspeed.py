"""megatron-deepspeed's megatron script: Megatron's flags under DeepSpeed's engine, as the stack costs its plans
(stack_profiles/megatron-deepspeed.yaml: DeepSpeed's ZeRO, advisor.zero_engine). The script writes the deepspeed
format's JSON (read here by DeepSpeed 0.19.8's DeepSpeedConfig) and passes DeepSpeed's launch arguments (read by
deepspeed.add_config_arguments, the parser Megatron-DeepSpeed's arguments.py extends) and the fork's own --zero-stage,
which no package on PyPI can check."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from advisor.cli_export import export_command
from advisor.export import NOTES_KEY, ExportError, export
from advisor.export.megatron_deepspeed import FORK_LACKS
from advisor.hardware import load_hardware
from advisor.layout import Plan
from advisor.model import load_model
from advisor.training import TrainingSetup

STACK = "megatron-deepspeed"
# megatron-core's own data parallelism, which the DeepSpeed engine replaces (megatron.py _data_parallel)
CORE_DP = ("--use-distributed-optimizer", "--overlap-grad-reduce", "--use-megatron-fsdp",
           "--num-distributed-optimizer-instances", "--ckpt-format")


def _run(text: str, tmp_path) -> tuple[list[str], str, dict]:
    """Run the script with bash in tmp_path, a stub torchrun on PATH: (pretrain_gpt.py's argv, CUDA_DEVICE_MAX_CONNECTIONS
    as it gets it, the ds_config.json the script wrote)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\0" "${CUDA_DEVICE_MAX_CONNECTIONS-<unset>}" "$@"\n')
    (bindir / "torchrun").chmod(0o755)
    (tmp_path / "run.sh").write_text(text)
    run = subprocess.run(["bash", "run.sh"], cwd=tmp_path, env={"PATH": f"{bindir}:{os.environ['PATH']}"},
                         capture_output=True, check=True)
    conn, *argv = run.stdout.decode().split("\0")[:-1]
    return argv[argv.index("pretrain_gpt.py") + 1:], conn, json.loads((tmp_path / "ds_config.json").read_text())


def _deepspeed_config(path, dp: int, monkeypatch):
    """DeepSpeedConfig of the file as written, the data-parallel size given by an mpu (no process group here)."""
    import deepspeed.runtime.config as ds_config

    class MPU:
        def get_data_parallel_world_size(self):
            return dp

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    return ds_config.DeepSpeedConfig(str(path), mpu=MPU())


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_gpt2_xl_zero_stages_launch_deepspeeds_engine(zero, tmp_path, monkeypatch):
    """The brief's command: `advisor export --model gpt2-xl --hw dgx-a100 --stack megatron-deepspeed --gpus 8 --zero N`
    wrote --use-distributed-optimizer at ZeRO-1 (megatron-core's engine) and no DeepSpeed config; at 2/3 it fell back
    to a bare JSON for a train.py of one's own."""
    pytest.importorskip("deepspeed")
    import deepspeed

    result = CliRunner().invoke(export_command, ["--model", "gpt2-xl", "--hw", "dgx-a100", "--stack", STACK, "--gpus",
                                                 "8", "--zero", str(zero), "--out", "-"])
    assert result.exit_code == 0, result.output
    argv, conn, cfg = _run(result.stdout, tmp_path)
    split = argv.index("--deepspeed")
    megatron, ds = argv[:split], argv[split:]
    assert not set(CORE_DP) & set(megatron) and "--bf16" in megatron and conn == "<unset>"  # no TP: no queue rule
    # DeepSpeed's own arguments (deepspeed/__init__.py _add_core_arguments); what is left is the fork's
    ns, rest = deepspeed.add_config_arguments(argparse.ArgumentParser()).parse_known_args(ds)
    assert ns.deepspeed is True and ns.deepspeed_config == "ds_config.json"
    assert rest == ["--zero-stage", str(zero), "--no-pipeline-parallel"]
    parsed = _deepspeed_config(tmp_path / "ds_config.json", 8, monkeypatch)
    assert parsed.zero_optimization_stage == zero and parsed.bfloat16_config.enabled
    assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu, parsed.gradient_accumulation_steps) == (8, 1, 1)
    assert parsed.gradient_clipping == 1.0  # the profile's clip_grad_norm: Megatron's --clip-grad 1.0 as DeepSpeed's
    assert cfg["zero_optimization"] == ({"stage": 0} if zero == 0 else
                                        {"stage": zero, "overlap_comm": True, "contiguous_gradients": True})
    # the deepspeed format's JSON of the same plan: the same content, its notes aside
    model, hw = load_model("gpt2-xl"), load_hardware("dgx-a100")
    plan, setup = Plan(dp=8, zero=zero), TrainingSetup(micro_batch=1, seq_len=1024)
    own = json.loads(export("deepspeed", model, hw, plan, setup, 1, 8, STACK).text)
    assert {k: v for k, v in cfg.items() if k != NOTES_KEY} == {k: v for k, v in own.items() if k != NOTES_KEY}


def test_model_parallel_degrees_stay_megatrons(tmp_path, monkeypatch):
    """TP and PP are the Megatron flags' (the fork passes its mpu to deepspeed.initialize): the JSON has no AutoTP
    section, no DeepSpeed activation checkpointing (Megatron's --recompute-* run it) and, with a pipeline, the fork's
    GPTModelPipe is kept (no --no-pipeline-parallel); TP wants one CUDA queue, as for Megatron-LM."""
    pytest.importorskip("deepspeed")
    model, hw = load_model("llama2-7b"), load_hardware("dgx-h100")
    plan, setup = Plan(dp=2, tp=2, pp=2, zero=1, sp=True), TrainingSetup(micro_batch=1, global_batch=16, recompute="full")
    argv, conn, cfg = _run(export("megatron", model, hw, plan, setup, 8, 8, STACK).text, tmp_path)
    assert argv[argv.index("--deepspeed"):] == ["--deepspeed", "--deepspeed_config", "ds_config.json", "--zero-stage", "1"]
    assert argv[argv.index("--tensor-model-parallel-size") + 1] == "2" and "--sequence-parallel" in argv
    assert "--recompute-granularity" in argv and conn == "1"
    assert "tensor_parallel" not in cfg and "activation_checkpointing" not in cfg
    parsed = _deepspeed_config(tmp_path / "ds_config.json", 2, monkeypatch)
    assert parsed.train_batch_size == 16 and parsed.gradient_accumulation_steps == 8


def test_zero3_under_tp_keeps_one_cuda_queue(tmp_path):
    """Megatron-FSDP refuses CUDA_DEVICE_MAX_CONNECTIONS=1, so megatron-core's ZeRO-3 script unsets it; DeepSpeed's
    ZeRO-3 has no such rule, and TP wants 1 (Megatron's validate_args before Blackwell)."""
    model, hw = load_model("llama2-7b"), load_hardware("dgx-h100")
    plan, setup = Plan(dp=4, tp=2, zero=3, sp=True), TrainingSetup(micro_batch=1, grad_accum=2)
    argv, conn, cfg = _run(export("megatron", model, hw, plan, setup, 2, 8, STACK).text, tmp_path)
    assert conn == "1" and cfg["zero_optimization"]["stage"] == 3 and "--use-megatron-fsdp" not in argv


@pytest.mark.parametrize("model,plan_kw,setup_kw,flags", [
    # GPT-OSS: learned sinks, the clamped GLU, alternating windows, YaRN, megatron-core's MoE
    ("gpt-oss-120b", dict(dp=16, pp=4, ep=8, etp=1, zero=1), dict(global_batch=64, seq_len=4096),
     "--glu-linear-offset, --activation-func-clamp-value, --softmax-type, --window-attn-skip-freq, "
     "--rotary-scaling-factor, --moe-ffn-hidden-size, --expert-tensor-parallel-size"),
    ("mixtral-8x7b", dict(dp=16, ep=8, etp=1, zero=1), dict(global_batch=64, seq_len=4096),
     "--moe-ffn-hidden-size, --expert-tensor-parallel-size"),
    ("smollm3-3b", dict(dp=8, zero=1), dict(global_batch=64, seq_len=4096), "--no-rope-freq"),
])
def test_flags_the_fork_lacks_are_refused_in_one_line(model, plan_kw, setup_kw, flags):
    """A flag megatron-core 0.8.0 had no field for cannot be in the 2023 fork's parser: refused, naming each."""
    m, hw = load_model(model), load_hardware("dgx-h100")
    world = plan_kw["dp"] * plan_kw.get("pp", 1) * plan_kw.get("cp", 1)
    plan, setup = Plan(**plan_kw), TrainingSetup(micro_batch=1, **setup_kw)
    ga = setup.global_batch // (plan.dp * setup.micro_batch)
    with pytest.raises(ExportError) as err:
        export("megatron", m, hw, plan, setup, ga, world, STACK)
    assert str(err.value) == (f"the {STACK} script of {model} would pass {flags}, which Megatron-DeepSpeed's 2023 fork "
                              "lacks (megatron-core 0.8.0 had no such field): use --stack megatron-core")
    export("megatron", m, hw, plan, setup, ga, world, "megatron-core")  # whose flags they are


def test_context_parallelism_as_the_fork_runs_it():
    """The fork splits sequences with DeepSpeed-Ulysses (--ds-sequence-parallel-size) where the plan's CP is Ulysses, and
    with megatron-core 0.8's ring (--context-parallel-size alone) otherwise: never megatron-core's --cp-comm-type."""
    m, hw = load_model("llama3-8b"), load_hardware("dgx-h100")
    setup = TrainingSetup(micro_batch=1, global_batch=8, seq_len=131072)
    text = export("megatron", m, hw, Plan(dp=2, cp=4, zero=1, cp_comm="ulysses"), setup, 4, 8, STACK).text
    assert "    --ds-sequence-parallel-size 4\n" in text
    assert "--context-parallel-size" not in text and "--cp-comm-type" not in text
    text = export("megatron", m, hw, Plan(dp=2, cp=4, zero=1, cp_comm="ring"), setup, 4, 8, STACK).text
    assert "    --context-parallel-size 4\n" in text and "--cp-comm-type" not in text


def test_what_megatron_core_0_8_had_is_written():
    """Sliding windows (TransformerConfig.window_size, in 0.8.0), the RoPE base and q/k norms are not refused."""
    hw = load_hardware("dgx-h100")
    for name, flag in (("mistral-7b", "--window-size"), ("qwen3-8b", "--qk-layernorm")):
        out = export("megatron", load_model(name), hw, Plan(dp=8, zero=1), TrainingSetup(micro_batch=1, global_batch=64,
                                                                                         seq_len=4096), 8, 8, STACK)
        assert flag in out.text and "--rotary-base" in out.text and "--deepspeed" in out.text


def test_the_interleaved_schedule_is_refused():
    """The fork pipelines with DeepSpeed's PipelineModule, whose engine runs no interleaved schedule."""
    plan = Plan(dp=2, tp=2, pp=2, zero=1, schedule="interleaved", virtual_stages=2)
    with pytest.raises(ExportError, match="no interleaved schedule: use --schedule 1f1b, or --stack megatron-core$"):
        export("megatron", load_model("llama2-7b"), load_hardware("dgx-h100"), plan,
               TrainingSetup(micro_batch=1, global_batch=16), 8, 8, STACK)


def test_fork_lacks_names_megatron_core_fields():
    """Each refused flag sets a field megatron-core 0.16.1 has (TransformerConfig, MLATransformerConfig,
    ModelParallelConfig, or GPTModel's argument): what megatron-core grew after 0.8.0, not a misspelt name."""
    pytest.importorskip("megatron.core")
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    fields = {f.name for c in (TransformerConfig, MLATransformerConfig, ModelParallelConfig) for f in dataclasses.fields(c)}
    fields |= set(inspect.signature(GPTModel.__init__).parameters)
    assert {flag: field for flag, field in FORK_LACKS.items() if field not in fields} == {}
