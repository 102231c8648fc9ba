"""advisor export --format litgpt: the config litgpt's CLI reads (``litgpt finetune_lora --config FILE``), parsed by
litgpt 0.5.13's own parser: jsonargparse over litgpt.finetune.lora.setup / litgpt.finetune.full.setup with a
``--config`` file action, as litgpt/__main__.py's CLI builds it. The refusals are what litgpt's setup() itself
raises or cannot express (module docstring of advisor/export/litgpt.py).

litgpt is not in the test extra: litgpt 0.5.13 pins huggingface-hub < 1.4, transformers 5.23.0 (the probe's) needs
>= 1.31. Its parser test runs where litgpt is installed: `python -m venv v && v/bin/pip install torch==2.13.0 &&
v/bin/pip install litgpt==0.5.13 pytest -e .` (2026-11-28: 19 passed)."""

from __future__ import annotations

import pytest
import yaml

from advisor.export import ExportError, export
from advisor.finetune import FineTune
from advisor.hardware import load_hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import load_model
from advisor.training import TrainingSetup

A100 = "mosaicml-a100-40gb"  # litgpt's resource tables' GPU (reference/finetune_runs.yaml)
CASES = {
    # litgpt's own Llama 2 7B QLoRA table row: one A100, bf16-true, NF4 with double quantisation, micro-batch 1
    "qlora-1gpu": (1, dict(), dict(method="qlora", library="litgpt", precision="bf16", micro_batch=1,
                                   global_batch=16, seq_len=1304)),
    "lora-4gpu-fsdp": (4, dict(dp=4, zero=3), dict(method="lora", library="litgpt", precision="bf16",
                                                   micro_batch=2, global_batch=16, seq_len=1304, recompute="full",
                                                   targets="all-linear")),
    "full-8gpu-fsdp": (8, dict(dp=8, zero=3), dict(precision="bf16-mixed", micro_batch=1, global_batch=64,
                                                   seq_len=4096, recompute="full")),
}


def _export(case: str, plan_kw: dict | None = None, setup_kw: dict | None = None):
    _, p, s = CASES[case]
    s = {**s, **(setup_kw or {})}
    ft = {k: s.pop(k) for k in list(s) if k in FineTune.model_fields}
    plan, setup = Plan(**{**p, **(plan_kw or {})}), TrainingSetup(**s, finetune=FineTune(**ft))
    grad_accum, err = resolve_grad_accum(setup, plan)
    assert err is None
    world = plan.dp * plan.tp * plan.pp * plan.cp
    return export("litgpt", load_model("llama2-7b"), load_hardware(A100), plan, setup, grad_accum, world), setup


@pytest.mark.parametrize("case", CASES)
def test_the_config_says_the_plan(case):
    out, setup = _export(case)
    cfg = yaml.safe_load(out.text)
    gpus = CASES[case][0]
    assert out.stack == "litgpt" and out.filename == {"qlora": "qlora.yaml", "lora": "lora.yaml"}.get(
        setup.finetune.method.value, "full.yaml")
    assert (cfg["devices"], cfg["num_nodes"]) == (gpus, 1)
    assert cfg["train"] == {"global_batch_size": setup.global_batch, "micro_batch_size": setup.micro_batch,
                            "max_seq_length": setup.seq_len}
    assert cfg["precision"] == {"bf16": "bf16-true", "bf16-mixed": "bf16-mixed"}[setup.precision.value]
    if case == "qlora-1gpu":
        assert cfg["quantize"] == "bnb.nf4-dq"  # advisor's qlora default: NF4 with double quantisation
        assert [cfg[k] for k in ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp",
                                 "lora_head")] == [True, False, True, False, False, False]
    if case == "lora-4gpu-fsdp":  # all-linear: every attention projection and the MLP, not the head
        assert all(cfg[k] for k in ("lora_query", "lora_key", "lora_value", "lora_projection", "lora_mlp"))
        assert not cfg["lora_head"] and "quantize" not in cfg
    if case == "full-8gpu-fsdp":
        assert not any(k.startswith("lora_") for k in cfg) and "litgpt finetune_full" in out.text
    assert all(f"# note: {n}" in out.text for n in out.notes)


