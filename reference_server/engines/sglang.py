"""SGLang as a child process: its own OpenAI server, started, watched and proxied to.

Like vLLM (``vllm.py``) it runs as a supervised child on loopback behind a random key of its
own, but from its OWN virtual environment: SGLang and vLLM pin conflicting versions of torch,
transformers and openai. ``scripts/setup.sh --with-sglang`` builds ``.venv-sglang``; the
engine uses its interpreter unless ``--engine-python`` names another.

What differs from vLLM, and why:

* The key. SGLang reads its key from ``--api-key`` only (no environment variable); a flag
  would show in ``ps``. It also reads a YAML ``--config`` file, so the key goes there: a file
  only this user can read, in a private folder, deleted as soon as the child is up (SGLang
  reads it while parsing its arguments, before it loads anything). SGLang logs its whole
  configuration, key included, at ``info`` level: the child logs at ``warning`` unless the
  server runs at ``debug``.
* The key's reach. SGLang's own check leaves ``/health*``, ``/metrics*`` and WebSockets
  open, so the child runs through ``sglang_launch``, SGLang's launcher plus our
  ``ChildKeyGuard`` on every path.
* Token ids. A prompt token id outside the vocabulary killed SGLang 0.5.18 (the whole
  server), so ids are checked here, against the checkpoint's ``vocab_size``, before they
  are forwarded; so are ``stop_token_ids`` and ``logit_bias`` keys.
* Metrics. SGLang exports its own names (``sglang:token_usage``, ...); ``vllm_metrics``
  adds the same quantities under vLLM's names, which every reader of this project uses.
* ``/server_info`` is filled from SGLang's own ``/server_info`` (``/get_server_info`` before
  0.5.18), field by field: SGLang's answer includes its key and address.

On a CPU it runs SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, the kernel library built
by the setup script) as SGLang's CPU documentation does: its ``intel_amx`` attention backend
with the radix cache on, on a Xeon with AMX, the CPUs that documentation targets. Elsewhere
``intel_amx`` does not run, so it takes ``torch_native`` attention, and every figure
carries ``SUPPORT_NOTE``: SGLang's CPU engine has no float32. (This server once turned the
radix cache off on AMX because ``torch_native`` flipped a near tie once a short prompt was
cached: not a bug, ``docs/near_ties.md``.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from reference_server import dtypes
from reference_server import prometheus as P
from reference_server.config import ServerConfig
from reference_server.engines.base import EngineDied, EngineError, EngineInfo
from reference_server.engines.proxy import PROJECT_ROOT, ProxyEngine
from reference_server.kv import kv_bytes_per_token
from reference_server.model_config import read_arch
from reference_server.models import ModelSpec
from reference_server.protocol import OpenAIRequest

log = logging.getLogger("reference_server")

# Where `scripts/setup.sh --with-sglang` puts SGLang's environment (WORKSHOP_SGLANG_VENV moves it).
DEFAULT_VENV = ".venv-sglang"
CPU_MAX_RUNNING = 32      # the CPU recipe's setting (shared/SGLANG_CPU.md)
SUPPORT_NOTE = ("outside SGLang's supported CPUs: its CPU engine targets Xeons with AMX (its "
                "intel_amx attention) and has no float32, so here it runs torch_native attention "
                "in bfloat16, emulated where the CPU lacks native bf16")


def support_note(device: str, amx: bool) -> str | None:
    """``SUPPORT_NOTE`` where SGLang runs outside the CPUs it supports: a CPU without AMX."""
    return SUPPORT_NOTE if device == "cpu" and not amx else None


def cpu_attention(amx: bool) -> str:
    """SGLang's CPU attention backend for this CPU: its documented ``intel_amx`` where the tiles
    are, ``torch_native`` (the one that runs without them) elsewhere."""
    return "intel_amx" if amx else "torch_native"


def default_python(env: dict | None = None, root: str = PROJECT_ROOT) -> str:
    """The interpreter of SGLang's own environment if the setup script built one, else ours."""
    env = os.environ if env is None else env
    venv = Path(env.get("WORKSHOP_SGLANG_VENV") or DEFAULT_VENV)
    python = (venv if venv.is_absolute() else Path(root) / venv) / "bin" / "python"
    return str(python) if python.exists() else sys.executable


