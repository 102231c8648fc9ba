"""Typed loaders for the measured datasets in ``validation/data/`` (sources and licences: data/SOURCES.md).

Each row type carries what the estimator needs and ``estimate_kwargs()`` returns the keyword arguments of
``advisor.estimate(...)`` for it; the measured quantity sits beside it under a unit-suffixed name
(``step_time_s``, ``iter_time_s``, ``peak_mem_bytes``, ``tflops_per_gpu``). Nothing here computes an
estimate: comparing is the caller's job. Pure Python + pydantic + PyYAML; no torch.

Left out: the raw ``published_collectives.yaml`` is returned as plain dicts (its schema varies by source).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Literal, Optional

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict

from advisor.model import CATALOGUE, ModelSpec, gpt2_like, llama_like

DATA_DIR = Path(__file__).resolve().parent / "data"


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _read_csv(name: str) -> list[dict[str, Any]]:
    """CSV rows as dicts; empty cells become None (pydantic then coerces the strings)."""
    with open(DATA_DIR / name, newline="") as fh:
        return [{k: (v if v != "" else None) for k, v in rec.items()} for rec in csv.DictReader(fh)]


def _read_yaml(name: str) -> Any:
    return yaml.safe_load((DATA_DIR / name).read_text())


# -- seed 001: 2x Titan RTX, nn.DataParallel vs DDP with and without NVLink ------------------------------
class TitanRun(Row):
    id: str
    label: str
    hardware_profile: Literal["titan-rtx-nvlink", "titan-rtx-pcie"]
    data_parallel: Literal["dp", "ddp"]
    dp: int
    train_runtime_s: float
    steps: int
    model: str
    micro_batch: int
    global_batch: int
    seq_len: int
    precision: str
    optimizer: str
    attention: str
    recompute: str

    @property
    def step_time_s(self) -> float:
        """Mean wall time per optimizer step (Trainer runtime / steps; includes warm-up and overheads)."""
        return self.train_runtime_s / self.steps

    def estimate_kwargs(self) -> dict[str, Any]:
        return dict(model=self.model, hw=self.hardware_profile, gpus=self.dp, dp=self.dp, tp=1, pp=1, zero=0,
                    micro_batch=self.micro_batch, global_batch=self.global_batch, seq=self.seq_len,
                    precision=self.precision, attention=self.attention, recompute=self.recompute,
                    optimizer=self.optimizer, data_parallel=self.data_parallel)


def load_titan_seed() -> list[TitanRun]:
    doc = _read_yaml("seeds_titan_rtx.yaml")
    s = doc["setup"]
    common = dict(steps=s["steps"], model=s["model"], micro_batch=s["per_device_train_batch_size"],
                  global_batch=s["global_batch"], seq_len=s["seq_len"], precision=s["precision"],
                  optimizer=s["optimizer"], attention=s["attention"], recompute=s["recompute"])
    return [TitanRun(id=r["id"], label=r["label"], hardware_profile=r["hardware_profile"],
                     data_parallel=r["plan"]["data_parallel"], dp=r["plan"]["dp"],
                     train_runtime_s=r["measured"]["train_runtime_s"], **common) for r in doc["runs"]]


# -- seed 000: DGX A100, DDP vs FSDP SHARD_GRAD_OP, one epoch of wikitext-2 -----------------------------
class DgxRun(Row):
    id: str
    model: str
    dp: int
    micro_batch: int
    fsdp: Optional[Literal["shard-grad-op"]]
    train_time_s: float
    hardware_profile: str
    precision: str
    optimizer: str
    attention: str
    recompute: str
    primary_reading: str
    seq_len_by_reading: dict[str, int]
    steps_per_epoch_by_reading: dict[str, int]

    def _reading(self, reading: Optional[str]) -> str:
        reading = reading or self.primary_reading
        if reading not in self.seq_len_by_reading:
            raise KeyError(f"reading {reading!r}: one of {sorted(self.seq_len_by_reading)}")
        return reading

    def step_time_s(self, reading: Optional[str] = None) -> float:
        """Wall time / steps per epoch: an upper bound (startup, tokenisation and evaluation included)."""
        return self.train_time_s / self.steps_per_epoch_by_reading[self._reading(reading)]

    def estimate_kwargs(self, reading: Optional[str] = None) -> dict[str, Any]:
        shard = dict(fsdp=self.fsdp) if self.fsdp else dict(zero=0)
        return dict(model=self.model, hw=self.hardware_profile, gpus=self.dp, dp=self.dp, tp=1, pp=1, **shard,
                    micro_batch=self.micro_batch, global_batch=self.micro_batch * self.dp,
                    seq=self.seq_len_by_reading[self._reading(reading)], precision=self.precision,
                    attention=self.attention, recompute=self.recompute, optimizer=self.optimizer,
                    data_parallel="ddp")


def load_dgx_seed() -> list[DgxRun]:
    doc = _read_yaml("seeds_dgx_a100.yaml")
    s, readings = doc["setup"], doc["readings"]
    out = []
    for r in doc["runs"]:
        out.append(DgxRun(
            id=r["id"], model=r["model"], dp=r["plan"]["dp"], micro_batch=r["per_device_train_batch_size"],
            fsdp=r["plan"]["fsdp"], train_time_s=r["measured"]["train_time_s"],
            hardware_profile=doc["hardware"]["hardware_profile"], precision=s["precision"],
            optimizer=s["optimizer"], attention=s["attention"], recompute=s["recompute"],
            primary_reading=doc["primary_reading"],
            seq_len_by_reading={k: v["seq_len"] for k, v in readings.items()},
            steps_per_epoch_by_reading={k: v["steps_per_epoch"][r["model"]] for k, v in readings.items()},
        ))
    return out


# -- vTrain: 1,440 Megatron-DeepSpeed iterations on one A100 node ---------------------------------------
class VTrainRow(Row):
    gpus: int
    global_batch: int
    micro_batch: int
    d_model: int
    n_heads: int
    n_layers: int
    seq_len: int
    tp: int
    dp: int
    pp: int
    iter_time_s: float

    def model_spec(self, vocab: int = 50257) -> ModelSpec:
        name = f"vtrain-l{self.n_layers}-h{self.d_model}-a{self.n_heads}"
        return gpt2_like(name, self.n_layers, self.d_model, self.n_heads, vocab=vocab, max_positions=self.seq_len)

    def estimate_kwargs(self, meta: Optional[dict] = None) -> dict[str, Any]:
        meta = meta or vtrain_meta()
        s = meta["setup"]
        return dict(model=self.model_spec(meta["model"]["vocab"]), hw=meta["hardware"]["hardware_profile"],
                    gpus=self.gpus, dp=self.dp, tp=self.tp, pp=self.pp, zero=s["zero"], sp=s["sp"],
                    schedule=s["schedule"], virtual_stages=s["virtual_stages"], micro_batch=self.micro_batch,
                    global_batch=self.global_batch, seq=self.seq_len, precision=s["precision"],
                    attention=s["attention"], recompute=s["recompute"], optimizer=s["optimizer"],
                    data_parallel=s["data_parallel"], overlap_grad_reduce=s["overlap_grad_reduce"],
                    stack="megatron-deepspeed")  # Megatron-DeepSpeed's fused kernels, also for pure-DP rows


def vtrain_meta() -> dict:
    return _read_yaml("vtrain_a100.meta.yaml")


def load_vtrain() -> list[VTrainRow]:
    return [VTrainRow(**rec) for rec in _read_csv("vtrain_a100.csv")]


# -- nccl-tests all_reduce_perf, 2..8 A100 in one node -------------------------------------------------
class NcclRow(Row):
    n_gpus: int
    size_bytes: int
    count: int
    dtype: str
    time_s_run1: float
    time_s_run2: float
    time_s: float  # median of the two runs
    busbw_GBps_run1: float
    busbw_GBps_run2: float
    busbw_GBps: float  # median; nccl-tests: algbw * 2(n-1)/n for all_reduce

    @property
    def hardware_profile(self) -> str:
        return "dgx-a100"


def load_nccl_a100() -> list[NcclRow]:
    return [NcclRow(**rec) for rec in _read_csv("a100_nccl_allreduce.csv")]


# -- aiconfigurator kernel timings: GEMMs on A100, H100, B200 and H200, NCCL 2.27 collectives on A100 ---------
# the shipped profile of each timed GPU
GEMM_GPU_PROFILES = {"a100": "dgx-a100", "h100": "dgx-h100", "b200": "aws-p6-b200", "h200": "dgx-h200"}


class KernelGemmRow(Row):
    gpu: Literal["a100", "h100", "b200", "h200"]
    m: int
    n: int
    k: int
    math: Literal["fp16"]
    time_s: float

    @property
    def hardware_profile(self) -> str:
        return GEMM_GPU_PROFILES[self.gpu]


class KernelCollectiveRow(Row):
    collective: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
    n_gpus: int
    size_bytes: int  # the whole buffer, as nccl-tests' "size" (all-gather: the output; reduce-scatter: the input)
    time_s: float


def load_aiconfigurator_gemm() -> list[KernelGemmRow]:
    return [KernelGemmRow(**rec) for rec in _read_csv("aiconfigurator_gemm.csv")]


def load_aiconfigurator_gemm_small() -> list[KernelGemmRow]:
    """The same harness's thin GEMMs: m 1..768, n and k the powers of two 128..16384 (build_from_aiconfigurator)."""
    return [KernelGemmRow(**rec) for rec in _read_csv("aiconfigurator_gemm_small.csv")]


