"""Hardware: a GPU, the links inside a node and between nodes, and the efficiencies calibration fits.

A profile is one system (e.g. a DGX A100 node) described in YAML with human units in the keys
(``memory_GiB``, ``bandwidth_GBps`` for NVLink/PCIe in bytes, ``bandwidth_Gbps`` for NICs in bits).
Datasheet figures sit beside a ``source:`` line; efficiency figures are either fitted by
``advisor calibrate`` or justified in the profile's comments. A profile may start from another with
``base:`` and give only what differs (see ``hardware_from_yaml``).

An NVLink domain may be larger than a node (``nvlink_domain_gpus``: GB200/GB300 NVL72 racks join 18 trays of 4
GPUs through NVLink switch trays): groups inside a domain run on the NVLink link, groups across domains on the
network, each GPU with its own share of its node's NICs (advisor.comm.network).

Deliberately left out: power/thermal clock throttling; which GPU sits beside which NIC (every GPU is taken to
own an equal share of its node's NICs, as on rail-optimised nodes).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, field_validator, model_validator

from advisor.errors import AdvisorError
from advisor.host_side import Host
from advisor.profiles import ProfileKind, fitted_latency, to_yaml
from advisor.efficiency import MATHS, ComputeEfficiency  # noqa: F401 (read from here too)
from advisor.spec import ProfileName, Spec, checked
from advisor.units import GB, TFLOP, Gbit, GiB

PROFILE_DIR = Path(__file__).resolve().parent.parent / "hardware_profiles"
# Installed wheels carry the profiles inside the package (see pyproject's package-data).
_PACKAGED_PROFILE_DIR = Path(__file__).resolve().parent / "hardware_profiles"


class LinkKind(str, Enum):
    nvlink = "nvlink"  # point-to-point NVLink bridge (e.g. 2x Titan RTX)
    nvswitch = "nvswitch"  # all-to-all NVLink through NVSwitch (DGX)
    pcie = "pcie"  # PCIe through the host bridge, no peer-to-peer (NCCL_P2P_DISABLE)
    infiniband = "infiniband"
    efa = "efa"  # AWS Elastic Fabric Adapter
    ethernet = "ethernet"  # RoCE or TCP


class GPU(Spec):
    name: str
    memory_GiB: float = Field(gt=0, le=1e5)
    # floors far below any real GPU (1 GB/s; 1 GFLOP/s) keep a denormal from overflowing a time to inf
    memory_bandwidth_GBps: float = Field(ge=1.0, le=1e6, description="HBM/GDDR bandwidth, datasheet")
    peak_tflops: dict[str, float] = Field(
        description="dense peak per math precision: fp32, tf32, bf16, fp16, fp8, fp6, fp4 (where the GPU has it)"
    )
    sm_count: Optional[int] = Field(default=None, ge=1, le=100_000, description="streaming multiprocessors (datasheet): "
                                    "what overlapped collectives take from a GEMM (advisor.parallel.tensor); None: not costed")
    compute_capability: Optional[float] = Field(
        default=None, ge=1.0, le=100.0, description="CUDA compute capability (sm_80: 8.0; NVIDIA's CUDA GPUs table): "
        "the attention kernel a stack's library picks (advisor.memory flash_output_copy); None: not known, not costed")
    block_scaling: bool = Field(
        default=False, description="tensor cores that apply per-block scales inside the GEMM (Blackwell, sm_100+): "
                                   "MXFP8's blocks of 32 and NVFP4's blocks of 16 (advisor.precision)")

    @field_validator("peak_tflops")
    @classmethod
    def _check_peaks(cls, v: dict[str, float]) -> dict[str, float]:
        allowed = set(MATHS)
        for key, val in v.items():
            if key not in allowed:
                raise ValueError(f"unknown precision {key!r} in peak_tflops (use {sorted(allowed)})")
            if not (1e-3 <= val < 1e6):
                raise ValueError(f"peak_tflops.{key}={val:g} must be a TFLOP/s figure from 0.001 to below 1,000,000 "
                                 "(the datasheet's dense figure, in TFLOP/s)")
        if "fp32" not in v:
            raise ValueError("peak_tflops needs at least fp32")
        return v

    @property
    def memory_bytes(self) -> float:
        return self.memory_GiB * GiB

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_GBps * GB

    def runs(self, math: str) -> bool:
        """Whether the GPU has this math precision natively (fp32 always): bf16 needs Ampere or later,
        fp8 Hopper or Ada (no fallback: PyTorch refuses bf16 autocast on Turing, Transformer Engine fp8
        below sm89)."""
        return math == "fp32" or math in self.peak_tflops

    def peak_flops_per_s(self, math: str) -> float:
        """Datasheet dense peak for a math precision; a GPU without it falls back to what it can run."""
        fallback = {"fp4": "fp8", "fp6": "fp8", "fp8": "fp16", "bf16": "fp16", "fp16": "fp32", "tf32": "fp32", "fp32": "fp32"}
        key = math
        while key not in self.peak_tflops:
            key = fallback[key]
        return self.peak_tflops[key] * TFLOP


class CommFit(Spec):
    """Alpha-beta parameters of one link class, as fitted from nccl-tests style sweeps.

    See advisor.comm.link_time for the formula and the meaning of each term.
    """

    latency_us: float = Field(ge=0, le=1e6)
    latency_per_hop_us: float = Field(default=0.0, ge=0, le=1e6)
    bandwidth_efficiency: float = Field(ge=1e-6, le=1.0)
    group_penalty: float = Field(default=0.0, ge=0, lt=2.0)
    half_size_MiB: float = Field(default=0.0, ge=0, le=1e6)
    # at most 1: x / (x / (x + h)) ** e never decreases with x then, so neither does the time
    half_size_exponent: float = Field(default=1.0, ge=0, le=1.0)
    loop_MiB_per_rank: float = Field(default=0.0, ge=0, le=1e5)
    loop_quantization: float = Field(default=0.0, ge=0, le=1.0)
    # NCCL's Simple protocol fills and drains a pipeline of chunks on every ring step: it costs like
    # this much more data per rank (0: no such cost), so small messages go faster on LL128
    simple_fill_MiB_per_rank: float = Field(default=0.0, ge=0, le=1e3)
    # LL128's large-message rate as a fraction of Simple's (0: Simple only). LL128 carries 120 data
    # bytes in each 128-byte line and has no pipeline to fill; NCCL runs a call on the faster protocol
    ll128_bandwidth_ratio: float = Field(default=0.0, ge=0, le=1.0)
    floor_us: float = Field(default=0.0, ge=0, le=1e6)
    floor_per_hop_us: float = Field(default=0.0, ge=0, le=1e6)
    # NCCL's low-latency path for small messages (LL, and NVLS/tree where NCCL picks them): a start-up of
    # ll_latency_us and a rate of ll_bandwidth_ratio x the link's (0: no such path). Fitted below 1 MiB at one
    # group size, so the start-up does not grow with the ranks here.
    ll_latency_us: float = Field(default=0.0, ge=0, le=1e6)
    ll_bandwidth_ratio: float = Field(default=0.0, ge=0, le=1.0)
    # Inter-node links only: the algorithms NCCL chose from for all-reduces across nodes on this system (advisor.comm
    # .network). "ring": its ring only, where the profile's sweep shows nothing else (2x p4d on NCCL 2.9.9: 43.8 of 50
    # GB/s busbw) or the platform sets NCCL_ALGO=Ring (GCP's GPUDirect-TCPX); "tree" or unset: ring or tree, whichever
    # is faster per call, as NCCL's tuner picks by default (the 2x A3 Mega sweep beats its NIC rate: 339 GB/s busbw
    # on 200 GB/s, which only the tree's half bytes on 2 nodes allow).
    algorithm: Optional[Literal["ring", "tree"]] = None
    # Inter-node links only: the fabric reduces in its switches (InfiniBand SHARP) and NCCL's CollNet is enabled
    # (NCCL_COLLNET_ENABLE=1 with the SHARP plugin, as Azure's ND H100 v5 runs it): an all-reduce across nodes may
    # then send each byte to the switch once instead of around a ring (advisor.comm.network).
    collnet: bool = False
    # Inter-node links only: NCCL's tree carries each message through one pipeline (up a chain of the node's GPUs,
    # across, and back down) where its ring splits it into n steps: its rate ramps up with the whole message S, as
    # (S / (S + tree_half_size)) ** half_size_exponent (0: as the ring's, with S / n). Fitted with the rest.
    tree_half_size_MiB: float = Field(default=0.0, ge=0, le=1e6)


class Link(Spec):
    kind: LinkKind
    bandwidth_GBps: Optional[float] = Field(default=None, ge=1e-3, le=1e5)  # floor: 1 MB/s
    bandwidth_Gbps: Optional[float] = Field(default=None, ge=1e-3, le=1e6)  # floor: 1 Mb/s
    latency_us: float = Field(ge=0, le=1e6, description="datasheet/typical one-way latency")
    fit: CommFit
    note: Optional[str] = None

    @field_validator("kind", mode="before")
    @classmethod
    def _roce_is_ethernet(cls, value: Any) -> Any:
        """RoCE (RDMA over Converged Ethernet, v1 or v2) is the ethernet kind: the name a cluster's admin gives it."""
        return "ethernet" if isinstance(value, str) and value.strip().lower() in ("roce", "rocev2", "roce-v2") else value
    # Intra-node (NVSwitch) links only: the switch reduces (NVLink SHARP, H100 and later); named in the algorithm
    # NCCL picks (NVLS-tree across 2 nodes). Its rate inside a node is in the link's fit (fitted sweeps ran it).
    nvls: bool = False
    # Inter-node links only: a fabric that delivers 1/oversubscription of the NICs' rate once a group spans more
    # than full_bisection_nodes nodes (NVLink domains); 1: non-blocking (a rail-optimised fat tree).
    oversubscription: float = Field(default=1.0, ge=1.0, le=100.0)
    full_bisection_nodes: Optional[int] = Field(default=None, ge=1, le=10_000_000)
    # NCCL runs a collective with one thread block per runtime channel, each on an SM for the whole call: what an
    # overlapped collective takes from the compute beside it (advisor.comm.held_sms); derived in each profile from
    # NCCL's topology search (reference/nccl_tuning_model.md s.4, s.7); None: not costed. NCCL's MAXCHANNELS is 64
    nccl_channels: Optional[int] = Field(default=None, ge=1, le=64)

    @model_validator(mode="after")
    def _one_bandwidth(self) -> "Link":
        if (self.bandwidth_GBps is None) == (self.bandwidth_Gbps is None):
            raise ValueError("give exactly one of bandwidth_GBps (bytes, NVLink/PCIe) or bandwidth_Gbps (bits, NICs)")
        return self

    @property
    def bandwidth_bytes_per_s(self) -> float:
        if self.bandwidth_GBps is not None:
            return self.bandwidth_GBps * GB
        if self.bandwidth_Gbps is not None:
            return self.bandwidth_Gbps * Gbit
        raise ValueError("link needs bandwidth_GBps or bandwidth_Gbps")


