"""torchtitan as two stacks (issue 15): ``torchtitan`` is 0.3.0, whose Llama configs train with ChunkedLossWrapper
(components/loss.py: lm_head and the loss run on an eighth of the sequence at a time, each chunk's backward before the
decoder's); ``torchtitan-0.2`` is the 2024-2025 releases (0.1.0-0.2.2 on PyPI), whose loss takes the whole sequence's
logits and whose TP always shards the sequence (apply_tp: SequenceParallel on the norms, no switch). Both launch with
``expandable_segments:True`` (run_train.sh), so the fit verdict keeps 1% for fragmentation, not the 5% of the default
allocator.

The measured rows: torchtitan's nvfp4.md (Llama 3 8B, 4 GB200, micro-batch 32, seq 2048, its 0.3.0 configs, peak
reserved memory) and its December 2024 H100 benchmark (Llama 3 70B, FSDP 32 x TP 8, micro-batch 16, seq 8192, full AC):
both were called "does not fit" (470 and 197 GiB) before.
"""

from __future__ import annotations

import pytest

from advisor import estimate, plan
from advisor.errors import AdvisorError
from advisor.memory import FRAGMENTATION
from advisor.units import GiB

GB200_ROW = dict(gpus=4, dp=4, fsdp="full-shard", micro_batch=32, seq=2048, recompute="selective", precision="bf16-mixed")
TOKENS, VOCAB, D_MODEL = 32 * 2048, 128256, 4096  # Llama 3 8B (its config.json)


def test_the_chunked_loss_holds_an_eighth_of_the_logits_and_none_into_the_backward():
    new = estimate("llama3-8b", "gb200-nvl72", stack="torchtitan", **GB200_ROW)
    old = estimate("llama3-8b", "gb200-nvl72", stack="torchtitan-0.2", **GB200_ROW)
    # 0.2: bf16 logits, the fp32 upcast, log-softmax and their gradients at the loss: 14 bytes a logit
    assert old.memory.parts["logits_loss"] == pytest.approx(TOKENS * VOCAB * 14, rel=1e-9)
    # 0.3.0: 14 bytes a logit of one chunk in eight, the chunks' hidden copies (2 h) and the fp32 accumulator (4 h);
    # and the head's unsharded gradient FSDP2 accumulates in fp32 over the chunks, then its fp32 reduce-scatter input
    # (set_requires_gradient_sync(False) but at the last chunk: 8 bytes per element of the V x h head)
    assert new.memory.parts["logits_loss"] == pytest.approx(TOKENS * (VOCAB * 14 / 8 + 6 * D_MODEL) + 8 * VOCAB * D_MODEL,
                                                            rel=1e-9)
    # the decoder's saves alike but for 0.3.0's fused wqkv, whose k output the per-op policy keeps (0.2 recomputes wk)
    assert new.memory.parts["activations"] - old.memory.parts["activations"] == pytest.approx(TOKENS * 32 * 2 * 1024)
    assert new.step_time_s < old.step_time_s  # the loss's FLOPs and bytes alike, in chunks; 0.2 reruns wk besides


def test_torchtitans_gb200_row_fits_within_five_percent_of_its_measured_peak():
    # nvfp4.md, Llama 3 8B 200M-token table, BF16 row: 174.49 GiB peak reserved of the GB200's 184.3 GiB; its config
    # (llama3_8b, 0.3.0's registry) checkpoints with SelectiveAC
    est = estimate("llama3-8b", "gb200-nvl72", stack="torchtitan", **GB200_ROW)
    assert est.fits
    # costed eager: 180.9 GiB (+3.7%); the run compiled its blocks, which advisor costs at 155 GiB (-11%: what the
    # compiled per-op policy saves, probed on CPU, and 0.3.0's default CUDA-graph pool are not measured on a GPU)
    assert est.memory.peak_bytes / GiB == pytest.approx(174.49, rel=0.05)


