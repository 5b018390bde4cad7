"""The slides: figures picked from executed notebooks, decks assembled from what exists, and
the decks built by Marp and rendered in a headless Chromium.

The last test needs Node.js/npm and Chromium (it skips, saying so, without them) and the
``playwright`` Python package (it fails without it: setup must install it).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLIDES = ROOT / "slides"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"slides_{name}", SLIDES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


ef = _load("export_figures")
bd = _load("build_decks")

PNG = b"\x89PNG\r\n\x1a\n" + b"fake image body"


def _png_output(png: bytes = PNG, titles: list[str] | None = None) -> dict:
    data = {"image/png": base64.b64encode(png).decode(), "text/plain": "<Figure size 825x462>"}
    if titles is not None:
        data[ef.FIGURE_MIME] = {"titles": titles}
    return {"output_type": "display_data", "data": data, "metadata": {}}


def _notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(source: str, *outputs: dict, stamp: str | None = None, reply: str | None = None) -> dict:
    execution = {}
    if stamp:
        execution["iopub.execute_input"] = stamp
    if reply:
        execution["shell.execute_reply"] = reply
    return {"cell_type": "code", "source": source, "outputs": list(outputs),
            "metadata": {"execution": execution}}


def _md(source: str) -> dict:
    return {"cell_type": "markdown", "source": source, "metadata": {}}


CONNECT = {"output_type": "stream", "name": "stdout", "text": (
    "engine:   vllm 0.32.0  ($WORKSHOP_BASE_URL)\n"
    "model:    smollm2-135m  [bfloat16]\n"
    "server:   http://127.0.0.1:1  device=cpu  max_model_len=2048  KV capacity=46592 tokens\n"
    "hardware: CPU Test CPU, 2 cores, 8 GiB RAM (no GPU)\n")}

SPEC = ef.FigureSpec("memory", r"fa\.memory_figure\(", r"Peak memory", "test figure")


# -- picking figures out of an executed notebook -------------------------------------------

def test_find_figure_returns_the_png_of_the_one_matching_cell():
    nb = _notebook(_md("## 3. Memory"), _code("x = 1"),
                   _code("fa.memory_figure(results)", _png_output()))
    cell, png, title = ef.find_figure(nb, SPEC)
    assert (cell, png, title) == (2, PNG, None)
    assert ef.section_of(nb["cells"], cell) == "3. Memory"


def test_find_figure_reads_sources_and_pngs_stored_as_lists_of_lines():
    b64 = base64.b64encode(PNG).decode()
    out = _png_output()
    out["data"]["image/png"] = [b64[:8] + "\n", b64[8:]]
    nb = _notebook(_code(["results = run()\n", "fa.memory_figure(results)"], out))
    assert ef.find_figure(nb, SPEC)[1] == PNG


@pytest.mark.parametrize("cells, why", [
    ([_code("plot_something_else()", _png_output())], "0 code cells match"),
    ([_code("fa.memory_figure(a)", _png_output()), _code("fa.memory_figure(b)", _png_output())],
     "2 code cells match"),
    ([_code("fa.memory_figure(a)")], "has 0 PNG outputs"),
    ([_code("fa.memory_figure(a)", _png_output(), _png_output())], "has 2 PNG outputs"),
    ([_code("fa.memory_figure(a)", {"output_type": "error", "ename": "ValueError",
                                     "evalue": "", "traceback": []})], "raised ['ValueError']"),
])
def test_find_figure_fails_loudly_when_the_figure_is_missing_or_ambiguous(cells, why):
    with pytest.raises(ef.ExportError, match=re.escape(why)):
        ef.find_figure(_notebook(*cells), SPEC)


def test_a_recorded_title_must_match_the_spec():
    ok = _notebook(_code("fa.memory_figure(r)", _png_output(titles=["Peak memory of one head"])))
    assert ef.find_figure(ok, SPEC)[2] == "Peak memory of one head"
    wrong = _notebook(_code("fa.memory_figure(r)", _png_output(titles=["Time per call"])))
    with pytest.raises(ef.ExportError, match="Time per call"):
        ef.find_figure(wrong, SPEC)


def test_the_kernel_records_left_titles_and_the_suptitle_too():
    # notebook 17's panels are titled on the left: centre titles alone read as no title
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure()
    left, right = fig.subplots(1, 2)
    left.set_title("colocated", loc="left")
    right.set_title("disaggregated")
    fig.suptitle("Gaps between tokens")
    titles = [t for t in ef.figure_titles(fig)["titles"] if t]
    assert titles == ["colocated", "disaggregated", "Gaps between tokens"]
    compile(ef._STARTUP, "startup", "exec")   # the copy the kernel runs is valid Python
    assert "def figure_titles" in ef._STARTUP


def test_run_metadata_reads_machine_engine_date_and_run_time_from_the_notebook():
    nb = _notebook(_code("session = connect()", CONNECT, stamp="2026-12-01T17:30:00.5Z"),
                   _code("x", reply="2026-12-01T17:31:30.5Z"))
    meta = ef.run_metadata(nb)
    assert meta["machine"] == "CPU Test CPU, 2 cores, 8 GiB RAM (no GPU)"
    assert meta["engine"] == "vllm 0.32.0"
    assert meta["date"] == "2026-12-01"
    assert meta["wall_s"] == 90.0
    assert meta["mode"] is None   # a CI run does not record it; --mode supplies it


def test_values_are_read_from_outputs_and_a_missing_one_is_an_error():
    nb = _notebook(_code("connect()", CONNECT))
    assert ef.find_values(nb, {"kv": (r"KV capacity=(\d+) tokens", "")}) == {"kv": "46592"}
    with pytest.raises(ef.ExportError, match="nope"):
        ef.find_values(nb, {"nope": (r"nope=(\d+)", "")})


def test_a_contender_the_run_left_out_reads_not_in_this_run_and_one_it_ran_must_match():
    """Notebook 10's slides list the whole CPU field; a quick run has three of its five."""
    nb = _notebook(_code("ui.md(...)", {"output_type": "display_data", "metadata": {}, "data": {
        "text/markdown": "**2 contenders** (vllm, mini-hash) x **1 workload** (shared-prefix), "
                         "the quick plan"}}))
    specs = {f"{e}_x": ef._of(e, rf"^{e} x=(\d+)", "") for e in ("sglang", "hf", "mini-radix")}
    assert ef.find_values(nb, specs) == dict.fromkeys(specs, ef.NOT_IN_RUN)
    for engine in ("vllm", "mini-hash"):
        with pytest.raises(ef.ExportError, match=f"{engine}_x"):
            ef.find_values(nb, {f"{engine}_x": ef._of(engine, rf"^{engine} x=(\d+)", "")})
    chart = _notebook(_code("ui.md(...)", {"output_type": "stream", "name": "stdout",
                                           "text": "Comparing **vllm, sglang** on **cpu**\n"}))
    assert ef.find_values(chart, {"hf": ef._setup_cell("hf", "answers", ef.CHART_FIELD)}) == \
        {"hf": ef.NOT_IN_RUN}
    with pytest.raises(ef.ExportError, match="sglang"):
        ef.find_values(chart, {"sglang": ef._setup_cell("sglang", "answers", ef.CHART_FIELD)})


