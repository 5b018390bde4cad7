"""The Llama transformer, in plain PyTorch: RMSNorm, RoPE, attention over a paged KV cache,
SwiGLU MLP. Works for Llama-style models: SmolLM2, Llama, Mistral, Qwen2 (q/k/v biases).

``Transformer.forward`` runs one engine step: the new tokens of every scheduled sequence are
one flat batch of ``T`` tokens, so every linear layer is a single ``[T, hidden]`` matmul
whatever the mix of prefills and decodes. Only attention needs to know which token belongs
to which sequence (``attention_metadata.py``): each token writes its K/V into its slot of the
pool (``kv_cache.py``), then each sequence's queries read its keys back through its block
table and run ``scaled_dot_product_attention``.

Attention variants (how much KV each token stores; ``loader.py`` converts the weights):

* ``gqa``: as shipped (SmolLM2: 9 query heads share 3 KV heads).
* ``mqa``: one KV head (KV is 3x smaller for SmolLM2).
* ``mla``: K and V come from a shared rank-``r`` latent; only the latent is cached and K/V
  are re-expanded at every step. Less memory, more compute: the DeepSeek-V2 trade, without
  its decoupled-RoPE trick.

How queries attend to cached keys (``decode_attention``): PyTorch's SDPA kernel, or
``eager``, the same formula written out (``eager_attention``). On CPU the written-out form is
the faster for a few queries against many keys; ``auto`` uses it in bf16/fp16 when several
sequences decode over enough keys (``use_eager``: more of them on a CPU with AMX tiles, which
SDPA's kernel runs on) and keeps SDPA in float32, where the engine must match Hugging Face.
When the sequences of a batch begin with the same cached blocks (a shared system prompt),
``cascade_attention`` reads those keys once for the whole batch instead of once per sequence
(``use_cascade``; cascade attention, which vLLM's V1 engine had on GPUs until its removal by
0.32), in either form: written out, or as two SDPA calls whose results ``merge_attention``
combines by their log-sum-exp.

Contract: the model owns weights and RoPE tables, never the KV pool; ``kv_layout()`` says
what the pool must hold per token and layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from mini_engine.attention_metadata import AttentionGroup, AttentionMetadata, additive_mask
from mini_engine.kv_cache import KVCache, KVLayout

if TYPE_CHECKING:
    from mini_engine.loader import ModelConfig


@dataclass
class DecoderLayer:
    ln1: torch.Tensor             # input_layernorm
    ln2: torch.Tensor             # post_attention_layernorm
    qkv: object                   # fused q/k/v projection (for MLA: q and the latent)
    o: object
    gate_up: object               # fused gate/up projection
    down: object
    up_k: torch.Tensor | None = None   # MLA: latent -> keys
    up_v: torch.Tensor | None = None   # MLA: latent -> values


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as transformers' LlamaRMSNorm (fp32 statistics), so fp32 runs match it bit
    # for bit more often than not.
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` with a boolean ``mask`` (True: may attend), written out
    as Hugging Face's "eager" attention does it: scores in the input's dtype, softmax in
    float32. SDPA's CPU kernel tiles the query axis for long prompts and applies the mask
    tile by tile; with three query rows per KV head (a decode step under GQA) against
    hundreds of keys, two plain batched matmuls are the faster."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    probs = scores.float().masked_fill_(mask.logical_not(), float("-inf")).softmax(-1)
    return torch.matmul(probs.to(v.dtype), v)


def sdpa_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA on CPU, and each query row's log-sum-exp of its scaled scores (float32,
    ``[..., rows, 1]``): the log of the softmax's denominator, all ``merge_attention`` needs
    to combine this result with attention over other keys. PyTorch's CPU flash kernel
    computes it anyway (its online softmax) and returns it from its private op; public SDPA
    drops it. ``mask``: boolean (True: may attend), additive in ``q``'s dtype, or None."""
    if mask is not None and mask.dtype == torch.bool:
        mask = additive_mask(mask, q.dtype)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=mask)
    return out, lse.unsqueeze(-1)


def merge_attention(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                    lse2: torch.Tensor) -> torch.Tensor:
    """Attention over two disjoint sets of keys, from attention over each set and its
    log-sum-exp: each result weighted by its set's share of the whole softmax's denominator,
    ``exp(lse_i - lse)``. FlashAttention's online softmax rescales its tiles the same way;
    FlashInfer calls this merging attention states, vLLM ``merge_attn_states``."""
    lse = torch.logaddexp(lse1, lse2)
    return (o1.float() * (lse1 - lse).exp() + o2.float() * (lse2 - lse).exp()).to(o1.dtype)


