"""advisor export writes only the costed stack's own launch formats; torchtitan and llm-foundry exports are read back
by those libraries' own parsers; Megatron exports pass Megatron-LM's own parse_args + validate_args.

Optional parsers (each test skips when its library is absent):
- torchtitan 0.3.0: `pip install torchtitan==0.3.0` (in the test extra; its config registries import the trainer's
  components, so its dependencies torchdata, datasets and tensorboard are needed too); the test runs
  ConfigManager.parse_args on the exported argv.
- torchtitan 0.2.2 (--format torchtitan-toml): `pip install --no-deps --target .torchtitan-0.2 torchtitan==0.2.2` (the
  README's test install) or ADVISOR_TORCHTITAN_02=DIR; its ConfigManager reads each job file in a subprocess with it
  first on the path, beside the installed 0.3.0.
- llm-foundry 0.22.0: `pip install llm-foundry==0.22.0` with a torchvision matching torch (composer imports it);
  the test runs make_dataclass_and_log_config(TrainConfig) + validate_config as scripts/train/train.py does.
- Megatron-LM's megatron/training/arguments.py ships in megatron-core 0.19.2's wheel (Python >= 3.12 only; 0.16.1
  has no megatron/training): `pip install --no-deps --target DIR --python-version 3.12 --only-binary=:all:
  megatron-core==0.19.2` (the README's test install does it into .megatron-lm) or ADVISOR_MEGATRON_LM=DIR. It runs in a subprocess (its megatron.core is not the
  installed 0.16.1 the other tests use).
"""

from __future__ import annotations

import json
import os
from collections import Counter
import subprocess
import sys
import textwrap

import pytest
import yaml
from click.testing import CliRunner

from advisor.cli_export import export_command
from advisor.export import EXPORTERS, KINDS, ExportError, export, launch_formats, resolve_launch, stacks_launching
from advisor.hardware import load_hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import load_model
from advisor.stack import StackError, list_stacks, load_stack, stack_from_yaml
from advisor.training import TrainingSetup
from advisor.workload import stack_setup


def inputs(model, hw, world, plan_kw, setup_kw):
    plan, setup = Plan(**plan_kw), TrainingSetup(**setup_kw)
    grad_accum, err = resolve_grad_accum(setup, plan)
    assert err is None
    return load_model(model), load_hardware(hw), plan, setup, grad_accum, world


# -- which formats a stack launches ----------------------------------------------------------------------------
def test_shipped_stacks_list_their_launch_formats():
    """Each shipped profile names its formats, usual one first (the stacks' own launchers: shared/stacks/)."""
    want = {"hf-trainer": ("accelerate", "deepspeed", "torchrun"), "megatron-deepspeed": ("megatron", "deepspeed"),
            "torchtitan": ("torchtitan",), "torchtitan-0.2": ("torchtitan-toml", "torchtitan"),
            "torchtitan-0.1": ("torchtitan-toml", "torchtitan"), "llm-foundry": ("llm-foundry",), "llm-foundry-2023": ("llm-foundry",),
            "megatron-core": ("megatron", "megatron-bridge"), "deepspeed": ("deepspeed",), "litgpt": ("litgpt",),
            "nanotron": ("nanotron",)}
    for name in list_stacks():
        assert set(launch_formats(load_stack(name))) <= set(KINDS), name
    for name, formats in want.items():
        if name in list_stacks():
            assert launch_formats(load_stack(name)) == formats
    assert stacks_launching("accelerate")[0] == "hf-trainer" and stacks_launching("megatron")[0] == "megatron-core"


def test_a_format_the_stack_does_not_launch_is_refused_in_one_line():
    with pytest.raises(ExportError) as err:
        resolve_launch("accelerate", "torchtitan")
    assert str(err.value) == ("stack torchtitan does not launch accelerate: it launches torchtitan (--format "
                              "torchtitan); accelerate is launched by --stack hf-trainer")
    assert resolve_launch(None, "megatron-deepspeed")[1] == "megatron"  # no format: the stack's usual one
    assert resolve_launch("deepspeed", "megatron-deepspeed")[1] == "deepspeed"


def test_a_profile_without_launch_formats_says_which_field(tmp_path):
    text = load_stack("torchtitan").model_dump(mode="json")
    text.pop("launch")
    stack = stack_from_yaml(yaml.safe_dump(text))
    with pytest.raises(ExportError, match="lists no launch format: add launch:"):
        launch_formats(stack)
    # a format advisor does not write is refused as the profile loads, naming the field and the formats it takes
    text["launch"] = ["slurm"]
    with pytest.raises(StackError, match=r"launch\.0: Input should be 'accelerate', .* \(got 'slurm'\)"):
        stack_from_yaml(yaml.safe_dump(text))


def test_every_launch_format_a_profile_may_name_has_a_writer():
    assert set(KINDS) == set(EXPORTERS)


BASE = ["--model", "llama3-8b", "--hw", "dgx-h100", "--gpus", "8", "--zero", "3", "--micro-batch", "2", "--seq", "8192"]


@pytest.mark.parametrize("stack,zero,first_line", [
    ("torchtitan", "3", "#!/bin/bash"),
    ("hf-trainer", "3", "# advisor export: llama3-8b"),
    ("megatron-deepspeed", "3", "#!/bin/bash"),  # DeepSpeed's ZeRO-3 under Megatron's flags (test_export_megatron_deepspeed.py)
    ("llm-foundry", "3", "# advisor export: llama3-8b"),
])
def test_cli_without_format_writes_the_stacks_first(stack, zero, first_line):
    result = CliRunner().invoke(export_command, BASE[:BASE.index("--zero") + 1] + [zero] + BASE[BASE.index("--zero") + 2:]
                                + ["--stack", stack])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(first_line) and f"; stack {stack}" in result.stdout.splitlines()[1 if first_line == "#!/bin/bash" else 0]


def test_cli_refuses_a_format_of_another_stack_exit_2():
    result = CliRunner().invoke(export_command, BASE + ["--stack", "torchtitan", "--format", "megatron"])
    assert result.exit_code == 2
    assert result.output == ("error: stack torchtitan does not launch megatron: it launches torchtitan (--format "
                             "torchtitan); megatron is launched by --stack megatron-core or megatron-deepspeed or megatron-bridge-perf\n")


def test_cli_format_without_stack_costs_in_the_stack_that_launches_it():
    """No --stack: the format names the stack (torchtitan's arguments come from the torchtitan stack)."""
    result = CliRunner().invoke(export_command, BASE + ["--format", "torchtitan"])
    assert result.exit_code == 0, result.output
    assert "; stack torchtitan" in result.stdout


