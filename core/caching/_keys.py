"""OpenAI's ``prompt_cache_key``s for one prefix group, dealt as its requests leave: one key while the answers show
the provider keeps the group's prefix warm, spread over more once they show it overflowing.

OpenAI's guide names ~15 requests a minute for one prefix and key before requests overflow to other machines
(``_cache_rules``), and every key costs one cold request, its warm-up, billed as a cache write where the model
prices writes. Spread from the start, a fast group pays a warm-up per key whether or not the provider overflows;
on one key it pays one, but if the provider does overflow, nearly every request is cold. The answers say which:
a request sent on a warm key whose answer reads nothing of the prefix overflowed.

So a group starts on one key. Once it is warm, a probe of ``WINDOW`` requests goes out on it and the rest wait for
their answers (one latency): if ``COLD_TO_SPREAD`` of them are cold, the group spreads over the keys its rate needs
(``keys_for``: its share of the run's concurrency over the answers' latency); otherwise it goes on at full speed,
still watching the last ``WINDOW`` answers. After a spread the group's requests wait for the new keys' writers and
probe again, so one spread's overflow never spreads it twice; a spread that still overflows grows by the share of
cold answers, at most twice over; a spread that leaves the answers mostly cold and no less so ends the spreading.

Invariants: a key's first request (its writer) is sent alone, and no other request of the group is sent while a
key is warming; a writer that fails leaves its key to the next request dealt; never more keys than requests left.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass

from ._cache_rules import OPENAI_KEY_REQUESTS_PER_MINUTE

__all__ = ["KeyDealer", "KeyTicket", "keys_for"]

# Answers of warm keys a decision looks at, and the cold ones among them that show overflow.
WINDOW = 20
COLD_TO_SPREAD = 5
# A spread after which at least this share of answers is cold, and no less than before it, ends the spreading.
_MOSTLY_COLD = 0.5
# The latency taken for a request before any is answered.
_ASSUMED_LATENCY_S = 5.0


def keys_for(requests: int, *, rate: float) -> int:
    """Keys for ``requests`` sent at ``rate`` a minute when the provider overflows past the guide's rate per key:
    each key costs one cold request (its warm-up) and takes ~15 requests a minute at its home machine, the rest
    going cold. Over the group's D = requests / rate minutes, k keys miss k + max(0, requests - k(1 + 15D)),
    least at k = requests / (1 + 15D)."""
    minutes = requests / max(rate, 1e-9)
    best = requests / (1.0 + OPENAI_KEY_REQUESTS_PER_MINUTE * minutes)
    return max(1, min(requests, math.ceil(best)))


@dataclass(frozen=True, slots=True)
class KeyTicket:
    """One dealt request: its group, the key it went out on, whether it is that key's writer, and whether its answer
    is evidence of the keys as they are since the last spread (``probe``: one of the probe after a warm-up)."""

    group_key: str
    name: str
    writer: bool
    evidence: bool = False
    probe: bool = False
    spreads: int = 0


class KeyDealer:
    """The keys of one group of ``prompts`` requests: ``deal`` names the key of each request as it leaves (waiting
    while keys warm or a probe is out), ``settled`` is told of each end. ``in_flight``: the group's share of the
    run's concurrency; ``minimum_tokens``: an answer reading fewer cached tokens read nothing of the prefix."""

    def __init__(self, *, group_key: str, prompts: int, in_flight: float, minimum_tokens: int) -> None:
        self.group_key = group_key
        self.active = 1
        self.spreads = 0
        self._minimum = minimum_tokens
        self._in_flight = max(1.0, in_flight)
        self._left = prompts
        self._unwarmed: deque[int] = deque([0])
        self._warming: set[int] = set()
        self._warm: list[int] = []
        self._turn = 0
        self._probing = True
        self._cold_at_spread = 0.0  # the cold share that made the last spread
        self.gave_up = False
        self._probe_dealt = self._probe_settled = 0
        self._window: deque[bool] = deque(maxlen=WINDOW)  # evidence answers: True where cold
        self._latency_sum = 0.0
        self._latencies = 0
        self._changed = asyncio.Event()

    def name(self, index: int) -> str:
        return f"llmd-{self.group_key}-{index}"

    async def deal(self) -> KeyTicket:
        """The key of the next request: an unwarmed key's writer first; else, once no key is warming, the next warm
        key in turn (one of the probe while it is out); else it waits for a writer's or the probe's answers."""
        while True:
            if self._unwarmed:
                index = self._unwarmed.popleft()
                self._warming.add(index)
                return self._dealt(KeyTicket(self.group_key, self.name(index), writer=True, spreads=self.spreads))
            if self._warm and not self._warming and (not self._probing or self._probe_dealt < WINDOW):
                index = self._warm[self._turn % len(self._warm)]
                self._turn += 1
                probe = self._probing
                self._probe_dealt += probe
                return self._dealt(KeyTicket(self.group_key, self.name(index), writer=False, evidence=True,
                                             probe=probe, spreads=self.spreads))
            await self._wait()

    def settled(self, ticket: KeyTicket, *, cached_tokens: int | None, latency_s: float | None = None) -> None:
        """Told of a dealt request's end: ``cached_tokens`` its answer read (None: it failed, no answer)."""
        if latency_s is not None and latency_s > 0:
            self._latency_sum += latency_s
            self._latencies += 1
        index = int(ticket.name.rpartition("-")[2])
        if ticket.writer:
            if index in self._warming:
                self._warming.discard(index)
                (self._unwarmed.appendleft if cached_tokens is None else self._warm.append)(index)
                if cached_tokens is None or not self._warming:
                    self._wake()  # a key to warm again, or the last writer answered: the waiting may go on
            return
        if not ticket.evidence or ticket.spreads != self.spreads:
            return
        if cached_tokens is not None:
            self._window.append(cached_tokens < self._minimum)
        cold = sum(self._window)
        if ticket.probe:
            self._probe_settled += 1
            if self._probe_settled < WINDOW:
                return
            self._probing = False
            self._wake()
            if cold >= COLD_TO_SPREAD:
                self._spread(cold / max(len(self._window), 1))
        elif len(self._window) == WINDOW and cold >= COLD_TO_SPREAD:
            self._spread(cold / WINDOW)

    def rate(self) -> float:
        """The group's requests a minute: its share of the run's concurrency over the answers' mean latency."""
        latency = self._latency_sum / self._latencies if self._latencies else _ASSUMED_LATENCY_S
        return self._in_flight * 60.0 / max(latency, 1e-3)

    def _dealt(self, ticket: KeyTicket) -> KeyTicket:
        self._left = max(0, self._left - 1)
        return ticket

    def _spread(self, cold: float) -> None:
        """Spread over the keys the group's rate needs; where it already spread and still overflows (the provider
        takes less than the guide's rate), over as many more as its keys fall short by, at most twice as many. A spread
        that left the answers mostly cold and no less so ends the spreading: they are not overflow (a host that ignores the key, a
        prefix shorter than estimated), and more keys would only pay more warm-ups."""
        self._window.clear()
        if self.gave_up or (self.spreads and cold >= max(self._cold_at_spread, _MOSTLY_COLD)):
            self.gave_up = True
            return
        self._cold_at_spread = cold
        want = keys_for(self._left, rate=self.rate()) if self._left else 0
        if self.spreads:
            want = max(want, math.ceil(self.active / max(1.0 - cold, 0.5)))
        want = min(self._left, want)
        if want <= self.active:
            return
        self._unwarmed.extend(range(self.active, want))
        self.active = want
        self.spreads += 1
        self._probing, self._probe_dealt, self._probe_settled = True, 0, 0
        self._wake()

    def _wake(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _wait(self) -> None:
        await self._changed.wait()
