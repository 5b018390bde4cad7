"""What fits on a GPU, how fast it can serve at best, and what a token costs.

Both directions of the capacity question: from a deployment (model, GPU, users, context) to
what fits, how fast it decodes at best and the cost per token (``plan``); from a target time
per output token to the largest batch and its cost (``latency_plan``); and from a target time
to first token to the prompts prefilled together, the request rate and its cost
(``ttft_plan``). Every step is timed the same way: the roofline model of
``workshop/compute/roofline.py`` applied to a whole batch (``decode_step``, ``prefill_step``).

Plain arithmetic on a model's config (``kvcache``) and a GPU's datasheet
(``workshop/data/gpus.json``); every speed is an upper bound and every cost a lower bound.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from reference_server.kv import kv_bytes_per_sequence
from reference_server.model_config import ModelArch
from workshop import DATA_DIR
from workshop.compute.roofline import prefill_flops, weights_read_per_step
from workshop.sizing.kvcache import WEIGHT_BYTES, weight_bytes


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int               # usable memory as the driver reports it (gpu_memory_bytes)
    bandwidth_bytes_s: float
    flops: float                    # dense bf16 (or fp16 where there is no bf16) FLOP/s
    price_usd_hour: float | None
    spec_source: str
    price_source: str
    memory_source: str = ""
    reserved_price_usd_hour: float | None = None   # a one-year commitment, where catalogued
    reserved_price_source: str = ""


def gpu_memory_bytes(g: dict) -> int:
    """The memory of one ``gpus.json`` entry, in bytes: the one place the catalogue's memory
    figure becomes bytes.

    "Memory" here is the **usable memory as the driver reports it**: nvidia-smi's
    ``memory.total`` (rocm-smi's VRAM total on AMD), the figure an engine's memory fraction
    (vLLM's ``gpu_memory_utilization``) is taken of. The catalogue keeps it as ``memory_mib``
    (MiB, 2^20 bytes, the unit the driver prints) next to the datasheet's ``memory_gb``. The
    datasheet figure is not converted: its "GB" of memory is a binary size of the chips
    (80 GB = 80 GiB), and the driver reports less (ECC on GDDR6 parts, the driver's own
    reservation), so neither 10^9 nor 2^30 bytes per "GB" gives the usable total.
    """
    if not g.get("memory_mib"):
        raise ValueError(f"gpus.json entry {g.get('name')!r} has no memory_mib (the total the "
                         "driver reports); add it with its memory_source")
    return int(g["memory_mib"]) * 2**20


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
            memory_source=g.get("memory_source", ""),
            reserved_price_usd_hour=g.get("reserved_price_usd_hour"),
            reserved_price_source=g.get("reserved_price_source", ""),
        )
    return out


# ---------------------------------------------------------------------------------------
# One step, bounded
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One forward pass of a batch: what it must read and compute, and its time bounds.

    The roofline model of ``workshop.compute.roofline`` applied to a whole step: it takes at least
    ``bytes_read / bandwidth`` and at least ``flops / peak FLOP/s``; the larger one bounds it.
    A decode step (``decode_step``) gives each of ``batch`` users one token, so its time is the
    time per output token (TPOT); a prefill step (``prefill_step``) processes ``batch`` whole
    prompts, so its time is their time to first token (TTFT) when they start together.
    """
    batch: int               # users decoding one token each, or prompts prefilled together
    bytes_read: float        # weights (routed experts only, for MoE) once + the KV read/written
    flops: float
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)

    @property
    def bound_by(self) -> str:
        return "memory bandwidth" if self.memory_s >= self.compute_s else "compute"


def _step(gpu: GPU, batch: int, bytes_read: float, flops: float, num_gpus: int) -> Step:
    # Tensor parallelism over ``num_gpus`` adds bandwidth and FLOP/s; communication is
    # ignored, so the bounds are optimistic.
    return Step(batch=batch, bytes_read=bytes_read, flops=flops,
                memory_s=bytes_read / (gpu.bandwidth_bytes_s * num_gpus),
                compute_s=flops / (gpu.flops * num_gpus))


def decode_step(cfg: ModelArch, gpu: GPU, batch: int, context: int, *,
                weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1) -> Step:
    """Bounds on one decode step of ``batch`` users who each hold ``context`` tokens.

    The weights are read once per step for everybody; each user's KV cache is read for that
    user alone; 2 FLOPs per active weight per token.
    """
    if batch < 1:
        raise ValueError("batch must be >= 1")
    bytes_read = (weights_read_per_step(cfg, batch) * WEIGHT_BYTES[weight_dtype]
                  + batch * kv_bytes_per_sequence(cfg, context, kv_dtype))
    return _step(gpu, batch, bytes_read, batch * 2 * cfg.active_params, num_gpus)


def prefill_step(cfg: ModelArch, gpu: GPU, prompts: int, prompt_len: int, *,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1) -> Step:
    """Bounds on prefilling ``prompts`` prompts of ``prompt_len`` tokens together.

    FLOPs: ``roofline.prefill_flops`` per prompt (2 per active weight per prompt token, the
    attention over the prompt, logits for the last token only). Bytes: the weights once (for
    mixture-of-experts, the experts all those tokens were routed to) and each prompt's KV cache
    written once.
    """
    if prompts < 1 or prompt_len < 1:
        raise ValueError("prompts and prompt_len must be >= 1")
    bytes_read = (weights_read_per_step(cfg, prompts * prompt_len) * WEIGHT_BYTES[weight_dtype]
                  + prompts * kv_bytes_per_sequence(cfg, prompt_len, kv_dtype))
    return _step(gpu, prompts, bytes_read, prompts * prefill_flops(cfg, prompt_len), num_gpus)


def usd_per_million_tokens(price_usd_hour: float, num_gpus: int, tokens_per_s: float) -> float:
    """What a million tokens cost when the GPUs are busy producing (or prefilling)
    ``tokens_per_s``."""
    return price_usd_hour * num_gpus / (tokens_per_s * 3600) * 1e6


def _cost(gpu: GPU, price_usd_hour: float | None, num_gpus: int,
          tokens_per_s: float) -> float | None:
    """``usd_per_million_tokens`` at the given price, else the catalogue's; None if neither."""
    price = price_usd_hour if price_usd_hour is not None else gpu.price_usd_hour
    return None if price is None else usd_per_million_tokens(price, num_gpus, tokens_per_s)


@dataclass(frozen=True)
class Deployment:
    """What every plan is about: a model on ``num_gpus`` GPUs, at these precisions."""
    model: str
    gpu: str
    num_gpus: int
    weight_dtype: str
    kv_dtype: str


# ---------------------------------------------------------------------------------------
# From a deployment to what fits, its speed and its cost
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan(Deployment):
    """What one deployment can do. Speeds are upper bounds from bandwidth and FLOP/s."""
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
    cost = _cost(gpu, price_usd_hour, num_gpus, total) if fits else None
    return Plan(
        model=cfg.name, gpu=gpu.name, num_gpus=num_gpus, weight_dtype=weight_dtype,
        kv_dtype=kv_dtype, context=context, users=users, weight_bytes=w_bytes,
        kv_bytes_per_token=kv_user / context, kv_bytes_per_user=kv_user, memory_for_kv=free,
        fits=fits, max_users=max_users, max_context=max_ctx, step_bytes=step.bytes_read,
        decode_tok_s_per_user=per_user, decode_tok_s_total=total, bound_by=step.bound_by,
        usd_per_million_tokens=cost,
    )


def max_users_for(cfg: ModelArch, gpu: GPU, context: int, *, weight_dtype: str = "bf16",
                  kv_dtype: str = "bf16", num_gpus: int = 1,
                  memory_utilization: float = 0.9) -> int:
    """Users of ``context`` tokens whose KV cache fits next to the weights (``plan``'s
    ``max_users``); none beyond the model's context limit."""
    if cfg.max_context and context > cfg.max_context:
        return 0
    return plan(cfg, gpu, weight_dtype=weight_dtype, kv_dtype=kv_dtype, context=context,
                users=1, num_gpus=num_gpus, memory_utilization=memory_utilization).max_users


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


def _largest(meets, cap: int = 10**7) -> int:
    """Largest n in [1, cap] with meets(n), 0 if not even meets(1); meets turns False once for
    good as n grows (a step only gets longer with a bigger batch). Doubling, then bisection."""
    if not meets(1):
        return 0
    lo, hi = 1, 2                  # meets(lo) is True
    while hi < cap and meets(hi):
        lo, hi = hi, 2 * hi
    if hi >= cap:
        return cap if meets(cap) else _bisect(meets, lo, cap)
    return _bisect(meets, lo, hi)


# ---------------------------------------------------------------------------------------
# From a TPOT target to a batch, users and cost
# ---------------------------------------------------------------------------------------

def _limited_by(length: int, model_max_context: int, n: int, by_latency: int, by_memory: int,
                what: str) -> str:
    """Why a target plan stops at ``n`` (users or prompts of ``length`` tokens)."""
    if model_max_context and length > model_max_context:
        return "context: longer than the model's limit"
    if n == 0:
        return (f"memory: not even one {what} fits" if by_memory == 0
                else f"latency: one {what} alone misses the target")
    return "latency target" if by_latency <= by_memory else "KV-cache memory"


def max_batch_for_tpot(cfg: ModelArch, gpu: GPU, tpot_s: float, context: int, *,
                       weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1,
                       cap: int = 10**7) -> int:
    """Largest batch whose decode step (``decode_step``) takes at most ``tpot_s``; 0 if none.

    Memory is not considered here (``latency_plan`` does).
    """
    return _largest(lambda batch: decode_step(
        cfg, gpu, batch, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
        num_gpus=num_gpus).seconds <= tpot_s, cap)


@dataclass(frozen=True)
class LatencyPlan(Deployment):
    """How many users one deployment serves at a TPOT target, and what a token then costs."""
    context: int
    tpot_target_s: float
    max_batch_latency: int           # largest batch meeting the target, memory aside
    max_batch_memory: int            # users whose KV cache fits next to the weights
    batch: int                       # the smaller of the two
    step: Step | None                # at ``batch`` (None when it is 0)
    usd_per_million_tokens: float | None
    model_max_context: int = 0       # 0: unknown

    @property
    def limited_by(self) -> str:
        return _limited_by(self.context, self.model_max_context, self.batch,
                           self.max_batch_latency, self.max_batch_memory, "user")

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

    Memory follows ``plan`` (``max_users_for``); the step time is ``decode_step``; the cost
    is the price of the GPUs over the tokens they produce at that batch, a lower bound like
    every figure here.
    """
    if tpot_s <= 0 or context < 1:
        raise ValueError("the TPOT target and the context must be > 0")
    by_memory = max_users_for(cfg, gpu, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                              num_gpus=num_gpus, memory_utilization=memory_utilization)
    by_latency = max_batch_for_tpot(cfg, gpu, tpot_s, context, weight_dtype=weight_dtype,
                                    kv_dtype=kv_dtype, num_gpus=num_gpus)
    batch = min(by_memory, by_latency)
    step = (decode_step(cfg, gpu, batch, context, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                        num_gpus=num_gpus) if batch else None)
    cost = _cost(gpu, price_usd_hour, num_gpus, batch / step.seconds) if step else None
    return LatencyPlan(model=cfg.name, gpu=gpu.name, num_gpus=num_gpus, weight_dtype=weight_dtype,
                       kv_dtype=kv_dtype, context=context, tpot_target_s=tpot_s,
                       max_batch_latency=by_latency, max_batch_memory=by_memory, batch=batch,
                       step=step, usd_per_million_tokens=cost,
                       model_max_context=cfg.max_context or 0)


# ---------------------------------------------------------------------------------------
# From a TTFT target to the prompts prefilled together, the request rate and the cost
# ---------------------------------------------------------------------------------------

def max_prompts_for_ttft(cfg: ModelArch, gpu: GPU, ttft_s: float, prompt_len: int, *,
                         weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1,
                         cap: int = 10**7) -> int:
    """Most prompts of ``prompt_len`` tokens that one prefill step (``prefill_step``) finishes
    within ``ttft_s``; 0 if not even one. Memory is not considered here (``ttft_plan`` does)."""
    return _largest(lambda prompts: prefill_step(
        cfg, gpu, prompts, prompt_len, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
        num_gpus=num_gpus).seconds <= ttft_s, cap)


@dataclass(frozen=True)
class PrefillPlan(Deployment):
    """How many prompts one deployment prefills within a TTFT target, and at what rate and cost.

    ``together``: prompts that arrive at once, prefilled in one step within the target. A
    stream of requests is less lucky: one that arrives while a prefill step runs waits for it,
    then for its own step, so its TTFT is up to twice a step. ``stream``: the largest step
    within half the target; back to back, such steps sustain ``requests_per_s``.
    """
    prompt_len: int
    ttft_target_s: float
    max_prompts_latency: int         # prompts prefilled together within the target, memory aside
    max_prompts_memory: int          # prompts whose KV cache fits next to the weights
    together: int                    # the smaller of the two
    together_step: Step | None       # None when ``together`` is 0
    stream: int                      # the same within half the target (and memory)
    stream_step: Step | None         # None when ``stream`` is 0
    usd_per_million_prompt_tokens: float | None      # at ``requests_per_s``
    model_max_context: int = 0       # 0: unknown

    @property
    def limited_by(self) -> str:
        return _limited_by(self.prompt_len, self.model_max_context, self.together,
                           self.max_prompts_latency, self.max_prompts_memory, "prompt")

    @property
    def requests_per_s(self) -> float:
        """Requests per second a stream can bring, each answered within the target."""
        return self.stream / self.stream_step.seconds if self.stream_step else 0.0

    @property
    def requests_per_s_per_gpu(self) -> float:
        return self.requests_per_s / self.num_gpus

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.requests_per_s * self.prompt_len


def ttft_plan(cfg: ModelArch, gpu: GPU, ttft_s: float, *, prompt_len: int = 2048,
              weight_dtype: str = "bf16", kv_dtype: str = "bf16", num_gpus: int = 1,
              memory_utilization: float = 0.9,
              price_usd_hour: float | None = None) -> PrefillPlan:
    """From a TTFT target to the prompts prefilled together, the request rate and the cost.

    The step time is ``prefill_step``; memory follows ``plan`` (the prompts' KV caches must
    fit next to the weights). The GPUs are taken to do nothing but prefill, so the rate is an
    upper bound and the cost per million prompt tokens a lower bound: decoding the answers
    takes GPU time too (``latency_plan``).
    """
    if ttft_s <= 0 or prompt_len < 1:
        raise ValueError("the TTFT target and the prompt length must be > 0")
    by_memory = max_users_for(cfg, gpu, prompt_len, weight_dtype=weight_dtype,
                              kv_dtype=kv_dtype, num_gpus=num_gpus,
                              memory_utilization=memory_utilization)
    deployment = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, num_gpus=num_gpus)

    def within(target: float) -> tuple[int, int, Step | None]:
        by_latency = max_prompts_for_ttft(cfg, gpu, target, prompt_len, **deployment)
        n = min(by_memory, by_latency)
        return by_latency, n, prefill_step(cfg, gpu, n, prompt_len, **deployment) if n else None

    by_latency, together, together_step = within(ttft_s)
    _, stream, stream_step = within(ttft_s / 2)
    cost = (_cost(gpu, price_usd_hour, num_gpus, stream / stream_step.seconds * prompt_len)
            if stream_step else None)
    return PrefillPlan(model=cfg.name, gpu=gpu.name, num_gpus=num_gpus,
                       weight_dtype=weight_dtype, kv_dtype=kv_dtype, prompt_len=prompt_len,
                       ttft_target_s=ttft_s, max_prompts_latency=by_latency,
                       max_prompts_memory=by_memory, together=together,
                       together_step=together_step, stream=stream, stream_step=stream_step,
                       usd_per_million_prompt_tokens=cost,
                       model_max_context=cfg.max_context or 0)


# ---------------------------------------------------------------------------------------
# From a demand and one replica's measured throughput to a fleet and its monthly bill
# ---------------------------------------------------------------------------------------

HOURS_PER_MONTH = 730.0             # 365 * 24 / 12


@dataclass(frozen=True)
class FleetOption:
    name: str
    reserved_replicas: int          # paid every hour of the month
    on_demand_gpu_hours: float      # paid only while running
    gpu_hours: float                # both, per month
    usd_month: float
    usd_per_million_tokens: float   # over the tokens actually served in the month


@dataclass(frozen=True)
class FleetPlan:
    """A day of two levels: ``peak_hours`` at the peak rate, the rest at the base rate,
    averaging ``tokens_per_day``."""
    mean_tokens_per_s: float
    peak_tokens_per_s: float
    base_tokens_per_s: float
    replicas_peak: int
    replicas_base: int
    options: tuple[FleetOption, ...]


def replicas_for(tokens_per_s: float, tokens_per_s_per_replica: float) -> int:
    """Replicas that keep up with ``tokens_per_s`` when each serves at most
    ``tokens_per_s_per_replica`` (the measured throughput within the latency objective)."""
    if tokens_per_s_per_replica <= 0:
        raise ValueError("tokens_per_s_per_replica must be > 0")
    return math.ceil(tokens_per_s / tokens_per_s_per_replica - 1e-9) if tokens_per_s > 0 else 0


def fleet_plan(tokens_per_day: float, peak_to_mean: float, peak_hours: float,
               tokens_per_s_per_replica: float, on_demand_usd_hour: float,
               reserved_usd_hour: float, gpus_per_replica: int = 1) -> FleetPlan:
    """Three ways to pay for the same demand: every replica reserved for the peak; every
    replica on demand, started and stopped with the two levels (no start-up time, no
    minimum billing: the best case for on-demand); the base reserved and the peak's extra
    on demand. Cost per million tokens is the month's bill over the month's tokens, so idle
    reserved hours count in it (``usd_per_million_tokens`` is the floor, every replica busy)."""
    if peak_to_mean < 1 or not 0 < peak_hours <= 24:
        raise ValueError("peak_to_mean must be >= 1 and peak_hours in (0, 24]")
    if peak_hours * peak_to_mean > 24 + 1e-9:
        raise ValueError(f"{peak_hours:g} h a day at {peak_to_mean:g}x the mean is more than a "
                         f"day's tokens: at most {24 / peak_to_mean:.3g} h at that ratio")
    mean = tokens_per_day / 86400.0
    peak = mean * peak_to_mean
    base = (mean * 24 - peak * peak_hours) / (24 - peak_hours) if peak_hours < 24 else peak
    base = max(base, 0.0)
    n_peak = replicas_for(peak, tokens_per_s_per_replica)
    n_base = replicas_for(base, tokens_per_s_per_replica)
    days = HOURS_PER_MONTH / 24
    tokens_month = tokens_per_day * days
    on_demand_hours = days * (peak_hours * n_peak + (24 - peak_hours) * n_base)
    extra_hours = days * peak_hours * (n_peak - n_base)

    def option(name: str, reserved: int, od_hours: float) -> FleetOption:
        usd = gpus_per_replica * (reserved * HOURS_PER_MONTH * reserved_usd_hour
                                  + od_hours * on_demand_usd_hour)
        return FleetOption(name, reserved, od_hours,
                           gpus_per_replica * (reserved * HOURS_PER_MONTH + od_hours), usd,
                           usd / (tokens_month / 1e6) if tokens_month > 0 else float("nan"))

    return FleetPlan(mean, peak, base, n_peak, n_base, (
        option("all reserved for the peak", n_peak, 0.0),
        option("all on demand, following the day", 0, on_demand_hours),
        option("base reserved, peak on demand", n_base, extra_hours),
    ))


__all__ = [
    "GPU", "gpu_memory_bytes", "load_gpus", "Step", "decode_step", "prefill_step",
    "usd_per_million_tokens", "Deployment", "Plan", "plan", "max_users_for", "max_context_for",
    "max_batch_for_tpot", "LatencyPlan", "latency_plan", "max_prompts_for_ttft", "PrefillPlan",
    "ttft_plan", "HOURS_PER_MONTH", "FleetOption", "FleetPlan", "replicas_for", "fleet_plan",
]
