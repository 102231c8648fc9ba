"""Low-precision training (issue 21): validation/data/lowprec_runs.yaml and megatron_bridge_performance.csv, verbatim
copies of the reference files.

``lowprec``: the end-to-end rows (torchao / torchtitan benchmark tables: bf16 beside FP8 tensorwise / rowwise, MXFP8,
NVFP4) estimated as their users ran them (``--stack torchtitan``, FSDP, their batch and checkpointing), each recipe
row's tokens/s per GPU and its speedup over the same table's BF16 row; and the GEMM rows (Transformer Engine's
per-GEMM profiling on B300 and H200 NVL, torchao's tables) through advisor.compute's recipe GEMM time plus, for the
"autocast" rows, the per-GEMM quantisation of both operands (advisor.precision ``gemm_quantise_bytes``).

``bridge``: Megatron-Bridge's dense pre-training, SFT and LoRA rows (Llama 3 8B / 70B, Llama 3.1 405B) on the systems advisor
has a profile for, estimated on ``BRIDGE_STACK`` with their TP/PP/VP, micro and global batch; tokens/s per GPU, and
every row must fit.

``python -m validation.lowprec --fit`` prints the recipe GEMM calibrations the Hopper and Blackwell profiles carry.
"""

from __future__ import annotations

import csv
from collections import Counter
from typing import Any, Callable, Optional

import numpy as np
import yaml

from advisor.compute import gemm_time, mem_time, recipe_gemm_time
from advisor.hardware import Hardware, load_hardware
from advisor.precision import RECIPES
from advisor.stack import load_stack
from advisor.units import GiB
from validation.datasets import DATA_DIR
from validation.report import DatasetReport, Point, _estimate, _report, ape_stats

# The stack the Megatron-Bridge rows are costed on: the one its performance tables ran, megatron-core as Bridge's
# performance recipes set it (every Llama recipe calls _benchmark_common: bf16 gradient reduction; FP8/FP4 weights):
# stack_profiles/megatron-bridge-perf.yaml
BRIDGE_STACK = "megatron-bridge-perf"

E2E_HARDWARE = {"H100": "dgx-h100", "H100 (96GB HBM2e, 500W)": "meta-grand-teton-h100", "H200": "dgx-h200",
                "B200 (power limited)": "aws-p6-b200", "B200": "aws-p6-b200", "GB200": "gb200-nvl72",
                # nvfp4.md's Qwen3 rows: 78.63 GiB published as 42.67% of memory, the GB200's 184.3 GiB of its Llama rows
                "GB200 (inferred)": "gb200-nvl72"}
# The torchtitan each end-to-end source ran: nvfp4.md and PR #3914 train with configs only torchtitan 0.3.0's registry
# has (llama3_8b_mxfp8, llama3_8b_first_85_pct_layers_nvfp4, on torch 2.14 nightlies): its chunked loss; the 2024-2025
# benchmark docs and torchao's tables predate it (torchtitan 0.0.2 and commits of Dec 2024 - Aug 2025): the whole-
# sequence loss and TP always with SequenceParallel (stack_profiles/torchtitan-0.2.yaml), on torch 2.9 or later (the
# fused rms_norm), else on the torch before it (torchtitan-0.1: the composite rms_norm), by the row's torch version
E2E_STACK_BY_SOURCE = {"nvfp4.md": "torchtitan", "3914": "torchtitan"}
E2E_STACK = "torchtitan-0.2"
E2E_STACK_BEFORE_TORCH_2_9 = "torchtitan-0.1"
# Checkpointing a row does not state: the default of its config. torchtitan 0.3.0's llama3_8b and qwen3 8B configs set
# activation_checkpoint=SelectiveAC.Config() (models/llama3/config_registry.py, models/qwen3/config_registry.py), the
# per-op policy, which the mxfp8 and nvfp4 variants inherit
E2E_DEFAULT_AC = {"torchtitan": "selective"}
# What a row's torch.compile compiled (torchtitan's compile.components): the blocks and the loss since the first
# release, 0.1.0 (June 2025: training.compile compiles the loss in components/loss.py; 0.2.2 compile.components
# ["model", "loss"]; 0.3.0 BaseLoss._maybe_compile), the blocks alone before it: the Dec-2024 commit's train.py left
# the loss eager ("TODO: compiling loss function causes CUDA errors, turning off for now"), and a checkout reporting
# 0.0.2 (main's version string from the April-2024 0.0.2 wheel until 0.1.0) is of that time. A row that says compile
# false runs eager
E2E_COMPILE_BLOCKS_ONLY = ("9dec370", "0.0.2")
# torchtitan 0.2.2's float8 options a row's `details` names (config/job_config.py:731-736, both off by default, the
# stack profiles' ``fsdp_float8_gather: off``): the float8 FSDP all-gather, its amaxes reduced at each gather or, with
# precompute_float8_dynamic_scale_for_fsdp, once after the optimizer step (advisor.parallel.fp8_gather). The first match wins
E2E_FP8_GATHER = (("precompute_float8_dynamic_scale_for_fsdp", "precomputed"), ("enable_fsdp_float8_all_gather", "per_gather"))
E2E_MODELS = {"Llama3-8B": "llama3-8b", "Llama3-70B": "llama3-70b", "Llama3.1-405B": "llama3-405b", "Qwen3-8B": "qwen3-8b"}
BRIDGE_HARDWARE = {"DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200", "DGX-B300": "dgx-b300", "DGX-GB200": "gb200-nvl72",
                   "DGX-GB300": "gb300-nvl72"}
