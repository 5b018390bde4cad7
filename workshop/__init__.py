"""The course's helpers: what each notebook imports, and where it lives.

Notebooks import from here; this package imports ``reference_server`` and ``mini_engine``,
never the other way round (``tests/unit/test_import_direction.py``). Helpers return data and
figures; the notebook writes the prose. A module serves the notebooks listed for it:

| notebook | topic | modules (`workshop/`) |
|---|---|---|
| every one | connect, controls, sanity gates | `session`, `ui`, `sanity`, `plots` |
| 00 | set-up, the first request | `probe`, `next_token` |
| 01 | pain points | `engine_comparison`, `live_requests`, `kv_usage`, `capacity` |
| 02 | KV-cache capacity and cost | `kvcache`, `capacity`, `capacity_plots`, `roofline` |
| 03 | prefill, decode, the roofline | `roofline` (`_measure`, `_plots`), `timing` |
| 04 | quantization | `quantization` (`_measure`, `_plots`), `model_memory`, `model_quality` |
| 05 | attention variants | `attention_variants`, `flash_attention`, `model_quality`, `timing` |
| 06 | FlashAttention | `flash_attention`, `roofline_measure`, `prompt_latency` |
| 07 | paged attention, batching | `batching`, `live_requests`, `kv_usage`, `bench/` |
| 08 | prefix caching | `prefix_caching`, `bench/` |
| 09 | speculative decoding | `spec_decoding`, `timing` |
| 10 | the engine showdown | `bench/` (`showdown`, `verify`), `engine_switches`, `decision` |
| 11 | the decision chart | `decision`, `decision_chart`, `bench/` |
| 12 | a shared queue of small models | `shared_queue/`, `bench/` |
| 13 | cold starts | `cold_start` |
| 14 | the production gateway | `api_gateway/`, `bench/` |
| 15 | sampling, structured output, tool calls | `sampling`, `probe` |
| 16 | cache-aware routing | `cache_aware_routing`, `tenant_isolation`, `api_gateway/`, `bench/` |
| 17 | disaggregated prefill and decode | `disaggregation`, `cold_start` |

Shared underneath: ``metrics`` (a server's ``/metrics`` sampled while requests run),
``prompt_latency`` (time to first token against prompt length),
``timing`` (best-of and interleaved timing), ``data/`` (model configs, GPU prices, engines'
cited features), and ``cli`` / ``__main__`` (the ``workshop`` command). The benchmark harness
is ``bench/`` (``python -m workshop.bench``), used by the notebooks and by ``benchmarks/``.
"""
