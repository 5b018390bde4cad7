"""KV-cache arithmetic: bytes per token, what fits on a GPU, and what it costs.

Both directions of the capacity question: from a deployment (model, GPU, users, context) to
what fits, how fast it decodes at best and the cost per token (``plan``), and from a latency
target (time per output token) to the largest batch and its cost (``latency_plan``). Both
time a decode step the same way, ``decode_step``.

Everything here is plain arithmetic on numbers that are either read from a model's
``config.json`` (shipped in ``workshop/data/models``, each with its source URL) or from a GPU
datasheet (``workshop/data/gpus.json``). Notebook 02 checks the arithmetic against the live
engine's own report of its KV capacity.

Two things the usual online calculators get wrong, and this module does not:

* the cache stores keys and values only for the *KV heads* (grouped-query attention shares
  each KV head between several query heads), not for every attention head;
* the precision of the cache is a separate choice from the precision of the weights
  (int4 weights with a bf16 cache is the common case).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reference_server import dtypes, prometheus
from reference_server.kv import (engine_capacity_tokens, kv_bytes_per_sequence,  # noqa: F401
                                 kv_bytes_per_token, kv_values_per_token_per_layer)
from reference_server.model_config import ModelArch, count_safetensors_params, read_arch

DATA_DIR = Path(__file__).parent / "data"

# The precisions the calculator offers, by their short names (bytes from reference_server.dtypes).
WEIGHT_BYTES: dict[str, float] = {
    n: dtypes.lookup(n).bytes for n in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4")}
KV_BYTES: dict[str, float] = {n: dtypes.lookup(n).bytes for n in ("fp32", "bf16", "fp16", "fp8", "int8")}

GIB = 2**30


def list_models() -> list[str]:
    return sorted(p.stem for p in (DATA_DIR / "models").glob("*.json"))


def load_model(key: str) -> ModelArch:
    """A shipped config by file name, e.g. ``load_model("llama-3.1-8b")``."""
    path = DATA_DIR / "models" / f"{key}.json"
    if not path.exists():
        raise KeyError(f"no shipped config {key!r}; have {list_models()}")
    return read_arch(json.loads(path.read_text()))


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int
    bandwidth_bytes_s: float
    flops: float                    # dense bf16 (or fp16 where there is no bf16) FLOP/s
    price_usd_hour: float | None
    spec_source: str
    price_source: str


def gpu_memory_bytes(g: dict) -> int:
    """Total device memory of one ``gpus.json`` entry, in bytes.

    ``memory_mib`` (what nvidia-smi reports as memory.total) wins where the data has it.
    Otherwise the datasheet's ``memory_gb`` is taken as decimal GB (10^9 bytes), as
    vendors quote it: an estimate, since the usable total differs by part.
    """
    if g.get("memory_mib"):
        return int(g["memory_mib"]) * 2**20
    return int(g["memory_gb"] * 1e9)


def load_gpus() -> dict[str, GPU]:
    data = json.loads((DATA_DIR / "gpus.json").read_text())
    out = {}
    for g in data["gpus"]:
        out[g["name"]] = GPU(
            name=g["name"],
            memory_bytes=gpu_memory_bytes(g),
            bandwidth_bytes_s=g["bandwidth_gb_s"] * 1e9,
            flops=(g.get("bf16_tflops") or g["fp16_tflops"]) * 1e12,
            price_usd_hour=g.get("price_usd_hour"),
            spec_source=g["spec_source"],
            price_source=g.get("price_source", ""),
        )
    return out


# ---------------------------------------------------------------------------------------
# Bytes per token
# ---------------------------------------------------------------------------------------

def naive_kv_bytes_per_token(cfg: ModelArch, weight_dtype: str = "bf16") -> float:
    """The common mistake: one K and V per *attention* head, at the *weight* precision."""
    return 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * WEIGHT_BYTES[weight_dtype]


def engine_cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's ``vllm:cache_config_info`` gauge from a ``/metrics`` page.

    vLLM publishes its own view there: ``num_gpu_blocks``, ``block_size``, ``cache_dtype``,
    and (recent versions) ``kv_cache_memory_bytes``. Empty dict if the gauge is absent.
    """
    return prometheus.labels_of(metrics_text, prometheus.CACHE_CONFIG_INFO)


# ---------------------------------------------------------------------------------------
# Weights and decode-step traffic
# ---------------------------------------------------------------------------------------

