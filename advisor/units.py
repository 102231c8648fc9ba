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
    """A step's time: 5.165 s, 12.30 ms, 45.2 us; from 10,000 s (2.8 h) on in hours, days or years (fmt_duration),
    never a 16036492.260 s."""
    if t >= 1e4:
        return fmt_duration(t)
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_seconds_3g(t: float) -> str:
    """Seconds to three significant figures (1.82 s, 0.0123 s), as the notes compare step times; from 1,000 s on
    in minutes, hours, days or years, below 0.1 ms (where .3g turns to 1e-05) in us: never 1.6e+07 s."""
    if t >= 1000:
        return fmt_duration(t)
    return f"{t:.3g} s" if t >= 1e-4 else fmt_seconds(t)


YEAR_S = 365.25 * 86400.0  # a Julian year


def fmt_duration(t: float) -> str:
    """A long duration in the largest whole unit: 3.2 h, 12.5 d, 312,199 y (whole years from a thousand on, with
    their thousands: plain digits, never 1e+05)."""
    for unit, size in (("y", YEAR_S), ("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if t >= size:
            return f"{t / size:,.{0 if t >= 1000 * size else 1}f} {unit}"
    return fmt_seconds(t)


def fmt_count(n: float) -> str:
    """A large count as --tokens takes it (powers of 1000): 1T, 300B, 2.5M, 999P; below a thousand, the number; from
    10^18 on, a power of ten (1e18, 2.5e21), never 1e+03P."""
    for unit, size in (("", 1.0), ("K", 1e3), ("M", 1e6), ("B", 1e9), ("T", 1e12), ("P", 1e15)):
        text = f"{n / size:.3g}"
        if abs(float(text)) < 1000:  # rounded: 999.7T is 1P, not 1e+03T
            return text + unit
    mantissa, exponent = f"{n:.2e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"
