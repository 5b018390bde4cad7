"""Weight quantization in a few readable lines, and honest ways to measure what it costs.

* ``quantize_int8_per_channel``: one scale per output row, 8-bit integers.
* ``quantize_int4_groupwise``: one scale (and, asymmetric, one minimum) per group of
  ``group_size`` consecutive weights in a row, 4-bit integers packed two per byte.
* ``QuantLinear`` keeps only the packed integers and scales and rebuilds the bf16 weight inside
  ``forward``. That saves memory, not time: real int4 kernels (llama.cpp, Marlin, torchao) fuse
  the unpacking into the matmul. ``quantize_dynamic_int8`` is the library path that works on
  a CPU today: PyTorch's built-in dynamic int8 (fbgemm/oneDNN kernels).
* Quality: ``perplexity`` on held-out ShareGPT text and ``greedy_agreement`` on a fixed
  question set. Memory: ``state_dict_bytes`` (what the weights occupy) and ``rss_bytes``
  (what the process holds), with ``release_memory`` to give freed memory back to the OS.
"""

from __future__ import annotations

import ctypes
import gc
import io
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from torch import nn

from mini_engine.quant import Int8Linear
from workshop.bench.workloads import sharegpt_path
from workshop.prefix_caching import common_prefix

# ---------------------------------------------------------------------------------------
# The quantizers
# ---------------------------------------------------------------------------------------