class Hardware(Spec):
    name: ProfileName
    description: str = ""
    source: str = Field(min_length=1, description="where the datasheet figures come from")
    gpu: GPU
    gpus_per_node: int = Field(ge=1, le=4096)
    # GPUs joined by one NVLink (NVSwitch) domain: gpus_per_node (the default) for a DGX/HGX node, 72 for an NVL72
    # rack of 18 trays; a multiple of gpus_per_node
    nvlink_domain_gpus: Optional[int] = Field(default=None, ge=1, le=1_000_000)
    intra_node: Link
    inter_node: Link
    efficiency: ComputeEfficiency
    price_per_gpu_hour_usd: Optional[float] = Field(default=None, gt=0, le=1e4)
    host: Optional[Host] = Field(default=None, description="the node's host side (offload); None: not described")
    calibration: Optional[dict] = Field(
        default=None, description="provenance of fitted values: date, host, versions, results file"
    )

    @field_validator("intra_node")
    @classmethod
    def _algorithm_across_nodes_only(cls, v: Link) -> Link:
        if v.fit.algorithm is not None:
            raise ValueError("fit.algorithm (NCCL's ring or tree across nodes) belongs to inter_node.fit: remove it here")
        if v.fit.collnet or v.oversubscription != 1.0 or v.full_bisection_nodes is not None:
            raise ValueError("fit.collnet, oversubscription and full_bisection_nodes describe the network: move them "
                             "to inter_node")
        if v.nvls and v.kind.value != "nvswitch":  # the switch reduces: a PCIe or bridged-NVLink node has none, and
            # advisor.comm would name its all-reduces NVLS-tree and hold NVLS's channels (held_sms)
            raise ValueError(f"nvls (NVLink SHARP, the NVSwitch's in-switch reduction) needs kind nvswitch, not "
                             f"{v.kind.value}: set nvls: false (a base's true is kept) or kind: nvswitch")
        return v

    @field_validator("inter_node")
    @classmethod
    def _nvls_in_the_node_only(cls, v: Link) -> Link:
        if v.nvls:
            raise ValueError("nvls (NVLink SHARP in the NVSwitch) belongs to intra_node: remove it from inter_node")
        if v.oversubscription != 1.0 and v.full_bisection_nodes is None:  # advisor.comm.network costs it beyond those
            raise ValueError(f"oversubscription {v.oversubscription:g} needs full_bisection_nodes, the nodes a group "
                             "spans at the NICs' full rate (e.g. those under one leaf switch): add it, or it costs nothing")
        return v

    @model_validator(mode="after")
    def _domain_of_whole_nodes(self) -> "Hardware":
        d = self.nvlink_domain_gpus
        if d is not None and (d < self.gpus_per_node or d % self.gpus_per_node):
            raise ValueError(f"nvlink_domain_gpus={d} must be a whole number of nodes of gpus_per_node="
                             f"{self.gpus_per_node} GPUs (e.g. {self.gpus_per_node * max(1, d // self.gpus_per_node)}); "
                             "leave it out for one NVLink domain per node")
        for name, link in (("intra_node", self.intra_node), ("inter_node", self.inter_node)):
            if self.gpu.sm_count and link.nccl_channels and link.nccl_channels >= self.gpu.sm_count:
                raise ValueError(f"{name}.nccl_channels={link.nccl_channels} leaves none of gpu.sm_count="
                                 f"{self.gpu.sm_count} SMs to compute beside a collective: give fewer channels or more SMs")
        if self.efficiency.framework_overhead_GiB >= self.gpu.memory_GiB:
            raise ValueError(f"efficiency.framework_overhead_GiB={self.efficiency.framework_overhead_GiB} is not below the "
                             f"{self.gpu.memory_GiB} GiB of gpu.memory_GiB: give the CUDA context's ~0.5-2 GiB")
        return self

    @property
    def domain_gpus(self) -> int:
        """GPUs in one NVLink domain (a node's, unless the profile joins several nodes into one)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def inter_node_bytes_per_s_per_gpu(self) -> float:
        """The per-node NIC bandwidth shared by the node's GPUs (rail-optimised nodes: one NIC per GPU)."""
        return self.inter_node.bandwidth_bytes_per_s / self.gpus_per_node

    @property
    def inter_node_share_per_gpu(self) -> float:
        """The fraction of its node's network one GPU gets when every GPU of the node communicates."""
        return self.inter_node_bytes_per_s_per_gpu / self.inter_node.bandwidth_bytes_per_s


