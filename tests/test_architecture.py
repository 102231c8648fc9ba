"""The house stays easy to see: imports between advisor's modules flow one way, and only the calibration
CLI touches torch (lazily). Read from the source, so a cycle hidden in a function-level import counts."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"
MODULES = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(advisor modules, other top-level packages) a module imports anywhere but under TYPE_CHECKING."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                   for n in ast.walk(node)}
    ours, other = set(), set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "advisor":
                ours |= {a.name for a in node.names if a.name in MODULES}
            elif node.module.startswith("advisor."):
                ours.add(node.module.split(".")[1])
            else:
                other.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                (ours.add(a.name.split(".")[1]) if a.name.startswith("advisor.") else other.add(a.name.split(".")[0]))
    return ours - {path.stem}, other


GRAPH = {p.stem: _imports(p) for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


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


def test_core_modules_sit_below_the_cli():
    """No module outside the CLI imports a cli* module; the cost model does not import search or calibrate."""
    core = {"hardware", "model", "compute", "comm", "memory", "plans", "estimate", "styles", "units", "errors"}
    for m, (ours, _) in GRAPH.items():
        if not m.startswith("cli"):
            assert not {o for o in ours if o.startswith("cli")}, m
        if m in core:
            assert not ours & {"search", "space", "suggest", "calibrate", "api", "export", "render"}, (m, ours)


def test_only_the_calibration_cli_imports_torch():
    users = sorted(m for m, (_, other) in GRAPH.items() if "torch" in other)
    assert users == ["cli_calibrate"]
