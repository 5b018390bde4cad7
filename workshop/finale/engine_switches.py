"""The teaching engine's speed switches, each turned off alone, timed on this machine.

``mini_engine`` keeps a switch for each technique that made it faster
(docs/runs/mini_engine_speed.md, "What each change bought"): weights packed once for oneDNN,
K/V read back block by block, attention written out for big decode batches, cascade attention
over a shared prefix.
``decode_step_rows`` builds one engine per variant (the defaults, then each switch off on its
own), gives every engine the same batch (sequences behind one system prompt, radix cache on,
so the prompt's blocks are shared), and times their decode steps in turn, round-robin: a
slow moment of a shared machine then falls on every variant alike. ``applies`` says whether a
switch changes anything for such a batch in that dtype on that device; where it does not, its
engine runs the defaults' code and its ratio is the run's noise.
"""

from __future__ import annotations

import random
import statistics
from typing import Callable, Iterable, Sequence

import torch

from mini_engine import LLMEngine, SamplingParams
from mini_engine.linear import can_prepack
from mini_engine.model import use_cascade, use_eager
from reference_server.dtypes import cpu_compute_dtype

DEFAULTS = "defaults"

# The server's flag for turning each technique off -> the engine's config for it.
SWITCHES: dict[str, dict[str, object]] = {
    "--no-prepack": {"prepack": False},
    "--kv-read slot": {"kv_read": "slot"},
    "--decode-attention sdpa": {"decode_attention": "sdpa"},
    "--no-cascade-attention": {"cascade_attention": False},
}


def engine_dtype() -> tuple[str, str]:
    """The device and dtype the course's server computes in on this machine: a GPU in bf16;
    else the CPU, in bf16 where it has native bf16 dot products and float32 where bf16 would
    be emulated (``reference_server.dtypes.cpu_compute_dtype``)."""
    if torch.cuda.is_available():
        return "cuda", "bfloat16"
    return "cpu", cpu_compute_dtype("bfloat16", "cpu")


def applies(flag: str, *, dtype: torch.dtype, device: str, batch: int, context: int,
            shared: int) -> bool:
    """Whether turning ``flag`` off changes the code a decode step of ``batch`` sequences over
    ``context`` keys each, ``shared`` of them common to all (whole blocks), runs."""
    if flag == "--no-prepack":
        return can_prepack(dtype, device)
    if flag == "--decode-attention sdpa":
        return use_eager("auto", dtype, batch, context)
    if flag == "--no-cascade-attention":
        return use_cascade(True, batch, shared)
    return flag in SWITCHES


def decoding(engine: LLMEngine, batch: int) -> bool:
    """Whether the last step decoded the whole batch and nothing else."""
    last = engine.history[-1] if engine.history else None
    return (last is not None and len(last.scheduled) == batch
            and all(kind == "decode" for _, _, kind in last.scheduled))