def load_aiconfigurator_nccl_a100() -> list[KernelCollectiveRow]:
    return [KernelCollectiveRow(**rec) for rec in _read_csv("aiconfigurator_nccl_a100.csv")]


# -- one H100: Hugging Face training steps ----------------------------------------------------------------
class Shape(Row):
    """A transformer's dimensions as the datasets record them."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab: int


class ModelShape(Shape):
    catalogue: Optional[str]
    family: Literal["gpt", "llama"]
    max_positions: int
    tied_embeddings: bool


class H100Row(Row):
    model: str
    shape: ModelShape
    params: int
    micro_batch: int
    seq_len: int
    precision: str
    precision_as_measured: str
    attention: str
    recompute: str
    optimizer: str
    optimizer_as_measured: str
    fwd_bwd_s: float
    opt_step_s: float
    step_time_s: float
    peak_mem_bytes: int
    peak_reserved_bytes: int
    mem_params_bytes: int
    mem_optimizer_states_bytes: int
    gpu: str
    torch: str

    def model_spec(self) -> ModelSpec:
        s = self.shape
        if s.catalogue:
            return CATALOGUE[s.catalogue]
        return llama_like(self.model, s.n_layers, s.d_model, s.n_heads, s.n_kv_heads, s.d_ff, s.vocab,
                          s.max_positions, tied=s.tied_embeddings)

    def estimate_kwargs(self) -> dict[str, Any]:
        return dict(model=self.shape.catalogue or self.model_spec(), hw="dgx-h100", gpus=1, dp=1, tp=1, pp=1,
                    zero=0, micro_batch=self.micro_batch, global_batch=self.micro_batch, seq=self.seq_len,
                    precision=self.precision, attention=self.attention, recompute=self.recompute,
                    optimizer=self.optimizer, stack=unclipped_loop())


def unclipped_loop():
    """The stack the H100 rows are costed in: the Trainer's profile (auto's on one GPU) without its max_grad_norm
    clipping, as the measured loop ran (reference/README.md, h100/: forward, backward and AdamW's step, timed apart as
    fwd_bwd_s and opt_step_s; nothing clips)."""
    from advisor.stack import load_stack

    trainer = load_stack("hf-trainer")
    return trainer.model_copy(update={"name": "h100-loop", "engine": trainer.engine.model_copy(
        update={"clip_grad_norm": False})})


def load_h100_single() -> list[H100Row]:
    lines = (DATA_DIR / "h100_single_gpu.jsonl").read_text().splitlines()
    return [H100Row(**json.loads(line)) for line in lines if line.strip()]


# -- published runs (papers, official tables) ------------------------------------------------------------
class PublishedRun(Shape):
    source_id: str
    model_name: str
    seq_len: int
    gpus: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    zero: int
    fsdp: Optional[str]
    micro_batch: int
    global_batch: int
    grad_accum: int
    schedule: Literal["1f1b", "gpipe", "interleaved"]
    virtual_stages: int
    sp: bool
    recompute: Literal["none", "selective", "full"]
    precision: str
    overlap_grad_reduce: bool
    hardware_profile: str
    measured_tflops_per_gpu: Optional[float]
    measured_step_time_s: Optional[float]
    step_time_s_from_tflops: Optional[float]  # derived with the source's own FLOP formula (SOURCES.md)
    mfu_percent: Optional[float]
    hfu_percent: Optional[float]
    flops_accounting: Optional[Literal["with_recompute", "without_recompute"]]
    trust: str
    assumptions: str

    @property
    def step_time_s(self) -> float:
        """The measured iteration time where published, else the one derived from TFLOP/s."""
        return self.measured_step_time_s if self.measured_step_time_s is not None else self.step_time_s_from_tflops

    def model_spec(self) -> ModelSpec:
        """Megatron GPT: LayerNorm, GELU MLP, learned positions, biases, tied embeddings."""
        return gpt2_like(self.source_id, self.n_layers, self.d_model, self.n_heads, vocab=self.vocab,
                         max_positions=self.seq_len, d_ff=self.d_ff)

    def estimate_kwargs(self) -> dict[str, Any]:
        shard = dict(fsdp=self.fsdp) if self.fsdp else dict(zero=self.zero)
        return dict(model=self.model_spec(), hw=self.hardware_profile, gpus=self.gpus, dp=self.dp, tp=self.tp,
                    pp=self.pp, **shard, sp=self.sp, schedule=self.schedule, virtual_stages=self.virtual_stages,
                    micro_batch=self.micro_batch, global_batch=self.global_batch, seq=self.seq_len,
                    precision=self.precision, recompute=self.recompute, data_parallel="ddp",
                    overlap_grad_reduce=self.overlap_grad_reduce,
                    # Megatron 2021-22: Adam, fused-softmax attention that stores the s x s scores (no flash)
                    optimizer="adamw-fused", attention="eager", stack="megatron-deepspeed")  # apex FusedAdam


def load_published_runs() -> list[PublishedRun]:
    return [PublishedRun(**rec) for rec in _read_csv("published_runs_normalised.csv")]


def load_published_skipped() -> dict[str, str]:
    """source_id -> why the row is not in published_runs_normalised.csv."""
    return {rec["source_id"]: rec["reason"] for rec in _read_csv("published_runs_skipped.csv")}


def load_published_runs_raw() -> list[dict]:
    return _read_yaml("published_runs.yaml")


def load_published_collectives() -> list[dict]:
    return _read_yaml("published_collectives.yaml")


def load_multinode_collectives() -> list[dict]:
    """validation/data/multinode_collectives.yaml (verbatim): collectives across nodes, one entry per system,
    collective and run, in published_collectives.yaml's schema (plain dicts; summaries have no measurements)."""
    return _read_yaml("multinode_collectives.yaml")