def weight_bytes(cfg: ModelArch, weight_dtype: str = "bf16") -> float:
    return cfg.params * WEIGHT_BYTES[weight_dtype]


def weights_read_per_step(cfg: ModelArch, batch: int) -> float:
    """Parameters a decode step must read for ``batch`` tokens.

    Dense model: all of them, whatever the batch. Mixture-of-experts: the always-used part
    plus the experts at least one of the ``batch`` tokens was routed to. With uniform routing
    an expert is untouched by one token with probability 1 - k/E, by ``batch`` tokens with
    (1 - k/E)**batch. The expert and shared sizes follow from total and active counts:
    total - active = experts * (1 - k/E).
    """
    if not cfg.num_experts or cfg.active_params >= cfg.params:
        return float(cfg.params)
    frac = cfg.experts_per_token / cfg.num_experts
    experts = (cfg.params - cfg.active_params) / (1 - frac)
    shared = cfg.params - experts
    touched = 1 - (1 - frac) ** max(batch, 1)
    return shared + experts * touched


@dataclass(frozen=True)
class DecodeStep:
    """One decode step for ``batch`` users: what it must read and compute, and its time bounds.

    The roofline model of ``workshop/roofline.py`` applied to a whole step: it takes at least
    ``bytes_read / bandwidth`` and at least ``flops / peak FLOP/s``; the larger one bounds it.
    Each user gets one token per step, so the step time is the time per output token (TPOT).
    """
    batch: int
    bytes_read: float        # weights (routed experts only, for MoE) once + every user's KV cache
    flops: float             # 2 per active weight per token
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound_by(self) -> str:
        return "memory bandwidth" if self.memory_s >= self.compute_s else "compute"


def decode_step(cfg: ModelArch, gpu: GPU, batch: int, context: int, *,
                weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                num_gpus: int = 1) -> DecodeStep:
    """Bounds on one decode step of ``batch`` users who each hold ``context`` tokens.

    The weights are read once per step for everybody; each user's KV cache is read for that
    user alone. Tensor parallelism over ``num_gpus`` adds bandwidth and FLOP/s; communication
    is ignored, so the bounds are optimistic.
    """
    if batch < 1:
        raise ValueError("batch must be >= 1")
    bytes_read = (weights_read_per_step(cfg, batch) * WEIGHT_BYTES[weight_dtype]
                  + batch * kv_bytes_per_sequence(cfg, context, kv_dtype))
    flops = batch * 2 * cfg.active_params
    return DecodeStep(batch=batch, bytes_read=bytes_read, flops=flops,
                      memory_s=bytes_read / (gpu.bandwidth_bytes_s * num_gpus),
                      compute_s=flops / (gpu.flops * num_gpus))


def usd_per_million_tokens(price_usd_hour: float, num_gpus: int, tokens_per_s: float) -> float:
    """What a million output tokens cost when the GPUs are busy producing ``tokens_per_s``."""
    return price_usd_hour * num_gpus / (tokens_per_s * 3600) * 1e6


@dataclass(frozen=True)
class Plan:
    """What one deployment can do. Speeds are upper bounds from bandwidth and FLOP/s."""
    model: str
    gpu: str
    num_gpus: int
    weight_dtype: str
    kv_dtype: str
    context: int
    users: int
    weight_bytes: float
    kv_bytes_per_token: float        # averaged over the context (sliding layers included)
    kv_bytes_per_user: float
    memory_for_kv: float             # after weights and the reserved fraction
    fits: bool
    max_users: int                   # at this context
    max_context: int                 # for this many users
    step_bytes: float                # bytes read by one decode step for all users
    decode_tok_s_per_user: float     # bound: min(bandwidth, compute)
    decode_tok_s_total: float
    bound_by: str                    # "memory bandwidth" or "compute"
    usd_per_million_tokens: float | None