def test_export_writes_pngs_pages_and_a_manifest_and_refuses_incomplete_runs(tmp_path):
    good = _notebook(_code("connect()", CONNECT, stamp="2026-12-01T17:30:00Z"), _md("## Memory"),
                     _code("fa.memory_figure(r)", _png_output()))
    (tmp_path / "nb.executed.ipynb").write_text(json.dumps(good))
    figures = {"06_x": [SPEC]}
    values = {"06_x": {"kv": (r"KV capacity=(\d+)", "")}}
    manifest = ef.export({"06_x": tmp_path / "nb.executed.ipynb"}, "quick",
                         figures_dir=tmp_path / "fig", reference_dir=tmp_path / "ref",
                         figures=figures, values=values)
    assert (tmp_path / "fig" / "06_x" / "memory.png").read_bytes() == PNG
    entry = manifest["figures"]["06_x/memory"]
    assert (entry["cell"], entry["section"]) == (2, "Memory")
    assert entry["sha256"] == hashlib.sha256(PNG).hexdigest()
    assert manifest["runs"]["06_x"]["mode"] == "quick"
    assert manifest["values"]["06_x"] == {"kv": "46592"}
    page = (tmp_path / "ref" / "06_x.html").read_text()
    assert "CPU Test CPU, 2 cores" in page and "data:image/png;base64," in page

    bad = _notebook(_code("connect()", CONNECT, stamp="2026-12-01T17:30:00Z"))
    (tmp_path / "bad.executed.ipynb").write_text(json.dumps(bad))
    with pytest.raises(ef.ExportError, match="memory"):
        ef.export({"06_x": tmp_path / "bad.executed.ipynb"}, "quick",
                  figures_dir=tmp_path / "fig", reference_dir=tmp_path / "ref",
                  figures=figures, values=values)
    # the failed export left the earlier figure and manifest alone
    assert json.loads((tmp_path / "fig" / "manifest.json").read_text()) == manifest