class HardwareError(AdvisorError):
    """A profile that cannot be found or read; the message is one line for the user."""


def profile_dirs() -> list[Path]:
    return [d for d in (PROFILE_DIR, _PACKAGED_PROFILE_DIR) if d.is_dir()]


HARDWARE = ProfileKind("hardware profile", profile_dirs, HardwareError, "advisor profiles", whole=frozenset({"fit"}),
                       check=fitted_latency)


def list_profiles() -> list[str]:
    return HARDWARE.names()


def load_hardware(name_or_path: str | Path | Hardware) -> Hardware:
    """Load a profile by built-in name (``dgx-a100``) or by path to a YAML file."""
    if isinstance(name_or_path, Hardware):  # built in Python (model_copy skips validation): checked again
        return checked(name_or_path, HardwareError, f"hardware profile {name_or_path.name}")
    return HARDWARE.load(name_or_path, Hardware)


def hardware_from_yaml(text: str, origin: str = "<yaml>", path: str | Path | None = None) -> Hardware:
    """A profile from YAML text, over its ``base:`` profile if it names one (advisor.profiles).

    ``base:`` is a built-in name or a path to a .yaml file, relative to ``path``'s folder (the file the text
    came from; without one, the current directory). A link's ``fit`` stays when the child changes the link's
    ``bandwidth_*`` or ``kind``: its efficiencies are fractions of the link rate, so they carry over. Where they
    do not, the child gives its own ``fit``, which replaces the base's whole (a fit is one measurement of one
    network; its keys are never mixed with another's).
    """
    return HARDWARE.from_yaml(text, Hardware, origin, path)


def hardware_to_yaml(hw: Hardware) -> str:
    """YAML that ``load_hardware`` accepts back unchanged (round trip tested)."""
    return to_yaml(hw)


__all__ = ["GPU", "Host", "CommFit", "ComputeEfficiency", "Hardware", "HardwareError", "Link", "LinkKind",
           "hardware_from_yaml", "hardware_to_yaml", "list_profiles", "load_hardware"]
