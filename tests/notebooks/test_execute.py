"""Execute the notebooks end to end, in quick mode, against real servers.

* Jupyter: the generated ``.ipynb`` runs in a fresh kernel through nbclient (working
  directory ``notebooks/``, as when a learner opens it there).
* marimo: ``marimo export html`` runs the generated ``.py`` in a marimo kernel, so marimo's
  UI elements and progress bars are exercised; it exits non-zero when any cell fails.

Both get ``WORKSHOP_QUICK=1`` and the URLs / API keys of the session's vLLM and hf servers, so
``workshop.session.connect()`` never starts a server of its own here.

Every notebook runs in Jupyter. Both formats run the same cells (scripts/sync_notebooks.py
writes them from one source and refuses what one format cannot run), and ``marimo check``
(tests/unit/test_notebooks_sync.py) checks every marimo file's cell graph; what only an
execution in marimo shows is its kernel at work: cells in dependency order, UI elements and
progress bars through ``workshop.ui``. So by default marimo executes a few notebooks
(``MARIMO_NAMES``), which keeps the suite within its time budget on a 2-core machine; ``WORKSHOP_TEST_MATRIX=full`` executes every notebook in both formats, and notebook
1 on SGLang too (before a release, or after changing ``workshop.ui``, the sync script or
``workshop.session``'s engine choice).

Notebook 0 also runs against the session's SGLang server (``WORKSHOP_ENGINE=sglang``, its URL
in ``WORKSHOP_SGLANG_BASE_URL``); in the full matrix, notebook 1 too (its baseline is still the
hf server), and notebook 0 in marimo. Those runs come first in this file: the fleet stops each
engine's server after the last test that uses it (tests/conftest.py), so SGLang is gone before
the other notebooks run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import FULL_MATRIX, unavailable

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NAMES = sorted(p.stem for p in (NOTEBOOKS / "src").glob("[0-9]*.py"))
# Whole-notebook limit; quick mode takes 15-90 s each on an idle 2-core machine, several times
# that on a machine shared with other jobs.
TIMEOUT_S = int(os.environ.get("WORKSHOP_NOTEBOOK_TIMEOUT", "900"))
OUT_DIR = Path(os.environ.get("WORKSHOP_TEST_LOGS", "/tmp/workshop-test-logs")) / "notebooks"

# pytest-timeout's default (pyproject) would cut a slow notebook before its own limit does.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(TIMEOUT_S + 120)]


# Executed in marimo by default: the newest notebooks (15-17, which their issues ask to run in
# both formats), and 02 and 11, quick ones that add the UI elements those lack (a dropdown, a
# text field). Between them they use every kind of UI element and progress bar.
MARIMO_NAMES = ["02_kv_cache_capacity", "11_decision_chart", "15_sampling_structured_output",
                "16_cache_aware_routing", "17_disaggregated_prefill_decode"]
if FULL_MATRIX:
    MARIMO_NAMES = NAMES

# Notebooks that run against SGLang too (issue 13). Notebook 1 (a dozen minutes on SGLang on a
# 2-core AVX2 CPU, where SGLang decodes several times slower than vLLM) only in the full
# matrix; the rest need what only vLLM or the teaching engine offers.
SGLANG_NAMES = ["00_setup_first_request"] + (["01_pain_points"] if FULL_MATRIX else [])
# The first cell is the same code in both formats, so marimo runs notebook 0 on SGLang in the
# full matrix only (the Jupyter run checks the engine line it printed).
SGLANG_MARIMO_NAMES = ["00_setup_first_request"] if FULL_MATRIX else []
# Notebooks that set SGLang beside the session's vLLM (``workshop.session.beside``) when
# WORKSHOP_SGLANG_BASE_URL names it: their Jupyter run, with SGLang, is in the SGLang section
# (where SGLang is installed, so always on CI) instead of among the plain runs.
SGLANG_BESIDE_NAMES = ["15_sampling_structured_output"]
PLAIN_NAMES = [n for n in NAMES if unavailable("sglang") or n not in SGLANG_BESIDE_NAMES]


def notebook_env(server, hf_server) -> dict[str, str]:
    """The environment a notebook runs in: ``server`` is the engine its first cell connects
    to (through ``WORKSHOP_ENGINE`` and that engine's variables), hf the baseline."""
    from workshop.session import env_names

    url_var, key_var = env_names(server.engine)
    env = dict(os.environ)
    env.update({
        "WORKSHOP_QUICK": "1",
        "WORKSHOP_ENGINE": server.engine,
        url_var: server.base_url,
        key_var: server.api_key or "",
        "WORKSHOP_HF_BASE_URL": hf_server.base_url,
        "WORKSHOP_HF_API_KEY": hf_server.api_key or "",
        "HF_HUB_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        # the checkout, importable whether or not the package is pip-installed
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    })
    return env


def run_jupyter(name: str, env: dict[str, str], monkeypatch, tag: str = "") -> None:
    import nbformat
    from nbclient import NotebookClient

    for key, value in env.items():
        monkeypatch.setenv(key, value)   # the kernel inherits this process's environment
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.monotonic()
    try:
        client.execute()
    finally:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        # for reading after a failure
        nbformat.write(nb, OUT_DIR / f"{name}{tag}.executed.ipynb")
    elapsed = time.monotonic() - start
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
    shown = "\n".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("text", ""))
                      for o in outputs)
    assert not implausible(shown), f"{name}: a sanity gate failed: {implausible(shown)}"
    print(f"{name}.ipynb{tag} executed in {elapsed:.0f} s")


