"""Estimates: API/CLI agreement, ZeRO paper memory accounting, invariants, published anchors."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from advisor import estimate
from advisor.api import PlanError
from advisor.cli import cli
from advisor.model import ModelSpec

JSON_KEYS = {"params", "step_time_s", "tokens_per_s", "mfu", "fits", "memory", "breakdown"}


def test_issue_example_json_matches_api():
    args = ["estimate", "--model", "gpt2-xl", "--hw", "dgx-h100", "--gpus", "1", "--micro-batch", "4", "--seq", "1024",
            "--precision", "bf16-mixed", "--attention", "sdpa", "--recompute", "none", "--optimizer", "adamw", "--json"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert JSON_KEYS <= set(data)
    assert data["params"] == 1_557_611_200
    api = estimate(model="gpt2-xl", hw="dgx-h100", gpus=1, micro_batch=4, seq=1024, precision="bf16-mixed",
                   optimizer="adamw")
    assert api.model_dump() == data


def test_step_time_is_sum_of_parts():
    e = estimate(model="llama2-7b", hw="dgx-a100", gpus=32, tp=4, pp=2, micro_batch=1, global_batch=64, seq=2048, recompute="full")
    assert e.step_time_s == pytest.approx(sum(e.breakdown.values()))
    assert e.memory.peak_bytes == pytest.approx(sum(e.memory.parts.values()))


@pytest.mark.parametrize("zero,expected_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_model_states(zero, expected_gb):
    # ZeRO paper (arXiv 1910.02054) Figure 1: Psi = 7.5B parameters, Nd = 64 GPUs, K = 12 (mixed-precision
    # Adam): 120 GB, 31.4 GB, 16.6 GB, 1.9 GB of model states per GPU. A 7.46B GPT stands in for Psi and
    # the states are scaled to 7.5B; grad_accum=2 keeps the gradients alive through the step. The stack keeps the
    # paper's 2-byte gradients (megatron-core, auto's stack for this model, keeps fp32 main gradients: 18 bytes)
    m = ModelSpec(name="psi", n_layers=36, d_model=4096, n_heads=32, d_ff=16384, vocab=50257, max_positions=2048)
    # the paper's own implementation: DeepSpeed (fp16 gradients; megatron-core keeps fp32 main grads, K = 14)
    e = estimate(model=m, hw="dgx-a100", gpus=64, zero=zero, micro_batch=1, grad_accum=2, seq=1, precision="bf16-mixed",
                 stack="deepspeed")
    p = e.memory.parts
    states = p["weights"] + p["gradients"] + p["optimizer_states"]
    assert states / m.n_params * 7.5e9 / 1e9 == pytest.approx(expected_gb, rel=0.02)  # the paper rounds to 0.1 GB


@pytest.mark.parametrize("kw", [
    dict(gpus=8, tp=3), dict(gpus=8, dp=3), dict(gpus=16, tp=16), dict(gpus=8, pp=2, zero=3),
    dict(gpus=8, micro_batch=3, global_batch=16), dict(gpus=4, dp=4, data_parallel="dp", zero=1),
])
def test_invalid_plans_give_one_line_reason(kw):
    with pytest.raises(PlanError) as exc:
        estimate(model="gpt2-xl", hw="dgx-a100", **kw)
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 300


def _peak(**kw):
    return estimate(model="llama2-13b", hw="dgx-a100", micro_batch=1, seq=2048, **kw).memory.peak_bytes


@pytest.mark.parametrize("gpus", [8, 16, 64])
def test_memory_never_grows_with_zero_stage(gpus):
    peaks = [_peak(gpus=gpus, zero=z) for z in range(4)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(peaks, peaks[1:])), peaks


def test_memory_never_grows_with_tp_or_pp():
    tps = [_peak(gpus=8, tp=t) for t in (1, 2, 4, 8)]
    assert all(b <= a for a, b in zip(tps, tps[1:])), tps
    pps = [_peak(gpus=8, pp=p, grad_accum=8) for p in (1, 2, 4, 8)]
    assert all(b <= a for a, b in zip(pps, pps[1:])), pps


def test_dp_vs_ddp_and_nvlink_direction():
    # Seed 001: 2x Titan RTX, gpt2, batch 4 per GPU: DDP with NVLink < DP < DDP without NVLink.
    kw = dict(model="gpt2", gpus=2, micro_batch=4, seq=1024, precision="fp32")
    ddp_nv = estimate(hw="titan-rtx-nvlink", **kw).step_time_s
    ddp_pcie = estimate(hw="titan-rtx-pcie", **kw).step_time_s
    dp_nv = estimate(hw="titan-rtx-nvlink", data_parallel="dp", **kw).step_time_s
    assert ddp_nv < dp_nv < ddp_pcie


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 48), heads=st.sampled_from([8, 16, 32]), dh=st.sampled_from([32, 64, 128]),
       mb=st.integers(1, 8), seq=st.sampled_from([128, 512, 2048]), gpus=st.sampled_from([1, 2, 8, 16]),
       zero=st.integers(0, 3), rc=st.sampled_from(["none", "selective", "full"]),
       prec=st.sampled_from(["fp32", "bf16-mixed", "fp16-mixed", "bf16"]))
def test_estimates_finite_positive(layers, heads, dh, mb, seq, gpus, zero, rc, prec):
    m = ModelSpec(name="g", n_layers=layers, d_model=heads * dh, n_heads=heads, d_ff=4 * heads * dh, vocab=32000, max_positions=4096)
    e = estimate(model=m, hw="dgx-a100", gpus=gpus, zero=zero if gpus > 1 else 0, micro_batch=mb, seq=seq, recompute=rc, precision=prec)
    assert np.isfinite(e.step_time_s) and e.step_time_s > 0
    assert all(v >= 0 and np.isfinite(v) for v in e.breakdown.values())
    assert e.memory.peak_bytes > 0 and 0 < e.mfu < 1


def _workload(model, hw="dgx-a100", stack="megatron-deepspeed", **setup):
    """The shared part of an evaluation, for the unit tests of one dimension or kernel model."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    setup = {"seq_len": 1024, "precision": "fp16-mixed", "attention": "eager", **setup}
    return Workload.of(load_model(model), load_hardware(hw), load_stack(stack), TrainingSetup(**setup))


