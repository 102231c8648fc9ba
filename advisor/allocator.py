"""The process's memory allocator, tuned for the search's arrays.

A search evaluates a few hundred thousand plans at once: every step of the cost model makes a temporary array of
about 2 MB and frees it. glibc's malloc serves blocks that large with mmap and hands them back on free, so each new
temporary is page-faulted in anew: about half of evaluate()'s time on the GPT-3 175B / 1,536-GPU search (measured:
benchmarks/bench_search.py ~0.65 M candidates/s as is, ~1.2 M with the settings below). Raising the mmap threshold
above those arrays and keeping freed memory in the heap lets them be reused. The command line (advisor.cli.main)
does it once at start; the Python API leaves the process as it found it unless its caller asks
(``advisor.allocator.tune()``). Elsewhere than glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import sys

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# blocks below 32 MiB come from the heap (glibc's ceiling for this setting on 64-bit: 4 Mi x sizeof(long)); the
# search's largest temporaries (a million plans x 8 bytes) stay under it
MMAP_THRESHOLD = 32 * 1024 * 1024
# freed heap memory is returned to the system only beyond 1 GiB at its top, and the heap grows 256 MiB at a time:
# a search's working set (a few hundred MB) is then allocated once
TRIM_THRESHOLD = 1024 * 1024 * 1024
TOP_PAD = 256 * 1024 * 1024

_done: list[bool] = []


def tune() -> bool:
    """Apply the settings above once per process; True where glibc took them."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6")
            ok = all(libc.mallopt(p, v) == 1 for p, v in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                                                          (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
        except (OSError, AttributeError):  # not glibc (musl has no mallopt): the allocator as it is
            ok = False
    _done.append(ok)
    return ok
