"""Paged KV memory: fixed-size blocks, a block table per sequence, reference counts.

The KV cache is one big pool of ``num_blocks * block_size`` token slots per layer
(``kv_cache.py`` owns the tensors). This file only does the bookkeeping: which block
belongs to whom. Token ``i`` of a sequence lives in slot
``block_table[i // block_size] * block_size + i % block_size``.

Two allocation modes, so learners can see why paging won:

* ``paged``: a sequence gets a new block only when its tokens spill into it. Waste is at
  most ``block_size - 1`` slots per sequence.
* ``contiguous``: like pre-vLLM servers, a sequence reserves room for ``max_model_len``
  tokens when it is admitted. Same data path, but most of the reservation stays empty;
  ``fragmentation()`` shows how much.

Reference counts let blocks be shared: a prefix-cache hit makes two sequences point at the
same block. A block returns to the free list when its count reaches zero; the prefix cache
holds one reference of its own on every block it remembers.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_engine.prefix_cache import PrefixCache
    from mini_engine.sequence import Sequence


class BlockAllocator:
    """Hands out block ids; a block is free exactly when its reference count is 0.

    ``order`` says which free block goes out next. ``lowest``: the lowest-numbered one, so
    the blocks a prompt takes in one go come out consecutive wherever the pool has such a
    run, and reading a sequence's keys back (the K/V gather) streams through long stretches
    of memory. ``fifo``: the one freed longest ago (a queue; vLLM's free-block order, where
    its attention kernel reads blocks in place). After some traffic a queue hands out
    blocks from all over the pool, and a gather of 2 KB pieces scattered over a gigabyte
    is several times slower than one over consecutive blocks (docs/runs/mini_engine_speed.md). The
    default stays ``fifo``: served, the agentic workload did not measurably gain from
    ``lowest``, since decodes still interleave their new blocks.
    """

    def __init__(self, num_blocks: int, order: str = "fifo"):
        if order not in ("lowest", "fifo"):
            raise ValueError(f"unknown block order {order!r}: lowest | fifo")
        self.num_blocks, self.order = num_blocks, order
        self.ref_count = [0] * num_blocks
        # lowest: a heap (sorted, so already one); fifo: a queue
        self._free: list[int] | deque[int] = (list(range(num_blocks)) if order == "lowest"
                                              else deque(range(num_blocks)))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        # IndexError when empty: callers check num_free
        block = heapq.heappop(self._free) if self.order == "lowest" else self._free.popleft()
        assert self.ref_count[block] == 0
        self.ref_count[block] = 1
        return block

    def incref(self, block: int) -> None:
        assert self.ref_count[block] > 0, "incref of a free block"
        self.ref_count[block] += 1

    def decref(self, block: int) -> None:
        assert self.ref_count[block] > 0, "double free"
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            if self.order == "lowest":
                heapq.heappush(self._free, block)
            else:
                self._free.append(block)


class BlockManager:
    """Gives sequences the blocks they need, taking prefix-cache hits into account.

    Contract: ``allocate(seq, n)`` either gives ``seq`` enough blocks for its first ``n``
    tokens and returns True, or changes nothing and returns False. ``free(seq)`` drops all of
    ``seq``'s references. Blocks held only by the prefix cache are evicted on demand.
    """

    def __init__(self, num_blocks: int, block_size: int, mode: str = "paged",
                 max_model_len: int = 2048, prefix_cache: "PrefixCache | None" = None,
                 block_order: str = "fifo"):
        if mode not in ("paged", "contiguous"):
            raise ValueError(f"unknown allocation mode {mode!r}")
        if mode == "contiguous" and prefix_cache is not None:
            raise ValueError("contiguous reservation is the no-sharing baseline: "
                             "turn the prefix cache off with it")
        self.block_size = block_size
        self.mode = mode
        self.max_model_len = max_model_len
        self.allocator = BlockAllocator(num_blocks, block_order)
        self.prefix_cache = prefix_cache
        self.prefix_queries = 0      # prompt tokens looked up (vLLM counts tokens)
        self.prefix_hits = 0         # tokens found

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        if self.mode == "contiguous":
            num_tokens = max(num_tokens, self.max_model_len)
        return -(-num_tokens // self.block_size)

    # -- prefix cache --------------------------------------------------------------------

    def match_prefix(self, seq: "Sequence") -> int:
        """Point a fresh ``seq`` at cached blocks for the longest known prefix of its tokens.
        Returns the number of tokens whose KV is thereby already computed."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if self.prefix_cache is None:
            return 0
        blocks = self.prefix_cache.match(seq.token_ids, seq.cache_salt)
        # At least one token must be computed to get logits for the next one.
        while blocks and len(blocks) * self.block_size >= seq.num_tokens:
            blocks.pop()
        for b in blocks:
            self.allocator.incref(b)
        seq.block_table = blocks
        seq.num_computed_tokens = len(blocks) * self.block_size
        return seq.num_computed_tokens

    def count_prefix_query(self, seq: "Sequence", hit_tokens: int) -> None:
        if self.prefix_cache is not None:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += hit_tokens

    def cache_full_blocks(self, seq: "Sequence") -> None:
        """Offer the blocks whose every token is computed to the prefix cache, once each
        (``seq.num_blocks_offered`` remembers how many were; ``free`` resets it)."""
        n = seq.num_computed_tokens // self.block_size
        if self.prefix_cache is None or n <= seq.num_blocks_offered:
            return
        self.prefix_cache.insert(seq.token_ids[:n * self.block_size], seq.block_table[:n],
                                 seq.cache_salt)
        seq.num_blocks_offered = n

    # -- allocation ----------------------------------------------------------------------

    def can_allocate(self, seq: "Sequence", num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        avail = self.allocator.num_free
        if avail < need and self.prefix_cache is not None:
            avail += self.prefix_cache.num_evictable()
        return avail >= need

    def allocate(self, seq: "Sequence", num_tokens: int) -> bool:
        need = self.blocks_for(num_tokens) - len(seq.block_table)
        if need <= 0:
            return True
        short = need - self.allocator.num_free
        if short > 0 and self.prefix_cache is not None:
            if self.prefix_cache.num_evictable() < short:
                return False
            self.prefix_cache.evict(short)
        if self.allocator.num_free < need:
            return False
        seq.block_table.extend(self.allocator.allocate() for _ in range(need))
        return True

    def free(self, seq: "Sequence") -> None:
        # Tail first: under the fifo order a prompt's head, the part most likely shared, is
        # then reused last.
        for b in reversed(seq.block_table):
            self.allocator.decref(b)
        seq.block_table = []
        seq.num_blocks_offered = 0

    # -- introspection -------------------------------------------------------------------

    def num_used_blocks(self) -> int:
        """Blocks held by some sequence (cached-but-idle blocks count as free, like vLLM)."""
        idle = self.prefix_cache.num_evictable() if self.prefix_cache is not None else 0
        return self.num_blocks - self.allocator.num_free - idle

    def usage(self) -> float:
        return self.num_used_blocks() / self.num_blocks

    @staticmethod
    def fragmentation(seqs: list["Sequence"], block_size: int) -> float:
        """Share of the slots reserved by ``seqs`` that hold no token (internal waste)."""
        slots = sum(len(s.block_table) for s in seqs) * block_size
        used = sum(min(s.num_tokens, len(s.block_table) * block_size) for s in seqs)
        return 0.0 if slots == 0 else 1.0 - used / slots