@pytest.mark.parametrize("case,plan_kw,setup_kw,message", [
    # the stack's own rules (stack_profiles/litgpt.yaml engine: distributed, offers), checked before the format's
    ("qlora-1gpu", dict(dp=2), dict(), "litgpt runs several devices only sharded"),
    ("qlora-1gpu", dict(dp=2, zero=3), dict(recompute="full"), "quantises only on one device"),
    ("qlora-1gpu", {}, dict(precision="bf16-mixed"), "only under a -true precision"),
    ("qlora-1gpu", {}, dict(recompute="full"), "checkpoints every layer on several devices and none on one"),
    ("lora-4gpu-fsdp", {}, dict(recompute="none"), "checkpoints every layer on several devices and none on one"),
    ("lora-4gpu-fsdp", dict(zero=1), {}, "litgpt does not run ZeRO-1"),
    ("lora-4gpu-fsdp", dict(dp=2, tp=2), {}, "data parallelism only"),
    ("lora-4gpu-fsdp", {}, dict(targets="q_proj,v_proj,up_proj"), "lora_mlp adapts every MLP linear"),
    ("lora-4gpu-fsdp", {}, dict(lora_alpha=12.5), "lora_alpha is an integer"),
    ("full-8gpu-fsdp", {}, dict(precision="fp8-tensorwise"), "litgpt trains in bf16-true"),
])
def test_refuses_what_litgpt_cannot_run_in_one_line(case, plan_kw, setup_kw, message):
    with pytest.raises(ExportError) as info:
        _export(case, plan_kw, setup_kw)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_another_librarys_lora_is_noted():
    out, _ = _export("lora-4gpu-fsdp", setup_kw=dict(library="peft"))
    assert any("LoRAQKVLinear" in n for n in out.notes)


@pytest.mark.parametrize("case", CASES)
def test_litgpts_own_parser_reads_the_config(case, tmp_path):
    """jsonargparse (litgpt's CLI) over litgpt 0.5.13's setup(): every key known and typed as litgpt declares it
    (quantize a Literal, the lora_* switches bool, train a TrainArgs); the values it reads are the plan's."""
    pytest.importorskip("litgpt", reason="pip install litgpt==0.5.13 (not beside transformers 5.23: module docstring)")
    from jsonargparse import ActionConfigFile, ArgumentParser

    out, setup = _export(case)
    path = tmp_path / out.filename
    path.write_text(out.text)
    if setup.finetune.adapters:
        from litgpt.finetune.lora import setup as litgpt_setup
    else:
        from litgpt.finetune.full import setup as litgpt_setup
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_function_arguments(litgpt_setup)
    cfg = parser.parse_args(["--config", str(path)])
    written = yaml.safe_load(out.text)
    assert cfg.train.micro_batch_size == setup.micro_batch and cfg.train.global_batch_size == setup.global_batch
    assert cfg.train.max_seq_length == setup.seq_len and cfg.devices == CASES[case][0]
    for key, value in written.items():
        if key != "train":
            assert (str(cfg[key]) if key in ("checkpoint_dir", "out_dir") else cfg[key]) == value, key


@pytest.mark.parametrize("gpus, method", [(1, "qlora"), (4, "lora")])
def test_the_search_under_litgpt_proposes_only_what_litgpt_runs_and_its_top_plan_exports(gpus, method):
    """stack_profiles/litgpt.yaml: engine.distributed fsdp_checkpointed, offers ddp and zero3 only: on one GPU
    no checkpointing, on several ZeRO-3 with every layer checkpointed; the search's first plan exports as is."""
    from advisor import plan as search

    res = search("llama2-7b", A100, gpus=gpus, stack="litgpt", seq=1304, global_batch=16, precision="bf16",
                 method=method, lora_library="litgpt", top=50)
    assert res.plans
    for row in res.plans:
        e = row.estimate
        assert (e.plan.zero, e.setup.recompute.value) == ((0, "none") if gpus == 1 else (3, "full"))
        assert e.plan.tp == e.plan.pp == e.plan.cp == 1
    top = res.plans[0].estimate
    if gpus > 1:  # the rule of thumb's DDP is not a plan litgpt runs: the reason does not claim to overrule it
        assert "has no DDP plan that runs and fits here" in res.plans[0].reason and "overrules" not in res.plans[0].reason
    grad_accum, _ = resolve_grad_accum(top.setup, top.plan)
    out = export("litgpt", load_model("llama2-7b"), load_hardware(A100), top.plan, top.setup, grad_accum, gpus)
    assert yaml.safe_load(out.text)["devices"] == gpus
