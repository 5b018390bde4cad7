"""The modules of ``workshop.bench`` import each other one way: the graph of their imports of
one another has no cycle, and ``plots.py`` (the figures) imports none of them.

Every import counts, wherever it is: at module level, inside a function (where a cycle hides
at run time) and under ``TYPE_CHECKING``. Modelled on ``test_import_direction.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
BENCH = ROOT / "workshop" / "bench"
PACKAGE = "workshop.bench"
MODULES = sorted(p.stem for p in BENCH.glob("*.py"))


def sibling_imports(tree: ast.AST, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of one of ``modules`` in ``tree``, however nested. Names
    that are not modules (``from . import SLO``) import the package: ``__init__``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = node.module
            elif node.level == 0 and _inside(node.module or ""):
                base = node.module[len(PACKAGE) + 1:] or None
            else:
                continue
            names = ([base.split(".")[0]] if base
                     else [a.name if a.name in modules else "__init__" for a in node.names])
        elif isinstance(node, ast.Import):
            names = [(a.name[len(PACKAGE) + 1:].split(".")[0] or "__init__")
                     for a in node.names if _inside(a.name)]
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and _inside(node.args[0].value)):
            names = [node.args[0].value[len(PACKAGE) + 1:].split(".")[0] or "__init__"]
        else:
            continue
        out += [(node.lineno, n) for n in names if n in modules]
    return out


def _inside(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def graph() -> dict[str, dict[str, int]]:
    """module -> {sibling it imports: first line}."""
    out: dict[str, dict[str, int]] = {}
    for m in MODULES:
        edges: dict[str, int] = {}
        for line, target in sibling_imports(ast.parse((BENCH / f"{m}.py").read_text()),
                                            set(MODULES)):
            if target != m:
                edges.setdefault(target, line)
        out[m] = edges
    return out


def find_cycle(edges: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, str] = {}          # "open" while on the current path, then "done"
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = "open"
        path.append(m)
        for n in sorted(edges.get(m, {})):
            if state.get(n) == "open":
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_sibling_imports_sees_every_form():
    tree = ast.parse("from .a import x\nfrom . import b, SLO\nimport workshop.bench.c\n"
                     "from workshop.bench.d import y\nfrom workshop.bench import e\n"
                     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .f import Z\n"
                     "def g():\n    from .h.inner import w\n"
                     "importlib.import_module('workshop.bench.i')\nimport workshop.other\n"
                     "from workshop.benchmarks import a\n")
    assert sorted(sibling_imports(tree, set("abcdefhi") | {"__init__"})) == sorted(
        [(1, "a"), (2, "b"), (2, "__init__"), (3, "c"), (4, "d"), (5, "e"), (8, "f"), (10, "h"),
         (11, "i")])


def test_find_cycle_finds_a_cycle_and_only_one():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {}}) is None
    assert find_cycle({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}) == ["a", "b", "c", "a"]


def test_the_modules_import_each_other_one_way():
    edges = graph()
    assert {"plots", "results", "sweep", "run", "showdown", "cli"} <= set(edges)
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {edges[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_plots_imports_no_sibling():
    imports = graph()["plots"]
    assert not imports, f"plots.py imports {imports} (module: first line); its inputs are " \
        "duck-typed and whatever else it needs (colours) comes from its callers"