def test_torchtitan_shards_the_sequence_with_tensor_parallelism_unless_told_not_to():
    kw = dict(gpus=256, dp=32, tp=8, fsdp="full-shard", micro_batch=16, seq=8192, recompute="full",
              precision="bf16-mixed", global_batch=512)
    # 0.2: always (apply_tp's SequenceParallel, no switch); 0.3.0: parallelism.enable_sequence_parallel defaults to
    # True (config/configs.py); megatron-core: only with --sequence-parallel. Without --sp/--no-sp, the stack's default
    assert estimate("llama3-70b", "dgx-h100", stack="torchtitan-0.2", **kw).plan.sp
    assert estimate("llama3-70b", "dgx-h100", stack="torchtitan", **kw).plan.sp
    assert not estimate("llama3-70b", "dgx-h100", stack="megatron-core", **kw).plan.sp
    # Megatron-Bridge's perf recipes set sequence_parallel = True wherever TP > 1 (64 of 64 in 0.6.2's perf_recipes)
    assert estimate("llama3-70b", "dgx-h100", stack="megatron-bridge-perf", **{**kw, "fsdp": None, "zero": 1}).plan.sp
    with pytest.raises(AdvisorError) as exc:
        estimate("llama3-70b", "dgx-h100", stack="torchtitan-0.2", sp=False, **kw)
    assert "torchtitan-0.2's tensor parallelism always shards the sequence: drop --no-sp" in str(exc.value)
    replicated = estimate("llama3-70b", "dgx-h100", stack="torchtitan", sp=False, **kw)
    sharded = estimate("llama3-70b", "dgx-h100", stack="torchtitan-0.2", **kw)
    # the December 2024 benchmark's 2D row ran in 71.9 GiB reserved on 96 GB H100s: with the sequence sharded the
    # layer inputs full checkpointing keeps are an eighth (2 h a token, 80 layers: 160 GiB replicated)
    assert replicated.memory.parts["activations"] - sharded.memory.parts["activations"] > 130 * GiB
    assert sharded.fits and not replicated.fits


def test_the_search_proposes_torchtitan_02_tp_only_with_sequence_parallelism():
    res = plan("llama3-70b", "dgx-h100", gpus=64, stack="torchtitan-0.2", seq=4096, global_batch=64, top=100_000)
    tp_rows = [r for r in res.plans if r.plan.tp > 1]
    assert tp_rows and all(r.plan.sp for r in tp_rows)
    assert any("always shards the sequence" in reason for reason in res.rejected)


def test_the_fragmentation_margin_follows_the_allocator_the_stack_launches():
    kw = dict(gpus=8, dp=8, fsdp="full-shard", micro_batch=1, seq=4096, recompute="full", precision="bf16-mixed")
    for stack, frac in (("torchtitan", FRAGMENTATION["expandable_segments"]), ("hf-trainer", FRAGMENTATION["caching"])):
        est = estimate("llama3-8b", "dgx-h100", stack=stack, **kw)
        assert est.memory.overhead["fragmentation"] == pytest.approx(frac * est.memory.peak_bytes, rel=1e-9)
    assert FRAGMENTATION == {"caching": 0.05, "expandable_segments": 0.01}


def test_the_torchtitan_export_sets_the_allocator_its_launcher_sets():
    from advisor.api import launch_config

    out = launch_config("llama3-8b", "dgx-h100", format="torchtitan", gpus=8, dp=8, fsdp="full-shard", micro_batch=1,
                        seq=8192, stack="torchtitan")
    assert "\nexport PYTORCH_ALLOC_CONF=expandable_segments:True\n" in out.text


PIPE = dict(gpus=32, dp=8, pp=4, micro_batch=1, seq=8192, global_batch=64, recompute="full", precision="bf16-mixed")