def test_plan_the_stack_does_not_run_is_refused():
    """ZeRO-1 is not among torchtitan's plan kinds (its profile's offers): refused, naming the stack."""
    with pytest.raises(ExportError, match="invalid under stack torchtitan"):
        export("torchtitan", *inputs("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=1), dict(micro_batch=1)))


# -- torchtitan: torchtitan 0.3.0's ConfigManager -----------------------------------------------------------------
TITAN = {
    "fsdp-sac": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=3), dict(micro_batch=2, grad_accum=2, recompute="selective")),
    "ddp-full": ("llama3-8b", "dgx-h100", 8, dict(dp=8), dict(micro_batch=1, global_batch=32, recompute="full",
                                                               optimizer="adamw-fused")),
    "hsdp-pure-bf16": ("llama3-70b", "dgx-h100", 32, dict(dp=32, zero=3, hybrid_shard=True),
                       dict(micro_batch=1, global_batch=64, precision="bf16", recompute="full")),
    "zero2-tp-sp": ("llama3-8b", "dgx-h100", 16, dict(dp=4, tp=4, zero=2, sp=True), dict(micro_batch=1, grad_accum=4)),
    "3d-interleaved": ("llama3-70b", "dgx-h100", 64, dict(dp=2, tp=8, pp=4, sp=True, schedule="interleaved",
                                                          virtual_stages=2),
                       dict(micro_batch=1, global_batch=256, recompute="full")),
    "pp-1f1b-fp32": ("llama3-8b", "dgx-a100", 16, dict(dp=8, pp=2), dict(micro_batch=1, global_batch=64, precision="fp32",
                                                                          seq_len=2048)),
    # expert parallelism borrowed from FSDP and TP (efsdp = dp_shard x tp / ep = 4), experts whole under EP
    "moe-ep-tp-sac": ("qwen3-30b-a3b", "dgx-h100", 16, dict(dp=8, tp=2, sp=True, zero=3, ep=4, etp=1),
                      dict(micro_batch=1, seq_len=4096, recompute="selective")),
    # ZB-V: two chunks a rank in a V (torch.distributed.pipelining ScheduleZBVZeroBubble); it raised a KeyError
    "pp-zbv": ("llama3-8b", "dgx-h100", 16, dict(dp=4, pp=4, schedule="zb-v"), dict(micro_batch=1, global_batch=64)),
    # no EP: written as 1 over deepseek_v3_671b's own expert_parallel_degree=2
    "moe-no-ep": ("deepseek-v3", "gb200-nvl72", 256, dict(dp=256, zero=3), dict(micro_batch=1, recompute="full")),
    # the embedding and the output counted as a layer each: (126 + 2) / 4 stages, first/last_stage_less_layers 1
    "405b-pp-edges": ("llama3-405b", "dgx-h100", 256, dict(dp=8, tp=8, pp=4, sp=True, zero=1, pp_split="edges"),
                      dict(micro_batch=1, global_batch=64, recompute="full", precision="fp8-rowwise")),
    # the recipes torchtitan 0.3.0 runs through a config function's converters: llama3_405b's own Float8 rowwise,
    # llama3_8b_mxfp8, llama3_8b_first_85_pct_layers_nvfp4 (compile written as costed: on for the mxfp8 case)
    "405b-fp8-rowwise": ("llama3-405b", "dgx-h100", 256, dict(dp=32, tp=8, sp=True, zero=3),
                         dict(micro_batch=1, recompute="full", precision="fp8-rowwise")),
    "8b-mxfp8": ("llama3-8b", "dgx-b200", 8, dict(dp=8, zero=3), dict(micro_batch=1, recompute="selective",
                                                                      precision="mxfp8", compile="model,loss")),
    "8b-nvfp4": ("llama3-8b", "gb200-nvl72", 4, dict(dp=4, zero=3), dict(micro_batch=8, seq_len=2048, precision="nvfp4",
                                                                         recompute="selective")),
    # async TP: an inductor pass, so the plan compiles (CompileConfig refuses it alone); the blocks only
    "fsdp-async-tp": ("llama3-70b", "dgx-h100", 64, dict(dp=8, tp=8, sp=True, zero=3),
                      dict(micro_batch=1, recompute="full", tp_overlap="async", compile="model")),
}