BRIDGE_MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b"}
# Megatron-Bridge's precision column: FP8 is current scaling on these tables (the README: "FP8 current scaling")
BRIDGE_PRECISION = {"BF16": "bf16-mixed", "FP8": "fp8-tensorwise", "MXFP8": "mxfp8", "NVFP4": "nvfp4"}

SPEEDUP_TOLERANCE_PCT = 10.0
TOKENS_TOLERANCE_PCT = 15.0
GEMM_TOLERANCE_PCT = 15.0

# TE's 5B configuration (docs/features/low_precision_training: gemm profiling): M = 15872 tokens, hidden 4096
TE_M = 15872
TE_SHAPES = {"QKV": (4096, 12288), "AttnOut": (4096, 4096), "MLPUp": (4096, 16384), "MLPDown": (16384, 4096)}  # (k, n)


def load_lowprec() -> list[dict]:
    return yaml.safe_load((DATA_DIR / "lowprec_runs.yaml").read_text())


def load_bridge() -> list[dict]:
    with open(DATA_DIR / "megatron_bridge_performance.csv", newline="") as f:
        return list(csv.DictReader(f))


def h200_nvl() -> Hardware:
    """The H200 NVL (PCIe card, 600 W) TE's H200 rows ran on: dgx-h200's efficiencies on the NVL's datasheet rates
    (NVIDIA H200 datasheet, H200 NVL column: BF16 1,671 and FP8 3,341 TFLOP/s with sparsity, half dense; 4.8 TB/s)."""
    hw = load_hardware("dgx-h200")
    gpu = hw.gpu.model_copy(update={"name": "H200-NVL", "memory_bandwidth_GBps": 4800.0,
                                    "peak_tflops": {**hw.gpu.peak_tflops, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}})
    return hw.model_copy(update={"name": "h200-nvl", "gpu": gpu})


def gemm_seconds(hw: Hardware, recipe: str, m: float, k: float, n: float, autocast: bool, passes=("fprop",)) -> float:
    """One GEMM's passes of shape m x k x n (fprop: [m, k] @ [k, n]) in ``recipe``; ``autocast``: each pass also
    quantises both of its operands in one orientation (TE benchmark_gemm.py's autocast mode)."""
    r = RECIPES.get(recipe)
    flops = 2.0 * m * k * n
    t = 0.0
    # operands per pass: fprop x [m,k], w [k,n]; dgrad dy [m,n], w; wgrad x, dy
    operands = {"fprop": m * k + k * n, "dgrad": m * n + k * n, "wgrad": m * k + m * n}
    for p in passes:
        if r is None or not r.runs_low(p):
            t += float(gemm_time(hw, "bf16", flops, n, k))
            continue
        t += float(recipe_gemm_time(hw, r, flops, n, k))
        if autocast:
            t += float(mem_time(hw, r.gemm_quantise_bytes * operands[p]))
    return t