def test_fsdp_under_torchtitans_pipeline_is_zero1_with_fp32_gradients():
    # torchtitan keeps FSDP's units gathered under PP (fsdp.py: reshard_after_forward False with pp), and
    # torch.distributed.pipelining's stage turns off resharding and gradient sync until the last micro-batch
    # (stage.py perform_reduce_grad); FSDP2 accumulates the unsharded gradients in reduce_dtype (fp32:
    # _fsdp_param.py to_accumulated_grad_if_needed)
    est = estimate("llama3-8b", "dgx-h100", stack="torchtitan", zero=1, **PIPE)
    parts = est.memory.parts
    stage_params = parts["weights"] / 2  # bf16, unsharded
    assert parts["gradients"] == pytest.approx(4 * stage_params, rel=1e-9)
    assert parts["optimizer_states"] == pytest.approx(12 * stage_params / 8, rel=1e-9)  # fp32 master + Adam over dp
    assert "reduce-scatter of 8.46 GiB" in est.collectives["zero"]  # the fp32 gradients, once a step
    # megatron-core's ZeRO-1 (distributed optimizer, main_grads fp32) holds the same states
    mc = estimate("llama3-8b", "dgx-h100", stack="megatron-core", zero=1, **PIPE).memory.parts
    assert (mc["weights"], mc["gradients"]) == pytest.approx((parts["weights"], parts["gradients"]), rel=1e-9)


def test_torchtitan_runs_zero1_only_under_a_pipeline():
    with pytest.raises(AdvisorError) as exc:
        estimate("llama3-8b", "dgx-h100", stack="torchtitan", zero=1, gpus=8, dp=8, micro_batch=1, seq=8192)
    assert "torchtitan's ZeRO-1 is its FSDP under a pipeline schedule (--pp 2 or more); without one, shard with --zero 2 or 3" \
        in str(exc.value)
    res = plan("llama3-70b", "dgx-h100", gpus=64, stack="torchtitan", seq=4096, global_batch=64, top=100_000)
    zero1 = [r.plan for r in res.plans if r.plan.zero == 1]
    assert zero1 and all(p.pp > 1 for p in zero1)


def test_the_torchtitan_export_writes_zero1_under_a_pipeline_as_fsdp():
    from advisor.api import launch_config

    out = launch_config("llama3-8b", "dgx-h100", format="torchtitan", stack="torchtitan", zero=1, **PIPE)
    assert "--parallelism.data-parallel-shard-degree 8\n" in out.text
    assert "--parallelism.pipeline-parallel-degree 4\n" in out.text
    assert any(n.startswith("ZeRO-1 is FSDP2 under the pipeline schedule") for n in out.notes)


def test_torchtitan_02s_op_level_checkpointing_also_reruns_wk():
    # 0.2.2's blocks run wq, wk, wv apart and its per-op policy recomputes every second matmul of a block (wk, wo, w3);
    # 0.3.0's fused wqkv leaves wo and w3 (distributed/activation_checkpoint.py in both): the difference is wk's
    # forward, 2 x d_model x kv_dim FLOPs a token and layer (Llama 3 8B: 4,096 x 1,024, 32 layers)
    kw = dict(gpus=8, dp=8, fsdp="full-shard", micro_batch=1, seq=8192, recompute="selective", precision="bf16-mixed")
    old = estimate("llama3-8b", "dgx-h100", stack="torchtitan-0.2", **kw)
    new = estimate("llama3-8b", "dgx-h100", stack="torchtitan", **kw)
    per_step = (old.hw_tflops_per_gpu * old.step_time_s - new.hw_tflops_per_gpu * new.step_time_s) * 1e12  # per GPU
    tokens_per_gpu = 8192
    assert per_step == pytest.approx(tokens_per_gpu * 32 * 2 * 4096 * 1024, rel=0.01)
    assert old.breakdown["compute/recompute"] > new.breakdown["compute/recompute"]
    # and it keeps wv's output, not wk's: a kv-wide bf16 tensor a token and layer less
    less = new.memory.parts["activations"] - old.memory.parts["activations"]
    assert less == pytest.approx(tokens_per_gpu * 32 * 2 * 1024, rel=0.01)


