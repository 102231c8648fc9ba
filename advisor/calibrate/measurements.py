"""Measurements for calibration: reading and checking them (no fitting, no torch).

Reads our results JSONL (advisor.calibrate.microbench), nccl-tests CSVs (``all_reduce_<n>gpu.csv``:
size(B),count,type,time(ns),busbw,time(ns),busbw, a file or a folder of them) and the reference
kernel/optimizer JSONL (kernels.jsonl, optim.jsonl) into one row format, checking every row (known kind,
link and collective; finite positive numbers) so that a damaged file is a one-line error naming file:line.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Optional

import numpy as np

from advisor.errors import AdvisorError
from advisor.io import not_a_file, read_text

# A sweep writes one row per link group, collective and size (advisor/calibrate/microbench.py:58-73: at most 8
# groups (2 to 64 ranks in a node, one a node, all) x 5 collectives x 21 sizes (1K:1G, the default) = 840 rows)
# and a few dozen kernel rows, each ~300 bytes: 35 rows on 2 CPU ranks at 1K:64K took 11 KB, the largest sweep
# ~250 KB. read_text's 16 MiB bound (advisor/io.py:23) holds 60 of those.
RESULTS_REAL = "at most a few hundred KB"

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
_DTYPE_MATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "tf32": "tf32",
               "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


class CalibrationError(AdvisorError):
    """Measurements that cannot be read or fitted; one line for the user."""


def parse_sizes(text: str, flag: str = "--sizes") -> list[int]:
    """'1K:1G' -> 1 KiB, 2 KiB, ... 1 GiB (doubling); '4M' -> [4 MiB]; '1K,8K' -> a list (binary units). A size that
    cannot be read is one line naming ``flag`` (the option it came from) and the part it could not read."""

    def one(given: str) -> int:
        s = given.strip().upper().removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        try:
            value = float(s[:-1] if s[-1:] in ("K", "M", "G") else s) * mult
            if not np.isfinite(value):
                raise ValueError
            return int(value)
        except ValueError:
            raise CalibrationError(f"{flag} {text!r}: cannot read {given.strip()!r}; use e.g. 1K:1G, 4M, or "
                                   "1K,64K,1M (bytes, K/M/G binary)") from None

    if ":" in text:
        lo, hi = (one(x) for x in text.split(":", 1))
        if not 0 < lo <= hi:
            raise CalibrationError(f"{flag} {text}: need 0 < start <= end, e.g. 1K:1G")
        out = [lo]
        while out[-1] * 2 <= hi:
            out.append(out[-1] * 2)
        return out
    out = [one(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 0:
        raise CalibrationError(f"{flag} {text!r}: give sizes like 1K:1G")
    return out


def on_cpu_note(info: dict) -> str:
    if info.get("backend") == "gloo":
        info["cpu_note"] = ("measured with gloo on CPU: the fitted link and efficiency figures describe this CPU "
                            "machine and its gloo transport, not the base profile's GPU")
        return "note: " + info["cpu_note"]
    return ""


def read_results(path: str | Path) -> list[dict]:
    """Rows from a results JSONL, an nccl-tests CSV, or a folder of either (sorted by name)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(x for x in p.iterdir() if x.suffix in (".csv", ".jsonl"))
        if not files:
            raise CalibrationError(f"{p}: no .csv or .jsonl measurement files in this folder")
        return [row for f in files for row in read_results(f)]
    if not p.is_file() and not_a_file(p) is None:  # missing (a FIFO, a device: read_text names it)
        raise CalibrationError(f"measurements file {str(p)!r} not found: give a results JSONL, an nccl-tests CSV or "
                               "a folder of them")
    if p.suffix == ".csv":
        return _read_nccl_tests_csv(p)
    try:  # bounded, regular files only: /dev/zero or a FIFO is refused, a 2 GB file not read into memory
        lines = read_text(p, "results JSONL", CalibrationError, real=RESULTS_REAL).splitlines()
    except CalibrationError as exc:
        if "not UTF-8" not in str(exc):
            raise
        raise CalibrationError(f"{p}: not a text file of JSON lines (results JSONL) or an nccl-tests CSV") from None
    rows = []
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=0)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            # a run killed mid-write leaves at most one torn last line (a resumed run repairs it before
            # appending: repair_torn_tail): skip it; anywhere else it is a damaged file
            if i == last and rows:
                continue
            raise CalibrationError(f"{p}:{i}: not a JSON object: fix or remove that line") from None
        except ValueError:  # int() beyond sys.get_int_max_str_digits: no measurement has a number of 4,300 digits
            raise CalibrationError(f"{p}:{i}: a number of thousands of digits: no measurement has one; fix or remove "
                                   "that line") from None
        rows.append(_check_row(_normalise(raw, f"{p}:{i}"), f"{p}:{i}"))
    return rows


def repair_torn_tail(path: str | Path) -> int:
    """Cut a torn last line (a run killed mid-write) so that appended rows start on a line of their own.

    Returns the bytes removed. Called by the sweep before it appends to an existing results file."""
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        return 0
    data = p.read_bytes()
    if data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with p.open("r+b") as fh:  # the results file the operator named with --out
        fh.truncate(keep)
    return len(data) - keep


