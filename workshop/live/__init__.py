"""Requests to a running server, one at a time or a few at once (notebooks 00, 01, 07, 15).

``probe`` and ``next_token`` (the first request, one token at a time), ``live_requests``
(requests in flight, emptying a prefix cache), ``kv_usage`` (KV blocks in use),
``prompt_latency`` (time to first token against prompt length), ``engine_comparison``
(one prompt on several engines), ``metrics_sampler`` (a server's ``/metrics`` sampled while
requests run), ``sampling`` (sampling, structured output and tool calls).
"""
