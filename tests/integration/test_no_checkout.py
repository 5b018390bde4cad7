"""Notebook 0 as Colab or molab runs it: no checkout, the course installed by its first cell.

The test builds the project's wheel from this checkout's files (what ``pip install
git+https://github.com/...`` builds on Colab), makes a fresh virtual environment in a temp
dir with notebook 0's ``.ipynb`` alone in an empty folder, installs there only what a hosted
runtime already has and the course does not install, then executes the notebook end to end
in a kernel of that environment, with ``WORKSHOP_INSTALL_SOURCE`` naming the wheel. The
first cell therefore takes its no-checkout branch: it pip-installs the wheel, then
``workshop.session.install_runtime()`` installs the course's dependencies from the wheel's
own metadata (pyproject.toml). The server is the test fleet's vLLM, named by
``WORKSHOP_BASE_URL`` / ``WORKSHOP_API_KEY``, so ``install_runtime`` skips the engine and the
rest of the notebook runs against that server from the installed package.

What a hosted runtime is assumed to have (``HOSTED``): ``ipykernel`` and ``nbclient`` run the
notebook (Colab's kernel is IPython); ``httpx`` and ``matplotlib`` are preinstalled on Colab
and listed in the marimo files' script header (molab installs those), and the course relies
on them: ``import workshop.session`` needs httpx before ``install_runtime`` runs, and the
plots need matplotlib, which is not one of the course's base dependencies. Colab has torch
preinstalled too: the new environment sees this one's CPU torch (and what torch needs)
through a ``.pth`` file, as Colab's Python sees its system packages, so the first cell finds
the torch it pins already there instead of unpacking it (about 40 s on 2 cores).

Not covered: installing vLLM itself (its CPU build is 3.4 GB; the CUDA build needs a GPU),
a GPU runtime (CUDA torch, the Hugging Face model a GPU runtime serves), the real git clone
of the repository (the wheel is built from this checkout, as pip would build the clone),
molab's uv installer, installing torch or replacing a preinstalled build of it (Colab's
CUDA one) with CPU torch, and the other notebooks. Cost beyond the fleet's vLLM, which other
tests start anyway: about two minutes on 2 cores, half of it the first cell's installs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from workshop.session import TORCH_CPU_INDEX

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "00_setup_first_request.ipynb"
HOSTED = ["ipykernel", "nbclient", "httpx", "matplotlib"]
TIMEOUT_S = int(os.environ.get("WORKSHOP_NOTEBOOK_TIMEOUT", "900"))
OUT_DIR = Path(os.environ.get("WORKSHOP_TEST_LOGS", "/tmp/workshop-test-logs")) / "notebooks"

# the installs (minutes) come on top of the notebook's own limit
pytestmark = [pytest.mark.engine, pytest.mark.timeout(2 * TIMEOUT_S + 300)]

# Run by the new environment's Python: execute the notebook, then one cell of the test's own
# that reports where the kernel found the course.
_RUN = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
src, out, folder, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
nb = nbformat.read(src, as_version=4)
nb.cells.append(nbformat.v4.new_code_cell(
    "import importlib.metadata as _md, importlib.util as _u, json as _j, sys as _s, workshop.session as _w\n"
    "print('PROBE ' + _j.dumps({'prefix': _s.prefix, 'workshop': _w.__file__,\n"
    "    'in_checkout': _w.in_checkout(), 'vllm': _u.find_spec('vllm') is not None,\n"
    "    'direct_url': _j.loads(_md.distribution('llm-inference-workshop').read_text('direct_url.json') or '{}')}))"))
client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                        resources={"metadata": {"path": folder}})
try:
    client.execute()
finally:
    nbformat.write(nb, out)
"""  # noqa: E501 (a script run in the notebook kernel, kept as it stands)


def _wheel(tmp: Path) -> Path:
    """The project's wheel, from the files git would clone (plus new, unignored ones)."""
    src = tmp / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True)
    for rel in listed.stdout.splitlines():
        if (ROOT / rel).is_file() and not rel.startswith(("notebooks/", "tests/", "slides/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    # the checkout's own setuptools (a dev dependency): no build environment to download
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "wheels"), str(src)],
                   check=True, cwd=tmp)
    (wheel,) = (tmp / "wheels").glob("*.whl")
    return wheel