def test_a_torchtitan_02_export_says_the_command_runs_0_3s_chunked_loss():
    from advisor.api import launch_config

    kw = dict(format="torchtitan", gpus=8, dp=8, fsdp="full-shard", micro_batch=1, seq=8192)
    old = launch_config("llama3-8b", "dgx-h100", stack="torchtitan-0.2", **kw)
    assert "# note: costed as stack torchtitan-0.2, whose loss differs from torchtitan 0.3.0's" in old.text
    assert not any("costed as stack" in n for n in launch_config("llama3-8b", "dgx-h100", stack="torchtitan", **kw).notes)


@pytest.mark.parametrize("stack", ["torchtitan", "torchtitan-0.2"])
def test_pure_bf16_is_costed_with_the_mixed_tables(stack):
    """Both torchtitans train in pure bf16 (training.dtype bfloat16, engine.precisions): the block computes in bf16 as
    under mixed precision (FSDP2's param_dtype), so the same measured tables serve it; it was refused for want of a
    'half' entry. Same activations and compute; less memory (bf16 weights and optimizer states)."""
    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, stack=stack, seq=8192)
    pure, mixed = estimate(precision="bf16", **kw), estimate(precision="bf16-mixed", **kw)
    assert pure.memory.parts["activations"] == pytest.approx(mixed.memory.parts["activations"])
    assert pure.breakdown["compute/forward"] == pytest.approx(mixed.breakdown["compute/forward"])
    assert pure.memory.peak_bytes < mixed.memory.peak_bytes


def test_ep_is_carved_from_the_sharded_ranks_only():
    """torchtitan 0.3.0 distributed/parallel_dims.py: the sparse mesh (pp, dp_replicate, efsdp, ep) takes efsdp =
    dp_shard x cp x tp / ep, so EP must divide the sharded ranks: DDP replicas (dp_replicate) lend it none. The search
    ranked DDP dp=4 x TP=2 x PP=2 x EP=8 on 16 H100s (efsdp 2/8) and its export wrote a mesh torchtitan refuses."""
    with pytest.raises(AdvisorError, match=r"efsdp = dp_shard x cp x tp / ep\): --ep must divide them"):
        estimate(model="qwen3-30b-a3b", hw="dgx-h100", gpus=16, dp=4, tp=2, pp=2, ep=8, etp=1, sp=True,
                 stack="torchtitan")
    ok = estimate(model="qwen3-30b-a3b", hw="dgx-h100", gpus=16, dp=8, tp=2, zero=3, ep=8, etp=1, sp=True,
                  stack="torchtitan", seq=4096)
    assert ok.step_time_s > 0
    found = plan(model="qwen3-30b-a3b", hw="dgx-h100", gpus=16, stack="torchtitan", top=100)
    for p in found.plans:
        lay = p.plan.layout(8, 16)
        assert p.plan.ep == 1 or (lay.dp_shard * p.plan.cp * p.plan.tp) % p.plan.ep == 0, p.plan.label()


def test_torchtitan_01_gathers_tp_inputs_in_fp8_under_tensorwise_scaling_only():
    """torchtitan 0.1.0 models/llama3/infra/parallelize.py: enable_float8_tensorwise_tp = ("float8" in converters, the
    name 0.1.0 registers its converter under) and not rowwise, which takes torchao's Float8ColwiseParallel /
    Float8RowwiseParallel / PrepareFloat8ModuleInput: a linear's input cast to e4m3 before its all-gather, its output
    gradient to e5m2 before the backward's, the reduce-scatters in bf16. Llama 3 70B, TP 8 with SP on one DGX H100:
    each layer's all-gathers move half the bytes under tensorwise, none less under rowwise. 0.2.2 still tests for
    "float8" but registers "quantize.linear.float8": bf16 always; 0.3.0 has no tensorwise recipe."""
    from advisor.comm import Collective, collective_time
    from advisor.hardware import load_hardware
    from advisor.stack import load_stack

    kw = dict(model="llama3-70b", hw="dgx-h100", gpus=16, dp=2, zero=3, tp=8, sp=True, micro_batch=1, seq=8192, recompute="full",
              stack="torchtitan-0.1")
    tp = {p: estimate(precision=p, **kw).breakdown["comm/tp"] for p in ("bf16-mixed", "fp8-tensorwise", "fp8-rowwise")}
    assert tp["fp8-rowwise"] == pytest.approx(tp["bf16-mixed"], rel=1e-9)
    # per layer: two sub-blocks (attention, MLP), each gathering in the forward, the recomputed forward and the
    # backward, in line (vanilla TP); 80 layers
    hw, act = load_hardware("dgx-h100"), 8192 * 8192 * 2.0  # tokens x d_model x bf16
    saved = collective_time(Collective.all_gather, 8, act, hw, 8) - collective_time(Collective.all_gather, 8, act / 2, hw, 8)
    assert tp["bf16-mixed"] - tp["fp8-tensorwise"] == pytest.approx(2 * 3 * 80 * saved, rel=1e-6)
    assert load_stack("torchtitan").engine.tp_gathers_quantised is False
    assert load_stack("torchtitan-0.2").engine.tp_gathers_quantised is False