def _argv(text: str, tmp_path) -> list[str]:
    """Run the exported script with bash, a stub torchrun on PATH: the arguments torchtitan.train gets."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\0" "$@"\n')
    (bindir / "torchrun").chmod(0o755)
    script = tmp_path / "run.sh"
    script.write_text(text)
    out = subprocess.run(["bash", str(script)], env={"PATH": f"{bindir}:{os.environ['PATH']}"}, capture_output=True,
                         check=True).stdout.decode().split("\0")[:-1]
    return out[out.index("torchtitan.train") + 1:]


@pytest.mark.parametrize("case", TITAN)
def test_torchtitan_notes_in_file_and_degrees(case, tmp_path):
    model, hw, plan, setup, ga, world = inputs(*TITAN[case])
    out = export("torchtitan", model, hw, plan, setup, ga, world)
    assert all(f"# note: {n}" in out.text.splitlines() for n in out.notes) and out.notes
    argv = _argv(out.text, tmp_path)
    flag = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--") and not argv[i + 1].startswith("-")}
    product = 1
    for k in ("data-parallel-replicate-degree", "data-parallel-shard-degree", "tensor-parallel-degree",
              "pipeline-parallel-degree"):
        product *= int(flag[f"--parallelism.{k}"])
    assert product == world
    assert argv[-1] == f"activation-checkpoint:{setup.recompute.value}"


def test_torchtitan_cuda_graph_note_only_where_there_is_a_choice():
    """torchtitan 0.3.0 refuses CUDA graphs under pipeline parallelism (trainer.py:183-187): there the
    --training.disable-cuda-graphs flag is required, so only a plan without PP is told it may drop it."""
    for plan_kw, noted in ((dict(dp=8, zero=3), True), (dict(dp=2, tp=2, pp=2, zero=1), False)):
        out = export("torchtitan", *inputs("llama3-8b", "dgx-h100", 8, plan_kw, dict(micro_batch=1, grad_accum=4)))
        assert "--training.disable-cuda-graphs" in out.text
        assert any(n.startswith("CUDA graphs off") for n in out.notes) is noted
    assert "DeepSeek-V3" in load_stack("torchtitan").description  # deepseek-v3 is one of its registries' configs


@pytest.mark.slow  # ~7 s each: ConfigManager imports torchtitan's trainer components and model registry
@pytest.mark.parametrize("case", TITAN)
def test_torchtitan_config_manager_parses(case, tmp_path, monkeypatch):
    pytest.importorskip("torchtitan")
    pytest.importorskip("tyro")
    from torchtitan.config.manager import ConfigManager

    model, hw, plan, setup, ga, world = inputs(*TITAN[case])
    recipe = setup.precision.recipe is not None
    if recipe:  # the config function builds torchao's converters, which ask for the GPU they would run on
        pytest.importorskip("torchao")
        from torchtitan.components.quantization import float8, mx, nvfp4

        for module in (float8, mx, nvfp4):
            monkeypatch.setattr(module, "has_cuda_capability", lambda *_: True)
    cfg = ConfigManager().parse_args(_argv(export("torchtitan", model, hw, plan, setup, ga, world).text, tmp_path))
    p, t, lay = cfg.parallelism, cfg.training, plan.layout(hw.gpus_per_node, world)
    assert (p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
            p.pipeline_parallel_degree) == (lay.dp_replicate, lay.dp_shard, plan.tp, plan.pp)
    assert t.global_batch_size == setup.micro_batch * ga * plan.dp and t.seq_len == setup.seq_len
    # without PP torchtitan accumulates global / (local x dp) steps; with PP it splits local into micro-batches
    if plan.pp > 1:
        assert t.local_batch_size // p.pipeline_parallel_microbatch_size == ga
        assert p.pipeline_parallel_schedule == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B",
                                                "zb-v": "ZBVZeroBubble"}[plan.schedule.value]
        edges = int(plan.pp_split.value == "edges")  # the embedding and the output counted as a layer each
        units = model.n_layers + 2 * edges  # torchtitan makes ceil(units / layers_per_stage) stages
        lps = p.pipeline_parallel_layers_per_stage  # None: its default, 1 stage a rank (1F1B, GPipe) or 2 (the others)
        default = 1 if plan.schedule.value in ("1f1b", "gpipe") else 2
        assert (lay.virtual_stages == default) if lps is None else (-(-units // lps) == plan.pp * lay.virtual_stages)
        assert p.pipeline_parallel_first_stage_less_layers == p.pipeline_parallel_last_stage_less_layers == edges
    else:
        assert t.global_batch_size // (t.local_batch_size * plan.dp) == ga
    if plan.tp > 1:
        assert p.enable_sequence_parallel == plan.sp
    ac = cfg.activation_checkpoint  # the subcommand's config: FullAC.Config, SelectiveAC.Config, or none
    want = {"none": None, "full": "FullAC.Config", "selective": "SelectiveAC.Config"}[setup.recompute.value]
    assert (None if ac is None else type(ac).__qualname__) == want
    assert t.dtype == ("bfloat16" if setup.precision.value == "bf16" else "float32")
    assert t.mixed_precision_param == ("float32" if setup.precision.value == "fp32" else "bfloat16")
    asynctp = setup.tp_overlap == "async"
    assert t.disable_cuda_graphs and cfg.compile.enable_async_tensor_parallel == asynctp
    # compile as costed, over what the config function sets (the recipes' turn it on for their converters)
    assert cfg.compile.enable == (setup.compile != "none")
    if setup.compile != "none":
        assert sorted(cfg.compile.components) == sorted(setup.compile.split(","))
    # the converters ran on the model's config: its Linear configs, by class, against what advisor costs low
    from torchtitan.models.common.linear import Linear

    kinds = Counter(type(c).__qualname__ for _, c, _, _ in cfg.model_spec.traverse(Linear.Config, recurse=True))
    per_layer = 5  # wqkv, wo, w1, w2, w3
    low = {"fp8-rowwise": "Float8Linear.Config", "mxfp8": "MXFP8Linear.Config", "nvfp4": "NVFP4Linear.Config"}
    if recipe:  # the layers the stack profile runs low (its BF16 tail under NVFP4); llama3_8b_mxfp8 takes lm_head too
        bf16 = load_stack("torchtitan").engine.bf16_layers(setup.precision.recipe, model.n_layers)
        head = int(setup.precision.value == "mxfp8")
        want = {low[setup.precision.value]: (model.n_layers - bf16) * per_layer + head,
                "Linear.Config": bf16 * per_layer + 1 - head}
        assert kinds == {k: n for k, n in want.items() if n}
    else:
        assert set(kinds) == {"Linear.Config"}
    opt = stack_setup(setup, load_stack("torchtitan")).optimizer.value  # asked, else the stack's default (fused)
    assert cfg.optimizer.implementation == {"adamw": "foreach", "adamw-fused": "fused"}[opt]
    assert p.fsdp_reshard_after_forward == ("never" if plan.zero == 2 else "default")
    if model.routed:
        assert p.expert_parallel_degree == plan.ep
    shape = cfg.model_spec.model
    assert (shape.dim, len(shape.layers)) == (model.d_model, model.n_layers)


@pytest.mark.parametrize("model,setup_kw,message", [
    ("llama2-7b", dict(), "no config function for llama2-7b"),
    ("llama3-8b", dict(precision="fp16-mixed"), "no fp16-mixed setting"),
    ("llama3-8b", dict(optimizer="sgd"), "trains AdamW, not sgd"),
    ("llama3-8b", dict(precision="fp8-rowwise"), "no config function for llama3-8b that runs fp8-rowwise"),
    ("llama3-405b", dict(precision="bf16-mixed"), "llama3_405b trains fp8-rowwise"),
    # torchtitan runs LoRA through a converter of the config function: the script would train every weight
    ("llama3-8b", dict(finetune=dict(method="lora")), "trains LoRA through a config function's LoRAConverter"),
])
def test_torchtitan_refusals(model, setup_kw, message):
    with pytest.raises(ExportError, match=message):
        export("torchtitan", *inputs(model, "dgx-h100", 8, dict(dp=8, zero=3), setup_kw))


# -- torchtitan 0.2: its TOML job file, read by 0.2.2's own ConfigManager ---------------------------------------------
TITAN_TOML = {
    "fsdp-sac-fp8-rowwise": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=3),
                             dict(micro_batch=1, seq_len=8192, recompute="selective", precision="fp8-rowwise")),
    "fsdp-tensorwise-fused-adam": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=3),
                                   dict(micro_batch=2, seq_len=8192, recompute="selective", precision="fp8-tensorwise",
                                        optimizer="adamw-fused")),
    "gw-hp-every-2": ("llama3-8b", "dgx-h100", 16, dict(dp=16, zero=3),
                      dict(micro_batch=1, recompute="every-k", recompute_layers=2, precision="fp8-rowwise-gw-hp")),
    "mxfp8-b200": ("llama3-8b", "dgx-b200", 8, dict(dp=8, zero=3), dict(micro_batch=1, recompute="selective",
                                                                        precision="mxfp8")),
    "2d-async-tp": ("llama3-70b", "dgx-h100", 64, dict(dp=8, tp=8, sp=True, zero=3),
                    dict(micro_batch=1, recompute="full", tp_overlap="async", precision="fp8-tensorwise",
                         compile="model,loss")),
    "hsdp-pure-bf16": ("llama3-70b", "dgx-h100", 32, dict(dp=32, zero=3, hybrid_shard=True),
                       dict(micro_batch=1, global_batch=64, precision="bf16", recompute="full")),
    "pp-interleaved": ("llama3-70b", "dgx-h100", 64, dict(dp=2, tp=8, pp=4, zero=1, sp=True, schedule="interleaved",
                                                          virtual_stages=2),
                       dict(micro_batch=1, global_batch=256, recompute="full")),
    "405b-pp-edges": ("llama3-405b", "dgx-h100", 256, dict(dp=8, tp=8, pp=4, sp=True, zero=1, pp_split="edges"),
                      dict(micro_batch=1, global_batch=64, recompute="full")),
    # 36 layers over 8 stages: 5 and 4 layers (torchtitan gives the first ones the extra layer)
    "pp-uneven-cp": ("qwen3-8b", "dgx-h100", 16, dict(dp=1, cp=2, cp_comm="all-gather", pp=8),
                     dict(micro_batch=1, global_batch=32, seq_len=8192)),
    "zero2-ddp-none": ("qwen3-8b", "dgx-h100", 8, dict(dp=8, zero=2), dict(micro_batch=1, grad_accum=4, seq_len=4096)),
    "moe-ep-tp": ("qwen3-30b-a3b", "dgx-h100", 16, dict(dp=8, tp=2, sp=True, zero=3, ep=4, etp=1),
                  dict(micro_batch=1, seq_len=4096, recompute="selective")),
    "llama4-scout-ep": ("llama4-scout", "gb200-nvl72", 64, dict(dp=64, zero=3, ep=16),
                        dict(micro_batch=1, seq_len=8192, recompute="full")),
}
RECIPE_NAMES = {"fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise", "fp8-rowwise-gw-hp": "rowwise_with_gw_hp",
                "mxfp8": "mxfp8_cublas"}


def _titan_toml(case):
    model, hw, plan, setup, ga, world = inputs(*TITAN_TOML[case])
    return (model, hw, plan, setup, ga, world), export("torchtitan-toml", model, hw, plan, setup, ga, world, "torchtitan-0.2")


@pytest.mark.parametrize("case", TITAN_TOML)
def test_torchtitan_toml_is_toml_with_the_plans_degrees(case):
    import tomllib

    (model, hw, plan, setup, ga, world), out = _titan_toml(case)
    assert out.kind == "torchtitan-toml" and out.stack == "torchtitan-0.2"
    assert all(f"# note: {n}" in out.text.splitlines() for n in out.notes)
    cfg = tomllib.loads(out.text)
    p = cfg["parallelism"]
    assert (p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] * p["tensor_parallel_degree"]
            * p["pipeline_parallel_degree"] * p.get("context_parallel_degree", 1)) == world
    recipe = setup.precision.value
    if recipe in RECIPE_NAMES:
        section = cfg["model"]["converters"][0]
        assert section == ("quantize.linear.mx" if recipe == "mxfp8" else "quantize.linear.float8")
        # the LM head stays in BF16 as advisor costs it (advisor.precision)
        node = cfg
        for part in section.split("."):
            node = node[part]
        assert node == {"recipe_name": RECIPE_NAMES[recipe], "filter_fqns": ["output"]}
    else:
        assert "converters" not in cfg["model"]


@pytest.mark.parametrize("model,hw,setup_kw,message", [
    ("llama2-7b", "dgx-h100", dict(), "no flavor for llama2-7b"),
    ("llama3-8b", "dgx-b200", dict(precision="nvfp4"), "no converter for it"),
    ("llama3-8b", "dgx-h100", dict(precision="fp8-blockwise"), "no converter for it"),
    ("qwen3-30b-a3b", "dgx-h100", dict(precision="fp8-rowwise"), "grouped GEMMs low only through torchao prototypes"),
    ("llama3-8b", "dgx-h100", dict(precision="fp16-mixed"), "no fp16-mixed setting"),
])
def test_torchtitan_toml_refusals(model, hw, setup_kw, message):
    with pytest.raises(ExportError, match=message) as err:
        export("torchtitan-toml", *inputs(model, hw, 8, dict(dp=8, zero=3), setup_kw), "torchtitan-0.2")
    assert "\n" not in str(err.value)


_TITAN02 = textwrap.dedent('''
    import json, sys
    from torchtitan.config.manager import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec
    import torchtitan
    out = {"file": torchtitan.__file__}
    for name, path in json.load(sys.stdin).items():
        c = ConfigManager().parse_args(["--job.config_file", path])
        args = get_train_spec(c.model.name).model_args[c.model.flavor]
        p, t, ac, q = c.parallelism, c.training, c.activation_checkpoint, c.quantize.linear
        out[name] = dict(
            degrees=[p.data_parallel_replicate_degree, p.data_parallel_shard_degree, p.tensor_parallel_degree,
                     p.pipeline_parallel_degree, p.expert_parallel_degree, p.expert_tensor_parallel_degree],
            fsdp_reshard=p.fsdp_reshard_after_forward, async_tp=p.enable_async_tensor_parallel,
            compile=[c.compile.enable, sorted(c.compile.components) if c.compile.enable else []],
            pp=[p.pipeline_parallel_schedule, p.pipeline_parallel_microbatch_size, p.pipeline_parallel_layers_per_stage,
                [p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers]],
            batch=[t.local_batch_size, t.global_batch_size, t.seq_len], dtypes=[t.dtype, t.mixed_precision_param],
            ac=[ac.mode, ac.selective_ac_option], converters=c.model.converters,
            float8=[q.float8.recipe_name, q.float8.filter_fqns, q.float8.enable_fsdp_float8_all_gather],
            mx=[q.mx.recipe_name, q.mx.filter_fqns], optimizer=c.optimizer.implementation,
            shape=[args.dim, args.n_layers, args.vocab_size])
    print(json.dumps(out))
''')


@pytest.mark.slow  # ~10 s: one subprocess imports torchtitan 0.2.2's config manager and model registry
def test_torchtitan_toml_parsed_by_torchtitan_022(tmp_path):
    """Every case read back by torchtitan 0.2.2's ConfigManager (its TOML loader, then tyro), the model flavor looked up
    in its registry, in a subprocess with 0.2.2 first on the path (the test extra installs 0.3.0). The README's test
    install unpacks 0.2.2 into .torchtitan-0.2; ADVISOR_TORCHTITAN_02 names another place."""
    pytest.importorskip("tyro")
    root = os.environ.get("ADVISOR_TORCHTITAN_02") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".torchtitan-0.2")
    if not os.path.isfile(os.path.join(root, "torchtitan", "config", "job_config.py")):
        pytest.skip("set ADVISOR_TORCHTITAN_02 to a directory with torchtitan 0.2.2 (pip install --no-deps --target)")
    runs, paths = {}, {}
    for case in TITAN_TOML:
        runs[case] = _titan_toml(case)
        paths[case] = str(tmp_path / f"{case}.toml")
        (tmp_path / f"{case}.toml").write_text(runs[case][1].text)
    run = subprocess.run([sys.executable, "-c", _TITAN02], input=json.dumps(paths), capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])},
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got.pop("file").startswith(os.path.abspath(root))  # 0.2.2, not the installed 0.3.0
    for case, ((model, hw, plan, setup, ga, world), _) in runs.items():
        g, lay = got[case], plan.layout(hw.gpus_per_node, world)
        ep = plan.ep if model.routed else 1
        assert g["degrees"] == [lay.dp_replicate, lay.dp_shard, plan.tp, plan.pp, ep,
                                (plan.etp or plan.tp) if plan.ep > 1 else 1], case
        assert g["shape"] == [model.d_model, model.n_layers, model.vocab], case
        assert g["fsdp_reshard"] == ("never" if plan.zero == 2 else "default")
        local, gbs, seq = g["batch"]
        assert gbs == setup.micro_batch * ga * plan.dp and seq == setup.seq_len
        if plan.pp > 1:  # the pipeline splits local into micro-batches
            edges = int(plan.pp_split.value == "edges")
            assert local // g["pp"][1] == ga and g["pp"][3] == [edges, edges]
            lps, default = g["pp"][2], 1 if plan.schedule.value in ("1f1b", "gpipe") else 2
            assert (lay.virtual_stages == default) if lps is None else (
                -(-(model.n_layers + 2 * edges) // lps) == plan.pp * lay.virtual_stages)
            assert g["pp"][0] == {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb-v": "ZBVZeroBubble"}[
                plan.schedule.value]
        else:  # trainer.py gradient_accumulation_steps = global / (local x dp)
            assert gbs // (local * plan.dp) == ga
        rc = setup.recompute.value
        assert g["ac"] == {"none": ["none", "2"], "full": ["full", "2"], "selective": ["selective", "op"],
                           "every-k": ["selective", str(setup.recompute_layers)]}[rc], case
        assert g["dtypes"] == ["bfloat16" if setup.precision.value == "bf16" else "float32",
                               "float32" if setup.precision.value == "fp32" else "bfloat16"]
        assert g["async_tp"] == (setup.tp_overlap == "async")
        assert g["compile"] == ([True, sorted(setup.compile.split(","))] if setup.compile != "none" else [False, []])
        opt = stack_setup(setup, load_stack("torchtitan-0.2")).optimizer.value  # asked, else 0.2.2's default (fused)
        assert g["optimizer"] == {"adamw": "foreach", "adamw-fused": "fused"}[opt]
        recipe = RECIPE_NAMES.get(setup.precision.value)
        if recipe is None:
            assert g["converters"] == []
        elif recipe.startswith("mxfp8"):
            assert g["converters"] == ["quantize.linear.mx"] and g["mx"] == [recipe, ["output"]]
        else:  # FSDP gathers in BF16, as the torchtitan-0.2 profile costs them
            assert g["converters"] == ["quantize.linear.float8"] and g["float8"] == [recipe, ["output"], False]


# -- Megatron-LM: its own parse_args + validate_args, every Megatron export case -----------------------------------
_VALIDATE = textwrap.dedent('''
    import json, os, sys, typing
    typing.override = getattr(typing, "override", lambda f: f)  # 3.12's no-op decorator, for Python 3.11
    import megatron.training.arguments as A
    out = []
    for case in json.load(sys.stdin):
        A.get_device_arch_version = lambda: case["arch"]  # the GPU's major compute capability (CPU here)
        A.torch.cuda.get_device_capability = lambda *_: (case["arch"], 0)  # --moe-grouped-gemm's check asks torch
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(case["env"])
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        try:
            args = A.validate_args(A.parse_args())
            got = {k: getattr(args, k) for k in case["expect"]}
            out.append("ok" if got == case["expect"] else f"parsed {got}, not {case['expect']}")
        except (AssertionError, SystemExit, ValueError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(out))
''')
ARCH = {"A100": 8, "H100": 9, "TITA": 7}  # CUDA compute capability major: Ampere 8.0, Hopper 9.0, Titan RTX (Turing) 7.5 (NVIDIA datasheets)


@pytest.mark.slow  # ~45 s: imports Megatron-LM's training package in a subprocess
def test_megatron_exports_pass_megatron_lms_validate_args(tmp_path):
    """Every Megatron case of tests/test_export.py, run by bash (the env it sets), through Megatron-LM's own
    parse_args and validate_args (megatron-core 0.19.2's megatron/training/arguments.py)."""
    # the README's test install unpacks it to .megatron-lm in the checkout; ADVISOR_MEGATRON_LM names another place
    root = os.environ.get("ADVISOR_MEGATRON_LM") or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                                 ".megatron-lm")
    if not root or not os.path.isfile(os.path.join(root, "megatron", "training", "arguments.py")):
        pytest.skip("set ADVISOR_MEGATRON_LM to a directory with megatron/training/arguments.py (module docstring)")
    from test_export import CASES, _run_megatron_script, exportable
    from test_export import inputs as case_inputs

    names, cases = [c for c in CASES if exportable("megatron", c)], []
    for case in names:
        model, hw, plan, setup, ga, world = case_inputs(case)
        text = export("megatron", model, hw, plan, setup, ga, world).text
        argv, env = _run_megatron_script(text, tmp_path, {})
        argv += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(model.vocab - 1), "--mock-data"]
        # the model's RoPE base, norm epsilon and Llama 3.1 scaling as Megatron-LM parses them (its defaults 10000, 1e-5)
        rope = model.position.value == "rotary"
        expect = {"rotary_base": int(model.rope_theta) if rope and model.rope_theta else 10000,
                  "layernorm_epsilon": model.norm_eps or 1e-5,
                  "use_rope_scaling": rope and getattr(model.rope_scaling, "kind", None) == "llama3"}
        cases.append({"argv": argv, "env": {**env, "WORLD_SIZE": str(world), "RANK": "0"},
                      "arch": ARCH[hw.gpu.name[:4].upper()], "expect": expect})
    run = subprocess.run([sys.executable, "-c", _VALIDATE], input=json.dumps(cases), capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])},
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    results = dict(zip(names, json.loads(run.stdout.strip().splitlines()[-1])))
    assert results == {case: "ok" for case in names}, run.stderr[-3000:]


