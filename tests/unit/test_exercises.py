"""The "predict, then measure" verdict: states the ratio, and asks for a missing prediction."""

from workshop import ui


def test_compare_states_the_ratio_both_ways():
    above = ui.compare_text(100, 150, "decode rate", "tok/s")
    assert "1.50x your prediction" in above and "50% above" in above and "tok/s" in above
    below = ui.compare_text(200, 150, "decode rate")
    assert "0.75x" in below and "25% below" in below


def test_compare_without_a_prediction_still_shows_the_measurement():
    text = ui.compare_text(None, 42.0, "TTFT", "ms")
    assert "42 ms" in text and "prediction" in text
    assert ui.compare(None, 1.0, "x").text == ui.compare_text(None, 1.0, "x")


def test_compare_names_a_computed_answer_as_computed():
    text = ui.compare_text(10, 17, "largest batch", "users", how="computed")
    assert text.startswith("**computed largest batch: 17 users**") and "computed value" in text
    assert "measure" not in text


def test_a_worked_answer_is_collapsed_until_opened():
    shown = ui.worked_answer("**3 x 4 = 12**").text
    assert shown.startswith("<details><summary><b>Worked answer</b></summary>")
    assert "**3 x 4 = 12**" in shown and shown.rstrip().endswith("</details>")


def test_outside_marimo_every_reveal_button_is_already_pressed():
    # a script has no one to press it; marimo's own button is checked by exporting a notebook
    # (tests/unit/test_notebooks_sync.py)
    assert ui.reveal_button("Measure").value is True
