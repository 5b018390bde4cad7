"""Format-neutral controls, progress and rich output for the notebooks.

The same notebook source runs in three places, and each wants different objects:

* marimo (editor, Molab): ``mo.ui`` elements, which re-run dependent cells when moved;
* Jupyter (Colab, nbclient): ``ipywidgets``, whose ``.value`` a cell reads when it is run;
* a plain script (``python notebooks/NN.py``, CI): no display at all, defaults only.

Every control here returns an object with ``.value`` that displays itself when it is the last
expression of a cell, so a notebook writes one line and works in all three. Read ``.value`` in a
*later* cell than the one that creates the control (marimo forbids reading it in the same one).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


def frontend() -> str:
    """``"marimo"`` inside a marimo notebook, ``"jupyter"`` in an IPython kernel, else
    ``"script"``."""
    if "marimo" in sys.modules:
        import marimo

        if marimo.running_in_notebook():
            return "marimo"
    if "ipykernel" in sys.modules:
        try:
            from IPython import get_ipython
        except ImportError:
            return "script"
        shell = get_ipython()
        if shell is not None and getattr(shell, "kernel", None) is not None:
            return "jupyter"
    return "script"


class Fixed:
    """A control with nothing to move: scripts and CI get the default value."""

    def __init__(self, value: Any, label: str = "") -> None:
        self.value = value
        self.label = label

    def __repr__(self) -> str:
        return f"{self.label or 'value'}: {self.value!r}"


def _ipywidgets():
    try:
        import ipywidgets
        return ipywidgets
    except ImportError:   # Jupyter without ipywidgets: behave like a script
        return None


def slider(start: float, stop: float, value: float, step: float = 1, label: str = "") -> Any:
    """A numeric slider; ints stay ints when start, stop and step are ints."""
    where = frontend()
    if where == "marimo":
        import marimo as mo
        return mo.ui.slider(start=start, stop=stop, step=step, value=value, label=label,
                            show_value=True)
    widgets = _ipywidgets() if where == "jupyter" else None
    if widgets is None:
        return Fixed(value, label)
    is_int = all(float(x).is_integer() for x in (start, stop, step, value))
    cls = widgets.IntSlider if is_int else widgets.FloatSlider
    return cls(min=start, max=stop, step=step, value=value, description=label,
               style={"description_width": "initial"},
               layout=widgets.Layout(width="60%"))


def dropdown(options: Sequence[str], value: str, label: str = "") -> Any:
    where = frontend()
    if where == "marimo":
        import marimo as mo
        return mo.ui.dropdown(options=list(options), value=value, label=label)
    widgets = _ipywidgets() if where == "jupyter" else None
    if widgets is None:
        return Fixed(value, label)
    return widgets.Dropdown(options=list(options), value=value, description=label,
                            style={"description_width": "initial"})


def text(value: str, label: str = "") -> Any:
    where = frontend()
    if where == "marimo":
        import marimo as mo
        return mo.ui.text(value=value, label=label, full_width=True)
    widgets = _ipywidgets() if where == "jupyter" else None
    if widgets is None:
        return Fixed(value, label)
    return widgets.Text(value=value, description=label, style={"description_width": "initial"},
                        layout=widgets.Layout(width="80%"))


def reveal_button(label: str) -> Any:
    """The button a "predict, then measure" exercise waits on in marimo, where every cell runs
    at once: ``scripts/sync_notebooks.py`` puts it under the prediction and starts the
    measuring cells with ``mo.stop(not button.value, ...)``. Once pressed it stays pressed, so
    re-running a cell above does not hide the measurement again. A run no browser asked for
    (``marimo export html``, ``python notebook.py``) finds it pressed and shows everything."""
    if frontend() == "marimo":
        import marimo as mo
        # `marimo export` runs in "edit" mode too; only runs a browser asked for have a request.
        return mo.ui.button(value=mo.app_meta().request is None, on_click=lambda _: True,
                            label=label, kind="success")
    return Fixed(True, label)


def progress(items: Iterable[T], total: int | None = None, title: str = "") -> Iterator[T]:
    """Wrap an iterable in a progress bar that the current front end can draw."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if frontend() == "marimo":
        import marimo as mo
        return iter(mo.status.progress_bar(items, total=total, title=title or None,
                                           remove_on_exit=True))
    from tqdm.auto import tqdm
    return iter(tqdm(items, total=total, desc=title or None, leave=False))


class Markdown:
    """Markdown that renders in Jupyter (``_repr_markdown_``) and prints readably in a script."""

    def __init__(self, text: str) -> None:
        self.text = text

    def _repr_markdown_(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def md(text: str) -> Any:
    """Render computed markdown (numbers measured in this run) as a cell's output."""
    if frontend() == "marimo":
        import marimo as mo
        return mo.md(text)
    return Markdown(text)


WORKED_ANSWER = "Worked answer"


def worked_answer(text: str) -> Any:
    """An exercise's worked answer (markdown computed in this run), collapsed until opened:
    a marimo accordion, an HTML ``<details>`` block in Jupyter and Colab."""
    if frontend() == "marimo":
        import marimo as mo
        return mo.accordion({WORKED_ANSWER: mo.md(text)})
    return Markdown(f"<details><summary><b>{WORKED_ANSWER}</b></summary>\n\n{text}\n\n</details>")


def table(rows: Sequence[dict[str, Any]], floatfmt: str = ".3g") -> Any:
    """Render a list of dicts (same keys) as a markdown table."""
    return md(markdown_table(rows, floatfmt))


def markdown_table(rows: Sequence[dict[str, Any]], floatfmt: str = ".3g") -> str:
    if not rows:
        return "_(no rows)_"
    keys = list(rows[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return format(v, floatfmt)
        return "" if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows]
    return "\n".join(lines)


def compare(prediction: float | None, measured: float, what: str, unit: str = "",
            how: str = "measured") -> Any:
    """The verdict of a "predict, then measure" exercise, as markdown.

    ``prediction`` is the number the learner wrote in the cell before (None: not written yet).
    ``how`` says where the other number came from ("measured", or "computed" where the
    exercise checks a prediction against a formula). The verdict only states the ratio; what
    it means is for the notebook's prose.
    """
    return md(compare_text(prediction, measured, what, unit, how))


def compare_text(prediction: float | None, measured: float, what: str, unit: str = "",
                 how: str = "measured") -> str:
    unit = f" {unit}" if unit else ""
    got = f"**{how} {what}: {measured:,.4g}{unit}**"
    if prediction is None:
        return f"{got}. (Write your prediction in the cell above and run both cells again.)"
    if prediction == 0 or measured == 0:
        return f"{got}; you predicted {prediction:,.4g}{unit}."
    ratio = measured / prediction
    return (f"{got}; you predicted {prediction:,.4g}{unit}: the {how} value is "
            f"{ratio:.2f}x your prediction ({abs(ratio - 1):.0%} "
            f"{'above' if ratio > 1 else 'below'} it).")