def _gemm_hw(gpu: str) -> Optional[Hardware]:
    if gpu.startswith("B300"):
        return load_hardware("dgx-b300")
    if gpu.startswith("H200 NVL"):
        return h200_nvl()
    if gpu.startswith("B200"):
        return load_hardware("aws-p6-b200")
    if gpu.startswith("H100"):
        return load_hardware("dgx-h100")
    return None


def te_layer_seconds(hw: Hardware, recipe: str, autocast: bool, passes) -> float:
    return sum(gemm_seconds(hw, recipe, TE_M, k, n, autocast, passes) for k, n in TE_SHAPES.values())


def predict_gemm(row: dict) -> Optional[tuple[float, float, str]]:
    """(predicted, measured, what) of one GEMM row, or None where advisor has nothing to say."""
    hw = _gemm_hw(row["hardware"]["gpu"])
    if hw is None:
        return None
    rid, recipe = row["id"], row["recipe"]
    autocast = row.get("mode", "").startswith("autocast")
    if rid.startswith("te-gemm-"):
        parts = rid.split("-")
        if "layer" in parts:
            which = parts[parts.index("layer") + 1]
            passes = ("fprop", "dgrad", "wgrad") if which == "total" else (which,)
            pred = te_layer_seconds(hw, recipe, autocast, passes)
        else:
            k, n = TE_SHAPES[parts[5]]
            pred = gemm_seconds(hw, recipe, TE_M, k, n, autocast)
        return pred * 1e3, float(row["time_ms"]), "time ms"
    if rid.startswith("te-speedups-"):
        passes = ("fprop", "dgrad", "wgrad")
        return (te_layer_seconds(hw, "bf16", False, passes) / te_layer_seconds(hw, recipe, autocast, passes),
                float(row["speedup_vs_bf16"]), "speedup")
    shape = row.get("shape")
    if not isinstance(shape, list) or len(shape) != 3:
        return None
    m, k, n = (float(x) for x in shape)
    groups = float(row.get("groups") or 1)
    if row.get("time_us") is not None:  # one pass of a grouped GEMM, pre-quantised
        pass_ = "wgrad" if rid.endswith("wgrad") else ("dgrad" if rid.endswith("dgrad") else "fprop")
        pred = groups * gemm_seconds(hw, recipe, m / groups, k, n, False, (pass_,))
        return pred * 1e6, float(row["time_us"]), "time us"
    if row.get("speedup_vs_bf16") is not None:  # forward + backward with the casts, against bf16
        all3 = ("fprop", "dgrad", "wgrad")
        return (gemm_seconds(hw, "bf16", m / groups, k, n, False, all3) / gemm_seconds(hw, recipe, m / groups, k, n, True, all3),
                float(row["speedup_vs_bf16"]), "speedup")
    return None


def _recompute(ac: Any, stack: str) -> Optional[str]:
    if ac is None:  # not stated: the default of the config the row ran
        return E2E_DEFAULT_AC.get(stack)
    a = str(ac).lower()
    if a.startswith("full"):
        return "full"
    if "sac" in a or a.startswith("selective"):
        return "selective"
    if a.startswith("none"):
        return "none"
    return None


def _torch_2_9(version: str) -> bool:
    """Whether a row's torch ("2.9.0.dev20250815+cu128", "2.7.0a0+gitb98af95", a commit hash of Dec 2024) is 2.9 or
    later; a bare commit is one of the rows' 2024 nightlies."""
    parts = version.split(".")
    return len(parts) > 1 and parts[0].isdigit() and parts[1].isdigit() and (int(parts[0]), int(parts[1])) >= (2, 9)


