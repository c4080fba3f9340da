"""The simulator's prompt caches, as the providers document them (rules and sources: ``core``'s ``cache_rules``).

An entry is a prefix's digest (the model, the routing key and the prefix's content in it), warm from the moment
the request that wrote it is answered, never before: a request that arrives while the writer is still being served
reads nothing, as Anthropic says ("available only once the first response begins") and OpenAI's routing implies.
Each hit refreshes the entry's time to live. OpenAI's overflow is modelled per route (a prefix's first message and
``prompt_cache_key``): once the route's home machine has taken ``overflow_rpm`` requests in the last minute, the
next go to other machines, which are taken to be cold: they read nothing and keep nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["PromptCache"]

_ENTRIES = 50_000  # prefixes remembered, least recently used dropped
_MINUTE = 60.0


@dataclass(slots=True)
class _Entry:
    warm_at: float  # monotonic seconds: the writing request's answer
    expires_at: float
    ttl_s: float


class PromptCache:
    """Every provider's cached prefixes in one simulator (digests keep providers apart), and the routes' recent
    requests for OpenAI's overflow. Times are ``time.monotonic()`` seconds, given by the caller."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._routes: dict[bytes, deque[float]] = {}

    def clear(self) -> None:
        self._entries.clear()
        self._routes.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def warm(self, digest: bytes, *, now: float) -> bool:
        """Whether ``digest`` is cached and answered at ``now``; a hit refreshes its time to live."""
        entry = self._entries.get(digest)
        if entry is None or entry.warm_at > now:
            return False
        if entry.expires_at <= now:
            del self._entries[digest]
            return False
        entry.expires_at = now + entry.ttl_s
        self._entries.move_to_end(digest)
        return True

    def write(self, digest: bytes, *, answered_at: float, ttl_s: float) -> None:
        """Keep ``digest`` from ``answered_at`` for ``ttl_s`` seconds; an entry already warm by then stays so (a
        second writer in flight does not push it back), and a longer time to live wins."""
        entry = self._entries.get(digest)
        if entry is None:
            self._entries[digest] = _Entry(answered_at, answered_at + ttl_s, ttl_s)
        else:
            entry.warm_at = min(entry.warm_at, answered_at)
            entry.ttl_s = max(entry.ttl_s, ttl_s)
            entry.expires_at = max(entry.expires_at, answered_at + entry.ttl_s)
        self._entries.move_to_end(digest)
        while len(self._entries) > _ENTRIES:
            self._entries.popitem(last=False)

    def pending(self, digest: bytes, *, ttl_s: float) -> None:
        """Keep ``digest`` cold until ``settle``: written by a request whose answer's time is not known yet (one of a
        Message Batch's wave, ``SimulatorConfig.batch_cache_wave``); an entry already kept stays as it is."""
        entry = self._entries.get(digest)
        if entry is None:
            self._entries[digest] = _Entry(math.inf, math.inf, ttl_s)
            while len(self._entries) > _ENTRIES:
                self._entries.popitem(last=False)
        else:
            entry.ttl_s = max(entry.ttl_s, ttl_s)

    def settle(self, digest: bytes, *, answered_at: float) -> None:
        """A ``pending`` entry turns warm at ``answered_at`` and lives its time to live from then."""
        entry = self._entries.get(digest)
        if entry is not None and entry.warm_at > answered_at:
            entry.warm_at = answered_at
            entry.expires_at = answered_at + entry.ttl_s

    def overflows(self, route: bytes, *, now: float, per_minute: int | None) -> bool:
        """Whether a request on ``route`` at ``now`` goes to a cold machine: its home machine has taken
        ``per_minute`` requests over the last minute (None: never). A request served at home is counted."""
        if per_minute is None:
            return False
        seen = self._routes.setdefault(route, deque())
        while seen and seen[0] <= now - _MINUTE:
            seen.popleft()
        if len(seen) >= per_minute:
            return True
        seen.append(now)
        return False
