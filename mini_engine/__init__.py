"""A teaching inference engine: paged KV cache, continuous batching, prefix caching (hash
blocks and radix tree), speculative decoding, quantized linears, attention variants.

Read in this order: ``config.py`` (every switch), ``sequence.py``, ``block_manager.py``,
``scheduler.py``, then the model side: ``loader.py``, ``model.py``, ``kv_cache.py``,
``attention_metadata.py``, ``model_runner.py``; then ``sampler.py`` and ``engine.py`` (the
step loop), then ``prefix_cache.py``, ``spec_decode.py``, ``linear.py`` (plain, prepacked
and quantized weights) and ``quant.py``.
"""

from mini_engine.config import EngineConfig
from mini_engine.engine import LLMEngine, RequestOutput, StepRecord
from mini_engine.sequence import SamplingParams, Sequence

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "Sequence",
           "StepRecord"]
