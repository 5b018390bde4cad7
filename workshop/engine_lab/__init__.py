"""Inside an engine: batching and paged KV, prefix caching, speculative decoding, cold starts
(notebooks 07, 08, 09, 13).

``batching``, ``prefix_caching``, ``spec_decoding``, ``cold_start``.
"""