def test_megatron_cross_entropy_moves_52_bytes_per_logit_under_fp16():
    # megatron/core/tensor_parallel/cross_entropy.py on logits.float(): upcast 6, max 4, sub_ 8, exp 8, sum 4,
    # div_ 8 forward; mul_ 8 and the cast back 6 backward = 52 bytes per logit; HF's log-softmax path 32
    from advisor.compute import head_times, mem_time

    m = ModelSpec(name="aligned", n_layers=2, d_model=512, n_heads=8, d_ff=2048, vocab=50304, max_positions=1024)
    w = {stack: _workload(m, stack=stack) for stack in ("megatron-deepspeed", "hf-trainer")}
    total = {stack: head_times(wl, 8 * 1024, 1) for stack, wl in w.items()}
    extra = sum(float(t.fwd_s + t.bwd_s) * (1 if stack == "megatron-deepspeed" else -1) for stack, t in total.items())
    assert extra == pytest.approx(float(mem_time(w["hf-trainer"].hw, 8 * 1024 * 50304 * (52 - 32))), rel=1e-6)


def test_host_time_per_micro_batch_includes_the_head_ops():
    # validation/data/host_overhead.json "-head" rows: megatron-core's GPTModel issues 44 + 27 aten ops
    # outside its layers per micro-batch (embedding, final norm, output layer, vocab-parallel loss)
    from advisor.host import head_host_time, op_costs

    w = _workload("gpt2")
    per_op = op_costs(w)[0]
    assert (w.tables.head_forward_ops, w.tables.head_backward_ops) == (44, 27)
    assert per_op == pytest.approx((8.6 + w.hw.efficiency.kernel_launch_us) * 1e-6)
    assert head_host_time(w, 1) == pytest.approx(71 * per_op + 3 * (w.hw.efficiency.matmul_host_us * 1e-6 - per_op))