def e2e_kwargs(row: dict) -> Optional[dict]:
    """advisor.estimate's options for an end-to-end row, or None where advisor cannot ask it (MoE, no GPU named,
    a parallelism column advisor does not read, a pipeline whose micro-batches the source does not state)."""
    hw, m, p, b = row["hardware"], row["model"], row["parallelism"], row["batch"]
    model, gpu = E2E_MODELS.get(m["name"]), E2E_HARDWARE.get(str(hw.get("gpu")))
    stack = E2E_STACK_BY_SOURCE.get(row["source"]["url"].rstrip("/").split("/")[-1], E2E_STACK)
    if stack == E2E_STACK and not _torch_2_9(str((row.get("software") or {}).get("versions", {}).get("torch"))):
        stack = E2E_STACK_BEFORE_TORCH_2_9
    recompute = _recompute(p.get("ac"), stack)
    if model is None or gpu is None or recompute is None or p.get("ep") or not isinstance(p.get("dp"), int):
        return None
    tp, pp = p.get("tp") or 1, p.get("pp") or 1
    asynctp = "async" in str(tp).lower()  # "8 (asyncTP)": torchtitan's async tensor parallel
    if not isinstance(tp, int) or not isinstance(pp, int):
        tp = int(str(tp).split()[0])
        pp = int(str(pp).split()[0])
    if pp > 1:  # the 405B 3D row: its micro-batch count, virtual stages and split (126 layers) are not published
        return None
    kw = dict(model=model, hw=gpu, gpus=hw["num_gpus"], dp=p["dp"], tp=tp, pp=pp, fsdp="full-shard",
              micro_batch=b["micro_batch_per_gpu"], seq=m["seq_len"], recompute=recompute, stack=stack, sp=tp > 1,
              precision="bf16-mixed" if row["precision"]["recipe"] == "bf16" else row["precision"]["recipe"])
    if b.get("global_batch_seqs"):
        kw["global_batch"] = b["global_batch_seqs"]
    if asynctp:
        kw["tp_overlap"] = "async"
    if p.get("compile"):
        version = str((row.get("software") or {}).get("versions", {}).get("torchtitan"))
        kw["compile"] = "model" if version.startswith(E2E_COMPILE_BLOCKS_ONLY) else "model,loss"
    details = str(row["precision"].get("details") or "")
    gather = next((mode for flag, mode in E2E_FP8_GATHER if flag in details), None)
    if gather is not None:  # the row's own float8 FSDP options over the stack's default (off)
        st = load_stack(stack)
        kw["stack"] = st.model_copy(update={"engine": st.engine.model_copy(update={"fsdp_float8_gather": gather})})
    return kw


def _twin(row: dict, rows: list[dict], differs: Callable[[dict], bool]) -> Optional[dict]:
    """The first end-to-end row of the same source, model, GPUs and batch as ``row`` for which ``differs`` holds."""
    for other in rows:
        if (other.get("kind") != "gemm" and other["source"]["url"] == row["source"]["url"]
                and other["model"]["name"] == row["model"]["name"] and other["hardware"] == row["hardware"]
                and other["batch"] == row["batch"] and differs(other)):
            return other
    return None


def _baseline(row: dict, rows: list[dict]) -> Optional[dict]:
    """The BF16 row of the same source, model, GPUs, batch and parallelism (compile and async TP included)."""
    if row["precision"]["recipe"] == "bf16":
        return None
    return _twin(row, rows, lambda o: o["precision"]["recipe"] == "bf16" and o["parallelism"] == row["parallelism"])


def _tp_apart(parallelism: dict) -> tuple[str, dict]:
    """(the TP degree as written, e.g. "8" of "8 (asyncTP)", the rest of the parallelism)."""
    return str(parallelism.get("tp")).split()[0], {k: v for k, v in parallelism.items() if k != "tp"}


def _vanilla_tp(row: dict, rows: list[dict]) -> Optional[dict]:
    """The row of the same source, model, GPUs, batch and recipe whose TP runs without async TP, for an async-TP row."""
    if "async" not in str(row["parallelism"].get("tp")).lower():
        return None
    return _twin(row, rows, lambda o: "async" not in str(o["parallelism"].get("tp")).lower()
                 and o["precision"]["recipe"] == row["precision"]["recipe"]
                 and _tp_apart(o["parallelism"]) == _tp_apart(row["parallelism"]))


