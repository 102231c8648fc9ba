"""Megatron-Bridge's published mixture-of-experts runs (reference/megatron_bridge_performance.csv, a verbatim copy in
validation/data/): tokens/s per GPU of DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, GPT-OSS-120B and Kimi-K2 on the
systems a shipped profile describes, each estimated with the plan as published (GPUs, TP, PP, VP, EP, micro and
global batch, sequence 4096), and whether that plan ranks in ``advisor plan``'s top 5 for its model, system and batch.

How a row becomes an estimate:
- the newest container release's row of each (model, system, precision): the tables repeat a configuration
  release after release as the software improves (Qwen3-30B-A3B on GB200: 26,032 tokens/s/GPU in 26.04, 39,936 in
  26.08), and advisor costs one stack;
- the stack: MOE_STACK, one constant: megatron-bridge-perf (megatron-core as Bridge's performance recipes set it);
- Megatron's distributed optimizer (ZeRO-1; Bridge's recipes use it), sequence parallelism where TP > 1, the
  experts unsplit by TP (ETP 1, as Bridge's MoE recipes set expert_tensor_parallel_size), the least recomputation
  (none, selective, full) the model predicts to fit, as the run fitted (the tables do not give it; Bridge's recipes
  recompute modules advisor has no name for), balanced routing (the tables' footnote: "MoE
  runs force a balanced token distribution"), dropless;
- precision: BF16 rows as bf16-mixed; FP8 (current scaling, the tables' README) as fp8-tensorwise and MXFP8 as mxfp8,
  the recipes the dense rows take (validation.lowprec BRIDGE_PRECISION; advisor.precision): the error is reported per
  precision;
- the pipeline split as the recipes write it: Qwen3-235B-A22B's embedding and loss counted as layers (EDGES_SPLIT),
  DeepSeek-V3's and Kimi-K2's layouts of ceil(61 / (pp vp)) layers a chunk (megatron-core's layout split); an
  interleaved schedule no layout fills would run as 1F1B, and be counted;
- rows with no precision (25.09's token-drop tables) are not compared.

Systems: DGX-H100 -> dgx-h100, DGX-B200 -> dgx-b200 (8x B200 on NVSwitch, InfiniBand), DGX-GB200 -> gb200-nvl72, DGX-GB300 ->
gb300-nvl72; DGX-B300 has a profile (dgx-b300) but is not in the issue's list: its rows are scored apart.
"""

from __future__ import annotations

import csv
import re
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from advisor.model import ModelSpec, load_model
from advisor.parallel.pipeline import layout_fills
from validation.datasets import DATA_DIR
from validation.report import DatasetReport, Point, _estimate, _hardware, _report, ape_stats

# Recomputation is not published: each row takes the least of these that the model predicts to fit (the run did)
RECOMPUTE_LADDER = ("none", "selective", "full")
# The stack every row is costed in: megatron-bridge-perf, the profile of Bridge's performance recipes (bf16 gradient
# reduction, weights held in FP8 under its low-precision recipes). Every MoE perf recipe of megatron-bridge 0.6.2 calls
# _benchmark_common last (perf_recipes/*/<system>/*.py), which sets grad_reduce_in_fp32 False: Kimi-K2's base recipe
# sets it True for Muon (recipes/kimi/h100/kimi_k2.py _apply_kimi_k2_optimizer), and the perf recipe sets it back
MOE_STACK = "megatron-bridge-perf"

