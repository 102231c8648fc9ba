"""`advisor validate`: the report's structure, the project's accuracy goals, the CLI and its figures.

The goals (validation.validate.GOALS) are asserted as they stand; those the current model does not yet
meet are xfail(strict=True) with the number measured when the mark was set, which says how far off the model
is: the suite stays green while a goal is unmet and fails the day it is met, so that the mark is removed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `validation` is not an installed package; run from a checkout
    sys.path.insert(0, str(ROOT))

from validation.cli import validate as validate_command  # noqa: E402
from advisor.step import TIME_PARTS  # noqa: E402
from validation import datasets as ds  # noqa: E402
from validation import validate as v  # noqa: E402


# every test here shares one full validation run (~30 s), with test_golden: on one xdist worker (--dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("validation")]


@pytest.fixture(scope="module")
def report(validation_report):
    return validation_report


def test_every_dataset_is_reported_in_under_a_minute(report):
    assert [d.name for d in report.datasets] == list(v.VALIDATORS)
    assert report.wall_s < 60  # the budget for the whole validation, offline


@pytest.mark.parametrize("name, loader", [
    ("titan", ds.load_titan_seed), ("dgx", ds.load_dgx_seed), ("vtrain", ds.load_vtrain),
    ("nccl", ds.load_nccl_a100), ("h100", ds.load_h100_single), ("published", ds.load_published_runs),
])
def test_rows_are_counted_and_none_dropped_silently(report, name, loader):
    d = report.get(name)
    assert d.rows == len(loader())
    estimated = len(d.secondary.get("step time (s)", d.points))  # published: every estimated row has a step time
    if name == "nccl":
        assert d.compared == sum(r.size_bytes >= v.NCCL_MIN_BYTES for r in loader())
    else:
        assert estimated + sum(d.rejected.values()) == d.rows
    assert sum(k.n for k in d.by_kind.values()) == d.compared


def test_errors_are_consistent(report):
    for d in report.datasets:
        assert d.compared > 0, d.name
        assert 0 <= d.mape_pct <= d.max_ape_pct, d.name
        assert all(math.isfinite(p.predicted) and p.predicted > 0 for p in d.points), d.name
        assert d.max_ape_pct == pytest.approx(max(abs(p.error_pct) for p in d.points))
    h100 = report.get("h100")
    assert 0 <= h100.memory_mape_pct <= h100.memory_max_ape_pct


def test_rank_agreement_and_regret_are_well_formed(report):
    vt = report.get("vtrain")
    assert set(vt.spearman) == {"(gpus, d_model, n_layers)", "(model, gpus, global batch)"}
    for rk in vt.spearman.values():
        assert rk.groups > 0 and -1 <= rk.min_rho <= rk.mean_rho <= 1
    assert vt.extra["top1_groups"] > 0
    assert 0 <= vt.extra["top1_regret_mean_pct"] <= vt.extra["top1_regret_max_pct"]
    assert 0 <= vt.extra["top1_exact_fraction"] <= 1


def test_vtrain_splits_into_per_step_and_per_micro_batch_parts(report):
    # reference/vtrain/ground_truth_single.csv: within each (model, GPUs, TP, PP, micro-batch) group the
    # iteration times are a + b x (micro-batches per step) to floating-point precision (432 groups)
    vt = report.get("vtrain")
    assert vt.extra["line_groups"] == 432
    assert vt.extra["measured_line_residual_max_pct"] < 1e-9
    assert 0 < vt.extra["per_micro_batch_mape_pct"] < 100
    assert any("per-micro-batch time error" in n for n in vt.notes)
    # 3 micro-batch sizes per (model, GPUs, TP, PP): 3 pairs each. 64 pairs where the larger micro-batch
    # is faster per micro-batch (a separate fit of the raw CSV's lines counts the same), the worst
    # l24 h1024 TP=8: 30.8% slower at micro-batch 1 than at 4
    assert vt.extra["measured_mb_pairs"] == 432
    assert vt.extra["measured_mb_inversions"] == 64
    assert vt.extra["measured_mb_inversion_max_pct"] == pytest.approx(30.8, abs=0.1)


def test_micro_batch_inversions_are_pairs_with_less_time_for_more_work():
    from validation.validate import micro_batch_inversions

    slope = {("m", 8, 8, 1, 1): 0.12, ("m", 8, 8, 1, 2): 0.10, ("m", 8, 8, 1, 4): 0.15, ("m", 8, 4, 1, 1): 0.05}
    assert sorted(micro_batch_inversions(slope)) == [(pytest.approx(20.0), 8)]


def test_published_collective_sweeps_are_scored_from_the_fitted_range(report):
    # validation/data/published_collectives.yaml: NVIDIA's DGX H100 sample (15 of its 32 sizes from 1 MiB), the
    # 2x p4d EFA run (13 of 30) and the 2x A3 Mega run (14 of 31): 42 scored; Stas Bekman's all_reduce_bench.py
    # sweeps, 8x H200 (15 of 20) and 1x p6-b200 (15 of 20), with his 4..8-GPU points at 8 GiB (5 each), and 4x
    # p6-b200 (15 of 20): 55 more, 97 in all; the smaller sizes are reported, not scored
    col = report.get("collectives")
    assert (col.rows, col.compared) == (93 + 70, 42 + 55)
    assert col.by_kind["aws-p4d (16 GPUs)"].mape_pct < 10
    assert col.by_kind["gcp-a3-mega (16 GPUs)"].mape_pct < 15
    assert any("not scored" in n for n in col.notes)
    assert col.by_kind["dgx-h100 (8 GPUs)"].mape_pct < 10
    # the fits' reported errors (validation.fit_intra_node, validation.fit_collectives): within 12% at every point
    new = [p for p in col.points if p.kind.startswith(("dgx-h200", "aws-p6-b200"))]
    assert len(new) == 55 and max(abs(p.error_pct) for p in new) < 12
    assert col.by_kind["aws-p6-b200 (32 GPUs)"].n == 15 and col.by_kind["aws-p6-b200 (32 GPUs)"].mape_pct < 4


def test_spearman_and_regret_on_a_known_ordering():
    """Helpers on hand-made points: a perfect ranking has rho 1 and regret 0; a reversed one rho -1."""
    pts = [v.Point(label=str(i), kind="k", predicted=i + 1.0, measured=10.0 * (i + 1)) for i in range(4)]
    rev = [v.Point(label=str(i), kind="k", predicted=4.0 - i, measured=10.0 * (i + 1)) for i in range(4)]
    assert v.rank_agreement(pts, lambda p: 0).mean_rho == pytest.approx(1.0)
    assert v.rank_agreement(rev, lambda p: 0).mean_rho == pytest.approx(-1.0)
    assert v.top1_regrets(pts, lambda p: 0) == [0.0]
    assert v.top1_regrets(rev, lambda p: 0) == [pytest.approx(300.0)]  # picks the 40 s plan over the 10 s one


def test_seed_comparisons_are_all_checked_and_explained(report):
    titan, dgx = report.get("titan"), report.get("dgx")
    assert {(c.faster, c.slower) for c in titan.comparisons} == {
        ("titan_ddp_nvlink", "titan_dp_nvlink"), ("titan_dp_nvlink", "titan_ddp_pcie"), ("titan_ddp_nvlink", "titan_ddp_pcie")}
    assert {c.slower for c in dgx.comparisons} == {"dgx_gpt2large_ddp", "dgx_gpt2xl_ddp"}
    measured = {("titan_ddp_nvlink", "titan_ddp_pcie"): 131.4367 / 101.9003, ("dgx_gpt2xl_fsdp_sgo", "dgx_gpt2xl_ddp"): 1292 / 877}
    for c in titan.comparisons + dgx.comparisons:
        if (c.faster, c.slower) in measured:
            assert c.measured_ratio == pytest.approx(measured[(c.faster, c.slower)], rel=1e-3)  # the yaml's 4 digits
        assert c.agrees == (c.direction_ok and abs(c.ratio_error_pct) <= 100 * v.RATIO_TOLERANCE)
        # every verdict names the dominant breakdown terms of both sides
        assert c.slower in c.why and c.faster in c.why
        assert any(term in c.why for term in TIME_PARTS)


NOT_YET_MET = {  # goal -> what the model measured when the mark was set (2026-11-24)
    # 2026-11-25, issue 21: the recipes' speedups over BF16 come out right for tensorwise FP8 on H100 (x1.27-1.31 vs
    # 1.25-1.29) and within 12-15% for MXFP8/NVFP4; torchao's row-wise FP8 is predicted 8-24% fast (its CUTLASS
    # kernel has no microbenchmark: tensorwise's rate assumed) and async TP is not modelled (x1.23 vs 1.44)
    # 2026-11-25, FSDP2's unit copies and the root unit's exposed collectives (advisor/parallel/data.py): 44% -> 50%
    # 2026-11-29: the rows costed in the torchtitan they ran (nvfp4.md's GB200 rows in 0.3.0, whose chunked loss and
    # default SelectiveAC put the BF16 row at 176 GiB of its measured 174.5, 470 GiB before; the rest in torchtitan-0.2,
    # TP with SequenceParallel), and nvfp4.md's Qwen3 8B rows on the GB200 their memory implies: 22 speedups, 37 rows
    # 2026-11-29 (8): torchtitan's H100 rows on the GPU they name (meta-grand-teton-h100: 96 GB HBM2e at 2.4 TB/s, the
    # 500 W cap not modelled): the FP8 speedups on TP 8 fall under (async TP not modelled: -10..-18%), rowwise +7..+14%
    # 2026-11-29 (8), later: torchtitan's async TP costed (advisor.parallel.tensor async_share): its gain over vanilla TP
    # within 12% on the 7 pairs (MAPE 6.9%); the FP8 async-TP speedups over BF16 stay 7-16% under
    # 2026-11-29 (8), later: torchao's MXFP8 casts each tensor along each dimension in a kernel of its own (torchtitan's
    # engine.quantise_bytes, 6.0625 bytes an element): the MXFP8 speedups from +4..+13% to +1..+10%
    # 2026-11-30 (9): torchtitan's NVFP4 config functions keep the last ceil(0.15 L) layers in BF16 (engine.bf16_tail,
    # nvfp4_bf16_tail_fqns), not the first and last: its two NVFP4 speedups from +10.6/+14.9% to +5.1/+8.9%
    # 2026-11-30 (11): every stack costs its own default optimizer (torchtitan 0.2.2's "fused" step): 75% -> 70%
    # 2026-11-30 (13): torchtitan 0.2's FP8 TP gathers in e4m3/e5m2 under tensorwise scaling (torchao's
    # Float8ColwiseParallel; engine.tp_gathers_quantised): the TP-8 tensorwise rows from -10..-16% to -4..-14%
    "lowprec speedups within 10 %": "70% of 20 speedups (MAPE 8.1%, max 15.1%: fp8-rowwise +7..+15%, async TP 70B -14%)",
    # the BF16 baselines themselves are 39-111% fast on torchtitan's Llama 3 8B FSDP rows (44-123% before FSDP2's unit
    # copies): their compute, not their FSDP2 collectives (8B on 8 H100s: 0.05 s of FSDP work in a 1.7 s step)
    # torchtitan's H100s are 500 W parts (96 GB HBM2e, Grand Teton) and torchao's B200s power-limited (limit not stated):
    # their rows run 17-88% (H100) and 111-150% (B200) faster than predicted on the 700 W / 1000 W profiles, which no
    # microbenchmark of the capped parts corrects; the GB200 rows +5..+21%
    # 2026-11-29 (8): the Grand Teton rows on their 2.4 TB/s HBM2e: 14% -> 19% (MAPE 49% -> 42%), +0..+64%; then the
    # async-TP rows run async TP, faster still: 14% (MAPE 46%)
    # 2026-11-30 (13): with NCCL's SMs held beside the overlapped FSDP collectives, 8% -> 14% (MAPE 52% -> 48%)
    "lowprec tokens/s within 15 %": "11% of 37 rows (MAPE 48%; H100 500 W rows +14..+83%, torchao's H100 +47..+59%, "
                                    "power-limited B200 +117..+160%, H200 +26..+28%, GB200 +11..+24%)",
    # 2026-11-30 (11): torchtitan's mid-2024 A100 rows (docs/performance.md at 0413364) were 5-18% fast already; costed
    # with the stack's default optimizer, 0.2.2's fused AdamW, each step 5-43 ms shorter: MAPE 9.79% -> 10.04%
    # 2026-11-30 (13): met (7.2%): the SMs NCCL's thread blocks hold while FSDP's gathers and reduce-scatters run beside
    # the compute (advisor.comm.held_sms: 24 of the A100's 108 in a node, 16 across nodes)
    "lowprec GEMM rows within 15 %": "88% of 91 GEMM rows (MAPE 7.3%; B300 single-GEMM rows with their casts up to "
                                     "+39% (AttnOut BF16), torchao's H100 blockwise kernels 31% faster fprop, 2x "
                                     "slower wgrad than TE's rate)",
    # gb200-nvl72's NVLink fit (group_penalty 1.99, from 8 and 72 GPUs) runs a 2-GPU group at 0.5% of the link: the
    # TP=2 rows' TP collectives cost 87 s a step and the GB300 PP=4 rows' sends 5 s (the communication issue's)
    # after the merges (megatron-core costs the rows; gb200-nvl72's ring penalty from a ring): MAPE 11.6%, max 30%.
    # 2026-11-25 (helper bridge): the rows asked as they ran (CP as ring, 405B's uneven split, FSDP as ZeRO-3: 61 of 79
    # compared, 18 fine-tuning and 25.09 rows not) with TE's FP8 inputs kept quantised and the least recomputation
    # predicted to fit (the tables do not publish it): bias -18..-23% per recipe, 405B 20-39% slow (CP, recomputation)
    # 2026-11-28: costed in megatron-bridge-perf, the stack its performance recipes set (bf16 gradient reduction, FP8/FP4
    # weights; megatron-bridge 0.6.2 perf_recipes/_common.py): MAPE 21% -> 14%, and every row fits (the GB300 NVFP4
    # TP1 PP1 row, 424 GiB of bf16 weights and fp32 gradients before, 255 GiB now on 278 GiB)
    # 2026-11-28: Blackwell Ultra's GEMM rates from TE's B300 measurements (the B200's inferred level was 11% slow on
    # TE's own GEMMs), megatron-core's weights quantised once a step (TE's is_first_microbatch cache), the perf
    # recipes' NVFP4 without BF16 edge layers, TE's sequence-parallel all-gathers in the recipe's format and ring CP's
    # merge kernels: MAPE 14% -> 6.7% (the issue 15 goal, met), 36% -> 70% of rows within 10%
    # 2026-11-29: the recipes' expandable_segments allocator (1% fragmentation margin), the five SFT rows (full
    # fine-tuning, -6..+11%) and the five LoRA rows (adapters under TP and PP, -11..+1%): 70% of 71
    # 2026-11-29 (3): the recipes' userbuffers TP overlap costed (advisor.parallel.tensor overlap_share: each
    # sequence-parallel collective pipelined with its GEMM in tp chunks; the NVFP4 recipes turn it off): the TP > 1
    # FP8/MXFP8 rows move from -10..-15% to -1..+17% (Llama 3.1 405B on H100, TP 8 CP 2: +11..+17%; on GB200 TP 4:
    # +9..+11%): ideal pipelining hides more than the runs did, and no measurement of TE's ring-exchange GEMMs says by
    # how much; NVFP4 405B on GB200 (no overlap) -14..-22%
    # 2026-11-29 (4): without userbuffers, TE's linears run the backward's input re-gather beside dgrad and the input
    # gradient's reduce-scatter beside wgrad (tensor.backward_exposed): NVFP4 bias -10% -> -8%, 73% within 10%
    # 2026-11-29 (5): the SMs userbuffers' collectives take from the GEMMs they overlap (TE's defaults: a pipelined
    # reduce-scatter's GEMM on SMs - 16, a bulk collective holding 16 while it runs) and the backward's input re-gather:
    # the TP-overlapped rows from -1..+17% to -9..+10%, 77% within 10%
    # 2026-11-30 (14): the uneven split's last rank costed without the embedding it does not hold, each rank with its
    # collectives: the 405B rows +0.4..+0.8%, one MXFP8 row from +9.2% to +10.0%: 76% within 10%
    # 2026-11-30 (18): RoPE's fused kernel in megatron-core's tables (2 + 2 elements per rotated q/k element, which a
    # GPT layer's probe never ran): every Llama row 0.2-1% slower, 78% within 10% (MAPE 6.5%)
    # 2026-12-01 (19): Megatron's distributed optimizer waits for the embedding's bucket (reduce-scatter after the
    # backward, all-gather before the next forward): 77.5% -> 78.9%
    # 2026-12-01 (20): Llama 3 70B MXFP8 on GB300 (26.02.01), PP 4 with VP n/a, not costed: a value the table does not
    # give, costed as 1F1B with a 27% bubble (-32%) where that layout ran at VP 5 in the releases either side: 80% of 70
    # 2026-12-01 (21): Transformer Engine's fused cross-entropy, which the perf recipes run (perf_recipes/_common.py:68):
    # 80% -> 81.4% (MAPE 6.2% -> 6.0%; NVFP4's bias -8% -> -6%, MXFP8's +5% -> +7%)
    "bridge tokens/s within 10 %": "81% of 70 rows compared (MAPE 5.9%, max 18%; FP8 5%, MXFP8 7%, NVFP4 7% biased "
                                   "slow, the NVFP4 405B rows on GB200 -10..-18%; recomputation is the least that fits)",
    # 2026-11-25, issue 22: with litgpt's blocks counted from its source (stack_profiles/litgpt.yaml) every row is under:
    # FSDP rows (Fabric's full-state-dict load peak) -1..-11%, PEFT bloomz +7%, single-GPU LoRA -7..-28% and QLoRA
    # -14..-21%. The single-GPU LoRA rows land within 0-5% if every frozen linear kept its input, which torch's source
    # (2.1.0 and 2.13: mm's input saved only when the weight needs a gradient; tests/test_finetune.py) says it does not:
    # not adopted, not explained. Three fit verdicts are wrong from that shortfall: Llama 2 7B LoRA at micro-batch 4 and
    # Falcon-40B QLoRA (NF4, with and without double quantisation) on one A100-40GB ran out of memory, predicted 38-40 GB
    # 2026-11-29: explained by a probe of litgpt's own modules (saved_tensors_hooks, CPU; stack_profiles/litgpt.yaml):
    # SDPA's v is a view of the fused qkv output and keeps it alive, LoRAQKVLinear.zero_pad's index_copy keeps the B
    # output, Fabric casts the logits to fp32 (8 bytes a logit with the log-softmax). Single-GPU rows -5.7..+0.1%, every
    # verdict right (the goal met); the FSDP rows, whose peak sums Fabric's full-state-dict load with the training
    # peak, -8..+17% (phi-1.5 on 2 GPUs at micro-batch 4: the measured peak grows 0.2-0.4 GB a sample, the sum 0.65)
    # 2026-11-29 (6): met. While checkpointed blocks recompute, the loss's log-softmax is already freed (its backward runs
    # first): 4 bytes a logit held, not 8 (probed with saved-tensor hooks); FSDP rows -9.7..+9.3%, MAPE 2.7%
    # the dequantisation kernels of bitsandbytes 0.41.1 run at 27-58% of the speed the model gives them (HBM-bound: read
    # the packed weight and constants, write bf16, in forward and in backward): 7B adds 80-88 ms an iteration, 28 modelled
    # 2026-11-29: bitsandbytes 0.41.1, the tables' version, dequantises into fp16 and casts to bf16 in each pass (stack
    # litgpt-2023: advisor/adapters.py dequant_cast): 0.27-0.58x -> 0.70-1.50x; phi-1.5's nf4 row (+9 ms measured, its
    # double-quant row +15 ms) is the 1.5, Llama 2 13B's 0.70-0.74
    "finetune QLoRA-over-LoRA time max error %": "50% (predicted 0.70-1.50x of what QLoRA adds)",
    # 2026-11-25, issue 17: 18 rows (newest release per model, system, precision) in megatron-deepspeed's kernels with
    # Megatron-Core's grouped GEMMs; FP8 (H100) 17%, MXFP8 28% (GB300 21% and GB200 25% slow: their all-to-alls and
    # pipeline sends are costed exposed; B200 42%), BF16 GPT-OSS 41% fast: the router's kernels, an MoE layer's host
    # work and device syncs, HybridEP/DeepEP dispatch and batch-level all-to-all overlap are not costed, and MXFP8 and
    # FP8 run as one fp8-mixed recipe. 2026-11-25 (helper bridge): FP8 as fp8-tensorwise and MXFP8 as mxfp8 (their
    # quantisation kernels costed): FP8 17% -> 25%, MXFP8 25% -> 26%, both biased slow
    # 2026-11-29: DGX-B200 on its own profile (dgx-b200: InfiniBand, not p6-b200's EFA fit): DeepSeek-V3's EP 32 over
    # 4 nodes -61% (its all-to-alls 63% of the step: pairwise, where HybridEP sends a token once per node)
    # 2026-11-29 (3): each 26.08 row's dispatcher and all-to-all overlap as megatron-bridge 0.6.2's recipe sets them
    # (HybridEP's flex dispatcher, --overlap-moe-expert-parallel-comm: advisor.parallel.expert), the recipes' pipeline
    # splits (Qwen3-235B's account_for_*_in_pipeline_split; DeepSeek-V3's and Kimi-K2's layouts, chunks of
    # ceil(61 / (pp vp)): interleaved, no longer 1F1B), costed in megatron-bridge-perf (every MoE perf recipe ends in
    # _benchmark_common's bf16 gradient reduction): the 8 rows of 26.08, the release 0.6.2's recipes are, MAPE 9.8%
    # (-15..+28%: GPT-OSS +18/+28% once its all-to-alls hide); older releases' rows, run by recipes 0.6.2 does not hold,
    # take the providers' defaults: GPT-OSS BF16 (26.04.01) +40..+53%, DeepSeek-V3 on B200 (26.04.01, EP 32 across 4
    # nodes pairwise) -60%, Qwen3-235B on H100/B200 -24/+42%
    # 2026-11-29 (4): the routed activations are kept under selective recomputation too (Megatron's core attention
    # reruns none of them), megatron-core keeps no expert output (the probabilities are applied inside the experts)
    # and the first grouped GEMM's input in the recipe's format. --recompute-modules is costed (the 26.08 DeepSeek-V3
    # GB200 row runs its recipe's mla_up_proj), but the 26.04.01 rows' recipes, which 0.6.2 does not hold, are not known:
    # DeepSeek-V3 on B200 and GPT-OSS BF16 on B200 fit there only under full recomputation (-72%, +26%)
    # 2026-11-29 (6): the flex dispatcher hands tokens over grouped by expert (no sort_chunks_by_idxs: 26.08 rows 8.9% ->
    # 12.0%, the GB200/GB300 flex rows faster) and its HybridEP kernels hold 32 SMs beside the compute they overlap
    # (-> 9.2%; Qwen3-30B-A3B on GB300 +0.9%, GB200 +5.3%)
    # 2026-11-29 (6), later: the last backward's exposed all-to-alls hide the gradient reduction too (a monotonicity fix):
    # GPT-OSS BF16 on B200 +26% -> +28%
    # 2026-11-29 (7): the 26.06 rows take the recipes of megatron-bridge 0.6.0, the wheel of the 26.06 stack (they agree
    # with 0.6.2's): Qwen3-30B-A3B on two H100 nodes runs HybridEP's flex dispatcher there, -17% -> +50% (its all-to-alls
    # 20 s a step pairwise, 5 s sent once a node as DeepEP's design does; the measured step leaves ~14 s for them)
    # 2026-11-30 (14): where pp x v does not divide the layers, the first and the last pipeline rank each costed whole
    # (the layout's short last chunk: DeepSeek-V3's and Kimi-K2's 16 chunks of 4, the last of 1) and the slower taken:
    # Kimi-K2 on GB300 -7% -> +4% (its first rank's 16 layers with their all-to-alls), DeepSeek-V3 on GB300 -14% -> -9%,
    # on GB200 -2% -> +8%
    # 2026-11-30 (16): GPT-OSS's clamp and expert bias as megatron-core runs them without TE's op fuser (the BF16 recipes;
    # stack_profiles/megatron-core.yaml routed_unfused): BF16 41% -> 28% (GB200 +54% -> +38%, GB300 +41% -> +26%,
    # H100 +44% -> +32%; B200 +56% -> +15%, where the clamp's copies leave only full recomputation fitting)
    # 2026-11-30 (18): RoPE in megatron-core's tables (fused: 2 + 2 elements per rotated q/k element), and GPT-OSS's
    # YaRN RoPE unfused (mscale 1.347: 12 + 13, rope_utils.py): BF16 28% -> 24% (GB200 +34%, H100 +29%, GB300 +22%,
    # B200 +12%), GPT-OSS MXFP8 on GB200 +29% -> +23%, GB300 +20% -> +14%; 26.08 rows 9.7% -> 8.0%
    # 2026-11-30 (MLA): multi-head latent attention's own element-wise kernels (fused_mla_yarn_rope_apply.py, the latent
    # norms and copies: stack_profiles/megatron-core.yaml kernels.latent) in place of the tables' q/k/v layout copies
    # (a half of their bytes forward, a quarter backward), mla_up_proj rerunning them, the attention output kept at
    # heads x d_v and the latents kept: DeepSeek-V3 GB300 -9.4% -> -5.7%, GB200 +8.2% -> +11.1%, Kimi-K2 GB300 +4.5% ->
    # +5.8%, B200 -70.6% -> -70.4%; 26.08 rows 8.0% -> 7.9%
    # 2026-12-01 (19): DeepSeek-V3's MTP depth as its recipes train it (GB300 -5.7% -> -9.8%, GB200 +11.1% -> +2.0%), and
    # the distributed optimizer's edge bucket: 26.08 rows 7.9% -> 7.2%
    # 2026-12-01 (20): FP8 attention on the 7 rows whose recipes set fp8_dot_product_attention (at FlashAttention-3's
    # FP8-to-BF16 share of peak): DeepSeek-V3 GB300 -10.0% -> -6.9%, Qwen3-235B GB300/GB200 -3/-2% -> +1%, but GPT-OSS
    # MXFP8 GB300 +13% -> +17%, GB200 +22% -> +26%, Qwen3-30B-A3B GB300 0% -> +6%, GB200 +4.5% -> +10%; 26.08 rows
    # 7.2% -> 8.8%
    # 2026-12-01 (21): the perf recipes' loss as it runs, Transformer Engine's fused cross-entropy (10 bytes a logit, not
    # the native 52; 2 held, not 8): every row faster, so the over-predicted ones more so (GPT-OSS +17..+34% ->
    # +14..+43%, Qwen3-30B-A3B +6..+10% -> +12..+16%); 26.08 rows 8.8% -> 13.4%. GPT-OSS's attention backend checked
    # (cuDNN's fused, as costed): the MoE rows' excess is not there
    "bridge-moe tokens/s MAPE %": "24.5% (max 70%; 26.08 rows 13.4%, MXFP8 20%, FP8 38%, BF16 30%) in megatron-bridge-perf",
    # 2026-11-25, issue 17: 4 of 18 published plans in the top 5 (GPT-OSS on GB200 and GB300, MXFP8 and BF16). The
    # model ranks ZeRO-2/3 (Megatron-FSDP) with EP and no pipeline ahead of the published pipelines with the
    # distributed optimizer (DeepSeek-V3 on GB200: 12.8 s vs 16.7 s a step), and Qwen3-30B-A3B on 8 GPUs ZeRO-3 without
    # EP (its all-to-alls cost a third of a step where the gathers hide): the pipeline sends and all-to-alls Megatron
    # overlaps are costed exposed
    # 2026-11-29 (3): searched with the row's dispatcher and overlap: 4 of 18 (GPT-OSS and Qwen3-30B-A3B on GB200/GB300)
    # 2026-11-29 (6): with HybridEP's SMs costed beside the batch overlap's compute, EP 8 loses to EP 2-4 on Qwen3-30B-A3B
    # (less to send, so fewer SMs held for less time), and GPT-OSS on GB200's EP 64 falls just below eight plans of EP
    # 4-32 within 1.3% of each other: 1 of 18 (3 without the SMs)
    # 2026-11-29 (7): Megatron-FSDP with EP and no pipeline, which the search ranks first for the 256-GPU models, is a
    # layout NVIDIA runs too: megatron-bridge 0.6.2's deepseek_v3_pretrain_64gpu_gb300_*_fsdp_config (optim_grads_params,
    # EP 64, TP 1, PP 1); its DeepSeek-V4 Flash recipes (the 26.08 tables' 128-GPU rows) run EP 32 with no pipeline
    # 2026-11-30 (13): NCCL's SMs held beside the overlapped data-parallel collectives (the ZeRO-3 plans' per
    # micro-batch gathers run beside most of the step): 3 of 18
    # 2026-11-30 (14): the first and last pipeline ranks costed apart: 4 of 18 (GPT-OSS BF16 on H100 first)
    # 2026-11-30 (16): GPT-OSS's unfused clamp and expert bias (megatron-core, BF16): 3 of 18; GPT-OSS BF16 on H100's
    # published TP 1 PP 4 EP 8 now 13% behind a CP 2 interleaved PP 4 plan, among near-ties (+0.2..+2.5%)
    # 2026-12-01 (21): Qwen3-30B-A3B on GB200 from 5th to 6th (Transformer Engine's cheaper loss moves its near-tied
    # rows): 3 -> 2 of 18
    "bridge-moe published plan in top 5 %": "11% (2 of 18): the search ranks Megatron-FSDP with less EP and no pipeline "
                                            "ahead of the published layouts (DeepSeek-V3, Kimi-K2, Qwen3 pipelines)",
    "vtrain top-1 regret max %": "18% (mean 3.6%): TP=1 micro-batch 2 vs TP=2 micro-batch 4 and TP=1 micro-batch 1 vs "
                                 "TP=2 micro-batch 2 are measured 8-18% apart in the direction the model ranks the other way",
    # 2026-11-25, issue 19 made the SC21 ZeRO-3 rows compute-bound (+154%, max 299%); issue 15 costs DeepSpeed 0.3.13's
    # calls one by one from its source (per-tensor gathers and reduce-scatters, a device sync per fetch, prefetch only
    # under 1e9 live elements, host ops per rank of torch's list-form collectives): ZeRO-3 rows MAPE 14%, bias -2%;
    # the 175B row at 1,536 GPUs is predicted 35% slow (the per-rank host ops), 2,240 GPUs 14% slow, 640 GPUs 17% fast.
    # 2026-11-30 (14): the host's per-rank slicing in each DeepSpeed call holds no SMs, its collective alone: 13% -> 14%
    "published TFLOP/s max APE %": "34% (ZeRO-3 rows MAPE 14%, bias -1%: 175B at 1,536 GPUs -34%; 3D, TP and DP rows within 6%)",
    # 2026-12-01 (helper s1): the misses by cause in validate's notes; NCCL's tree on 2 domains (A3 Mega 64 MiB)
    "multinode max APE % (>= 64 MiB)": "53% (166 of 186 points within 15%): 11 where two sweeps of one system differ "
                                       "by more than 15% (p5's EKS excerpt, NCCL 2.18, 1.4-2.2x the README's time; "
                                       "dstack's A3 High all-gather >= 1.4x cluster-toolkit's), 4 at dips of a sweep's "
                                       "own busbw (p5's all-gathers at 16 MiB a rank), 5 the model's (GB200's 2-rack "
                                       "all-reduce +16..+21%: NVLS in the rack not modelled)",
    "multinode AG/AR ratio max error %": "29% (43 of 52 within 15%): dstack's A3 High all-gather against another run's "
                                         "all-reduce, and p5's all-gather dips at 256 MiB-1 GiB",
}


def test_a100_collectives_from_a_second_node_and_nccl(report):
    """validation/data/aiconfigurator_nccl_a100.csv (NCCL 2.27.3, 2/4/8 A100-SXM4-80GB, half): from 8 MiB the
    all-reduce agrees with the dgx-a100 link fitted to the vTrain node's sweep within 3% on average at every GPU
    count; all-gather, reduce-scatter and all-to-all, never fitted, within 20% (2-GPU all-gather is the worst:
    the model is 14% fast there on average)."""
    d = report.get("a100-collectives")
    assert (d.rows, d.compared) == (252, 84)
    for kind, e in d.by_kind.items():
        assert e.mape_pct < (3.0 if kind.startswith("all_reduce") else 20.0), kind


def test_a100_gemm_rate_is_the_h100_fit_carried_by_one_measured_ratio(report):
    """validation/data/aiconfigurator_gemm.csv: one harness timed the same fp16 GEMMs on an A100 and an H100; per
    shape >= 1e10 FLOPs the A100 reaches 1.0435x the H100's fraction of peak (median of 966). The A100 profiles'
    half-precision matmul_max is the dgx-h100 fit times that median; the ratio leaves a small per-shape spread
    (MAPE < 6% from 1e11 FLOPs), and both profiles sit from that harness by the same rate gap (within 2 points)."""
    from advisor.hardware import load_hardware
    from validation.validate_kernels import gemm_efficiency_ratio

    med, lo, hi, shapes = gemm_efficiency_ratio()
    assert shapes == 966 and med == pytest.approx(1.0435, abs=5e-4) and lo < med < hi
    h100 = load_hardware("dgx-h100").efficiency.matmul_max
    for prof in ("dgx-a100", "aws-p4d"):
        mx = load_hardware(prof).efficiency.matmul_max
        for math_ in ("bf16", "fp16"):
            assert mx[math_] == pytest.approx(round(h100[math_] * med, 3), abs=1e-9), (prof, math_)
    d = report.get("gemm")
    assert d.by_kind["1e11-1e12 FLOPs"].mape_pct < 6 and d.by_kind[">= 1e12 FLOPs"].mape_pct < 6
    gap_a100, gap_h100 = d.extra["a100_profile_median_error_without_fixed_pct"], d.extra["h100_profile_median_error_without_fixed_pct"]
    assert abs(gap_a100 - gap_h100) < 2.0


@pytest.mark.parametrize("gpu, profile, median, quartiles", [
    # `python -m validation.validate_kernels` (aiconfigurator 0.4.0: B200 trtllm 1.0.0rc6, H200 and H100 1.0.0rc3, fp16
    # torch_flow): on the same 966 shapes >= 1e10 FLOPs the B200 reaches 0.8415x the H100's fraction of peak
    # (quartiles 0.7911..0.8903), the H200 1.0020x (0.9892..1.0175: the same compute)
    ("b200", "aws-p6-b200", 0.8415, (0.7911, 0.8903)),
    ("h200", "dgx-h200", 1.0020, (0.9892, 1.0175)),
])
def test_b200_and_h200_gemm_rates_are_the_h100_fit_carried_by_their_ratio(report, gpu, profile, median, quartiles):
    from advisor.hardware import load_hardware
    from validation.validate_kernels import gemm_efficiency_ratio

    med, lo, hi, shapes = gemm_efficiency_ratio(gpu)
    assert shapes == 966 and med == pytest.approx(median, abs=5e-5)  # pinned to the printed 4 decimals
    assert (lo, hi) == pytest.approx(quartiles, abs=5e-5)
    h100 = load_hardware("dgx-h100").efficiency.matmul_max
    mx = load_hardware(profile).efficiency.matmul_max
    for math_ in ("bf16", "fp16", "fp8"):  # fp8 assumed to behave as bf16, as dgx-h100 assumes
        assert mx[math_] == pytest.approx(round(h100["bf16"] * med, 3), abs=1e-9), math_
    d = report.get("gemm")
    assert d.extra[f"{gpu}_over_h100_efficiency_median"] == med and d.extra[f"{gpu}_ratio_shapes"] == 966
    # without the fixed time per kernel (the H100 per-call harness's) the profile sits from this harness by about the
    # H100's rate gap (12.3%): B200 14.0%, H200 12.0%
    assert abs(d.extra[f"{gpu}_profile_median_error_without_fixed_pct"] - d.extra["h100_profile_median_error_without_fixed_pct"]) < 2.0


@pytest.mark.parametrize("goal", [
    pytest.param(g, marks=pytest.mark.xfail(strict=True, reason=f"not yet met: {NOT_YET_MET[g]}")) if g in NOT_YET_MET else g
    for g in v.GOALS
])
def test_accuracy_goal(report, goal):
    value, threshold, met = report.goals()[goal]
    assert met, f"{goal}: {value:.3g}, goal {'<=' if v.GOALS[goal].sense == 'max' else '>='} {threshold}"


# --- CLI ------------------------------------------------------------------------------------------------
SMALL = ["--dataset", "titan", "--dataset", "dgx", "--dataset", "h100"]


def test_cli_prints_a_table_per_dataset():
    res = CliRunner().invoke(validate_command, SMALL)
    assert res.exit_code == 0, res.output
    for name in ("== titan", "== dgx", "== h100", "goals:", "MAPE", "faster than"):
        assert name in res.output


def test_cli_json_parses():
    res = CliRunner().invoke(validate_command, SMALL + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [d["name"] for d in doc["datasets"]] == ["titan", "dgx", "h100"]
    assert {"value", "threshold", "met"} <= set(doc["goals"]["titan seed comparisons agree"])
    assert doc["datasets"][0]["comparisons"][0]["why"]


def test_cli_plot_writes_readable_pngs(tmp_path):
    import matplotlib.image as mpimg

    res = CliRunner().invoke(validate_command, SMALL + ["--plot", str(tmp_path / "figs")])
    assert res.exit_code == 0, res.output
    pngs = sorted((tmp_path / "figs").glob("*.png"))
    assert {p.name for p in pngs} == {"predicted_vs_measured.png", "error_by_kind.png", "seed_breakdown.png"}
    for p in pngs:
        assert p.stat().st_size > 10_000, p
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200


def test_cli_plot_refuses_what_cannot_be_a_folder_before_the_run(tmp_path):
    """A --plot that exists and is not a directory (a file, /dev/null: a review found FileExistsError) is one line."""
    (tmp_path / "f").write_text("")
    for target in (tmp_path / "f", "/dev/null", tmp_path / "f" / "below"):
        res = CliRunner().invoke(validate_command, ["--dataset", "titan", "--plot", str(target)])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output  # click's own refusal for a file
        assert "give a directory" in res.output or "is a file" in res.output, res.output


def test_advisor_import_stays_light():
    """`advisor --help` must not pay for the validation stack (scipy, matplotlib, the datasets)."""
    code = "import sys, advisor.cli; print(sorted(m for m in ('validation', 'scipy', 'matplotlib') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def test_cli_offers_every_dataset():
    """`advisor validate --dataset` lists its choices without importing validation (kept light): same names."""
    from validation.cli import DATASETS
    from validation.validate import VALIDATORS

    assert sorted(DATASETS) == sorted(VALIDATORS)


def test_lowprec_rows_take_the_torchtitan_of_their_torch():
    """torch before 2.9 has no fused CUDA rms_norm (the wheels' ATen headers: _fused_rms_norm_cuda_dispatch.h first in
    2.9.0): the torchao/torchtitan rows of earlier torch are costed in torchtitan-0.1, later ones in torchtitan-0.2,
    nvfp4.md's (torchtitan 0.3.0 configs) in torchtitan."""
    from validation.lowprec import _torch_2_9, e2e_kwargs, load_lowprec

    assert _torch_2_9("2.9.0.dev20250815+cu128") and _torch_2_9("2.14.0a0+gitd9abf9e") and _torch_2_9("2.10.0")
    assert not _torch_2_9("2.7.0a0+gitb98af95") and not _torch_2_9("2.8.0a0+5228986c39 (NGC 25.05)")
    assert not _torch_2_9("1963fc83a1c32e162162e2414f78b043f0674bae (2024/12/23)") and not _torch_2_9("None")
    stacks = {}
    for r in load_lowprec():
        kw = e2e_kwargs(r) if r.get("kind") != "gemm" and r.get("parallelism") else None
        if kw:
            stacks[r["id"]] = kw["stack"]
    assert stacks["tt-h100-l8b-8gpu-bf16-eager"] == "torchtitan-0.1"  # Dec 2024's nightly
    assert stacks["ao-b200-l8b-bf16"] == "torchtitan-0.2"  # torch 2.9.0.dev20250815
    assert stacks["tt-gb200-l8b-bf16"] == "torchtitan"


def test_an_empty_plot_directory_is_refused():
    """--plot "" was Path(""), the working directory: the figures landed wherever the command ran."""
    res = CliRunner().invoke(validate_command, ["--dataset", "titan", "--plot", ""])
    assert res.exit_code == 2 and "--plot needs a directory name" in res.output


def test_json_has_a_schema_and_the_rows_on_request():
    res = CliRunner().invoke(validate_command, ["--dataset", "titan", "--json", "--points"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["schema"] == 1 and set(doc) == {"schema", "datasets", "wall_s", "goals", "figures"}
    rows = doc["datasets"][0]["points"]
    assert len(rows) == doc["datasets"][0]["compared"] == 3 and {"label", "kind", "predicted", "measured"} <= set(rows[0])
    assert "points" not in json.loads(CliRunner().invoke(validate_command, ["--dataset", "titan", "--json"]).output)["datasets"][0]
