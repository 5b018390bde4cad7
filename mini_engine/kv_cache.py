"""The KV pool: the tensors that hold every sequence's keys and values, allocated up front.

Each layer stores, per token *slot*, what the model's ``KVLayout`` says (keys and values for
GQA/MQA, one latent vector for MLA). ``num_slots = num_blocks * block_size``; which slots
belong to which sequence is the business of ``block_manager.py``, where each token goes of
``attention_metadata.py``.

Contract: ``write`` and ``read`` move whole slots along the layout's slot axis;
``read_blocks`` moves whole blocks (``block_size`` consecutive slots), which is how attention
reads a context: a block is one contiguous piece of memory per head, so a block table's
blocks come back as rows of one 2-D table, copied ``block_size`` times fewer and larger, and
already in the order attention wants (no reshaping copy after it). On CPU the gain is mostly
that PyTorch spreads such a first-axis gather over its threads, where the gather along the
slot axis runs on one (docs/runs/mini_engine_speed.md has the figures).
``bytes_per_token`` is measured from the tensors actually allocated (pool bytes / slots),
and the pool is sized by allocating the same layout for one slot on the ``meta`` device:
no formula for "KV bytes per token" is written here, the layout is the only definition.
"""

from __future__ import annotations

import math
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

    def __init__(self, layout: KVLayout, num_layers: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", read: str = "block"):
        if read not in ("block", "slot"):
            raise ValueError(f"unknown KV read {read!r}: block | slot")
        self.layout, self.num_blocks, self.block_size = layout, num_blocks, block_size
        self.by_slot = read == "slot"
        self._in_block = torch.arange(block_size, device=device)
        self.num_slots = num_slots = num_blocks * block_size
        self.layers = [layout.allocate(num_slots, dtype=dtype, device=device)
                       for _ in range(num_layers)]
        self._axes = [layout.slot_axis(i) for i in range(len(layout.shapes))]
        # Each entry also seen as a 2-D table of blocks: the axes before the slot axis (KV
        # heads) times the blocks, by one block's worth of everything after. Row
        # ``h * num_blocks + b`` is block ``b`` of head ``h``: one contiguous piece of memory.
        self._before = [math.prod(s[:a]) for s, a in zip(layout.shapes, self._axes)]
        self._offsets = {n: torch.arange(n, device=device)[:, None] * num_blocks
                         for n in set(self._before)}
        self._block_tables = [[t.view(n * num_blocks, -1) for t, n in zip(layer, self._before)]
                              for layer in self.layers]
        self._read_shapes = [tuple(-1 if d is None else d for d in s) for s in layout.shapes]

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

    def slots_of(self, blocks: torch.Tensor) -> torch.Tensor:
        """Every slot of ``blocks``, block after block (what ``read`` takes)."""
        return (blocks[:, None] * self.block_size + self._in_block).view(-1)

    def read_blocks(self, layer: int, blocks: torch.Tensor) -> list[torch.Tensor]:
        """The entries of ``blocks`` (a 1-D tensor of block ids), their slots in that order
        along the slot axis (``len(blocks) * block_size`` of them). Same values as ``read``
        of those blocks' slots; one copy per block and head instead of one per slot (unless
        the pool was made with ``read="slot"``, which reads exactly that way, for comparison)."""
        if self.by_slot:
            return self.read(layer, self.slots_of(blocks))
        rows = {n: (offsets + blocks).view(-1) for n, offsets in self._offsets.items()}
        return [table.index_select(0, rows[n]).view(shape) for table, n, shape
                in zip(self._block_tables[layer], self._before, self._read_shapes)]
