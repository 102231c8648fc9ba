"""Units: SI base units inside the code, human units only at the edges.

Every internal quantity is in bytes, seconds, FLOPs, FLOP/s or bytes/s; names carry the unit as a
suffix (``_s``, ``_bytes``, ``_flops_per_s``). These constants convert at the edges (YAML, CLI).
"""

from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
KiB = 1024.0
MiB = 1024.0**2
GiB = 1024.0**3
TFLOP = 1e12
us = 1e-6
ms = 1e-3
Gbit = 1e9 / 8  # one gigabit in bytes: NICs are rated in bits per second

# Bytes per element, as floats so that a 4-bit type is 0.5 bytes and never rounds to 0.
BYTES_PER_DTYPE: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,  # TF32 is an fp32 storage format with a reduced-precision matmul path
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "bool": 1.0,
}


def fmt_bytes(n: float) -> str:
    """Human-readable bytes in binary units (GiB), as nvidia-smi and torch report them."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_duration(t: float) -> str:
    """A long duration in the largest whole unit: 3.2 h, 12.5 d."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if t >= size:
            return f"{t / size:.1f} {unit}"
    return fmt_seconds(t)


def fmt_count(n: float) -> str:
    """A large count as --tokens takes it (powers of 1000): 1T, 300B, 2.5M; below a thousand, the number."""
    for unit, size in (("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}"
