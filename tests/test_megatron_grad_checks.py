"""megatron-core 0.19.2's gradient buckets, NaN check and gradient clipping as the stack profiles cost them."""

from types import SimpleNamespace

import pytest

from advisor.parallel.overlap import bucket_bytes
from advisor.stack import load_stack


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