def validate_lowprec() -> DatasetReport:
    rows = load_lowprec()
    rejected, points, speedups, gemms = Counter(), [], [], []
    memory_deltas: list[tuple[str, float, float]] = []
    no_fit: list[str] = []  # every end-to-end row ran
    tokens: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for r in rows:
        if r.get("kind") == "gemm":
            got = predict_gemm(r)
            if got is None:
                rejected["GEMM row with no shape or GPU advisor reads"] += 1
                continue
            pred, meas, what = got
            gemms.append(Point(label=r["id"], kind=f"gemm {what}", predicted=pred, measured=meas))
            continue
        kw = e2e_kwargs(r)
        if kw is None:
            rejected["end-to-end row advisor cannot ask (MoE, no GPU named, a column it does not read, or a pipeline "
                     "with no micro-batch count)"] += 1
            continue
        est = _estimate(kw, rejected)
        if est is None:
            continue
        if not est.fits:
            no_fit.append(r["id"])
        tokens[r["id"]] = est.tokens_per_s / est.world_size
        peaks[r["id"]] = est.memory.peak_bytes / GiB
        points.append(Point(label=r["id"], kind=r["precision"]["recipe"], predicted=tokens[r["id"]],
                            measured=float(r["measured"]["tokens_per_s_per_gpu"]), breakdown=est.breakdown))
    for r in rows:
        base = _baseline(r, rows) if r.get("kind") != "gemm" else None
        if base is None or r["id"] not in tokens or base["id"] not in tokens:
            continue
        measured = r["measured"].get("speedup_vs_bf16") or (r["measured"]["tokens_per_s_per_gpu"]
                                                           / base["measured"]["tokens_per_s_per_gpu"])
        speedups.append(Point(label=r["id"], kind=r["precision"]["recipe"],
                              predicted=tokens[r["id"]] / tokens[base["id"]], measured=float(measured)))
        if r["measured"].get("peak_memory_gib") and base["measured"].get("peak_memory_gib"):
            # the recipe's memory change against its BF16 row, in GiB (torchtitan's reserved memory): what the recipe
            # itself moves, apart from how far the stack's activation tables are from the BF16 peak
            memory_deltas.append((r["id"], peaks[r["id"]] - peaks[base["id"]],
                                  r["measured"]["peak_memory_gib"] - base["measured"]["peak_memory_gib"]))
    # what async TP adds over the same run's vanilla TP (torchtitan's asyncTP tables): the mechanism's own check
    async_gains = []
    for r in rows:
        van = _vanilla_tp(r, rows) if r.get("kind") != "gemm" else None
        if van is not None and r["id"] in tokens and van["id"] in tokens:
            async_gains.append(Point(label=r["id"], kind=r["precision"]["recipe"],
                                     predicted=tokens[r["id"]] / tokens[van["id"]],
                                     measured=float(r["measured"]["tokens_per_s_per_gpu"])
                                     / float(van["measured"]["tokens_per_s_per_gpu"])))
    extra = {}
    extra["speedup_mape_pct"], extra["speedup_max_ape_pct"] = ape_stats(speedups)
    if async_gains:
        extra["async_tp_gain_mape_pct"], extra["async_tp_gain_max_ape_pct"] = ape_stats(async_gains)
    extra["gemm_mape_pct"], extra["gemm_max_ape_pct"] = ape_stats(gemms)
    def within(points: list[Point], tol: float) -> float:
        return 100.0 * float(np.mean([abs(p.error_pct) <= tol for p in points])) if points else float("nan")
    extra["speedup_within_10_pct"] = within(speedups, SPEEDUP_TOLERANCE_PCT)
    extra["tokens_within_15_pct"] = within(points, TOKENS_TOLERANCE_PCT)
    extra["gemm_within_15_pct"] = within(gemms, GEMM_TOLERANCE_PCT)
    extra["predicted_to_fit_pct"] = 100.0 * (len(points) - len(no_fit)) / max(len(points), 1)
    notes = [f"speedup over BF16 {s.label}: predicted x{s.predicted:.3f}, measured x{s.measured:.3f} ({s.error_pct:+.1f}%)"
             for s in speedups]
    if no_fit:
        notes.append(f"predicted not to fit though they ran ({len(no_fit)}): " + ", ".join(no_fit))
    notes += [f"peak memory against BF16 {rid}: predicted {p:+.1f} GiB, measured {m:+.1f} GiB" for rid, p, m in memory_deltas]
    notes += [f"async TP over vanilla TP {a.label}: predicted x{a.predicted:.3f}, measured x{a.measured:.3f} "
              f"({a.error_pct:+.1f}%)" for a in async_gains]
    notes += [f"GEMM {g.label}: predicted {g.predicted:.4g}, measured {g.measured:.4g} ({g.error_pct:+.1f}%)"
              for g in gemms if abs(g.error_pct) > GEMM_TOLERANCE_PCT]
    return _report("lowprec", "low-precision recipes: torchao/torchtitan end-to-end rows, TE and torchao GEMM rows",
                   "tokens/s per GPU", len(rows), points, rejected, extra=extra, notes=notes)


