"""advisor export --format nanotron: the config nanotron's ``run_train.py --config-file FILE`` reads, parsed by nanotron
0.4's own parser (nanotron.config.get_config_from_file: dacite, strict, over its Config dataclasses, as
DistributedTrainer does). The refusals are what nanotron 0.4 cannot run (module docstring of
advisor/export/nanotron.py).

nanotron 0.4 (the latest on PyPI) is in the test extra: beside it, it adds only dacite. It does not import as shipped
(nanotron.config.config and nanotron.logging import each other: _nanotron_config below works around it, its parser
code unchanged), and its model needs flash-attn (not imported here). Without nanotron the parser tests skip
(2026-11-29: 40 passed with it, in the test extra's venv and in a venv of its own)."""

from __future__ import annotations

import sys
import types

import pytest
import yaml
from click.testing import CliRunner

from advisor.cli_export import export_command
from advisor.export import ExportError, export, nanotron_config
from advisor.export.nanotron import stage_layers
from advisor.finetune import FineTune
from advisor.hardware import load_hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import llama_like, load_model
from advisor.training import TrainingSetup
from advisor.stack import load_stack
from advisor.workload import stack_setup

H100 = "dgx-h100"
TINY = llama_like("tiny-llama", 2, 64, 4, 2, 256, 1024, 256, tied=True)  # GQA, tied head: what the Playbook sweeps
CASES = {
    # (model, plan, setup): TP + SP under ZeRO-1, the Playbook's layout (tp_mode REDUCE_SCATTER, async)
    "llama3-8b-tp4-sp-zero1": ("llama3-8b", dict(dp=2, tp=4, sp=True, zero=1),
                               dict(micro_batch=1, grad_accum=8, seq_len=4096)),
    "llama3-8b-tp2-pp2-afab": ("llama3-8b", dict(dp=2, tp=2, pp=2, schedule="gpipe"),
                               dict(micro_batch=1, grad_accum=4, seq_len=4096)),
    "llama3-8b-sp-pp4-1f1b": ("llama3-8b", dict(tp=2, sp=True, pp=4), dict(micro_batch=1, grad_accum=8, seq_len=4096)),
    "llama2-7b-ddp-2nodes": ("llama2-7b", dict(dp=16), dict(micro_batch=2, global_batch=64, seq_len=2048,
                                                             optimizer="adamw-fused")),
    "tiny-ddp": (TINY, dict(dp=2), dict(micro_batch=4, grad_accum=2, seq_len=256)),
}


def _inputs(case: str, plan_kw: dict | None = None, setup_kw: dict | None = None, model=None):
    name, p, s = CASES[case]
    s = {**s, **(setup_kw or {})}
    ft = {k: s.pop(k) for k in list(s) if k in FineTune.model_fields}
    plan, setup = Plan(**{**p, **(plan_kw or {})}), TrainingSetup(**s, finetune=FineTune(**ft))
    setup = stack_setup(setup, load_stack("nanotron"))  # its default optimizer, torch's AdamW, where none is asked
    grad_accum, err = resolve_grad_accum(setup, plan)
    assert err is None
    return load_model(model or name), load_hardware(H100), plan, setup, grad_accum, plan.world_size


def _export(case: str, plan_kw: dict | None = None, setup_kw: dict | None = None, model=None):
    inputs = _inputs(case, plan_kw, setup_kw, model)
    return export("nanotron", *inputs), inputs


