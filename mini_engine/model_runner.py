"""The Llama forward pass, in plain PyTorch, over a paged KV cache.

The model is built from the Hugging Face ``config.json`` and ``*.safetensors`` directly
(no ``transformers`` at run time), so every tensor is visible. Works for Llama-style models:
SmolLM2, Llama, Mistral, Qwen2 (q/k/v biases).

One ``forward`` runs a whole engine step: the new tokens of every scheduled sequence are
concatenated into one flat batch of ``T`` tokens, so every linear layer is a single
``[T, hidden]`` matmul whatever the mix of prefills and decodes. Only attention needs to know
which token belongs to which sequence: each token writes its K/V into its *slot* of the
pool, then each sequence's queries read its keys back through its block table (a gather
with an index tensor) and run ``scaled_dot_product_attention``.

Attention variants (how much KV each token stores):

* ``gqa``: as shipped (SmolLM2: 9 query heads share 3 KV heads).
* ``mqa``: the KV heads averaged into one (the GQA paper's conversion; quality drops
  without further training; KV is 3x smaller here).
* ``mla``: K and V come from a shared rank-``r`` latent (``W_kv ~= up @ down`` by SVD).
  Only the latent is cached; K/V are re-expanded at every step. Less memory, more compute:
  the DeepSeek-V2 trade, without its decoupled-RoPE trick.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mini_engine.quant import make_linear

SMALL_QUERY = 8   # sequences with at most this many new tokens share one padded attention call


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    eos_token_id: list[int]

    @classmethod
    def from_hf(cls, path: str | os.PathLike) -> "ModelConfig":
        c = json.loads((Path(path) / "config.json").read_text())
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        if rope.get("rope_type", "default") not in ("default", None):
            raise NotImplementedError(f"rope scaling {rope.get('rope_type')!r} is not implemented")
        eos = c.get("eos_token_id")
        return cls(
            vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"], num_layers=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"],
            num_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
            head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=rope.get("rope_theta") or c.get("rope_theta", 10000.0),
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            max_position_embeddings=c.get("max_position_embeddings", 4096),
            eos_token_id=eos if isinstance(eos, list) else ([eos] if eos is not None else []))


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
class _Group:
    """Sequences whose attention runs in one SDPA call (padded to a common shape)."""
    q_index: torch.Tensor     # [B*Qmax] row of each (seq, query) in the flat batch
    valid: torch.Tensor       # [B*Qmax] False for padding
    slots: torch.Tensor       # [B, L] slot of each context token (0 for padding)
    mask: torch.Tensor        # [B, 1, Qmax, L] True where attention is allowed
    B: int
    Q: int
    L: int

    fresh: bool = False       # one sequence prefilling from position 0: K/V are all new
    identity: bool = False    # the group is every token of the step, in order, no padding

    def __post_init__(self):
        self.slots_flat = self.slots.reshape(-1)
        self.all_valid = bool(self.valid.all())
        self.grouped_masks: dict[int, torch.Tensor] = {}

    def grouped_mask(self, grp: int) -> torch.Tensor:
        """The mask for ``grp`` query heads folded into the query axis (built once a step)."""
        if grp not in self.grouped_masks:
            self.grouped_masks[grp] = self.mask.repeat(1, 1, grp, 1) if grp > 1 else self.mask
        return self.grouped_masks[grp]


@dataclass
class _Meta:
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    groups: list[_Group] = field(default_factory=list)
    logit_rows: torch.Tensor | None = None


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # Same op order as transformers' LlamaRMSNorm (fp32 statistics), so fp32 runs match it bit
    # for bit more often than not.
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class ModelRunner:
    """Owns the weights and the KV pool; ``forward(chunks) -> logits``.

    ``num_blocks`` slots-of-``block_size`` per layer are allocated up front (the allocator in
    ``block_manager.py`` hands them out). Not thread-safe: one engine thread calls it.
    """

    def __init__(self, model_path: str, *, dtype: torch.dtype = torch.float32,
                 device: str = "cpu", block_size: int = 16, num_blocks: int | None = None,
                 kv_cache_bytes: int = 1 << 30, attention: str = "gqa", mla_rank: int = 64,
                 quant: str | None = None):
        self.cfg = cfg = ModelConfig.from_hf(model_path)
        self.dtype, self.device, self.block_size = dtype, torch.device(device), block_size
        self.attention, self.mla_rank, self.quant = attention, mla_rank, quant
        self._load(model_path)
        per_token = self.kv_bytes_per_token()
        if num_blocks is None:
            num_blocks = max(4, kv_cache_bytes // (per_token * block_size))
        self.num_blocks = num_blocks
        slots = num_blocks * block_size
        kw = dict(dtype=dtype, device=self.device)
        if attention == "mla":
            self.k_cache = [torch.zeros(slots, mla_rank, **kw) for _ in range(cfg.num_layers)]
            self.v_cache = None
        else:
            # [kv_heads, slots, head_dim]: a gather along the slot axis then yields K/V already
            # shaped [kv_heads, B, L, head_dim] for SDPA, with no transpose copy.
            shape = (self.num_kv_heads, slots, cfg.head_dim)
            self.k_cache = [torch.zeros(shape, **kw) for _ in range(cfg.num_layers)]
            self.v_cache = [torch.zeros(shape, **kw) for _ in range(cfg.num_layers)]
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.int64)
                                             .float() / cfg.head_dim))
        max_pos = cfg.max_position_embeddings
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(dtype).to(self.device)
        self.sin = emb.sin().to(dtype).to(self.device)

    # -- weights -------------------------------------------------------------------------

    def _load(self, model_path: str) -> None:
        cfg = self.cfg
        sd: dict[str, torch.Tensor] = {}
        for f in sorted(Path(model_path).glob("*.safetensors")):
            sd.update(load_file(str(f)))
        if not sd:
            raise FileNotFoundError(f"no *.safetensors in {model_path}")
        get = lambda k: sd[k].to(self.dtype).to(self.device)  # noqa: E731
        opt = lambda k: get(k) if k in sd else None           # noqa: E731
        self.embed = get("model.embed_tokens.weight")
        self.norm = get("model.norm.weight")
        self.lm_head = self.embed if cfg.tie_word_embeddings or "lm_head.weight" not in sd \
            else get("lm_head.weight")
        self.num_kv_heads = 1 if self.attention == "mqa" else cfg.num_kv_heads
        kv_dim = cfg.num_kv_heads * cfg.head_dim
        self.layers = []
        self.effective: dict[str, torch.Tensor] = {}   # HF-named weights this model really uses
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            wq, wk, wv = (get(p + f"self_attn.{n}_proj.weight") for n in "qkv")
            bq, bk, bv = (opt(p + f"self_attn.{n}_proj.bias") for n in "qkv")
            layer = {"ln1": get(p + "input_layernorm.weight"),
                     "ln2": get(p + "post_attention_layernorm.weight")}
            if self.attention == "mqa":
                merge = lambda w: w.view(cfg.num_kv_heads, -1, *w.shape[1:]).mean(0)  # noqa: E731
                wk, wv = merge(wk), merge(wv)
                bk, bv = (merge(b) if b is not None else None for b in (bk, bv))
            if self.attention == "mla":
                if bk is not None:
                    raise NotImplementedError("MLA option needs bias-free K/V projections")
                U, S, Vh = torch.linalg.svd(torch.cat([wk, wv]).float(), full_matrices=False)
                r = self.mla_rank
                down = (S[:r, None] * Vh[:r]).to(self.dtype)         # [r, hidden]
                up = U[:, :r].to(self.dtype)                          # [2*kv_dim, r]
                layer["up_k"], layer["up_v"] = up[:kv_dim].contiguous(), up[kv_dim:].contiguous()
                wk = (layer["up_k"].float() @ down.float()).to(self.dtype)   # for effective weights
                wv = (layer["up_v"].float() @ down.float()).to(self.dtype)
                qkv_w = torch.cat([wq, down])
                qkv_b = None if bq is None else torch.cat([bq, torch.zeros(r, dtype=bq.dtype)])
            else:
                qkv_w = torch.cat([wq, wk, wv])
                qkv_b = None if bq is None else torch.cat([bq, bk, bv])
            # Fused projections: one matmul for q/k/v and one for gate/up.
            layer["qkv"] = make_linear(qkv_w, qkv_b, self.quant)
            layer["o"] = make_linear(get(p + "self_attn.o_proj.weight"), None, self.quant)
            gate, upw = get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")
            layer["gate_up"] = make_linear(torch.cat([gate, upw]), None, self.quant)
            layer["down"] = make_linear(get(p + "mlp.down_proj.weight"), None, self.quant)
            self.layers.append(layer)
            # What an equivalent Hugging Face model would need (tests compare against it).
            q_out = cfg.num_heads * cfg.head_dim
            deq = layer["qkv"].dequantize(torch.float32)
            if self.attention == "mla":
                self.effective[p + "self_attn.q_proj.weight"] = deq[:q_out]
                down_eff = deq[q_out:]
                self.effective[p + "self_attn.k_proj.weight"] = layer["up_k"].float() @ down_eff
                self.effective[p + "self_attn.v_proj.weight"] = layer["up_v"].float() @ down_eff
            else:
                kv_out = self.num_kv_heads * cfg.head_dim
                self.effective[p + "self_attn.q_proj.weight"] = deq[:q_out]
                self.effective[p + "self_attn.k_proj.weight"] = deq[q_out:q_out + kv_out]
                self.effective[p + "self_attn.v_proj.weight"] = deq[q_out + kv_out:]
            gu = layer["gate_up"].dequantize(torch.float32)
            self.effective[p + "mlp.gate_proj.weight"] = gu[:cfg.intermediate_size]
            self.effective[p + "mlp.up_proj.weight"] = gu[cfg.intermediate_size:]
            self.effective[p + "mlp.down_proj.weight"] = layer["down"].dequantize(torch.float32)
            self.effective[p + "self_attn.o_proj.weight"] = layer["o"].dequantize(torch.float32)
        del sd

    def kv_bytes_per_token(self) -> int:
        el = torch.empty((), dtype=self.dtype).element_size()
        if self.attention == "mla":
            return self.cfg.num_layers * self.mla_rank * el
        kv_heads = 1 if self.attention == "mqa" else self.cfg.num_kv_heads
        return self.cfg.num_layers * 2 * kv_heads * self.cfg.head_dim * el

    def weight_bytes(self) -> int:
        n = self.embed.numel() * self.embed.element_size()
        return n + sum(l[k].nbytes() for l in self.layers for k in ("qkv", "o", "gate_up", "down"))

    # -- metadata ------------------------------------------------------------------------

    def _slots(self, table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Slot of each position, given block tables ``[B, nblocks]`` and positions ``[B, L]``."""
        bs = self.block_size
        return table.gather(1, pos // bs) * bs + pos % bs

    def _prepare(self, chunks: list[Chunk]) -> tuple[torch.Tensor, _Meta]:
        dev = self.device
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
        # slot of every new token
        seq_of_token = torch.repeat_interleave(
            torch.arange(len(chunks), device=dev),
            torch.tensor([len(c.token_ids) for c in chunks], device=dev))
        bs = self.block_size
        slot_mapping = tables[seq_of_token, positions // bs] * bs + positions % bs
        meta = _Meta(positions, slot_mapping,
                     logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=dev))
        small = [i for i, c in enumerate(chunks) if len(c.token_ids) <= SMALL_QUERY]
        big = [i for i, c in enumerate(chunks) if len(c.token_ids) > SMALL_QUERY]
        if small:
            meta.groups.append(self._group([chunks[i] for i in small], [offsets[i] for i in small],
                                           tables[small]))
        for i in big:
            meta.groups.append(self._group([chunks[i]], [offsets[i]], tables[i:i + 1]))
        if len(meta.groups) == 1 and not big and meta.groups[0].all_valid:
            meta.groups[0].identity = True
        return input_ids, meta

    def _group(self, chunks: list[Chunk], offsets: list[int], tables: torch.Tensor) -> _Group:
        dev = self.device
        B = len(chunks)
        Q = max(len(c.token_ids) for c in chunks)
        n = torch.tensor([len(c.token_ids) for c in chunks], device=dev)
        start = torch.tensor([c.start for c in chunks], device=dev)
        ctx = start + n
        L = int(ctx.max())
        qi = torch.arange(Q, device=dev)
        q_index = torch.tensor(offsets, device=dev)[:, None] + qi
        valid = qi[None, :] < n[:, None]
        q_index = torch.where(valid, q_index, torch.zeros_like(q_index)).reshape(-1)
        kj = torch.arange(L, device=dev)
        key_ok = kj[None, :] < ctx[:, None]                                   # [B, L]
        qpos = start[:, None] + qi[None, :]                                    # [B, Q]
        mask = (kj[None, None, :] <= qpos[:, :, None]) & key_ok[:, None, :]    # [B, Q, L]
        pos = torch.where(key_ok, kj[None, :].expand(B, L), torch.zeros_like(kj)[None, :])
        slots = self._slots(tables, pos)
        fresh = B == 1 and chunks[0].start == 0
        return _Group(q_index, valid.reshape(-1), slots, mask[:, None], B, Q, L, fresh)

    # -- forward -------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk], num_layers: int | None = None) -> torch.Tensor:
        """Run the new tokens of ``chunks`` through the first ``num_layers`` layers (all by
        default), write their K/V into the pool, and return fp32 logits ``[rows, vocab]``
        for the positions each chunk asked for, in chunk order."""
        input_ids, meta = self._prepare(chunks)
        x = F.embedding(input_ids, self.embed)
        cos = self.cos.index_select(0, meta.positions)[:, None, :]
        sin = self.sin.index_select(0, meta.positions)[:, None, :]
        cfg = self.cfg
        q_dim = cfg.num_heads * cfg.head_dim
        kv_dim = self.num_kv_heads * cfg.head_dim
        for li, layer in enumerate(self.layers[:num_layers]):
            h = _rms_norm(x, layer["ln1"], cfg.rms_norm_eps)
            qkv = layer["qkv"](h)
            if self.attention == "mla":
                q = qkv[:, :q_dim].view(-1, cfg.num_heads, cfg.head_dim)
                q = q * cos + _rotate_half(q) * sin
                self.k_cache[li].index_copy_(0, meta.slot_mapping, qkv[:, q_dim:].contiguous())
            else:
                # RoPE on q and k in one go (they sit side by side in the fused output)
                qk = qkv[:, :q_dim + kv_dim].view(-1, cfg.num_heads + self.num_kv_heads, cfg.head_dim)
                qk = qk * cos + _rotate_half(qk) * sin
                q, k = qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]
                v = qkv[:, q_dim + kv_dim:].view(-1, self.num_kv_heads, cfg.head_dim)
                self.k_cache[li].index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
                self.v_cache[li].index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
            attn = self._attention(li, layer, q, meta, None if self.attention == "mla" else (k, v))
            x = x + layer["o"](attn.reshape(-1, q_dim))
            h = _rms_norm(x, layer["ln2"], cfg.rms_norm_eps)
            gate, up = layer["gate_up"](h).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
        x = _rms_norm(x.index_select(0, meta.logit_rows), self.norm, cfg.rms_norm_eps)
        return F.linear(x, self.lm_head).float()

    def _kv(self, li: int, layer: dict, g: _Group) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of the group's context, ``[kv_heads, B, L, head_dim]`` each."""
        cfg = self.cfg
        if self.attention != "mla":
            # One index_select per tensor along the slot axis: this gather is what a
            # paged-attention kernel avoids by reading the blocks in place.
            shape = (self.num_kv_heads, g.B, g.L, cfg.head_dim)
            k = self.k_cache[li].index_select(1, g.slots_flat).view(shape)
            v = self.v_cache[li].index_select(1, g.slots_flat).view(shape)
            return k, v
        lat = self.k_cache[li].index_select(0, g.slots_flat).view(g.B, g.L, -1)  # [B, L, r]
        k = (lat @ layer["up_k"].T).view(g.B, g.L, cfg.num_kv_heads, cfg.head_dim)
        v = (lat @ layer["up_v"].T).view(g.B, g.L, cfg.num_kv_heads, cfg.head_dim)
        cos, sin = self.cos[:g.L][None, :, None, :], self.sin[:g.L][None, :, None, :]
        k = k * cos + _rotate_half(k) * sin     # RoPE after expansion: position = index in seq
        return k.permute(2, 0, 1, 3).contiguous(), v.permute(2, 0, 1, 3).contiguous()

    def _attention(self, li: int, layer: dict, q: torch.Tensor, meta: _Meta,
                   new_kv: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
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
            k, v = self._kv(li, layer, g)
            # SDPA's leading two axes are free batch axes: use (kv_head, sequence). The query
            # heads sharing a KV head are folded into the query axis, so SDPA sees
            # [kv_heads, B, group*Q, d] against [kv_heads, B, L, d]: GQA without K/V copies.
            qg = (q if g.identity else q.index_select(0, g.q_index))
            qg = qg.view(g.B, g.Q, kvh, grp, cfg.head_dim)
            qg = qg.permute(2, 0, 3, 1, 4).reshape(kvh, g.B, grp * g.Q, cfg.head_dim)
            mask = g.grouped_mask(grp).transpose(0, 1)                 # [1, B, group*Q, L]
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

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights this runner effectively computes with, under Hugging Face names (fp32):
        load them into a ``LlamaForCausalLM`` to get a reference for a quantized / MQA / MLA
        run."""
        sd = dict(self.effective)
        sd["model.embed_tokens.weight"] = self.embed.float()
        sd["model.norm.weight"] = self.norm.float()
        for i, layer in enumerate(self.layers):
            sd[f"model.layers.{i}.input_layernorm.weight"] = layer["ln1"].float()
            sd[f"model.layers.{i}.post_attention_layernorm.weight"] = layer["ln2"].float()
        if self.lm_head is not self.embed:
            sd["lm_head.weight"] = self.lm_head.float()
        return sd
