"""DeepSpeed 0.19.8's ZeRO-Offload as its source runs it (advisor/parallel/zero_offload.py): the PCIe bytes per step,
ZeRO-1 with offload_optimizer, host memory with pinned buffers' power-of-two rounding, and the copies' exposure.
Llama 3 8B (8,030,261,248 parameters, Hugging Face's count) on 8 A100s of a DGX A100 (host: 12.5 GB/s pinned PCIe a GPU,
13.7 G/s CPU Adam): S = 8,030,261,248 / 8 = 1,003,782,656 parameters per rank."""

import numpy as np
import pytest

from advisor import estimate
from advisor.api import PlanError
from advisor.candidates import Candidates
from advisor.layout import Plan
from advisor.parallel import offload, zero_offload
from advisor.stack import load_stack
from advisor.training import TrainingSetup

P = 8_030_261_248
S = P / 8
GIB = 2**30
PCIE = 12.5e9  # dgx-a100's host link a GPU: two GPUs to a PCIe Gen4 switch's x16 uplink (its profile)
KW = dict(model="llama3-8b", hw="dgx-a100", stack="deepspeed", dp=8, offload="optimizer-cpu", micro_batch=1, seq=4096)


def _pcie(zero: int, ga: int, stack: str = "deepspeed") -> tuple[float, float]:
    s = TrainingSetup(grad_accum=ga)
    c = Candidates.of_plan(Plan(dp=8, zero=zero, offload="optimizer-cpu"), s, ga)
    down, up = offload.pcie_bytes(c, S, 2.0, load_stack(stack), 2.0)
    return float(down[0]) / S, float(up[0]) / S


@pytest.mark.parametrize("zero,ga,down,up", [
    # ZeRO-2, one micro-batch: only the boundary's fp32 copy down (async_inplace_copy_grad_to_fp32_buffer_from_gpu,
    # stage_1_and_2.py:1888-1912: the paper's 2 B were 4), the bf16 partition up after the step (:3091-3095)
    (2, 1, 4.0, 2.0),
    # ZeRO-2, 4 micro-batches: each copies its running sum down (:1857), the last three bring it up first (:1855-1856),
    # then the boundary's fp32 copy: 2 x 4 + 4 down (was 2 x 4), 2 x 3 + 2 up (was 2)
    (2, 4, 12.0, 8.0),
    # ZeRO-3: each micro-batch's partition down and straight back up (stage3.py:2025-2028, 2035-2041), the boundary's
    # fp32 copy (:1456-1457), the updated partition up (:2858): 2 + 4 down, 2 + 2 up (was 2 and 2); 4 micro-batches:
    # 2 x 4 + 4 down, 2 x 4 + 2 up
    (3, 1, 6.0, 4.0),
    (3, 4, 12.0, 10.0),
    # ZeRO-1 (one micro-batch; it reduces at the boundary only, :2285-2287): the fp32 copy down, the partition up
    (1, 1, 4.0, 2.0),
])
def test_pcie_bytes_per_partition_parameter_as_deepspeed_copies_them(zero, ga, down, up):
    assert _pcie(zero, ga) == (down, up)


def test_megatron_deepspeed_keeps_the_papers_volume():
    # its DeepSpeed is 0.9.5 (stack profile), whose source is not read here: Ren et al. 2021's 2 B down a micro-batch
    assert _pcie(2, 4, "megatron-deepspeed") == (8.0, 2.0)


def test_zero2_host_memory_counts_deepspeeds_allocations_and_pinned_rounding():
    # per rank: pinned fp32 master (stage_1_and_2.py:563-565) and fp32 gradient partition (:937-941), 4 x S = 4.015 GB
    # each, taken as 2^32 by torch's caching host allocator (CachingHostAllocator.h:300-309); the pinned bf16 buffer
    # the step writes (:566-575), 2 S = 2.008 GB as 2^31; Adam's m and v (cpu_adam.py:161-164), 8 S, not pinned; the
    # pinned bf16 twin of the largest parameter's staging buffer (temp_grad_buffer_for_cpu_offload, :653-658), the
    # embedding's 525,336,576 x 2 = 1.051 GB as 2^30: 147.83 GiB a node (139.83 without the twin; 16 B a parameter
    # gave 119.66 GiB)
    e = estimate(zero=2, grad_accum=1, **KW)
    assert e.params == P
    per_rank = 2 * 2**32 + 2**31 + 8 * S + 2**30
    assert e.host_memory_bytes == pytest.approx(8 * per_rank, rel=1e-12)
    assert e.host_memory_bytes / GIB == pytest.approx(147.83, abs=0.01)
    # under accumulation the pinned bf16 running sums (:1822-1825), 2 S more a rank
    e4 = estimate(zero=2, grad_accum=4, **KW)
    assert e4.host_memory_bytes == pytest.approx(8 * (per_rank + 2 * S), rel=1e-12)