# -- assembling decks ----------------------------------------------------------------------

MANIFEST = {
    "runs": {"06_x": {"machine": "CPU Test, 2 cores", "date": "2026-12-01", "mode": "quick",
                      "engine": "vllm 0.32.0", "reference_page": "reference_run/06_x.html"}},
    "figures": {"06_x/memory": {"file": "figures/06_x/memory.png", "notebook": "06_x",
                                "cell": 17, "section": "3. Memory"}},
    "values": {"06_x": {"kv": "46592"}},
}


def test_directives_expand_from_the_manifest():
    text = ("{{figure 06_x/memory}}\n{{figure 06_x/memory h:300}}\nKV {{value 06_x/kv}}\n"
            "{{run 06_x}}")
    out = bd.expand(text, MANIFEST)
    assert "![h:430](../figures/06_x/memory.png)" in out
    assert "![h:300](../figures/06_x/memory.png)" in out
    assert "notebook 6, “3. Memory”, cell 17" in out
    assert "KV 46592" in out
    assert "quick-mode run on CPU Test, 2 cores, 2026-12-01, vllm 0.32.0" in out


@pytest.mark.parametrize("text, why", [
    ("{{figure 06_x/nope}}", "figure '06_x/nope'"),
    ("{{value 06_x/nope}}", "value '06_x/nope'"),
    ("{{run 05_y}}", "no reference run of 05_y"),
    ("{{chart 06_x}}", "unknown directive"),
])
def test_a_directive_the_manifest_cannot_fill_stops_the_build(text, why):
    with pytest.raises(bd.BuildError, match=re.escape(why)):
        bd.expand(text, MANIFEST)


def test_plan_skips_notebooks_that_do_not_exist_and_parts_with_nothing(tmp_path):
    for part, name in [(1, "00_a"), (3, "06_c"), (3, "07_d"), (3, "05_b"), (5, "12_f"),
                       (5, "13_g")]:
        (tmp_path / f"part{part}").mkdir(exist_ok=True)
        (tmp_path / f"part{part}" / f"{name}.md").write_text("## slide")
    # 05_b is not a notebook (yet); 08_e and 11_h are notebooks without slides; nothing for
    # parts 2 and 4; 12_f is part 5's, not part 4's
    included, notes = bd.plan(["00_a", "06_c", "07_d", "08_e", "11_h", "12_f"], decks=tmp_path)
    assert included == {1: ["00_a"], 3: ["06_c", "07_d"], 5: ["12_f"]}
    text = "\n".join(notes)
    assert "skipping slides for 05_b" in text and "skipping slides for 13_g" in text
    assert "notebook 08_e has no slides yet" in text
    assert "part 4: notebook 11_h has no slides yet (slides/decks/part4/11_h.md)" in text
    assert "part 2: not built" in text
    assert "part 4: not built (no notebook in 10-11 with slides)" in text


def test_parts_cover_every_notebook_number_once_and_every_deck_folder_is_a_part():
    numbers = [n for part in bd.PARTS for n in part.notebooks]
    assert numbers == list(range(100))
    assert [p.number for p in bd.PARTS] == list(range(1, len(bd.PARTS) + 1))
    folders = sorted(d.name for d in (SLIDES / "decks").iterdir() if d.is_dir())
    assert folders == [f"part{p.number}" for p in bd.PARTS]
    for folder in folders:
        assert (SLIDES / "decks" / folder / "_title.md").exists(), folder
        for md in (SLIDES / "decks" / folder).glob("[0-9]*.md"):
            part = next(p for p in bd.PARTS if bd.notebook_number(md.stem) in p.notebooks)
            assert f"part{part.number}" == folder, f"{md.name} belongs in part{part.number}"


