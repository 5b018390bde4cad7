"""A teaching inference engine: paged KV cache, continuous batching, prefix caching (hash
blocks and radix tree), speculative decoding, quantized linears, attention variants.

Read in this order: ``sequence.py``, ``block_manager.py``, ``scheduler.py``,
``model_runner.py``, ``sampler.py``, ``engine.py``, then ``prefix_cache.py`` and
``spec_decode.py``, ``quant.py``.
"""

from mini_engine.engine import EngineConfig, LLMEngine, RequestOutput, StepRecord
from mini_engine.sequence import SamplingParams, Sequence

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "Sequence",
           "StepRecord"]
