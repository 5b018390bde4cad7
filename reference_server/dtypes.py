"""Number formats by name: the one table of canonical names, aliases and bytes per element.

Engines, configs and people spell the same format several ways ("bf16", "bfloat16",
"torch.bfloat16"); everything in the project looks names up here. "auto" is not a format:
it means "what the model was saved in" (its config's ``torch_dtype``), and ``resolve`` is the
only place that turns it into one.

Block formats carry their scales in the per-element figure: int4 with one bf16 scale per
group of 128 weights costs 0.5 + 2/128 bytes; MXFP4 (OCP Microscaling, used for gpt-oss's
experts) stores one 8-bit scale per block of 32 values: 0.5 + 1/32.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class DType:
    name: str                      # canonical: what vLLM's --dtype / --kv-cache-dtype accept
    bytes: float                   # per stored element, scales of block formats included
    short: str                     # the compact label tables and plots use
    aliases: tuple[str, ...] = ()  # other spellings (torch's, vLLM's)


DTYPES: tuple[DType, ...] = (
    DType("float32", 4.0, "fp32", ("float", "torch.float32")),
    DType("bfloat16", 2.0, "bf16", ("torch.bfloat16",)),
    DType("float16", 2.0, "fp16", ("half", "torch.float16")),
    # vLLM's --kv-cache-dtype fp8 means e4m3 (its default fp8 flavour).
    DType("fp8_e4m3", 1.0, "fp8", ("float8_e4m3fn", "torch.float8_e4m3fn", "fp8_e4m3fn")),
    DType("fp8_e5m2", 1.0, "fp8_e5m2", ("float8_e5m2", "torch.float8_e5m2")),
    DType("int8", 1.0, "int8", ("torch.int8",)),
    DType("int4", 0.5 + 2 / 128, "int4"),
    DType("mxfp4", 0.5 + 1 / 32, "mxfp4"),
)

_BY_NAME: dict[str, DType] = {}
for _d in DTYPES:
    for _n in (_d.name, _d.short, *_d.aliases):
        _BY_NAME[_n] = _d


def lookup(name: str) -> DType:
    """The format called ``name`` (any alias, any case). "auto" is refused: use ``resolve``."""
    key = str(name).strip().lower()
    if key == AUTO:
        raise ValueError('"auto" is not a format: resolve it against the model with '
                         "dtypes.resolve(name, model_dtype)")
    try:
        return _BY_NAME[key]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(_BY_NAME)}") from None


def resolve(name: str | None, *fallbacks: str | None) -> DType:
    """``name``, where "auto" (or None) means the first of ``fallbacks`` that is a format.

    The one "auto" rule of the project: the model's dtype is its config's ``torch_dtype``,
    so callers pass that last, e.g. a KV cache's dtype is
    ``resolve(kv_cache_dtype, server_dtype, arch.torch_dtype)``: "auto" for the cache means
    the dtype the model is served in, and "auto" for that means the checkpoint's own.
    (Engines may still pick a 16-bit format for float32 checkpoints; the configs this
    course reads are all saved in 16 bits.)
    """
    for candidate in (name, *fallbacks):
        if candidate is not None and str(candidate).strip().lower() not in (AUTO, ""):
            return lookup(candidate)
    raise ValueError(f'dtype {name!r} means "the model\'s own", and no torch_dtype is known: '
                     "pass the dtype explicitly")


def canonical(name: str | None, *fallbacks: str | None) -> str:
    return resolve(name, *fallbacks).name


def bytes_per_element(name: str | None, *fallbacks: str | None) -> float:
    return resolve(name, *fallbacks).bytes


def cpu_has_bf16() -> bool:
    """Native bf16 dot products (AVX512_BF16 or AMX); elsewhere bf16 matmuls are emulated."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_compute_dtype(dtype: str, device: str, native_bf16: bool | None = None,
                      model_dtype: str | None = None) -> str:
    """The dtype to compute in when ``dtype`` is asked for on ``device``: float32 instead of
    bfloat16 on a CPU without native bf16 dot products, where bf16 matrix multiplies are
    emulated (several times slower in prefill, measured: docs/troubleshooting.md); anything
    else as asked. ``native_bf16`` defaults to this machine's;
    ``model_dtype`` is what "auto" means (the checkpoint's own)."""
    try:
        bf16 = canonical(dtype, model_dtype) == "bfloat16"
    except ValueError:    # "auto" and unknown names: the engine resolves them
        return dtype
    if device != "cpu" or not bf16:
        return dtype
    return dtype if (cpu_has_bf16() if native_bf16 is None else native_bf16) else "float32"


def cpu_has_amx() -> bool:
    """AMX tiles, as vLLM and SGLang ask before picking their AMX kernels (the teaching
    engine's probe, which picks its attention form by it too)."""
    try:
        from mini_engine.model import cpu_has_amx as probe
    except ImportError:     # no torch here: no AMX kernels either
        return False
    return probe()


__all__ = ["AUTO", "DType", "DTYPES", "lookup", "resolve", "canonical", "bytes_per_element",
           "cpu_has_bf16", "cpu_compute_dtype", "cpu_has_amx"]
