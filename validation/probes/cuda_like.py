"""CUDA-like op behaviour on CPU for the probes: CUDA autocast's op lists and fused dropout.

The one implementation is advisor.probe.emulate.cuda_like (advisor never imports validation/, so it lives there);
these scripts keep their ``CudaLike(amp_dtype)`` name for it.
"""

from advisor.probe.emulate import cuda_like


def CudaLike(amp_dtype=None, cache=True):  # noqa: N802 (the probes' class-like name)
    return cuda_like(amp_dtype, cache)
