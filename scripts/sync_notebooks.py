"""Generate the committed notebooks from their single source of truth.

Each notebook is written once, as a jupytext "percent" script in ``notebooks/src/NN_slug.py``.
This script turns it into the two files learners open:

* ``notebooks/NN_slug.ipynb`` for Jupyter and Colab (outputs empty, deterministic cell ids);
* ``notebooks/NN_slug.py`` in marimo's file format, for marimo and Molab.

Source conventions (see notebooks/README.md):

* ``# %%`` starts a code cell, ``# %% [markdown]`` a markdown cell;
* ``# %% tags=["jupyter-only"]`` / ``tags=["marimo-only"]`` keeps a cell in one format only;
* ``tags=["hide-code"]`` hides a code cell's source in marimo (markdown is always hidden);
* ``{{github_repo}}`` stands for the repository's ``owner/name``, taken from
  ``[project.urls] Repository`` in ``pyproject.toml`` (its one home);
* every top-level name is defined in exactly one cell (marimo's rule; names starting with
  ``_`` are cell-local in marimo and exempt) -- checked here, so a broken source fails loudly
  instead of being renamed silently.

"Predict, then measure" exercises (a markdown cell ``**Exercise N (predict, then measure).**``,
a prediction cell ``name = None  # your prediction``, a cell calling ``ui.compare(name, ...)``,
a ``# Worked answer to Exercise N,`` cell) need nothing more in Jupyter, which runs cells in
order. marimo runs them all at once, so its file gets a button after each prediction
(``workshop.ui.reveal_button``) and ``mo.stop`` until it is pressed at the top of the cell after
the prediction, of the ``ui.compare`` cell and of the worked answer (``with_reveals``).

Usage::

    python scripts/sync_notebooks.py           # regenerate every notebook
    python scripts/sync_notebooks.py --check   # exit 1 if a committed file is stale
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SOURCES = NOTEBOOKS / "src"
JUPYTER_ONLY = "jupyter-only"
MARIMO_ONLY = "marimo-only"
HIDE_CODE = "hide-code"
FORMAT_TAGS = {JUPYTER_ONLY, MARIMO_ONLY, HIDE_CODE}
# marimo writes its own version into every file; a different local marimo must not make the
# check fail on that line alone.
_GENERATED_WITH = re.compile(r'^__generated_with = ".*"$', re.MULTILINE)
# Dependencies marimo's sandbox (and Molab) install before running the .py file.
MARIMO_SCRIPT_HEADER = """\
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "marimo",
#     "matplotlib",
#     "openai",
#     "httpx",
#     "tqdm",
#     "numpy",
# ]
# ///"""
MARIMO_IMPORT_CELL = "import marimo as mo"
REPO_PLACEHOLDER = "{{github_repo}}"
# A "predict, then measure" exercise (the order is checked by tests/unit/test_exercise_order.py).
EXERCISE = re.compile(r"^\*\*Exercise (\d+) \(predict, then (measure|compute)\)\.\*\*", re.M)
PREDICTION = re.compile(r"^(\w+) = None\b.*#.*predict")
# What marimo gets for one (see with_reveals): a button cell after the prediction, and a first
# statement for the cells that measure and for the worked answer. The button imports its own
# helper: a notebook may import `ui` in the very cell that waits on the button (05's first).
REVEAL_BUTTON = """\
from workshop.ui import reveal_button as _reveal_button

{button} = _reveal_button("{label}")
{button}"""
REVEAL_MEASUREMENT = """\
mo.stop(not {button}.value,
        mo.md("_Write your prediction for Exercise {n}, then press **{label}** under it._"))"""
REVEAL_ANSWER = "mo.stop(not {button}.value)"


class NotebookSourceError(ValueError):
    """The source breaks a convention one of the two formats depends on."""


@dataclass(frozen=True)
class Cell:
    kind: str               # "code" | "markdown"
    source: str
    tags: frozenset[str]

    def in_format(self, fmt: str) -> bool:
        if fmt == "jupyter":
            return MARIMO_ONLY not in self.tags
        return JUPYTER_ONLY not in self.tags


def read_source(text: str) -> tuple[dict, list[Cell]]:
    """Parse a percent script into (notebook metadata, cells)."""
    import jupytext

    if "import marimo" in text:
        raise NotebookSourceError("a source must not contain 'import marimo': marimo code goes "
                                  "in 'marimo-only' cells through workshop.ui or the injected "
                                  "'mo' name")
    nb = jupytext.reads(text, fmt="py:percent")
    cells = []
    for c in nb.cells:
        if c.cell_type not in ("code", "markdown"):
            raise NotebookSourceError(f"unsupported cell type {c.cell_type!r}")
        tags = frozenset(c.metadata.get("tags", []))
        unknown = {t for t in tags if t not in FORMAT_TAGS}
        if unknown:
            raise NotebookSourceError(f"unknown cell tags {sorted(unknown)}; known: "
                                      f"{sorted(FORMAT_TAGS)}")
        if tags >= {JUPYTER_ONLY, MARIMO_ONLY}:
            raise NotebookSourceError("a cell cannot be both jupyter-only and marimo-only")
        source = c.source.strip("\n")
        if not source.strip():
            continue
        if c.cell_type == "code" and re.search(r"^\s*[%!]", source, re.MULTILINE):
            raise NotebookSourceError(f"IPython magics and shell escapes do not run in marimo: "
                                      f"{source.splitlines()[0]!r}")
        cells.append(Cell(c.cell_type, source, tags))
    return dict(nb.metadata), cells


