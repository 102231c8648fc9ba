"""Shared helpers of the robustness suites (tests/test_robust_*.py): run the CLI in-process, check that a
bad input is answered with one line and exit code 2, and count the bad inputs tried per surface
(printed at the end of the run by tests/conftest.py)."""

from __future__ import annotations

import contextlib
import io
from collections import Counter

from advisor.cli import main

TRIED: Counter = Counter()  # surface ("cli", "profiles", "models", "plans", "calibrate") -> bad inputs tried


def tried(surface: str, n: int = 1) -> None:
    TRIED[surface] += n


def run_main(args: list[str]) -> tuple[int, str, str]:
    """advisor's entry point in-process: (exit code, stdout, stderr). Any escaping exception is a failure."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(args: list[str], *needles: str) -> str:
    """The input is refused: exit code 2, exactly one line on stderr, no traceback, naming the needles."""
    code, _, err = run_main(args)
    assert code == 2, (args, code, err)
    assert err.endswith("\n") and err.count("\n") == 1, (args, err)
    assert "Traceback" not in err and err.startswith("error: "), (args, err)
    for needle in needles:
        assert needle in err, (args, needle, err)
    return err
