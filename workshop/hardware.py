"""What this machine is: GPUs (nvidia-smi), CPU model and features, usable cores, RAM.

The notebooks print it beside every measurement; the benchmark harness records it with its
results. Reads the system only, imports nothing from the course.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path


def gpus(fields: str = "name,memory.total") -> list[str]:
    """One line of nvidia-smi ``--query-gpu`` fields per NVIDIA GPU; empty without one."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_name() -> str | None:
    """Name and memory of the first NVIDIA GPU; None without one."""
    return next(iter(gpus()), None)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The CPU features that decide each engine's CPU kernels and dtype (AMX tiles, native bf16 dot
# products, 512-bit vectors), strongest first.
CPU_FEATURES = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_features() -> list[str]:
    """Which of ``CPU_FEATURES`` this CPU has."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    return [f for f in CPU_FEATURES if f in flags]


def cpu_kind(features: list[str] | None = None) -> str | None:
    """The CPU's kind in a few words, from its strongest feature: "AMX", "AVX-512, native
    bf16", "AVX-512", "AVX2" (None: none of them, or not an x86 CPU)."""
    f = cpu_features() if features is None else features
    for flag, kind in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512, native bf16"),
                       ("avx512f", "AVX-512"), ("avx2", "AVX2")):
        if flag in f:
            return kind
    return None


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def cores() -> int:
    """CPU cores this process may use (its affinity, not the machine's count)."""
    return (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1))


def hardware() -> str:
    """One line about this machine: GPU if any, CPU model and kind, usable cores, RAM."""
    cores_ = cores()
    mem = memory_gib()
    kind = cpu_kind()
    cpu = (f"{cpu_name()}" + (f" ({kind})" if kind else "") + f", {cores_} cores"
           + (f", {mem:.0f} GiB RAM" if mem else ""))
    gpu = gpu_name()
    return f"GPU {gpu}; CPU {cpu}" if gpu else f"CPU {cpu} (no GPU)"