def test_pipeline_bubble_does_not_repeat_the_last_stages_head():
    # 1F1B with stage times t_i takes sum(t_i) + (m-1) max(t_i): fill and drain cross the layer-only stages,
    # so the logits and loss on the last stage do not enter the bubble. Two models that differ only in
    # vocabulary (GPT-2's 50,257 vs 512) have the same bubble, though their step times differ.
    big = ModelSpec(name="big-vocab", n_layers=12, d_model=768, n_heads=12, d_ff=3072, vocab=50257, max_positions=1024)
    small = big.model_copy(update={"name": "small-vocab", "vocab": 512})
    kw = dict(hw="dgx-a100", gpus=4, pp=4, micro_batch=8, global_batch=64, seq=1024, precision="bf16-mixed",
              stack="megatron-deepspeed")
    eb, es = estimate(model=big, **kw), estimate(model=small, **kw)
    assert eb.breakdown["pipeline_bubble"] == pytest.approx(es.breakdown["pipeline_bubble"], rel=1e-9)
    assert eb.breakdown["pipeline_bubble"] > 0
    assert eb.step_time_s > 1.05 * es.step_time_s


def test_tp_without_sequence_parallel_repeats_layernorm_and_dropout_traffic():
    # Megatron, GPT d=1024, d_ff=4096, fp16: per token, GELU 2f + q/k/v copies 2(q+2kv) + core merge 2q =
    # 16,384 elements split by TP; 2 LayerNorms 4h + 2 bias-dropout-adds 7h = 11,264 on every TP rank
    # unless sequence parallel (Korthikanti et al. 2022 s.4.2.2). 2 bytes each, backward twice forward.
    t = _workload("gpt2-medium").tables

    def per_token(tp, sp):
        return [float(t.elementwise_forward.per_gpu(tp, sp)), float(t.elementwise_backward.per_gpu(tp, sp))]

    assert per_token(1, False) == [2 * 27648, 4 * 27648]
    assert per_token(8, False) == [2 * (2048 + 11264), 4 * (2048 + 11264)]
    assert per_token(8, True) == [2 * 27648 / 8, 4 * 27648 / 8]


def test_tp_comm_counts_layer_and_head_collectives():
    # Megatron, no SP, full recompute: 2 all-reduces per layer forward, 2 backward, 2 recomputed; outside
    # the layers the embedding output and the LM head's input gradient (tokens x h) and the vocab-parallel
    # cross-entropy's three fp32 per-token all-reduces (megatron-core tensor_parallel/cross_entropy.py).
    from advisor import comm
    from advisor.comm import Collective
    from advisor.hardware import load_hardware

    hw = load_hardware("dgx-a100")
    e = estimate(model="gpt2", hw="dgx-a100", gpus=2, tp=2, micro_batch=2, global_batch=2, seq=1024,
                 precision="fp16-mixed", attention="eager", recompute="full", stack="megatron-deepspeed")
    tokens = 2 * 1024
    ar = float(comm.collective_time(Collective.all_reduce, 2, tokens * 768 * 2.0, hw, 2))
    ce = float(comm.collective_time(Collective.all_reduce, 2, tokens * 4.0, hw, 2))
    assert e.breakdown["comm/tp"] == pytest.approx((12 * 6 + 2) * ar + 3 * ce, rel=1e-9)


def _layer(w, tokens, recompute="full"):
    """(one layer's GPU times, its host times, the head's GPU times, the head's host time) at tp 1."""
    from advisor.compute import head_times, layer_times
    from advisor.host import head_host_time, layer_host_times
    from advisor.training import Recompute

    code = Recompute(recompute).code
    return (layer_times(w, tokens, 1, False, code), layer_host_times(w, 1, code), head_times(w, tokens, 1),
            float(head_host_time(w, 1)))