def test_plan_export_writes_only_the_costed_stacks_format():
    from _robust import run_main

    from advisor.cli import plan

    code, _, err = run_main(["plan", "--model", "llama3-8b", "--hw", "dgx-h100", "--gpus", "8", "--stack", "torchtitan",
                             "--export", "megatron"])
    assert code == 2 and err.count("\n") == 1 and "stack torchtitan does not launch megatron" in err
    chosen = CliRunner().invoke(plan, ["--model", "llama3-8b", "--hw", "dgx-h100", "--gpus", "8", "--export", "torchtitan"])
    assert chosen.exit_code == 0, chosen.output
    assert "; stack torchtitan" in chosen.stdout.splitlines()[1]  # searched in the stack that launches the format



def test_plan_precision_auto_exports_the_fastest_precision_the_format_writes():
    """plan --precision auto --export torchtitan ranked Qwen3-30B-A3B on 8 B200s fastest in a low-precision recipe
    that torchtitan 0.3.0 has no qwen3 config function for (its recipes: llama3_8b_mxfp8, llama3_8b_first_85_pct_layers_
    nvfp4, llama3_405b's rowwise FP8; torchtitan/models/*/config_registry.py), then refused every ranked plan of that
    precision and told the user to raise --top, which ranks more plans of the same precision; it writes the best plan
    of the fastest precision the format writes (bf16-mixed here), saying so."""
    from _robust import run_main

    args = ["plan", "--model", "qwen3-30b-a3b", "--hw", "dgx-b200", "--gpus", "8", "--global-batch", "64", "--seq",
            "4096", "--precision", "auto", "--stack", "torchtitan", "--top", "2", "--export", "torchtitan", "--out", "-"]
    code, out, err = run_main(args)
    assert code == 0, err
    assert "precision=bf16-mixed" in out.splitlines()[1]
    note = next(line for line in err.splitlines() if line.startswith("note: the best plan in "))
    assert note.startswith("note: the best plan in bf16-mixed, the fastest precision torchtitan writes (plan 1 in ")
    assert "has no config function for qwen3-30b-a3b that runs" in note and "--export torchtitan-toml" in note