def cascade_attention(q: torch.Tensor, k_shared: torch.Tensor, v_shared: torch.Tensor,
                      k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      written_out: bool = True) -> torch.Tensor:
    """Attention for a batch whose sequences all begin with the same ``P`` keys
    (``k_shared``, ``v_shared``: ``[kv_heads, 1, P, d]``, one copy); ``k``, ``v`` and ``mask``
    (boolean, or additive as SDPA's) cover each sequence's own keys after them. Every query
    of the batch meets the shared keys in one matmul (the batch's rows stacked), its own
    keys in a second, so the shared keys are gathered and read once instead of once per
    sequence.

    Written out (``eager_attention``'s form), one float32 softmax runs over both sets of
    scores, so the result is attention over the whole context. SDPA's kernel cannot take one
    softmax over two calls: with ``written_out=False`` (on CPU) each call returns its
    log-sum-exp and ``merge_attention`` combines the two results."""
    kvh, B, rows, d = q.shape
    P = k_shared.shape[-2]
    stacked = q.reshape(kvh, 1, B * rows, d)
    if not written_out and q.device.type == "cpu":
        shared, lse_shared = sdpa_with_lse(stacked, k_shared, v_shared)
        own, lse_own = sdpa_with_lse(q, k, v, mask)
        return merge_attention(shared.view(kvh, B, rows, d), lse_shared.view(kvh, B, rows, 1),
                               own, lse_own)
    scores = torch.cat((torch.matmul(stacked, k_shared.transpose(-1, -2)).view(kvh, B, rows, P),
                        torch.matmul(q, k.transpose(-1, -2))), dim=-1) * d ** -0.5
    scores = scores.float()
    if mask.dtype == torch.bool:              # shared keys: all visible
        scores[..., P:].masked_fill_(mask.logical_not(), float("-inf"))
    else:
        scores[..., P:] += mask
    probs = scores.softmax(-1).to(v.dtype)
    shared = torch.matmul(probs[..., :P].reshape(kvh, 1, B * rows, P), v_shared)
    return shared.view(kvh, B, rows, d) + torch.matmul(probs[..., P:], v)


# Where the written-out form starts to win, in keys read (sequences x context): per call
# on a 2-core AVX-512 CPU without AMX, bf16, GQA 9/3, it lost at 8 x 150 (0.75x) and 4 x 600
# (0.79x) and won at 8 x 600 (1.34x), 4 x 1,400 (1.36x), 32 x 150 (1.57x).
EAGER_MIN_KEYS = 4096
# With AMX tiles, SDPA's CPU kernel runs its bf16 matmuls on them (oneDNN's brgemm, in
# PyTorch's FlashAttentionKernel.cpp), and the written-out form wins only over more keys: per
# call on a 2-core Xeon with AMX it lost at 32 x 150 (0.81x) and 8 x 600 (0.83x), tied at
# 16 x 600 and 8 x 1,400 (1.00x, 1.01x) and won at 32 x 600 (1.10x) and 16 x 1,400 (1.14x).
# See docs/runs/mini_engine_speed.md for both.
EAGER_MIN_KEYS_AMX = 16384


def cpu_has_amx() -> bool:
    """AMX tiles on this CPU, as vLLM and SGLang ask before picking their AMX kernels."""
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except Exception:   # an older torch without the probe: no AMX kernels either
        return False


def eager_min_keys(amx: bool | None = None) -> int:
    """Keys read (sequences x context) from which ``auto`` writes attention out; ``amx``
    defaults to this CPU's."""
    return EAGER_MIN_KEYS_AMX if (cpu_has_amx() if amx is None else amx) else EAGER_MIN_KEYS


def use_eager(mode: str, dtype: torch.dtype, num_seqs: int, context: int,
              amx: bool | None = None) -> bool:
    """Whether a group of ``num_seqs`` sequences over ``context`` keys attends with
    ``eager_attention`` (else SDPA) under the ``decode_attention`` setting ``mode``, on a CPU
    with AMX tiles or not (``amx``; this one's by default)."""
    if mode == "auto":
        return (dtype != torch.float32 and num_seqs > 1
                and num_seqs * context >= eager_min_keys(amx))
    return mode == "eager"


# Where reading a shared prefix once starts to pay, in keys saved ((sequences - 1) x shared
# keys): per call on a 2-core AVX-512 CPU, bf16, GQA 9/3, against ``eager_attention`` over
# gathered keys, it lost at 4 x 608 shared (0.88-0.90x) and won at 8 x 608 (1.15x) and
# 8 x 1,200 (1.41-1.56x); with both gathers reading whole blocks, 0.94x at 8 x 608 + 200
# own keys, 1.13x at 8 x 608 + 800, 1.39x at 8 x 1,200. In float32 with SDPA on a 2-core
# AVX2 CPU, 30 layers: 1.0x at 4 x 640 shared + 736 own, 1.46x at 8, 1.7x at 16.
# See docs/runs/mini_engine_speed.md.
CASCADE_MIN_SAVED_KEYS = 4096


