"""Predict, then measure, in that order: every exercise in a notebook source has a prediction
cell, then the cell that measures or computes it (``ui.compare`` on that prediction), then a
worked answer (``ui.worked_answer``) before the next exercise. Read from the sources, so a
reordering that shows the answer before the question fails here. In the generated marimo files,
which run every cell at once, each exercise's measurement waits for its own button."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = NOTEBOOKS / "src"
EXERCISE = re.compile(r"^# \*\*Exercise (\d+) \(predict, then (?:measure|compute)\)\.\*\*", re.M)
PREDICTION = re.compile(r"^(\w+) = None\b.*#.*predict", re.M)
# Every notebook (issue 36: two to four exercises each, each with a worked answer).
WORKED = sorted(p.stem for p in SOURCES.glob("[0-9][0-9]_*.py"))


def exercises(text: str) -> list[tuple[int, str]]:
    """(number, the source from its heading to the next exercise's) for each exercise."""
    marks = list(EXERCISE.finditer(text))
    return [(int(m.group(1)), text[m.start():marks[i + 1].start() if i + 1 < len(marks) else None])
            for i, m in enumerate(marks)]


def order_problems(text: str) -> list[str]:
    found = exercises(text)
    problems = []
    if [n for n, _ in found] != list(range(1, len(found) + 1)) or not 2 <= len(found) <= 4:
        problems.append(f"exercises numbered {[n for n, _ in found]}: want 1..N, N from 2 to 4")
    for n, body in found:
        guess = PREDICTION.search(body)
        if guess is None:
            problems.append(f"exercise {n}: no prediction cell (`name = None  # ... predict...`)")
            continue
        measured = body.find(f"ui.compare({guess.group(1)},", guess.end())
        if measured < 0:
            problems.append(f"exercise {n}: no ui.compare({guess.group(1)}, ...) after the "
                            "prediction")
            continue
        if body.find("ui.worked_answer(", measured) < 0:
            problems.append(f"exercise {n}: no ui.worked_answer after the measurement")
        elif f"# Worked answer to Exercise {n}," not in body[measured:]:
            # the label a reader of the unexecuted notebook sees (GitHub, Colab before a run)
            problems.append(f"exercise {n}: its worked answer's cell does not say "
                            f"'# Worked answer to Exercise {n}, ...'")
    return problems


@pytest.mark.parametrize("name", WORKED)
def test_each_exercise_predicts_then_measures_then_works_the_answer(name):
    assert order_problems((SOURCES / f"{name}.py").read_text()) == []


@pytest.mark.parametrize("name", WORKED)
def test_each_marimo_exercise_waits_for_its_own_button(name):
    found = exercises((SOURCES / f"{name}.py").read_text())
    cells = (NOTEBOOKS / f"{name}.py").read_text().split("\n@app.cell")
    buttons = re.findall(r"^    (reveal_exercise_\d+) = ", "\n".join(cells), re.M)
    assert buttons == [f"reveal_exercise_{n}" for n, _ in found]
    for n, body in found:
        guess = PREDICTION.search(body).group(1)
        gated = [c for c in cells if f"ui.compare({guess}," in c
                 or f"# Worked answer to Exercise {n}," in c]
        assert len(gated) == 2 and all(f"mo.stop(not reveal_exercise_{n}.value" in c
                                       for c in gated), f"exercise {n}"


def test_the_check_fails_an_answer_shown_before_the_question():
    good = ("# **Exercise 1 (predict, then measure).** How many?\n\n# %%\n"
            "guess = None    # your prediction\n\n# %%\nx = 3\nui.compare(guess, x, 'x')\n\n"
            "# %%\n# Worked answer to Exercise 1, collapsed until opened\n"
            "ui.worked_answer(f'{x}')\n\n"
            "# **Exercise 2 (predict, then compute).** And?\n\n# %%\n"
            "guess2 = None   # your prediction\n\n# %%\nui.compare(guess2, 4, 'y')\n"
            "# Worked answer to Exercise 2, collapsed until opened\nui.worked_answer('4')\n")
    assert order_problems(good) == []
    measured_first = good.replace("guess = None    # your prediction\n\n# %%\nx = 3\n"
                                  "ui.compare(guess, x, 'x')",
                                  "x = 3\nui.compare(guess, x, 'x')\n\n# %%\n"
                                  "guess = None    # your prediction")
    assert ("exercise 1: no ui.compare(guess, ...) after the prediction"
            in order_problems(measured_first))
    assert "exercise 2: no ui.worked_answer after the measurement" in order_problems(
        good.replace("ui.worked_answer('4')", ""))
    assert order_problems(good.replace("Exercise 2",
                                       "Exercise 3"))[0].startswith("exercises numbered")
    unlabelled = good.replace("# Worked answer to Exercise 1, collapsed until opened\n", "")
    assert order_problems(unlabelled) == [
        "exercise 1: its worked answer's cell does not say '# Worked answer to Exercise 1, ...'"]