def implausible(text: str) -> list[str]:
    """The lines a sanity gate printed (``workshop.sanity.MARK``): a measurement that breaks
    physics fails the notebook's test."""
    from workshop.sanity import MARK
    return [line.strip()[:300] for line in text.splitlines() if MARK in line]


def run_marimo(name: str, env: dict[str, str], tag: str = "") -> None:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    html = OUT_DIR / f"{name}{tag}.html"
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "marimo", "export", "html", "--no-sandbox", "-f",
                        str(NOTEBOOKS / f"{name}.py"), "-o", str(html)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, f"marimo export failed ({elapsed:.0f} s):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert html.exists() and html.stat().st_size > 10_000
    found = implausible(html.read_text(errors="replace"))
    assert not found, f"{name}: a sanity gate failed: {found}"
    print(f"{name}.py{tag} executed in {elapsed:.0f} s")


def first_cell_engine(path: Path) -> str:
    """The engine line the first cell printed, from an executed notebook (Jupyter)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    text = "".join(o.get("text", "") for o in first.get("outputs", []))
    return next((line for line in text.splitlines() if line.startswith("engine:")), text[-300:])


def sglang_env(sglang_server, hf_server) -> dict[str, str]:
    env = notebook_env(sglang_server, hf_server)
    # A tripwire: vLLM's variable names a port where nothing listens, so a first cell that
    # ignored WORKSHOP_ENGINE fails (after connect()'s wait) instead of quietly running the
    # notebook against a vLLM server, or starting one.
    env["WORKSHOP_BASE_URL"] = "http://127.0.0.1:9"
    return env


def requests_served(server) -> float:
    return server.metric("reference_server_requests_total")


# -- against SGLang: first in the file, so the fleet retires SGLang before the rest -------------

@pytest.mark.parametrize("name", SGLANG_NAMES)
def test_jupyter_notebook_runs_on_sglang(name, sglang_server, hf_server, monkeypatch):
    before = requests_served(sglang_server)
    run_jupyter(name, sglang_env(sglang_server, hf_server), monkeypatch, tag=".sglang")
    # The first cell connected to SGLang through WORKSHOP_ENGINE, and the requests went there.
    line = first_cell_engine(OUT_DIR / f"{name}.sglang.executed.ipynb")
    assert line.startswith("engine:   sglang") and "$WORKSHOP_SGLANG_BASE_URL" in line, line
    assert requests_served(sglang_server) - before >= 10


@pytest.mark.parametrize("name", SGLANG_BESIDE_NAMES)
def test_jupyter_notebook_runs_with_sglang_beside(name, vllm_server, sglang_server, hf_server,
                                                  monkeypatch):
    from workshop.session import env_names

    env = notebook_env(vllm_server, hf_server)
    url_var, key_var = env_names("sglang")
    env.update({url_var: sglang_server.base_url, key_var: sglang_server.api_key or ""})
    before = requests_served(sglang_server)
    run_jupyter(name, env, monkeypatch, tag=".beside-sglang")
    assert requests_served(sglang_server) - before >= 10     # SGLang took part


@pytest.mark.parametrize("name", SGLANG_MARIMO_NAMES)
def test_marimo_notebook_runs_on_sglang(name, sglang_server, hf_server):
    before = requests_served(sglang_server)
    run_marimo(name, sglang_env(sglang_server, hf_server), tag=".sglang")
    assert requests_served(sglang_server) - before >= 10


# -- against vLLM ----------------------------------------------------------------------------------

# What a run must have found, beyond "no cell failed": notebook -> text its output must show.
MUST_SHOW = {
    # a measured point above its roof means mis-counted FLOPs or a mis-measured roof
    "03_prefill_decode_roofline": "Every point is under its roof",
    # the prefill reading is shown (a conclusion inside an if/else is never displayed in Jupyter)
    "06_flash_attention": "so the measurement is",
    # the killed decode process was reported (not hung on, not finished by chance)
    "17_disaggregated_prefill_decode": "WorkerDied: the decode process",
}


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_jupyter_notebook_runs(name, vllm_server, hf_server, monkeypatch):
    run_jupyter(name, notebook_env(vllm_server, hf_server), monkeypatch)
    if name in MUST_SHOW:
        import nbformat
        nb = nbformat.read(OUT_DIR / f"{name}.executed.ipynb", as_version=4)
        shown = "".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("text", ""))
                        for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
        assert MUST_SHOW[name] in shown, f"{name}: '{MUST_SHOW[name]}' not in its output"


@pytest.mark.parametrize("name", MARIMO_NAMES)
def test_marimo_notebook_runs(name, vllm_server, hf_server):
    run_marimo(name, notebook_env(vllm_server, hf_server))