def test_torchtitan_02_trains_tp_or_pp_without_fsdp_in_fp32_and_refuses_it_under_mixed():
    """torchtitan 0.2.2 distributed/utils.py maybe_enable_amp: with FSDP (dp_shard or CP > 1) the mixed precision is
    fully_shard's; without it autocast runs on DDP or one device only ("Mixed precision training with TP or PP is only
    supported when FSDP/HSDP/CP is enabled"): a TP or PP plan without FSDP trains in fp32, which its tables do not
    cost. Refused under bf16-mixed in one line; with FSDP, or in 0.3.0 (fully_shard's policy on every plan), costed."""
    from _robust import assert_one_line_error

    base = ["estimate", "--model", "llama3-8b", "--hw", "dgx-h100", "--tp", "2", "--stack", "torchtitan-0.2"]
    assert_one_line_error(base + ["--gpus", "2", "--dp", "1"],
                          "torchtitan-0.2 trains TP or PP without FSDP in fp32 (no autocast there)")
    # and DDP beside TP or PP raises at start-up in any precision (models/llama3/infra/parallelize.py)
    for precision in ("bf16-mixed", "bf16"):
        assert_one_line_error(base + ["--gpus", "8", "--dp", "4", "--precision", precision],
                              "torchtitan-0.2 runs no DDP beside TP or PP (\"DDP has not supported > 1D parallelism\")")
    assert estimate(model="llama3-8b", hw="dgx-h100", gpus=8, tp=2, dp=4, zero=3, stack="torchtitan-0.2").fits
    assert estimate(model="llama3-8b", hw="dgx-h100", gpus=8, tp=2, dp=4, zero=3, stack="torchtitan").fits
    for precision in ("bf16-mixed", "bf16"):
        found = plan("llama3-8b", "dgx-h100", gpus=8, stack="torchtitan-0.2", precision=precision, top=50).plans
        assert all(p.plan.tp == p.plan.pp == 1 or (p.plan.zero >= 1 and p.plan.dp > 1) or p.plan.cp > 1
                   or (precision == "bf16" and p.plan.dp == 1) for p in found)


