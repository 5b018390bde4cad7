"""A per-key request-rate limit: a token bucket.

The bucket holds at most ``burst`` tokens and refills at ``per_minute / 60`` tokens a second;
each request takes one. A key that has been quiet may send ``burst`` requests at once, and
on average no more than ``per_minute`` a minute. Times are passed in (seconds on any
monotonic clock), so the arithmetic is testable without waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenBucket:
    per_minute: float
    burst: int
    tokens: float = field(init=False)
    updated: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.per_minute <= 0 or self.burst < 1:
            raise ValueError("per_minute must be > 0 and burst >= 1")
        self.tokens = float(self.burst)

    @property
    def per_second(self) -> float:
        return self.per_minute / 60.0

    def _refill(self, now: float) -> None:
        if self.updated is not None and now > self.updated:
            self.tokens = min(float(self.burst),
                              self.tokens + (now - self.updated) * self.per_second)
        if self.updated is None or now > self.updated:
            self.updated = now

    def take(self, now: float) -> float:
        """Take one token: 0.0 when the request may go, else the seconds until one is due
        (what ``Retry-After`` says; nothing is taken then)."""
        self._refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.per_second
