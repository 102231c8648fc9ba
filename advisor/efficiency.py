"""What fraction of its datasheet a GPU reaches, per kind of work: a hardware profile's ``efficiency`` (fitted by
``advisor calibrate`` or justified in the profile)."""

from __future__ import annotations

from typing import Optional, get_args

from pydantic import Field, field_validator

from advisor.engine import RecipeName
from advisor.spec import Spec

# per-precision efficiency figures that are not fractions: (upper bound, what the number is)
_EFFICIENCY_RANGES = {"matmul_half_dim": (1e7, "a GEMM size in [0, 1e7]"),
                      "matmul_fixed_us": (1e4, "microseconds in [0, 10000]"),
                      "matmul_kernel_floor_us": (1e4, "microseconds in [0, 10000]")}


# the keys of a GPU's per-precision efficiencies: a math precision (gpu.peak_tflops') or a low-precision recipe
# (advisor.precision); of optimizer_bandwidth, advisor's --optimizer names. Any other key would be read by nothing.
MATHS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4")
EFFICIENCY_KEYS = {"optimizer_bandwidth": ("adamw", "adamw-fused", "sgd")}


def _known_keys(v: dict, field: str) -> None:
    known = EFFICIENCY_KEYS.get(field, MATHS + get_args(RecipeName))
    bad = [k for k in v if k not in known]
    if bad:
        raise ValueError(f"unknown key {', '.join(map(repr, bad))} in {field} (use {', '.join(known)})")


class ComputeEfficiency(Spec):
    """What fraction of the datasheet a GPU reaches, per kind of work (fitted or justified)."""

    matmul_max: dict[str, float] = Field(
        description="fraction of peak reached by large GEMMs, per math precision"
    )
    matmul_half_dim: dict[str, float] = Field(
        description="GEMM n or k at which efficiency halves, per math precision: small GEMMs lose most"
    )
    matmul_fixed_us: dict[str, float] = Field(
        default_factory=dict,
        description="GPU time every GEMM kernel pays beyond its FLOPs (ramp-up, wave tail), per math precision; "
                    "absent = 0",
    )
    matmul_kernel_floor_us: dict[str, float] = Field(
        default_factory=dict,
        description="GPU time of one more GEMM kernel queued behind others with no launch gap between them (timed as "
                    "CUDA-graph replays), per math precision: what each further kernel of a multi-stream grouped GEMM "
                    "pays in sequence; absent = matmul_fixed_us",
    )
    memory_bandwidth: float = Field(ge=1e-6, le=1.0, description="fraction of HBM bandwidth reached by copies")
    elementwise_bandwidth: Optional[float] = Field(
        default=None, ge=1e-6, le=1.0,
        description="fraction reached by PyTorch's element-wise kernels on activation-sized tensors (default: memory_bandwidth)",
    )
    optimizer_bandwidth: dict[str, float] = Field(
        description="fraction of HBM bandwidth reached by the optimizer step, per implementation"
    )
    attention_max: float = Field(ge=1e-6, le=1.0, description="fused attention kernel: fraction of matmul peak")
    attention_half_sd: float = Field(
        default=113620.0, ge=0, le=1e12, description="seq_len x head_dim at which fused attention reaches half of attention_max"
    )
    kernel_launch_us: float = Field(
        ge=0, le=1e4, description="host-side cost to launch one eager kernel; bounds tiny kernels"
    )
    matmul_host_us: float = Field(
        default=28.0, ge=0, le=1e4, description="host-side cost of issuing one GEMM/attention call from Python"
    )
    framework_overhead_GiB: float = Field(
        ge=0, le=1e3, description="CUDA context + library workspaces outside tensor allocations"
    )

    @property
    def elementwise(self) -> float:
        return self.elementwise_bandwidth if self.elementwise_bandwidth is not None else self.memory_bandwidth

    @field_validator("matmul_max", "optimizer_bandwidth")
    @classmethod
    def _fractions(cls, v: dict[str, float], info) -> dict[str, float]:
        _known_keys(v, info.field_name)
        for key, val in v.items():
            if not (1e-6 <= float(val) <= 1.0):  # the floor keeps a denormal from overflowing a time to inf
                raise ValueError(f"{info.field_name}.{key}={val} must be a fraction in [1e-6, 1]")
        if info.field_name == "matmul_max" and "fp32" not in v:
            raise ValueError("matmul_max needs at least fp32")
        if info.field_name == "optimizer_bandwidth":
            missing = {"adamw", "adamw-fused", "sgd"} - set(v)
            if missing:
                raise ValueError(f"optimizer_bandwidth lacks {', '.join(sorted(missing))} (fractions of HBM bandwidth)")
        return v

    def kernel_floor_us(self, *keys: str) -> float:
        """The first of ``keys`` the profile gives a kernel floor for, else the first it gives a fixed time for, else 0."""
        for table in (self.matmul_kernel_floor_us, self.matmul_fixed_us):
            hit = next((table[k] for k in keys if k in table), None)
            if hit is not None:
                return hit
        return 0.0

    @field_validator("matmul_half_dim", "matmul_fixed_us", "matmul_kernel_floor_us")
    @classmethod
    def _in_range(cls, v: dict[str, float], info) -> dict[str, float]:
        _known_keys(v, info.field_name)
        upper, what = _EFFICIENCY_RANGES[info.field_name]
        for key, val in v.items():
            if not (0.0 <= float(val) <= upper):
                raise ValueError(f"{info.field_name}.{key}={val} must be {what}")
        return v
