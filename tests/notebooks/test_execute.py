"""Execute every notebook end to end, in both formats, in quick mode, against real servers.

* Jupyter: the generated ``.ipynb`` runs in a fresh kernel through nbclient (working
  directory ``notebooks/``, as when a learner opens it there).
* marimo: ``marimo export html`` runs the generated ``.py`` in a marimo kernel, so marimo's
  UI elements and progress bars are exercised; it exits non-zero when any cell fails.

Both get ``WORKSHOP_QUICK=1`` and the URLs / API keys of the session's vLLM and hf servers, so
``workshop.session.connect()`` never starts a server of its own here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
NAMES = sorted(p.stem for p in (NOTEBOOKS / "src").glob("[0-9]*.py"))
# Whole-notebook limit; quick mode takes 15-90 s each on an idle 2-core machine, several times
# that on a machine shared with other jobs.
TIMEOUT_S = int(os.environ.get("WORKSHOP_NOTEBOOK_TIMEOUT", "900"))
OUT_DIR = Path(os.environ.get("WORKSHOP_TEST_LOGS", "/tmp/workshop-test-logs")) / "notebooks"

# pytest-timeout's default (pyproject) would cut a slow notebook before its own limit does.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(TIMEOUT_S + 120)]


def notebook_env(vllm_server, hf_server) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "WORKSHOP_QUICK": "1",
        "WORKSHOP_BASE_URL": vllm_server.base_url,
        "WORKSHOP_API_KEY": vllm_server.api_key or "",
        "WORKSHOP_HF_BASE_URL": hf_server.base_url,
        "WORKSHOP_HF_API_KEY": hf_server.api_key or "",
        "HF_HUB_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        # the checkout, importable whether or not the package is pip-installed
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    })
    return env


@pytest.mark.parametrize("name", NAMES)
def test_jupyter_notebook_runs(name, vllm_server, hf_server, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    for key, value in notebook_env(vllm_server, hf_server).items():
        monkeypatch.setenv(key, value)   # the kernel inherits this process's environment
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    start = time.monotonic()
    try:
        client.execute()
    finally:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, OUT_DIR / f"{name}.executed.ipynb")   # for reading after a failure
    elapsed = time.monotonic() - start
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
    print(f"{name}.ipynb executed in {elapsed:.0f} s")


@pytest.mark.parametrize("name", NAMES)
def test_marimo_notebook_runs(name, vllm_server, hf_server):
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    html = OUT_DIR / f"{name}.html"
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "marimo", "export", "html", "--no-sandbox", "-f",
                        str(NOTEBOOKS / f"{name}.py"), "-o", str(html)],
                       cwd=ROOT, env=notebook_env(vllm_server, hf_server), capture_output=True,
                       text=True, timeout=TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert r.returncode == 0, f"marimo export failed ({elapsed:.0f} s):\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    assert html.exists() and html.stat().st_size > 10_000
    print(f"{name}.py executed in {elapsed:.0f} s")