def test_setup_values_read_the_configuration_table_not_the_field_table():
    """Notebook 10 prints the field (label | engine | server args ...) before the set-up
    table (engine | answers | dtype ...): both have a row starting with the engine's name."""
    field = ("| label | engine | server args | server | note |\n|---|---|---|---|---|\n"
             "| vllm | vllm | -- --max-num-seqs 32 | already running |  |\n")
    setup = ("| engine | answers | dtype | attention | prefix cache | compiled | max running | "
             "KV tokens | CPU | notes |\n|---|---|---|---|---|---|---|---|---|---|\n"
             "| vllm | right (11 as the reference, 3 near ties) | bfloat16 | CPU_ATTN (AMX) | "
             "hashed blocks of 128 tokens | compiled | 64 | 46592 | avx2 | - |\n")
    def md(text):
        return {"output_type": "display_data", "data": {"text/markdown": text}}

    nb = _notebook(_code("field", md(field)), _code("setup", md(setup)))
    specs = {**ef._setup_values(["vllm"], ef.SETUP_COLUMNS),
             "args": ef.VALUES["10_engine_showdown"]["vllm_args"]}
    values = ef.find_values(nb, specs)
    assert values == {"vllm_answers": "right (11 as the reference, 3 near ties)",
                      "vllm_dtype": "bfloat16", "vllm_attention": "CPU_ATTN (AMX)",
                      "vllm_prefix_cache": "hashed blocks of 128 tokens",
                      "vllm_compiled": "compiled", "vllm_max_running": "64",
                      "vllm_kv_tokens": "46592", "vllm_cpu": "avx2",
                      "args": "-- --max-num-seqs 32"}
    contenders = md("**1 contenders** (vllm) x **1 workload** (shared-prefix), the quick plan")
    with pytest.raises(ef.ExportError, match="vllm_dtype"):
        ef.find_values(_notebook(_code("field", md(field)), _code("plan", contenders)),
                       ef._setup_values(["vllm"], ["dtype"]))


def test_stage_values_skip_the_verdict_table_with_the_same_first_columns():
    """Notebook 11 prints this run's verdicts (workload | constraint | result | ...) before
    the two-stage table (workload | constraint | stage A | stage B | same winner)."""
    verdicts = ("| workload | constraint | result | margin |\n|---|---|---|---|\n"
                "| shared-prefix | throughput | - | - |\n")
    stages = ("| workload | constraint | Xeon with AMX | EPYC with AVX2 only | same winner |\n"
              "|---|---|---|---|---|\n"
              "| shared-prefix | throughput | vllm x1.9 | tie: a, b | no |\n")
    def md(text):
        return {"output_type": "display_data", "data": {"text/markdown": text}}

    nb = _notebook(_code("v", md(verdicts)), _code("s", md(stages)))
    specs = {k: v for k, v in ef.VALUES["11_decision_chart"].items()
             if k.startswith("stage_shared_prefix_throughput")}
    assert ef.find_values(nb, specs) == {"stage_shared_prefix_throughput_amx": "vllm x1.9",
                                         "stage_shared_prefix_throughput_epyc": "tie: a, b"}


def test_deck_markdown_joins_sections_with_slide_breaks_and_ends_with_the_sources(tmp_path):
    (tmp_path / "part3").mkdir()
    (tmp_path / "part3" / "_title.md").write_text("# Part 3\n")
    (tmp_path / "part3" / "06_x.md").write_text("## A\n\n{{figure 06_x/memory}}\n")
    md = bd.deck_markdown(bd.PARTS[2], ["06_x"], MANIFEST, decks=tmp_path)
    assert md.startswith("---\nmarp: true\n")
    slides = md.split("\n---\n")[1:]   # after the front matter
    assert [s.strip().splitlines()[0] for s in slides] == [
        "# Part 3", "## A", "<!-- _class: sources -->"]
    assert "slides/reference_run/06_x.html" in slides[-1]


# -- the committed figures and decks -------------------------------------------------------

def test_committed_figures_match_the_manifest_and_every_existing_deck_builds_as_markdown(tmp_path):
    manifest = json.loads((SLIDES / "figures" / "manifest.json").read_text())
    for key, fig in manifest["figures"].items():
        png = (SLIDES / fig["file"]).read_bytes()
        assert hashlib.sha256(png).hexdigest() == fig["sha256"], key
        assert fig["notebook"] in manifest["runs"], key
    for run in manifest["runs"].values():
        assert run["machine"] and run["date"] and run["mode"] in ("quick", "full")
    built = bd.build(tmp_path, render_decks=False)
    assert [p.name for p in built][:1] == ["part1.md"]
    for md in built:
        assert "{{" not in md.read_text(), md.name


