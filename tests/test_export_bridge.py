"""advisor export --format megatron-bridge: a YAML of ConfigContainer overrides, read back onto a config and checked
field by field against the plan.

megatron-bridge 0.6.2 needs Python >= 3.12 (0.4.0 on) and imports Transformer Engine from its package __init__
(megatron/bridge/__init__.py -> models -> peft/lora_layers.py ``import transformer_engine.pytorch``), so its
ConfigContainer and recipes do not import on a CPU machine. Two tests, then:

- always: the YAML (yaml.safe_load) is applied key by key, refusing any key the target lacks, onto megatron-core's own
  TransformerConfig (the provider's base), DistributedDataParallelConfig and OptimizerConfig, and onto mirrors of
  the Bridge-only fields checked in 0.6.2's source: models/gpt_provider.py:139-159 (share_embeddings_and_output_weights,
  position_embedding_type, seq_length), training/config.py:222-231 (GPTDatasetConfig.seq_length), megatron-core
  0.19.2 training/config/training_config.py:11-15 (micro/global_batch_size), :486 (CheckpointConfig.ckpt_format),
  common_config.py:92 (DistributedInitConfig.use_megatron_fsdp), training/mixed_precision.py (recipe names);
- where megatron-bridge's omegaconf_utils loads (ADVISOR_MEGATRON_BRIDGE=1 with megatron-bridge 0.6.2 installed
  --no-deps --ignore-requires-python (PyPI serves its wheel to Python 3.12: `pip download --python-version 3.12
  --only-binary=:all: megatron-bridge==0.6.2`), megatron-core 0.19.2 (likewise), omegaconf, hydra-core, triton, which
  megatron-core's MoE imports; 42 cases passed so on 2026-12-01): Bridge's own
  process_config_with_overrides(cfg, config_filepath=...) merges the file, and parse_hydra_overrides (struct mode:
  an unknown key is an error) takes every key as a ``key=value`` override. The module is loaded without running
  megatron/bridge/__init__.py (which needs Transformer Engine).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import types
import typing

import pytest
import yaml

from advisor.export import ExportError, export
from advisor.hardware import load_hardware
from advisor.layout import Plan, resolve_grad_accum
from advisor.model import load_model
from advisor.training import TrainingSetup

tc = pytest.importorskip("megatron.core.transformer.transformer_config")
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.optimizer import OptimizerConfig  # noqa: E402
from test_export import inputs as export_case_inputs  # noqa: E402

CASES = {
    "tp-sp-ddp": ("llama2-7b", "dgx-h100", 8, dict(dp=2, tp=4, sp=True), dict(micro_batch=1, global_batch=16)),
    "3d-interleaved-zero1-full": ("llama3-70b", "dgx-h100", 64,
                                  dict(dp=2, tp=8, pp=4, zero=1, sp=True, schedule="interleaved", virtual_stages=2),
                                  dict(micro_batch=1, global_batch=256, seq_len=8192, recompute="full")),
    "uneven-first-last-block": ("llama3-405b", "dgx-h100", 128, dict(dp=1, tp=8, pp=16, sp=True),
                                dict(micro_batch=1, global_batch=32, seq_len=8192, recompute="block", recompute_layers=2)),
    "edges-interleaved-cp": ("llama3-405b", "dgx-h100", 512,
                             dict(dp=2, tp=8, pp=16, cp=2, zero=1, sp=True, schedule="interleaved", virtual_stages=4,
                                  pp_split="edges"), dict(micro_batch=1, global_batch=64, seq_len=8192, recompute="full")),
    "cp-ulysses-selective-fp16": ("llama3-8b", "dgx-h100", 16, dict(dp=2, tp=2, cp=4, sp=True, cp_comm="ulysses"),
                                  dict(micro_batch=1, global_batch=8, seq_len=32768, recompute="selective",
                                       precision="fp16-mixed")),
    "zero1-fp8-tensorwise": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=1),
                             dict(micro_batch=1, grad_accum=2, precision="fp8-tensorwise")),
    "zero3-fsdp": ("llama2-7b", "dgx-h100", 8, dict(dp=8, zero=3), dict(micro_batch=1, grad_accum=4)),
    # Mistral-7B's 4,096-key window on every layer: window_size (4095, 0)
    "sliding-window": ("mistral-7b", "dgx-h100", 8, dict(dp=8, zero=1), dict(micro_batch=1, global_batch=64, seq_len=8192)),
    # 40 layers on 16 stages, 1F1B: a layout of 3 x 8 and 2 x 8 (tests/test_export.py's case)
    "uneven-1f1b-layout": ("llama2-13b", "dgx-h100", 32, dict(dp=2, pp=16, zero=1),
                           dict(micro_batch=1, global_batch=64, seq_len=4096)),
    # megatron-core's HybridDeviceOptimizer: optimizer.optimizer_cpu_offload under the distributed optimizer
    "optimizer-offload": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=1, offload="optimizer-cpu"),
                          dict(micro_batch=1, global_batch=64, seq_len=8192, recompute="selective")),
    "cpu-offload": ("llama3-8b", "dgx-h100", 8, dict(dp=8, zero=1),
                    dict(micro_batch=1, global_batch=64, seq_len=8192, recompute="offload", recompute_layers=16)),
    "moe-ep": ("mixtral-8x7b", "dgx-h100", 32, dict(dp=4, tp=2, pp=4, ep=4, sp=True, zero=1),
               dict(micro_batch=1, global_batch=64, seq_len=4096, recompute="full")),
    # 32 layers on 3 x 2 interleaved chunks: pipeline_model_parallel_layout (as Bridge's DeepSeek-V3 recipes write it)
    # LoRA r 16 alpha 32 on the fused qkv under TP and PP (Megatron-Bridge's Llama 3 70B LoRA recipes' adapters)
    "lora-tp-pp": ("llama3-70b", "dgx-h100", 8, dict(dp=1, tp=2, pp=4, sp=True, zero=1),
                   dict(micro_batch=1, global_batch=32, seq_len=4096,
                        finetune=dict(method="lora", lora_rank=16, lora_alpha=32.0, targets="qkv"))),
    "interleaved-layout-flex-batch": ("mixtral-8x7b", "dgx-h100", 48,
                                      dict(dp=8, tp=2, pp=3, ep=8, sp=True, zero=1, schedule="interleaved",
                                           virtual_stages=2),
                                      dict(micro_batch=1, global_batch=48, seq_len=4096, moe_dispatcher="flex",
                                           moe_overlap="batch")),
    # SGD with momentum, costed with one state (advisor.optimizer): OptimizerConfig.optimizer "sgd" (default "adam")
    "moe-ep-sgd": ("qwen3-30b-a3b", "dgx-h100", 8, dict(dp=8, ep=8, zero=1),
                   dict(micro_batch=1, global_batch=64, seq_len=4096, optimizer="sgd")),
    # GPT-OSS: learned sinks, biases on every linear, the experts' clamped quick-GELU GLU, YaRN, 128-key windows
    "gpt-oss": ("gpt-oss-120b", "dgx-h100", 16, dict(dp=16, ep=8, zero=1), dict(micro_batch=1, global_batch=64, seq_len=4096)),
}


def inputs(case: str):
    return export_case_inputs(case, CASES)


# -- the target: megatron-core's own classes, and mirrors of the Bridge-only fields (module docstring) -----------
@dataclasses.dataclass
class Provider(tc.TransformerConfig):  # megatron/bridge/models/gpt_provider.py GPTModelProvider's own fields
    share_embeddings_and_output_weights: bool = True
    position_embedding_type: str = "learned_absolute"
    seq_length: int = 1024


@dataclasses.dataclass
class Train:
    micro_batch_size: typing.Optional[int] = 2  # recipes/common.py _pretrain_common
    global_batch_size: typing.Optional[int] = 32


@dataclasses.dataclass
class Dataset:
    seq_length: int = 4096


@dataclasses.dataclass
class Dist:
    use_megatron_fsdp: bool = False


@dataclasses.dataclass
class Checkpoint:
    ckpt_format: str = "torch_dist"


@dataclasses.dataclass
class Container:  # training/config.py ConfigContainer: the sections the export writes
    model: Provider
    train: Train
    dataset: Dataset
    ddp: DistributedDataParallelConfig
    optimizer: OptimizerConfig
    dist: Dist
    checkpoint: Checkpoint
    mixed_precision: typing.Optional[str] = "bf16_mixed"
    peft: typing.Optional[dict] = None  # Optional[PEFT], instantiated from the overrides' _target_ (omegaconf_utils.py)


@dataclasses.dataclass
class LoRA:  # megatron-bridge 0.6.2 peft/lora.py:101-108 LoRA's fields (DoRA's, peft/dora.py:59-66, are a subset)
    target_modules: list = dataclasses.field(default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1",
                                                                      "linear_fc2"])
    dim: int = 32
    alpha: int = 32
    dropout: float = 0.0
    dropout_position: str = "pre"
    sequence_parallel_input_regather: bool = False


# training/mixed_precision.py MIXED_PRECISION_RECIPES (the registered function names)
BRIDGE_PRECISION = {"bf16_mixed", "fp16_mixed", "bf16_with_fp8_delayed_scaling_mixed", "bf16_with_mxfp8_mixed",
                    "bf16_with_fp8_current_scaling_mixed", "bf16_with_fp8_subchannel_scaling_mixed",
                    "bf16_with_nvfp4_mixed"}


def container() -> Container:
    """_pretrain_common's defaults where the export overwrites them (DDP: distributed optimizer and overlaps on)."""
    ddp = DistributedDataParallelConfig(overlap_grad_reduce=True, overlap_param_gather=True,
                                        use_distributed_optimizer=True)
    return Container(Provider(num_layers=2, hidden_size=64, num_attention_heads=4), Train(), Dataset(), ddp,
                     OptimizerConfig(), Dist(), Checkpoint())


