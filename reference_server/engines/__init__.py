"""Engines behind the reference server, created by name (imported lazily: each pulls in
heavy, sometimes mutually incompatible packages)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from reference_server.engines.base import Engine, EngineDied, EngineError, EngineInfo

_REGISTRY = {
    "vllm": "reference_server.engines.vllm:VLLMEngine",
    "sglang": "reference_server.engines.sglang:SGLangEngine",
    "hf": "reference_server.engines.hf:HFEngine",
    "mini": "reference_server.engines.mini:MiniEngine",
    "remote": "reference_server.engines.remote:RemoteEngine",
}


def loads_model(engine: str) -> bool:
    """Whether ``engine`` serves a model of this machine (``--model``, resolved and prepared
    before it starts); the remote engine serves the remote server's."""
    return engine != "remote"


if TYPE_CHECKING:
    from reference_server.config import ServerConfig
    from reference_server.models import ModelSpec


def create_engine(config: ServerConfig, model: ModelSpec | None) -> Engine:
    """The engine ``config`` names, for ``model`` (None for an engine that does not
    ``loads_model``)."""
    module, cls = _REGISTRY[config.engine].split(":")
    return getattr(importlib.import_module(module), cls)(config, model)


__all__ = ["Engine", "EngineDied", "EngineError", "EngineInfo", "create_engine", "loads_model"]
