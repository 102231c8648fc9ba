"""Start N local benchmark workers (env:// rendezvous on 127.0.0.1), watch them, and stop them.

- Workers run ``python -P`` (``-I`` before Python 3.11) in a private folder: neither the directory
  ``advisor calibrate`` runs in nor anything in it is on their import path (a json.py there ran in every
  worker); they import advisor and torch from the installed packages.
- Their number is bounded (check_nproc): WORKERS_PER_CORE per usable CPU core, never more than MAX_LOCAL_WORKERS.
- Each worker has a process group of its own, stopped as a group, and dies with the launcher even when the
  launcher is killed (advisor.calibrate.lifeline). SIGTERM and SIGHUP stop the run as Ctrl-C does.
- A worker that dies or stops making progress for ``timeout_s`` ends the run with a one-line error that names
  the rank; the other workers are stopped, and the measurements already appended to the results JSONL stay
  there (a rerun with the same --out resumes).
- Progress: rank 0's position in the sweep, on stderr, with the time left (advisor.calibrate.progress).
- The run folder (beats, one log per rank) is removed after a run that succeeded; a failed run keeps it, and
  its error names it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

from advisor.calibrate.lifeline import PARENT_ENV
from advisor.calibrate.measurements import CalibrationError
from advisor.calibrate.overlap import overlap_plan
from advisor.calibrate.progress import SweepClock

_WORKER = "import json,sys; from advisor.calibrate.microbench import BenchConfig, run_worker; " \
          "run_worker(BenchConfig(**json.loads(sys.argv[1])), sys.argv[2])"
# -P (3.11+) leaves the working directory off sys.path and keeps the user's site-packages; -I, the only way
# before 3.11, also drops user site-packages and PYTHON* variables.
ISOLATION = ("-P",) if sys.version_info >= (3, 11) else ("-I",)

# A worker is a Python process with torch loaded (~0.3-0.5 GB). On CPU (gloo) each rank is one busy thread:
# beyond a few per core the ranks only time-slice and measure the scheduler; 4 per core still lets a 2-core CI
# machine run the 4-rank sweep the tests use.
WORKERS_PER_CORE = 4
# The largest single nodes hold 8-16 GPUs; 64 local ranks is four times that, and ~30 GB of worker memory.
MAX_LOCAL_WORKERS = 64


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_nproc(nproc: int, cores: int | None = None) -> None:
    """Refuse more local workers than this machine can run (one line naming the bound)."""
    cores = usable_cores() if cores is None else cores
    limit = min(MAX_LOCAL_WORKERS, WORKERS_PER_CORE * cores)
    if nproc > limit:
        raise CalibrationError(f"--nproc {nproc}: at most {limit} local workers on this machine ({WORKERS_PER_CORE} "
                               f"per CPU core x {cores} cores, and never more than {MAX_LOCAL_WORKERS}); give a "
                               "smaller --nproc, or run under torchrun across nodes")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(cfg, nproc: int, progress=None) -> None:
    """Run the sweep on ``nproc`` local ranks; raises CalibrationError naming a dead or hung rank."""
    check_nproc(nproc)
    cfg = replace(cfg, out=str(Path(cfg.out).resolve()))  # workers run in their own folder
    beat_dir = tempfile.mkdtemp(prefix="advisor-calibrate-")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), **{PARENT_ENV: str(os.getpid())})
    shown = progress or _StderrProgress()
    procs, logs = [], []
    with _stop_on_terminate():
        try:
            for r in range(nproc):
                log = open(Path(beat_dir) / f"rank{r}.log", "w+")
                logs.append(log)
                procs.append(subprocess.Popen([sys.executable, *ISOLATION, "-c", _WORKER, json.dumps(asdict(cfg)), beat_dir],
                                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), cwd=beat_dir, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            _watch(procs, logs, beat_dir, cfg.timeout_s, shown, SweepClock.for_sweep(cfg, nproc, nproc),
                   len(overlap_plan(cfg, nproc, nproc)))
        finally:
            getattr(shown, "end", lambda: None)()
            for p in procs:
                _stop(p)
            for log in logs:
                log.close()
    shutil.rmtree(beat_dir, ignore_errors=True)  # a run that failed keeps its folder: the error names its logs


def _stop(p: subprocess.Popen) -> None:
    """Stop a worker and anything it started (its own process group)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            p.kill()
    p.wait()


