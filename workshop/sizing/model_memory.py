"""What a model occupies: its weights' bytes, and this process's resident memory.

``state_dict_bytes`` counts what the weights take as stored (packed integers and scales
included), ``param_bytes`` the tensors a module holds; ``rss_bytes`` is what the operating
system says the process holds, and ``release_memory`` gives freed memory back to it so that
RSS can show a model was really freed.
"""

from __future__ import annotations

import ctypes
import gc
import io
import sys

import torch
from torch import nn


def state_dict_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights as serialized by ``torch.save`` (tied tensors once).

    Works the same for plain, ``QuantLinear`` and PyTorch-quantized modules, whose packed
    weights are neither parameters nor buffers.
    """
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def param_bytes(model: nn.Module) -> int:
    """Bytes of parameters and buffers, each storage counted once."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def rss_bytes() -> int:
    import psutil
    return psutil.Process().memory_info().rss


def release_memory() -> None:
    """Collect garbage and ask glibc to hand freed heap pages back to the OS.

    Without ``malloc_trim`` freed tensors often stay in the process's heap, so RSS would not
    drop even though the memory is free for reuse.
    """
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass


__all__ = [
    "state_dict_bytes", "param_bytes", "rss_bytes", "release_memory",
]