def test_plan_precision_auto_export_without_stack_ranks_precisions_in_the_formats_stack():
    """plan --precision auto --export torchtitan without --stack: auto's best plan is megatron-core's, which does not
    launch torchtitan, so the search reruns in torchtitan; it reran at the default precision (bf16-mixed), dropping
    --precision auto without a word, where torchtitan 0.3.0 writes Llama 3 8B's NVFP4 and MXFP8 recipes
    (llama3_8b_first_85_pct_layers_nvfp4, llama3_8b_mxfp8) and ranks one of them first on B200 (advisor plan
    --stack torchtitan --precision auto)."""
    from _robust import run_main

    args = ["plan", "--model", "llama3-8b", "--hw", "dgx-b200", "--gpus", "8", "--global-batch", "64", "--seq", "4096",
            "--precision", "auto", "--top", "2", "--export", "torchtitan", "--out", "-"]
    code, out, err = run_main(args)
    named = run_main(args[:-4] + ["--stack", "torchtitan", "--export", "torchtitan", "--out", "-"])
    assert code == 0 and named[0] == 0, err
    assert out == named[1] and "precision=bf16-mixed" not in out.splitlines()[1]

# -- llm-foundry: its TrainConfig and train.py's validate_config ---------------------------------------------------
FOUNDRY = {
    "mpt-fsdp": ("mpt-7b", "dgx-a100", 8, dict(dp=8, zero=3), dict(micro_batch=4, grad_accum=2, seq_len=2048)),
    "gpt2-ddp-fp16": ("gpt2", "dgx-a100", 8, dict(dp=8), dict(micro_batch=8, global_batch=128, precision="fp16-mixed")),
    "llama-hsdp-full": ("llama2-13b", "dgx-h100", 32, dict(dp=32, zero=3, hybrid_shard=True),
                        dict(micro_batch=1, global_batch=128, recompute="full")),
    "zero2-fp32": ("mpt-7b", "dgx-a100", 16, dict(dp=16, zero=2), dict(micro_batch=1, global_batch=64, precision="fp32",
                                                                        seq_len=2048)),
}


