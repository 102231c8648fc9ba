"""A node's host side (its memory, each GPU's PCIe link, CPU cores and CPU Adam rate, local NVMe), which offload
uses (advisor/parallel/offload.py); part of a hardware profile (advisor.hardware, the ``host:`` key)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from advisor.spec import Spec
from advisor.units import GiB


class Host(Spec):
    """A node's host side, which offloaded model states and activations use (advisor/parallel/offload.py): its
    memory, each GPU's PCIe link to it, its CPU cores and the rate DeepSpeed's CPU Adam steps parameters at, and
    its local NVMe drives. Every number datasheet-sourced or fitted (``advisor calibrate`` measures the copy and
    the CPU Adam rate); a profile without a host side gets no offload plans."""

    memory_GiB: float = Field(gt=0, le=1e6, description="host memory per node")
    pcie_GBps: float = Field(gt=0, le=1e4, description="each GPU's host link, one direction, as a pinned copy reaches it")
    cpu_cores: int = Field(ge=1, le=100_000, description="physical cores per node")
    cpu_adam_Gparams_per_s: float = Field(gt=0, le=1e4, description="parameters per second the node's CPU Adam steps")
    nvme_read_GBps: Optional[float] = Field(default=None, gt=0, le=1e4, description="the node's NVMe drives together")
    nvme_write_GBps: Optional[float] = Field(default=None, gt=0, le=1e4)
    nvme_TB: Optional[float] = Field(default=None, gt=0, le=1e6)
    source: Optional[str] = None

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * GiB

    @property
    def pcie_bytes_per_s(self) -> float:
        return self.pcie_GBps * 1e9

    @property
    def cpu_adam_params_per_s(self) -> float:
        return self.cpu_adam_Gparams_per_s * 1e9

    @property
    def has_nvme(self) -> bool:
        return self.nvme_read_GBps is not None and self.nvme_write_GBps is not None
