#!/usr/bin/env bash
# SGLang in an environment of its own (run by `scripts/setup.sh --with-sglang`; the argument is
# cpu or cuda). SGLang and vLLM pin conflicting versions of torch, transformers and openai, so
# they never share an environment: the reference server starts SGLang from this one
# (`--engine sglang --engine-python .venv-sglang/bin/python`, the default when it exists).
#
# On a GPU this is `pip install sglang`. On a CPU it follows shared/SGLANG_CPU.md: CPU torch,
# SGLang's dependencies minus the CUDA-only ones, and SGLang's CPU kernel library built from
# source (it is on no package index). That build takes minutes, so the wheel is cached under
# ~/.cache/llm-workshop/wheels, keyed by a hash of the source, torch and Python; later
# setups install it in seconds. Idempotent: an unchanged setup only checks its stamp.
#
#   WORKSHOP_SGLANG_VENV=path  the environment (default: .venv-sglang)
#   SGLANG_KERNEL_SRC=folder   the kernel source (default: ../shared/third_party/sglang-kernel-cpu)
#   PYTHON=python3.11          the interpreter to build the environment from
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD

device=${1:?usage: setup_sglang.sh cpu|cuda}
venv=${WORKSHOP_SGLANG_VENV:-.venv-sglang}
# The versions the CPU recipe was verified with; SGLang pins torch==2.13.0 itself.
sglang_version=0.5.18
torch_cpu=2.13.0+cpu
torchvision_version=0.28.0
# SGLang's requirements that only a CUDA machine can use (or that pull CUDA torch builds).
cuda_only="torch torchvision torchaudio torchcodec timm flashinfer-python flashinfer-cubin
flashinfer-jit-cache flash-attn flash-attn-4 sglang-kernel sgl-deep-ep sgl-deep-gemm
nvidia-cutlass-dsl nvidia-mathdx cuda-python cuda-tile tilelang quack-kernels humming-kernels
tokenspeed-mla torch-memory-saver"

kernel_src=${SGLANG_KERNEL_SRC:-../shared/third_party/sglang-kernel-cpu}
kernel_hash=""
# Upstream builds the kernel for AVX-512 (and AMX): on an x86 CPU without AVX-512 it would die
# with "Illegal instruction", so there it is built from the same source for AVX2
# (scripts/sglang_kernel_avx2.py says how). The variant is part of the wheel's cache key.
kernel_isa=native
if [ "$device" = cpu ] && [ "$(uname -m)" = x86_64 ]; then
  if grep -qw avx512f /proc/cpuinfo; then kernel_isa=avx512; else kernel_isa=avx2; fi
