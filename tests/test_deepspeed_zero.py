"""The deepspeed stack's ZeRO engine as DeepSpeed 0.19.8 runs it (engine.zero_buffers, advisor/parallel/zero_buffers.py):
its IPG buckets and step copies in memory, its ZeRO-1/2 gradient all-reduce and ZeRO-2's once-a-step gather in time.
Sources: deepspeed 0.19.8 runtime/zero/config.py, stage_1_and_2.py, stage3.py as installed."""

from __future__ import annotations

import pytest

import advisor
from advisor import comm
from advisor.comm import Collective
from advisor.hardware import load_hardware

BUCKET = 500_000_000  # reduce_bucket_size default, runtime/zero/config.py:113
BF16 = 2.0


def _parts(**kw):
    e = advisor.estimate(stack="deepspeed", micro_batch=1, **kw)
    return e, e.model_dump(mode="json")["memory"]["parts"]


@pytest.mark.parametrize("overlap, buckets", [(True, 2), (False, 1)])
def test_zero2_holds_its_ipg_buckets_and_the_flat_copy_it_all_reduces(overlap, buckets):
    """setup_buckets allocates reduce_bucket_size elements in bf16, a second buffer under overlap_comm
    (stage_1_and_2.py:3256-3280); allreduce_bucket flattens each filled bucket before all_reduce (:2359-2385): GPT-2 XL's
    1.56e9 gradients fill the 5e8-element bucket. 3.0e9 / 2.0e9 bytes on top of the states and activations."""
    _, parts = _parts(model="gpt2-xl", hw="dgx-a100", gpus=8, zero=2, overlap_grad_reduce=overlap)
    assert parts["transient"] == pytest.approx((buckets + 1) * BUCKET * BF16, rel=1e-9)


REUSE = 1_000_000_000  # stage3_max_reuse_distance default, runtime/zero/config.py:251


def test_zero3_keeps_one_ipg_bucket_from_init_and_the_reused_tail_gathered():
    """stage3.py:779-784 allocates the IPG bucket once at init (5e8 bf16 = 1e9 bytes). Gathered beside it at the turn
    from forward to backward: the sub-module computing (GPT-2 XL's largest, c_fc, 1600 x 6400 = 10.24e6) and what
    __params_to_release keeps because the trace reuses it within stage3_max_reuse_distance elements
    (partitioned_param_coordinator.py:634-662): the tied head (50257 x 1600 = 80.4e6), which the backward reuses
    next, and the last layers while twice the parameters behind them stay under 1e9, half of it in all: 5e8 in bf16."""
    _, parts = _parts(model="gpt2-xl", hw="dgx-a100", gpus=8, zero=3)
    assert parts["transient"] == pytest.approx(BUCKET * BF16 + (1600 * 6400 + REUSE / 2) * BF16, rel=1e-9)


def test_zero3_reused_tail_is_the_head_alone_when_the_head_is_past_half_the_distance():
    """Llama 3 8B's output layer, 128256 x 4096 = 525.3e6 elements, is over half the reuse distance: the last layer's
    sub-modules recur only after the head has been traversed twice (1.05e9 > 1e9), so the head alone stays gathered
    beside the computing sub-module (its largest, a 14336 x 4096 MLP projection: 58.7e6)."""
    _, parts = _parts(model="llama3-8b", hw="dgx-h100", gpus=8, zero=3, seq=1024)
    assert parts["transient"] == pytest.approx(BUCKET * BF16 + (14336 * 4096 + 128256 * 4096) * BF16, rel=1e-9)


def test_zero2_step_holds_what_deepspeeds_estimator_counts_plus_the_flat_copy():
    """At the step the partition's bf16 gradients are flattened (a copy) and upcast to fp32 (stage_1_and_2.py:3103-3118).
    DeepSpeed's estimate_zero2_model_states_mem_needs (:4017-4034) counts 2 P + 18 P / N without offload (2 grads_16bit
    + 4 grads_32bit + 4 params_32bit + 8 Adam states per partitioned parameter); the flattened copy adds 2 P / N.
    Llama 3 8B on 2 H100s at seq 128: the step, not the activations, sets the peak."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    e, parts = _parts(model="llama3-8b", hw="dgx-h100", gpus=2, zero=2, seq=128, overlap_grad_reduce=False)
    n = e.params
    _, gpu = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=2, num_nodes=1, cpu_offload=False)
    states = parts["weights"] + parts["gradients"] + parts["optimizer_states"] + parts["transient"]
    assert parts["activations"] == 0.0  # the step phase
    assert states == pytest.approx(gpu + 2 * n / 2, rel=1e-6)  # gpu is int(...): a byte's rounding


KW = dict(model="llama3-8b", hw="dgx-h100", gpus=16, stack="deepspeed", micro_batch=1, seq=4096)


def _dp(zero, grad_accum, **kw):
    b = advisor.estimate(zero=zero, grad_accum=grad_accum, **KW, **kw).model_dump(mode="json")["breakdown"]
    return b["comm/dp_grad"], b["comm/zero_params"]


def test_zero1_all_reduces_the_gradient_buckets():
    """use_multi_rank_bucket_allreduce defaults to true (config.py:119): average_tensor puts every rank's slice of a
    bucket in one ("allreduce", group) bucket and allreduce_bucket calls dist.all_reduce on it (stage_1_and_2.py
    :1690-1720, :2359-2385): twice a reduce-scatter's bus bytes. Exposed whole without overlap_comm."""
    grad, gather = _dp(1, 8, overlap_grad_reduce=False)
    hw = load_hardware("dgx-h100")
    n = advisor.estimate(zero=1, **KW).params
    assert grad == pytest.approx(float(comm.collective_time(Collective.all_reduce, 16, n * BF16, hw, 8)), rel=1e-9)
    assert gather == pytest.approx(float(comm.collective_time(Collective.all_gather, 16, n * BF16, hw, 8)), rel=1e-9)


