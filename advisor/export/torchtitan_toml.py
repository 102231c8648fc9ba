"""torchtitan 0.2 (the releases from mid-2024 to 0.2.2): a TOML job file for ``torchtitan.train --job.config_file``.

Before 0.3.0 a torchtitan run is a job file whose sections are JobConfig's dataclasses (0.2.2 config/job_config.py),
read by config/manager.py (ConfigManager.parse_args: TOML under CLI overrides, through tyro). The plan's degrees,
batch and dtypes are the keys 0.3.0's overrides also have (advisor.export.torchtitan SHARED_KEYS); what is 0.2's own:
- the model by registry name and flavor ([model] name, flavor: models/<name>/__init__.py, FLAVORS);
- a low-precision recipe as a model converter ([model] converters, components/quantization): torchao's Float8Linear
  with its recipe name (tensorwise, rowwise, rowwise_with_gw_hp) or MXLinear (mxfp8_cublas), the output layer filtered
  out as advisor costs it (advisor.precision: the LM head stays in BF16; MXLinear filters "output" by default, Float8Linear
  does not), and FSDP's all-gather as the stack costs it (engine ``fsdp_float8_gather``): in BF16 by default
  (enable_fsdp_float8_all_gather off, job_config.py:732), or under tensorwise in float8, which 0.2.2 runs only without a
  recipe_name (float8.py:64-67 asserts the two apart; recipe_name None is Float8LinearConfig(), tensorwise), with
  precompute_float8_dynamic_scale_for_fsdp where the amaxes are precomputed (advisor.parallel.fp8_gather);
- activation checkpointing as [activation_checkpoint] mode with selective_ac_option "op" (per-op SAC) or k (every k-th
  block: advisor's every-k);
- sequence parallelism always under TP (apply_tp has no switch) and async TP as parallelism.enable_async_tensor_parallel,
  which maybe_enable_async_tp refuses without compile.enable and "model" in compile.components (tensor_parallel.py).
tests/test_export_stacks.py parses every case with 0.2.2's own ConfigManager.

Refused in one line: models with no flavor here, fp16, NVFP4 and the blockwise / delayed FP8 recipes (no 0.2 converter),
a recipe on a mixture-of-experts model (0.2's grouped-GEMM converters are torchao prototypes advisor does not cost), TP
without sequence parallelism, and what the 0.3.0 format also refuses (advisor.export.torchtitan refuse_common).
"""

from __future__ import annotations

import json
from typing import Any, Optional

from advisor.export.common import Exported, ExportError, Run, catalogued, check, header
from advisor.export.torchrun import torchrun_argv
from advisor.export.torchtitan import SHARED_KEYS, _async_tp, refuse_common, shared_notes
from advisor.parallel.fp8_gather import GATHER_RECIPES
from advisor.stack import Stack
from advisor.training import compile_parts

# advisor model -> ([model] name, flavor) of torchtitan 0.2.2's registries whose shapes are the catalogue's
# (models/{llama3,qwen3,gpt_oss,deepseek_v3,llama4}/__init__.py; tests/test_export_stacks.py compares each shape).
# Llama 4's _irope flavors are the Hugging Face models': chunked attention (fixed_attn_block_size 8192, flex
# block_causal) and a NoPE global layer every 4th (every_n_layers_nope); built on the meta device, 17bx16e_irope has
# 107,769,861,120 parameters and 17bx128e_irope 400,711,848,960, the catalogue's llama4-scout and llama4-maverick
FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B"),
           "qwen3-8b": ("qwen3", "8B"), "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "gpt-oss-120b": ("gpt_oss", "120b"),
           "deepseek-v3": ("deepseek_v3", "671B"), "llama4-scout": ("llama4", "17bx16e_irope"),
           "llama4-maverick": ("llama4", "17bx128e_irope")}
# advisor recipe -> (converter, its section's key values): components/quantization/float8.py and mx.py register them
FLOAT8 = "quantize.linear.float8"
MX = "quantize.linear.mx"
CONVERTERS = {"fp8-tensorwise": (FLOAT8, {"recipe_name": "tensorwise", "filter_fqns": ["output"]}),
              "fp8-rowwise": (FLOAT8, {"recipe_name": "rowwise", "filter_fqns": ["output"]}),
              "fp8-rowwise-gw-hp": (FLOAT8, {"recipe_name": "rowwise_with_gw_hp", "filter_fqns": ["output"]}),
              "mxfp8": (MX, {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]})}
