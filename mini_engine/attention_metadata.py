"""Where each new token's K/V go, and which cached keys each query may read.

A step's new tokens (one ``Chunk`` per scheduled sequence) are concatenated into one flat
batch of ``T`` tokens. ``prepare`` turns the chunks into the index tensors the model needs:

* ``positions`` and ``slot_mapping``: the position of each of the ``T`` tokens and the KV
  slot it writes, ``block_table[pos // block_size] * block_size + pos % block_size``;
* ``groups``: sequences whose attention runs in one padded SDPA call. All sequences with at
  most ``SMALL_QUERY`` new tokens (decodes, verifications) share one group; each longer
  prefill chunk gets its own. A group carries the blocks of its context keys (its block
  tables: the model reads the pool a whole block at a time, so a group's key axis is a whole
  number of blocks, the unused tail of each last block masked like any padding), the causal
  mask, and how many leading keys all its sequences share (the same blocks: a prefix-cache
  hit such as a common system prompt), so the model may read those once for the group;
* ``logit_rows``: the rows of the flat batch whose logits the engine wants.

Pure index arithmetic: no weights, no KV tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

SMALL_QUERY = 8   # sequences with at most this many new tokens share one padded attention call


@dataclass
class Chunk:
    """New tokens of one sequence for this forward: positions ``start .. start+len-1``.
    Logits are wanted for the last ``num_logits`` of them (0 for a partial prefill chunk,
    1 for a normal step, 1 + drafts when verifying speculative tokens)."""

    block_table: list[int]
    start: int
    token_ids: list[int]
    num_logits: int


@dataclass
class AttentionGroup:
    """Sequences whose attention runs in one SDPA call (padded to a common shape)."""
    q_index: torch.Tensor     # [B*Qmax] row of each (seq, query) in the flat batch
    valid: torch.Tensor       # [B*Qmax] False for padding
    blocks: torch.Tensor      # [B, L / block_size] block table (block 0 as padding)
    mask: torch.Tensor        # [B, 1, Qmax, L] True where attention is allowed
    B: int
    Q: int
    L: int                    # keys: the longest context, rounded up to whole blocks
    block_size: int

    fresh: bool = False       # one sequence prefilling from position 0: K/V are all new
    identity: bool = False    # the group is every token of the step, in order, no padding
    shared_len: int = 0       # leading keys every sequence reads from the same slots, all
    #                           before its first query (a whole number of blocks)

    def __post_init__(self):
        self.blocks_flat = self.blocks.reshape(-1)
        self.all_valid = bool(self.valid.all())
        self.grouped_masks: dict[tuple, torch.Tensor] = {}

    # Only a group that reads its shared keys once needs these (built once a step, on use).
    @cached_property
    def shared_blocks(self) -> torch.Tensor:
        return self.blocks[0, :self.shared_len // self.block_size]                # [P / bs]

    @cached_property
    def own_blocks(self) -> torch.Tensor:
        return self.blocks[:, self.shared_len // self.block_size:].reshape(-1)

    def grouped_mask(self, grp: int, additive: torch.dtype | None = None) -> torch.Tensor:
        """The mask for ``grp`` query heads folded into the query axis, ``[1, B, grp*Q, L]``:
        boolean (True: may attend), or with ``additive`` a dtype, 0 / -inf in it as SDPA's
        kernels apply a mask. Built once a step, for every layer."""
        key = (grp, additive)
        if key not in self.grouped_masks:
            if additive is not None:
                self.grouped_masks[key] = additive_mask(self.grouped_mask(grp), additive)
            else:
                self.grouped_masks[key] = (self.mask.repeat(1, 1, grp, 1) if grp > 1
                                           else self.mask).transpose(0, 1)
        return self.grouped_masks[key]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA's kernels apply it: 0 where a query may attend, -inf where not."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        mask.logical_not(), float("-inf"))


@dataclass
class AttentionMetadata:
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    groups: list[AttentionGroup] = field(default_factory=list)
    logit_rows: torch.Tensor | None = None


def prepare(chunks: list[Chunk], block_size: int,
            device: torch.device) -> tuple[torch.Tensor, AttentionMetadata]:
    """The flat batch's token ids and its attention metadata."""
    dev = device
    ids, pos, logit_rows = [], [], []
    offsets = []
    t = 0
    for c in chunks:
        n = len(c.token_ids)
        ids += c.token_ids
        pos += range(c.start, c.start + n)
        logit_rows += range(t + n - c.num_logits, t + n)
        offsets.append(t)
        t += n
    input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
    positions = torch.tensor(pos, dtype=torch.long, device=dev)
    width = max(len(c.block_table) for c in chunks)
    tables = torch.tensor([c.block_table + [0] * (width - len(c.block_table)) for c in chunks],
                          dtype=torch.long, device=dev)
    seq_of_token = torch.repeat_interleave(
        torch.arange(len(chunks), device=dev),
        torch.tensor([len(c.token_ids) for c in chunks], device=dev))
    bs = block_size
    slot_mapping = tables[seq_of_token, positions // bs] * bs + positions % bs
    meta = AttentionMetadata(positions, slot_mapping,
                             logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=dev))
    small = [i for i, c in enumerate(chunks) if len(c.token_ids) <= SMALL_QUERY]
    big = [i for i, c in enumerate(chunks) if len(c.token_ids) > SMALL_QUERY]
    if small:
        meta.groups.append(_group([chunks[i] for i in small], [offsets[i] for i in small],
                                  tables[small], block_size, dev))
    for i in big:
        meta.groups.append(_group([chunks[i]], [offsets[i]], tables[i:i + 1], block_size, dev))
    if len(meta.groups) == 1 and not big and meta.groups[0].all_valid:
        meta.groups[0].identity = True
    return input_ids, meta


def _group(chunks: list[Chunk], offsets: list[int], tables: torch.Tensor, block_size: int,
           dev: torch.device) -> AttentionGroup:
    B = len(chunks)
    Q = max(len(c.token_ids) for c in chunks)
    n = torch.tensor([len(c.token_ids) for c in chunks], device=dev)
    start = torch.tensor([c.start for c in chunks], device=dev)
    ctx = start + n
    L = -(-int(ctx.max()) // block_size) * block_size
    qi = torch.arange(Q, device=dev)
    q_index = torch.tensor(offsets, device=dev)[:, None] + qi
    valid = qi[None, :] < n[:, None]
    q_index = torch.where(valid, q_index, torch.zeros_like(q_index)).reshape(-1)
    kj = torch.arange(L, device=dev)
    key_ok = kj[None, :] < ctx[:, None]                                   # [B, L]
    qpos = start[:, None] + qi[None, :]                                    # [B, Q]
    mask = (kj[None, None, :] <= qpos[:, :, None]) & key_ok[:, None, :]    # [B, Q, L]
    fresh = B == 1 and chunks[0].start == 0
    return AttentionGroup(q_index, valid.reshape(-1), tables[:, :L // block_size],
                          mask[:, None], B, Q, L, block_size, fresh,
                          shared_len=_shared_len(tables, start, block_size) if B > 1 else 0)


def _shared_len(tables: torch.Tensor, start: torch.Tensor, block_size: int) -> int:
    """Keys at the head of every sequence that come from the same blocks (their block tables
    agree there), capped at the earliest query so every query sees all of them."""
    same = (tables == tables[:1]).all(0).int().cumprod(0)          # 1 while all tables agree
    blocks = min(int(same.sum()), int(start.min()) // block_size)
    return blocks * block_size
