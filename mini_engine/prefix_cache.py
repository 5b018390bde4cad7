"""Prefix caching, two ways: hash-chained blocks (vLLM) and a radix tree (SGLang).

Both remember *full* blocks of KV after the sequence that computed them has moved on, so a
later prompt starting with the same tokens skips that part of prefill. Both share one small
contract, so ``block_manager.py`` does not care which one is plugged in:

* ``match(token_ids) -> block ids`` of the longest cached prefix (whole blocks only). The
  caller takes its own references.
* ``insert(token_ids, block_ids)``: ``len(token_ids) == len(block_ids) * block_size``; the
  cache takes one reference on each block it did not know yet.
* ``evict(n)``: drop least-recently-used blocks that nobody but the cache holds; frees at
  least ``n`` blocks if ``num_evictable() >= n``.
* ``reset()``: forget every block not in use.

``match`` and ``insert`` take an optional ``salt`` (the request's ``cache_salt``): only
requests with the same salt share blocks, so one tenant's timing cannot tell whether another
recently sent a prompt. No salt is the shared, unsalted namespace.

The difference learners should see: vLLM names a block by a hash of (parent hash, its
tokens), so lookup is a dict walk and any block can be evicted on its own; SGLang keeps a
tree whose edges are token runs, splits edges on partial matches, and evicts leaves only.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Protocol

from mini_engine.block_manager import BlockAllocator


class PrefixCache(Protocol):
    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]: ...
    def insert(self, token_ids: list[int], block_ids: list[int],
               salt: str | None = None) -> None: ...
    def evict(self, num_blocks: int) -> int: ...
    def num_evictable(self) -> int: ...
    def num_cached_blocks(self) -> int: ...
    def reset(self) -> int: ...


_clock = itertools.count()   # a logical LRU clock: cheaper and more testable than time()


class HashPrefixCache:
    """vLLM's automatic prefix caching: ``hash(parent_hash, block tokens) -> block``."""

    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size
        self.table: dict[int, int] = {}                     # chain hash -> block
        self.meta: dict[int, tuple[int, int]] = {}          # block -> (chain hash, depth)
        self.last_used: dict[int, int] = {}                 # block -> clock

    def _hashes(self, token_ids: list[int], salt: str | None = None):
        h = salt    # vLLM mixes the salt into the first block's hash; the chain carries it on
        bs = self.block_size
        for i in range(len(token_ids) // bs):
            h = hash((h, tuple(token_ids[i * bs:(i + 1) * bs])))
            yield h

    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        out = []
        now = next(_clock)
        for h in self._hashes(token_ids, salt):
            b = self.table.get(h)
            if b is None:
                break
            self.last_used[b] = now
            out.append(b)
        return out

    def insert(self, token_ids: list[int], block_ids: list[int],
               salt: str | None = None) -> None:
        now = next(_clock)
        for depth, (h, b) in enumerate(zip(self._hashes(token_ids, salt), block_ids)):
            known = self.table.get(h)
            if known is not None:           # already cached (maybe a twin block): keep the old one
                self.last_used[known] = now
                continue
            if b in self.meta:              # this block is cached under another chain (impossible
                continue                    # for correct callers; be safe)
            self.table[h] = b
            self.meta[b] = (h, depth)
            self.last_used[b] = now
            self.allocator.incref(b)

    def _idle(self) -> list[int]:
        return [b for b in self.meta if self.allocator.ref_count[b] == 1]

    def num_evictable(self) -> int:
        return sum(1 for b in self.meta if self.allocator.ref_count[b] == 1)

    def num_cached_blocks(self) -> int:
        return len(self.meta)

    def _drop(self, b: int) -> None:
        h, _ = self.meta.pop(b)
        del self.table[h]
        del self.last_used[b]
        self.allocator.decref(b)

    def evict(self, num_blocks: int) -> int:
        # Oldest first; among equally old, the deepest block first (it is the least
        # likely to be shared), which is the order vLLM's free queue gives.
        victims = sorted(self._idle(), key=lambda b: (self.last_used[b], -self.meta[b][1]))
        for b in victims[:num_blocks]:
            self._drop(b)
        return min(num_blocks, len(victims))

    def reset(self) -> int:
        idle = self._idle()
        for b in idle:
            self._drop(b)
        return len(idle)


class _Node:
    __slots__ = ("key", "blocks", "children", "parent", "last_used")

    def __init__(self, key: tuple, blocks: list[int], parent: "_Node | None"):
        self.key = key                  # the token run on the edge into this node
        self.blocks = blocks            # one block per block_size tokens of key
        self.children: dict[tuple, _Node] = {}   # first block's tokens -> child
        self.parent = parent
        self.last_used = next(_clock)


class RadixPrefixCache:
    """SGLang's radix cache at block granularity: edges are runs of whole blocks. One tree
    per salt (SGLang keys the root's children by salt): trees of different salts share
    nothing."""

    def __init__(self, allocator: BlockAllocator, block_size: int):
        self.allocator = allocator
        self.block_size = block_size
        # salt -> its tree's root; None is the shared, unsalted tree, kept even when empty
        self.roots: dict[str | None, _Node] = {None: _Node((), [], None)}

    def _first(self, tokens) -> tuple:
        return tuple(tokens[:self.block_size])

    def _common_blocks(self, key: tuple, tokens: list[int], start: int) -> int:
        """How many whole blocks of ``key`` equal ``tokens[start:]``."""
        bs = self.block_size
        n = 0
        while (n + 1) * bs <= len(key) and start + (n + 1) * bs <= len(tokens):
            if key[n * bs:(n + 1) * bs] != tuple(tokens[start + n * bs:start + (n + 1) * bs]):
                break
            n += 1
        return n

    def _split(self, node: _Node, nblocks: int) -> _Node:
        """Cut ``node``'s edge after ``nblocks`` blocks; return the new upper node."""
        bs = self.block_size
        upper = _Node(node.key[:nblocks * bs], node.blocks[:nblocks], node.parent)
        upper.last_used = node.last_used
        node.parent.children[self._first(node.key)] = upper
        node.key, node.blocks = node.key[nblocks * bs:], node.blocks[nblocks:]
        node.parent = upper
        upper.children[self._first(node.key)] = node
        return upper

    def _walk(self, root: _Node, token_ids: list[int], split: bool):
        """Follow the tree from ``root`` along ``token_ids``; return (deepest node, blocks,
        tokens used)."""
        node, blocks, i = root, [], 0
        now = next(_clock)
        bs = self.block_size
        while i + bs <= len(token_ids):
            child = node.children.get(self._first(token_ids[i:]))
            if child is None:
                break
            n = self._common_blocks(child.key, token_ids, i)
            if n < len(child.blocks):
                if not split:
                    child.last_used = now
                    blocks += child.blocks[:n]
                    i += n * bs
                    break
                child = self._split(child, n)
            child.last_used = now
            blocks += child.blocks
            i += len(child.key)
            node = child
            if n < len(child.blocks):
                break
        return node, blocks, i

    def match(self, token_ids: list[int], salt: str | None = None) -> list[int]:
        root = self.roots.get(salt)
        if root is None:            # a salt with nothing cached yet
            return []
        # Split on a partial match (as SGLang does) so the unshared tail can be evicted alone.
        _, blocks, _ = self._walk(root, token_ids, split=True)
        return blocks

    def insert(self, token_ids: list[int], block_ids: list[int],
               salt: str | None = None) -> None:
        root = self.roots.setdefault(salt, _Node((), [], None))
        node, _, i = self._walk(root, token_ids, split=True)
        rest = len(token_ids) - i
        if rest <= 0:
            return
        first = i // self.block_size
        new = _Node(tuple(token_ids[i:]), list(block_ids[first:]), node)
        for b in new.blocks:
            self.allocator.incref(b)
        node.children[self._first(new.key)] = new

    def _nodes(self):
        stack = [n for root in self.roots.values() for n in root.children.values()]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _idle_leaf(self, n: _Node) -> bool:
        return not n.children and all(self.allocator.ref_count[b] == 1 for b in n.blocks)

    def num_evictable(self) -> int:
        # A node's blocks are evictable once nobody uses them and (eventually) its subtree is
        # gone; nodes in use always have in-use ancestors, so counting idle blocks suffices.
        return sum(1 for n in self._nodes() for b in n.blocks if self.allocator.ref_count[b] == 1)

    def num_cached_blocks(self) -> int:
        return sum(len(n.blocks) for n in self._nodes())

    def _remove_leaf(self, n: _Node) -> int:
        for b in n.blocks:
            self.allocator.decref(b)
        del n.parent.children[self._first(n.key)]
        return len(n.blocks)

    def evict(self, num_blocks: int) -> int:
        heap = [(n.last_used, id(n), n) for n in self._nodes() if self._idle_leaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_blocks and heap:
            _, _, n = heapq.heappop(heap)
            freed += self._remove_leaf(n)
            p = n.parent
            if p.parent is not None and self._idle_leaf(p):     # roots have no parent
                heapq.heappush(heap, (p.last_used, id(p), p))
        # a salt whose tree is empty again costs nothing to forget
        self.roots = {s: r for s, r in self.roots.items() if s is None or r.children}
        return freed

    def reset(self) -> int:
        return self.evict(1 << 62)

    # -- for tests and pictures ------------------------------------------------------------

    def check_invariants(self) -> None:
        bs = self.block_size
        seen: set[int] = set()
        for n in self._nodes():
            assert n.key and len(n.key) == len(n.blocks) * bs, "edge length != blocks"
            assert n.parent.children.get(self._first(n.key)) is n, "child keyed wrongly"
            for b in n.blocks:
                assert b not in seen, "block cached twice"
                assert self.allocator.ref_count[b] >= 1, "cached block has no reference"
                seen.add(b)
        for n in list(self._nodes()) + list(self.roots.values()):
            firsts = [self._first(c.key) for c in n.children.values()]
            assert len(firsts) == len(set(firsts))

    def dump(self, salt: str | None = None) -> dict:
        """The tree of ``salt`` (the unsalted one by default) as nested dicts, for drawing."""
        def rec(n: _Node) -> dict:
            return {"tokens": len(n.key), "blocks": list(n.blocks), "last_used": n.last_used,
                    "children": [rec(c) for c in n.children.values()]}
        return rec(self.roots.get(salt, _Node((), [], None)))


def make_prefix_cache(kind: str | None, allocator: BlockAllocator, block_size: int):
    if kind in (None, "none", "off"):
        return None
    if kind == "hash":
        return HashPrefixCache(allocator, block_size)
    if kind == "radix":
        return RadixPrefixCache(allocator, block_size)
    raise ValueError(f"unknown prefix cache {kind!r}: none | hash | radix")
