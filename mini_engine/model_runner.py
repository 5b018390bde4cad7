"""``ModelRunner``: the model plus its KV pool; ``forward(chunks) -> logits``.

It loads the model (``loader.py``), allocates the KV pool the model's layout asks for
(``kv_cache.py``: ``num_blocks`` blocks of ``block_size`` slots, as many as
``kv_cache_gib`` holds unless ``num_blocks`` is given), and for each step turns the
scheduled chunks into a flat batch plus attention metadata (``attention_metadata.py``)
before calling the model (``model.py``).

It also owns the process's host-side settings: the torch thread count (``num_threads`` from
the start, torch's default when unset, and ``solo_threads`` for a step that decodes one
sequence alone, when the config sets it; the server does on CPU), and whether the C
allocator keeps freed memory for the next step (``keep_freed_memory``).

Contract: ``forward`` writes the K/V of every chunk's tokens into the slots their block
tables name and returns fp32 logits ``[rows, vocab]`` for the positions each chunk asked
for, in chunk order. Not thread-safe: one engine thread calls it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch

from mini_engine.attention_metadata import SMALL_QUERY, Chunk, prepare
from mini_engine.config import EngineConfig
from mini_engine.kv_cache import KVCache
from mini_engine.loader import ModelConfig, hf_state_dict, load_model

__all__ = ["Chunk", "ModelConfig", "ModelRunner", "keep_freed_memory"]   # Chunk: re-exported

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt parameters (malloc.h)


@functools.cache
def keep_freed_memory() -> bool:
    """Ask the C allocator to keep freed memory for reuse instead of handing it back to the
    kernel: glibc's ``mallopt`` with a trim threshold of 1 GiB and an mmap threshold of
    32 MiB, which also stops glibc from moving both thresholds as it goes. Process-wide, once
    per process; returns whether it could (False where the C library is not glibc: macOS,
    Windows, musl).

    Why: a step allocates and frees the same few-megabyte tensors layer after layer (each
    layer's gathered keys and values, scores, activations). With glibc's moving thresholds
    those can be unmapped at the end of one layer and mapped again, page by page, in the
    next, page by page, and a step then costs several times what it does without the faults
    (measured: docs/runs/mini_engine_speed.md, "What each change bought"). vLLM's CPU guide
    recommends preloading TCMalloc, an allocator that keeps freed memory, for its
    performance."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version          # only glibc has it (musl's mallopt is a stub)
    except (OSError, AttributeError, TypeError):
        return False
    return bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
                and libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20))


class ModelRunner:
    def __init__(self, model_path: str, config: EngineConfig):
        if config.keep_freed_memory:
            keep_freed_memory()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.threads = torch.get_num_threads()
        self.solo_threads = config.solo_threads or self.threads
        self.model = load_model(model_path, dtype=config.torch_dtype, device=config.device,
                                attention=config.attention, mla_rank=config.mla_rank,
                                quant=config.quant, prepack=config.prepack,
                                prepack_fp32=config.prepack_fp32,
                                decode_attention=config.decode_attention,
                                cascade_attention=config.cascade_attention)
        self.cfg: ModelConfig = self.model.cfg
        self.block_size = config.block_size
        layout = self.model.kv_layout()
        num_blocks = config.num_blocks
        if num_blocks is None:
            per_slot = KVCache.bytes_per_slot(layout, self.cfg.num_layers, self.model.dtype)
            pool_bytes = int(config.kv_cache_gib * (1 << 30))
            num_blocks = max(4, pool_bytes // (per_slot * self.block_size))
        self.num_blocks = num_blocks
        self.kv_cache = KVCache(layout, self.cfg.num_layers, num_blocks, self.block_size,
                                self.model.dtype, self.model.device, read=config.kv_read)

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], num_layers: int | None = None) -> torch.Tensor:
        """Run the new tokens of ``chunks`` through the first ``num_layers`` layers (all by
        default); see the contract above."""
        if self.solo_threads != self.threads:
            solo = len(chunks) == 1 and len(chunks[0].token_ids) <= SMALL_QUERY
            want = self.solo_threads if solo else self.threads
            if torch.get_num_threads() != want:
                torch.set_num_threads(want)
        input_ids, meta = prepare(chunks, self.block_size, self.model.device)
        return self.model.forward(input_ids, meta, self.kv_cache, num_layers)

    def kv_bytes_per_token(self) -> int:
        """Measured: bytes of the allocated pool / its token slots."""
        return self.kv_cache.bytes_per_token

    def weight_bytes(self) -> int:
        return self.model.weight_bytes()

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights this runner effectively computes with, under Hugging Face names (fp32):
        load them into a ``LlamaForCausalLM`` to get a reference for a quantized / MQA / MLA
        run."""
        return hf_state_dict(self.model)