@pytest.mark.parametrize("case", CASES)
def test_the_config_says_the_plan(case):
    out, (model, _, plan, setup, grad_accum, world) = _export(case)
    cfg = yaml.safe_load(out.text)
    assert (out.stack, out.kind, out.filename) == ("nanotron", "nanotron", "nanotron_config.yaml")
    par = cfg["parallelism"]
    assert (par["dp"], par["tp"], par["pp"]) == (plan.dp, plan.tp, plan.pp) and plan.dp * plan.tp * plan.pp == world
    sp = plan.tp > 1 and plan.sp
    assert par["tp_mode"] == ("REDUCE_SCATTER" if sp else "ALL_REDUCE") and par["tp_linear_async_communication"] is False
    assert par["pp_engine"] == {"gpipe": "afab"}.get(plan.schedule.value, "1f1b") and "recompute_layer" not in par
    assert cfg["tokens"] | {"train_steps": None} == {"sequence_length": setup.seq_len, "train_steps": None,
                                                     "micro_batch_size": setup.micro_batch,
                                                     "batch_accumulation_per_replica": grad_accum}
    opt = cfg["optimizer"]
    assert (opt["zero_stage"], opt["accumulate_grad_in_fp32"], opt["torch_adam_is_fused"]) == (
        plan.zero, True, setup.optimizer.value == "adamw-fused")
    assert cfg["model"]["dtype"] == "bfloat16" and cfg["model"]["ddp_bucket_cap_mb"] == 25
    assert cfg["model"]["model_config"] == {
        "is_llama_config": True, "hidden_size": model.d_model, "intermediate_size": model.d_ff,
        "num_hidden_layers": model.n_layers, "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.kv_heads, "vocab_size": model.vocab,
        "max_position_embeddings": model.max_positions,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "initializer_range": 0.02,
        "tie_word_embeddings": model.tied_embeddings}
    # the launch line: CUDA_DEVICE_MAX_CONNECTIONS=1 only where async TP asserts it (asked: test_nanotron_async_tp)
    launch = out.text.splitlines()[1]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in launch and "run_train.py --config-file" in launch  # async TP off
    assert ("--nnodes 2 --nproc_per_node 8" in launch) is (world == 16)
    assert all(f"# note: {n}" in out.text for n in out.notes) and any("placeholders" in n for n in out.notes)


def test_llama3_8b_exact():
    """llama3-8b, TP=2+SP x PP=4 1F1B: every number the plan sets, and the notes on what nanotron does otherwise."""
    out, _ = _export("llama3-8b-sp-pp4-1f1b")
    cfg = yaml.safe_load(out.text)
    assert cfg["parallelism"] == {"dp": 1, "tp": 2, "pp": 4, "pp_engine": "1f1b", "tp_mode": "REDUCE_SCATTER",
                                  "tp_linear_async_communication": False}
    mc = cfg["model"]["model_config"]
    assert (mc["hidden_size"], mc["intermediate_size"], mc["num_hidden_layers"], mc["num_attention_heads"],
            mc["num_key_value_heads"], mc["vocab_size"], mc["tie_word_embeddings"]) == (4096, 14336, 32, 32, 8, 128256,
                                                                                        False)
    assert cfg["tokens"]["batch_accumulation_per_replica"] == 8 and cfg["optimizer"]["zero_stage"] == 0
    # nanotron's cost balance puts 9 layers on the first stage (the LM head weighs 2.2 layers), not 8
    assert any("stages hold [9, 9, 8, 6] layers, not the estimate's 8 each" in n for n in out.notes)
    assert any("llama3-8b's is 500000" in n for n in out.notes)  # 0.4's RoPE base is fixed at 10000


def test_stage_layers_follow_nanotrons_cost_balance():
    """models/base.py:180-198 with models/llama.py:775-787's costs, by hand: llama3-8b's layer 4h^2 + 3h d_ff =
    243,269,632, its head 128256 h = 525,336,576; thresholds at quarters of 8,310,964,800."""
    llama3 = load_model("llama3-8b")
    assert stage_layers(llama3, 4) == [9, 9, 8, 6] and stage_layers(llama3, 2) == [18, 14]
    assert stage_layers(llama3, 1) == [32] and sum(stage_layers(llama3, 8)) == 32
    # a stage takes layers until it passes its share, so the first holds one more than pp divides out
    assert stage_layers(load_model("llama2-70b"), 8) == [11, 10, 10, 10, 10, 10, 10, 9]


