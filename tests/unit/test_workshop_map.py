"""Issue 38: ``workshop/__init__.py`` maps every notebook to the modules it uses, so a
newcomer finds a notebook's code in one guess; a module added without a row, or a row naming
a module that is gone, fails here."""

from __future__ import annotations

import re
from pathlib import Path

import workshop

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workshop"


def named_in_map() -> set[str]:
    doc = (workshop.__doc__ or "").replace("``", "`")
    names = {n for n in re.findall(r"`([a-z_]+)/?`", doc) if not n.startswith("_")} | (
        {"__main__"} if "`__main__`" in doc else set())
    # "`roofline` (`_measure`, `_plots`)" names roofline_measure and roofline_plots
    for stem, suffixes in re.findall(r"`([a-z_]+)` \(((?:`_[a-z]+`(?:, )?)+)\)", doc):
        names |= {stem + s for s in re.findall(r"`(_[a-z]+)`", suffixes)}
    # the command, the packages it imports and the scripts that import it
    return names - {"workshop", "reference_server", "mini_engine", "benchmarks"}


def test_every_module_and_subpackage_has_a_place_in_the_map():
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted((modules | packages | {"data"}) - named_in_map()) == []


def test_every_name_in_the_map_exists_and_every_notebook_has_a_row():
    modules = ({p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir()
                                                         if p.is_dir()})
    bench = {p.stem for p in (PACKAGE / "bench").glob("*.py")}
    assert sorted(named_in_map() - modules - bench) == []
    rows = set(re.findall(r"^\| (\d\d) \|", workshop.__doc__ or "", re.M))
    notebooks = {p.name[:2] for p in (ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")}
    assert sorted(notebooks - rows) == []