def test_zero3_host_memory_counts_its_sub_groups_and_host_gradient_buffer():
    # fp32 master unpinned (stage3.py:1157-1160), the fp32 gradients pinned per sub-group of sub_group_size = 1e9
    # elements (:1337-1340; one of 1e9 and the rest, :1210-1233), the bf16 grad_partitions_flat_buffer pinned
    # (:791-795), Adam's 8 S, and the step's upload: copy_ of the fp32 sub-group into the GPU's bf16 partition
    # (stage3.py:2858-2859), blocking, so torch converts it on the CPU into a pageable bf16 temporary of
    # min(S, 1e9) elements: 152.77 GiB a node (137.87 without it; 16 S: 119.66 GiB)
    e = estimate(zero=3, grad_accum=1, **KW)
    rest = S - 1e9
    per_rank = 4 * S + 2**32 + 2 ** np.ceil(np.log2(4 * rest)) + 2**31 + 8 * S + 2 * 1e9
    assert e.host_memory_bytes == pytest.approx(8 * per_rank, rel=1e-12)
    assert e.host_memory_bytes / GIB == pytest.approx(152.77, abs=0.01)


def test_zero2_gradient_copies_show_whole_with_or_without_overlap_comm():
    # ZeRO-2 without overlap_comm copies on the current stream (reduce_ipg_grads, stage_1_and_2.py:2239-2248); with it on
    # the reduction stream, but the host waits for each parameter's copy before the next (_wait_for_offload_copies,
    # :1812-1814) and takes bool() of the overflow check at the boundary (:1791-1793): the whole 2 + 4 + 4 + 8 = 18 B x S
    # over the host link either way (1.445 s), where 1/32 of it (each micro-batch's last layer's share) was costed
    on = estimate(zero=2, grad_accum=4, **KW)
    off = estimate(zero=2, grad_accum=4, overlap_grad_reduce=False, **KW)
    copies = 18 * S / PCIE
    assert copies == pytest.approx(1.445, abs=1e-3)
    # the node's CPU steps its 8 ranks' partitions at the profile's 30 B a parameter, and unscales and clips the fp32
    # gradient in place (unscale_and_clip_grads, stage_1_and_2.py:3193-3216): 8 B more
    step_and_upload = 8 * S / 13.7e9 * 38 / 30 + 2 * S / PCIE
    assert off.breakdown["offload"] == pytest.approx(step_and_upload + copies, rel=1e-9)
    assert on.breakdown["offload"] == pytest.approx(step_and_upload + copies, rel=1e-9)


def test_zero3_gradient_copies_hide_behind_the_backward():
    # ZeRO-3 copies on reduce_and_partition_stream with a bounded queue of events (stage3.py:1665-1667), no wait per
    # parameter: each micro-batch's 2 + 2 B (4 + 2 + 2 at the boundary; :2025-2041, :1456-1457) shows 1/32
    e = estimate(zero=3, grad_accum=4, **KW)
    copies = (4 + 4 + 4 + 8) * S / PCIE
    step_and_upload = 8 * S / 13.7e9 * 38 / 30 + 2 * S / PCIE
    assert e.breakdown["offload"] == pytest.approx(step_and_upload + copies / 32, rel=1e-9)


def test_zero1_offload_is_costed_at_one_micro_batch():
    # DeepSpeed runs ZeRO-1 with offload_optimizer (offload_config.py:56 "Valid with stage 1, 2, and 3"): the same
    # DeepSpeedZeroOptimizer, partition_grads False (engine.py:2676-2716), which keeps .grad whole on the GPU until the
    # step (2 B x P = 14.96 GiB) and copies the fp32 partition down at the boundary; advisor refused it before
    e = estimate(zero=1, grad_accum=1, **KW)
    assert e.memory.parts["gradients"] == pytest.approx(2 * P)
    assert e.memory.parts["optimizer_states"] == 0
    step = P / 13.7e9 * 38 / 30  # CPU Adam's 30 B a parameter and the unscale and clip's 8 (zero_offload)
    assert e.breakdown["offload"] == pytest.approx(step + 2 * S / PCIE + 4 * S / PCIE, rel=1e-9)  # the copy shows whole
    # the Trainer's ZeRO-1 (accelerate's plugin writes no overlap_comm: False below stage 3) copies after backward
    t = estimate(**{**KW, "stack": "hf-trainer"}, zero=1, grad_accum=1)
    assert t.breakdown["offload"] == pytest.approx(step + 2 * S / PCIE + 4 * S / PCIE, rel=1e-9)


