"""A model's architecture, read once from its Hugging Face ``config.json``.

Every part of the project that needs a model's shape (the KV formula, the capacity
calculator, the roofline, the server's ``/server_info``) reads it through ``read_arch``, so
the quirks of the config format are handled in one place:

* ``num_key_value_heads`` is absent on plain multi-head models (then it equals the head count);
* ``head_dim`` is absent on most older models (then it is ``hidden_size / heads``);
* multi-head latent attention (DeepSeek-V2/V3) caches a compressed latent
  (``kv_lora_rank``) plus one shared RoPE key (``qk_rope_head_dim``), not per-head K and V;
* sliding windows come as ``layer_types`` (gpt-oss, Gemma), or as one ``sliding_window`` for
  every layer (Mistral v0.1), or are switched off by ``use_sliding_window: false`` (Qwen2);
* multimodal configs nest the language model under ``text_config``;
* newer ``transformers`` write ``dtype`` where older ones wrote ``torch_dtype``.

The course's shipped configs (``workshop/data/models``) add ``name``, ``source`` and the
published ``params`` / ``active_params``; a plain config leaves those to the caller.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelArch:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int = 0
    intermediate_size: int = 0
    attention: str = "gqa"           # "gqa" (covers MHA and MQA) or "mla"
    kv_lora_rank: int = 0            # MLA only: size of the compressed latent
    qk_rope_head_dim: int = 0        # MLA only: the shared RoPE key stored next to it
    sliding_window: int = 0          # 0 = every layer sees the whole context
    num_sliding_layers: int = 0      # how many layers use the window
    max_context: int = 0             # max_position_embeddings (0 = unknown)
    num_experts: int = 0             # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    params: int = 0                  # all weights (what must sit in memory); 0 = unknown
    active_params: int = 0           # weights used per token (< params for mixture-of-experts)
    torch_dtype: str | None = None   # what the checkpoint was saved in: what "auto" means
    source: str = ""                 # where the config came from (URL or path)


def read_arch(config: dict | str | Path, name: str | None = None,
              params: int | None = None) -> ModelArch:
    """``config``: a config dict, a ``config.json`` file, a model folder, or a hub id.

    A hub id is read from the local Hugging Face cache (the engine downloaded it when it
    loaded the model); nothing is fetched when ``HF_HUB_OFFLINE`` is set.
    ``params`` overrides the parameter count (e.g. from ``count_safetensors_params``).
    """
    source = default_name = ""
    if not isinstance(config, dict):
        source = str(config)
        where = Path(config).expanduser()
        default_name = ((where if where.is_dir() else where.parent).name if where.exists()
                        else source)
        config = _load(config)
    d: dict[str, Any] = dict(config)
    if "num_hidden_layers" not in d and isinstance(d.get("text_config"), dict):
        d = {**d, **d["text_config"]}
    heads = d["num_attention_heads"]
    layers = d["num_hidden_layers"]
    layer_types = d.get("layer_types") or []
    n_sliding = d.get("num_sliding_layers", sum(t == "sliding_attention" for t in layer_types))
    window = d.get("sliding_window") or 0
    if window and not n_sliding and not layer_types and d.get("use_sliding_window", True):
        n_sliding = layers          # e.g. Mistral v0.1: a window on every layer
    total = int(params if params else d.get("params", 0))
    return ModelArch(
        name=name or d.get("name") or default_name or d.get("_name_or_path") or "model",
        num_layers=layers,
        hidden_size=d.get("hidden_size", 0),
        num_heads=heads,
        num_kv_heads=d.get("num_key_value_heads") or heads,
        # MLA configs have no head_dim: their per-head value width is the comparable figure.
        head_dim=d.get("head_dim") or d.get("v_head_dim") or d["hidden_size"] // heads,
        vocab_size=d.get("vocab_size") or 0,
        intermediate_size=d.get("intermediate_size") or 0,
        attention=d.get("attention") or ("mla" if d.get("kv_lora_rank") else "gqa"),
        kv_lora_rank=d.get("kv_lora_rank") or 0,
        qk_rope_head_dim=d.get("qk_rope_head_dim") or 0,
        sliding_window=window if n_sliding else 0,
        num_sliding_layers=n_sliding if window else 0,
        max_context=d.get("max_position_embeddings") or 0,
        num_experts=d.get("n_routed_experts") or d.get("num_local_experts") or 0,
        experts_per_token=d.get("num_experts_per_tok") or 0,
        params=total,
        active_params=int(d.get("active_params") or total),
        torch_dtype=_dtype_name(d.get("torch_dtype") or d.get("dtype")),
        source=d.get("source") or source,
    )


def _dtype_name(value: Any) -> str | None:
    return str(value).replace("torch.", "") if value else None


def _load(where: str | Path) -> dict:
    path = Path(where).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    text = str(where)
    if text.count("/") == 1 and not text.startswith((".", "/", "~")):
        from huggingface_hub import hf_hub_download  # a hub id: the engine cached it
        return json.loads(Path(hf_hub_download(text, "config.json")).read_text())
    raise FileNotFoundError(f"no config.json at {where}")


def count_safetensors_params(folder: str | Path) -> int:
    """Parameters stored in a model folder's ``*.safetensors`` files (headers only, fast)."""
    import struct
    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, meta in header.items():
            if key != "__metadata__":
                total += math.prod(meta["shape"])
    return total


__all__ = ["ModelArch", "read_arch", "count_safetensors_params"]