@pytest.mark.parametrize("case", FOUNDRY)
def test_foundry_yaml_keys(case):
    model, hw, plan, setup, ga, world = inputs(*FOUNDRY[case])
    out = export("llm-foundry", model, hw, plan, setup, ga, world, "llm-foundry")
    cfg = yaml.safe_load(out.text)
    assert all(f"# note: {n}" in out.text.splitlines() for n in out.notes)
    # update_batch_size_info (llmfoundry/utils/config_utils.py): device batch = global / world, accumulation =
    # device batch / micro-batch; with every rank a data-parallel rank that is advisor's grad_accum
    assert cfg["global_train_batch_size"] // world // cfg["device_train_microbatch_size"] == ga
    assert cfg["max_seq_len"] == setup.seq_len
    assert cfg["precision"] == {"bf16-mixed": "amp_bf16", "fp16-mixed": "amp_fp16", "fp32": "fp32"}[setup.precision.value]
    if plan.zero >= 2:
        want = "HYBRID_SHARD" if plan.hybrid_shard else {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}[plan.zero]
        f = cfg["fsdp_config"]
        assert f["sharding_strategy"] == want and f["limit_all_gathers"] is True
        assert f["activation_checkpointing"] == (setup.recompute.value == "full")
        assert f["mixed_precision"] == ("FULL" if setup.precision.value == "fp32" else "PURE")
    else:
        assert "fsdp_config" not in cfg
    assert cfg["model"]["name"] == ("mpt_causal_lm" if model.name == "mpt-7b" else "hf_causal_lm")
    # the clipping the llm-foundry profile costs (engine.clip_grad_norm), as its MPT pretrain YAMLs set it
    # (shared/stacks/llm-foundry-and-nanotron.md A.0); without the key Composer clips nothing
    assert cfg["algorithms"] == {"gradient_clipping": {"clipping_type": "norm", "clipping_threshold": 1.0}}
    if model.name == "mpt-7b":  # MPT-7B: d_model 4096, 32 heads, 32 layers, expansion 4, ALiBi (its config.json)
        m = cfg["model"]
        assert (m["d_model"], m["n_heads"], m["n_layers"], m["expansion_ratio"]) == (4096, 32, 32, 4.0)
        assert m["attn_config"]["alibi"] and not m["learned_pos_emb"]


@pytest.mark.parametrize("case", FOUNDRY)
def test_foundry_train_config_parses(case, monkeypatch):
    """As llm-foundry's scripts/train/train.py reads its YAML: make_dataclass_and_log_config(TrainConfig, all
    transforms) then validate_config (llmfoundry/command_utils/train.py)."""
    pytest.importorskip("llmfoundry")
    from omegaconf import OmegaConf

    from llmfoundry.command_utils.train import validate_config
    from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS, TrainConfig, make_dataclass_and_log_config

    model, hw, plan, setup, ga, world = inputs(*FOUNDRY[case])
    out = export("llm-foundry", model, hw, plan, setup, ga, world, "llm-foundry")
    monkeypatch.setenv("WORLD_SIZE", str(world))  # composer.utils.dist.get_world_size without a process group
    _, cfg = make_dataclass_and_log_config(OmegaConf.create(out.text), TrainConfig, TRAIN_CONFIG_KEYS, transforms="all")
    validate_config(cfg)
    assert (cfg.device_train_batch_size, cfg.device_train_microbatch_size) == (setup.micro_batch * ga, setup.micro_batch)
    assert cfg.max_seq_len == setup.seq_len