@pytest.mark.parametrize("case,plan_kw,setup_kw,model,message", [
    # the stack's own rules (stack_profiles/nanotron.yaml engine.offers), checked before the format's
    ("llama3-8b-tp4-sp-zero1", dict(zero=2), {}, None, "nanotron does not run ZeRO-2"),
    ("llama3-8b-tp2-pp2-afab", dict(schedule="interleaved", virtual_stages=2), {}, None,
     "nanotron does not run an interleaved"),
    ("llama3-8b-tp4-sp-zero1", dict(dp=1, cp=2), {}, None, "nanotron runs no context parallelism"),
    ("llama3-8b-tp4-sp-zero1", {}, dict(recompute="selective"), None, "nanotron has no selective recomputation"),
    ("llama3-8b-tp4-sp-zero1", {}, dict(recompute="full"), None,
     "nanotron does not run full checkpointing: use --recompute none"),  # 0.4 checkpoints nothing
    # nanotron 0.4's own limits
    ("llama3-8b-tp4-sp-zero1", {}, dict(precision="fp16-mixed"), None, "use --precision bf16-mixed"),
    ("llama3-8b-tp4-sp-zero1", {}, dict(precision="bf16"), None, "--precision bf16: nanotron trains bf16 weights"),
    ("llama3-8b-tp4-sp-zero1", {}, dict(optimizer="sgd"), None, "builds torch.optim.AdamW only"),
    ("llama3-8b-tp4-sp-zero1", dict(dp=8, tp=1, sp=False), dict(method="lora"), None,
     "--method lora: stack nanotron does not run lora fine-tuning (it runs full): --stack deepspeed --format"),
    ("llama3-8b-sp-pp4-1f1b", {}, dict(grad_accum=2), None, "1F1B needs at least pp - 1 = 3 micro-batches"),
    # the stack's own rule (engine.tp_beyond_kv_heads refuse: models/llama.py:271-274) before the export's
    ("tiny-ddp", dict(dp=1, tp=4), {}, None, "tp=4, heads=4, kv heads=2 (tp that splits them: 1, 2); nanotron takes "
     "only a tp that divides the KV heads, replicating none: --tp 2"),
    ("llama3-8b-tp4-sp-zero1", {}, {}, "gpt2", "gpt2 has a gelu MLP, layernorm norms, learned positions, biases"),
    ("llama3-8b-tp4-sp-zero1", dict(tp=1, dp=8, sp=False), {}, "mixtral-8x7b", "mixtral-8x7b has experts"),
    ("llama3-8b-tp4-sp-zero1", {}, {}, "qwen2.5-7b", "qwen2.5-7b has biases"),
    ("llama3-8b-tp4-sp-zero1", {}, {}, "mistral-7b", "mistral-7b has sliding-window attention"),
    ("llama3-8b-tp4-sp-zero1", {}, {}, "qwen3-8b", "qwen3-8b has q/k norms"),
])
def test_refuses_what_nanotron_cannot_run_in_one_line(case, plan_kw, setup_kw, model, message):
    with pytest.raises(ExportError) as info:
        _export(case, plan_kw, setup_kw, model)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("plan_kw,message", [
    (dict(dp=4, pp=1, zero=2), "ZeRO-2: nanotron's zero_stage is 0 or 1"),
    (dict(schedule="interleaved", virtual_stages=2), "the interleaved schedule: nanotron's pp_engine is afab"),
    (dict(schedule="zb-h1"), "the zb-h1 schedule"),
    (dict(dp=1, cp=2), "context parallelism (cp=2): nanotron 0.4 splits over dp, tp and pp only"),
])
def test_the_format_refuses_on_its_own_without_the_stack(plan_kw, message):
    """nanotron_config called directly (no stack profile in between) refuses the same plans itself."""
    with pytest.raises(ExportError) as info:
        nanotron_config(*_inputs("llama3-8b-tp2-pp2-afab", plan_kw))
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ExportError, match="--recompute selective: nanotron has no selective"):
        nanotron_config(*_inputs("llama3-8b-tp4-sp-zero1", setup_kw=dict(recompute="selective")))


def test_costing_differences_are_notes():
    out, _ = _export("llama3-8b-tp4-sp-zero1", dict(dp=2, tp=1, sp=False, zero=0, overlap_grad_reduce=False),
                     dict(attention="eager"), model="llama2-7b")
    assert any("nanotron runs flash-attn" in n for n in out.notes)
    assert any("DDP overlaps the gradient all-reduce" in n for n in out.notes)
    assert not any("rotates with base" in n for n in out.notes)  # Llama 2's base is nanotron's 10000


