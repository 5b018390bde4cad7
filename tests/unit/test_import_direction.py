"""The packages depend one way: workshop -> reference_server -> mini_engine, never back.

reference_server/ and mini_engine/ ship without the workshop (``pip install`` of the server
alone), and mini_engine is the teaching engine reference_server wraps.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FORBIDDEN = {"reference_server": {"workshop"}, "mini_engine": {"workshop", "reference_server"}}


def imported_packages(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``tree``, however nested."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", ""))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            out.append((node.lineno, node.args[0].value.split(".")[0]))
    return out


def test_imported_packages_sees_every_form():
    tree = ast.parse("import workshop.x\nfrom workshop import y\nfrom . import z\n"
                     "def f():\n    import reference_server\n"
                     "importlib.import_module('workshop.sizing.kvcache')\n")
    assert sorted(imported_packages(tree)) == [
        (1, "workshop"), (2, "workshop"), (5, "reference_server"), (6, "workshop")]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_against_the_dependency_direction(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = [f"{path.relative_to(ROOT)}:{line}: imports {name}"
           for path in files for line, name in imported_packages(ast.parse(path.read_text()))
           if name in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)