def test_the_reference_run_covers_every_notebook_in_full_mode_one_at_a_time():
    """Issue 35: readers without a machine learn from these numbers, so every notebook has a
    run, in full mode, and no run shared the machine with another."""
    runs = json.loads((SLIDES / "figures" / "manifest.json").read_text())["runs"]
    assert set(bd.existing_notebooks()) <= set(runs), "notebooks without a reference run"
    quick = sorted(n for n, r in runs.items() if r["mode"] != "full")
    assert not quick, f"reference runs in quick mode: {quick}"
    spans = sorted((ef.dt.datetime.fromisoformat(r["started"].replace("Z", "+00:00")),
                    r["wall_s"], n) for n, r in runs.items())
    # any overlap shows between two runs that started one after the other
    overlaps = [(a[2], b[2]) for a, b in zip(spans, spans[1:])
                if a[0] + ef.dt.timedelta(seconds=a[1]) > b[0]]
    assert not overlaps, f"runs that shared the machine: {overlaps}"


def test_the_agendas_run_times_are_the_reference_runs():
    """The agendas in slides/README.md quote each notebook's run time; they are the committed
    reference run's, so a new run cannot leave them behind."""
    runs = json.loads((SLIDES / "figures" / "manifest.json").read_text())["runs"]
    by_number = {int(name[:2]): run for name, run in runs.items()}
    quoted = re.findall(r"notebook (\d+) whole: ([\d,]+) s", (SLIDES / "README.md").read_text())
    assert quoted
    wrong = [(n, t, round(by_number[int(n)]["wall_s"])) for n, t in quoted
             if int(t.replace(",", "")) != round(by_number[int(n)]["wall_s"])]
    assert not wrong, f"(notebook, quoted, the reference run's) {wrong}"


def test_every_figure_selector_still_matches_one_cell_of_its_notebook():
    """Catches a renamed plotting call now, not at the next --refresh."""
    for name, specs in ef.FIGURES.items():
        path = ROOT / "notebooks" / f"{name}.ipynb"
        if not path.exists():
            continue   # a notebook that is gone (or not written yet) is skipped by the build
        cells = json.loads(path.read_text())["cells"]
        for spec in specs:
            pattern = re.compile(spec.source, re.M)
            hits = [i for i, c in enumerate(cells)
                    if c["cell_type"] == "code" and pattern.search(ef._join(c["source"]))]
            assert len(hits) == 1, f"{name}/{spec.name}: /{spec.source}/ matches cells {hits}"


# -- the real build ------------------------------------------------------------------------

def _needs_tools() -> None:
    # On CI a missing tool is a setup bug (scripts/setup.sh installs them), not a reason to skip.
    missing = pytest.fail if os.environ.get("CI") else pytest.skip
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            missing(f"{tool} is not installed: the decks are built with Marp CLI from npm "
                    "(setup must install Node.js and npm)")
    if bd.browser_path() is None:
        missing("no Chromium at /usr/bin/chromium or $CHROME_PATH (scripts/setup.sh installs "
                "Debian's chromium when it runs as root)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("the Python package 'playwright' is missing: setup must install it (it "
                    "drives the system Chromium; no browser download)")


@pytest.mark.timeout(900)
def test_build_slides_renders_first_and_last_slide_of_every_deck_without_browser_errors():
    _needs_tools()
    env = dict(os.environ, CHROME_PATH=bd.browser_path())
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build_slides.sh")], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, f"build_slides.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    built = sorted(bd.BUILD.glob("part*.html"))
    included, _ = bd.plan(bd.existing_notebooks())
    assert [p.stem for p in built] == [f"part{n}" for n in sorted(included)]
    for html_file in built:
        assert html_file.with_suffix(".pdf").stat().st_size > 10_000
        shots, errors = bd.screenshot_slides(html_file, bd.BUILD / "png", "ends")
        assert not errors, f"{html_file.name}: {errors}"
        assert len(shots) == 2
        for shot in shots:
            assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 5_000