# How each row's tokens travel, as the performance recipe for its (model, system, precision) sets it (perf_recipes/
# <model>/<system>/*.py: moe_token_dispatcher_type / moe_flex_dispatcher_backend, and overlap_moe_expert_parallel_comm,
# set directly or by _enable_hybridep_full_iteration_mxfp8 (qwen/common.py), _enable_deepseek_full_iteration_mxfp8
# (deepseek/common.py), _apply_gpt_oss_120b_full_iter_fp8mx_configs (gpt_oss/common.py)), with the layout it sets
# (tp, pp, vp, ep, micro-batch). Two megatron-bridge wheels hold perf_recipes, each a container release's (WHEELS):
# 0.6.2 the 26.08 container's (RECIPE_RELEASE; it post-dates 0.5.0, released 06/22/2026, its README), 0.6.0 the 26.06
# container's (the oldest wheel with perf_recipes; its README announces "the NeMo 26.06 training stack that integrates
# full-iteration CUDA graphs, HybridEP/router optimizations, all-to-all overlap", which its recipes set and which took
# Qwen3-30B-A3B on GB200 from 26,112 tokens/s/GPU in 26.04.01 to 40,706 in 26.06 on the same layout). The two agree on
# every MoE recipe a 26.06 row ran, so RECIPES serves both. A row of an older release, or whose layout is not its
# recipe's, ran a recipe neither holds (a recipe's layout outlives its settings: DeepSeek-V3's 26.04.01 B200 layout,
# EP 32, is 0.6.0's, whose full-iteration settings came later): it takes the model providers' defaults (alltoall, and
# the shared experts' overlap where the provider sets it: deepseek_v3_bridge.py, kimi_bridge.py), DEFAULT_TRAVEL.
RECIPE_RELEASE = "26.08"
RECIPES = {  # (model, system, precision) -> (recipe, (tp, pp, vp, ep, mbs), dispatcher, overlap)
    ("DeepSeekV3", "DGX-GB300", "MXFP8"): ("deepseek_v3_pretrain_256gpu_gb300_fp8mx_config", (1, 2, 8, 32, 1), "flex", "batch"),
    ("DeepSeekV3", "DGX-GB200", "MXFP8"): ("deepseek_v3_pretrain_256gpu_gb200_fp8mx_config", (1, 4, 4, 64, 1), "flex", "batch"),
    ("DeepSeekV3", "DGX-B200", "MXFP8"): ("deepseek_v3_pretrain_256gpu_b200_fp8mx_config", (1, 8, 2, 8, 1), "alltoall",
                                          "shared_experts"),
    ("Kimi_K2", "DGX-GB300", "MXFP8"): ("kimi_k2_pretrain_256gpu_gb300_fp8mx_config", (1, 4, 4, 64, 2), "flex", "none"),
    ("GPT OSS 120B", "DGX-GB300", "MXFP8"): ("gpt_oss_120b_pretrain_64gpu_gb300_fp8mx_config", (1, 1, None, 16, 4), "flex",
                                            "batch"),
    ("GPT OSS 120B", "DGX-GB200", "MXFP8"): ("gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config", (1, 1, None, 64, 4), "flex",
                                            "batch"),
    ("GPT OSS 120B", "DGX-GB300", "BF16"): ("gpt_oss_120b_pretrain_64gpu_gb300_bf16_config", (1, 1, None, 64, 4), "alltoall",
                                           "none"),
    ("GPT OSS 120B", "DGX-GB200", "BF16"): ("gpt_oss_120b_pretrain_64gpu_gb200_bf16_config", (1, 1, None, 64, 4), "alltoall",
                                           "batch"),
    ("GPT OSS 120B", "DGX-B200", "BF16"): ("gpt_oss_120b_pretrain_64gpu_b200_bf16_config", (1, 1, None, 8, 4), "alltoall",
                                          "none"),
    ("GPT OSS 120B", "DGX-H100", "BF16"): ("gpt_oss_120b_pretrain_64gpu_h100_bf16_config", (1, 4, None, 8, 1), "alltoall",
                                          "none"),
    ("Qwen3_30B_a3B", "DGX-GB300", "MXFP8"): ("qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config", (1, 1, None, 8, 8), "flex",
                                             "batch"),
    ("Qwen3_30B_a3B", "DGX-GB200", "MXFP8"): ("qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config", (1, 1, None, 8, 4), "flex",
                                             "batch"),
    ("Qwen3_30B_a3B", "DGX-B200", "MXFP8"): ("qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config", (1, 1, None, 8, 4), "flex",
                                            "batch"),
    ("Qwen3_30B_a3B", "DGX-H100", "FP8"): ("qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config", (1, 1, None, 16, 1), "flex",
                                          "none"),
    ("Qwen3_235B_a22B", "DGX-GB300", "MXFP8"): ("qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config", (1, 4, 12, 32, 2),
                                               "flex", "batch"),
    ("Qwen3_235B_a22B", "DGX-GB200", "MXFP8"): ("qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config", (1, 8, 3, 32, 1),
                                               "flex", "batch"),
    ("Qwen3_235B_a22B", "DGX-B200", "MXFP8"): ("qwen3_235b_a22b_pretrain_256gpu_b200_fp8mx_config", (1, 8, 3, 8, 1), "flex",
                                              "batch"),
    ("Qwen3_235B_a22B", "DGX-H100", "FP8"): ("qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config", (2, 8, 4, 32, 1),
                                            "alltoall", "batch"),
}
WHEELS = {RECIPE_RELEASE: "0.6.2", "26.06": "0.6.0", "26.06.01": "0.6.0"}  # release -> the wheel of its recipes
DEFAULT_TRAVEL = ("alltoall", "shared_experts")
# The recomputation those recipes set (recompute_granularity "selective" with recompute_modules), alike in both wheels:
# deepseek/common.py _deepseek_v3_common (selective) with the GB200 MXFP8 recipe's ["mla_up_proj"] (its GB300 one's
# []); Kimi-K2's ["mla_up_proj"] (kimi/gb300/kimi_k2.py); the GPT-OSS MXFP8 recipes end in recompute_modules = []
# (gpt_oss/gb200/gpt_oss.py, gb300 alike); the Qwen3 perf recipes set recompute_granularity None. An empty list
# reruns nothing: none. Rows without a recipe take the least recomputation predicted to fit (RECOMPUTE_LADDER)
RECIPE_RECOMPUTE = {"deepseek_v3_pretrain_256gpu_gb200_fp8mx_config": ("mla_up_proj",),
                    "kimi_k2_pretrain_256gpu_gb300_fp8mx_config": ("mla_up_proj",)}