def notebook_title(cells: list[Cell]) -> str | None:
    """The first level-1 markdown heading, used as the marimo app title."""
    for cell in cells:
        if cell.kind == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return None


def check_marimo_rules(cells: list[Cell]) -> None:
    """Each global name is defined by one marimo cell; fail with the offending names."""
    from marimo._ast.compiler import compile_cell

    owner: dict[str, int] = {}
    for i, cell in enumerate(cells):
        if cell.kind != "code" or not cell.in_format("marimo"):
            continue
        try:
            compiled = compile_cell(cell.source, cell_id=f"c{i}")  # type: ignore[arg-type]
        except SyntaxError as e:
            raise NotebookSourceError(f"cell {i} does not parse: {e}") from e
        for name in compiled.defs:
            if name.startswith("_"):
                continue
            if name in owner:
                raise NotebookSourceError(
                    f"{name!r} is defined in cell {owner[name]} and again in cell {i}; marimo "
                    "allows one defining cell per name (use a new name, or a '_'-prefixed one "
                    "for cell-local values)")
            owner[name] = i
        if "mo" in compiled.defs:
            raise NotebookSourceError("the name 'mo' is reserved for the injected marimo import")
        unbound = _private_names_read_unbound(cell.source)
        if unbound:
            raise NotebookSourceError(
                f"cell {i} reads {', '.join(map(repr, unbound))} without defining it; in marimo "
                "'_'-prefixed names are local to the cell that defines them (Jupyter would "
                "read another cell's), so give the value a public name")


def _private_names_read_unbound(source: str) -> list[str]:
    """``_name``s the cell reads but never binds anywhere in it (scopes ignored: a binding in
    any nested scope counts, so this errs towards silence)."""
    tree = compile(source, "<cell>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return sorted(n for n in read - bound
                  if n.startswith("_") and not n.startswith("__") and n != "_")


def _markdown_call(markdown: str) -> str:
    # A raw triple-quoted string keeps backslashes (LaTeX) intact; fall back to ''' quotes if
    # the text itself contains """.
    quote = "'''" if '"""' in markdown else '"""'
    if quote in markdown:
        raise NotebookSourceError("markdown cell contains both \"\"\" and '''")
    # marimo's own layout: codegen indents the body, marimo strips that indent on load.
    return f"mo.md(r{quote}\n{markdown}\n{quote})"


def with_reveals(cells: list[Cell]) -> list[Cell]:
    """marimo's cells, each exercise's measurement waiting for the learner's prediction.

    marimo runs every cell at once, so after each prediction cell (``name = None  # your
    prediction``) comes a button (``workshop.ui.reveal_button``), and three cells start with
    ``mo.stop`` until it is pressed: the code cell after the prediction (where the measuring
    starts), the one calling ``ui.compare(name, ...)`` and the worked answer. Jupyter runs
    cells in order, so its notebook needs none of this.
    """
    cells = [c for c in cells if c.in_format("marimo")]
    gates: dict[int, str] = {}      # cell index -> the statement it starts with
    buttons: dict[int, Cell] = {}   # prediction cell index -> the button cell after it
    exercise = None
    for i, cell in enumerate(cells):
        heading = EXERCISE.search(cell.source) if cell.kind == "markdown" else None
        guess = PREDICTION.match(cell.source) if cell.kind == "code" and exercise else None
        if heading:
            exercise = int(heading.group(1)), heading.group(2).capitalize()
        elif guess:
            (n, label), exercise = exercise, None
            later = [j for j in range(i + 1, len(cells)) if cells[j].kind == "code"]
            compare = next((j for j in later if f"ui.compare({guess.group(1)}," in cells[j].source),
                           None)
            if compare is None:
                raise NotebookSourceError(f"exercise {n}: no cell calls ui.compare("
                                          f"{guess.group(1)}, ...) after its prediction")
            names = {"button": f"reveal_exercise_{n}", "n": n, "label": label}
            buttons[i] = Cell("code", REVEAL_BUTTON.format(**names),
                              frozenset({MARIMO_ONLY, HIDE_CODE}))
            gates[later[0]] = gates[compare] = REVEAL_MEASUREMENT.format(**names)
            worked = next((j for j in later if j > compare
                           and f"# Worked answer to Exercise {n}," in cells[j].source), None)
            if worked is not None:
                gates[worked] = REVEAL_ANSWER.format(**names)
    out = []
    for i, cell in enumerate(cells):
        if i in gates:
            # after the cell's leading comments, which say what it is
            lines = cell.source.splitlines()
            head = next((k for k, line in enumerate(lines) if not line.startswith("#")), len(lines))
            cell = Cell(cell.kind, "\n".join(lines[:head] + [gates[i]] + lines[head:]), cell.tags)
        out += [cell, buttons[i]] if i in buttons else [cell]
    return out


