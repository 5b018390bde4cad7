"""The course's helpers: what each notebook imports, and where it lives.

Notebooks import from here; this package imports ``reference_server`` and ``mini_engine``,
never the other way round (``tests/unit/test_import_direction.py``). Helpers return data and
figures; the notebook writes the prose. A module serves the notebooks listed for it:

| notebook | topic | modules (`workshop/`) |
|---|---|---|
| all | connect, controls, gates | `session`, `ui`, `sanity`, `plots`, `hardware` |
| 00 | set-up, the first request | `live/` (`probe`, `next_token`) |
| 01 | pain points | `live/` (`engine_comparison`, `live_requests`, `kv_usage`, ...), `sizing/` |
| 02 | KV-cache capacity | `sizing/` (`kvcache`, `capacity`, `capacity_plots`), `compute/roofline` |
| 03 | the roofline | `compute/` (`roofline`, `roofline_measure`, `roofline_plots`), `timing` |
| 04 | quantization | `precision/` (`quantization`, `_measure`, `_plots`), `sizing/model_memory` |
| 05 | attention variants | `compute/attention_variants`, `precision/model_quality` |
| 06 | FlashAttention | `compute/` (`flash_attention`, `roofline_measure`) |
| 07 | paged KV, batching | `engine_lab/batching`, `live/` (`live_requests`, `kv_usage`) |
| 08 | prefix caching | `engine_lab/prefix_caching`, `bench/` |
| 09 | speculative decoding | `engine_lab/spec_decoding`, `timing` |
| 10 | the showdown | `bench/` (`showdown`, `verify`), `finale/` (`engine_switches`, `decision`) |
| 11 | the decision chart | `finale/` (`decision`, `decision_chart`) |
| 12 | a shared queue | `shared_queue/` |
| 13 | cold starts | `engine_lab/cold_start` |
| 14 | the production gateway | `api_gateway/`, `sizing/capacity` |
| 15 | sampling, structured output | `live/` (`sampling`, `probe`) |
| 16 | cache-aware routing | `fleet/` (`cache_aware_routing`, `tenant_isolation`) |
| 17 | prefill and decode apart | `fleet/disaggregation` |

Folders follow the course: `live/` talks to a running server, `sizing/` counts what fits,
`precision/` trades bits for quality, `compute/` prices a forward pass, `engine_lab/` opens an
engine, `finale/` judges engines, `fleet/` runs several replicas. Shared underneath:
``live/metrics_sampler`` (a server's ``/metrics`` sampled while requests run),
``live/prompt_latency`` (time to first token against prompt length), ``timing``
(best-of and interleaved timing), ``data/`` (model configs, GPU prices, engines' cited
features), and ``cli`` / ``__main__`` (the ``workshop`` command). The benchmark harness is
``bench/`` (``python -m workshop.bench``), used by the notebooks and by ``benchmarks/``.
"""

from pathlib import Path

# One home for where things are, so moving a module never changes what it finds.
PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "data"          # model configs, GPU prices, engines' cited features
CHECKOUT_DIR = PACKAGE_DIR.parent        # the repository, when the course runs from a clone
