#!/usr/bin/env bash
# Set up (scripts/setup.sh, SGLang's environment included) and run the whole test suite: unit
# tests, the reference server on real engines over HTTP, the benchmark harness, and every
# notebook in both formats.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not engine"` (no engines).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKSHOP_DEVICE=${WORKSHOP_DEVICE:-cpu} bash scripts/setup.sh --with-sglang
# shellcheck disable=SC1091
. "${WORKSHOP_VENV:-.venv}/bin/activate"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WORKSHOP_QUICK=1
python scripts/sync_notebooks.py --check
exec python -m pytest -ra --durations=25 "$@"
