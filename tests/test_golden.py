"""Every figure `advisor plan --json` printed for sixteen varied searches, and every prediction `advisor validate`
made, equal what was recorded (tests/golden/record.py) within 1e-9 relative: a change meant to move no number
moves none. Keys may be added; a recorded key that is renamed or whose value changed on purpose is listed in
CHANGED with the reason."""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(HERE))

import record  # noqa: E402

REL = 1e-9  # float sums taken in another order differ in the last bits, never more

# path patterns (keys joined by "/", "*" for any one key or index) whose recorded value may differ, and why
CHANGED: dict[str, str] = {}


def _load(name: str) -> dict:
    return json.loads(gzip.decompress((HERE / f"{name}.json.gz").read_bytes()))


def _changed(path: tuple) -> bool:
    for pattern in CHANGED:
        parts = pattern.split("/")
        if len(parts) <= len(path) and all(p == "*" or p == str(k) for p, k in zip(parts, path)):
            return True
    return False


def diff(old, new, path=()) -> list[str]:
    """Where ``new`` departs from ``old`` (keys only in ``new`` are fine)."""
    if _changed(path):
        return []
    where = "/".join(map(str, path)) or "(root)"
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{where}: was a mapping, now {type(new).__name__}"]
        out = []
        for k, v in old.items():
            if k not in new:
                out += [] if _changed(path + (k,)) else [f"{where}/{k}: missing"]
            else:
                out += diff(v, new[k], path + (k,))
        return out
    if isinstance(old, list):
        if not isinstance(new, list) or len(new) != len(old):
            return [f"{where}: list of {len(old)}, now {len(new) if isinstance(new, list) else type(new).__name__}"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in diff(a, b, path + (i,))]
    if isinstance(old, float) or (isinstance(old, int) and not isinstance(old, bool) and isinstance(new, float)):
        if not isinstance(new, (int, float)) or isinstance(new, bool):
            return [f"{where}: {old!r} -> {new!r}"]
        if math.isclose(old, new, rel_tol=REL, abs_tol=1e-12):
            return []
        return [f"{where}: {old!r} -> {new!r} ({(new - old) / old if old else math.inf:+.2e})"]
    return [] if old == new else [f"{where}: {old!r} -> {new!r}"]


def test_diff_finds_a_moved_number_and_a_lost_key():
    assert diff({"a": 1.0, "b": [1, 2]}, {"a": 1.0 + 1e-12, "b": [1, 2], "c": 3}) == []
    assert diff({"a": 1.0}, {"a": 1.001}) == ["a: 1.0 -> 1.001 (+1.00e-03)"]
    assert diff({"a": {"b": 1}}, {"a": {}}) == ["a/b: missing"]


@pytest.mark.parametrize("name", sorted(record.SEARCHES))
def test_plan_json_equals_the_golden(name):
    old = _load("plan")[name]
    new = record.run_cli(record.SEARCHES[name])
    problems = diff(old, new)
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:5])


@pytest.mark.slow
def test_validate_predictions_equal_the_golden():
    old = _load("validate")
    new = record.validate_golden()
    problems = [p for name in old for p in diff(old[name], new.get(name), (name,))]
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:5])