# the files' collective names (nccl-tests' binaries: alltoall_perf) -> advisor.comm.Collective
COLLECTIVE_NAMES = {"alltoall": "all_to_all"}


def collective_name(entry: dict) -> str:
    return COLLECTIVE_NAMES.get(entry["collective"], entry["collective"])


def collective_sweep(entry: dict) -> tuple[np.ndarray, np.ndarray]:
    """(sizes in bytes, times in seconds) of a published_collectives.yaml entry's measurements.

    The published time where the source gives one (nccl-tests output); where it gives only busbw (Stas Bekman's
    all_reduce_bench.py sweeps and GPU-count points, the ``mleng_*`` entries), the time that busbw stands for by
    nccl-tests' definition, t = S x bus_factor(n) / busbw (advisor.comm.bus_factor; n = the entry's num_gpus).
    Their busbw is published to 0.01 GB/s: below 1 MiB on several nodes (0.01-0.04 GB/s) that is a coarse time.
    The same holds for multinode_collectives.yaml's entries without a time column (``time_us: null``).
    """
    from advisor.comm import bus_factor

    factor = float(bus_factor(collective_name(entry), entry["hardware"]["num_gpus"]))
    pts = [(m["size_bytes"], m["time_us"] * 1e-6 if m.get("time_us") is not None
            else m["size_bytes"] * factor / (m["busbw_GBps"] * 1e9))
           for m in entry["measurements"]]
    return tuple(np.array(v, dtype=float) for v in zip(*pts))
