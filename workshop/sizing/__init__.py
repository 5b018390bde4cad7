"""What fits: KV cache per token, weights, and how many requests a GPU or CPU holds
(notebooks 01, 02, 04, 14; ``kvcache``'s model configs serve most notebooks).

``kvcache`` (the per-token formula, model configs), ``model_memory`` (weights),
``capacity`` and ``capacity_plots`` (concurrency and cost per GPU, the one GB/GiB conversion).
"""
