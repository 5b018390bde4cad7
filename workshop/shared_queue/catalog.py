"""The small models the workers serve: named copies of the bundled model.

This machine has one small model, SmolLM2-135M. To have several, each name here is a folder
of links to the bundled model's files: loading ``smol-b`` really loads a second copy of the
weights into memory, and costs what loading any model of that size costs, but every copy
computes the same thing. For the queue and the packing policy only a model's name, size,
load time and speed matter, and those are real.

``layers`` below 30 makes each copy the bundled model cut to its first ``layers`` layers
(its ``config.json`` says so; the loader then reads only those): a smaller and faster model
of the same family whose output is no longer sensible text. The notebook uses it to fit its
quick mode in CI's time; the full run serves the whole model.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from reference_server import dtypes, kv
from reference_server.model_config import count_safetensors_params, read_arch
from reference_server.models import cache_dir, resolve_model

DTYPE = "float32"          # the teaching engine's fastest dtype on most CPUs
BLOCK_SIZE = 16


def model_names(n: int) -> list[str]:
    if not 1 <= n <= 26:
        raise ValueError("between 1 and 26 models")
    return [f"smol-{c}" for c in string.ascii_lowercase[:n]]


def bundled_layers() -> int:
    return read_arch(resolve_model("smollm2-135m").path).num_layers


def model_copies(n: int, layers: int | None = None) -> dict[str, str]:
    """``n`` model names -> folders holding links to the bundled model's files, each with
    its own ``config.json`` (``layers``: keep only the first that many layers)."""
    source = Path(resolve_model("smollm2-135m").path)
    config = json.loads((source / "config.json").read_text())
    full = config["num_hidden_layers"]
    layers = full if layers is None else layers
    if not 1 <= layers <= full:
        raise ValueError(f"layers must be between 1 and {full}")
    config["num_hidden_layers"] = layers
    out = {}
    for name in model_names(n):
        folder = cache_dir() / "shared-queue-models" / f"{layers}-layers" / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in source.iterdir():
            link = folder / f.name
            if f.name != "config.json" and not link.exists():
                link.symlink_to(f)
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        out[name] = str(folder)
    return out


def kv_pool_blocks(slots: int, max_tokens_per_request: int) -> int:
    """KV blocks for ``slots`` requests of up to ``max_tokens_per_request`` tokens each."""
    return slots * kv.blocks_for(max_tokens_per_request, BLOCK_SIZE)


def model_bytes(path: str, num_blocks: int) -> int:
    """Memory one loaded model takes in a worker, known before loading it: its weights in
    ``DTYPE`` (parameter count from the safetensors headers, less the layers a cut copy
    drops) plus its KV pool."""
    arch = read_arch(path)
    params = count_safetensors_params(path)
    full = read_arch(Path(path, "model.safetensors").resolve().parent).num_layers
    embed = arch.vocab_size * arch.hidden_size
    params = embed + (params - embed) * arch.num_layers / full   # the layers are all alike
    weights = params * dtypes.bytes_per_element(DTYPE)
    pool = kv.kv_bytes_per_token(arch, DTYPE) * num_blocks * BLOCK_SIZE
    return int(weights + pool)