def test_zero2_gathers_the_weights_once_a_step():
    """ZeRO-2 keeps the bf16 weights whole (bit16_groups_flat) and all-gathers the updated partitions once, after
    the optimizer step (stage_1_and_2.py:3149-3155), as ZeRO-1: only its gradient reduction runs every micro-batch
    (engine.py:3084-3086). So 8 micro-batches cost 8 reductions and one gather (ZeRO-1's)."""
    _, gather = _dp(1, 8)
    _, eight = _dp(2, 8)
    _, one = _dp(2, 1)
    assert eight - gather == pytest.approx(8 * (one - gather), rel=1e-9)


def test_zero2_without_overlap_comm_reduces_on_the_compute_stream():
    """Without overlap_comm DeepSpeed reduces each IPG bucket on the current stream (stage_1_and_2.py reduce_ipg_grads:
    ``stream = get_accelerator().current_stream()`` unless overlap_comm): every micro-batch's all-reduce is exposed
    whole, beside ZeRO-2's one gather a step (ZeRO-1's, as test_zero1_all_reduces_the_gradient_buckets costs it)."""
    hw = load_hardware("dgx-h100")
    n = advisor.estimate(zero=2, **KW).params
    _, params = _dp(2, 8, overlap_grad_reduce=False)
    all_reduce = float(comm.collective_time(Collective.all_reduce, 16, n * BF16, hw, 8))
    gather = float(comm.collective_time(Collective.all_gather, 16, n * BF16, hw, 8))
    assert params == pytest.approx(8 * all_reduce + gather, rel=1e-9)
    _, overlapped = _dp(2, 8)
    assert overlapped < params / 2  # overlap_comm hides most of it behind the backward


def test_the_trainers_zero1_is_deepspeeds_without_overlap_comm():
    """hf-trainer's ZeRO-1 runs through accelerate's DeepSpeed plugin, whose config (accelerate 1.15 utils/dataclasses.py
    DeepSpeedPlugin.__post_init__) writes neither reduce_bucket_size nor overlap_comm: one 5e8-element bf16 bucket and
    its flat copy (overlap_comm's default below stage 3 is False: config.py overlap_comm_valid), and the all-reduce
    of every bucket after the last backward, exposed whole whatever --overlap-grad-reduce says. Its ZeRO-2 is FSDP's:
    no bucket."""
    kw = dict(model="gpt2-xl", hw="dgx-a100", gpus=8, micro_batch=1, stack="hf-trainer")
    z1 = advisor.estimate(zero=1, **kw)
    assert z1.memory.parts["transient"] == pytest.approx(2 * BUCKET * BF16, rel=1e-9)
    hw = load_hardware("dgx-a100")
    all_reduce = float(comm.collective_time(Collective.all_reduce, 8, z1.params * BF16, hw, 8))
    assert z1.breakdown["comm/dp_grad"] == pytest.approx(all_reduce, rel=1e-9)
    assert advisor.estimate(zero=1, overlap_grad_reduce=False, **kw).step_time_s == pytest.approx(z1.step_time_s)
    assert advisor.estimate(zero=2, **kw).memory.parts["transient"] < BUCKET * BF16 / 10


def test_pure_bf16_keeps_a_bf16_master_partition_and_needs_zero():
    """--precision bf16 in the deepspeed stack exports bf16_master_weights_and_grads and bf16_optimizer_states
    (advisor/export/deepspeed.py), under which deepspeed 0.19.8 clones the rank's partition in that dtype beside its
    bf16 moments (stage_1_and_2.py:558-561): 2 + 4 bytes a stepped parameter, Llama 3 8B's 8,030,261,248 over 8 ranks
    6.02e9 bytes (not the moments' 4.02e9). Without ZeRO the option is refused (runtime/config.py:706-709) and
    DeepSpeed runs FP16_Optimizer over fp32 masters (engine.py:2318-2321): that plan is refused, naming the fix."""
    import advisor
    from advisor.errors import AdvisorError

    kw = dict(model="llama3-8b", hw="dgx-h100", gpus=8, precision="bf16", stack="deepspeed")
    one = advisor.estimate(**kw, zero=1)
    params = one.params
    assert params == 8_030_261_248  # Llama 3 8B's config.json, as transformers counts it
    assert one.memory.parts["optimizer_states"] == pytest.approx(params / 8 * 6.0, rel=1e-9)
    with pytest.raises(AdvisorError, match="trains pure bf16 only under ZeRO 1-3 .*--zero 1, 2 or 3, or --precision "
                                           "bf16-mixed$"):
        advisor.estimate(**kw, zero=0)
    # the Trainer's DeepSpeed (accelerate's plugin) keeps fp32 masters: no bf16 partition, no refusal
    trainer = advisor.estimate(**{**kw, "stack": "hf-trainer"}, zero=1)
    assert trainer.memory.parts["optimizer_states"] != pytest.approx(params / 8 * 6.0, rel=1e-3)