def quantize_int8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w`` [out, in] -> int8 [out, in] and one float scale per output row.

    The scheme has one home, the teaching engine's ``Int8Linear`` (``mini_engine/quant.py``):
    scale = the row's largest |w| / 127, q = w / scale rounded. This returns its numbers.
    """
    layer = Int8Linear(w)
    return layer.qweight, layer.scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def relative_error(w: torch.Tensor, rebuilt: torch.Tensor) -> float:
    """mean |rebuilt - w| / mean |w|: the error of a round trip, relative to the weights' size."""
    return ((rebuilt.float() - w.float()).abs().mean() / w.float().abs().mean()).item()


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Values 0..15, last dimension even -> uint8 with two values per byte (low nibble first)."""
    q = q.to(torch.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    out = torch.empty(*packed.shape[:-1], 2 * packed.shape[-1], dtype=torch.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


@dataclass
class Int4Weight:
    packed: torch.Tensor       # uint8 [out, in/2]
    scale: torch.Tensor        # [out, in/group]
    offset: torch.Tensor       # [out, in/group]: the group minimum (asymmetric) or -8*scale
    group_size: int
    shape: tuple[int, int]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.packed, self.scale, self.offset))


def quantize_int4_groupwise(w: torch.Tensor, group_size: int = 128, symmetric: bool = True,
                            scale_dtype: torch.dtype = torch.bfloat16) -> Int4Weight:
    """``w`` [out, in] -> 16 levels per group of ``group_size`` weights along each row.

    Symmetric: levels -8..7 times ``absmax / 7`` (zero is exact). Asymmetric: 16 levels spread
    from the group's minimum to its maximum (GGUF's Q4_1 does this with groups of 32).
    Either way a weight is rebuilt as ``q * scale + offset`` with q in 0..15.
    """
    out_f, in_f = w.shape
    if in_f % group_size or group_size % 2:
        raise ValueError(f"in_features {in_f} is not a multiple of group_size {group_size}")
    g = w.float().reshape(out_f, in_f // group_size, group_size)
    if symmetric:
        scale = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 7
        offset = -8 * scale
    else:
        lo, hi = g.amin(dim=-1, keepdim=True), g.amax(dim=-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        offset = lo
    # Round with the scale as it will be stored, so rebuilding uses exactly the same numbers.
    scale, offset = scale.to(scale_dtype).float(), offset.to(scale_dtype).float()
    q = torch.round((g - offset) / scale).clamp(0, 15)
    return Int4Weight(pack_int4(q.reshape(out_f, in_f)), scale.squeeze(-1).to(scale_dtype),
                      offset.squeeze(-1).to(scale_dtype), group_size, (out_f, in_f))


def dequantize_int4(w: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild ``q * scale + offset`` in ``dtype`` (bf16 halves the memory traffic)."""
    out_f, in_f = w.shape
    q = unpack_int4(w.packed).to(dtype).reshape(out_f, in_f // w.group_size, w.group_size)
    scale, offset = w.scale.to(dtype).unsqueeze(-1), w.offset.to(dtype).unsqueeze(-1)
    return torch.addcmul(offset, q, scale).reshape(out_f, in_f)


class QuantLinear(nn.Module):
    """A linear layer that stores int8 or packed int4 weights and rebuilds them per call."""

    def __init__(self, linear: nn.Linear, bits: int, group_size: int = 128,
                 symmetric: bool = True):
        super().__init__()
        self.bits, self.in_features, self.out_features = bits, linear.in_features, linear.out_features
        w = linear.weight.detach()
        if bits == 8:
            q, scale = quantize_int8_per_channel(w)
            self.register_buffer("q", q)
            self.register_buffer("scale", scale.to(torch.bfloat16))
        elif bits == 4:
            qw = quantize_int4_groupwise(w, group_size, symmetric)
            self.group_size = group_size
            self.register_buffer("packed", qw.packed)
            self.register_buffer("scale", qw.scale)
            self.register_buffer("offset", qw.offset)
        else:
            raise ValueError("bits must be 8 or 4")
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def weight_dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.bits == 8:
            return self.q.to(dtype) * self.scale.to(dtype)
        return dequantize_int4(Int4Weight(self.packed, self.scale, self.offset, self.group_size,
                                          (self.out_features, self.in_features)), dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight_dequantized(x.dtype), self.bias)


def quantize_model(model: nn.Module, bits: int, group_size: int = 128, symmetric: bool = True,
                   skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """Replace every ``nn.Linear`` (except names ending in ``skip``) by a ``QuantLinear``.

    ``lm_head`` is skipped by default: in SmolLM2 it *is* the embedding matrix (tied), which
    stays bf16 here, as it does in most int4 recipes.
    """
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not full.endswith(tuple(skip)):
                setattr(module, child_name, QuantLinear(child, bits, group_size, symmetric))
    return model


def quantize_dynamic_int8(model: nn.Module, skip: Sequence[str] = ("lm_head",)) -> nn.Module:
    """The library path: PyTorch's dynamic int8 quantization of the ``nn.Linear`` layers.

    Weights become int8 with one scale per output row; **activations** are quantized to int8
    on the fly, one scale per tensor, and the matmul runs in int8 kernels (W8A8). It needs
    float32 activations, so the rest of the model is converted to float32 first. ``lm_head``
    (tied to the embedding in SmolLM2) is left alone, as in ``quantize_model``. (PyTorch marks
    this API as moving to ``torchao``; it still ships and works in torch 2.13.)
    """
    import warnings
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    model = model.float()
    targets = {name: per_channel_dynamic_qconfig for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and not name.endswith(tuple(skip))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, targets, dtype=torch.qint8)


# ---------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------
# Quality
# ---------------------------------------------------------------------------------------

QUESTIONS: tuple[str, ...] = (
    "What is the capital of France?",
    "How many days are there in a week?",
    "What is the chemical symbol for water?",
    "Name the largest planet in the solar system.",
    "What does a thermometer measure?",
    "Give me one tip for sleeping better.",
    "What is 12 plus 7?",
    "Translate 'thank you' into Spanish.",
    "What colour do you get by mixing blue and yellow?",
    "Who wrote the play Romeo and Juliet?",
    "What is the boiling point of water at sea level in Celsius?",
    "Write a short sentence about the sea.",
)


def heldout_texts(n: int = 20, skip: int = 1000, min_chars: int = 400,
                  path: Path | None = None) -> list[str]:
    """``n`` assistant replies from ShareGPT, read lazily from the start of the 125 MB file.

    Conversations before ``skip`` are passed over, and only mostly-ASCII replies of at least
    ``min_chars`` are kept, so the set is English prose and code, the same on every machine.
    Nothing here trains or tunes on them; whether SmolLM2's pre-training corpus contained
    ShareGPT is not documented, so treat the perplexities as relative, not absolute.
    """
    decoder = json.JSONDecoder()
    texts: list[str] = []
    with open(path or sharegpt_path(), encoding="utf-8") as f:
        buf, pos, index = f.read(1 << 20), 0, 0
        pos = buf.index("[") + 1
        while len(texts) < n:
            while True:                          # skip separators, refill when needed
                while pos < len(buf) and buf[pos] in " \n\r\t,":
                    pos += 1
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError:
                    more = f.read(1 << 20)
                    if not more:
                        return texts
                    buf, pos = buf[pos:] + more, 0
            pos, index = end, index + 1
            if index <= skip:
                continue
            for turn in obj.get("conversations", []):
                text = turn.get("value", "")
                if (turn.get("from") == "gpt" and len(text) >= min_chars
                        and sum(c.isascii() for c in text) > 0.98 * len(text)):
                    texts.append(text)
                    break
    return texts


@torch.inference_mode()
def perplexity(model: nn.Module, tokenizer, texts: Iterable[str], max_tokens: int = 4096,
               window: int = 512) -> float:
    """exp(mean negative log-likelihood) over the first ``max_tokens`` tokens of ``texts``.

    Texts are joined with the end-of-text token and cut into non-overlapping windows; every
    token but the first of each window is predicted. Same texts + same tokenizer = comparable.
    """
    sep = tokenizer.eos_token or "\n\n"
    ids = tokenizer(sep.join(texts), return_tensors="pt")["input_ids"][0][:max_tokens]
    total_nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window].unsqueeze(0)
        if chunk.shape[1] < 2:
            break
        logits = model(chunk).logits.float()
        nll = nn.functional.cross_entropy(logits[0, :-1], chunk[0, 1:], reduction="sum")
        total_nll += nll.item()
        count += chunk.shape[1] - 1
    return math.exp(total_nll / count)


def chat_ids(tokenizer, question: str) -> torch.Tensor:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                         add_generation_prompt=True, return_tensors="pt",
                                         return_dict=True)["input_ids"]