# Megatron-Bridge 0.3.1's Llama 3.1 405B recipes (megatron/bridge/recipes/llama/llama3.py,
# llama31_405b_pretrain_config) set account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split:
# the embedding and the loss each take a layer's place in the pipeline split (126 layers + 2 = 128), which is what
# advisor's ``pp_split="edges"`` costs. The Llama 3 8B and 70B recipes leave both unset (False, the default).
BRIDGE_PP_SPLIT = {"llama3-405b": "edges"}
# Context parallelism: no Llama recipe of Megatron-Bridge 0.3.1 sets cp_comm_type (only the GPT-OSS and Gemma 3 VL
# ones do, to "a2a"), and megatron-core 0.16.1 leaves it None, which TEDotProductAttention runs as "p2p"
# (transformer/transformer_config.py cp_comm_type; extensions/transformer_engine.py): the ring exchange of K and V.
BRIDGE_CP_COMM = "ring"
# Recomputation: the tables do not publish it, and the Llama recipes in Megatron-Bridge 0.3.1's package
# (recompute_granularity None) are written for other parallelisms than the tables' rows (llama3_70b: TP4 PP4 VP5 CP2;
# the rows' configurations live in its scripts/performance, which the package does not ship): each row takes the
# least recomputation each row's model predicts to fit, as the run did: none, selective (Megatron's default
# recompute_modules, the core attention), then --recompute-method block with k = 1, 2, ... layers of each stage chunk
# checkpointed (megatron-core transformer_block.py: layer_number < recompute_num_layers), then full (uniform, 1)
BRIDGE_MODEL_LAYERS = {"llama3-8b": 32, "llama3-70b": 80, "llama3-405b": 126}  # the models' configs (n_layers)
BRIDGE_TASKS = ("pretrain", "sft", "lora")
# The LoRA rows' adapters: megatron-bridge 0.6.2's llama3_70b_peft_config (recipes/llama/h100/llama3.py: dim 16,
# alpha 32; LoRA's dropout 0.0, peft/lora.py) with the perf recipes' cfg.peft.target_modules = ["linear_qkv"]
BRIDGE_LORA = dict(method="lora", lora_rank=16, lora_alpha=32.0, lora_dropout=0.0, lora_targets="qkv")


