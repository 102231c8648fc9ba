"""Session hooks: the robustness suites count the bad inputs they try; the count is printed at the end. One full
validation run is shared by the suites that read it (test_validate, test_golden)."""

import sys
from pathlib import Path

import pytest
from _robust import TRIED

ROOT = Path(__file__).resolve().parents[1]

SURFACES = ("cli", "profiles", "models", "plans", "calibrate")


def pytest_sessionfinish(session, exitstatus):
    """Under pytest-xdist each worker counts its own tries: it hands them to the controller with its output."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["robust_tried"] = dict(TRIED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """(controller, pytest-xdist) a worker's count of bad inputs tried, added to the session's."""
    TRIED.update(getattr(node, "workeroutput", {}).get("robust_tried", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TRIED:
        return
    parts = ", ".join(f"{s} {TRIED.get(s, 0):,}" for s in SURFACES)
    terminalreporter.write_line(f"robustness: {sum(TRIED.values()):,} bad inputs tried ({parts})")


@pytest.fixture(scope="session")
def validation_report():
    """``validation.validate.run()`` over every dataset, once per session (~30 s on 2 cores)."""
    if str(ROOT) not in sys.path:  # `validation` is not an installed package; run from a checkout
        sys.path.insert(0, str(ROOT))
    from validation.validate import run

    return run()