@torch.inference_mode()
def greedy_answers(model: nn.Module, tokenizer, questions: Sequence[str] = QUESTIONS,
                   max_new_tokens: int = 24) -> list[list[int]]:
    """Greedy (deterministic) answer token ids for each question, chat template applied."""
    answers = []
    for q in questions:
        ids = chat_ids(tokenizer, q)
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones_like(ids),
                             pad_token_id=tokenizer.eos_token_id)
        answers.append(out[0, ids.shape[1]:].tolist())
    return answers


@dataclass(frozen=True)
class Agreement:
    exact: float          # share of answers identical to the reference, token for token
    prefix: float         # mean share of each reference answer reproduced before diverging

    def __str__(self) -> str:
        return f"{self.exact:.0%} identical, {self.prefix:.0%} of tokens before divergence"


def greedy_agreement(reference: Sequence[Sequence[int]],
                     candidate: Sequence[Sequence[int]]) -> Agreement:
    if len(reference) != len(candidate) or not reference:
        raise ValueError("need the same, non-zero number of answers")
    exact = sum(list(r) == list(c) for r, c in zip(reference, candidate)) / len(reference)
    prefix = sum(common_prefix(r, c) / max(len(r), 1)
                 for r, c in zip(reference, candidate)) / len(reference)
    return Agreement(exact, prefix)