# The recipes that run the attention core in FP8 (cfg.mixed_precision.fp8_dot_product_attention = True; advisor
# --fp8-attention), megatron-bridge 0.6.2 perf_recipes: DeepSeek-V3 GB300 MXFP8 (deepseek/gb300/deepseek_v3.py:154,
# _enable_deepseek_full_iteration_mxfp8(fp8_dot_product_attention=True); its GB200 recipe, :157, leaves the default
# False), GPT-OSS-120B MXFP8 (gpt_oss/gb300/gpt_oss.py:231, gb200/gpt_oss.py:240 -> gpt_oss/common.py:74), Qwen3 MXFP8
# on GB300 and GB200 (qwen/gb300/qwen3_moe.py:327,487, gb200/qwen3_moe.py:329,489 -> qwen/common.py:57). Kimi-K2's
# GB300 recipe (kimi/gb300/kimi_k2.py) and the H100 FP8 ones do not set it.
FP8_ATTENTION = {"deepseek_v3_pretrain_256gpu_gb300_fp8mx_config", "gpt_oss_120b_pretrain_64gpu_gb300_fp8mx_config",
                 "gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config", "qwen3_30b_a3b_pretrain_8gpu_gb300_fp8mx_config",
                 "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config", "qwen3_235b_a22b_pretrain_256gpu_gb300_fp8mx_config",
                 "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config"}
# Models whose recipes count the embedding and the loss as pipeline layers (--account-for-embedding/loss-in-pipeline-
# split): Qwen3-235B-A22B's perf recipes start from qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config (recipes/qwen/
# h100/qwen3_moe.py), which sets both: its 94 layers + 2 split over pp x vp chunks.
EDGES_SPLIT = {"Qwen3_235B_a22B"}

SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-B200": "dgx-b200", "DGX-GB200": "gb200-nvl72", "DGX-GB300": "gb300-nvl72"}
PRECISIONS = {"BF16": "bf16-mixed", "FP8": "fp8-tensorwise", "MXFP8": "mxfp8"}