@pytest.mark.parametrize("plan_kw,setup_kw,message", [
    (dict(dp=4, tp=2), dict(), "invalid under stack llm-foundry: llm-foundry does not run tensor parallelism"),
    (dict(dp=8, zero=3), dict(precision="bf16"), "no pure bf16"),
    (dict(dp=8, zero=3), dict(recompute="selective"), "invalid under stack llm-foundry: llm-foundry has no selective"),
    (dict(dp=8), dict(recompute="full"), "needs --zero 2 or 3"),
    # Composer's AMP_FP8 is Transformer Engine's DelayedScaling (mosaicml 0.32.1 composer/core/precision.py)
    (dict(dp=8, zero=2), dict(precision="fp8-tensorwise"), "fp8-tensorwise has none; use --precision fp8-delayed"),
])
def test_foundry_refusals(plan_kw, setup_kw, message):
    """What the stack does not run is refused by its profile (offers, selective) before the exporter sees it."""
    with pytest.raises(ExportError, match=message):
        export("llm-foundry", *inputs("mpt-7b", "dgx-a100", 8, plan_kw, dict(micro_batch=1, seq_len=2048, **setup_kw)),
               "llm-foundry")


def test_foundry_writes_fp8_delayed_as_composers_amp_fp8():
    out = export("llm-foundry", *inputs("mpt-7b", "dgx-h100", 8, dict(dp=8, zero=2),
                                        dict(micro_batch=1, seq_len=2048, precision="fp8-delayed")), "llm-foundry")
    assert yaml.safe_load(out.text)["precision"] == "amp_fp8"


def test_python_api_launch_config():
    """advisor.launch_config: estimate's options, the same refusal as the CLI, the stack's usual format by default."""
    import advisor
    from advisor.errors import AdvisorError

    out = advisor.launch_config("llama3-8b", "dgx-h100", gpus=8, zero=3, micro_batch=2, stack="torchtitan")
    assert (out.kind, out.stack, out.filename) == ("torchtitan", "torchtitan", "torchtitan_train.sh")
    assert advisor.launch_config("gpt2", "dgx-a100", gpus=8, format="deepspeed").stack == "hf-trainer"
    with pytest.raises(AdvisorError, match="stack torchtitan does not launch megatron: it launches torchtitan"):
        advisor.launch_config("llama3-8b", "dgx-h100", gpus=8, zero=3, stack="torchtitan", format="megatron")


@pytest.mark.parametrize("model,hw,gpus", [("olmo-2-7b", "dgx-a100", 8), ("gemma-2-9b", "dgx-a100", 8)])
def test_auto_costs_in_a_stack_that_exports_the_model(model, hw, gpus):
    """--stack auto leaves megatron-core out for a model its launch formats cannot write (OLMo 2's full-width q/k
    norms, Gemma 2's GeGLU and soft-capping: megatron_shape.unwritten), so the plans it ranks export; megatron-core
    itself still costs them when asked."""
    from advisor.api import auto_runs
    from advisor.export import unwritable
    from advisor.search import plan
    from advisor.stack import load_stack

    core = load_stack("megatron-core")
    assert unwritable(core, load_model(model)) and not auto_runs(core, load_model(model))
    found = plan(model, hw, gpus=gpus, top=3)
    assert {p.estimate.stack for p in found.plans} == {"hf-trainer"}
    for p in found.plans:
        e = p.estimate
        export(None, load_model(model), load_hardware(hw), e.plan, e.setup, e.grad_accum, e.world_size, e.stack)
    assert plan(model, hw, gpus=gpus, top=1, stack="megatron-core").plans  # costed where asked


def test_auto_keeps_megatron_core_for_what_its_flags_write():
    """DeepSeek's MLA has Megatron-LM flags (megatron_shape.model_shape), Llama has nothing to miss."""
    from advisor import launch_config
    from advisor.export import unwritable
    from advisor.stack import load_stack

    core = load_stack("megatron-core")
    assert unwritable(core, load_model("deepseek-v2-lite")) == [] == unwritable(core, load_model("llama3-8b"))
    bridge_only = core.model_copy(update={"launch": ["megatron-bridge"]})  # Bridge's overrides have no MLA fields
    assert unwritable(bridge_only, load_model("deepseek-v2-lite")) == ["multi-head latent attention"]
    # GPT-OSS: Megatron-LM's --softmax-type learnable, --quick-geglu, --glu-linear-offset, --activation-func-clamp-value
    # and its default add_bias_linear write it (megatron_shape.mlp_flags), Bridge's overrides the same fields
    # (activation_func "quick_gelu": megatron-bridge 0.6.2 utils/activation_map.py)
    assert unwritable(core, load_model("gpt-oss-120b")) == [] == unwritable(bridge_only, load_model("gpt-oss-120b"))
    text = launch_config("gpt-oss-120b", "dgx-h100", gpus=16, ep=8, stack="megatron-core", format="megatron-bridge").text
    assert "activation_func: quick_gelu" in text and "softmax_type: learnable" in text


def test_any_ranks_only_stacks_whose_formats_write_the_model():
    """--stack any leaves out the Megatron stacks for OLMo 2 (full-width q/k norms) and torchtitan for a model its
    registries have no config function for (advisor.export.unwritable)."""
    from advisor.export import unwritable
    from advisor.search import plan

    stacks = {p.estimate.stack for p in plan("olmo-2-7b", "dgx-h100", gpus=8, top=200, stack="any").plans}
    assert stacks and not stacks & {"megatron-core", "megatron-bridge-perf"}
    assert unwritable(load_stack("torchtitan"), load_model("deepseek-v2-lite"))
    assert unwritable(load_stack("torchtitan"), load_model("llama3-8b")) == []


def test_torchtitan_export_of_a_stack_given_by_path(tmp_path):
    """A profile file over torchtitan (base: torchtitan) exports: the exporter took the stack's name back to
    load_stack, which knows only the shipped ones ('unknown stack profile s1')."""
    from advisor.export import export as export_
    from advisor.stack import load_stack

    path = tmp_path / "s1.yaml"
    path.write_text("name: s1\ndescription: torchtitan as shipped, under another name\nbase: torchtitan\n")
    model, hw, plan, setup, ga, world = inputs(*TITAN["fsdp-sac"])
    out = export_("torchtitan", model, hw, plan, setup.model_copy(update={"stack": "s1"}), ga, world, load_stack(path))
    assert out.stack == "s1" and "--parallelism.data-parallel-shard-degree 8" in out.text