@torch.inference_mode()
def forced_greedy_agreement(model: nn.Module, tokenizer, questions: Sequence[str],
                            reference: Sequence[Sequence[int]]) -> Agreement:
    """Would ``model`` reproduce the reference's greedy answers? One forward per question.

    Feed question + reference answer and take the model's top token at every answer
    position. Greedy decoding reproduces the answer exactly iff every one of those is the
    reference token, and diverges at the first position where one is not: the same two
    numbers as generating and comparing, without a forward pass per generated token.
    """
    rows = []
    for q, ref in zip(questions, reference):
        ids = chat_ids(tokenizer, q)
        if not ref:
            rows.append([])
            continue
        full = torch.cat([ids, torch.tensor([list(ref)], dtype=ids.dtype)], dim=1)
        logits = model(full).logits[0, ids.shape[1] - 1:-1]
        rows.append(logits.argmax(-1).tolist())
    return greedy_agreement(reference, rows)


@torch.inference_mode()
def decode_tokens_per_s(model: nn.Module, tokenizer, prompt: str = QUESTIONS[0],
                        new_tokens: int = 32) -> float:
    """Greedy generation speed at batch 1, prefill excluded: (n - 1) tokens / time after the first."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    kwargs = dict(do_sample=False, attention_mask=torch.ones_like(ids),
                  pad_token_id=tokenizer.eos_token_id)
    model.generate(ids, max_new_tokens=1, **kwargs)                 # warm-up
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    total = time.perf_counter() - t0
    return (new_tokens - 1) / max(total - first, 1e-9)


@torch.inference_mode()
def linear_input_ranges(model: nn.Module, tokenizer, text: str, max_tokens: int = 256) -> list[dict]:
    """For every ``nn.Linear``: the largest and the mean absolute value of its input.

    Per-tensor int8 activation quantization spends its 127 steps on the largest value; when
    that is hundreds of times the typical value, typical activations get only a few levels.
    """
    stats: dict[str, tuple[float, float]] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            def hook(_mod, args, name=name):
                x = args[0].float().abs()
                stats[name] = (x.max().item(), x.mean().item())
            hooks.append(module.register_forward_pre_hook(hook))
    try:
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :max_tokens]
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return [{"layer input": n, "max |x|": mx, "mean |x|": mean, "max / mean": mx / mean,
             "int8 levels for a typical value": mean / (mx / 127)}
            for n, (mx, mean) in stats.items()]


# ---------------------------------------------------------------------------------------
# One variant, measured end to end
# ---------------------------------------------------------------------------------------

VARIANTS: dict[str, Callable[[nn.Module], nn.Module]] = {
    "bf16 (reference)": lambda m: m,
    "int8 per-channel (ours)": lambda m: quantize_model(m, 8),
    "int4 group 64, symmetric (ours)": lambda m: quantize_model(m, 4, 64, True),
    "int4 group 32, min/max (ours, Q4_1's grid)": lambda m: quantize_model(m, 4, 32, False),
    "int8 dynamic (PyTorch library)": quantize_dynamic_int8,
}


def load_bf16(path: str) -> nn.Module:
    """The model in bf16, copied out of the memory-mapped checkpoint.

    ``from_pretrained`` may leave tensors as views of the mapped file; the mapping then stays
    (and counts in RSS) as long as any one of them lives, so replacing layers by quantized ones
    would not visibly free anything. Owning copies make RSS tell the truth.
    """
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():          # shared (tied) parameters appear once
            p.data = p.data.clone()
    return model


def evaluate_variant(name: str, make: Callable[[nn.Module], nn.Module], path: str, tokenizer,
                     texts: Sequence[str], questions: Sequence[str],
                     reference: Sequence[Sequence[int]] | None = None, max_tokens: int = 2048,
                     new_tokens: int = 24, speed_tokens: int = 32) -> tuple[dict, list[list[int]]]:
    """Load a fresh bf16 model, apply ``make``, measure, free it, and prove it was freed.

    ``reference`` are the reference model's greedy answers; when None (the reference itself)
    they are generated here. Agreement is then measured by ``forced_greedy_agreement`` for
    every variant, the reference included (its row shows the noise floor of comparing a full
    forward pass with step-by-step decoding). Returns the row and the reference answers.
    RSS is this process's resident memory: measured before loading, with the variant loaded
    and used once, and after ``del`` + ``release_memory``; the last should return to about
    the first.
    """
    release_memory()
    rss_before = rss_bytes()
    model = make(load_bf16(path))
    weights = state_dict_bytes(model)
    ppl = perplexity(model, tokenizer, texts, max_tokens=max_tokens)
    # Measured after a forward pass: weights loaded from a memory-mapped file only count
    # towards RSS once they have been touched.
    release_memory()
    rss_loaded = rss_bytes()
    if reference is None:
        reference = greedy_answers(model, tokenizer, questions, new_tokens)
    agreement = forced_greedy_agreement(model, tokenizer, questions, reference)
    speed = decode_tokens_per_s(model, tokenizer, new_tokens=speed_tokens)
    del model
    release_memory()
    rss_after = rss_bytes()
    return {
        "variant": name,
        "weights (MiB)": weights / 2**20,
        "RSS in use (MiB, +)": (rss_loaded - rss_before) / 2**20,
        "RSS after free (MiB, +)": (rss_after - rss_before) / 2**20,
        "perplexity": ppl,
        "answers identical": f"{agreement.exact:.0%}",
        "tokens before divergence": f"{agreement.prefix:.0%}",
        "decode tok/s (batch 1)": speed,
    }, [list(a) for a in reference]


# ---------------------------------------------------------------------------------------
# The GGUF the bundled model came from
# ---------------------------------------------------------------------------------------


def gguf_summary(path: str | Path) -> dict[str, dict[str, float]]:
    """Per tensor type in a GGUF file: number of weights, bytes, bits per weight."""
    import gguf
    reader = gguf.GGUFReader(str(path))
    out: dict[str, dict[str, float]] = {}
    for t in reader.tensors:
        row = out.setdefault(t.tensor_type.name, {"weights": 0, "bytes": 0})
        row["weights"] += int(t.n_elements)
        row["bytes"] += int(t.n_bytes)
    for row in out.values():
        row["bits_per_weight"] = 8 * row["bytes"] / row["weights"]
    return out


def distinct_values_per_group(w: torch.Tensor, group_size: int = 32,
                              max_groups: int = 2000) -> float:
    """Mean number of distinct values in each group of ``group_size`` consecutive weights.

    A weight matrix that was stored as 4-bit groups has at most 16 per group.
    """
    groups = w.reshape(-1, group_size)[:max_groups]
    return sum(len(torch.unique(g)) for g in groups) / len(groups)


__all__ = [
    "quantize_int8_per_channel", "dequantize_int8", "relative_error", "pack_int4", "unpack_int4", "Int4Weight",
    "quantize_int4_groupwise", "dequantize_int4", "QuantLinear", "quantize_model",
    "quantize_dynamic_int8", "state_dict_bytes", "param_bytes", "rss_bytes", "release_memory",
    "QUESTIONS", "sharegpt_path", "heldout_texts", "perplexity", "greedy_answers",
    "common_prefix", "Agreement", "greedy_agreement", "chat_ids", "forced_greedy_agreement", "decode_tokens_per_s", "gguf_summary",
    "VARIANTS", "load_bf16", "evaluate_variant", "linear_input_ranges",
    "distinct_values_per_group",
]


def plot_tradeoff(rows: list[dict]):
    """Weight memory against perplexity, one labelled point per variant (rows as returned by
    ``evaluate_variant``): the trade-off at a glance, lower-left is better."""
    from workshop.plots import figure

    fig, ax = figure("Memory vs quality of each weight format", "weights (MiB)",
                     "perplexity on held-out ShareGPT (lower is better)")
    for r in rows:
        ax.scatter(r["weights (MiB)"], r["perplexity"], s=45, label=r["variant"])
    ax.legend(fontsize=8)
    return fig
