"""Make a copy of SGLang's CPU kernel source build for x86-64 CPUs without AVX-512.

Usage: python scripts/sglang_kernel_avx2.py SOURCE_COPY   (run by setup_sglang.sh)

Upstream compiles every file with -march=x86-64-v4 plus AMX flags, so the library it builds
dies with "Illegal instruction" on an AVX2-only CPU (seen on an AMD EPYC with AVX2 only).
The kernels themselves already carry portable paths: every AVX-512/AMX body sits behind
`CPU_CAPABILITY_AVX512`, which vec.h defines only when those flags are on, and the few files
written only in AVX-512 are the ones upstream already leaves out of its Arm64 build. This
script makes the x86 build take those same paths:

- x86-64-v3 (AVX2, FMA, F16C) instead of x86-64-v4 and AMX, with ATen's AVX2 vectors;
- the AVX-512-only sources and their operators left out, as upstream does on Arm64; the four
  operators Arm64 takes from its own sources (int8 GEMM and fused MoE) are registered with a
  body that raises, so a model that needs them fails with a message, not a missing symbol
  (a bf16 dense model such as the course's never calls them);
- the shared-memory all-reduce (used only with tensor parallelism over several processes)
  compiled for AVX-512 in its own functions, so nothing else in the library is.

Every edit checks that the text it replaces is there: a changed upstream fails here, loudly,
rather than building a library that would crash at run time.
"""

from __future__ import annotations

import pathlib
import sys

UNAVAILABLE = """\
// Written by the workshop's scripts/sglang_kernel_avx2.py: operators whose only x86 code is
// AVX-512, registered so that the library loads on AVX2 and says why if one is called.
#include <ATen/ATen.h>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#define SGL_AVX2_UNAVAILABLE(op) \\
  TORCH_CHECK(false, "sgl_kernel " op " needs the AVX-512 build of SGLang's CPU kernel; this one was built for AVX2")

std::tuple<at::Tensor, at::Tensor> per_token_quant_int8_cpu(at::Tensor&) {
  SGL_AVX2_UNAVAILABLE("per_token_quant_int8_cpu");
}

at::Tensor int8_scaled_mm_cpu(at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&,
                              at::ScalarType, bool) {
  SGL_AVX2_UNAVAILABLE("int8_scaled_mm_cpu");
}

at::Tensor int8_scaled_mm_with_quant(at::Tensor&, at::Tensor&, at::Tensor&, const std::optional<at::Tensor>&,
                                     at::ScalarType, bool) {
  SGL_AVX2_UNAVAILABLE("int8_scaled_mm_with_quant");
}

at::Tensor fused_experts_cpu(at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, bool, int64_t,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<std::vector<int64_t>>, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&, const std::optional<double>&,
                             const std::optional<double>&, bool, const std::optional<std::string>&) {
  SGL_AVX2_UNAVAILABLE("fused_experts_cpu");
}
"""  # noqa: E501 (C++ source written out as it stands)


def replace_once(path: pathlib.Path, old: str, new: str) -> None:
    text = path.read_text()
    if text.count(old) != 1:
        sys.exit(f"{path}: expected the text below exactly once, found it {text.count(old)} "
                 f"times; has the kernel source changed?\n{old}")
    path.write_text(text.replace(old, new))


def main(root: str) -> None:
    cpu = pathlib.Path(root) / "csrc" / "cpu"
    cmake = cpu / "CMakeLists.txt"
    replace_once(cmake, '''        -march=x86-64-v4
        -mavx512bf16
        -mavx512vnni
        -mamx-tile
        -mamx-bf16
        -mamx-int8
''', '''        -march=x86-64-v3
        -DCPU_CAPABILITY=AVX2
        -DCPU_CAPABILITY_AVX2
''')
    replace_once(cmake, 'if(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")\n    '
                        'add_compile_definitions',
                 'if(TRUE)  # AVX2 build: the AVX-512-only kernels are left out as on Arm64\n'
                 '    add_compile_definitions')
    replace_once(cpu / "shm.cpp", '#if defined(__x86_64__)\n#include "x86_64/shm.h"\n',
                 '#if defined(__x86_64__)\n#pragma GCC push_options\n'
                 '#pragma GCC target("avx512f,avx512bw,avx512vl")\n'
                 '#include "x86_64/shm.h"\n#pragma GCC pop_options\n')
    (cpu / "avx2_unavailable.cpp").write_text(UNAVAILABLE)
    print(f"==> {root}: patched to build for AVX2 (x86-64-v3)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
