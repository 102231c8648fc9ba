"""Rebuild aiconfigurator_gemm.csv, aiconfigurator_gemm_small.csv and aiconfigurator_nccl_a100.csv from NVIDIA's
aiconfigurator wheel.

Run from the repository root:
    pip download --no-deps aiconfigurator==0.4.0 -d /tmp/aic
    python -m validation.data.build_from_aiconfigurator /tmp/aic/aiconfigurator-0.4.0-py3-none-any.whl

aiconfigurator (Apache-2.0, NVIDIA; https://pypi.org/project/aiconfigurator/) ships kernel timings its
collector measured on each GPU ("silicon" data). Two of its tables are taken here, filtered and with the
units changed, nothing else:
- GEMMs: ``systems/data/a100_sxm/trtllm/1.0.0/gemm_perf.txt``, ``h100_sxm/trtllm/1.0.0rc3/gemm_perf.txt``,
  ``b200_sxm/trtllm/1.0.0rc6/gemm_perf.txt`` and ``h200_sxm/trtllm/1.0.0rc3/gemm_perf.txt`` (the H200's other
  tables, trtllm 0.20.0, sglang and vllm, are timed through other paths: no torch_flow rows), the rows timed
  through PyTorch (``kernel_source`` torch_flow, ``gemm_dtype`` float16): an (m x k) @ (k x n)
  matmul, ``latency`` in ms. Kept: m (tokens) 1024..8192, n and k from 128 to 16384: the shapes a
  training step's linear layers have (the table also has m down to 1 and n, k of 32..65536, inference shapes).
  aiconfigurator_gemm_small.csv: the same rows at m 1..768 (every m the table has below 1024) and n, k the powers of
  two 128..16384, the thin GEMMs of a routed expert's few tokens, to which the GPU's per-kernel time
  (efficiency.matmul_kernel_floor_us) is fitted (validation/validate_kernels.py kernel_floor).
- Collectives: ``systems/data/a100_sxm/nccl/2.27.3/nccl_perf.txt``, NCCL 2.27.3 on 2, 4 and 8 A100-SXM4-80GB
  of one NVSwitch node, ``nccl_dtype`` half: ``message_size`` is in elements of the whole buffer (the nccl-tests
  "size" / 2 bytes: its all-reduce busbw at 512 MiB, 222 GB/s on 8 GPUs, matches the vTrain node's 230 GB/s
  only read so), ``latency`` in ms.
"""

from __future__ import annotations

import csv
import io
import sys
import zipfile
from pathlib import Path

from validation.data.build_from_reference import _write_csv

# in this order: the A100 and H100 rows come first, as they did before the B200 and H200 were added
GEMM_FILES = {"a100": "aiconfigurator/systems/data/a100_sxm/trtllm/1.0.0/gemm_perf.txt",
              "h100": "aiconfigurator/systems/data/h100_sxm/trtllm/1.0.0rc3/gemm_perf.txt",
              "b200": "aiconfigurator/systems/data/b200_sxm/trtllm/1.0.0rc6/gemm_perf.txt",
              "h200": "aiconfigurator/systems/data/h200_sxm/trtllm/1.0.0rc3/gemm_perf.txt"}
NCCL_FILE = "aiconfigurator/systems/data/a100_sxm/nccl/2.27.3/nccl_perf.txt"
COLLECTIVE = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
              "alltoall": "all_to_all"}


def _reader(source: Path, member: str):
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as z:
            return csv.DictReader(io.StringIO(z.read(member).decode()))
    return csv.DictReader(io.StringIO((source / member).read_text()))


def _gemm_rows(source: Path, keep) -> list[list]:
    """The fp16 torch_flow GEMM rows of every GPU whose (m, n, k) ``keep`` takes, latency in seconds."""
    out = []
    for gpu, member in GEMM_FILES.items():
        for r in _reader(source, member):
            if r["kernel_source"] != "torch_flow" or r["gemm_dtype"] != "float16":
                continue
            m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
            if keep(m, n, k):
                out.append([gpu, m, n, k, "fp16", repr(float(r["latency"]) * 1e-3)])
    return out


def gemm_rows(source: Path) -> list[list]:
    return _gemm_rows(source, lambda m, n, k: 1024 <= m <= 8192 and 128 <= n <= 16384 and 128 <= k <= 16384)


# the powers of two of n and k kept at small m: the 8 of the 18 training-sized values that span them, at 1/5 the rows
SMALL_NK = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def gemm_small_rows(source: Path) -> list[list]:
    return _gemm_rows(source, lambda m, n, k: m < 1024 and n in SMALL_NK and k in SMALL_NK)


def nccl_rows(source: Path) -> list[list]:
    return [[COLLECTIVE[r["op_name"]], int(r["num_gpus"]), int(r["message_size"]) * 2, repr(float(r["latency"]) * 1e-3)]
            for r in _reader(source, NCCL_FILE) if r["nccl_dtype"] == "half"]


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    source = Path(argv[0])
    n = _write_csv("aiconfigurator_gemm.csv", ["gpu", "m", "n", "k", "math", "time_s"], gemm_rows(source))
    s = _write_csv("aiconfigurator_gemm_small.csv", ["gpu", "m", "n", "k", "math", "time_s"], gemm_small_rows(source))
    c = _write_csv("aiconfigurator_nccl_a100.csv", ["collective", "n_gpus", "size_bytes", "time_s"], nccl_rows(source))
    print(f"aiconfigurator_gemm.csv: {n} rows; aiconfigurator_gemm_small.csv: {s} rows; "
          f"aiconfigurator_nccl_a100.csv: {c} rows")


if __name__ == "__main__":
    main(sys.argv[1:])
