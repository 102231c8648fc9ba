"""Routed experts' GEMMs as Transformer Engine launches them (advisor.parallel.expert gemm_calls, advisor.host
expert_launches). megatron-core 0.19.2 runs --moe-grouped-gemm with TE as TEGroupedMLP's te.pytorch.GroupedLinear
(extensions/transformer_engine_spec_provider.py:75-85), whose general_grouped_gemm (TE 2.14 module/grouped_linear.py:207)
reaches te_general_grouped_gemm ("For now, we only have multi-stream cublas backend", csrc/extensions/gemm.cpp) and
libtransformer_engine.so's multi_stream_cublas_gemm: one nvte_cublas_gemm_v2 per local expert, GEMM i on compute
stream i % nvte_get_num_compute_streams(), a function that returns the constant 4 in the 2.14 and 2.20.2 wheels
(``mov $0x4,%eax; ret``; no environment variable sets it). The busiest stream runs ceil(E_local / 4) GEMMs one after
another: the first at the per-call fixed time a dense GEMM pays (dgx-h100's fitted matmul_fixed_us, bf16 23.7 us), each
further one at the GPU's own per-kernel time (matmul_kernel_floor_us, 3.7 us: aiconfigurator's GPU-timed thin GEMMs,
advisor.parallel.expert fixed_times), as the C++ loop queues them with no Python between. Megatron-Bridge's MXFP8
performance recipes instead run TE's CuTe DSL fused grouped MLP (ops/fused/forward_grouped_mlp.py, set by
NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 and use_transformer_engine_op_fuser in perf_recipes/qwen/common.py): one kernel.
"""

from __future__ import annotations

import pytest

from advisor.compute import linear_pass_times
from advisor.hardware import load_hardware
from advisor.host import expert_launches
from advisor.model import load_model
from advisor.parallel import expert
from advisor.stack import load_stack
from advisor.training import TrainingSetup
from advisor.workload import Workload

QWEN = load_model("qwen3-30b-a3b")  # 128 routed experts of width 768, top-8: gate, up and down routed linears
ROUTED = [lin for lin in QWEN.layer.linears if lin.copies > 1]
H100 = load_hardware("dgx-h100")
FIXED_S = 23.7e-6  # hardware_profiles/dgx-h100.yaml matmul_fixed_us bf16 (fitted to reference/h100/kernels.jsonl)
FLOOR_S = 3.7e-6  # hardware_profiles/dgx-h100.yaml matmul_kernel_floor_us bf16 (fitted to aiconfigurator_gemm_small.csv)
LAUNCH_S = 4.0e-6  # hardware_profiles/dgx-h100.yaml kernel_launch_us


def _workload(stack, precision: str = "bf16-mixed", hw=H100) -> Workload:
    return Workload.of(QWEN, hw, stack, TrainingSetup(seq_len=4096, precision=precision))


def _grouped_one_kernel(name: str):
    """The same stack with one grouped kernel per linear (what advisor costed before: moe_gemm_streams 0)."""
    s = load_stack(name)
    return s.model_copy(update={"engine": s.engine.model_copy(update={"moe_gemm_streams": 0})})


def test_profiles_say_which_backend():
    assert load_stack("megatron-core").engine.moe_gemm_streams == 4
    assert load_stack("megatron-bridge-perf").engine.moe_gemm_streams == 4  # inherited from megatron-core
    assert load_stack("megatron-bridge-perf").engine.moe_one_kernel_under == ["mxfp8"]
    assert load_stack("torchtitan").engine.moe_gemm_streams == 0  # torch._grouped_mm: one kernel


@pytest.mark.parametrize("ep, floors, launches", [(16, 2.0, 8.0), (8, 4.0, 16.0), (32, 1.0, 4.0), (128, 1.0, 1.0),
                                                  (1, 32.0, 128.0)])
def test_megatron_core_pays_the_busiest_streams_fixed_times(ep, floors, launches):
    """128 experts over ep ranks: 128 / ep local GEMMs on 4 streams, ceil(128 / ep / 4) kernels in sequence: one
    fixed time, the rest the kernel floor (1 + 31 x 3.7 / 23.7 = 5.8 fixed times at ep 1, where 32 were costed before)."""
    w = _workload(load_stack("megatron-core"))
    assert all(expert.gemm_calls(w, lin, ep) == (floors, launches) for lin in ROUTED)
    one = _workload(_grouped_one_kernel("megatron-core"))
    for lin in ROUTED:
        fwd, bwd, _ = linear_pass_times(w, lin, 4096.0, 1, expert.gemm_shape(w, lin, 4096.0, 1, ep, 1))
        fwd1, bwd1, _ = linear_pass_times(one, lin, 4096.0, 1, expert.gemm_shape(one, lin, 4096.0, 1, ep, 1))
        # forward: one GEMM pass; backward: dgrad and wgrad, two general_grouped_gemm calls (grouped_linear.py:411, 467-487)
        assert expert.fixed_times(w, lin, ep) == (1.0, floors - 1.0)
        assert fwd - fwd1 == pytest.approx((floors - 1.0) * FLOOR_S, rel=1e-9, abs=1e-15)
        assert bwd - bwd1 == pytest.approx(2.0 * (floors - 1.0) * FLOOR_S, rel=1e-9, abs=1e-15)


def test_qwen3_30b_on_16_h100s_by_hand():
    """Bridge's qwen3_30b_a3b_pretrain_16gpu_h100_fp8cs_config layout, EP 16: 8 local experts, 2 GEMMs a stream; under
    FP8 current scaling (not a fused-grouped-MLP recipe) the multi-stream path stays; the gate's forward by hand."""
    w = _workload(load_stack("megatron-bridge-perf"), "fp8-tensorwise")
    gate = ROUTED[0]
    assert expert.gemm_calls(w, gate, 16) == (2.0, 8.0)
    flops, n, k, fixed, floors = expert.gemm_shape(w, gate, 4096.0, 1, 16, 1)
    rows = 4096 * 8 * 16 / 128  # tokens x top-k x ep / E: 4096 rows an expert
    h0 = H100.efficiency.matmul_half_dim["bf16"]
    assert (n, k, fixed, floors) == (768, 2048, 1.0, 1.0)
    assert flops == pytest.approx(2 * 768 * 2048 * 4096 * 8 / (rows / (rows + h0)))
    # the recipe's GEMMs take the fp8 floor (dgx-h100: 3.7 us, bf16's assumed), behind one per-call fixed time
    assert H100.efficiency.kernel_floor_us("fp8-tensorwise", "fp8", "bf16") == 3.7


def test_bridge_mxfp8_runs_one_fused_grouped_kernel():
    w = _workload(load_stack("megatron-bridge-perf"), "mxfp8", load_hardware("dgx-b200"))
    assert all(expert.gemm_calls(w, lin, 8) == (1.0, 1.0) for lin in ROUTED)
    assert expert_launches(w, 8) == 0.0


def test_host_launches_one_cublas_gemm_per_local_expert():
    """The C++ loop's launches past the one call the layer counts: 3 routed linears x (8 - 1) x 4 us at EP 16."""
    w = _workload(load_stack("megatron-core"))
    assert expert_launches(w, 16) == pytest.approx(3 * 7 * LAUNCH_S)
    assert expert_launches(w, 128) == 0.0
    assert expert_launches(_workload(_grouped_one_kernel("megatron-core")), 16) == 0.0
