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

import numpy as np

from advisor.errors import AdvisorError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
_DTYPE_MATH = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "tf32": "tf32",
               "bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}


class CalibrationError(AdvisorError):
    """Measurements that cannot be read or fitted; one line for the user."""


def parse_sizes(text: str) -> list[int]:
    """'1K:1G' -> 1 KiB, 2 KiB, ... 1 GiB (doubling); '4M' -> [4 MiB]; '1K,8K' -> a list (binary units)."""

    def one(s: str) -> int:
        s = s.strip().upper().removesuffix("B").removesuffix("I")
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        try:
            return int(float(s[:-1] if s[-1:] in ("K", "M", "G") else s) * mult)
        except ValueError:
            raise CalibrationError(f"sizes: cannot read {s!r}; use e.g. 1K:1G, 4M, or 1K,64K,1M") from None

    if ":" in text:
        lo, hi = (one(x) for x in text.split(":", 1))
        if not 0 < lo <= hi:
            raise CalibrationError(f"sizes {text}: need 0 < start <= end")
        out = [lo]
        while out[-1] * 2 <= hi:
            out.append(out[-1] * 2)
        return out
    out = [one(x) for x in text.split(",") if x.strip()]
    if not out or min(out) < 0:
        raise CalibrationError(f"sizes {text!r}: give sizes like 1K:1G")
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
    if not p.is_file():
        raise CalibrationError(f"measurements file {str(p)!r} not found")
    if p.suffix == ".csv":
        return _read_nccl_tests_csv(p)
    try:
        lines = p.read_text().splitlines()
    except UnicodeDecodeError:
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


_LINKS = ("intra", "inter", "world")  # world: all GPUs of several nodes, with per_node
_KINDS = ("collective", "matmul", "copy", "optimizer", "sdpa_fwd")


def _check_row(row: dict, where: str) -> dict:
    """One measurement, validated: known kind/link/collective, finite positive numbers (rows with a failed
    status are kept as reported failures). Raises a one-line CalibrationError naming the place."""
    kind = row.get("kind")
    if kind not in _KINDS:
        raise CalibrationError(f"{where}: unknown measurement kind {kind!r} (known: {', '.join(_KINDS)})")
    if row.get("status", "ok") != "ok":
        return row
    need = {"collective": ("n_ranks", "size_bytes", "time_s"), "copy": ("bytes_moved", "time_s"),
            "optimizer": ("params", "time_s"), "matmul": ("m", "n", "k", "time_s"), "sdpa_fwd": ("time_s",)}[kind]
    for key in need:
        val = row.get(key)
        try:
            num = float(val)
        except (TypeError, ValueError):
            raise CalibrationError(f"{where}: {kind} row needs a number in {key!r} (got {val!r})") from None
        if not (np.isfinite(num) and num > 0):
            raise CalibrationError(f"{where}: {key}={val!r} must be a positive finite number")
    if kind == "collective":
        if row.get("link", "intra") not in _LINKS:
            raise CalibrationError(f"{where}: unknown link {row.get('link')!r} (use intra, inter or world)")
        if row.get("link") == "world":
            g = row.get("per_node")
            if not (isinstance(g, int) and not isinstance(g, bool) and 1 <= g <= float(row["n_ranks"])):
                raise CalibrationError(f"{where}: a world row needs per_node, the GPUs per node (an integer from 1 "
                                       f"to n_ranks; got {g!r})")
        if row.get("collective") not in COLLECTIVES:
            raise CalibrationError(f"{where}: unknown collective {row.get('collective')!r} (known: {', '.join(COLLECTIVES)})")
        if float(row["n_ranks"]) < 2:
            raise CalibrationError(f"{where}: n_ranks={row['n_ranks']!r}: a collective needs at least 2 ranks")
    return row


def _read_nccl_tests_csv(p: Path) -> list[dict]:
    m = re.match(r"([a-z_]+?)_(\d+)gpu$", p.stem)
    if not m or m.group(1) not in COLLECTIVES:
        raise CalibrationError(f"{p.name}: expected a name like all_reduce_<n>gpu.csv (nccl-tests sweep)")
    coll, n = m.group(1), int(m.group(2))
    rows = []
    with p.open() as fh:
        for rec in csv.reader(fh):
            if not rec or not rec[0].strip().isdigit():
                continue  # header
            times = [float(rec[i]) * 1e-9 for i in range(3, len(rec), 2) if rec[i].strip()]
            rows.append({"kind": "collective", "collective": coll, "link": "intra", "n_ranks": n,
                         "size_bytes": float(rec[0]), "time_s": float(np.median(times)),
                         "times_s": times, "status": "ok", "source": p.name})
    return rows


def _normalise(raw: dict, where: str) -> dict:
    """Map the reference kernel/optimizer rows onto our kinds; our own rows pass through."""
    if not isinstance(raw, dict) or "kind" not in raw:
        raise CalibrationError(f"{where}: a measurement needs a 'kind' field")
    kind = raw["kind"]
    if kind == "adamw_step":  # reference/h100/optim.jsonl
        impl = "adamw-fused" if raw.get("impl") == "fused" else "adamw"
        return {"kind": "optimizer", "optimizer": impl, "params": raw["params"], "time_s": raw["s"], "status": "ok"}
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
