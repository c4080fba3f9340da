"""The order a planned run sends in: a warm-up key's first request answered before the rest of its requests leave,
while requests of other keys and those of no key keep the run's workers busy.

A cache entry turns warm only once the request that wrote it is answered (``_cache_rules``), so requests sent
beside their warm-up would each pay the whole prefix.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["Warmth", "WarmUpQueue"]

T = TypeVar("T")


class Warmth:
    """A run's warm-up keys: those warm (a request of theirs answered) and those warming (a warm-up in flight), shared
    by every ``WarmUpQueue`` of the run, so a key is warmed once however many chunks its requests are in."""

    def __init__(self) -> None:
        self.warm: set[str] = set()
        self.warming: set[str] = set()
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Wake every queue waiting on a key."""
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def wait(self) -> None:
        await self._changed.wait()


class WarmUpQueue(Generic[T]):
    """Items in order, each with its warm-up key (or None). ``next`` hands the first item of a key as its warm-up and
    holds the key's later items until the warm-up is answered (``done``), here or in another queue sharing
    ``warmth``; when a warm-up fails, a held item of its key warms it instead. Workers call ``next`` until it
    returns None."""

    def __init__(self, items: Iterable[T], *, key: Callable[[T], str | None], warmth: Warmth | None = None) -> None:
        self._items = iter(items)
        self._key = key
        self._warmth = Warmth() if warmth is None else warmth
        self._mine: dict[str, T] = {}  # key -> the warm-up this queue has in flight
        self._held: dict[str, deque[T]] = {}
        self._ready: deque[T] = deque()
        self.warm_ups = 0

    async def next(self) -> T | None:
        warmth = self._warmth
        while True:
            self._release()
            if self._ready:
                return self._ready.popleft()
            for item in self._items:
                key = self._key(item)
                if key is None or key in warmth.warm:
                    return item
                if key in warmth.warming:
                    self._held.setdefault(key, deque()).append(item)
                    continue
                return self._start(key, item)
            if not self._held:
                return None  # nothing left and nothing waiting on a warm-up
            await warmth.wait()

    def _release(self) -> None:
        """Held items whose key turned warm go; a key whose warm-up failed with none in flight gets a new one."""
        warmth = self._warmth
        for key in list(self._held):
            if key in warmth.warm:
                self._ready.extend(self._held.pop(key))
            elif key not in warmth.warming:
                held = self._held[key]
                self._ready.append(self._start(key, held.popleft()))
                if not held:
                    del self._held[key]

    def _start(self, key: str, item: T) -> T:
        self._warmth.warming.add(key)
        self._mine[key] = item
        self.warm_ups += 1
        return item

    def done(self, item: T, *, answered: bool) -> None:
        """Told of every item ``next`` handed out once it is finished; ``answered``: it has a provider's answer."""
        key = self._key(item)
        if key is None or self._mine.get(key) is not item:
            return
        del self._mine[key]
        self._warmth.warming.discard(key)
        if answered:
            self._warmth.warm.add(key)
        self._warmth.changed()