def _preinstalled(folder: Path, top: str = "torch") -> Path:
    """Links to this environment's ``top`` and what it needs, in ``folder``: a package a
    hosted runtime has preinstalled (Colab's torch, in its system site-packages), there
    without the minute that unpacking CPU torch into the new environment would take."""
    import re
    from importlib.metadata import distribution

    folder.mkdir()
    seen, todo = set(), [top]
    while todo:
        dist = distribution(todo.pop())
        name = re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
        if name in seen or name in ("pip", "setuptools"):     # the new environment's own
            continue
        seen.add(name)
        todo += [re.match(r"[\w.-]+", r).group(0) for r in dist.requires or []
                 if "extra ==" not in r]
        for entry in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if not entry.endswith(".pth"):
                (folder / entry).symlink_to(Path(dist.locate_file(entry)).resolve())
    return folder


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _hosted_env(venv: Path, wheel: Path, server) -> dict[str, str]:
    """This process's environment without the checkout or its virtual environment, plus the
    variables a reader would set on Colab to use a server of their own."""
    ours = Path(sys.prefix).resolve()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "WORKSHOP_ENGINE")
           and not (k.startswith("WORKSHOP_") and k.endswith(("_BASE_URL", "_API_KEY")))}
    path = [p for p in env.get("PATH", "").split(os.pathsep)
            if p and not Path(p).resolve().is_relative_to(ours)]
    env.update({
        "PATH": os.pathsep.join([str(venv / "bin"), *path]),
        "VIRTUAL_ENV": str(venv),
        "PYTHONNOUSERSITE": "1",
        "WORKSHOP_INSTALL_SOURCE": str(wheel),
        "WORKSHOP_BASE_URL": server.base_url,
        "WORKSHOP_API_KEY": server.api_key or "",
        "WORKSHOP_QUICK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "MPLBACKEND": "Agg",
        # no .pyc for every file of torch at install (a minute on 2 cores): the same packages,
        # compiled on import instead
        "PIP_NO_COMPILE": "1",
        # a bootstrap that ignored WORKSHOP_INSTALL_SOURCE fails on GitHub, never prompts
        "GIT_TERMINAL_PROMPT": "0",
    })
    if not _resolves(TORCH_CPU_INDEX.split("/")[2]):
        # a sandbox without PyTorch's index: fail each lookup there at once, not after retries
        env["PIP_RETRIES"] = "0"
    return env


def _assert_ran_without_checkout(executed: Path, venv: Path, wheel: Path) -> None:
    """Every cell of the executed notebook ran, its first cell installed the course from
    ``wheel`` without vLLM, and the kernel imported it from ``venv``."""
    import nbformat

    from workshop.sanity import MARK

    nb = nbformat.read(executed, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "no plot was drawn"
    shown = "".join(str(o.get("data", {}).get("text/markdown", "")) + str(o.get("text", ""))
                    for o in outputs)
    assert MARK not in shown, "a sanity gate failed"
    # The first cell installed the course without vLLM and connected to the named server.
    first = "".join(o.get("text", "") for o in code[0].get("outputs", []))
    assert "$WORKSHOP_BASE_URL names the server: installing the course without vLLM" in first, first
    assert "engine:   vllm" in first and "($WORKSHOP_BASE_URL)" in first, first[-2000:]
    # the last cell is the test's probe (_RUN)
    probe = "".join(o.get("text", "") for o in code[-1].get("outputs", []))
    probe = json.loads(probe.split("PROBE ", 1)[1])
    # The kernel was the new environment's, importing the course installed from the wheel.
    assert Path(probe["prefix"]).resolve() == venv.resolve(), probe
    assert Path(probe["workshop"]).resolve().is_relative_to(venv.resolve()), probe
    assert not probe["in_checkout"] and not probe["vllm"], probe
    assert probe["direct_url"].get("url") == wheel.as_uri(), probe


def test_notebook_0_runs_from_its_first_cell_without_a_checkout(tmp_path, vllm_server):
    assert NOTEBOOK.exists(), "generate it: python scripts/sync_notebooks.py"
    wheel = _wheel(tmp_path)
    venv, folder = tmp_path / "venv", tmp_path / "colab"
    folder.mkdir()
    shutil.copy2(NOTEBOOK, folder / NOTEBOOK.name)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "hosted.pth").write_text(f"{_preinstalled(tmp_path / 'hosted')}\n")
    env = _hosted_env(venv, wheel, vllm_server)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *HOSTED], check=True,
                   cwd=folder, env=env, timeout=TIMEOUT_S)
    assert subprocess.run([str(python), "-c", "import workshop"], cwd=folder, env=env,
                          capture_output=True).returncode != 0, "the course is importable already"
    before = vllm_server.metric("reference_server_requests_total")

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    executed = OUT_DIR / "00_setup_first_request.no_checkout.executed.ipynb"
    r = subprocess.run([str(python), "-c", _RUN, str(folder / NOTEBOOK.name), str(executed),
                        str(folder), str(TIMEOUT_S)],
                       cwd=folder, env=env, capture_output=True, text=True,
                       timeout=2 * TIMEOUT_S + 120)
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-5000:]}\n(see {executed})"

    _assert_ran_without_checkout(executed, venv, wheel)
    assert vllm_server.metric("reference_server_requests_total") - before >= 10
