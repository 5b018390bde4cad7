"""``benchmarks/mini_vs_vllm_suite.sh`` runs for an hour, and only where a CPU with AVX512_BF16
turns up: a flag it passes that the harness or the teaching engine no longer takes must fail
here, not there. Its dry run prints each harness command; each must parse."""

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mini_engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "mini_vs_vllm_suite.sh"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("mini_vs_vllm",
                                                  ROOT / "benchmarks" / "mini_vs_vllm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SUITE), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "DRY": "1", "FORCE": "1",
                               "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                               **env})


def test_every_step_is_a_command_the_harness_and_engine_take(harness, tmp_path):
    done = dry_run(tmp_path)
    assert done.returncode == 0, done.stderr
    commands = [shlex.split(line) for line in done.stdout.splitlines()]
    assert len(commands) == 7                       # one per step
    for cmd in commands:
        assert cmd[:2] == ["python", "benchmarks/mini_vs_vllm.py"]
        args, extra = harness.parse_args(cmd[2:])
        assert Path(args.log_dir).parent == tmp_path / "out" / "logs"   # kept with the results
        for label in args.engines:
            _, engine, flags = harness.split_label(label)
            assert engine in ("mini", "vllm"), label
            if engine == "mini":                    # as the harness starts it
                EngineConfig.from_cli(flags + extra + ["--enable-logging-iteration-details"])
    assert not (tmp_path / "out").exists()          # a dry run writes nothing


def test_steps_chosen_by_name_and_unknown_names_refused(tmp_path):
    done = dry_run(tmp_path, STEPS="onednn streams")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "ONEDNN_VERBOSE" in lines[0] and "streams.json" in lines[1]
    refused = dry_run(tmp_path, STEPS="agentic bogus")
    assert refused.returncode == 2 and "unknown step bogus" in refused.stderr
    assert refused.stdout == ""                     # nothing ran before the check