# the optimizer steps a row may time: what `advisor calibrate` times (advisor.calibrate.microbench) and the profiles'
# optimizer_bandwidth keys (advisor.training.Optimizer)
OPTIMIZERS = ("adamw", "adamw-fused", "sgd")
_LINKS = ("intra", "inter", "world")  # world: all GPUs of several nodes, with per_node
_KINDS = ("collective", "overlap", "matmul", "copy", "optimizer", "sdpa_fwd")

# What no measurement of one rank can show; a row beyond these is a damaged or made-up file, refused by name.
# 100 TB/s: 12x the fastest memory shipping (B200 HBM3e, 8 TB/s) and 55x NVLink 5's 1.8 TB/s per GPU.
MAX_BYTES_PER_S = 1e14
# 100 PFLOP/s: 10x a B200's dense FP4 peak (9 PFLOP/s), the fastest GPU arithmetic shipping.
MAX_FLOPS_PER_S = 1e17
# 100 ns: no kernel or collective a rank times takes less (a CUDA launch alone takes 2-5 us; nccl-tests' smallest
# all-reduce on one NVSwitch node, 8 B, ~10 us): 20x margin below either.
MIN_TIME_S = 1e-7
# 2^20 ranks: 10x the largest training clusters reported (~10^5 GPUs).
MAX_RANKS = 1 << 20


def _check_row(row: dict, where: str) -> dict:
    """One measurement, validated: known kind/link/collective, finite positive numbers that a machine can
    produce (rows with a failed status are kept as reported failures). Raises a one-line CalibrationError
    naming the place."""
    kind = row.get("kind")
    if kind not in _KINDS:
        raise CalibrationError(f"{where}: unknown measurement kind {kind!r} (known: {', '.join(_KINDS)})")
    if row.get("status", "ok") != "ok":
        return row
    need = {"collective": ("n_ranks", "size_bytes", "time_s"), "copy": ("bytes_moved", "time_s"),
            "overlap": ("n_ranks", "size_bytes", "time_s", "compute_s", "collective_s"),
            "optimizer": ("params", "time_s"), "matmul": ("m", "n", "k", "time_s"), "sdpa_fwd": ("time_s",)}[kind]
    shape = ("b", "heads", "s", "d") if kind == "sdpa_fwd" and any(k in row for k in ("b", "heads", "s", "d")) else ()
    for key in need + shape:
        val = row.get(key)
        num = _number(val)
        if num is None:  # JSON numbers only: true, "8" and 1e400-sized integers are a damaged or hand-made row
            raise CalibrationError(f"{where}: {kind} row needs a number in {key!r} (got {_short(val)})")
        if not (np.isfinite(num) and num > 0):
            raise CalibrationError(f"{where}: {key}={_short(val)} must be a positive finite number")
    if kind == "optimizer" and row.get("optimizer") not in OPTIMIZERS:
        raise CalibrationError(f"{where}: unknown optimizer {_short(row.get('optimizer'))} (known: {', '.join(OPTIMIZERS)})")
    if kind in ("collective", "overlap"):
        _check_collective(row, where)
    if kind == "overlap":
        _check_overlap(row, where)
    _check_physical(row, where)
    return row


def _number(val) -> Optional[float]:
    """A JSON number as a float (None for anything else: a bool, a string, an integer too large for a float)."""
    if isinstance(val, bool) or not isinstance(val, (int, float, np.integer, np.floating)):
        return None
    try:
        return float(val)
    except OverflowError:
        return None


def _short(val) -> str:
    """A value for a one-line message, cut where it is long (a 400-digit integer)."""
    text = repr(val)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_overlap(row: dict, where: str) -> None:
    """A GEMM loop beside an all-gather (advisor.calibrate.overlap): over the node or every GPU, its times possible,
    the GPU's SM count a whole number (null on CPU)."""
    if row.get("collective") != "all_gather" or row.get("link") not in ("intra", "world"):
        raise CalibrationError(f"{where}: an overlap row times an all-gather over the node (link intra) or every GPU "
                               f"(link world), not {row.get('collective')!r} over {row.get('link')!r}")
    if min(float(row["compute_s"]), float(row["collective_s"])) < MIN_TIME_S:
        raise CalibrationError(f"{where}: compute_s and collective_s must be at least {MIN_TIME_S:g} s (seconds)")
    sms = row.get("sm_count")
    if sms is not None and not (isinstance(sms, int) and not isinstance(sms, bool) and 1 <= sms <= 100_000):
        raise CalibrationError(f"{where}: sm_count={sms!r}: the GPU's SMs, a whole number (or null on CPU)")


