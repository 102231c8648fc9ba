"""The house stays easy to see (issue 14): imports between advisor's modules flow one way, with no cycle (lazy
imports count); advisor never imports validation; only calibration and the probe touch torch (lazily); the cost model
never asks which stack it runs (no stack's name in its code: a stack is data); no module over 350 lines and no
function over 80. Read from the source, so a cycle hidden in a function-level import counts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 350, 80


def _name(path: Path) -> str:
    """``model.layer`` for advisor/model/layer.py, ``model`` for advisor/model/__init__.py."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_name(p): p for p in PACKAGE.rglob("*.py") if _name(p)}


def _resolve(module: str) -> str | None:
    """The advisor module (key of FILES) an import of ``advisor.<module>...`` reaches."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FILES:
            return ".".join(parts[:n])
    return None


def _imports(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(advisor modules, other top-level packages, other packages imported at module level) a module imports
    anywhere but under TYPE_CHECKING. A submodule importing its own package counts: the package's __init__
    imports the submodule back, a cycle."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    in_function = {id(n) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(node)}
    ours, other, top = set(), set(), set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "advisor" or node.module.startswith("advisor."):
                base = node.module[len("advisor."):] if node.module != "advisor" else ""
                for a in node.names:
                    ours.add(_resolve(f"{base}.{a.name}" if base else a.name) or _resolve(base))
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("advisor."):
                    ours.add(_resolve(a.name[len("advisor."):]))
                else:
                    names.append(a.name)
        other |= {n.split(".")[0] for n in names}
        if id(node) not in in_function:
            top |= {n.split(".")[0] for n in names}
    return {o for o in ours if o and o != _name(path)}, other, top


IMPORTS = {m: _imports(p) for m, p in FILES.items()}
GRAPH = {m: (ours, other) for m, (ours, other, _) in IMPORTS.items()}
# the cost model: typed inputs and the pure functions over them (not the search, the CLI or calibration)
CORE = {"units", "errors", "spec", "io", "profiles", "hardware", "stack", "training", "layout", "workload",
        "candidates", "comm", "compute", "host", "optimizer", "memory", "step", "constraints", "model",
        "model.layer", "model.spec", "model.catalogue", "model.hf", "parallel", "parallel.data",
        "parallel.tensor", "parallel.pipeline"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, stack, found = {}, [], []

    def visit(u: str) -> None:
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


def test_module_imports_have_no_cycle():
    assert _cycles({m: ours for m, (ours, _) in GRAPH.items()}) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_graph_sees_package_modules_and_function_level_imports():
    assert {"parallel.data", "parallel.tensor", "model.layer", "calibrate.links", "export.megatron"} <= set(FILES)
    assert {"comm", "candidates", "parallel.pipeline"} <= GRAPH["parallel.data"][0]
    assert "model.layer" in GRAPH["stack"][0] and "ranking" in GRAPH["suggest"][0]


def test_core_modules_sit_below_the_search_and_the_cli():
    """No module outside the CLI imports a cli* module; the cost model imports none of search, calibration,
    the API, export or rendering; everything is in CORE or above it."""
    above = {"search", "space", "suggest", "explain", "calibrate", "api", "export", "render", "results", "ranking"}
    for m, (ours, _) in GRAPH.items():
        if not m.startswith("cli"):
            assert not {o for o in ours if o.startswith("cli")}, m
        if m in CORE:
            assert not {o for o in ours if o.split(".")[0] in above}, (m, ours)
    assert CORE <= set(FILES)


def test_advisor_never_imports_validation():
    users = sorted(m for m, (_, other) in GRAPH.items() if "validation" in other)
    assert users == []


def test_only_calibration_and_the_probe_import_torch_and_never_at_module_level():
    users = sorted(m for m, (_, other) in GRAPH.items() if "torch" in other)
    assert all(u in ("cli_calibrate", "cli_probe") or u.split(".")[0] in ("calibrate", "probe") for u in users), users
    assert "calibrate.microbench" in users  # the worker measures with torch
    assert "probe.measure" in users  # the probe watches a step with torch
    assert [m for m, (_, _, top) in IMPORTS.items() if "torch" in top] == []


def test_a_submodule_importing_its_package_would_be_a_cycle():
    assert _cycles({"calibrate": {"calibrate.links"}, "calibrate.links": {"calibrate"}}) == [
        ["calibrate", "calibrate.links", "calibrate"]]


def test_the_cost_model_never_names_a_stack():
    """What a stack does is read from its profile: no core module compares against a stack's name."""
    from advisor.stack import list_stacks

    names = set(list_stacks()) | {"hf", "megatron"}
    for m in CORE:
        tree = ast.parse(FILES[m].read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                      and n.body and isinstance(n.body[0], ast.Expr)}
        found = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in docstrings and n.value in names}
        assert not found, (m, found)


@pytest.mark.parametrize("module", sorted(FILES))
def test_modules_and_functions_stay_readable_in_one_sitting(module):
    text = FILES[module].read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{module}: {len(text.splitlines())} lines; split it by concept"
    long = [(f.name, f.end_lineno - f.lineno + 1) for f in ast.walk(ast.parse(text))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_every_package_ships():
    """A non-editable install ships only the packages pyproject.toml lists: every directory of advisor/ with an
    __init__.py must be there, or `pip install .` gives an advisor that fails on import."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "advisor").rglob("__init__.py")}
    assert found - listed == set()


def test_the_cli_tunes_glibcs_allocator_once():
    """advisor/allocator.py: on glibc, mallopt takes the three settings (1 = success) and a second call does nothing
    more; elsewhere the allocator is left as it is."""
    import platform
    import sys

    from advisor import allocator

    first = allocator.tune()
    assert allocator.tune() is first and len(allocator._done) == 1
    assert first == (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc")