def bridge_least_recompute(kw: dict, rejected: Counter):
    """The estimate under the least recomputation predicted to fit: none, selective, the smallest block k (by
    bisection: a stage keeps less with every layer more checkpointed), full; the last tried where none fits."""
    est = None
    for policy in ({"recompute": "none"}, {"recompute": "selective"}):
        est = _estimate({**kw, **policy}, rejected)
        if est is None or est.fits:
            return est
    chunks = kw["pp"] * kw.get("virtual_stages", 1)
    layers = BRIDGE_MODEL_LAYERS[kw["model"]] + (2 if kw.get("pp_split") == "edges" else 0)
    lo, hi, best = 1, -(-layers // chunks) - 1, None
    while lo <= hi:
        k = (lo + hi) // 2
        got = _estimate({**kw, "recompute": "block", "recompute_layers": k}, rejected)
        if got is not None and got.fits:
            best, hi = got, k - 1
        else:
            lo = k + 1
    return best if best is not None else _estimate({**kw, "recompute": "full"}, rejected)


def _cell(value: str) -> Optional[int]:
    """An integer cell; None for a blank, "n/a" or a cell that says two things ("64 (0)": the 25.09 table's
    two configurations in one row)."""
    v = value.strip()
    if v in ("", "n/a"):
        return 0
    return int(v) if v.isdigit() else None


def bridge_kwargs(row: dict) -> tuple[Optional[dict], str]:
    """advisor.estimate's options for a Megatron-Bridge dense row as the run was configured, or (None, why not)."""
    model, hw, prec = BRIDGE_MODELS.get(row["Model"]), BRIDGE_HARDWARE.get(row["System"]), BRIDGE_PRECISION.get(row["Precision"])
    # SFT is full fine-tuning: the pre-training step on SQuAD packed into full-length rows (the perf recipes'
    # pad_to_max_length), costed with causal attention over the whole row (per document in the run: Llama 3 70B at
    # 4,096 spends ~4% of its FLOPs there, so the estimate errs that much slow at most); LoRA the same rows through
    # the recipes' adapters (BRIDGE_LORA)
    if row["task"] not in BRIDGE_TASKS:
        return None, f"a {row['task']} row"
    if model is None or hw is None or prec is None:
        return None, "a system without a profile or no precision named"
    cells = {k: _cell(row[k]) for k in ("#-GPUs", "TP", "PP", "VP", "CP", "FSDP")}
    if any(v is None for v in cells.values()):
        return None, "a cell giving two configurations ('1 (2)')"
    gpus, tp, pp, cp = cells["#-GPUs"], cells["TP"] or 1, cells["PP"] or 1, cells["CP"] or 1
    # "n/a" or blank is a value the table did not give (reference/README.md), not a 1: a pipeline's interleaving
    # sets its bubble (Llama 3 70B on GB300 in MXFP8, 26.02.01, PP 4 with VP n/a: as 1F1B at 8 micro-batches a 27%
    # bubble, where 26.02 and 26.04 ran that layout at VP 5), so a pipeline without its VP is not costed
    if pp > 1 and row["VP"].strip() in ("", "n/a"):
        return None, "a pipeline whose virtual stages the table does not give (VP n/a)"
    # Megatron-Bridge's recipes run the distributed optimizer (ZeRO-1, ddp.use_distributed_optimizer); an FSDP
    # degree means Megatron-FSDP (ddp.use_megatron_fsdp, data_parallel_sharding_strategy
    # "optim_grads_params" in Megatron-Bridge 0.3.1's recipes/common.py: ZeRO-3)
    fsdp = cells["FSDP"] > 0
    vp = cells["VP"]
    kw = dict(model=model, hw=hw, gpus=gpus, tp=tp, pp=pp, dp=gpus // (tp * pp * cp), zero=3 if fsdp else 1,
              micro_batch=int(row["MBS"]), global_batch=int(row["GBS"]), seq=int(row["Sequence Length"]),
              precision=prec, recompute="none", stack=BRIDGE_STACK)
    if tp > 1:
        kw["sp"] = True
    if prec == "nvfp4":  # the NVFP4 recipes turn the userbuffers TP overlap off (perf_recipes/llama/<system>/*_nvfp4_config:
        kw["tp_overlap"] = "none"  # comm_overlap.tp_comm_overlap = False); the others keep the stack's (on)
    if row["task"] == "lora":
        kw.update(BRIDGE_LORA)
    if cp > 1:
        kw["cp"], kw["cp_comm"] = cp, BRIDGE_CP_COMM
    if pp > 1 and model in BRIDGE_PP_SPLIT:
        kw["pp_split"] = BRIDGE_PP_SPLIT[model]
    if pp > 1 and vp > 1:
        kw["schedule"] = "interleaved"
        kw["virtual_stages"] = vp
    return kw, ""


def validate_bridge() -> DatasetReport:
    rows = load_bridge()
    rejected, points, no_fit, recomputed = Counter(), [], [], Counter()
    dense = [r for r in rows if r["Model"] in BRIDGE_MODELS]
    for r in dense:
        kw, why = bridge_kwargs(r)
        if kw is None:
            rejected[why] += 1
            continue
        est = bridge_least_recompute(kw, rejected)  # the least recomputation predicted to fit (not published)
        if est is None:
            continue
        rc = est.setup.recompute.value
        recomputed[f"{rc} {est.setup.recompute_layers}" if rc == "block" else rc] += 1
        task = "" if r["task"] == "pretrain" else f" {r['task'].upper()}"
        label = f"{r['Model']}{task} {r['System']} {r['Precision']} tp{r['TP']} pp{r['PP']} {r['release']}"
        if not est.fits:
            no_fit.append(label)
        points.append(Point(label=label, kind=r["Precision"] + task, predicted=est.tokens_per_s / est.world_size,
                            measured=float(r["Tokens / sec / GPU"]), breakdown=est.breakdown))
    extra = {"predicted_to_fit_pct": 100.0 * (len(points) - len(no_fit)) / max(len(points), 1),
             "within_10_pct": 100.0 * np.mean([abs(p.error_pct) <= 10.0 for p in points]) if points else float("nan")}
    notes = [f"stack {BRIDGE_STACK}; {len(points)} of {len(dense)} dense rows compared; CP as {BRIDGE_CP_COMM}, "
             "Llama 3.1 405B with the embedding and loss in the pipeline split (its recipe), FSDP as ZeRO-3; SFT rows as "
             "full fine-tuning with causal attention over each packed row, LoRA rows with the recipes' adapters (r 16 on "
             "linear_qkv)",
             "recomputation, which the tables do not give (their runs' configs are Megatron-Bridge's "
             "scripts/performance, not in its package; the package's Llama recipes set none at other parallelisms), "
             "the least predicted to fit: " + ", ".join(f"{k} {n}" for k, n in sorted(recomputed.items()))]
    if no_fit:
        notes.append(f"predicted not to fit though they ran ({len(no_fit)}): " + ", ".join(no_fit[:6]))
    return _report("bridge", "Megatron-Bridge dense pre-training, SFT and LoRA (Llama 3 8B/70B, 3.1 405B): BF16, FP8, MXFP8, NVFP4",
                   "tokens/s per GPU", len(dense), points, rejected, extra=extra, notes=notes)


def fit_report() -> str:
    """The recipe calibrations: each recipe's matmul_max that gives TE's measured pre-quantised speedup over BF16."""
    from scipy.optimize import brentq

    out = []
    # fp8-delayed takes fp8-tensorwise's rate (the same GEMM; see dgx-h100's profile)
    cases = [("dgx-b300", "B300", {"fp8-tensorwise": "FP8Current", "mxfp8": "MXFP8", "nvfp4": "NVFP4"}),
             ("dgx-h100", "H200", {"fp8-tensorwise": "FP8Current"})]
    rows = {r["id"]: r for r in load_lowprec()}
    for prof, tag, recipes in cases:
        hw = load_hardware(prof)
        passes = ("fprop", "dgrad", "wgrad")
        tb = te_layer_seconds(hw, "bf16", False, passes)
        for name, te in recipes.items():
            sp = rows[f"te-gemm-{tag.lower()}-prequant-layer-total-{te}"]["speedup_vs_bf16"]
            r = RECIPES[name]

            def f(x: float) -> float:
                e = hw.efficiency.model_copy(update={"matmul_max": {**hw.efficiency.matmul_max, name: x}})
                return te_layer_seconds(hw.model_copy(update={"efficiency": e}), name, False, passes) - tb / sp
            out.append(f"{prof} {name}: x{sp} over BF16 -> matmul_max {brentq(f, 0.01, 1.0):.3f} of the {r.format} peak")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    if "--fit" in sys.argv:
        print(fit_report())