def not_installed(python: str | None = None) -> str | None:
    """Why SGLang cannot start from ``python`` (default: ``default_python()``), or None.
    Its kernel library is imported too: one built for another CPU dies there (SIGILL)."""
    python = python or default_python()
    try:
        probe = subprocess.run([python, "-c", "import sglang, sgl_kernel"], capture_output=True,
                               timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"SGLang could not be probed with {python}: {e}"
    if probe.returncode == 0:
        return None
    return (f"SGLang (with its kernel library) does not import in {python}: run "
            "`bash scripts/setup.sh --with-sglang` (it builds .venv-sglang), or point "
            "--engine-python at an interpreter that has it")


def engine_arg(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``; the last one wins, as
    with argparse), or None."""
    value = None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            value = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(args):
            value = args[i + 1]
    return value


def kv_tokens_for(kv_cache_gib: float, bytes_per_token: float) -> int:
    """Tokens that fit in ``kv_cache_gib`` GiB of KV cache (SGLang's ``--max-total-tokens``;
    its CPU engine has a page size of 1, so no rounding to blocks)."""
    return int(kv_cache_gib * 2**30 // bytes_per_token)


def cpu_mem_fraction(kv_bytes: float, weight_bytes: float, available_bytes: float) -> float:
    """SGLang's ``--mem-fraction-static`` on a CPU, so that the KV cache asked for fits.

    SGLang sizes its KV pool as the memory free after loading the weights minus
    ``(1 - fraction)`` of the memory free before; ``--max-total-tokens`` then caps the pool.
    A fraction covering weights + KV + 3 GiB (torch itself, activations, and what other
    processes take meanwhile: with 1 GiB a busy 2-core machine got half the KV cache asked
    for) makes the cap what counts, so the capacity is what ``--kv-cache-gib`` says, not
    whatever memory happened to be free.
    """
    want = (kv_bytes + weight_bytes + 3 * 2**30) / available_bytes
    return round(min(0.9, max(0.05, want)), 3)


def weight_bytes(folder: str) -> int:
    """Bytes of the checkpoint's weight files in ``folder`` (0 when there are none)."""
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin")
               for f in Path(folder).glob(pattern))