def test_a_refusal_names_a_format_the_stack_launches():
    """accelerate's refusal of TP says "use --format megatron", which hf-trainer does not launch: the stack's own format
    that writes the plan is named instead (its DeepSpeed JSON's AutoTP), or the stack that launches the other."""
    case = ("llama3-8b", "dgx-h100", 8, dict(dp=2, tp=4), dict(micro_batch=1, seq_len=4096))
    with pytest.raises(ExportError) as err:
        export("accelerate", *inputs(*case), "hf-trainer")
    # with the stack named: without it, --format deepspeed picks the deepspeed stack, which runs no TP (a review)
    assert str(err.value).endswith("use --stack hf-trainer --format deepspeed") and "megatron" not in str(err.value).split(":")[-1]
    export("deepspeed", *inputs(*case), "hf-trainer")  # which does write it


@pytest.mark.parametrize("recompute,k,target", [
    ("block", 16, "first-16"),  # llm-foundry act_ckpt.py parse_ele_str: first-n -> blocks 0..n-1
    ("every-k", 4, [3, 7, 11, 15, 19, 23, 27, 31]),  # block ids: every 4th counted from 1 (advisor.recompute every-k)
])
def test_foundry_writes_partial_checkpointing_as_mpts_target(recompute, k, target):
    """block and every-k were written activation_checkpointing: false (no note), training another plan: MPT's
    activation_checkpointing_target selects the blocks (modeling_mpt.py activation_checkpointing_fn)."""
    case = ("mpt-7b", "dgx-h100", 16, dict(dp=16, zero=3),
            dict(micro_batch=2, global_batch=64, seq_len=8192, recompute=recompute, recompute_layers=k))
    cfg = yaml.safe_load(export("llm-foundry", *inputs(*case), "llm-foundry").text)
    assert cfg["fsdp_config"]["activation_checkpointing"] is True
    assert cfg["model"]["activation_checkpointing_target"] == {"MPTBlock": target}
    with pytest.raises(ExportError, match="MPT only"):
        export("llm-foundry", *inputs("llama2-7b", *case[1:]), "llm-foundry")


def test_torchrun_says_the_model_parallel_degrees_are_the_scripts():
    """A torchrun line starts processes only: a TP plan exported as one would train data-parallel replicas unless the
    script builds the TP, which the file now says (a comment and the notes)."""
    out = export("torchrun", *inputs("llama3-8b", "dgx-h100", 8, dict(dp=2, tp=4), dict(micro_batch=1, seq_len=4096)),
                 "hf-trainer")
    assert len(out.notes) == 1 and out.notes[0].startswith("the plan's tp=4 is not set by torchrun")
    assert f"# note: {out.notes[0]}" in out.text.splitlines()
    plain = export("torchrun", *inputs("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=0), dict(micro_batch=1)), "hf-trainer")
    assert plain.notes == () and "note" not in plain.text
    # a sharded plan likewise: torchrun's processes would train DDP replicas unless the script wraps the model
    sharded = export("torchrun", *inputs("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=2), dict(micro_batch=1)), "hf-trainer")
    assert sharded.notes == ("the plan's FSDP SHARD_GRAD_OP (ZeRO-2) is not set by torchrun either: train.py wraps the "
                             "model in FSDP, a unit per decoder layer as it was costed",)
    zero1 = export("torchrun", *inputs("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=1), dict(micro_batch=1)), "hf-trainer")
    assert zero1.notes == ("the plan's ZeRO-1 is not set by torchrun either: train.py shards the optimizer states "
                           "(DeepSpeed's stage 1, torch's ZeroRedundancyOptimizer)",)


def test_an_export_its_stack_cannot_cost_says_so_in_the_file():
    """llm-foundry's profile has no SwiGLU tables: estimate refuses Llama 3 8B there, and export wrote the YAML as if it
    were a costed plan; now the file and its notes say it is the layout alone."""
    from advisor.api import launch_config

    out = launch_config("llama3-8b", "dgx-h100", gpus=8, dp=8, zero=3, stack="llm-foundry")
    assert out.notes[-1].startswith("not a costed plan: stack llm-foundry's profile describes gelu MLPs only "
                                    "(kernels.elementwise), not a swiglu MLP")
    assert f"# note: {out.notes[-1]}" in out.text


def test_a_format_two_dated_profiles_write_picks_the_newer():
    """torchtitan-0.1 and torchtitan-0.2 both write torchtitan's TOML and are both superseded: the tie went to 0.1 by
    name, costing the file's plan in the older torchtitan."""
    from advisor.export import stacks_launching

    assert stacks_launching("torchtitan-toml")[0] == "torchtitan-0.2"


def test_an_fsdp_costed_zero3_exported_as_deepspeed_says_it_runs_otherwise():
    """hf-trainer launches DeepSpeed too, but costs ZeRO-3 as accelerate's FSDP does (a layer a unit, prefetched):
    the DeepSpeed JSON it writes starts stage 3's per-sub-module gathers instead, which --stack deepspeed costs."""
    from advisor import api

    kw = dict(gpus=8, zero=3, format="deepspeed")
    hf = api.launch_config("llama3-8b", "dgx-h100", stack="hf-trainer", **kw)
    assert any(n.startswith("costed as hf-trainer runs ZeRO-3") and n.endswith("--stack deepspeed costs it so")
               for n in hf.notes)
    ds = api.launch_config("llama3-8b", "dgx-h100", stack="deepspeed", **kw)
    assert not any("costed as" in n for n in ds.notes)


@pytest.mark.parametrize("fmt,name", [("torchtitan", "qwen3-30b-a3b"), ("torchtitan-toml", "qwen3-30b-a3b"),
                                      ("torchtitan", "gpt-oss-120b")])
def test_a_config_json_of_a_catalogue_model_exports_with_its_config_function(fmt, name, tmp_path):
    """The Hugging Face config.json of Qwen/Qwen3-30B-A3B (the catalogue's own, advisor.model.hub_configs), saved in
    its model folder, is named Qwen3-30B-A3B: torchtitan's exporters looked its config function up by that name and
    refused it ("torchtitan 0.3.0 has no config function for Qwen3-30B-A3B"). A model of the catalogue's shape,
    every field equal, is written as the catalogue's, with a note; the file is the catalogue model's but for the
    header's name and that note."""
    from advisor.model.hub_configs import HUB_CONFIGS

    folder = tmp_path / name.upper()
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))
    args = ["export", "--format", fmt, "--hw", "dgx-h100", "--gpus", "16", "--dp", "16", "--zero", "3", "--ep", "8",
            "--seq", "4096", "--out", "-"]
    mine = CliRunner().invoke(export_command, ["--model", str(folder)] + args[1:])
    ref = CliRunner().invoke(export_command, ["--model", name] + args[1:])
    assert mine.exit_code == 0 and ref.exit_code == 0, mine.output
    note = (f"# note: {name.upper()} has the catalogue's {name} shape (every field of its config): written with {name}'s "
            "config")
    lines = mine.output.splitlines()  # the file, then the notes echoed (CliRunner mixes the streams)
    assert note in lines and note.removeprefix("# ") in lines
    assert [line.replace(name.upper(), name) for line in lines if not line.endswith(f"written with {name}'s config")
            ] == ref.output.splitlines()