def use_cascade(enabled: bool, num_seqs: int, shared_len: int) -> bool:
    """Whether a group of ``num_seqs`` sequences reads its ``shared_len`` common keys once
    (``cascade_attention``) under the ``cascade_attention`` setting ``enabled``."""
    return enabled and shared_len > 0 and (num_seqs - 1) * shared_len >= CASCADE_MIN_SAVED_KEYS


def rope_tables(cfg: "ModelConfig", dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotation angles, ``[max_positions + 1024, head_dim]``."""
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64)
                                         .float() / cfg.head_dim))
    # Past the last position too: attention reads whole KV blocks, and MLA rotates the keys of
    # a last block's masked tail (never attended) as if they had positions.
    positions = cfg.max_position_embeddings + 1024
    freqs = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


class Transformer:
    """Weights (built by ``loader.load_model``) and the forward pass."""

    def __init__(self, cfg: "ModelConfig", layers: list[DecoderLayer], *, embed: torch.Tensor,
                 norm: torch.Tensor, lm_head: object, tied: bool = False,
                 attention: str = "gqa", mla_rank: int = 64, decode_attention: str = "sdpa",
                 cascade_attention: bool = False, dtype: torch.dtype = torch.float32,
                 device: torch.device = torch.device("cpu")):
        self.cfg, self.layers = cfg, layers
        self.embed, self.norm, self.lm_head, self.tied = embed, norm, lm_head, tied
        self.attention, self.mla_rank = attention, mla_rank
        if decode_attention not in ("auto", "sdpa", "eager"):
            raise ValueError(f"unknown decode attention {decode_attention!r}: auto | sdpa | eager")
        self.decode_attention = decode_attention
        self.cascade_attention = cascade_attention and attention != "mla"   # MLA: not written
        self.dtype, self.device = dtype, device
        self.amx = torch.device(device).type == "cpu" and cpu_has_amx()   # for ``use_eager``
        self.num_kv_heads = 1 if attention == "mqa" else cfg.num_kv_heads
        self.cos, self.sin = rope_tables(cfg, dtype, device)

    def kv_layout(self) -> KVLayout:
        if self.attention == "mla":
            return KVLayout(((None, self.mla_rank),))
        # [kv_heads, slots, head_dim]: a gather along the slot axis then yields K/V already
        # shaped [kv_heads, B, L, head_dim] for SDPA, with no transpose copy.
        kv = (self.num_kv_heads, None, self.cfg.head_dim)
        return KVLayout((kv, kv))

    def weight_bytes(self) -> int:
        n = self.embed.numel() * self.embed.element_size()
        if self.lm_head.weight is not self.embed:     # untied, or tied but packed: a copy
            n += self.lm_head.nbytes()
        return n + sum(m.nbytes() for layer in self.layers
                       for m in (layer.qkv, layer.o, layer.gate_up, layer.down))

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: AttentionMetadata, kv: KVCache,
                num_layers: int | None = None) -> torch.Tensor:
        """Run the flat batch through the first ``num_layers`` layers (all by default),
        writing its K/V into ``kv``; return fp32 logits of ``meta.logit_rows``."""
        x = F.embedding(input_ids, self.embed)
        cos = self.cos.index_select(0, meta.positions)[:, None, :]
        sin = self.sin.index_select(0, meta.positions)[:, None, :]
        cfg = self.cfg
        q_dim = cfg.num_heads * cfg.head_dim
        kv_dim = self.num_kv_heads * cfg.head_dim
        for li, layer in enumerate(self.layers[:num_layers]):
            h = rms_norm(x, layer.ln1, cfg.rms_norm_eps)
            qkv = layer.qkv(h)
            if self.attention == "mla":
                q = qkv[:, :q_dim].view(-1, cfg.num_heads, cfg.head_dim)
                q = q * cos + rotate_half(q) * sin
                kv.write(li, meta.slot_mapping, qkv[:, q_dim:].contiguous())
                new_kv = None
            else:
                # RoPE on q and k in one go (they sit side by side in the fused output)
                qk = qkv[:, :q_dim + kv_dim].view(-1, cfg.num_heads + self.num_kv_heads,
                                                  cfg.head_dim)
                qk = qk * cos + rotate_half(qk) * sin
                q, k = qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]
                v = qkv[:, q_dim + kv_dim:].view(-1, self.num_kv_heads, cfg.head_dim)
                kv.write(li, meta.slot_mapping, k.transpose(0, 1), v.transpose(0, 1))
                new_kv = (k, v)
            attn = self._attention(li, layer, q, meta, kv, new_kv)
            x = x + layer.o(attn.reshape(-1, q_dim))
            h = rms_norm(x, layer.ln2, cfg.rms_norm_eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        x = rms_norm(x.index_select(0, meta.logit_rows), self.norm, cfg.rms_norm_eps)
        return self.lm_head(x).float()

    def _context_kv(self, li: int, layer: DecoderLayer, g: AttentionGroup,
                    kv: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the group's context, ``[kv_heads, B, L, head_dim]`` each."""
        cfg = self.cfg
        if self.attention != "mla":
            return self._gather(li, kv, g.blocks_flat, g.B, g.L)
        lat = kv.read_blocks(li, g.blocks_flat)[0].view(g.B, g.L, -1)             # [B, L, r]
        k = (lat @ layer.up_k.T).view(g.B, g.L, cfg.num_kv_heads, cfg.head_dim)
        v = (lat @ layer.up_v.T).view(g.B, g.L, cfg.num_kv_heads, cfg.head_dim)
        cos, sin = self.cos[:g.L][None, :, None, :], self.sin[:g.L][None, :, None, :]
        k = k * cos + rotate_half(k) * sin     # RoPE after expansion: position = index in seq
        return k.permute(2, 0, 1, 3).contiguous(), v.permute(2, 0, 1, 3).contiguous()

    def _gather(self, li: int, kv: KVCache, blocks: torch.Tensor, B: int,
                L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``B`` sequences' ``L`` first slots (whole blocks),
        ``[kv_heads, B, L, d]`` each, from ``blocks`` (their block tables, one after the
        other). The pool's ``[kv_heads, slots, d]`` read block by block comes out in exactly
        this shape: no copy after the gather. (Cutting the last block's masked tail off with
        a view would cost more than it saves: matmuls over a strided key tensor are slower.)"""
        shape = (self.num_kv_heads, B, L, self.cfg.head_dim)
        k, v = kv.read_blocks(li, blocks)
        return k.view(shape), v.view(shape)

    def _attention(self, li: int, layer: DecoderLayer, q: torch.Tensor, meta: AttentionMetadata,
                   kv: KVCache, new_kv: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        cfg = self.cfg
        kvh = cfg.num_kv_heads if self.attention == "mla" else self.num_kv_heads
        grp = cfg.num_heads // kvh
        out = torch.empty_like(q)
        for g in meta.groups:
            if g.fresh and new_kv is not None:
                # A prompt prefilled from scratch needs no gather: its K/V are the ones just
                # computed, and a plain causal mask applies.
                t0 = int(g.q_index[0])
                sl = slice(t0, t0 + g.Q)
                k, v = (t[sl].transpose(0, 1).repeat_interleave(grp, dim=0) for t in new_kv)
                o = F.scaled_dot_product_attention(q[sl].transpose(0, 1), k, v, is_causal=True)
                out[sl] = o.transpose(0, 1)
                continue
            eager = use_eager(self.decode_attention, self.dtype, g.B, g.L, self.amx)
            cascade = use_cascade(self.cascade_attention, g.B, g.shared_len)
            if cascade:        # the shared keys once, then each sequence's own
                ks, vs = self._gather(li, kv, g.shared_blocks, 1, g.shared_len)
                k, v = self._gather(li, kv, g.own_blocks, g.B, g.L - g.shared_len)
            else:
                k, v = self._context_kv(li, layer, g, kv)
            # SDPA's leading two axes are free batch axes: use (kv_head, sequence). The query
            # heads sharing a KV head are folded into the query axis, so SDPA sees
            # [kv_heads, B, group*Q, d] against [kv_heads, B, L, d]: GQA without K/V copies.
            qg = (q if g.identity else q.index_select(0, g.q_index))
            qg = qg.view(g.B, g.Q, kvh, grp, cfg.head_dim)
            qg = qg.permute(2, 0, 3, 1, 4).reshape(kvh, g.B, grp * g.Q, cfg.head_dim)
            # [1, B, group*Q, L]: boolean for the written-out form, else additive, as SDPA's
            # kernels want it (made once a step, not once a layer)
            mask = g.grouped_mask(grp, None if eager else q.dtype)
            if cascade:
                o = cascade_attention(qg, ks, vs, k, v, mask[..., g.shared_len:], eager)
            elif eager:
                o = eager_attention(qg, k, v, mask)
            else:
                o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
            o = o.view(kvh, g.B, grp, g.Q, cfg.head_dim).permute(1, 3, 0, 2, 4)
            o = o.reshape(g.B * g.Q, cfg.num_heads, cfg.head_dim)
            if g.identity:            # a decode-only step: the group is the whole batch
                return o
            if g.all_valid:
                out.index_copy_(0, g.q_index, o)
            else:
                out.index_copy_(0, g.q_index[g.valid], o[g.valid])
        return out