def test_zero1_offload_under_accumulation_is_refused_with_deepspeeds_reason():
    with pytest.raises(PlanError, match=r"adds the previous step's gradient.*--grad-accum 1, or --zero 2"):
        estimate(zero=1, grad_accum=4, **KW)


def test_deepspeed_zero1_offload_adds_the_previous_steps_gradient():
    """The reason, from DeepSpeed's own methods: copy_grads_in_partition as reduce_ipg_grads calls it on ZeRO-1's
    boundary micro-batch (micro_step_id 1 of grad_accum 2), run on CPU tensors for two steps."""
    pytest.importorskip("deepspeed")
    import torch
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    o = DeepSpeedZeroOptimizer.__new__(DeepSpeedZeroOptimizer)
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    fp32 = torch.zeros(4)
    fp32.grad = torch.zeros(4)
    for k, v in dict(cpu_offload=True, cpu_offload_pin_memory=False, _offload_gradient_safety_enabled=False,
                     _pending_offload_events={}, gradient_accumulation_dtype=torch.bfloat16, dtype=torch.bfloat16,
                     params_in_partition=[[p]], param_id={id(p): 0}, grad_position={0: [0, 0, 0, 4]},
                     low_precision_master_weights_and_grads=False, master_weights_and_grads_dtype=torch.float32,
                     device="cpu", single_partition_of_fp32_groups=[fp32], use_grad_accum_attribute=False,
                     temp_grad_buffer_for_gpu_offload=torch.zeros(4, dtype=torch.bfloat16), accumulated_grads_in_cpu={},
                     _offload_accumulated_param_ids=set(), norm_for_param_grads={}, local_overflow=False).items():
        setattr(o, k, v)
    o.is_gradient_accumulation_boundary = lambda: True
    o._record_gradient_stream = lambda *a: None
    o.clear_grad_attribute = lambda q: setattr(q, "grad", None)
    o._is_muon_group = lambda params: False
    seen = []
    for g in (1.0, 10.0):
        o.micro_step_id = 1
        p.grad = torch.full((4,), g, dtype=torch.bfloat16)  # the step's reduced gradient
        o.copy_grads_in_partition(p, 0)
        seen.append(float(fp32.grad[0]))
    assert seen == [1.0, 11.0]  # the second step steps on 1 + 10: if this fails, DeepSpeed fixed it: lift the refusal


def test_zero2_nvme_optimizer_is_refused_on_deepspeed():
    # stage_1_and_2.py sets cpu_offload for any device but none (:220-222) and has no swapper: the states stay in host
    # memory; only stage 3 swaps them (stage3.py optimizer_swapper)
    with pytest.raises(PlanError, match="NVMe under ZeRO-3 only"):
        estimate(**{**KW, "offload": "optimizer-nvme"}, zero=2, grad_accum=1)


def test_copies_per_micro_batch_sum_to_the_steps_gradient_bytes():
    for zero in (1, 2, 3):
        for ga in (1, 2, 8):
            if zero == 1 and ga > 1:
                continue
            first, middle, last, (down, up) = zero_offload.micro_batch_copies(np.array([zero]), np.array([ga]), 2.0)
            assert (first + max(ga - 2, 0) * middle + last)[0] == (down + up)[0]


def test_zero1_offload_export_is_refused_under_accumulation():
    from advisor.export import ExportError, export
    from advisor.hardware import load_hardware
    from advisor.model import load_model

    with pytest.raises(ExportError, match="previous step's gradient"):
        export("deepspeed", load_model("llama3-8b"), load_hardware("dgx-a100"), Plan(dp=8, zero=1, offload="optimizer-cpu"),
               TrainingSetup(micro_batch=1, grad_accum=2), 2, 8, "deepspeed")


