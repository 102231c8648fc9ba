"""torch.compile as an input (--compile none | model | loss | model,loss): the stack's compiled tables, measured by
advisor.probe.compiled on the graphs torch.compile hands to Inductor, and what they change in an estimate."""

import pytest

from advisor import api
from advisor.errors import AdvisorError
from advisor.model.catalogue import load_model
from advisor.stack import load_stack

LLAMA8 = dict(model="llama3-8b", hw="dgx-h100", gpus=8, dp=8, fsdp="full-shard", seq=8192, micro_batch=1,
              stack="torchtitan-0.2")


# -- the probe's fusion rules, on a toy it can be checked against by hand ------------------------------------------
T, H, F = 64, 48, 80


def _toy(x, w, g):
    import torch

    y = torch.nn.functional.rms_norm(x, (H,), g)
    z = y @ w
    return torch.nn.functional.silu(z) * z


def test_the_probe_fuses_a_norm_and_a_swiglu_as_inductor_does():
    """RMSNorm -> GEMM -> SiLU(z) * z in bf16, compiled: the forward is two fused kernels around one extern GEMM, the
    norm reading x once (2h a token) and writing its output (2h) and its fp32 rstd (4), the activation reading z once
    (2f) and writing its result (2f); the partitioner keeps x, rstd, y and z for the backward (2h + 4 + 2h + 2f a
    token). The backward: the activation's gradient in one kernel, two GEMMs, the norm's input gradient and its
    weight gradient (a sum over the tokens, a reduction of its own). Counted by hand from the graph."""
    torch = pytest.importorskip("torch")
    from advisor.probe import compiled

    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H, F, dtype=torch.bfloat16, requires_grad=True)
    g = torch.ones(H, dtype=torch.bfloat16, requires_grad=True)
    graphs = compiled.compile_graphs(_toy, (x, w, g))
    fw, extern = compiled.kernels(graphs.forward, T)
    assert extern == 1 and len(fw) == 2
    norm, act = fw
    assert sorted(t.per_token for t in norm.reads) == [2 * H / T, 2 * H]  # x, and the weight (per layer)
    assert sorted(t.per_token for t in norm.writes) == [4, 2 * H]
    assert [t.per_token for t in act.reads] == [2 * F] and [t.per_token for t in act.writes] == [2 * F]
    assert sorted(t.per_token for t in compiled.saved(graphs, T, (x,))) == sorted([2 * H, 4, 2 * H, 2 * F])
    bw, extern = compiled.kernels(graphs.backward, T)
    assert extern == 2 and len(bw) == 3
    assert [t.per_token for t in bw[0].reads] == [2 * F, 2 * F] and [t.per_token for t in bw[0].writes] == [2 * F]
    traffic, launches = compiled.traffic(graphs.forward, T)
    assert sum(t.per_token for t in traffic) == 4 * H + 4 + 4 * F + 2 * H / T and launches == 3  # with the weight


