"""The in-process engines run all their PyTorch work in one thread (``local.torch_thread``):
the model is loaded in the thread that later runs every step, so only one OpenMP team exists.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from reference_server.config import ServerConfig
from reference_server.engines.local import SamplingParams
from reference_server.models import ModelError, resolve_model


def _spy(monkeypatch, cls, name: str, seen: list[int]) -> None:
    """Wrap ``cls.name`` so that each call records the thread it ran in."""
    real = getattr(cls, name)

    def wrapper(*args, **kwargs):
        seen.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)


@pytest.mark.parametrize("engine", ["mini", "hf"])
def test_the_thread_that_loads_the_model_runs_every_step(engine, monkeypatch):
    try:
        spec = resolve_model("smollm2-135m", prepare=False)
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    loads: list[int] = []
    steps: list[int] = []
    if engine == "mini":
        import mini_engine
        from reference_server.engines.mini import MiniEngine as Engine
        _spy(monkeypatch, mini_engine.LLMEngine, "__init__", loads)
        _spy(monkeypatch, mini_engine.LLMEngine, "step", steps)
        args = ["--threads", "1"]
    else:
        from reference_server.engines.hf import HFEngine as Engine
        _spy(monkeypatch, Engine, "_load", loads)
        _spy(monkeypatch, Engine, "_decode", steps)
        args = []
    eng = Engine(ServerConfig(engine=engine, device="cpu", kv_cache_gib=0.05,
                              engine_args=args), spec)

    async def run() -> None:
        await eng.start()
        # The server's other blocking work (asyncio.to_thread) keeps threads of the default
        # pool busy meanwhile, as it may in a real server.
        hold = threading.Event()
        busy = asyncio.gather(*(asyncio.to_thread(hold.wait) for _ in range(2)))
        try:
            prompt = eng.tokenizer.encode("Count: one two three")
            for rid in ("a", "b"):
                async for _ in eng.generate(rid, prompt, SamplingParams(max_tokens=3,
                                                                        temperature=0)):
                    pass
        finally:
            hold.set()
            await busy
            await eng.stop()

    asyncio.run(run())
    assert len(loads) == 1 and steps
    assert set(steps) == set(loads), "steps ran outside the thread that loaded the model"
    assert loads[0] != threading.get_ident()