def test_pipeline_phases_start_and_end_drained():
    # megatron-core p2p_communication (batch_p2p_sync, default on) calls torch.cuda.synchronize() after
    # every stage exchange: a host-bound forward cannot hide behind a GPU-bound backward. gpt2-medium,
    # micro-batch 2 on A100: the host issues a layer's forward slower than the GPU runs it, but the whole
    # micro-batch (with the backward) is GPU-bound; the drained phases still leave the GPU idle.
    w = _workload("gpt2-medium")
    lt, ht, head, head_host = _layer(w, 2 * 1024)
    layers = w.model.n_layers / 2
    host = layers * float(ht.total_s) + head_host
    gpu = layers * float(lt.fwd_s + lt.bwd_s + lt.recompute_s) + float(head.fwd_s + head.bwd_s)
    assert float(ht.fwd_s) > float(lt.fwd_s) and host < gpu
    kw = dict(model="gpt2-medium", hw="dgx-a100", gpus=2, micro_batch=2, global_batch=16, seq=1024,
              precision="fp16-mixed", attention="eager", recompute="full", stack="megatron-deepspeed")
    assert estimate(pp=2, **kw).breakdown["host_overhead"] > 0.01


def test_host_bound_forward_ends_with_the_heads_gpu_time():
    # The forward ends with the LM head and the loss: few ops, much GPU work. The GPU can start them only
    # once the host has issued every layer before them, and the forward is drained before the backward
    # (DeepSpeed 0.9.5's loss .item(), Megatron's timers): a host-bound micro-batch cannot hide the head's GPU
    # forward GPU time behind the host's issuing. gpt2-medium shape, micro-batch 1, fp16, full recompute, one A100:
    # the layers are host-bound. Two vocabularies: the step grows by at least the head's extra forward GPU time
    # (its backward may hide behind the host-bound backward).
    from advisor.compute import head_times

    w = _workload("gpt2-medium")
    lt, ht, _, _ = _layer(w, 1024)
    assert float(ht.fwd_s) > float(lt.fwd_s) and float(ht.bwd_s + ht.recompute_s) > float(lt.bwd_s + lt.recompute_s)
    small = ModelSpec(name="small-vocab", n_layers=24, d_model=1024, n_heads=16, d_ff=4096, vocab=8192, max_positions=1024)
    big = small.model_copy(update={"name": "big-vocab", "vocab": 8192 * 8})
    kw = dict(hw="dgx-a100", gpus=1, micro_batch=1, global_batch=4, seq=1024, precision="fp16-mixed", attention="eager",
              recompute="full", stack="megatron-deepspeed")
    head = {m.name: head_times(_workload(m), 1024, 1) for m in (small, big)}
    extra_gpu = 4 * float(head["big-vocab"].fwd_s - head["small-vocab"].fwd_s)  # 4 micro-batches
    grew = estimate(model=big, **kw).step_time_s - estimate(model=small, **kw).step_time_s
    assert extra_gpu > 0.004 and grew >= extra_gpu * (1 - 1e-9)


def test_precision_must_be_one_the_gpu_runs_and_defaults_to_its_best():
    # Turing (Titan RTX) has no bf16 (PyTorch refuses bf16 autocast there), Ampere no fp8 (Transformer
    # Engine needs sm89+): asking for them is a one-line error naming the fix; the default is bf16-mixed
    # where bf16 exists, else fp16-mixed.
    assert estimate(model="gpt2", hw="titan-rtx-pcie").setup.precision == "fp16-mixed"
    assert estimate(model="gpt2", hw="dgx-a100").setup.precision == "bf16-mixed"
    # fp8-mixed, the switch every stack's FP8 launches as Transformer Engine's DelayedScaling: costed as fp8-delayed
    assert estimate(model="gpt2", hw="dgx-h100", precision="fp8-mixed").setup.precision == "fp8-delayed"
    for hw, p, fix in (("titan-rtx-nvlink", "bf16-mixed", "fp16-mixed"), ("dgx-a100", "fp8-mixed", "bf16-mixed"),
                       ("titan-rtx-pcie", "bf16", "fp16-mixed")):
        with pytest.raises(PlanError) as exc:
            estimate(model="gpt2", hw=hw, precision=p)
        msg = str(exc.value)
        assert "\n" not in msg and p in msg and f"use {fix}" in msg
    res = subprocess.run([sys.executable, "-m", "advisor.cli", "plan", "--model", "gpt2", "--hw", "dgx-a100",
                          "--precision", "fp8-mixed"], capture_output=True, text=True)
    assert res.returncode == 2 and "no fp8 math" in res.stderr + res.stdout and "Traceback" not in res.stderr


