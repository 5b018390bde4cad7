"""Issue 38: ``workshop/__init__.py`` maps every notebook to the modules it uses, so a
newcomer finds a notebook's code in one guess; a module added without a place in the map, or a
name in the map that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import workshop

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workshop"
# packages with a guide of their own (their __init__ or module docstrings), named whole
OWN_GUIDE = {"bench", "shared_queue", "api_gateway", "data"}


def named_in_map(doc: str | None = None) -> set[str]:
    """Every name the map gives: ``live/`` and ``compute/roofline`` name a folder and a module;
    in ``(`quantization`, `_measure`)`` a suffix extends the name before it."""
    doc = (workshop.__doc__ if doc is None else doc).replace("``", "`")
    names: set[str] = set()
    for line in doc.splitlines():
        stem = None
        for token in re.findall(r"`([a-z_][a-z_/]*)`", line):     # not an endpoint: `/metrics`
            if token.startswith("_") and not token.startswith("__") and stem:
                names.add(stem + token)
                continue
            parts = [p for p in token.split("/") if p]
            names |= set(parts)
            stem = parts[-1] if parts else stem
    names |= {"__main__"} if "`__main__`" in doc else set()
    return names - {"workshop", "reference_server", "mini_engine", "benchmarks"}


def modules() -> set[str]:
    """Top-level modules, every subpackage, and the modules of the topic folders."""
    found = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    for init in PACKAGE.glob("*/__init__.py"):
        found.add(init.parent.name)
        if init.parent.name not in OWN_GUIDE:
            found |= {p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"}
    return found | {"data"}


def test_the_map_reads_folders_modules_and_suffixes():
    doc = "| 03 | x | `compute/` (`roofline`, `_measure`), `sizing/kvcache`, `timing` |"
    assert named_in_map(doc) == {"compute", "roofline", "roofline_measure", "sizing",
                                 "kvcache", "timing"}


def test_every_module_and_subpackage_has_a_place_in_the_map():
    assert sorted(modules() - named_in_map()) == []


def test_every_name_in_the_map_exists_and_every_notebook_has_a_row():
    bench = {p.stem for p in (PACKAGE / "bench").glob("*.py")}
    assert sorted(named_in_map() - modules() - bench) == []
    rows = set(re.findall(r"^\| (\d\d) \|", workshop.__doc__ or "", re.M))
    notebooks = {p.name[:2] for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")}
    assert sorted(notebooks - rows) == []
