"""``benchmarks/greedy_agreement.py``: its departure rule, and one small run end to end (two
real engines on ShareGPT prompts from the local file)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "greedy_agreement.py"


def _module():
    spec = importlib.util.spec_from_file_location("greedy_agreement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_first_departure():
    first = _module().first_departure
    assert first([1, 2, 3], [1, 2, 3]) is None
    assert first([1, 2, 3], [1, 5, 3]) == 1
    assert first([7], [8]) == 0
    assert first([1, 2], [1, 2, 3]) == 2          # one stopped early: departs where it stopped


def test_a_small_run_reports_every_prompt(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--prompts", "3", "--new-tokens", "4", "--threads", "2",
         "--out", str(tmp_path / "agree.json"), "--", "--compute-dtype", "bf16"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "A (defaults): 3 prompts" in done.stdout and "float32" in done.stdout
    assert "B (--compute-dtype bf16): 3 prompts" in done.stdout and "bfloat16" in done.stdout
    assert "3 prompts x 4 new tokens:" in done.stdout
    assert (tmp_path / "agree.json").exists()
