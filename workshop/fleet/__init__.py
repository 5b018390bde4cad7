"""More than one replica: cache-aware routing, tenants, prefill and decode apart
(notebooks 16, 17).

``cache_aware_routing``, ``tenant_isolation``, ``disaggregation``.
"""