def test_cli_exports_nanotron_by_stack_or_by_format():
    base = ["--model", "llama3-8b", "--hw", H100, "--gpus", "8", "--dp", "2", "--tp", "4", "--sp", "--zero", "1",
            "--micro-batch", "1", "--grad-accum", "8", "--seq", "4096"]
    by_stack = CliRunner().invoke(export_command, base + ["--stack", "nanotron"])
    by_format = CliRunner().invoke(export_command, base + ["--format", "nanotron"])
    assert by_stack.exit_code == by_format.exit_code == 0, by_stack.output + by_format.output
    assert by_stack.stdout == by_format.stdout and "; stack nanotron" in by_stack.stdout.splitlines()[0]
    assert yaml.safe_load(by_stack.stdout)["parallelism"]["tp_mode"] == "REDUCE_SCATTER"
    refused = CliRunner().invoke(export_command, base + ["--stack", "nanotron", "--recompute", "full"])
    assert refused.exit_code == 2 and "nanotron does not run full checkpointing: use --recompute none" in refused.output
    assert refused.output.count("\n") == 1


def test_the_search_under_nanotron_proposes_plans_whose_top_exports():
    from advisor import plan as search

    res = search("llama3-8b", H100, gpus=8, stack="nanotron", seq=4096, global_batch=64, top=5)
    assert res.plans
    top = res.plans[0].estimate
    grad_accum, _ = resolve_grad_accum(top.setup, top.plan)
    out = export("nanotron", load_model("llama3-8b"), load_hardware(H100), top.plan, top.setup, grad_accum, 8)
    assert yaml.safe_load(out.text)["parallelism"]["dp"] == top.plan.dp


# -- nanotron 0.4's own parser ------------------------------------------------------------------------------------
def _nanotron_config():
    """nanotron 0.4's config module. Its wheel does not import as shipped: nanotron/logging.py:38 imports
    nanotron.config.config (for LoggingArgs, an annotation of set_ranks_logging_level only), whose imports
    (config/config.py:13-27: lighteval_config, parallelism_config, utils_config -> pipeline_parallel.engine) import
    nanotron.logging again for get_logger / log_rank: a cycle no import order breaks. nanotron.logging is imported
    first against a stand-in config package, then the real one, and LoggingArgs put back; the parser itself
    (get_config_from_file, dacite over the dataclasses) is nanotron's, untouched."""
    pytest.importorskip("nanotron", reason="nanotron 0.4 (the test extra) is not installed")
    if "nanotron.logging" not in sys.modules:
        stubs = {name: types.ModuleType(name) for name in ("nanotron.config", "nanotron.config.config")}
        stubs["nanotron.config"].__path__ = []
        stubs["nanotron.config.config"].LoggingArgs = None
        sys.modules.update(stubs)
        try:
            import nanotron.logging  # noqa: F401
        finally:
            for name in stubs:
                del sys.modules[name]
    import nanotron.config
    import nanotron.logging

    nanotron.logging.LoggingArgs = nanotron.config.LoggingArgs
    return nanotron.config