@lru_cache(maxsize=None)
def moe_stack():
    """MOE_STACK's profile, read once (a YAML read per estimate would be most of this dataset's time)."""
    from advisor.stack import load_stack

    return load_stack(MOE_STACK)


@lru_cache(maxsize=None)
def model_spec(name: str) -> ModelSpec:
    catalogue = {"DeepSeekV3": "deepseek-v3", "Qwen3_30B_a3B": "qwen3-30b-a3b", "GPT OSS 120B": "gpt-oss-120b",
                 "Qwen3_235B_a22B": "qwen3-235b-a22b", "Kimi_K2": "kimi-k2"}
    return load_model(catalogue[name])


MODELS = ("DeepSeekV3", "Qwen3_30B_a3B", "Qwen3_235B_a22B", "GPT OSS 120B", "Kimi_K2")


def _int(x: str) -> Optional[int]:
    m = re.match(r"\s*(\d+)", x or "")
    return int(m.group(1)) if m else None


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split()[0]))


def load_rows(systems: dict[str, str] = SYSTEMS) -> list[dict[str, Any]]:
    """The MoE rows on the given systems with a precision: the newest release's row of each (model, system,
    precision), the plan the tables publish today (older releases ran older software, often other plans)."""
    with open(DATA_DIR / "megatron_bridge_performance.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[tuple, dict] = {}
    for r in rows:
        if r["Model"] not in MODELS or r["System"] not in systems or r["Precision"] not in PRECISIONS:
            continue
        row = {"model": r["Model"], "system": r["System"], "hw": systems[r["System"]], "precision": r["Precision"],
               "gpus": int(r["#-GPUs"]), "tp": int(r["TP"]), "pp": int(r["PP"]), "ep": int(r["EP"]),
               "vp": _int(r["VP"]), "mbs": int(r["MBS"]), "gbs": int(r["GBS"]), "seq": int(r["Sequence Length"]),
               "measured": float(r["Tokens / sec / GPU"]), "release": r["release"]}
        key = tuple(row[k] for k in ("model", "system", "precision"))
        if key not in out or _release(row["release"]) > _release(out[key]["release"]):
            out[key] = row
    return list(out.values())


# Multi-token prediction depths each model's runs train (advisor.mtp): DeepSeek-V3's one, as every DeepSeek-V3 perf
# recipe's base sets it (megatron-bridge 0.6.2 recipes/deepseek/h100/deepseek_v3.py:123 mtp_num_layers = 1, under
# perf_recipes/deepseek/common.py's deepseek_v3_pretrain_config) and its provider reads it from config.json's
# num_nextn_predict_layers 1 (models/conversion/model_bridge.py:478), the layouts placing it before the loss ("...tmL",
# recipes/deepseek/h100/deepseek_v3.py:66). Kimi-K2 none: its layouts (recipes/kimi/h100/kimi_k2.py:31-40) hold no
# "mtp", which megatron-core's validate_layer_layout would refuse beside mtp_num_layers 1
# (pipeline_parallel_layer_layout.py:111-113); nor Qwen3 or GPT-OSS (no MTP weights, no recipe sets it).
MTP_LAYERS = {"DeepSeekV3": 1}


def estimate_kwargs(row: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(advisor.estimate's options for a row, whether its interleaved schedule ran as 1F1B)."""
    spec = model_spec(row["model"])
    tp, pp, vp = row["tp"], row["pp"], row["vp"]
    interleaved = pp > 1 and vp is not None and vp > 1
    edges = row["model"] in EDGES_SPLIT and pp > 1
    # DeepSeek-V3's and Kimi-K2's explicit layouts are chunks of ceil(61 / (pp vp)) layers, the rest in the last
    # (set_deepseek_v3_pipeline_model_parallel_layout, _get_kimi_k2_pipeline_layout): megatron-core's layout split
    fallback = interleaved and ((spec.n_layers + 2) % (pp * vp) != 0 if edges
                                else not bool(layout_fills(spec.n_layers, pp * vp)))
    dispatcher, overlap, recipe = travel(row)
    kw = dict(model=spec, hw=row["hw"], gpus=row["gpus"], tp=tp, pp=pp, zero=1, sp=tp > 1, ep=row["ep"], etp=1,
              micro_batch=row["mbs"], global_batch=row["gbs"], seq=row["seq"], precision=PRECISIONS[row["precision"]],
              attention="sdpa", recompute="none", stack=moe_stack(), moe_dispatcher=dispatcher,
              moe_overlap=overlap, tp_overlap="none", mtp_layers=MTP_LAYERS.get(row["model"], 0),
              fp8_attention=recipe in FP8_ATTENTION)
    # no userbuffers TP overlap: the one MoE recipe with TP > 1, qwen3_235b_a22b_pretrain_256gpu_h100_fp8cs_config, sets
    # CommOverlapConfig(tp_comm_overlap=False); the others run TP 1
    if interleaved and not fallback:
        kw.update(schedule="interleaved", virtual_stages=vp)
    if edges:
        kw.update(pp_split="edges")
    return kw, fallback


def travel(row: dict[str, Any]) -> tuple[str, str, Optional[str]]:
    """(dispatcher, overlap, the recipe they come from or None) of a row (RECIPES, for a release WHEELS holds)."""
    recipe = RECIPES.get((row["model"], row["system"], row["precision"]))
    if (recipe is None or recipe[1] != tuple(row[k] for k in ("tp", "pp", "vp", "ep", "mbs"))
            or row["release"].split()[0] not in WHEELS):
        # the shared experts' overlap where the model has shared experts to overlap (megatron-core's
        # --moe-shared-expert-overlap is a no-op without a shared expert size: transformer_config.py); none for Qwen3's
        # and GPT-OSS's, as advisor refuses the flag there
        shared = model_spec(row["model"]).experts.d_ff_shared
        return DEFAULT_TRAVEL[0], DEFAULT_TRAVEL[1] if shared else "none", None
    return recipe[2], recipe[3], recipe[0]


def _kind(row: dict[str, Any]) -> str:
    return f"{row['precision']} {row['system']}"


def validate_bridge_moe(systems: dict[str, str] = SYSTEMS, name: str = "bridge-moe") -> DatasetReport:
    rows, rejected, points, no_fit, fallbacks, recomputed = load_rows(systems), Counter(), [], [], 0, Counter()
    travels: Counter = Counter()
    current: list[Point] = []
    by_precision: dict[str, list[Point]] = defaultdict(list)
    for r in rows:
        kw, fallback = estimate_kwargs(r)
        fallbacks += fallback
        travels[f"{kw['moe_dispatcher']}+{kw['moe_overlap']}"] += 1
        est, recipe = None, travel(r)[2]
        # the least recomputation predicted to fit (the tables do not publish it); not full under the batch overlap
        ladder = RECOMPUTE_LADDER[:-1] if kw["moe_overlap"] == "batch" else RECOMPUTE_LADDER
        if recipe is not None:  # what the recipe sets: its modules, or nothing
            modules = RECIPE_RECOMPUTE.get(recipe)
            ladder = (("selective", ",".join(modules)),) if modules else ("none",)
        for rc in ladder:
            policy = dict(recompute=rc[0], recompute_modules=rc[1]) if isinstance(rc, tuple) else dict(recompute=rc)
            est = _estimate({**kw, **policy}, rejected)
            if est is None or est.fits:
                break
        if est is None:
            continue
        recomputed[est.setup.recompute.value] += 1
        label = f"{r['model']} {r['system']} {r['precision']} {r['gpus']}g TP{r['tp']} PP{r['pp']} EP{r['ep']}"
        if not est.fits:
            no_fit.append(label)
        p = Point(label=label, kind=_kind(r), predicted=est.tokens_per_s / est.world_size, measured=r["measured"],
                  breakdown=est.breakdown)
        points.append(p)
        by_precision[r["precision"]].append(p)
        if r["release"].split()[0] == RECIPE_RELEASE:
            current.append(p)
    ranks = published_plan_ranks(rows)
    extra = {"predicted_to_fit_pct": 100.0 * (len(points) - len(no_fit)) / max(len(points), 1),
             "published_plan_in_top5_pct": 100.0 * sum(r is not None for _, r in ranks) / max(len(ranks), 1)}
    for prec, pts in sorted(by_precision.items()):
        extra[f"{prec}_mape_pct"], extra[f"{prec}_max_ape_pct"] = ape_stats(pts)
    # the rows of the release whose recipes megatron-bridge 0.6.2 holds (RECIPES): what they ran is known
    extra["recipe_release_mape_pct"], extra["recipe_release_max_ape_pct"] = ape_stats(current)
    notes = [f"{len(points)} rows compared ({', '.join(f'{k} {len(v)}' for k, v in sorted(by_precision.items()))}), "
             f"the newest release of each (model, system, precision), costed in {Path(MOE_STACK).stem}; balanced routing, dropless "
             "(the tables force a balanced token distribution); FP8 as fp8-tensorwise, MXFP8 as mxfp8",
             "dispatcher and all-to-all overlap as the recipe of the row's release sets them (megatron-bridge 0.6.2: "
             "26.08, 0.6.0: 26.06, rows of their layouts), "
             "else the providers' defaults: " + ", ".join(f"{k} {n}" for k, n in sorted(travels.items())),
             f"{fallbacks} interleaved schedules whose chunks no layout fills run as 1F1B",
             "recomputation, which the tables do not give: the recipe's (RECIPE_RECOMPUTE) where a wheel holds it, "
             "else the least predicted to fit: "
             + ", ".join(f"{k} {n}" for k, n in sorted(recomputed.items()))]
    notes.append("the published plan's rank in advisor plan's top 5 (dp, tp, pp, ep matched; '-': not in it): "
                 + ", ".join(f"{k} {r or '-'}" for k, r in ranks))
    if no_fit:
        notes.append(f"predicted not to fit though they ran ({len(no_fit)}): " + ", ".join(no_fit[:6])
                     + (", ..." if len(no_fit) > 6 else ""))
    return _report(name, "Megatron-Bridge MoE pretraining tables (DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, "
                   "GPT-OSS-120B, Kimi-K2) on H100, B200, GB200, GB300", "tokens/s per GPU", len(rows), points,
                   rejected, extra=extra, notes=notes)


def published_plan_ranks(rows: Optional[list[dict[str, Any]]] = None, top: int = 5) -> list[tuple[str, Optional[int]]]:
    """For each (model, system, precision, GPUs, batch) of the rows: the published plan's rank among ``advisor plan``'s
    ``top`` (None: not among them, or the search refused), matched on dp, tp, pp and ep."""
    from advisor.errors import AdvisorError
    from advisor.search import plan

    rows = load_rows() if rows is None else rows
    out = []
    seen = set()
    for r in rows:
        key = (r["model"], r["system"], r["precision"], r["gpus"], r["gbs"])
        if key in seen:
            continue
        seen.add(key)
        kw, _ = estimate_kwargs(r)
        try:
            found = plan(kw["model"], _hardware(r["hw"]), gpus=r["gpus"], seq=r["seq"], global_batch=r["gbs"],
                         precision=kw["precision"], stack=kw["stack"], top=top, moe_dispatcher=kw["moe_dispatcher"],
                         moe_overlap=kw["moe_overlap"], tp_overlap=kw["tp_overlap"])
        except AdvisorError as exc:
            out.append((f"{' '.join(map(str, key))}: {str(exc)[:80]}", None))
            continue
        dp = r["gpus"] // (r["tp"] * r["pp"])
        rank = next((i + 1 for i, p in enumerate(found.plans) if (p.estimate.plan.dp, p.estimate.plan.tp,
                     p.estimate.plan.pp, p.estimate.plan.ep) == (dp, r["tp"], r["pp"], r["ep"])), None)
        out.append((" ".join(map(str, key)), rank))
    return out