def test_complex_numbers_are_aten_fallbacks_not_fused():
    """Inductor generates no code for complex tensors (torch 2.13 _inductor/lowering.py unsupported_input_tensor: the
    op falls back to aten): a rotary embedding as torchtitan writes it (view_as_complex, multiply, view_as_real) keeps
    its complex multiply as a kernel of its own, reading and writing 8 bytes a complex element."""
    torch = pytest.importorskip("torch")
    from advisor.probe import compiled

    freqs = torch.polar(torch.ones(T, H // 2), torch.randn(T, H // 2))

    def rope(x):
        xc = torch.view_as_complex(x.float().reshape(T, H // 2, 2))
        return torch.view_as_real(xc * freqs).flatten(1).type_as(x)

    x = torch.randn(T, H, dtype=torch.bfloat16, requires_grad=True)
    ks, _ = compiled.kernels(compiled.compile_graphs(rope, (x,)).forward, T)
    (mul,) = [k for k in ks if k.ops == ["mul"]]
    assert [t.per_token for t in mul.writes] == [4 * H]  # H/2 complex64 a token
    assert len(ks) == 3  # the fp32 cast, the complex multiply, the cast back


# -- the tables and what they change ------------------------------------------------------------------------------
@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-0.2"])
@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "qwen3-8b"])
def test_compiled_tables_move_and_keep_no_more_than_eager(stack, model):
    """On every layer: the compiled block's element-wise bytes, saved bytes (each policy), kernel launches and the
    compiled loss's bytes a logit are at most eager's (torch.compile fuses; it does not add traffic here)."""
    s, layer = load_stack(stack), load_model(model).layer
    eager, comp = s.tables("mixed", "sdpa", layer), s.tables("mixed", "sdpa", layer, "model,loss")
    for part in ("elementwise_forward", "elementwise_backward", "saved_layer", "saved_full_recompute",
                 "saved_selective"):
        assert getattr(comp, part).per_gpu(1, False) <= getattr(eager, part).per_gpu(1, False), part
    assert comp.host_forward_ops < eager.host_forward_ops and comp.host_backward_ops < eager.host_backward_ops
    assert comp.loss_forward < eager.loss_forward and comp.loss_backward < eager.loss_backward
    assert comp.logits_peak < eager.logits_peak


def test_compiled_loss_keeps_four_bytes_a_logit_where_eager_keeps_fourteen():
    """torchtitan 0.2's whole-sequence loss: eager, the bf16 logits upcast to fp32, log-softmax and their gradients
    peak at 14 bytes a logit; compiled (compile.components loss), the bf16 logits kept and their bf16 gradient
    written: 4 (advisor probe --stack torchtitan). Llama 3 8B, 8,192 tokens, vocabulary 128,256."""
    logits = 8192 * 128256
    eager = api.estimate(**LLAMA8)
    blocks = api.estimate(**LLAMA8, compile="model")
    both = api.estimate(**LLAMA8, compile="model,loss")
    assert eager.memory.parts["logits_loss"] == pytest.approx(14 * logits)
    assert blocks.memory.parts["logits_loss"] == pytest.approx(14 * logits)
    assert both.memory.parts["logits_loss"] == pytest.approx(4 * logits)
    # the blocks' compile keeps SiLU's output out of the saved tensors: 2 d_ff a token and layer, no recomputation
    saved = 2 * 14336 * 8192 * 32
    assert eager.memory.parts["activations"] - blocks.memory.parts["activations"] == pytest.approx(saved)
    assert both.step_time_s < blocks.step_time_s < eager.step_time_s
    assert both.breakdown["comm/zero_params"] == pytest.approx(eager.breakdown["comm/zero_params"])


def test_a_compiled_plan_reestimates_as_its_row():
    """plan --compile model,loss: each row, re-estimated from its Plan and TrainingSetup, gives its own numbers."""
    from advisor.search import plan

    found = plan(model="llama3-8b", hw="dgx-h100", gpus=8, stack="torchtitan-0.2", compile="model,loss", top=3)
    assert found.plans
    for row in found.plans:
        assert row.setup.compile == "model,loss"
        again = api.estimate_plan("llama3-8b", "dgx-h100", row.plan, row.setup, row.estimate.world_size)
        assert again.step_time_s == pytest.approx(row.estimate.step_time_s)
        assert again.memory.parts == pytest.approx(row.estimate.memory.parts)


def test_compile_where_no_compiled_table_exists_is_one_line():
    """A stack whose profile has no compiled tables refuses --compile in one line naming those that have them; the
    CLI says it on one line too."""
    from _robust import assert_one_line_error

    with pytest.raises(AdvisorError, match=r"--compile model: stack megatron-core's profile has no torch.compile "
                                           r"measured: drop it, or use --stack torchtitan or torchtitan-0.1 or "
                                           r"torchtitan-0.2$"):
        api.estimate(**{**LLAMA8, "stack": "megatron-core", "fsdp": None}, compile="model")
    assert_one_line_error(["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--stack", "megatron-core",
                           "--compile", "model,loss"], "has no torch.compile measured",
                          "--stack deepspeed or hf-trainer or torchtitan")
    # the Trainer compiles the model with its loss inside (TrainingArguments.torch_compile): never one alone
    with pytest.raises(AdvisorError, match=r"--compile model: stack hf-trainer compiles model,loss \(its profile's "
                                           r"compile:\): use --compile model,loss"):
        api.estimate(**{**LLAMA8, "stack": "hf-trainer", "fsdp": None}, compile="model")
    # litgpt runs its own blocks, not the Hugging Face modules its base profile's compiled tables measured
    with pytest.raises(AdvisorError, match="stack litgpt's profile has no torch.compile measured"):
        api.estimate(**{**LLAMA8, "stack": "litgpt", "precision": "bf16", "recompute": "full"}, compile="model,loss")
    # hf-trainer's compiled tables are Llama's: a GPT-2 (GeLU MLP) compiled is refused in one line too
    assert_one_line_error(["estimate", "--model", "gpt2-xl", "--hw", "dgx-a100", "--stack", "hf-trainer", "--compile",
                           "model,loss"], "no kernels.host entry for mode mixed, sdpa attention and a gelu MLP compiled")
    assert_one_line_error(["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--compile", "blocks"],
                          "--compile")


def test_the_estimate_says_what_is_compiled():
    from click.testing import CliRunner

    from advisor.cli import cli

    r = CliRunner().invoke(cli, ["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--stack", "torchtitan-0.2",
                                 "--zero", "3", "--compile", "model,loss"])
    assert r.exit_code == 0, r.output
    assert "torch.compile of model and loss" in r.output


def test_compile_under_auto_and_any():
    """--stack auto costs a search in hf-trainer, which compiles (Llama), where megatron-core, its stack for
    model-parallel plans, has no compiled table: every plan in hf-trainer; --stack any ranks the stacks that
    compile."""
    from advisor.search import plan

    auto = plan(model="llama3-8b", hw="dgx-h100", compile="model,loss", top=20)
    assert auto.plans and {p.setup.stack for p in auto.plans} == {"hf-trainer"}
    found = plan(model="llama3-8b", hw="dgx-h100", stack="any", compile="model,loss", top=20)
    assert found.plans and {p.setup.stack for p in found.plans} <= {"hf-trainer", "torchtitan", "torchtitan-0.1",
                                                                     "torchtitan-0.2"}


def test_accelerate_export_compiles_as_costed(tmp_path, monkeypatch):
    """hf-trainer's --compile model,loss is accelerate's dynamo_config (the prepared model compiled whole, its loss
    inside), read back by accelerate 1.15's own loader and launcher into the TorchDynamoPlugin's environment; a
    part alone is refused in one line (accelerate compiles the whole model)."""
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import TorchDynamoPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    from advisor.api import launch_config
    from advisor.export.common import ExportError

    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, seq=4096, stack="hf-trainer", format="accelerate")
    out = launch_config(**kw, compile="model,loss")
    path = tmp_path / out.filename
    path.write_text(out.text)
    cfg = load_config_from_file(str(path))
    assert cfg.dynamo_config["dynamo_backend"] == "INDUCTOR"
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", str(path), "train.py"]))
    for key, value in prepare_multi_gpu_env(args).items():
        monkeypatch.setenv(key, value)
    assert TorchDynamoPlugin().backend.value == "INDUCTOR"
    with pytest.raises(ExportError, match="accelerate compiles the whole model, its loss inside"):
        launch_config(**kw, compile="model")
    assert "dynamo_config" not in launch_config(**kw).text


def test_when_nothing_fits_eager_the_plan_says_whether_compiling_fits():
    """Llama 3 8B at 320K tokens a sequence on 8 H100s in torchtitan-0.2: no eager plan fits (the whole-sequence
    loss alone holds 14 bytes a logit); the suggestion names --compile model,loss, and that search does find one."""
    from advisor.search import plan
    from advisor.suggest import suggest_fix

    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, stack="torchtitan-0.2", seq=327680, global_batch=8, top=1)
    eager = plan(**kw)
    assert not eager.plans and "--compile model,loss fits on 8 GPUs" in suggest_fix(eager)
    assert plan(**kw, compile="model,loss").plans[0].estimate.fits


def test_deepspeed_export_tells_the_script_to_compile():
    """DeepSpeed 0.19 compiles through engine.compile() (runtime/engine.py), with no config switch (the JSON's
    "compile" section is DeepCompile's passes): the export says so in its notes and leaves that section out; the
    torchrun format, whose script is the user's, refuses --compile in one line naming accelerate."""
    import json

    from advisor.api import launch_config
    from advisor.export.common import ExportError

    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, seq=4096, compile="model,loss")
    out = launch_config(**kw, stack="deepspeed", format="deepspeed")
    assert any("engine.compile()" in n for n in out.notes) and "compile" not in json.loads(out.text)
    with pytest.raises(ExportError, match="the torchrun export has no torch.compile setting: use --format accelerate"):
        launch_config(**kw, stack="hf-trainer", format="torchrun")