def out_of_vocabulary(body: dict, vocab_size: int) -> tuple[str, int] | None:
    """The first token id in ``body`` that the model does not have: ``(param, id)``, or None.

    Token ids reach the engine as a prompt (a list of ints), as ``stop_token_ids`` and as the
    keys of ``logit_bias``; negative ids are refused by the schema already.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        top = max(prompt)
        if top >= vocab_size:
            return "prompt", top
    stops = body.get("stop_token_ids") or []
    if stops and max(stops) >= vocab_size:
        return "stop_token_ids", max(stops)
    bias = body.get("logit_bias")
    if isinstance(bias, dict):
        for key in bias:
            try:
                tid = int(key)
            except (TypeError, ValueError):
                return "logit_bias", key     # not a token id at all
            if not 0 <= tid < vocab_size:
                return "logit_bias", tid
    return None


# SGLang's metric -> vLLM's, for the quantities both report (prometheus.py holds the names).
_GAUGES = [  # (vLLM name, SGLang name, how several samples combine, help)
    (P.NUM_REQUESTS_RUNNING, P.SGLANG_NUM_RUNNING, "sum", "Requests in the running batch."),
    (P.NUM_REQUESTS_WAITING, P.SGLANG_NUM_QUEUED, "sum", "Requests waiting to be scheduled."),
    (P.KV_CACHE_USAGE, P.SGLANG_TOKEN_USAGE, "mean",
     "KV-cache usage, 0 to 1 (tokens held by requests; cached prefixes no request uses are free)."),
]
_COUNTERS = [
    (P.PROMPT_TOKENS, P.SGLANG_PROMPT_TOKENS, "Prompt tokens processed."),
    (P.GENERATION_TOKENS, P.SGLANG_GENERATION_TOKENS, "Tokens generated."),
    # SGLang looks every prompt token up in its radix tree and reports the hits per request
    # (its cache report): queries are the prompt tokens, hits the cached ones.
    (P.PREFIX_CACHE_QUERIES, P.SGLANG_PROMPT_TOKENS,
     "Prompt tokens looked up in the prefix cache (counted when the request finishes)."),
    (P.PREFIX_CACHE_HITS, P.SGLANG_CACHED_TOKENS,
     "Prompt tokens found in the prefix cache (counted when the request finishes)."),
    # SGLang's name for a preemption: a running request retracted for lack of KV space.
    (P.NUM_PREEMPTIONS, P.SGLANG_NUM_RETRACTED,
     "Requests preempted (retracted) for lack of KV space."),
]
_HISTOGRAMS = [
    (P.TIME_TO_FIRST_TOKEN, P.SGLANG_TIME_TO_FIRST_TOKEN, "Time to first token."),
    (P.INTER_TOKEN_LATENCY, P.SGLANG_INTER_TOKEN_LATENCY, "Time between output tokens."),
    (P.E2E_REQUEST_LATENCY, P.SGLANG_E2E_REQUEST_LATENCY, "Request latency, end to end."),
]


class _Translated:
    def __init__(self, samples: list[P.Sample], model_name: str) -> None:
        self.samples, self.model_name = samples, model_name

    def collect(self):
        by_name: dict[str, list[P.Sample]] = {}
        for s in self.samples:
            by_name.setdefault(s.name, []).append(s)
        labels, values = ["model_name"], [self.model_name]
        for name, source, how, doc in _GAUGES:
            found = [s.value for s in by_name.get(source, [])]
            value = sum(found) if how == "sum" else (sum(found) / len(found) if found else 0.0)
            used = sum(s.value for s in by_name.get(P.SGLANG_NUM_USED_TOKENS, []))
            total = sum(s.value for s in by_name.get(P.SGLANG_MAX_TOTAL_TOKENS, []))
            if name == P.KV_CACHE_USAGE and total > 0:
                # sglang:token_usage is rounded to 0.01: one short request in a 46k-token
                # cache reads 0. The token counts it comes from are exact.
                value, source = (used / total,
                                 f"{P.SGLANG_NUM_USED_TOKENS} / {P.SGLANG_MAX_TOTAL_TOKENS}")
            g = GaugeMetricFamily(name, f"{doc} From {source}.", labels=labels)
            g.add_metric(values, value)
            yield g
        for name, source, doc in _COUNTERS:
            c = CounterMetricFamily(name.removesuffix("_total"), f"{doc} From {source}.",
                                    labels=labels)
            c.add_metric(values, sum(s.value for s in by_name.get(source, [])))
            yield c
        for name, source, doc in _HISTOGRAMS:
            buckets: dict[float, float] = {}
            for s in by_name.get(source + "_bucket", []):
                le = float(s.labels.get("le", "nan"))
                if not math.isnan(le):
                    buckets[le] = buckets.get(le, 0.0) + s.value
            if not buckets:
                continue        # SGLang has observed nothing yet: no series to report
            total = sum(s.value for s in by_name.get(source + "_sum", []))
            h = HistogramMetricFamily(name, f"{doc} From {source}.", labels=labels)
            h.add_metric(values, [(_le(le), n) for le, n in sorted(buckets.items())], total)
            yield h


def _le(edge: float) -> str:
    return "+Inf" if math.isinf(edge) else repr(edge)


def vllm_metrics(sglang_text: str, model_name: str) -> str:
    """SGLang's ``/metrics`` text, with the quantities vLLM also reports added under vLLM's
    names (summed over SGLang's label sets, e.g. streaming or not); SGLang's own lines follow
    unchanged. A page without SGLang metrics (``--enable-metrics`` off) gains nothing."""
    samples = P.parse(sglang_text)
    if not any(s.name.startswith("sglang:") for s in samples):
        return sglang_text
    registry = CollectorRegistry()
    registry.register(_Translated(samples, model_name))
    return generate_latest(registry).decode() + sglang_text


# What /server_info may repeat from SGLang's own: settings and sizes, never its key, address,
# ports or paths of files it reads.
INFO_FIELDS = ("attention_backend", "chunked_prefill_size", "mem_fraction_static",
               "max_running_requests", "max_total_num_tokens", "max_prefill_tokens",
               "schedule_policy", "page_size", "kv_cache_dtype", "disable_radix_cache",
               "disable_overlap_schedule", "context_length", "max_req_input_len")


class SGLangEngine(ProxyEngine):
    name = "sglang"
    reserved_args = {
        **ProxyEngine.reserved_args,
        "--config": "the server passes the child's key in a --config file of its own",
        # SGLang checks no key at all with several tokenizer workers (nor can our guard)
        "--tokenizer-worker-num": "the child's key is checked only with one tokenizer worker",
    }

    def __init__(self, config: ServerConfig, model: ModelSpec) -> None:
        super().__init__(config, model)
        if config.engine_python is None:
            self.python = default_python()
        self.device = config.resolved_device()
        # SGLang's argument parser would take a key starting with "-" for a flag.
        self.child_key = "sgl-" + self.child_key
        self._config_dir: str | None = None
        self._aborts: set[asyncio.Task] = set()
        self._sglang: dict = {}          # the fields of SGLang's /server_info we repeat
        self._version = "unknown"
        self.arch = read_arch(model.path) if (Path(model.path) / "config.json").exists() else None
        self.prefix_caching = config.enable_prefix_caching
        amx = self.device == "cpu" and dtypes.cpu_has_amx()
        chosen = engine_arg(config.engine_args, "--attention-backend")
        self.attention = chosen or (cpu_attention(amx) if self.device == "cpu" else None)
        self.support_note = support_note(self.device, amx)
        if self.support_note:
            log.warning(self.support_note)

    @property
    def max_total_tokens(self) -> int | None:
        """KV capacity to ask for (``--kv-cache-gib`` in tokens; unknown for a hub id)."""
        if self.arch is None:
            return None
        return kv_tokens_for(self.config.kv_cache_gib,
                             kv_bytes_per_token(self.arch, dtypes.canonical(
                                 self.config.dtype, self.arch.torch_dtype)))

    def command(self) -> list[str]:
        c = self.config
        cmd = [self.python, "-m", "reference_server.engines.sglang_launch",
               "--model-path", self.model.path, "--served-model-name", self.served_name,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--dtype", c.dtype, "--context-length", str(c.max_model_len),
               "--enable-metrics", "--enable-cache-report",   # cached-token counts in "usage"
               # Its running/KV gauges are refreshed every N decode steps (default 40): at CPU
               # speed that is seconds, so a reader mid-request saw the previous request's
               # values (seen: a test waiting for "1 running" timed out on a 2-core AVX2 CPU).
               "--decode-log-interval", "1",
               "--log-level", "debug" if c.log_level == "debug" else "warning"]
        if self._config_dir:
            cmd += ["--config", os.path.join(self._config_dir, "key.yaml")]
        if not self.prefix_caching:
            cmd.append("--disable-radix-cache")
        if self.device == "cpu":
            fraction = c.gpu_memory_utilization
            if not fraction and self.max_total_tokens:
                import psutil
                fraction = cpu_mem_fraction(c.kv_cache_gib * 2**30, weight_bytes(self.model.path),
                                            psutil.virtual_memory().available)
            if not engine_arg(c.engine_args, "--attention-backend"):
                cmd += ["--attention-backend", self.attention]
            cmd += ["--device", "cpu", "--disable-overlap-schedule",
                    "--mem-fraction-static", str(fraction or 0.05),   # 0.05: the recipe's
                    "--max-running-requests", str(CPU_MAX_RUNNING),
                    # Its scheduler otherwise polls without pause while idle: most of a core
                    # on a 2-core machine, taken from everything else running there.
                    "--sleep-on-idle"]
            if self.max_total_tokens:
                cmd += ["--max-total-tokens", str(self.max_total_tokens)]
        elif c.gpu_memory_utilization:
            cmd += ["--mem-fraction-static", str(c.gpu_memory_utilization)]
        return cmd + list(c.engine_args)

    def env(self) -> dict[str, str]:
        env = super().env()
        if self.device == "cpu":
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        # SGLang's /health otherwise queues a one-token generation and waits for the engine's
        # next output: with 64 streams on 2 cores that took longer than the probe timeout, and
        # the liveness probe called a busy engine hung and cut every stream. Plain /health
        # answers from SGLang's HTTP process, as vLLM's does; a stuck engine still shows as
        # requests that time out (--upstream-read-timeout).
        env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] = "0"
        return env

    async def start(self) -> None:
        # A subprocess that imports SGLang: off the event loop, which serves /health meanwhile.
        await asyncio.to_thread(self._check_installed)
        self._config_dir = tempfile.mkdtemp(prefix="sglang-key-")     # mode 0700
        path = os.path.join(self._config_dir, "key.yaml")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"api-key: {json.dumps(self.child_key)}\n")   # JSON strings are YAML
        try:
            await super().start()
        finally:
            self._forget_key_file()

    def _forget_key_file(self) -> None:
        if self._config_dir:
            shutil.rmtree(self._config_dir, ignore_errors=True)
            self._config_dir = None

    def _check_installed(self) -> None:
        """Fail with the fix, not with a child's ModuleNotFoundError in the log."""
        problem = not_installed(self.python)
        if problem:
            raise EngineDied(problem)

    async def stop(self) -> None:
        await super().stop()
        self._forget_key_file()

    async def on_ready(self) -> None:
        info: dict = {}
        for path in ("/server_info", "/get_server_info"):   # the second before SGLang 0.5.18
            try:
                info = await self.get_json(path)
                break
            except Exception:
                continue
        self._version = str(info.get("version", "unknown"))
        self._sglang = {k: info[k] for k in INFO_FIELDS if info.get(k) is not None}

    def info(self) -> EngineInfo:
        s = self._sglang
        kv_dtype = s.get("kv_cache_dtype", "auto")
        per_token = None
        if self.arch is not None:
            per_token = int(kv_bytes_per_token(
                self.arch, dtypes.canonical(kv_dtype, self.config.dtype, self.arch.torch_dtype)))
        return EngineInfo(
            engine="sglang", engine_version=self._version, model=self.served_name,
            model_path=self.model.path, dtype=self.config.dtype, device=self.device,
            max_model_len=int(s.get("context_length") or self.config.max_model_len),
            kv_capacity_tokens=s.get("max_total_num_tokens"),
            kv_bytes_per_token=per_token, block_size=s.get("page_size"),
            prefix_caching=not s.get("disable_radix_cache", not self.prefix_caching),
            attention=s.get("attention_backend") or self.attention,
            prefix_cache=f"radix tree, page {s.get('page_size') or 1}",
            compiled=self.compiled,
            extra={"kv_cache_dtype": kv_dtype, "sglang": s,
                   "engine_args": self.config.public_engine_args(),
                   **({"support_note": self.support_note} if self.support_note else {})})

    @property
    def compiled(self) -> bool:
        """CUDA graphs are SGLang's default on a GPU; on a CPU it compiles only when told to."""
        args = self.config.engine_args
        if self.device == "cpu":
            return "--enable-torch-compile" in args
        return "--disable-cuda-graph" not in args

    @property
    def max_running(self) -> int:
        if self._sglang.get("max_running_requests"):
            return int(self._sglang["max_running_requests"])
        chosen = engine_arg(self.config.engine_args, "--max-running-requests")
        if chosen:
            return int(chosen)
        return CPU_MAX_RUNNING if self.device == "cpu" else 256

    def request_body(self, request: OpenAIRequest) -> dict:
        body = super().request_body(request)
        # Our own request id (a client's is replaced: it could name someone else's request),
        # so that a request whose client left can be aborted by name.
        body["rid"] = uuid.uuid4().hex
        return body

    def abandon(self, resp, body: dict) -> None:
        # SGLang 0.5.18 keeps generating for a client that hung up mid-stream (it checks for
        # a disconnect only while no token comes), holding its KV cache: abort it by name,
        # THEN drop the connection (once SGLang sees the connection go it forgets the name and
        # ignores the abort, though the request runs on). With n > 1 SGLang runs "<rid>_0",
        # "<rid>_1", ... and knows only those names.
        n = body.get("n") or 1
        rids = [body["rid"]] if n == 1 else [f"{body['rid']}_{i}" for i in range(n)]
        task = asyncio.ensure_future(self._abort(rids, resp))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, rids: list[str], resp=None) -> None:
        try:
            for rid in rids:
                async with self._client.post("/abort_request", json={"rid": rid},
                                             timeout=self._probe_timeout) as answer:
                    await answer.read()
        except Exception as exc:     # the child is gone or hung: nothing left to free
            log.warning("could not abort an abandoned SGLang request: %s", exc)
        finally:
            if resp is not None:
                resp.close()

    async def _forward(self, path: str, request: OpenAIRequest):
        given = request.model_dump(exclude_unset=True)
        if self.arch is not None and self.arch.vocab_size:
            bad = out_of_vocabulary(given, self.arch.vocab_size)
            if bad:
                raise EngineError(400, f"token id {bad[1]} is out of vocabulary (this model has "
                                  f"{self.arch.vocab_size} token ids)", param=bad[0])
        # SGLang 0.5.18 samples unseeded unless it runs with --enable-deterministic-inference
        # (sglang/srt/sampling/sampling_batch_info.py): refused rather than silently ignored.
        if given.get("seed") is not None and not self.seeded:
            raise EngineError(400, "this SGLang server ignores 'seed': start it with "
                              "`-- --enable-deterministic-inference` to use seeds", param="seed")
        return await super()._forward(path, request)

    @property
    def seeded(self) -> bool:
        return "--enable-deterministic-inference" in self.config.engine_args

    async def metrics_text(self) -> str:
        return vllm_metrics(await super().metrics_text(), self.served_name)

    async def reset_prefix_cache(self) -> bool:
        # SGLang refuses (400) while requests run, as vLLM's reset does.
        self.check()
        return await self.post("/flush_cache") == 200