def plan(cfg: ModelArch, gpu: GPU, *, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
         context: int = 4096, users: int = 1, num_gpus: int = 1,
         memory_utilization: float = 0.9, price_usd_hour: float | None = None) -> Plan:
    """Does ``users`` x ``context`` fit, and how fast / cheap can decoding be at best?

    ``memory_utilization`` is the share of GPU memory the engine may use (vLLM's
    ``--gpu-memory-utilization``, default 0.9); activations and the CUDA context live in the
    rest. Tensor parallelism over ``num_gpus`` splits weights and KV and adds bandwidth and
    FLOP/s; communication costs are ignored, so the bounds are optimistic.
    """
    if users < 1 or context < 1:
        raise ValueError("users and context must be >= 1")
    memory = gpu.memory_bytes * num_gpus * memory_utilization
    w_bytes = weight_bytes(cfg, weight_dtype)
    kv_user = kv_bytes_per_sequence(cfg, context, kv_dtype)
    free = memory - w_bytes
    max_users = max(int(free // kv_user), 0) if free > 0 else 0
    max_ctx = max_context_for(cfg, free, users, kv_dtype)
    fits = free > 0 and users <= max_users and (not cfg.max_context or context <= cfg.max_context)

    step = decode_step(cfg, gpu, users, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                       num_gpus=num_gpus)
    per_user = 1 / step.seconds
    total = users * per_user
    price = price_usd_hour if price_usd_hour is not None else gpu.price_usd_hour
    cost = None if price is None or not fits else usd_per_million_tokens(price, num_gpus, total)
    return Plan(
        model=cfg.name, gpu=gpu.name, num_gpus=num_gpus, weight_dtype=weight_dtype,
        kv_dtype=kv_dtype, context=context, users=users, weight_bytes=w_bytes,
        kv_bytes_per_token=kv_user / context, kv_bytes_per_user=kv_user, memory_for_kv=free,
        fits=fits, max_users=max_users, max_context=max_ctx, step_bytes=step.bytes_read,
        decode_tok_s_per_user=per_user, decode_tok_s_total=total, bound_by=step.bound_by,
        usd_per_million_tokens=cost,
    )


def max_context_for(cfg: ModelArch, kv_space_bytes: float, users: int,
                    kv_dtype: str = "bf16") -> int:
    """Longest context such that ``users`` sequences fit in ``kv_space_bytes`` (0 if none).

    Bisection, because sliding-window layers make bytes-per-sequence non-linear in context.
    Capped at the model's ``max_position_embeddings`` when known.
    """
    if kv_space_bytes <= 0:
        return 0
    cap = cfg.max_context or 10**8
    def fits(n: int) -> bool:
        return users * kv_bytes_per_sequence(cfg, n, kv_dtype) <= kv_space_bytes
    if fits(cap):
        return cap
    return _bisect(fits, 0, cap)       # fits(0) is True (0 bytes), fits(cap) is False


def _bisect(meets, lo: int, hi: int) -> int:
    """Largest n in [lo, hi) with meets(n), given meets(lo), not meets(hi), and meets
    turning False once for good as n grows."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


# ---------------------------------------------------------------------------------------
# The other direction: from a latency target to a batch, users and cost
# ---------------------------------------------------------------------------------------

def max_batch_for_tpot(cfg: ModelArch, gpu: GPU, tpot_s: float, context: int, *,
                       weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1,
                       cap: int = 10**7) -> int:
    """Largest batch whose decode step (``decode_step``) takes at most ``tpot_s``; 0 if none.

    Memory is not considered here (``latency_plan`` does). A step only gets longer as the
    batch grows (more KV to read, more FLOPs, for MoE more experts touched), so a doubling
    search followed by bisection finds the edge.
    """
    def meets(batch: int) -> bool:
        return decode_step(cfg, gpu, batch, context, weight_dtype=weight_dtype,
                           kv_dtype=kv_dtype, num_gpus=num_gpus).seconds <= tpot_s
    if not meets(1):
        return 0
    lo, hi = 1, 2                  # meets(lo) is True
    while hi < cap and meets(hi):
        lo, hi = hi, 2 * hi
    if hi >= cap:
        return cap if meets(cap) else _bisect(meets, lo, cap)
    return _bisect(meets, lo, hi)


@dataclass(frozen=True)
class LatencyPlan:
    """How many users one deployment serves at a TPOT target, and what a token then costs."""
    model: str
    gpu: str
    num_gpus: int
    weight_dtype: str
    kv_dtype: str
    context: int
    tpot_target_s: float
    max_batch_latency: int           # largest batch meeting the target, memory aside
    max_batch_memory: int            # users whose KV cache fits next to the weights
    batch: int                       # the smaller of the two
    step: DecodeStep | None          # at ``batch`` (None when it is 0)
    usd_per_million_tokens: float | None
    model_max_context: int = 0       # 0: unknown

    @property
    def limited_by(self) -> str:
        if self.model_max_context and self.context > self.model_max_context:
            return "context: longer than the model's limit"
        if self.batch == 0:
            return ("memory: not even one user fits" if self.max_batch_memory == 0
                    else "latency: one user alone misses the target")
        return ("latency target" if self.max_batch_latency <= self.max_batch_memory
                else "KV-cache memory")

    @property
    def tpot_s(self) -> float | None:
        return self.step.seconds if self.step else None

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch / self.step.seconds if self.step else 0.0

    @property
    def users_per_gpu(self) -> float:
        return self.batch / self.num_gpus


def latency_plan(cfg: ModelArch, gpu: GPU, tpot_s: float, *, context: int = 4096,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1,
                 memory_utilization: float = 0.9,
                 price_usd_hour: float | None = None) -> LatencyPlan:
    """The inverse of ``plan``: from a TPOT target to the largest batch, users and cost.

    Memory follows ``plan`` (its ``max_users`` at this context; none beyond the model's
    context limit); the step time is ``decode_step``; the cost is the price of the GPUs
    over the tokens they produce at that batch, a lower bound like every figure here.
    """
    if tpot_s <= 0 or context < 1:
        raise ValueError("the TPOT target and the context must be > 0")
    by_memory = plan(cfg, gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype, context=context,
                     users=1, num_gpus=num_gpus, memory_utilization=memory_utilization).max_users
    if cfg.max_context and context > cfg.max_context:
        by_memory = 0
    by_latency = max_batch_for_tpot(cfg, gpu, tpot_s, context, weight_dtype=weight_dtype,
                                    kv_dtype=kv_dtype, num_gpus=num_gpus)
    batch = min(by_memory, by_latency)
    step = (decode_step(cfg, gpu, batch, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                        num_gpus=num_gpus) if batch else None)
    price = price_usd_hour if price_usd_hour is not None else gpu.price_usd_hour
    cost = (usd_per_million_tokens(price, num_gpus, batch / step.seconds)
            if step and price is not None else None)
    return LatencyPlan(model=cfg.name, gpu=gpu.name, num_gpus=num_gpus, weight_dtype=weight_dtype,
                       kv_dtype=kv_dtype, context=context, tpot_target_s=tpot_s,
                       max_batch_latency=by_latency, max_batch_memory=by_memory, batch=batch,
                       step=step, usd_per_million_tokens=cost,
                       model_max_context=cfg.max_context or 0)


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


__all__ = [
    "ModelArch", "GPU", "Plan", "WEIGHT_BYTES", "KV_BYTES", "load_model", "list_models",
    "load_gpus", "read_arch", "kv_bytes_per_token", "naive_kv_bytes_per_token",
    "kv_bytes_per_sequence", "kv_values_per_token_per_layer", "engine_capacity_tokens",
    "engine_cache_config", "count_safetensors_params", "served_model_config",
    "weight_bytes", "weights_read_per_step", "plan", "max_context_for",
    "human_bytes", "DecodeStep", "decode_step", "usd_per_million_tokens", "max_batch_for_tpot",
    "LatencyPlan", "latency_plan", "latency_rows", "plot_tpot_vs_batch",
]


# ---------------------------------------------------------------------------------------
# Notebook helpers: tables and figures built from the functions above
# ---------------------------------------------------------------------------------------

def model_rows(keys: list[str] | None = None, context: int = 32_768,
               kv_dtype: str = "bf16") -> list[dict]:
    """One row per shipped model: the config terms and what they imply for the cache."""
    rows = []
    for key in keys or list_models():
        cfg = load_model(key)
        per_token = kv_bytes_per_token(cfg, kv_dtype)
        ctx = min(context, cfg.max_context) if cfg.max_context else context
        if cfg.attention == "mla":
            terms = f"MLA: latent {cfg.kv_lora_rank} + RoPE key {cfg.qk_rope_head_dim}"
        else:
            terms = f"{cfg.num_kv_heads} KV heads x {cfg.head_dim} (of {cfg.num_heads} heads)"
        if cfg.num_sliding_layers:
            terms += f"; {cfg.num_sliding_layers} layers window {cfg.sliding_window}"
        rows.append({
            "model": f"[{cfg.name}]({cfg.source})",
            "layers": cfg.num_layers,
            "cached per layer": terms,
            f"KV B/token ({kv_dtype})": round(per_token),
            "naive B/token": round(naive_kv_bytes_per_token(cfg, kv_dtype)),
            "KV of one long conversation": (f"{human_bytes(kv_bytes_per_sequence(cfg, ctx, kv_dtype))}"
                                            f" at {ctx:,} tokens"),
            "weights (bf16)": human_bytes(weight_bytes(cfg, "bf16")),
        })
    return rows


def engine_check(cfg: ModelArch, cache_config: dict[str, str], server_info: dict) -> dict:
    """Compare our bytes/token with the engine's own block count for its KV memory.

    The engine (vLLM) sizes its cache in bytes and divides by its own per-block size; if our
    formula is right, ``floor(memory / (block_size x our bytes/token))`` is its block count.
    """
    block = int(cache_config.get("block_size") or server_info.get("block_size") or 16)
    dtype = cache_config.get("cache_dtype", "auto")
    kv_dtype = dtypes.canonical(dtype, server_info.get("dtype"), cfg.torch_dtype)
    ours = int(kv_bytes_per_token(cfg, kv_dtype))
    blocks = cache_config.get("num_gpu_blocks")
    memory = cache_config.get("kv_cache_memory_bytes")
    out = {"block_size": block, "cache_dtype": dtype, "our_bytes_per_token": ours,
           "engine_blocks": int(blocks) if blocks and blocks != "None" else None,
           "engine_capacity_tokens": server_info.get("kv_capacity_tokens"),
           "kv_memory_bytes": int(memory) if memory and memory != "None" else None}
    if out["kv_memory_bytes"] is not None:
        out["predicted_blocks"] = out["kv_memory_bytes"] // int(ours * block)
        out["predicted_capacity_tokens"] = engine_capacity_tokens(out["kv_memory_bytes"], ours, block)
        out["agrees"] = out["predicted_blocks"] == out["engine_blocks"]
    elif out["engine_blocks"] is not None:
        # No byte budget published (e.g. GPU sized by memory fraction): report what the
        # engine's block count means in bytes under our formula instead.
        out["implied_kv_memory_bytes"] = out["engine_blocks"] * block * ours
    return out


def gpu_rows(cfg: ModelArch, gpus: dict[str, GPU], *, weight_dtype: str, kv_dtype: str,
             context: int, users: int, num_gpus: int = 1) -> list[dict]:
    rows = []
    for g in gpus.values():
        p = plan(cfg, g, weight_dtype=weight_dtype, kv_dtype=kv_dtype, context=context,
                 users=users, num_gpus=num_gpus)
        rows.append({
            "GPU": f"{num_gpus} x {g.name}" if num_gpus > 1 else g.name,
            "fits": "yes" if p.fits else "no",
            "max users": p.max_users,
            f"max context ({users} users)": p.max_context,
            "tok/s per user (bound)": round(p.decode_tok_s_per_user, 1) if p.fits else None,
            "tok/s total (bound)": round(p.decode_tok_s_total) if p.fits else None,
            "$/hour (indicative)": g.price_usd_hour,
            "$ per M tokens (at best)": (round(p.usd_per_million_tokens, 3)
                                         if p.usd_per_million_tokens is not None else None),
        })
    return rows


def plot_users_vs_context(cfg: ModelArch, gpu: GPU, weight_dtype: str, num_gpus: int = 1,
                          contexts: list[int] | None = None):
    """Max simultaneous users against context: bf16 KV, fp8 KV, and the naive calculator."""
    from workshop.plots import figure
    top = cfg.max_context or 131_072
    contexts = contexts or [c for c in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
                                        131072) if c <= top]
    memory = gpu.memory_bytes * num_gpus * 0.9 - weight_bytes(cfg, weight_dtype)
    fig, ax = figure(f"{cfg.name} on {num_gpus} x {gpu.name}, weights {weight_dtype}",
                     "context per user (tokens)", "max simultaneous users")
    for kv_dtype, style in (("bf16", "o-"), ("fp8", "s-")):
        users = [max(int(memory // kv_bytes_per_sequence(cfg, c, kv_dtype)), 0) for c in contexts]
        ax.plot(contexts, users, style, label=f"KV cache {kv_dtype} (this module)")
    # The classic mistake: keys and values for every attention head (bf16 cache).
    heads = [max(int(memory // (naive_kv_bytes_per_token(cfg, "bf16") * c)), 0) for c in contexts]
    ax.plot(contexts, heads, "x--", color="tab:gray",
            label=f"mistake: K and V for all {cfg.num_heads} attention heads (bf16)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.legend()
    return fig


def latency_rows(cfg: ModelArch, gpus: dict[str, GPU], tpot_s: float, *, weight_dtype: str,
                 kv_dtype: str, context: int, num_gpus: int = 1) -> list[dict]:
    """``latency_plan`` for every GPU of the catalogue."""
    rows = []
    for g in gpus.values():
        lp = latency_plan(cfg, g, tpot_s, context=context, weight_dtype=weight_dtype,
                          kv_dtype=kv_dtype, num_gpus=num_gpus)
        rows.append({
            "GPU": f"{num_gpus} x {g.name}" if num_gpus > 1 else g.name,
            "max batch": lp.batch,
            "limited by": lp.limited_by,
            "users per GPU": round(lp.users_per_gpu, 1),
            "TPOT at that batch (ms)": round(lp.tpot_s * 1e3, 1) if lp.step else None,
            "tok/s total (bound)": round(lp.tokens_per_s_total) if lp.step else None,
            "$ per M tokens (at best)": (round(lp.usd_per_million_tokens, 3)
                                         if lp.usd_per_million_tokens is not None else None),
        })
    return rows


def plot_tpot_vs_batch(cfg: ModelArch, gpu: GPU, tpot_s: float, *, context: int,
                       weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1):
    """TPOT bound against batch size, with the target, the memory limit and the answer."""
    import numpy as np

    from workshop.plots import figure
    lp = latency_plan(cfg, gpu, tpot_s, context=context, weight_dtype=weight_dtype,
                      kv_dtype=kv_dtype, num_gpus=num_gpus)
    top = max(int(1.5 * max(lp.max_batch_latency, lp.max_batch_memory)), 8)
    batches = np.unique(np.linspace(1, top, 200).astype(int))
    steps = [decode_step(cfg, gpu, int(b), context, weight_dtype=weight_dtype,
                         kv_dtype=kv_dtype, num_gpus=num_gpus) for b in batches]
    gpus = f"{num_gpus} x {gpu.name}" if num_gpus > 1 else gpu.name
    fig, ax = figure(f"{cfg.name} on {gpus}: weights {weight_dtype}, KV {kv_dtype}, "
                     f"{context:,} tokens per user", "batch (users decoding together)",
                     "time per output token (ms)")
    # The bound is drawn wide and pale so that the part it follows stays visible on top.
    ax.plot(batches, [s.seconds * 1e3 for s in steps], "-", lw=6, alpha=0.3, color="tab:blue",
            label="TPOT bound = max(memory time, compute time)")
    ax.plot(batches, [s.memory_s * 1e3 for s in steps], "--", lw=1.3, color="navy",
            label="memory time: (weights read + batch x KV per user) / bandwidth")
    ax.plot(batches, [s.compute_s * 1e3 for s in steps], ":", lw=1.8, color="tab:purple",
            label="compute time: batch x 2 x active params / FLOP/s")
    ax.axhline(tpot_s * 1e3, color="tab:green", label=f"TPOT target {tpot_s * 1e3:g} ms")
    if lp.max_batch_memory < top:
        ax.axvline(lp.max_batch_memory, color="tab:red", linestyle="-.",
                   label=f"KV cache full: {lp.max_batch_memory:,} users")
    if lp.step:
        ax.plot([lp.batch], [lp.tpot_s * 1e3], "o", color="black", markersize=8,
                label=f"answer: batch {lp.batch:,} ({lp.limited_by})")
    ax.set_xlim(left=0)
    ax.set_ylim(0, max(2 * tpot_s * 1e3, min(steps[-1].seconds * 1e3, 4 * tpot_s * 1e3)))
    ax.legend(fontsize=8)
    return fig


def served_model_config(model_path: str, name: str | None = None) -> ModelArch:
    """The config of the model a server loaded: its own ``config.json`` and weights when the
    folder is on this machine, else the shipped config of the bundled model if that is it."""
    folder = Path(model_path)
    if (folder / "config.json").exists():
        return read_arch(folder, name=name or folder.name,
                         params=count_safetensors_params(folder))
    if "smollm2-135m" in model_path.lower():
        return load_model("smollm2-135m")
    raise ValueError(f"{model_path} is not a local folder and has no shipped config: copy its "
                     "config.json into workshop/data/models/ with a params field")
