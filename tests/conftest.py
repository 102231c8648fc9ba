"""Session hooks: the robustness suites count the bad inputs they try; the count is printed at the end."""

from _robust import TRIED

SURFACES = ("cli", "profiles", "models", "plans", "calibrate")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not TRIED:
        return
    parts = ", ".join(f"{s} {TRIED.get(s, 0):,}" for s in SURFACES)
    terminalreporter.write_line(f"robustness: {sum(TRIED.values()):,} bad inputs tried ({parts})")
