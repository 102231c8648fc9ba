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


@pytest.fixture(autouse=True, scope="session")
def _temporary_files_in_the_sessions_folder(tmp_path_factory):
    """Temporary folders the code under test makes (advisor calibrate's run folder, which a failed run keeps so that
    its error can name the logs) go under pytest's own base folder, which pytest prunes, not into /tmp for good."""
    import os
    import tempfile

    base = tmp_path_factory.mktemp("tmp")
    saved, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir, os.environ["TMPDIR"] = str(base), str(base)
    yield
    tempfile.tempdir = saved
    if saved_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved_env