MODES = ("none", "full", "selective", "every-k")
# run_train.sh of those releases exports it (the torchtitan-0.2 profile's allocator, from torchtitan's)
ALLOC = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def _refuse(r: Run) -> None:
    if r.model.name not in FLAVORS:
        raise ExportError(f"torchtitan 0.2 has no flavor for {r.model.name}: its registries cover {', '.join(FLAVORS)}")
    refuse_common(r, "0.2", MODES)
    p = r.setup.precision.value
    if r.setup.precision.recipe is not None and p not in CONVERTERS:
        raise ExportError(f"--precision {p}: torchtitan 0.2 has no converter for it (Float8Linear tensorwise, rowwise, "
                          "rowwise_with_gw_hp; MXLinear mxfp8): use one of " + ", ".join(CONVERTERS))
    if r.setup.precision.recipe is not None and r.model.routed:
        raise ExportError(f"--precision {p} on {r.model.name}: torchtitan 0.2 runs a mixture of experts' grouped GEMMs "
                          "low only through torchao prototypes (quantize.grouped_mm), which advisor does not cost: "
                          "use --precision bf16-mixed")
    if r.plan.ep > 1 and (r.plan.etp or r.plan.tp) not in (1, r.plan.tp):
        raise ExportError(f"etp={r.plan.etp}: torchtitan 0.2 runs the experts at ETP 1 or TP's degree (parallel_dims.py)")
    if r.plan.tp > 1 and not r.plan.sp:
        raise ExportError("torchtitan 0.2 shards the sequence under every TP plan (apply_tp): use --sp")


def sections(r: Run, fp8_gather: str = "off") -> dict[str, dict[str, Any]]:
    """The job file's sections and keys for a run (None values are not written); ``fp8_gather``: the stack engine's
    ``fsdp_float8_gather``."""
    _refuse(r)
    name, flavor = FLAVORS[r.model.name]
    out: dict[str, dict[str, Any]] = {"model": {"name": name, "flavor": flavor}}
    recipe = CONVERTERS.get(r.setup.precision.value)
    if recipe is not None:
        out["model"]["converters"] = [recipe[0]]
        out[recipe[0]] = dict(recipe[1])
        if fp8_gather != "off" and r.setup.precision.value in GATHER_RECIPES:  # tensorwise as Float8LinearConfig()
            out[recipe[0]].update(recipe_name=None, enable_fsdp_float8_all_gather=True,
                                  precompute_float8_dynamic_scale_for_fsdp=fp8_gather == "precomputed")
    for key, value_of in SHARED_KEYS:
        section, field = key.rsplit(".", 1)
        out.setdefault(section, {})[field] = value_of(r)
    if r.plan.ep > 1:  # ETP: 1 or TP's degree (parallel_dims.py asserts it), the experts' own TP
        out["parallelism"]["expert_tensor_parallel_degree"] = r.plan.etp or r.plan.tp
    out["parallelism"]["enable_async_tensor_parallel"] = _async_tp(r)
    # torch.compile as costed (--compile; 0.2.2 config/job_config.py Compile: enable, components)
    out["compile"] = {"enable": r.setup.compile != "none", "components": list(compile_parts(r.setup.compile)) or None}
    rc = r.setup.recompute.value
    out["activation_checkpoint"] = {"mode": "selective" if rc == "every-k" else rc,
                                    "selective_ac_option": ("op" if rc == "selective" else str(r.setup.recompute_layers)
                                                            if rc == "every-k" else None)}
    return out


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))  # a TOML basic string: JSON's escapes are TOML's


def notes(r: Run, stack: Optional[Stack]) -> list[str]:
    out = shared_notes(r)
    if r.setup.precision.recipe is not None:
        # the converters' casts: costed as separate memory-bound kernels either way (advisor.compute)
        out.append("the converter's casts are costed as kernels of their own; torchao's float8 / MX converters are "
                   "built for torch.compile, which fuses some of them" + ("" if r.setup.compile != "none" else
                   " (--compile model,loss costs the compiled run)"))
    if stack is not None and stack.name != "torchtitan-0.2":
        out.append(f"costed as stack {stack.name}; this file is torchtitan 0.2's format")
    return out


def torchtitan_toml_config(model, hw, plan, setup, grad_accum: int, world_size: int,
                           stack: Optional[Stack] = None) -> Exported:
    check(model, hw, plan, setup, grad_accum, world_size)
    twin, said = catalogued(model, FLAVORS)
    run = Run(twin, hw, plan, setup, grad_accum, world_size)
    body = sections(run, stack.engine.fsdp_float8_gather if stack is not None else "off")
    said += notes(run, stack)
    launch = " ".join(torchrun_argv(hw, world_size, "-m"))
    lines = [f"# {header(model, hw, plan, setup, grad_accum, world_size, peft=False)}",
             "# torchtitan 0.2 job file (config/job_config.py); data, tokenizer (hf_assets_path), optimizer and "
             "checkpoint keys are yours. Launch:",
             f"#   {ALLOC} {launch} torchtitan.train --job.config_file torchtitan_job.toml"]
    lines += [f"# note: {n}" for n in said]
    for section, keys in body.items():
        kept = {k: v for k, v in keys.items() if v is not None}
        if kept:
            lines += ["", f"[{section}]"] + [f"{k} = {_toml(v)}" for k, v in kept.items()]
    return Exported("torchtitan_job.toml", "\n".join(lines) + "\n", tuple(said))