class _stop_on_terminate:
    """SIGTERM and SIGHUP raise KeyboardInterrupt in the launcher (main thread only), so the workers are stopped
    and the run ends as after Ctrl-C; the previous handlers come back afterwards."""

    SIGNALS = tuple(getattr(signal, s) for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s))

    def __enter__(self):
        self.saved = {}
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self.saved[s] = signal.signal(s, _interrupt)
        return self

    def __exit__(self, *exc):
        for s, handler in self.saved.items():
            signal.signal(s, handler)
        return False


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _watch(procs, logs, beat_dir: str, timeout_s: float, progress, clock: SweepClock, overlaps: int = 0) -> None:
    """Wait for the workers, showing rank 0's place in the sweep: the collectives (with the clock's time left), then
    the ``overlaps`` measurements of compute beside a collective, counted on past them."""
    start = last_change = time.time()
    last_beats: dict[int, str] = {}
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return
        for r, c in enumerate(codes):
            if c not in (None, 0):
                raise CalibrationError(f"calibrate: rank {r} died (exit {c}): {_last_line(logs[r])}; "
                                       f"measurements so far are kept, rerun to resume (log: {logs[r].name})")
        beats = {r: _read(Path(beat_dir) / f"rank{r}") for r in range(len(procs))}
        now = time.time()
        if beats != last_beats:
            last_beats, last_change = beats, now
            shown = _shown(beats.get(0, ""), clock, overlaps, now)
            if shown is not None:
                progress(shown[0], shown[1], now - start, shown[2])
        elif now - last_change > timeout_s:
            lagging = min(range(len(procs)), key=lambda r: _position(beats.get(r, ""))[0])
            raise CalibrationError(f"calibrate: rank {lagging} made no progress for {timeout_s:.0f} s (hung); "
                                   "workers stopped, measurements so far are kept, rerun to resume "
                                   f"(on a loaded machine with a larger --timeout than {timeout_s:.0f}: one measurement "
                                   f"beats only when it ends; logs: {beat_dir})")
        time.sleep(0.1)


class _StderrProgress:
    """One progress line on stderr, redrawn in place; ended with a newline before anything else is printed."""

    def __init__(self):
        self.open = False

    def __call__(self, done: int, total: int, elapsed: float, eta: str = "") -> None:
        frac = done / total if total else 0.0
        bar = "#" * int(30 * frac)
        self.open = done < total
        sys.stderr.write(f"\r[{bar:<30s}] {done}/{total} measurements, {elapsed:.0f} s" + (f", {eta} " if self.open else ""))
        if not self.open:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def end(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.open = False


def _shown(beat: str, clock: SweepClock, overlaps: int, now: float) -> tuple[int, int, str] | None:
    """(measurements done, of how many, the time-left text) from rank 0's beat ("i n t" in the collectives, then
    "n n t overlap j" and "n n t done"); None before it has written one."""
    done, total, at = _position(beat)
    if not total:
        return None
    phase = beat.split()[3:5]
    if phase[:1] == ["overlap"]:
        j = int(phase[1]) if len(phase) > 1 and phase[1].isdigit() else 0
        return total + j, total + overlaps, f"compute beside a collective, {j + 1} of {overlaps}"
    clock.observe(done, at or now)
    return (total + overlaps if phase[:1] == ["done"] else done), total + overlaps, clock.text(now)


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
    # torchrun-style rank prefixes off; the exception's own line rather than what a C++ error appends after it
    # (torch's "Exception raised from ... <omitting python frames>", then a lone quote)
    lines = [re.sub(r"^\[rank\d+\]:\s*", "", ln).strip() for ln in log.read().splitlines()]
    lines = [ln for ln in lines if ln]
    raised = [ln for ln in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: |$)", ln)]
    last = (raised or lines or ["no output"])[-1][:300]
    if "No module named 'advisor'" in last or "No module named 'torch'" in last:
        last += (" (workers import advisor and torch from this Python's installed packages, never from the "
                 "working directory: pip install -e . here)")
    return last