@pytest.mark.parametrize("case", CASES)
def test_nanotrons_own_parser_reads_the_config(case, tmp_path):
    """get_config_from_file (config/config.py:382-415, as DistributedTrainer calls it): every key known to 0.4's
    dataclasses (dacite strict), typed as nanotron declares it; the values it reads are the plan's."""
    nc = _nanotron_config()
    import torch
    from nanotron.parallel.pipeline_parallel.engine import (
        AllForwardAllBackwardPipelineEngine,
        OneForwardOneBackwardPipelineEngine,
    )
    from nanotron.parallel.tensor_parallel.nn import TensorParallelLinearMode

    out, (model, _, plan, setup, grad_accum, world) = _export(case)
    path = tmp_path / out.filename
    path.write_text(out.text)
    cfg = nc.get_config_from_file(str(path))
    assert isinstance(cfg, nc.Config)
    par = cfg.parallelism
    assert (par.dp, par.tp, par.pp, par.expert_parallel_size) == (plan.dp, plan.tp, plan.pp, 1)
    sp = plan.tp > 1 and plan.sp
    assert par.tp_mode is (TensorParallelLinearMode.REDUCE_SCATTER if sp else TensorParallelLinearMode.ALL_REDUCE)
    # async communication under ALL_REDUCE would make o_proj raise (parallel/tensor_parallel/nn.py:133-134)
    assert par.tp_linear_async_communication is False  # nanotron's default, as costed
    engine = AllForwardAllBackwardPipelineEngine if plan.pp > 1 and plan.schedule.value == "gpipe" else \
        OneForwardOneBackwardPipelineEngine
    assert type(par.pp_engine) is engine
    tok = cfg.tokens
    assert (tok.sequence_length, tok.micro_batch_size, tok.batch_accumulation_per_replica) == (
        setup.seq_len, setup.micro_batch, grad_accum)
    assert cfg.global_batch_size == setup.micro_batch * grad_accum * plan.dp  # config/config.py:324-326
    opt = cfg.optimizer
    assert (opt.zero_stage, opt.accumulate_grad_in_fp32, opt.torch_adam_is_fused, opt.clip_grad) == (
        plan.zero, True, setup.optimizer.value == "adamw-fused", 1.0)
    assert cfg.model.dtype is torch.bfloat16 and isinstance(cfg.model.init_method, nc.RandomInit)
    mc = cfg.model.model_config
    assert isinstance(mc, nc.LlamaConfig)  # not Starcoder2Config, nor the Union's Any (a plain dict)
    assert (mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.num_attention_heads,
            mc.num_key_value_heads, mc.vocab_size, mc.tie_word_embeddings, mc.hidden_act) == (
        model.d_model, model.d_ff, model.n_layers, model.n_heads, model.kv_heads, model.vocab, model.tied_embeddings,
        "silu")
    assert cfg.data.dataset is None and cfg.checkpoints.checkpoint_interval == cfg.tokens.train_steps


def test_nanotrons_parser_is_strict_so_later_keys_are_refused_not_written(tmp_path):
    """Why --recompute full is refused, not written as recompute_layer: 0.4's dacite (strict=True) rejects the key
    nanotron added after 0.4, so a file with it would not start."""
    nc = _nanotron_config()
    import dacite

    out, _ = _export("llama3-8b-tp4-sp-zero1")
    cfg = yaml.safe_load(out.text)
    cfg["parallelism"]["recompute_layer"] = True
    path = tmp_path / "later.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(dacite.UnexpectedDataError, match="recompute_layer"):
        nc.get_config_from_file(str(path))


@pytest.mark.parametrize("name,pp", [("llama3-8b", 4), ("llama3-8b", 8), ("llama2-70b", 8), ("llama2-7b", 2)])
def test_nanotrons_build_model_places_the_layers_as_the_note_says(name, pp, tmp_path):
    """nanotron's own placement loop (models/base.py build_model) over stand-in blocks weighted as
    LlamaModel.get_block_compute_costs weighs them (models/llama.py:775-787; the module imports flash_attn, which does
    not build on CPU): it gives stage_layers' split."""
    _nanotron_config()
    import torch
    import torch.distributed as torch_dist
    from nanotron.models.base import build_model
    from nanotron.parallel.pipeline_parallel.block import PipelineBlock

    class Block(PipelineBlock):
        def __init__(self, builder):
            torch.nn.Module.__init__(self)
            self.module_builder = builder

        def build_and_set_rank(self, pp_rank: int):
            self.rank = pp_rank

    class Layer:  # LlamaDecoderLayer
        pass

    class Head:  # the lm_head's TensorParallelColumnLinear
        pass

    m = load_model(name)

    class Stand(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(object)] + [Block(Layer) for _ in range(m.n_layers)] +
                                              [Block(object), Block(Head), Block(object), Block(object)])

        def get_block_compute_costs(self):
            return {Layer: 4 * m.n_heads * (m.d_model // m.n_heads) * m.d_model + 3 * m.d_ff * m.d_model,
                    Head: m.vocab * m.d_model}

    started = not torch_dist.is_initialized()  # log_rank asks the default group for this rank
    if started:
        torch_dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        context = types.SimpleNamespace(pp_pg=types.SimpleNamespace(size=lambda: pp), world_pg=None)
        built = build_model(Stand, context, torch.float32, device=torch.device("cpu"))
    finally:
        if started:
            torch_dist.destroy_process_group()
    ranks = [b.rank for b in built.blocks[1:1 + m.n_layers]]
    assert [ranks.count(r) for r in range(pp)] == stage_layers(m, pp)