def _check_collective(row: dict, where: str) -> None:
    if row.get("link", "intra") not in _LINKS:
        raise CalibrationError(f"{where}: unknown link {row.get('link')!r} (use intra, inter or world)")
    if row.get("collective") not in COLLECTIVES:
        raise CalibrationError(f"{where}: unknown collective {row.get('collective')!r} (known: {', '.join(COLLECTIVES)})")
    n = float(row["n_ranks"])
    if n < 2:
        raise CalibrationError(f"{where}: n_ranks={row['n_ranks']!r}: a collective needs at least 2 ranks")
    if n != int(n) or n > MAX_RANKS:
        raise CalibrationError(f"{where}: n_ranks={row['n_ranks']!r}: give the ranks of the group, a whole number "
                               f"from 2 to at most {MAX_RANKS}")
    if row.get("link") == "world":
        g = row.get("per_node")
        if not (isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= n):
            raise CalibrationError(f"{where}: a world row needs per_node, the GPUs per node (an integer from 1 "
                                   f"to n_ranks; got {g!r})")


def _check_physical(row: dict, where: str) -> None:
    """Refuse a time no machine measures, and a rate (bytes or FLOPs per second) above any memory, link or GPU."""
    kind, t = row["kind"], float(row["time_s"])
    if t < MIN_TIME_S:
        raise CalibrationError(f"{where}: time_s={row['time_s']!r} is shorter than any kernel or collective takes "
                               f"({MIN_TIME_S:g} s); check the file's units (seconds)")
    nbytes = {"collective": lambda: float(row["size_bytes"]), "overlap": lambda: float(row["size_bytes"]),
              "copy": lambda: float(row["bytes_moved"]),
              # a step reads every fp32 parameter at least once
              "optimizer": lambda: 4.0 * float(row["params"])}.get(kind)
    if nbytes is not None and nbytes() / t > MAX_BYTES_PER_S:
        raise CalibrationError(f"{where}: {kind} at {nbytes() / t:.3g} B/s is faster than any memory or link "
                               f"({MAX_BYTES_PER_S:.0e} B/s); check its bytes and time_s (seconds)")
    if kind == "matmul":
        flops = 2.0 * float(row["m"]) * float(row["n"]) * float(row["k"])
    elif kind == "sdpa_fwd" and all(c in row for c in ("b", "heads", "s", "d")):
        flops = 2.0 * float(row["b"]) * float(row["heads"]) * float(row["s"]) ** 2 * float(row["d"])  # causal
    else:
        return
    if flops / t > MAX_FLOPS_PER_S:
        raise CalibrationError(f"{where}: {kind} at {flops / t:.3g} FLOP/s is faster than any GPU "
                               f"({MAX_FLOPS_PER_S:.0e} FLOP/s); check its shape and time_s (seconds)")


def _read_nccl_tests_csv(p: Path) -> list[dict]:
    m = re.match(r"([a-z_]+?)_(\d+)gpu$", p.stem)
    if not m or m.group(1) not in COLLECTIVES:
        raise CalibrationError(f"{p.name}: expected a name like all_reduce_<n>gpu.csv (nccl-tests sweep)")
    coll, n = m.group(1), int(m.group(2))
    rows = []
    text = read_text(p, "nccl-tests CSV", CalibrationError, real=RESULTS_REAL)
    for i, rec in enumerate(csv.reader(text.splitlines()), 1):
        if not rec or not rec[0].strip().isdigit():
            continue  # header
        try:
            times = [float(rec[k]) * 1e-9 for k in range(3, len(rec), 2) if rec[k].strip()]
        except ValueError:
            raise CalibrationError(f"{p}:{i}: the time columns (ns) must be numbers; fix or remove that line") from None
        if not times:
            raise CalibrationError(f"{p}:{i}: no time column (size,count,type,time(ns),busbw,...); fix or remove that line")
        row = {"kind": "collective", "collective": coll, "link": "intra", "n_ranks": n,
               "size_bytes": float(rec[0]), "time_s": float(np.median(times)),
               "times_s": times, "status": "ok", "source": p.name}
        rows.append(_check_row(row, f"{p}:{i}"))
    return rows


def _normalise(raw: dict, where: str) -> dict:
    """Map the reference kernel/optimizer rows onto our kinds; our own rows pass through."""
    if not isinstance(raw, dict) or "kind" not in raw:
        raise CalibrationError(f"{where}: a measurement needs a 'kind' field")
    kind = raw["kind"]
    if kind == "adamw_step":  # reference/h100/optim.jsonl
        impl = "adamw-fused" if raw.get("impl") == "fused" else "adamw"
        return {"kind": "optimizer", "optimizer": impl, "params": raw.get("params"), "time_s": raw.get("s"), "status": "ok"}
    if kind == "sdpa_fwd" and "s_time" in raw and "time_s" not in raw:  # there "s" is the sequence length
        return dict(raw, time_s=raw["s_time"], status="ok")
    if kind in ("matmul", "copy") and "s" in raw and "time_s" not in raw:
        row = dict(raw, time_s=raw["s"], status="ok")
        if kind == "matmul":
            row["math"] = _math_of(raw)
        return row
    return dict(raw)


def _math_of(raw: dict) -> str:
    dt = str(raw.get("dtype", "float32"))
    if raw.get("tf32") or "tf32" in dt:
        return "tf32"
    return _DTYPE_MATH.get(dt.replace("torch.", ""), dt)
