"""From a Hugging Face model folder to a ``Transformer``, and back to Hugging Face names.

``ModelConfig.from_hf`` is the engine's one reader of ``config.json``; ``load_model`` reads
the ``*.safetensors`` directly (no ``transformers`` at run time, so every tensor is visible),
fuses q/k/v and gate/up into one matmul each, quantizes the linears if asked, and converts
the attention variant:

* ``mqa``: the KV heads' projections averaged into one head (the GQA paper's conversion;
  quality drops without further training).
* ``mla``: ``[W_k; W_v] ~= up @ down`` by SVD at rank ``r``; the fused projection computes
  the latent ``down @ x`` and only that is cached (``model.py`` re-expands it).

``hf_state_dict`` is the inverse: the weights the engine effectively computes with, under
Hugging Face names, so a ``LlamaForCausalLM`` can be the reference for a quantized / MQA /
MLA run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from mini_engine.linear import make_linear
from mini_engine.model import DecoderLayer, Transformer


@dataclass
class ModelConfig:
    """The architecture numbers the engine needs from ``config.json``."""

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


def load_model(model_path: str, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
               attention: str = "gqa", mla_rank: int = 64,
               quant: str | None = None, prepack: bool = False, prepack_fp32: bool = False,
               decode_attention: str = "sdpa", cascade_attention: bool = False) -> Transformer:
    if attention not in ("gqa", "mqa", "mla"):
        raise ValueError(f"unknown attention variant {attention!r}: gqa | mqa | mla")
    cfg = ModelConfig.from_hf(model_path)
    dev = torch.device(device)
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_path).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    if not sd:
        raise FileNotFoundError(f"no *.safetensors in {model_path}")
    get = lambda k: sd[k].to(dtype).to(dev)      # noqa: E731
    opt = lambda k: get(k) if k in sd else None  # noqa: E731
    embed = get("model.embed_tokens.weight")
    tied = cfg.tie_word_embeddings or "lm_head.weight" not in sd
    lm_head = embed if tied else get("lm_head.weight")
    kv_dim = cfg.num_kv_heads * cfg.head_dim

    def linear(weight: torch.Tensor, bias: torch.Tensor | None = None, quantize: bool = True):
        return make_linear(weight, bias, quant if quantize else None, prepack, prepack_fp32)

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        wq, wk, wv = (get(p + f"self_attn.{n}_proj.weight") for n in "qkv")
        bq, bk, bv = (opt(p + f"self_attn.{n}_proj.bias") for n in "qkv")
        up_k = up_v = None
        if attention == "mqa":
            merge = lambda w: w.view(cfg.num_kv_heads, -1, *w.shape[1:]).mean(0)  # noqa: E731
            wk, wv = merge(wk), merge(wv)
            bk, bv = (merge(b) if b is not None else None for b in (bk, bv))
        if attention == "mla":
            if bk is not None:
                raise NotImplementedError("MLA option needs bias-free K/V projections")
            U, S, Vh = torch.linalg.svd(torch.cat([wk, wv]).float(), full_matrices=False)
            down = (S[:mla_rank, None] * Vh[:mla_rank]).to(dtype)     # [r, hidden]
            up = U[:, :mla_rank].to(dtype)                              # [2*kv_dim, r]
            up_k, up_v = up[:kv_dim].contiguous(), up[kv_dim:].contiguous()
            qkv_w = torch.cat([wq, down])
            qkv_b = None if bq is None else torch.cat(
                [bq, torch.zeros(mla_rank, dtype=bq.dtype, device=bq.device)])
        else:
            qkv_w = torch.cat([wq, wk, wv])
            qkv_b = None if bq is None else torch.cat([bq, bk, bv])
        gate, upw = get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")
        layers.append(DecoderLayer(
            ln1=get(p + "input_layernorm.weight"), ln2=get(p + "post_attention_layernorm.weight"),
            # fused projections: one matmul for q/k/v and one for gate/up
            qkv=linear(qkv_w, qkv_b),
            o=linear(get(p + "self_attn.o_proj.weight")),
            gate_up=linear(torch.cat([gate, upw])),
            down=linear(get(p + "mlp.down_proj.weight")),
            up_k=up_k, up_v=up_v))
    norm = get("model.norm.weight")
    sd.clear()      # release the checkpoint's tensors (not `del sd`: get and opt close over it)
    # The head is never quantized (in SmolLM2 it is the embedding matrix). Packed, it is a
    # second copy of a tied embedding: the lookup needs the plain rows.
    return Transformer(cfg, layers, embed=embed, norm=norm,
                       lm_head=linear(lm_head, quantize=False), tied=tied,
                       attention=attention, mla_rank=mla_rank,
                       decode_attention=decode_attention,
                       cascade_attention=cascade_attention, dtype=dtype, device=dev)


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The weights ``model`` effectively computes with (dequantized, converted), under
    Hugging Face names, in fp32."""
    cfg = model.cfg
    q_out = cfg.num_heads * cfg.head_dim
    kv_out = model.num_kv_heads * cfg.head_dim
    sd = {"model.embed_tokens.weight": model.embed.float(),
          "model.norm.weight": model.norm.float()}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        qkv = layer.qkv.dequantize(torch.float32)
        sd[p + "self_attn.q_proj.weight"] = qkv[:q_out]
        if model.attention == "mla":
            down = qkv[q_out:]
            sd[p + "self_attn.k_proj.weight"] = layer.up_k.float() @ down
            sd[p + "self_attn.v_proj.weight"] = layer.up_v.float() @ down
        else:
            sd[p + "self_attn.k_proj.weight"] = qkv[q_out:q_out + kv_out]
            sd[p + "self_attn.v_proj.weight"] = qkv[q_out + kv_out:]
        sd[p + "self_attn.o_proj.weight"] = layer.o.dequantize(torch.float32)
        gate_up = layer.gate_up.dequantize(torch.float32)
        sd[p + "mlp.gate_proj.weight"] = gate_up[:cfg.intermediate_size]
        sd[p + "mlp.up_proj.weight"] = gate_up[cfg.intermediate_size:]
        sd[p + "mlp.down_proj.weight"] = layer.down.dequantize(torch.float32)
        sd[p + "input_layernorm.weight"] = layer.ln1.float()
        sd[p + "post_attention_layernorm.weight"] = layer.ln2.float()
    if not model.tied:
        sd["lm_head.weight"] = model.lm_head.dequantize(torch.float32)
    return sd
