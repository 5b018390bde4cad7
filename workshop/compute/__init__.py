"""What a forward pass costs: the roofline, attention variants, FlashAttention
(notebooks 03, 05, 06).

``roofline`` (arithmetic intensity, the ridge point), ``roofline_measure`` (matmul roof,
bandwidth, a cold prefill on a live server), ``roofline_plots``, ``attention_variants``
(MHA, GQA, MQA, MLA), ``flash_attention`` (tiled attention written out).
"""
