"""Start N local benchmark workers (env:// rendezvous on 127.0.0.1) and watch them.

A worker that dies or stops making progress for ``timeout_s`` ends the run with a one-line error that
names the rank; the other workers are stopped, and the measurements already appended to the results
JSONL stay there (a rerun with the same --out resumes). Progress: rank 0's position in the sweep, on
stderr, with the time left (advisor.calibrate.progress). Ctrl-C stops the workers the same way.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from advisor.calibrate.progress import SweepClock
from advisor.errors import AdvisorError

_WORKER = "import json,sys; from advisor.calibrate.microbench import BenchConfig, run_worker; " \
          "run_worker(BenchConfig(**json.loads(sys.argv[1])), sys.argv[2])"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(cfg, nproc: int, progress=None) -> None:
    """Run the sweep on ``nproc`` local ranks; raises AdvisorError naming a dead or hung rank."""
    beat_dir = tempfile.mkdtemp(prefix="advisor-calibrate-")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), PYTHONPATH=os.pathsep.join(filter(None, [_repo_root(), os.environ.get("PYTHONPATH")])))
    procs, logs = [], []
    for r in range(nproc):
        log = open(Path(beat_dir) / f"rank{r}.log", "w+")
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, json.dumps(asdict(cfg)), beat_dir],
                                      env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log, stderr=subprocess.STDOUT))
        logs.append(log)
    try:
        _watch(procs, logs, beat_dir, cfg.timeout_s, progress or _stderr_progress, SweepClock.for_sweep(cfg, nproc, nproc))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def _watch(procs, logs, beat_dir: str, timeout_s: float, progress, clock: SweepClock) -> None:
    start = last_change = time.time()
    last_beats: dict[int, str] = {}
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        for r, c in enumerate(codes):
            if c not in (None, 0):
                raise AdvisorError(f"calibrate: rank {r} died (exit {c}): {_last_line(logs[r])}; "
                                   "measurements so far are kept, rerun to resume")
        beats = {r: _read(Path(beat_dir) / f"rank{r}") for r in range(len(procs))}
        now = time.time()
        if beats != last_beats:
            last_beats, last_change = beats, now
            done, total, at = _position(beats.get(0, ""))
            if total:
                clock.observe(done, at or now)
                progress(done, total, now - start, clock.text(now))
        elif now - last_change > timeout_s:
            lagging = min(range(len(procs)), key=lambda r: _position(beats.get(r, ""))[0])
            raise AdvisorError(f"calibrate: rank {lagging} made no progress for {timeout_s:.0f} s (hung); "
                               "workers stopped, measurements so far are kept, rerun to resume")
        time.sleep(0.1)


def _stderr_progress(done: int, total: int, elapsed: float, eta: str = "") -> None:
    frac = done / total if total else 0.0
    bar = "#" * int(30 * frac)
    sys.stderr.write(f"\r[{bar:<30s}] {done}/{total} measurements, {elapsed:.0f} s" + (f", {eta} " if done < total else ""))
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def _position(text: str) -> tuple[int, int, float]:
    """(measurement rank 0 is at, measurements in the sweep, when it got there) from a beat file."""
    parts = text.split()
    try:
        return int(parts[0]), int(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0
    except (IndexError, ValueError):
        return 0, 0, 0.0


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _last_line(log) -> str:
    log.flush()
    log.seek(0)
    lines = [ln.strip() for ln in log.read().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _repo_root() -> str:
    return str(Path(__file__).resolve().parents[2])
