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
CHANGED: dict[str, str] = {
    # both goldens re-recorded 2026-11-28 (git log tests/golden): the Megatron-Bridge tables costed in
    # megatron-bridge-perf, Blackwell Ultra's GEMM rates measured on a B300, Transformer Engine's weight casts once a
    # step, the perf recipes' NVFP4 without BF16 edge layers; ring context parallelism's merge kernels (a CP=2 plan
    # no longer ties a data-parallel one and wins it on its label); a plan's reason no longer says it overrules a rule
    # of thumb whose kind has no plan that runs and fits; Transformer Engine's sequence-parallel all-gathers in the
    # recipe's format (validate only)
}

# The kernel style ("framework" in a plan's setup, "kernels" for a whole search) became the training stack the
# plans were costed in (issue 14); the recorded value must map to the new one.
STYLE_TO_STACK = {"hf": "hf-trainer", "megatron": "megatron-deepspeed"}


def migrate(doc: dict) -> dict:
    """A recorded `plan --json` document in today's key names (the renames above)."""
    doc = dict(doc)
    if "kernels" in doc:
        doc["stack"] = STYLE_TO_STACK[doc.pop("kernels")]
    plans = []
    for p in doc.get("plans", []):
        setup = dict(p["setup"])
        if "framework" in setup:
            setup["stack"] = STYLE_TO_STACK[setup.pop("framework")]
        plans.append({**p, "setup": setup})
    doc["plans"] = plans
    return doc


def canonical(doc: dict) -> dict:
    """Plans that tie on the ranking key and the step time (to 1e-12) in label order: the order of exact ties is
    the enumeration's, which float rounding decided before the search broke ties explicitly."""
    def key(p):
        need = p["memory"]["peak_bytes"] + p["memory"]["overhead_bytes"]
        return (round(need, 0) if doc.get("objective") == "memory" else 0.0, float(f"{p['step_time_s']:.12g}"))

    plans = sorted(doc.get("plans", []), key=lambda p: (key(p), p["label"]))
    return {**doc, "plans": [{**p, "rank": i + 1} for i, p in enumerate(plans)]}


def one_policy_per_plan(doc: dict) -> dict:
    """The recorded search as the search ranks it since it keeps one checkpointing policy per plan (issue 16): a
    row that differs from a better-ranked one only in its policy (recompute, recompute_layers) is dropped."""
    seen, plans = set(), []
    for p in sorted(doc.get("plans", []), key=lambda p: p["rank"]):
        setup = {k: v for k, v in p["setup"].items() if k not in ("recompute", "recompute_layers")}
        key = json.dumps([p["world_size"], p["stack"], p["plan"], setup], sort_keys=True)
        if key not in seen:
            seen.add(key)
            plans.append(p)
    return {**doc, "plans": plans}


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
    old = canonical(one_policy_per_plan(migrate(_load("plan")[name])))
    new = canonical(record.run_cli(record.SEARCHES[name]))
    # the recorded top 20 less its other-policy rows: the new search's first rows, the ones after it unrecorded
    new["plans"] = new["plans"][:len(old["plans"])]
    problems = diff(old, new)
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:5])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(record.SEARCHES))
def test_every_row_of_a_search_is_what_estimate_says(name):
    """`advisor plan` and `advisor estimate` apply one stack rule (issue 14: they disagreed on the same plan):
    every row of each search is estimated again from its plan and setup, with the stack the row names and, where
    the search chose it (no --stack), with auto."""
    from advisor.api import estimate_plan
    from advisor.layout import Plan
    from advisor.training import TrainingSetup

    doc = record.run_cli(record.SEARCHES[name])
    for row in doc["plans"]:
        plan, setup = Plan(**row["plan"]), TrainingSetup(**row["setup"])
        for stack in (setup.stack,) + (() if "--stack" in record.SEARCHES[name] else ("auto",)):
            e = estimate_plan(doc["model"], doc["hw"], plan,
                              setup.model_copy(update={"stack": stack}), doc["world_size"]).model_dump(mode="json")
            problems = diff({k: row[k] for k in ("step_time_s", "breakdown", "memory", "mfu", "hfu", "stack", "setup")}, e)
            assert not problems, f"row {row['rank']} ({row['label']}), stack {stack}: " + "; ".join(problems[:5])


@pytest.mark.slow
@pytest.mark.xdist_group("validation")  # the validation run test_validate reads too, on one worker
def test_validate_predictions_equal_the_golden(validation_report):
    old = _load("validate")
    new = record.validate_golden(validation_report)
    problems = [p for name in old for p in diff(old[name], new.get(name), (name,))]
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:5])