def to_marimo(metadata: dict, cells: list[Cell]) -> str:
    from marimo._ast.app_config import _AppConfig
    from marimo._ast.cell import CellConfig
    from marimo._ast.codegen import generate_filecontents

    check_marimo_rules(cells)
    cells = with_reveals(cells)
    check_marimo_rules(cells)    # the buttons' names are free
    codes = [MARIMO_IMPORT_CELL]
    configs = [CellConfig(hide_code=True)]
    for cell in cells:
        if cell.kind == "markdown":
            codes.append(_markdown_call(cell.source))
            configs.append(CellConfig(hide_code=True))
        else:
            codes.append(cell.source)
            configs.append(CellConfig(hide_code=HIDE_CODE in cell.tags))
    title = notebook_title(cells)
    config = _AppConfig.from_untrusted_dict({"width": "medium",
                                             **({"app_title": title} if title else {})})
    return generate_filecontents(codes, ["_"] * len(codes), configs, config=config,
                                 header_comments=MARIMO_SCRIPT_HEADER)


def to_ipynb(metadata: dict, cells: list[Cell]) -> str:
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb_cells = []
    for i, cell in enumerate(c for c in cells if c.in_format("jupyter")):
        make = new_code_cell if cell.kind == "code" else new_markdown_cell
        nb_cell = make(cell.source)
        nb_cell["id"] = f"cell-{i:02d}"   # nbformat's default ids are random: not diff-stable
        nb_cells.append(nb_cell)
    nb = new_notebook(cells=nb_cells)
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        # Colab reads this to show a title and to offer a GPU for the notebook.
        "colab": {"name": notebook_title(cells) or "", "provenance": []},
        "accelerator": "GPU",
    }
    return nbformat.writes(nb, version=4) + "\n"


def github_repo(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """``owner/name`` of the repository, from ``[project.urls] Repository``."""
    import tomllib

    url = tomllib.loads(pyproject.read_text())["project"]["urls"]["Repository"]
    m = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    if not m:
        raise NotebookSourceError(f"pyproject.toml: Repository {url!r} is not a GitHub URL")
    return m.group(1)


def outputs_for(src: Path, out_dir: Path = NOTEBOOKS) -> dict[Path, str]:
    """The two generated files of one source, by path (next to ``src``'s parent by default)."""
    metadata, cells = read_source(src.read_text().replace(REPO_PLACEHOLDER, github_repo()))
    return {
        out_dir / f"{src.stem}.ipynb": to_ipynb(metadata, cells),
        out_dir / f"{src.stem}.py": to_marimo(metadata, cells),
    }


def _normalise(text: str) -> str:
    return _GENERATED_WITH.sub('__generated_with = "*"', text)


def stale_files(sources: list[Path] | None = None,
                out_dir: Path = NOTEBOOKS) -> dict[Path, str]:
    """Generated files that differ from what is on disk, mapped to a unified diff."""
    stale = {}
    for src in sources if sources is not None else sorted(SOURCES.glob("[0-9]*.py")):
        for path, wanted in outputs_for(src, out_dir).items():
            have = path.read_text() if path.exists() else ""
            if _normalise(have) != _normalise(wanted):
                diff = difflib.unified_diff(have.splitlines(), wanted.splitlines(),
                                            str(path), f"{path} (generated)", lineterm="", n=1)
                stale[path] = "\n".join(list(diff)[:40])
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if a generated notebook is out of date")
    ap.add_argument("sources", nargs="*", type=Path, help="default: notebooks/src/[0-9]*.py")
    args = ap.parse_args(argv)
    sources = [p.resolve() for p in args.sources] or sorted(SOURCES.glob("[0-9]*.py"))
    if not sources:
        print(f"no notebook sources in {SOURCES}", file=sys.stderr)
        return 1
    if args.check:
        stale = stale_files(sources)
        for path, diff in stale.items():
            print(f"STALE {path}\n{diff}\n")
        if stale:
            print("run: python scripts/sync_notebooks.py", file=sys.stderr)
            return 1
        print(f"{len(sources)} notebook(s) in sync")
        return 0
    for src in sources:
        for path, text in outputs_for(src).items():
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