def test_ddp_reduces_in_25_mib_buckets_each_paying_its_call():
    # PyTorch DDP (bucket_cap_mb=25): gpt2-xl's fp32 gradients (1,557,611,200 x 4 bytes) go out as 238 all-reduces
    # of ~25 MiB, each at the rate nccl-tests measures for that size, not as one 6.2 GB all-reduce.
    from advisor.comm import Collective, collective_time
    from advisor.hardware import load_hardware

    hw = load_hardware("dgx-a100")
    e = estimate(model="gpt2-xl", hw="dgx-a100", gpus=8, micro_batch=1, global_batch=8, precision="fp32",
                 overlap_grad_reduce=False)
    grad = 1_557_611_200 * 4.0
    n = np.ceil(grad / (25 * 2**20))
    assert n == 238
    assert e.breakdown["comm/dp_grad"] == pytest.approx(n * float(collective_time(Collective.all_reduce, 8, grad / n, hw, 8)), rel=1e-9)
    assert e.breakdown["comm/dp_grad"] > 1.2 * float(collective_time(Collective.all_reduce, 8, grad, hw, 8))


def test_a_two_chunk_schedule_reads_back_its_two_virtual_stages():
    """A ZB-V row reports its two model chunks a rank; estimate takes them back (and only them) with the same step."""
    from advisor.api import estimate as est
    from advisor.errors import AdvisorError

    kw = dict(gpus=8, pp=4, schedule="zb-v", micro_batch=1, global_batch=64, stack="torchtitan")
    assert est("llama3-8b", "dgx-h100", virtual_stages=2, **kw).step_time_s == est("llama3-8b", "dgx-h100", **kw).step_time_s
    with pytest.raises(AdvisorError, match="has two model chunks per pipeline rank"):
        est("llama3-8b", "dgx-h100", virtual_stages=3, **kw)


# --- invariants a randomized sweep of 68,000 estimates found broken (each the smallest case it found) ------------
def test_frozen_inputs_are_not_saved_twice_under_nvfp4_and_lora():
    """NVFP4 keeps a linear's saved input in 4 bits, LoRA keeps no input of a frozen linear: the same input must not be
    taken away twice (torchtitan, selective recomputation left -0.72 GiB of activations)."""
    for rc in ("none", "selective", "full"):
        e = estimate("llama3-8b", "dgx-b200", stack="torchtitan", recompute=rc, precision="nvfp4", method="lora")
        assert all(v >= 0 for v in e.memory.parts.values()), (rc, e.memory.parts)


def test_the_zero_collectives_named_are_those_costed_under_lora():
    """The collectives line reported `reduce-scatter of -65.74 MiB` for a LoRA plan under ZeRO-2: the adapters'
    parameters less the whole embedding. It names what data.sharded_collectives moves: the adapters' gradients, the
    frozen base's weights gathered under ZeRO-2/3."""
    for z in (1, 2, 3):
        e = estimate("qwen3-8b", "gcp-a3-ultra", stack="hf-trainer", dp=2, zero=z, method="lora")
        assert " of -" not in e.collectives["zero"], e.collectives["zero"]
    full = estimate("qwen3-8b", "gcp-a3-ultra", stack="hf-trainer", dp=2, zero=3).collectives["zero"]
    lora = estimate("qwen3-8b", "gcp-a3-ultra", stack="hf-trainer", dp=2, zero=3, method="lora").collectives["zero"]
    assert full.split("; ")[1] == lora.split("; ")[1]  # the same base weights gathered


@pytest.mark.parametrize("model, hw, kw", [
    # two micro-batches: torch's Schedule1F1B refuses fewer than the stages (pipelining/schedules.py:1020-1024), and
    # torchtitan's ZeRO-1 gradients are held through the second forward (tests/test_torchtitan_pp_grads.py)
    ("qwen2.5-7b", "gcp-a4", dict(stack="torchtitan", tp=4, pp=2, dp=8, zero=1, seq=512, grad_accum=2)),
    ("gpt2", "rtx-3090-nvlink", dict(stack="megatron-core", dp=4, pp=4, seq=512))])