def strict_apply(obj, overrides: dict, path: str = "") -> None:
    for key, value in overrides.items():
        assert hasattr(obj, key), f"{path}{key} is not a field of {type(obj).__name__}"
        if dataclasses.is_dataclass(getattr(obj, key)) and isinstance(value, dict):
            strict_apply(getattr(obj, key), value, f"{path}{key}.")
        else:
            setattr(obj, key, value)


def assert_matches(cfg: Container, case: str) -> None:
    model, hw, plan, setup, ga, world = inputs(case)
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (plan.tp, plan.pp, plan.cp)
    assert m.sequence_parallel == (plan.sp and plan.tp > 1)
    assert m.virtual_pipeline_model_parallel_size == (plan.virtual_stages if plan.schedule == "interleaved" else None)
    assert m.seq_length == cfg.dataset.seq_length == setup.seq_len
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (model.n_layers, model.d_model, model.n_heads)
    assert cfg.train.micro_batch_size == setup.micro_batch
    assert cfg.train.global_batch_size == setup.micro_batch * ga * plan.dp
    assert cfg.ddp.use_distributed_optimizer == cfg.optimizer.use_distributed_optimizer == (plan.zero >= 1)
    assert cfg.ddp.use_megatron_fsdp == cfg.dist.use_megatron_fsdp == (plan.zero >= 2)
    # --optimizer-cpu-offload needs the precision-aware optimizer (megatron/training/arguments.py), every state offloaded
    offloaded = plan.offload.value == "optimizer-cpu"
    assert (cfg.optimizer.optimizer_cpu_offload, cfg.optimizer.use_precision_aware_optimizer) == (offloaded, offloaded)
    assert cfg.optimizer.optimizer_offload_fraction == (1.0 if offloaded else 0.0)
    sgd = getattr(setup.optimizer, "value", None) == "sgd"
    assert cfg.optimizer.optimizer == ("sgd" if sgd else "adam")  # the step costed
    if plan.zero == 3:
        assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params" and cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    assert cfg.ddp.overlap_grad_reduce == (plan.overlap_grad_reduce and plan.dp > 1)
    r = setup.recompute.value
    assert m.recompute_granularity == {"none": None, "full": "full", "block": "full", "selective": "selective",
                                       "offload": None}[r]
    # Transformer Engine's CPU offload of the first k layers (the GB200/GB300 Llama 3 70B perf recipes set it)
    assert (m.cpu_offloading, m.cpu_offloading_num_layers) == ((True, setup.recompute_layers) if r == "offload" else (False, 0))
    assert m.recompute_method == {"full": "uniform", "block": "block"}.get(r)
    assert m.recompute_num_layers == (setup.recompute_layers if r in ("full", "block") else None)
    # the YAML's list, as OmegaConf gives it: Mistral-7B's 4,096 keys, GPT-OSS's 128 (on every other layer)
    assert m.window_size == {"mistral-7b": [4095, 0], "gpt-oss-120b": [127, 0]}.get(model.name)
    # GPT-OSS as its own provider sets it (megatron-bridge 0.6.2 models/gpt_oss/gpt_oss_bridge.py: yarn, quick_gelu,
    # glu_linear_offset 1, activation_func_clamp_value 7, softmax_type learnable, add_bias_linear)
    oss = model.name == "gpt-oss-120b"
    assert (m.softmax_type, m.glu_linear_offset, m.activation_func_clamp_value) == (
        ("learnable", 1.0, 7.0) if oss else ("vanilla", 0.0, None))
    assert m.add_bias_linear == oss and m.position_embedding_type == ("yarn" if oss else "rope")
    # the YAML's name, or the callable Bridge's process_config_with_overrides makes of it (utils/activation_map.py)
    act = getattr(m.activation_func, "__name__", m.activation_func)
    assert act == ("quick_gelu" if oss else "silu" if model.mlp.value == "swiglu" else "gelu")
    assert m.gated_linear_unit == (oss or model.mlp.value == "swiglu")
    if plan.cp > 1:
        assert m.cp_comm_type == {"ring": "p2p", "all-gather": "all_gather", "ulysses": "a2a"}[plan.cp_comm.value]
    chunks = plan.pp * plan.virtual_stages
    if plan.pp > 1 and plan.pp_split.value == "edges":
        assert m.account_for_embedding_in_pipeline_split and m.account_for_loss_in_pipeline_split
    elif plan.schedule == "interleaved" and model.n_layers % chunks:  # a layout: ceil(L / chunks) each, the rest last
        layout, per = m.pipeline_model_parallel_layout, -(-model.n_layers // chunks)
        assert len(layout) == chunks and layout[0][0] == "embedding" and layout[-1][-1] == "loss"
        assert [c.count("decoder") for c in layout] == [per] * (chunks - 1) + [model.n_layers - per * (chunks - 1)]
        assert m.virtual_pipeline_model_parallel_size == plan.virtual_stages
    elif plan.pp > 1 and model.n_layers % plan.pp and m.pipeline_model_parallel_layout:  # 1F1B: ceil(L / pp) at most
        counts = [c.count("decoder") for c in m.pipeline_model_parallel_layout]
        assert sum(counts) == model.n_layers and max(counts) == -(-model.n_layers // plan.pp) and len(counts) == plan.pp
        assert m.virtual_pipeline_model_parallel_size is None
    elif plan.pp > 1 and model.n_layers % plan.pp:
        first, last = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage
        assert first + last + (model.n_layers // plan.pp + 1) * (plan.pp - 2) == model.n_layers
    if setup.finetune.adapters:  # Bridge's LoRA, built from _target_ with fields LoRA has
        peft = dict(cfg.peft)
        assert peft.pop("_target_") == "megatron.bridge.peft.lora.LoRA"
        lora = LoRA(**peft)
        assert (lora.dim, lora.alpha) == (setup.finetune.lora_rank, setup.finetune.lora_alpha)
        assert lora.target_modules == ["linear_qkv"]
    else:
        assert cfg.peft is None
    if model.experts is not None:
        assert (m.num_moe_experts, m.expert_model_parallel_size, m.moe_router_topk) == (
            model.experts.n_experts, plan.ep, model.experts.experts_per_token)
        assert m.expert_tensor_parallel_size == (plan.tp if plan.etp is None else plan.etp)
    assert cfg.mixed_precision in BRIDGE_PRECISION
    want = {"bf16-mixed": "bf16_mixed", "fp16-mixed": "fp16_mixed", "fp8-tensorwise": "bf16_with_fp8_current_scaling_mixed"}
    assert cfg.mixed_precision == want[setup.precision.value]


@pytest.mark.parametrize("case", CASES)
def test_export_loads_onto_the_config_fields(case):
    out = export("megatron-bridge", *inputs(case), stack="megatron-core")
    assert out.filename.endswith(".yaml") and all(f"# note: {n}" in out.text for n in out.notes)
    cfg = container()
    strict_apply(cfg, yaml.safe_load(out.text))
    assert_matches(cfg, case)


def _bridge_omegaconf_utils():
    """megatron/bridge/training/utils/omegaconf_utils.py, loaded without megatron/bridge/__init__.py."""
    if not os.environ.get("ADVISOR_MEGATRON_BRIDGE"):
        pytest.skip("set ADVISOR_MEGATRON_BRIDGE=1 with megatron-bridge 0.6.2 installed (module docstring)")
    import typing_extensions

    typing.override = getattr(typing, "override", typing_extensions.override)  # megatron-core 0.19.2 wants 3.12
    root = os.path.join(os.path.dirname(os.path.dirname(importlib.util.find_spec("megatron.core").origin)), "bridge")
    for sub in ("", ".training", ".training.utils", ".utils"):
        if "megatron.bridge" + sub not in sys.modules:
            pkg = types.ModuleType("megatron.bridge" + sub)
            pkg.__path__ = [os.path.join(root, *sub.split(".")[1:])]
            sys.modules[pkg.__name__] = pkg
    from megatron.bridge.training.utils import omegaconf_utils

    return omegaconf_utils


def _dotlist(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _dotlist(value, f"{prefix}{key}.")
        else:
            # one line, however long (a pipeline layout's nested list): Hydra's override lexer takes no newline
            text = "null" if value is None else yaml.safe_dump(value, default_flow_style=True, width=float("inf")
                                                               ).strip().removesuffix("...").strip()
            # a section the base config leaves None (peft: Optional[PEFT]) is added, Hydra's '+', not overridden
            out.append(f"{'+' if prefix.startswith('peft.') else ''}{prefix}{key}={text}")
    return out


@pytest.mark.parametrize("case", CASES)
def test_bridge_merges_the_export(case, tmp_path, caplog):
    ou = _bridge_omegaconf_utils()
    text = export("megatron-bridge", *inputs(case), stack="megatron-core").text
    path = tmp_path / "bridge_overrides.yaml"
    path.write_text(text)
    cfg = ou.process_config_with_overrides(container(), config_filepath=str(path))
    assert "not found in config object" not in caplog.text
    assert_matches(cfg, case)
    base, excluded = ou.create_omegaconf_dict_config(container())
    merged = ou.parse_hydra_overrides(base, _dotlist(yaml.safe_load(text)))  # struct mode: unknown keys fail
    cfg = container()
    ou.apply_overrides(cfg, ou.OmegaConf.to_container(merged, resolve=True), excluded)
    assert_matches(cfg, case)


@pytest.mark.parametrize("case,plan_kw,setup_kw,message", [
    ("zero1-fp8-tensorwise", {}, dict(precision="fp8-rowwise"), "no matching mixed-precision recipe"),
    # megatron-core's NVFP4 keeps a BF16 layer at each end (advisor.precision); bf16_with_nvfp4_mixed keeps none
    ("zero1-fp8-tensorwise", {}, dict(precision="nvfp4"), "runs every layer in NVFP4"),
    ("tp-sp-ddp", {}, dict(recompute="every-k", recompute_layers=2), "every-k checkpointing"),
    ("zero3-fsdp", dict(offload="params-cpu"), {}, "megatron-core does not offload params-cpu"),
    ("zero1-fp8-tensorwise", {}, dict(precision="fp32"), "bf16 or fp16 mixed precision"),
    # 32 layers on 3 x 8 chunks of ceil(32 / 24) = 2: the last chunks would hold none
    ("tp-sp-ddp", dict(pp=3, tp=1, dp=2, sp=False, schedule="interleaved", virtual_stages=8), {}, "a layer in every chunk"),
])
def test_refuses_in_one_line(case, plan_kw, setup_kw, message):
    model, hw, world, p, s = CASES[case]
    plan, setup = Plan(**{**p, **plan_kw}), TrainingSetup(**{**s, **setup_kw})
    grad_accum, err = resolve_grad_accum(setup, plan)
    assert err is None
    with pytest.raises(ExportError) as info:
        export("megatron-bridge", load_model(model), load_hardware(hw), plan, setup, grad_accum,
               plan.dp * plan.tp * plan.pp * plan.cp, stack="megatron-core")
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("stack, precision, hw, says, silent", [
    # megatron-core: fp32 gradients as every Bridge recipe, BF16 weights where the recipe gathers FP8 ones
    ("megatron-core", "fp8-tensorwise", "dgx-h100",
     ["keeps the first and the last layer in BF16", "estimate (megatron-core) runs every layer in FP8",
      "weights in FP8 (fp8_param_gather); the estimate (megatron-core) in BF16"], ["grad_reduce_in_fp32"]),
    # megatron-bridge-perf (the perf recipes): FP8 weights as the recipe, but bf16 gradient reduction
    ("megatron-bridge-perf", "fp8-tensorwise", "dgx-h100",
     ["keeps the first and the last layer in BF16", "grad_reduce_in_fp32"], ["fp8_param_gather"]),
    ("megatron-bridge-perf", "nvfp4", "gb200-nvl72", ["grad_reduce_in_fp32"], ["first_last_layers_bf16", "param_gather"]),
    ("megatron-core", "bf16-mixed", "dgx-h100", [], ["grad_reduce_in_fp32"]),
])
def test_notes_say_where_the_recipe_runs_otherwise_than_the_stack_costed(stack, precision, hw, says, silent):
    """Megatron-Bridge 0.6.2's mixed-precision recipes (training/mixed_precision.py): current scaling keeps one BF16
    layer at each end, every FP8/FP4 recipe gathers quantised weights, every recipe reduces gradients in fp32; the
    YAML cannot override them (the precision setup writes its fields over the model's and DDP's), so the file says
    where the run will differ from the stack the plan was costed in, and nothing else."""
    plan, setup = Plan(dp=8, zero=1), TrainingSetup(micro_batch=1, grad_accum=2, precision=precision)
    out = export("megatron-bridge", load_model("llama3-8b"), load_hardware(hw), plan, setup, 2, 8, stack=stack)
    for text in says:
        assert any(text in n for n in out.notes), (text, out.notes)
    for text in silent:
        assert not any(text in n for n in out.notes), (text, out.notes)
    assert all(f"# note: {n}" in out.text for n in out.notes)
