"""Notebook 14's production gateway: API keys with per-key rate limits and token quotas,
a request log without prompt text, and a routing policy (spread, concentrate, round robin,
or prefix-aware: notebook 16) in front of several OpenAI-compatible replicas.

Not notebook 12's queue gateway (``workshop.shared_queue.gateway``), which puts requests on
a NATS queue for workers to pull: this one is an HTTP reverse proxy in front of ordinary
engine servers, the kind that fronts vLLM or SGLang in production.

``bucket``, ``quota``, ``routing``, ``usage`` and ``request_log`` are pure logic; ``app`` is
the HTTP layer; ``launch`` starts one from Python; ``python -m workshop.api_gateway`` runs it.
"""
