"""Workers die with the process that started them (advisor.calibrate.launch), even when it is killed.

On Linux the kernel sends a worker SIGKILL when its parent exits (prctl PR_SET_PDEATHSIG, through ctypes);
elsewhere, and as a fallback, a daemon thread checks that the parent is still the worker's parent and ends the
worker when it is not. The launcher names itself in ADVISOR_CALIBRATE_PARENT; a worker started by anything
else (torchrun, whose agent stops its own workers) is left alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

PARENT_ENV = "ADVISOR_CALIBRATE_PARENT"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# How often the fallback looks for its parent: a worker left alone stops within a second, far inside the
# --timeout a hung rank is given (120 s by default), at the cost of one getppid call a second.
POLL_S = 1.0
EXIT_ORPHANED = 70  # the parent is gone (sysexits' EX_SOFTWARE): nothing is left to report to


def bind_to_parent() -> None:
    """Tie this worker's life to the launcher named in ADVISOR_CALIBRATE_PARENT (no-op without it)."""
    raw = os.environ.get(PARENT_ENV, "")
    if not raw.isdigit():
        return
    parent = int(raw)
    set_death_signal()
    if os.getppid() != parent:  # the launcher died before the death signal was set
        os._exit(EXIT_ORPHANED)
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="advisor-calibrate-lifeline").start()


def set_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent exits; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(EXIT_ORPHANED)  # from a thread: the process ends even inside a blocking collective