def test_zero2_offload_keeps_a_gpu_staging_buffer_of_its_largest_parameter():
    """temp_grad_buffer_for_gpu_offload (stage_1_and_2.py:659-661): one largest parameter in bf16 on the GPU from init,
    Llama 3 8B's embedding, 128256 x 4096 = 525,336,576 elements: 1,050,673,152 bytes, beside the backward and the
    step alike; ZeRO-3's offload (stage3.py) allocates no such buffer."""
    from advisor.hardware import load_hardware
    from advisor.model import load_model
    from advisor.workload import Workload

    w = Workload.of(load_model("llama3-8b"), load_hardware("dgx-a100"), load_stack("deepspeed"),
                    TrainingSetup(seq_len=4096, stack="deepspeed"))
    staging = zero_offload.gpu_staging_bytes(w, np.array([1, 2, 3]), np.array([1, 1, 1]), 2.0)
    assert list(staging) == [128256 * 4096 * 2, 128256 * 4096 * 2, 0.0]
    e = estimate(zero=2, grad_accum=1, **KW)  # the estimate holds it: transient at least the buffer
    assert e.memory.parts["transient"] >= 128256 * 4096 * 2


def test_the_cpu_step_unscales_and_clips_the_gradient_and_fp16_zero3_checks_it_on_the_host():
    """unscale_and_clip_grads (stage_1_and_2.py:3193-3216, stage3.py:2979-2988) multiplies the host gradient partition
    by 1 / (loss scale x clip) every step the exports' gradient_clipping = 1.0 reaches: a read and a write, 8 B of
    fp32 beside CPU Adam's 30 (the profile's rate), 0.586 -> 0.742 s for the node's 8 x S parameters; ZeRO-3 under fp16
    runs isinf and isnan over the host bf16 gradient buffer (has_overflow, stage3.py:3009-3018): 8 B more, 0.898 s."""
    adam = 8 * S / 13.7e9
    for zero, precision, extra in [(2, "bf16-mixed", 8), (2, "fp16-mixed", 8), (3, "bf16-mixed", 8), (3, "fp16-mixed", 16)]:
        assert zero_offload.host_step_factor(np.array([zero]), 4.0, precision == "fp16-mixed")[0] == (30 + extra) / 30
    z2, z2h = estimate(zero=2, grad_accum=4, **KW), estimate(zero=2, grad_accum=4, precision="fp16-mixed", **KW)
    z3, z3h = estimate(zero=3, grad_accum=4, **KW), estimate(zero=3, grad_accum=4, precision="fp16-mixed", **KW)
    assert z2.breakdown["offload"] - z2h.breakdown["offload"] == pytest.approx(0.0, abs=1e-12)
    assert z3h.breakdown["offload"] - z3.breakdown["offload"] == pytest.approx(adam * 8 / 30, rel=1e-9)
    assert adam * 38 / 30 == pytest.approx(0.742, abs=1e-3)


def test_pure_bf16_keeps_bf16_masters_moments_and_copies_on_the_host():
    """--precision bf16 exports bf16_master_weights_and_grads and bf16_optimizer_states (export/deepspeed.py): the
    master partition and its gradient in bf16 (base_optimizer.py:521-526, stage_1_and_2.py:558-561, :937-941), CPU
    Adam's moments in bf16 (engine.py:2388-2391, cpu_adam.py:158), the running sums views of the gradient partition
    (:1821-1825), the boundary copy in bf16 (:1899-1900). ZeRO-2, 4 micro-batches, per rank: master, gradient and
    upload buffer 2 S each as 2^31, the twin 2^30, moments 4 S: 85.92 GiB a node (162.79 in bf16-mixed)."""
    e = estimate(zero=2, grad_accum=4, precision="bf16", **KW)
    assert e.host_memory_bytes == pytest.approx(8 * (3 * 2**31 + 2**30 + 4 * S), rel=1e-12)
    assert e.host_memory_bytes / GIB == pytest.approx(85.92, abs=0.01)
    s = TrainingSetup(grad_accum=4)
    c = Candidates.of_plan(Plan(dp=8, zero=2, offload="optimizer-cpu"), s, 4)
    down, up = offload.pcie_bytes(c, S, 2.0, load_stack("deepspeed"), 2.0, 2.0)
    assert (float(down[0]) / S, float(up[0]) / S) == (2 * 4 + 2.0, 2 * 3 + 2.0)  # the boundary's 2 B, not fp32's 4
    # the step: Adam's 16 B and the unscale's 4 over the profile's 30
    assert zero_offload.host_step_factor(np.array([2]), 2.0, False)[0] == pytest.approx(20 / 30)
    # the Trainer's ZeRO-1 keeps fp32 masters under pure bf16 (accelerate's plugin: export/accelerate.py)
    t = estimate(**{**KW, "stack": "hf-trainer"}, zero=1, grad_accum=1, precision="bf16")
    assert t.host_memory_bytes == pytest.approx(8 * (2 * 2**32 + 2**31 + 8 * S + 2**30), rel=1e-12)
