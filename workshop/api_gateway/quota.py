"""A per-key token quota: prompt + completion tokens per fixed window.

A window opens with the key's first request and lasts ``window_s`` seconds; the next request
after it opens a new one with nothing used. A request is admitted while the window's count
is below the quota, and its tokens (the upstream's ``usage``) are added when it finishes,
so the last admitted request may overshoot: a gateway cannot know a reply's length before
it is generated. Refused requests are told to come back when the window ends.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class QuotaWindow:
    tokens: int                     # allowed per window
    window_s: float
    used: int = 0
    started: float | None = None    # when the current window opened

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.window_s <= 0:
            raise ValueError("tokens must be >= 1 and window_s > 0")

    def _roll(self, now: float) -> None:
        if self.started is None or now >= self.started + self.window_s:
            self.started, self.used = now, 0

    def check(self, now: float) -> float:
        """0.0 when a request may start now, else the seconds until the window ends."""
        self._roll(now)
        if self.used < self.tokens:
            return 0.0
        return self.started + self.window_s - now

    def add(self, tokens: int, now: float) -> None:
        """Count a finished request's tokens (into the window it started in, unless that
        has ended since: then into a new one)."""
        self._roll(now)
        self.used += max(0, int(tokens))

    def remaining(self, now: float) -> int:
        self._roll(now)
        return max(0, self.tokens - self.used)

    def resets_in(self, now: float) -> float:
        self._roll(now)
        return self.started + self.window_s - now
