"""The committed notebooks are generated from notebooks/src and must match it."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sync_notebooks",
                                               ROOT / "scripts" / "sync_notebooks.py")
sync = importlib.util.module_from_spec(_spec)
sys.modules["sync_notebooks"] = sync   # dataclasses look their module up there
_spec.loader.exec_module(sync)  # type: ignore[union-attr]

SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9]*.py"))


def test_there_are_notebooks():
    assert SOURCES, "no notebook sources found"


def test_committed_notebooks_are_in_sync():
    stale = sync.stale_files()
    assert not stale, ("generated notebooks are stale; run `python scripts/sync_notebooks.py`:\n"
                       + "\n".join(stale.values()))


def test_check_cli_exit_code_is_zero_when_in_sync():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sync_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_each_generated_pair_is_well_formed(src: Path):
    import nbformat

    assert "import marimo" not in src.read_text()
    nb = nbformat.reads((ROOT / "notebooks" / f"{src.stem}.ipynb").read_text(), as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code")
    marimo_text = (ROOT / "notebooks" / f"{src.stem}.py").read_text()
    ast.parse(marimo_text)
    assert "import marimo" in marimo_text and "app = marimo.App(" in marimo_text


def test_marimo_accepts_every_generated_notebook():
    """marimo's own linter on the committed files: one definition per name, no cycles, no
    syntax marimo refuses. CI executes only some notebooks in marimo (tests/notebooks), so
    this is what checks the others' cell graphs."""
    files = [str(ROOT / "notebooks" / f"{src.stem}.py") for src in SOURCES]
    r = subprocess.run([sys.executable, "-m", "marimo", "check", *files],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


SAMPLE = '''\
# %% [markdown]
# # Sample title
#
# Some prose with a backslash \\alpha.

# %%
x = 1

# %% tags=["jupyter-only"]
y = "jupyter"

# %% tags=["marimo-only"]
y = "marimo"

# %%
print(x, y)
'''


def _generate(tmp_path: Path, text: str) -> dict[str, str]:
    src = tmp_path / "src" / "00_sample.py"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    return {p.suffix: t for p, t in sync.outputs_for(src, tmp_path).items()}


def test_format_tags_route_cells(tmp_path: Path):
    out = _generate(tmp_path, SAMPLE)
    sources = ["".join(c["source"]) for c in json.loads(out[".ipynb"])["cells"]]
    assert 'y = "jupyter"' in sources and 'y = "marimo"' not in sources
    assert 'y = "marimo"' in out[".py"] and 'y = "jupyter"' not in out[".py"]
    assert 'app_title="Sample title"' in out[".py"]
    assert "\\alpha" in out[".py"]   # raw markdown string keeps backslashes


def test_cell_ids_are_deterministic(tmp_path: Path):
    assert _generate(tmp_path, SAMPLE) == _generate(tmp_path, SAMPLE)


def test_marimo_file_runs_as_a_script(tmp_path: Path):
    path = tmp_path / "00_sample.py"
    path.write_text(_generate(tmp_path, SAMPLE)[".py"])
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "1 marimo" in r.stdout


EXERCISE_SAMPLE = '''\
# %% [markdown]
# **Exercise 1 (predict, then measure).** How many widgets?

# %%
my_widgets = None    # your prediction

# %%
from workshop import ui

widgets = 6 * 7
print("measured", widgets)
ui.compare(my_widgets, widgets, "widgets")

# %%
# Worked answer to Exercise 1, collapsed until opened
ui.worked_answer(f"6 x 7 = {widgets}")
'''


def _marimo_cells(text: str) -> list[str]:
    return text.split("\n@app.cell")[1:]


def test_an_exercise_waits_for_its_button_in_marimo_only(tmp_path: Path):
    out = _generate(tmp_path, EXERCISE_SAMPLE)
    cells = _marimo_cells(out[".py"])
    at = next(i for i, c in enumerate(cells) if "my_widgets = None" in c)
    assert "(hide_code=True)" in cells[at + 1]
    assert 'reveal_exercise_1 = _reveal_button("Measure")' in cells[at + 1]
    # the measurement and the worked answer start with the stop (after the cell's comments)
    assert "):\n    mo.stop(not reveal_exercise_1.value,\n" in cells[at + 2]
    assert "press **Measure**" in cells[at + 2] and "ui.compare(my_widgets" in cells[at + 2]
    assert ("):\n    # Worked answer to Exercise 1, collapsed until opened\n"
            "    mo.stop(not reveal_exercise_1.value)\n    ui.worked_answer(") in cells[at + 3]
    sources = ["".join(c["source"]) for c in json.loads(out[".ipynb"])["cells"]]
    # Jupyter gets the cells as written
    assert sources == [c.source for c in sync.read_source(EXERCISE_SAMPLE)[1]]


def test_an_unattended_marimo_run_reveals_every_exercise(tmp_path: Path):
    """No one presses the button in a script or ``marimo export html``: both show the
    measurement and the worked answer (the export tells itself from the editor by the missing
    HTTP request, which a marimo release could change)."""
    path = tmp_path / "00_sample.py"
    path.write_text(_generate(tmp_path, EXERCISE_SAMPLE)[".py"])
    # the notebook imports workshop.ui from this checkout
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0 and "measured 42" in r.stdout, r.stderr
    html = tmp_path / "sample.html"
    r = subprocess.run([sys.executable, "-m", "marimo", "export", "html", "--no-sandbox",
                        "--no-include-code", str(path), "-o", str(html)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    shown = html.read_text()
    assert "measured widgets: 42" in shown and "6 x 7 = 42" in shown
    assert "then press" not in shown


@pytest.mark.parametrize("bad, message", [
    ("# %%\nx = 1\n\n# %%\nx = 2\n", "defined in cell"),
    ("# %%\n%pip install foo\n", "magics"),
    ("# %%\nimport marimo as mo\n", "import marimo"),
    ('# %% tags=["colab"]\nx = 1\n', "unknown cell tags"),
    ('# %% tags=["jupyter-only", "marimo-only"]\nx = 1\n', "both"),
    ("# %%\n_t = 1\n\n# %%\ny = _t + 1\n", "reads '_t' without defining it"),
    ("# %% [markdown]\n# **Exercise 1 (predict, then measure).** ?\n\n# %%\n"
     "guess = None  # your prediction\n\n# %%\nprint(guess)\n", "no cell calls ui.compare"),
])
def test_sources_that_break_a_format_are_rejected(tmp_path: Path, bad: str, message: str):
    with pytest.raises(sync.NotebookSourceError, match=message):
        _generate(tmp_path, bad)


def test_check_mode_reports_a_hand_edited_output(tmp_path: Path):
    src = tmp_path / "src" / "00_sample.py"
    src.parent.mkdir()
    src.write_text(SAMPLE)
    for path, text in sync.outputs_for(src, tmp_path).items():
        path.write_text(text)
    assert sync.stale_files([src], tmp_path) == {}
    edited = tmp_path / "00_sample.ipynb"
    edited.write_text(edited.read_text().replace("Some prose", "Edited prose"))
    assert list(sync.stale_files([src], tmp_path)) == [edited]
    # A different marimo version alone does not make a file stale.
    marimo_file = tmp_path / "00_sample.py"
    edited.write_text(sync.outputs_for(src, tmp_path)[edited])
    marimo_file.write_text(marimo_file.read_text().replace(
        '__generated_with = "', '__generated_with = "9.9.9-'))
    assert sync.stale_files([src], tmp_path) == {}
