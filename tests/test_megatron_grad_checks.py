"""megatron-core 0.19.2's gradient buckets, NaN check and gradient clipping as the stack profiles cost them."""

from types import SimpleNamespace

import pytest

from advisor import estimate
from advisor.hardware import load_hardware
from advisor.parallel.overlap import bucket_bytes
from advisor.stack import load_stack

LLAMA3_8B = 8_030_261_248  # parameters (meta-llama/Meta-Llama-3-8B: 4096 hidden, 32 layers, 128256 vocab, untied)
H100 = load_hardware("dgx-h100")
ELEMENTWISE_S_PER_BYTE = 1.0 / (3350e9 * 0.757)  # H100 SXM 3.35 TB/s datasheet x the profile's element-wise share


def _variant(tmp_path, base="megatron-core", **engine):
    """The ``base`` profile with the engine fields given (the thing under test switched on or off)."""
    fields = ", ".join(f"{k}: {str(v).lower()}" for k, v in engine.items())
    path = tmp_path / f"{base}-variant.yaml"
    path.write_text(f"base: {base}\nname: variant\ndescription: t\nengine: {{{fields}}}\n")
    return str(path)


@pytest.mark.parametrize("stack,dp,grad_bytes,mib", [
    # distributed_data_parallel.py:68-69: max(40,000,000, 1,000,000 x dp) elements of the buffer's dtype
    ("megatron-core", 8, 4.0, 40e6 * 4 / 2**20),          # fp32 main gradients: 152.6 MiB, the profile's old fixed size
    ("megatron-bridge-perf", 8, 2.0, 40e6 * 2 / 2**20),   # bf16 buffer (grad_reduce_in_fp32 False): 76.3 MiB
    ("megatron-core", 64, 4.0, 64e6 * 4 / 2**20),         # beyond 40 ranks the bucket grows: 244.1 MiB
])
def test_megatron_bucket_is_counted_in_elements_of_the_buffer(stack, dp, grad_bytes, mib):
    w = SimpleNamespace(stack=load_stack(stack))
    assert float(bucket_bytes(w, dp, grad_bytes)) / 2**20 == pytest.approx(mib, rel=1e-9)
    # a stack that sizes its buckets in MiB keeps them (torch DDP's bucket_cap_mb 25: torch-1.11's profile)
    assert float(bucket_bytes(SimpleNamespace(stack=load_stack("torch-1.11")), dp, grad_bytes)) == 25 * 2**20


def test_megatron_grad_nan_check_reads_the_buffer_and_syncs_twice_a_bucket(tmp_path):
    """Megatron-LM's default check_for_nan_in_grad (arguments.py:2735-2737): per bucket a norm of its gradients and two
    host syncs (param_and_grad_buffer.py:339-365). Llama 3 8B at dp 64 in buckets of 64e6 elements: ceil(8.03e9 /
    64e6) = 126 buckets, 252 syncs, whatever the buffer's dtype; its fp32 buffer (megatron-core) reads 2 bytes a
    parameter more than the bf16 one (megatron-bridge-perf): 16.1 GB at 2.54 TB/s, 6.33 ms more. Megatron-Bridge's
    performance recipes turn the check off (perf_recipes/_common.py:57)."""
    kw = dict(gpus=64, zero=1, seq=8192, global_batch=256, recompute="full", precision="bf16-mixed")

    def grad(stack):
        return estimate("llama3-8b", H100, stack=stack, **kw).breakdown["comm/dp_grad"]
    fp32 = grad("megatron-core") - grad(_variant(tmp_path, grad_nan_check=False))
    bf16 = grad(_variant(tmp_path, "megatron-bridge-perf", grad_nan_check=True)) - grad("megatron-bridge-perf")
    assert fp32 - bf16 == pytest.approx(LLAMA3_8B * 2.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)
    assert fp32 - bf16 == pytest.approx(6.33e-3, rel=0.01)
    syncs = bf16 - LLAMA3_8B * 2.0 * ELEMENTWISE_S_PER_BYTE
    # each one op's issue: hardware_profiles/dgx-h100.yaml:92 kernel_launch_us 4 + the stack's cpu_us_per_op 8.6
    # (stack_profiles/megatron-deepspeed.yaml:15, megatron-core's base), 12.6 us
    assert syncs / 252 == pytest.approx(12.6e-6, rel=0.01)


def test_megatron_clips_the_gradients_it_steps(tmp_path):
    """clip_grad 1.0 (Megatron-LM arguments.py:2505, optimizer_config.py:371): the multi-tensor L2 norm reads the
    distributed optimizer's fp32 gradient shard and the scale reads and writes it (clip_grads.py:116-118, 186-188),
    12 bytes a stepped parameter: Llama 3 8B on 8 H100s under ZeRO-1, 1.004e9 parameters a GPU, 4.75 ms a step."""
    kw = dict(gpus=8, zero=1, seq=8192, global_batch=128, precision="fp8-tensorwise")
    on = estimate("llama3-8b", H100, stack="megatron-core", **kw).breakdown["optimizer"]
    off = estimate("llama3-8b", H100, stack=_variant(tmp_path, clip_grad_norm=False), **kw).breakdown["optimizer"]
    assert on - off == pytest.approx(LLAMA3_8B / 8 * 12.0 * ELEMENTWISE_S_PER_BYTE, rel=0.01)
    assert on - off == pytest.approx(4.75e-3, rel=0.01)


def test_megatron_script_turns_the_nan_check_off_where_the_stack_costed_it_off():
    """megatron-bridge-perf is costed without the per-bucket NaN check (perf_recipes/_common.py:57), but its
    --format megatron script left Megatron-LM's default on (check_for_nan_in_loss_and_grad, arguments.py:2735-2737),
    so the run paid 252 host syncs a step the estimate did not; megatron-core keeps the default, costed."""
    from advisor import launch_config

    def flags(stack):
        return launch_config("llama3-8b", H100, format="megatron", stack=stack, gpus=8, tp=2, sp=True).text.split()
    assert "--no-check-for-nan-in-loss-and-grad" in flags("megatron-bridge-perf")
    assert "--no-check-for-nan-in-loss-and-grad" not in flags("megatron-core")
    assert "--no-check-for-nan-in-loss-and-grad" not in flags("megatron-deepspeed")  # its arguments have no such check