def test_torchtitan_03_runs_fsdp2_on_one_rank_where_nothing_shards():
    """0.3.0 always calls apply_fsdp_to_decoder ("with shard_degree=1 it is a no-op for the all-gather but still
    installs the MixedPrecisionPolicy", models/llama3/parallelize.py:69) and has no autocast or replicate(): at dp 1 a
    TP plan keeps fp32 shards, Adam and bf16 gradients (16 bytes a parameter, no autocast copy of the weights) and pays
    the one-rank unit copies; 0.2.2 ran autocast on fp32 weights there (and refuses that TP plan under mixed)."""
    kw = dict(gpus=8, tp=8, micro_batch=1, seq=8192, precision="bf16-mixed")
    new = estimate("llama3-8b", "dgx-h100", stack="torchtitan", **kw)
    per_rank = new.params / 8  # every linear, the embedding and the head split over the TP ranks (8.03B / 8)
    parts = new.memory.parts
    assert parts["weights"] + parts["gradients"] + parts["optimizer_states"] == pytest.approx(16 * per_rank, rel=0.01)
    assert parts["transient"] < 0.2 * 2 * per_rank  # the unit's gradient buffers, not a 2-byte copy of every weight
    # the cast and copy of each unit, twice a micro-batch (reshard_after_forward without PP), reading and writing bf16
    copies = new.breakdown["comm/zero_params"]
    assert 0.5 * 2 * 4 * per_rank / 3.35e12 < copies < 3 * 2 * 4 * per_rank / 3.35e12  # H100's 3.35 TB/s (datasheet)
    with pytest.raises(AdvisorError, match="trains TP or PP without FSDP in fp32"):
        estimate("llama3-8b", "dgx-h100", stack="torchtitan-0.2", **kw)
    # its replicas at dp_shard 1 (HSDP of one-rank shards): no autocast copy either, 0.2.2's DDP keeps one
    ddp = dict(gpus=8, dp=8, micro_batch=1, seq=4096, precision="bf16-mixed", model="llama3-8b", hw="dgx-h100")
    r3, r2 = estimate(stack="torchtitan", **ddp), estimate(stack="torchtitan-0.2", **ddp)
    assert r2.memory.parts["transient"] - r3.memory.parts["transient"] > 0.9 * 2 * r3.params


def test_fsdp2s_hsdp_all_reduces_the_replicas_in_every_micro_batch():
    """torch 2.13 FSDP2 foreach_reduce all-reduces each unit's shard over dp_replicate after its reduce-scatter in every
    micro-batch's post-backward, and neither torchtitan calls set_requires_all_reduce(False) to defer it: on 4 p4d nodes
    (400 Gb/s EFA each) Llama 3 8B's ~1 s all-reduce is paid per micro-batch, 4x at 4 micro-batches; hf-trainer's FSDP1
    (accelerate's no_sync accumulation) pays it once a step."""
    kw = dict(gpus=32, fsdp="hybrid-shard", micro_batch=1, seq=2048, recompute="full")
    def params_s(stack, ga):
        return estimate("llama3-8b", "aws-p4d", global_batch=32 * ga, stack=stack, **kw).breakdown["comm/zero_params"]
    for stack in ("torchtitan", "torchtitan-0.2"):
        assert params_s(stack, 4) == pytest.approx(4 * params_s(stack, 1), rel=0.01)
    assert params_s("hf-trainer", 4) < 1.5 * params_s("hf-trainer", 1)


def test_torchtitan_03_replicas_and_pipelines_where_nothing_shards():
    """At dp_shard 1 0.3.0's replicas are HSDP over one-rank shards: their gradients all-reduce in every micro-batch's
    post-backward (foreach_reduce); under a pipeline torch's pipelining defers the unshard and the reduce to the last
    micro-batch (pipelining/stage.py set_reshard_after_backward(False), set_requires_gradient_sync(False)): the
    one-rank copies are paid once a step there. LoRA freezes the head: no head gradient at the chunked loss's peak."""
    def part(name, **kw):
        return estimate("llama3-8b", "dgx-h100", gpus=8, stack="torchtitan", seq=4096, **kw).breakdown[name]
    assert part("comm/dp_grad", dp=8, zero=0, global_batch=64) == pytest.approx(8 * part("comm/dp_grad", dp=8, zero=0,
                                                                                         global_batch=8), rel=0.01)
    piped = dict(dp=2, zero=0, tp=2, pp=2)
    assert part("comm/zero_params", global_batch=64, **piped) == pytest.approx(
        part("comm/zero_params", global_batch=16, **piped), rel=0.01)
    kw = dict(gpus=8, dp=8, zero=3, seq=4096, stack="torchtitan")
    lora, full = estimate("llama3-8b", "dgx-h100", method="lora", **kw), estimate("llama3-8b", "dgx-h100", **kw)
    assert full.memory.parts["logits_loss"] - lora.memory.parts["logits_loss"] == pytest.approx(8 * VOCAB * D_MODEL, rel=1e-6)
