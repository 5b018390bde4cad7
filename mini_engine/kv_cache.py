"""The KV pool: the tensors that hold every sequence's keys and values, allocated up front.

Each layer stores, per token *slot*, what the model's ``KVLayout`` says (keys and values for
GQA/MQA, one latent vector for MLA). ``num_slots = num_blocks * block_size``; which slots
belong to which sequence is the business of ``block_manager.py``, where each token goes of
``attention_metadata.py``.

Contract: ``write`` and ``read`` move whole slots along the layout's slot axis.
``bytes_per_token`` is measured from the tensors actually allocated (pool bytes / slots),
and the pool is sized by allocating the same layout for one slot on the ``meta`` device:
no formula for "KV bytes per token" is written here, the layout is the only definition.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KVLayout:
    """What one layer caches: one tensor shape per entry, ``None`` marking the slot axis."""

    shapes: tuple[tuple[int | None, ...], ...]

    def allocate(self, num_slots: int, **kw) -> list[torch.Tensor]:
        return [torch.zeros(tuple(num_slots if d is None else d for d in s), **kw)
                for s in self.shapes]

    def slot_axis(self, entry: int) -> int:
        return self.shapes[entry].index(None)


class KVCache:
    """``num_layers`` x the layout's tensors, each with ``num_slots`` slots."""

    def __init__(self, layout: KVLayout, num_layers: int, num_slots: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu"):
        self.layout, self.num_slots = layout, num_slots
        self.layers = [layout.allocate(num_slots, dtype=dtype, device=device)
                       for _ in range(num_layers)]
        self._axes = [layout.slot_axis(i) for i in range(len(layout.shapes))]

    @staticmethod
    def bytes_per_slot(layout: KVLayout, num_layers: int, dtype: torch.dtype) -> int:
        """Bytes one slot takes over all layers: the layout allocated for one slot, on the
        ``meta`` device (no memory)."""
        return num_layers * sum(t.nbytes for t in layout.allocate(1, dtype=dtype, device="meta"))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for layer in self.layers for t in layer)

    @property
    def bytes_per_token(self) -> int:
        return self.nbytes // self.num_slots

    def write(self, layer: int, slots: torch.Tensor, *values: torch.Tensor) -> None:
        """Store ``values`` (one per layout entry, slot axis where the layout has it) into
        ``slots``."""
        for t, axis, v in zip(self.layers[layer], self._axes, values):
            t.index_copy_(axis, slots, v)

    def read(self, layer: int, slots: torch.Tensor) -> list[torch.Tensor]:
        """The entries at ``slots``, in that order along the slot axis. This gather is what a
        paged-attention kernel avoids by reading the blocks in place."""
        return [t.index_select(axis, slots) for t, axis in zip(self.layers[layer], self._axes)]