fi
if [ "$device" = cpu ]; then
  if [ ! -f "$kernel_src/pyproject_cpu.toml" ]; then
    echo "SGLang's CPU kernel source is not at '$kernel_src' (set SGLANG_KERNEL_SRC to a copy of" >&2
    echo "SGLang's python/sglang/kernels/aot folder)" >&2
    exit 1
  fi
  kernel_hash=$( (cd "$kernel_src" && find . -type f ! -path './build/*' -print0 | LC_ALL=C sort -z \
                  | xargs -0 sha256sum; if [ "$kernel_isa" = avx2 ]; then cat "$here/scripts/sglang_kernel_avx2.py"; fi) \
                | sha256sum | cut -c1-16)
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating $venv (SGLang's own environment)"
  "${PYTHON:-python3}" -m venv "$venv"
fi
py=$venv/bin/python
stamp="$venv/.workshop-setup"
want="$device $sglang_version $kernel_hash $(sha256sum scripts/setup_sglang.sh | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "==> SGLang $sglang_version in $venv: up to date"
  exit 0
fi
"$py" -m pip install --quiet --upgrade pip

if [ "$device" = cuda ]; then
  echo "==> installing SGLang $sglang_version for CUDA into $venv"
  "$py" -m pip install --quiet "sglang==$sglang_version"
  echo "$want" > "$stamp"
  exit 0
fi

echo "==> installing SGLang $sglang_version for CPU into $venv (first time: a few minutes)"
# The kernel links libnuma. CI and these machines run as root; elsewhere say what is missing.
if ! [ -e /usr/include/numa.h ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # Wait for a lock another apt holds instead of failing (a fresh machine runs updates).
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq libnuma-dev >/dev/null
  else
    echo "SGLang's CPU kernel needs libnuma's headers: install libnuma-dev (Debian/Ubuntu) first" >&2
    exit 1
  fi
fi
constraints=$(mktemp)
requirements=$(mktemp)
downloads=$(mktemp -d)
trap 'rm -rf "$constraints" "$requirements" "$downloads"' EXIT
echo "torch==$torch_cpu" > "$constraints"
# torch's "+cpu" build lives on PyTorch's own index; try the configured indexes first.
pip_cpu() {
  "$py" -m pip install --quiet "$@" || "$py" -m pip install --quiet "$@" \
    --extra-index-url https://download.pytorch.org/whl/cpu
}
pip_cpu "torch==$torch_cpu" "scikit-build-core>=0.10" wheel packaging
# SGLang's own list of requirements, read from its wheel's metadata, minus the CUDA-only ones
# and the optional extras; markers are evaluated for this machine. The requirements go in
# first and SGLang itself without dependencies, so pip has no CUDA-only package to miss.
"$py" -m pip download --quiet --no-deps "sglang==$sglang_version" -d "$downloads"
"$py" - "$cuda_only" "$downloads"/sglang-*.whl > "$requirements" <<'EOF'
import sys, zipfile
from email.parser import Parser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
skip = {canonicalize_name(n) for n in sys.argv[1].split()}
with zipfile.ZipFile(sys.argv[2]) as whl:
    meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
    requires = Parser().parsestr(whl.read(meta).decode()).get_all("Requires-Dist") or []
for line in requires:
    req = Requirement(line)
    if canonicalize_name(req.name) in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(line.split(";")[0])
EOF
pip_cpu -r "$requirements" -c "$constraints"
"$py" -m pip install --quiet --no-deps "$downloads"/sglang-*.whl "torchvision==$torchvision_version"

# PyPI's torchvision has no CPU ops for this torch; registering fakes for `torchvision::nms`
# then fails and `import sglang` with it. Register them only when the ops exist (idempotent:
# the original decorator text is gone after the first run).
"$py" - <<'EOF'
import importlib.util, pathlib
path = pathlib.Path(importlib.util.find_spec("torchvision").submodule_search_locations[0]) / "_meta_registrations.py"
text = path.read_text()
old = '@torch.library.register_fake("torchvision::'
new = ('@(torch.library.register_fake if torchvision.extension._has_ops() '
       'else (lambda name: (lambda fn: fn)))("torchvision::')
if old in text:
    path.write_text(text.replace(old, new))
    print(f"==> patched {path}: skip torchvision::nms/qnms fakes without its CPU ops")
EOF

# The CPU kernel library: built once per source, torch and Python, then taken from the cache.
pyver=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache=${WORKSHOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-workshop}/wheels/sglang-kernel-cpu-$kernel_isa-$kernel_hash-torch${torch_cpu%+cpu}-$pyver
if ! ls "$cache"/*.whl >/dev/null 2>&1; then
  echo "==> building SGLang's CPU kernel from $kernel_src (once: about 5 minutes on 2 cores)"
  command -v cmake >/dev/null || "$py" -m pip install --quiet cmake ninja
  build=$(mktemp -d)
  cp -r "$kernel_src/." "$build/src"
  cp "$build/src/pyproject_cpu.toml" "$build/src/pyproject.toml"
  if [ "$kernel_isa" = avx2 ]; then "$py" scripts/sglang_kernel_avx2.py "$build/src"; fi
  # Its pyproject pins the torch it was released with; --no-build-isolation builds against
  # the environment's torch, the one the kernel will run with.
  "$py" -m pip wheel --quiet --no-build-isolation --no-deps "$build/src" -w "$build/wheels"
  mkdir -p "$cache"
  cp "$build"/wheels/*.whl "$cache/"
  rm -rf "$build"
fi
"$py" -m pip install --quiet --no-deps --force-reinstall "$cache"/*.whl

"$py" -c "import sglang, sgl_kernel; print('==> SGLang', sglang.__version__, 'with its CPU kernel: ok')"
echo "$want" > "$stamp"
