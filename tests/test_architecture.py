"""The house stays easy to see: imports between advisor's modules flow one way, only calibration touches torch
(lazily), and advisor never imports validation. Read from the source, so a cycle hidden in a function-level
import counts.

Every module is a node named by its path under advisor/: ``hardware`` for advisor/hardware.py,
``calibrate.links`` for advisor/calibrate/links.py, ``calibrate`` for advisor/calibrate/__init__.py."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"


def _node(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {_node(p): p for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "__init__.py"}
NODES = set(FILES)


def _resolve(dotted: str) -> str:
    """The node an import of ``advisor.<dotted>`` lands on: the longest module path that exists ("" for a name
    that is no module, e.g. ``from advisor import __version__``)."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in NODES:
            return ".".join(parts[:k])
    return ""


def _imports(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(advisor nodes, other top-level packages, other packages imported at module level) a module imports
    anywhere but under TYPE_CHECKING."""
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
                base = node.module.removeprefix("advisor").lstrip(".")
                ours |= {_resolve(f"{base}.{a.name}" if base else a.name) for a in node.names}
            else:
                names = [node.module]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("advisor."):
                    ours.add(_resolve(a.name.removeprefix("advisor.")))
                else:
                    names.append(a.name)
        other |= {n.split(".")[0] for n in names}
        if id(node) not in in_function:
            top |= {n.split(".")[0] for n in names}
    ours.discard("")
    return ours - {_node(path)}, other, top


GRAPH = {m: _imports(p) for m, p in FILES.items()}


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


def test_modules_inside_packages_are_nodes():
    assert {"calibrate", "calibrate.links", "calibrate.launch", "calibrate.microbench", "hardware"} <= NODES
    assert "links" not in NODES and "calibrate" not in GRAPH["calibrate.links"][0]
    assert GRAPH["calibrate"][0] >= {"calibrate.links", "calibrate.profile", "calibrate.launch"}
    assert _resolve("calibrate.links.fit_link") == "calibrate.links" and _resolve("calibrate.fit_link") == "calibrate"


def test_module_imports_have_no_cycle():
    assert _cycles({m: ours for m, (ours, _, _) in GRAPH.items()}) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_a_submodule_importing_its_package_would_be_a_cycle():
    """The package's __init__ imports its modules, so a module that imports the package (rather than a sibling
    module) closes a cycle: the finder sees it."""
    graph = {m: set(ours) for m, (ours, _, _) in GRAPH.items()}
    graph["calibrate.links"].add("calibrate")
    assert _cycles(graph)


def test_core_modules_sit_below_the_cli():
    """No module outside the CLI imports a cli* module; the cost model does not import search or calibration."""
    core = {"hardware", "model", "compute", "comm", "memory", "plans", "estimate", "styles", "units", "errors"}
    above = {"search", "space", "suggest", "calibrate", "api", "export", "render"}
    for m, (ours, _, _) in GRAPH.items():
        if not m.startswith("cli"):
            assert not {o for o in ours if o.startswith("cli")}, m
        if m in core:
            assert not {o for o in ours if o.split(".")[0] in above}, (m, ours)
        if m.startswith("calibrate"):  # calibration uses the cost model, never the search or the CLI above it
            assert not {o for o in ours if o.split(".")[0] in above - {"calibrate"}}, (m, ours)


def test_only_calibration_imports_torch_and_never_at_module_level():
    users = sorted(m for m, (_, other, _) in GRAPH.items() if "torch" in other)
    assert users and all(m == "cli_calibrate" or m.startswith("calibrate.") for m in users), users
    assert "calibrate.microbench" in users  # the worker measures with torch
    assert [m for m, (_, _, top) in GRAPH.items() if "torch" in top] == []


# `advisor validate` (cli_validate.py, not calibration's) imports validation.validate inside its command: the
# one importer left, for its owner to move; the check stops any other module from joining it.
KNOWN_VALIDATION_IMPORTERS = {"cli_validate"}


def test_advisor_never_imports_validation():
    importers = {m for m, (_, other, _) in GRAPH.items() if "validation" in other}
    assert importers - KNOWN_VALIDATION_IMPORTERS == set(), importers
    assert not any(m.startswith("calibrate") for m in importers)


def test_calibration_modules_stay_small():
    """A module of the calibration package stays near the house budget (~350 lines), a function near ~80."""
    for m, p in FILES.items():
        if not (m.startswith("calibrate") or m == "cli_calibrate"):
            continue
        lines = p.read_text().splitlines()
        assert len(lines) <= 360, (m, len(lines))
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 85, (m, node.name, node.end_lineno - node.lineno + 1)