def test_full_recomputation_never_holds_more_than_selective(model, hw, kw):
    """The head's gradient joined the full-recomputation moment although the gradients were held throughout already
    (ZeRO-1, Megatron's main_grad buffer): counted twice."""
    peaks = [estimate(model, hw, recompute=rc, **kw).memory.peak_bytes for rc in ("none", "selective", "full")]
    assert peaks[2] <= peaks[1] <= peaks[0], peaks


@pytest.mark.parametrize("model, hw, kw", [
    ("gpt-oss-120b", "aws-p5", dict(stack="megatron-deepspeed", dp=8, ep=8, seq=8192, grad_accum=2)),
    ("deepseek-v3", "gcp-a4", dict(stack="megatron-core", dp=2, ep=2, seq=2048, recompute="full", micro_batch=2,
                                   grad_accum=4, optimizer="adamw-fused"))])
def test_zero3_gathers_no_expert_that_nothing_shards(model, hw, kw):
    """With ep = dp the expert data-parallel group is one rank: the local experts are held whole, so ZeRO-3 gathers
    only the rest of a layer (it counted two whole layers, experts included: ZeRO-3 above ZeRO-2)."""
    peaks = [estimate(model, hw, zero=z, **kw).memory.peak_bytes for z in (1, 2, 3)]
    assert peaks[2] <= peaks[1] <= peaks[0], peaks


def test_torchtitan_zero1_without_an_fsdp_group_is_no_fsdp():
    """torchtitan applies no FSDP at dp 1: --zero 1 there holds what --zero 0 does (it was priced with the unsharded
    fp32 gradients of FSDP under a pipeline, 10% more)."""
    peaks = {z: estimate("llama3-8b", "dgx-h100", dp=1, zero=z, stack="torchtitan", seq=4096).memory.peak_bytes
             for z in (0, 1, 2)}
    assert peaks[0] == peaks[1] == peaks[2]


@pytest.mark.parametrize("kw, message", [
    (dict(method="lora", lora_rank=65536), "--lora-rank 65536 is above llama3-8b's hidden size 4096"),
    (dict(recompute="block", recompute_layers=1000), "--recompute-layers 1000: llama3-8b has 32 layers")])
def test_absurd_options_are_refused(kw, message):
    from advisor.errors import AdvisorError

    with pytest.raises(AdvisorError, match=message):
        estimate("llama3-8b", "dgx-h100", **kw)


def test_selective_recomputation_of_eager_attention_holds_a_layers_scores_again():
    """Megatron's selective recomputation reruns core attention in each layer's backward: under eager (unfused)
    attention that layer's s x s scores, softmax and dropout mask are held again meanwhile, one layer at a time, as
    a full rerun holds them. At seq 8192 with 32 heads they outweigh what selective keeps beyond full's layer inputs:
    selective then holds more than full (the fuzz's 'selective below full' was this transient left out)."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.stack import load_stack
    from advisor.training import TrainingSetup
    from advisor.workload import Workload

    kw = dict(stack="megatron-core", pp=4, dp=1, zero=1, micro_batch=1, seq=8192, precision="bf16")
    sel, full = (estimate("llama2-7b", "dgx-h100", recompute=rc, attention="eager", **kw) for rc in ("selective", "full"))
    w = Workload.of(load_model("llama2-7b"), load_hardware("dgx-h100"), load_stack("megatron-core"),
                    TrainingSetup(seq_len=8192, precision="bf16", attention="eager", recompute="selective"))
    layer_scores = w.tables.saved_layer.scores * 32 * 8192 * 8192  # bytes per score element x heads x s x s (mb 1)
    assert layer_scores > 8e9 and sel.memory.peak_bytes > full.memory.peak_bytes
    sdpa = estimate("llama2-7b", "dgx-h100", recompute="selective", attention="sdpa", **kw)
    assert sel.memory.parts["activations"] - sdpa.memory.parts["activations"] >= layer_scores