def decode_step_rows(model_path: str, *, dtype: str, device: str = "cpu", batch: int = 8,
                     shared_tokens: int = 640, own_tokens: int = 64, rounds: int = 8,
                     switches: Sequence[str] = tuple(SWITCHES), kv_cache_gib: float = 0.25,
                     seed: int = 0,
                     progress: Callable[[Iterable], Iterable] = lambda it: it
                     ) -> tuple[list[dict], dict[str, list[float]]]:
    """One row per variant (the defaults first): median decode-step time over ``rounds``
    round-robin steps, the ratio to the defaults' median (above 1: turning the technique off
    made steps slower), and whether its tokens matched the defaults' token for token; and
    every step's time in ms, by variant."""
    rng = random.Random(seed)
    system = [rng.randrange(1000, 30000) for _ in range(shared_tokens)]
    prompts = [system + [rng.randrange(1000, 30000) for _ in range(own_tokens)]
               for _ in range(batch)]
    variants = {DEFAULTS: {}, **{flag: SWITCHES[flag] for flag in switches}}
    engines: dict[str, LLMEngine] = {}
    for name in progress(list(variants)):
        engine = LLMEngine(model_path, dtype=dtype, device=device, prefix_cache="radix",
                           kv_cache_gib=kv_cache_gib, max_num_seqs=batch, **variants[name])
        params = SamplingParams(max_tokens=rounds + 256, temperature=0.0, ignore_eos=True)
        # The first prompt alone, so that the others find its system prompt in the cache and
        # every sequence's context starts with the same blocks.
        engine.add_request(prompts[0], params, request_id="0")
        while not engine.history or engine.history[-1].scheduled[0][2] != "decode":
            engine.step()
        for i, prompt in enumerate(prompts[1:], 1):
            engine.add_request(prompt, params, request_id=str(i))
        while not decoding(engine, batch):
            engine.step()
        engines[name] = engine
    step_ms: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {name: [] for name in engines}
    order = list(engines)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            out = engines[name].step()
            step_ms[name].append(1e3 * engines[name].history[-1].seconds)   # the engine's own clock
            tokens[name].append(sorted((o.request_id, tuple(o.new_token_ids)) for o in out))
    # What the attention rules see: the whole blocks the batch has in common, and the
    # context in whole blocks (as it is halfway through the timed steps)
    bs = engines[DEFAULTS].block_manager.block_size
    shared = shared_tokens // bs * bs
    context = -(-(shared_tokens + own_tokens + rounds // 2) // bs) * bs
    base = statistics.median(step_ms[DEFAULTS])
    rows = []
    for name in engines:
        ms = statistics.median(step_ms[name])
        rows.append({
            "variant": name,
            "applies here": name == DEFAULTS or applies(
                name, dtype=engines[name].runner.model.dtype, device=device, batch=batch,
                context=context, shared=shared),
            "ms per step": ms,
            "slower than defaults": ms / base,
            "same tokens": tokens[name] == tokens[DEFAULTS],
        })
    return rows, step_ms


def switches_figure(rows: Sequence[dict], step_ms: dict[str, list[float]], title: str):
    """Every decode step's time by variant (dots) and each variant's median (bar), the
    defaults' median as a dashed line; variants that run the defaults' code here in gray."""
    from workshop.plots import figure

    fig, ax = figure(title, "ms per decode step (dots: each step; bar: median; right: "
                     "median / the defaults')", "",
                     size=(7.5, 0.6 * len(rows) + 1.6))
    names = [r["variant"] for r in rows]
    for y, r in enumerate(rows):
        color = ("tab:blue" if r["variant"] == DEFAULTS else
                 "tab:orange" if r["applies here"] else "tab:gray")
        ax.barh(y, r["ms per step"], color=color, alpha=0.35, height=0.6)
        ax.plot(step_ms[r["variant"]], [y] * len(step_ms[r["variant"]]), "o", color=color,
                markersize=4)
        # the ratio in a column right of the axes, clear of the dots
        ax.text(1.01, y, f"{r['slower than defaults']:.2f}x", transform=ax.get_yaxis_transform(),
                va="center", fontsize=9, color=color)
    ax.axvline(rows[0]["ms per step"], color="tab:blue", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(rows)),
                  [n if r["applies here"] else f"{n}\n(same code here)" for n,
                   r in zip(names, rows)])
    ax.invert_yaxis()                     # the defaults on top, as in the table
    ax.set_xlim(left=0)
    return fig


def bytes_rows(rows: Sequence[dict], *, weight_bytes: float, kv_bytes_per_token: float,
               batch: int, shared: int, own: int) -> list[dict]:
    """Per variant of ``decode_step_rows``'s ``rows``: the MB a decode step moves if its time
    were memory traffic, those bytes over the defaults' bytes, and the measured time over the
    defaults' time. A step moves every weight once (three times without prepacking: the
    reorder reads and writes each weight before the matmul reads it) and the keys and values
    of each of ``batch`` sequences' ``shared`` + ``own`` tokens (the shared prompt's once per
    batch with cascade attention). A switch that does not apply (``applies here``) runs the
    defaults' code; ``--kv-read slot`` and ``--decode-attention sdpa`` move the defaults' bytes."""
    applied = {r["variant"]: r["applies here"] for r in rows}
    kv_each = batch * (shared + own) * kv_bytes_per_token
    kv_cascade = ((shared + batch * own) * kv_bytes_per_token
                  if applied.get("--no-cascade-attention") else kv_each)
    moved = {DEFAULTS: weight_bytes + kv_cascade,
             "--no-prepack": (3 if applied.get("--no-prepack") else 1) * weight_bytes + kv_cascade,
             "--no-cascade-attention": weight_bytes + kv_each}
    out = []
    for r in rows:
        b = moved.get(r["variant"], moved[DEFAULTS])
        out.append({"variant": r["variant"], "MB moved per step": b / 1e6,
                    "bytes / defaults'": b / moved[DEFAULTS],
                    "time / defaults'": r["slower than defaults"]})
    return out


__all__ = ["DEFAULTS", "SWITCHES", "engine_dtype", "applies", "decode_step_rows", "switches_figure",
           "bytes_rows"]
