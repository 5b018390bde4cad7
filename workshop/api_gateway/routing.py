"""Which replica gets the next request: spread the load, concentrate it, take turns, or follow
the prefix cache.

Every policy has ``choose(outstanding, prompt=None) -> replica index``: ``outstanding`` is the
gateway's own count of outstanding requests per replica (sent, reply not finished), which the
gateway keeps exactly, with no call to the replicas; ``prompt`` is the request's prompt as
text (``prompt_text``), which the gateway extracts only for a policy whose ``reads_prompt``
is true (``prefix``).

* ``spread``: the replica with the fewest outstanding requests; ties go round robin, so an
  idle fleet is used in turn (the rule of vLLM's data-parallel balancer, which counts
  requests, and of most proxies' "least connections").
* ``concentrate``: the first replica in the list until it holds ``max_per_replica``, then the
  next: load piles onto few replicas, which run bigger batches, and the last ones stay idle
  while demand allows: replicas that could be released. When every replica is full, the one
  with the fewest outstanding takes the overflow.
* ``round_robin``: each replica in turn, whatever it holds.
* ``prefix``: the replica that most likely holds the prompt's start in its prefix cache, unless
  it is busier than the least-loaded by more than ``balance``; see ``Prefix``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any, Sequence

POLICIES = ("spread", "concentrate", "round_robin", "prefix")


class Spread:
    name = "spread"
    reads_prompt = False

    def __init__(self) -> None:
        self._next = 0          # where the round robin among tied replicas resumes

    def choose(self, outstanding: Sequence[int], prompt: str | None = None) -> int:
        n = len(outstanding)
        least = min(outstanding)
        for step in range(n):
            i = (self._next + step) % n
            if outstanding[i] == least:
                self._next = (i + 1) % n
                return i
        raise AssertionError("unreachable")


class Concentrate:
    name = "concentrate"
    reads_prompt = False

    def __init__(self, max_per_replica: int) -> None:
        if max_per_replica < 1:
            raise ValueError("max_per_replica must be >= 1")
        self.max_per_replica = max_per_replica

    def choose(self, outstanding: Sequence[int], prompt: str | None = None) -> int:
        for i, k in enumerate(outstanding):
            if k < self.max_per_replica:
                return i
        return min(range(len(outstanding)), key=lambda i: outstanding[i])


class RoundRobin:
    name = "round_robin"
    reads_prompt = False

    def __init__(self) -> None:
        self._next = 0

    def choose(self, outstanding: Sequence[int], prompt: str | None = None) -> int:
        i = self._next % len(outstanding)
        self._next = i + 1
        return i


def chunk_hashes(text: str, chunk_chars: int) -> list[bytes]:
    """The chained hashes of ``text``'s full chunks of ``chunk_chars`` characters: chunk i's
    hash covers chunk i and, through chunk i-1's hash, everything before it, so two texts share
    their first k hashes exactly when they share their first k chunks (vLLM's block hashes, on
    characters instead of token ids). A partial last chunk is left out, as a partial block."""
    out, parent = [], b""
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        parent = hashlib.blake2b(parent + text[start:start + chunk_chars].encode(),
                                 digest_size=8).digest()
        out.append(parent)
    return out


class Prefix:
    """Prefix-aware routing, balanced against load.

    The gateway cannot see the replicas' caches; it keeps, per replica, an approximate index:
    the chained chunk hashes (``chunk_hashes``) of the prompts it sent there, least recently
    sent evicted first beyond ``max_chunks`` per replica, so the index stays bounded. The rule:

    1. per replica, the share of the prompt's chunks that its index holds from the start;
    2. the best-matching replica (ties: the fewest outstanding, then the lowest index) gets the
       request if that share is at least ``threshold`` **and** it holds at most ``balance``
       more outstanding requests than the least-loaded replica;
    3. otherwise the least-loaded replica (ties round robin, as ``spread``): an unknown prefix,
       or a hot prefix whose replica is busy, goes where there is room, and that replica
       learns the prefix too;
    4. the chosen replica's index records the prompt's chunks.

    SGLang's cache-aware router has the same shape (a radix tree of text per worker, a match
    threshold, a load-balance check, periodic eviction); its balance check compares the
    whole fleet's most and least loaded workers, this one the chosen replica's load.
    """

    name = "prefix"
    reads_prompt = True

    def __init__(self, threshold: float = 0.5, balance: int = 4, chunk_chars: int = 64,
                 max_chunks: int = 65536) -> None:
        if not 0 <= threshold <= 1:
            raise ValueError("threshold must be between 0 and 1")
        if balance < 0 or chunk_chars < 1 or max_chunks < 1:
            raise ValueError("balance >= 0, chunk_chars >= 1 and max_chunks >= 1")
        self.threshold, self.balance = threshold, balance
        self.chunk_chars, self.max_chunks = chunk_chars, max_chunks
        self.index: list[OrderedDict[bytes, None]] = []
        self._least = Spread()
        self.last: dict[str, Any] = {}      # the last decision, for the curious

    def matches(self, hashes: Sequence[bytes]) -> list[int]:
        """Per replica, how many of ``hashes`` its index holds from the first on."""
        out = []
        for idx in self.index:
            k = 0
            while k < len(hashes) and hashes[k] in idx:
                k += 1
            out.append(k)
        return out

    def choose(self, outstanding: Sequence[int], prompt: str | None = None) -> int:
        n = len(outstanding)
        while len(self.index) < n:
            self.index.append(OrderedDict())
        hashes = chunk_hashes(prompt or "", self.chunk_chars)
        matched = self.matches(hashes)[:n]
        best = min(range(n), key=lambda i: (-matched[i], outstanding[i], i))
        share = matched[best] / len(hashes) if hashes else 0.0
        if hashes and share >= self.threshold and \
                outstanding[best] - min(outstanding) <= self.balance:
            chosen, why = best, "prefix"
        else:
            chosen = self._least.choose(outstanding)
            why = "least loaded" if share < self.threshold or not hashes else "spilled"
        self.last = {"replica": chosen, "why": why, "best": best, "share": share}
        idx = self.index[chosen]
        for h in hashes:
            idx[h] = None
            idx.move_to_end(h)
        while len(idx) > self.max_chunks:
            idx.popitem(last=False)
        return chosen


def prompt_text(body: dict) -> str:
    """A request's prompt as one text for ``Prefix``: the chat messages' roles and contents in
    order (a longer conversation extends a shorter one's text), or the completion prompt; with
    the request's ``cache_salt`` first, since a salted prompt shares no cache with another."""
    salt = body.get("cache_salt")
    head = f"salt\x1f{salt}\x1e" if isinstance(salt, str) else ""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            if isinstance(content, list):       # content parts: their text, in order
                content = "".join(p.get("text", "") for p in content
                                  if isinstance(p, dict) and isinstance(p.get("text"), str))
            parts.append(f"{m.get('role')}\x1f{content if isinstance(content, str) else ''}\x1e")
        return head + "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return head + prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, str):
            return head + first
        return head + " ".join(str(t) for t in (first if isinstance(first, list) else prompt))
    return head


def make_policy(name: str, max_per_replica: int = 8, *, prefix_threshold: float = 0.5,
                prefix_balance: int = 4) -> Spread | Concentrate | RoundRobin | Prefix:
    if name == "spread":
        return Spread()
    if name == "concentrate":
        return Concentrate(max_per_replica)
    if name == "round_robin":
        return RoundRobin()
    if name == "prefix":
        return Prefix(threshold=prefix_threshold, balance=prefix_balance)
    raise ValueError(f"unknown policy {name!r}; choose from {POLICIES}")
