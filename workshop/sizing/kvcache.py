"""KV-cache arithmetic: bytes per token for real models, and the check against an engine.

Everything here is plain arithmetic on numbers read from a model's ``config.json`` (shipped in
``workshop/data/models``, each with its source URL, or the served model's own folder). The
formulas themselves have one home, ``reference_server/kv.py``; this module adds the course's
model catalogue, the common mistake to compare with, and ``engine_check``, which notebooks 1
and 2 use to test the formula against the live engine's own block count. What fits on a GPU
and what it costs is ``capacity``.

Two things the usual online calculators get wrong, and this module does not:

* the cache stores keys and values only for the *KV heads* (grouped-query attention shares
  each KV head between several query heads), not for every attention head;
* the precision of the cache is a separate choice from the precision of the weights
  (int4 weights with a bf16 cache is the common case).
"""

from __future__ import annotations

import json
from pathlib import Path

from reference_server import dtypes, prometheus
from reference_server.kv import (  # noqa: F401
    engine_capacity_tokens,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_values_per_token_per_layer,
)
from reference_server.model_config import ModelArch, count_safetensors_params, read_arch
from workshop import DATA_DIR

# The precisions the calculator offers, by their short names (bytes from reference_server.dtypes).
WEIGHT_BYTES: dict[str, float] = {
    n: dtypes.lookup(n).bytes for n in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4")}
KV_BYTES: dict[str, float] = {n: dtypes.lookup(n).bytes
                              for n in ("fp32", "bf16", "fp16", "fp8", "int8")}

GIB = 2**30


def list_models() -> list[str]:
    return sorted(p.stem for p in (DATA_DIR / "models").glob("*.json"))


def load_model(key: str) -> ModelArch:
    """A shipped config by file name, e.g. ``load_model("llama-3.1-8b")``."""
    path = DATA_DIR / "models" / f"{key}.json"
    if not path.exists():
        raise KeyError(f"no shipped config {key!r}; have {list_models()}")
    return read_arch(json.loads(path.read_text()))


def served_model_config(model_path: str, name: str | None = None) -> ModelArch:
    """The config of the model a server loaded: its own ``config.json`` and weights when the
    folder is on this machine, else the shipped config of the bundled model if that is it."""
    folder = Path(model_path)
    if (folder / "config.json").exists():
        return read_arch(folder, name=name or folder.name,
                         params=count_safetensors_params(folder))
    if "smollm2-135m" in model_path.lower():
        return load_model("smollm2-135m")
    raise ValueError(f"{model_path} is not a local folder and has no shipped config: copy its "
                     "config.json into workshop/data/models/ with a params field")


def naive_kv_bytes_per_token(cfg: ModelArch, weight_dtype: str = "bf16") -> float:
    """The common mistake: one K and V per *attention* head, at the *weight* precision."""
    return 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * WEIGHT_BYTES[weight_dtype]


def engine_cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge from a ``/metrics`` page.

    vLLM publishes its own view there: ``num_gpu_blocks``, ``block_size``, ``cache_dtype``,
    and (recent versions) ``kv_cache_memory_bytes``. Empty dict if the gauge is absent.
    """
    return prometheus.labels_of(metrics_text, prometheus.CACHE_CONFIG_INFO)


def engine_check(cfg: ModelArch, cache_config: dict[str, str], server_info: dict) -> dict:
    """Compare our bytes/token with the engine's own block count for its KV memory.

    The engine (vLLM) sizes its cache in bytes and divides by its own per-block size; if our
    formula is right, ``floor(memory / (block_size x our bytes/token))`` is its block count.
    """
    block = int(cache_config.get("block_size") or server_info.get("block_size") or 16)
    dtype = cache_config.get("cache_dtype", "auto")
    kv_dtype = dtypes.canonical(dtype, server_info.get("dtype"), cfg.torch_dtype)
    ours = int(kv_bytes_per_token(cfg, kv_dtype))
    blocks = cache_config.get("num_gpu_blocks")
    memory = cache_config.get("kv_cache_memory_bytes")
    out = {"block_size": block, "cache_dtype": dtype, "our_bytes_per_token": ours,
           "engine_blocks": int(blocks) if blocks and blocks != "None" else None,
           "engine_capacity_tokens": server_info.get("kv_capacity_tokens"),
           "kv_memory_bytes": int(memory) if memory and memory != "None" else None}
    if out["kv_memory_bytes"] is not None:
        out["predicted_blocks"] = out["kv_memory_bytes"] // int(ours * block)
        out["predicted_capacity_tokens"] = engine_capacity_tokens(out["kv_memory_bytes"], ours,
                                                                  block)
        out["agrees"] = out["predicted_blocks"] == out["engine_blocks"]
    elif out["engine_blocks"] is not None:
        # No byte budget published (e.g. GPU sized by memory fraction): report what the
        # engine's block count means in bytes under our formula instead.
        out["implied_kv_memory_bytes"] = out["engine_blocks"] * block * ours
    return out


def weight_bytes(cfg: ModelArch, weight_dtype: str = "bf16") -> float:
    return cfg.params * WEIGHT_BYTES[weight_dtype]


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


__all__ = [
    "engine_capacity_tokens", "kv_bytes_per_sequence", "kv_bytes_per_token",
    "kv_values_per_token_per_layer", "ModelArch", "read_arch", "WEIGHT_BYTES", "KV_BYTES",
    "list_models", "load_model", "served_model_config", "naive_kv_bytes_per_token",
    "engine_cache_config", "engine_check", "weight_bytes", "human_bytes",
]
