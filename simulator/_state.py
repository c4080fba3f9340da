"""Everything one running simulator remembers: config, counters, quota windows and forced faults.

One ``SimState`` per app, handed to each route group, so a simulator never shares anything with
another one in the same process (tests run several side by side).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ._config import RANDOM_FAULT_FIELDS, SimulatorConfig
from ._prompt_cache import PromptCache

__all__ = ["QUOTA_WINDOW_S", "QuotaWindow", "SimState", "SimStats"]

QUOTA_WINDOW_S = 60.0


@dataclass(slots=True)
class SimStats:
    """Counters behind ``GET /_sim/stats``; ``in_flight`` is a live gauge that a reset keeps.

    ``requests_total``, the gauges, ``by_status``, ``quota_rejections`` and the token sums count both real-time
    APIs (chat completions and Messages); ``completions`` and ``messages`` count each API's successful answers.
    """

    requests_total: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    completions: int = 0  # POST /v1/chat/completions answered 200
    messages: int = 0  # POST /v1/messages answered 200
    generate_contents: int = 0  # POST /v1beta/models/{model}:generateContent answered 200
    prompt_tokens: int = 0  # all input, a Message's cache reads and writes included
    completion_tokens: int = 0
    cached_tokens: int = 0  # chat's cached_tokens and a Message's cache_read_input_tokens
    cache_creation_tokens: int = 0  # a Message's cache_creation_input_tokens
    # Requests past ``cache_overflow_rpm`` on one prefix and prompt_cache_key, served by a cold machine.
    cache_overflows: int = 0
    quota_rejections: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    batches: int = 0  # created through POST /v1/batches
    batch_lines: int = 0  # input lines answered, successes and errors alike
    batch_outcomes: dict[str, int] = field(default_factory=dict)  # final status -> batches
    message_batches: int = 0  # created through POST /v1/messages/batches
    message_batch_lines: int = 0  # requests answered (succeeded or errored), not those canceled or expired
    gemini_batches: int = 0  # created through POST /v1beta/models/{model}:batchGenerateContent
    gemini_batch_lines: int = 0  # requests of Gemini batches answered or ended (succeeded, failed or cancelled)
    gemini_caches: int = 0  # explicit caches created through POST /v1beta/cachedContents
    gemini_uploads: int = 0  # resumable uploads started (POST /upload/v1beta/files, command start)
    embedding_inputs: int = 0  # texts embedded, real-time and in batches (a packed request or line holds many)
    # Real-time requests that carried a [[sim:...]] marker, by marker (those past their xN included): how many
    # times a prompt with that marker was sent.
    markers: dict[str, int] = field(default_factory=dict)

    def count(self, outcome: str) -> None:
        self.by_status[outcome] = self.by_status.get(outcome, 0) + 1

    def reset(self) -> None:
        in_flight = self.in_flight
        for name, default in SimStats().to_dict().items():
            setattr(self, name, default)
        # Requests still being served will decrement the gauge when they finish.
        self.in_flight = in_flight
        self.peak_in_flight = in_flight

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # copies the dicts too: a snapshot never changes under its reader


class QuotaWindow:
    """Amounts admitted over the last ``span`` seconds, for one quota (requests or tokens) of ``per_minute``.

    A span shorter than a minute enforces the per-minute quota as providers may, quantised: 6,000 a minute
    over 1 s is 100 in any second (``limit``, what the window holds).
    """

    __slots__ = ("per_minute", "span", "limit", "_events", "_used")

    def __init__(self, per_minute: int, *, span: float = QUOTA_WINDOW_S) -> None:
        self._events: deque[tuple[float, int]] = deque()
        self._used = 0
        self.resize(per_minute, span=span)

    def resize(self, per_minute: int, *, span: float) -> None:
        self.per_minute = per_minute
        self.span = span
        self.limit = max(1, round(per_minute * span / QUOTA_WINDOW_S))

    def _expire(self, now: float) -> None:
        cutoff = now - self.span
        events = self._events
        while events and events[0][0] <= cutoff:
            self._used -= events.popleft()[1]

    def wait_for(self, amount: int, *, now: float) -> float:
        """Seconds until ``amount`` fits (0 if it fits now, the window's span if it never can)."""
        self._expire(now)
        excess = self._used + amount - self.limit
        if excess <= 0:
            return 0.0
        if amount > self.limit:
            return self.span
        for at, size in self._events:
            excess -= size
            if excess <= 0:
                return at + self.span - now
        return self.span  # unreachable while the window's sum is consistent

    def add(self, amount: int, *, now: float) -> None:
        self._events.append((now, amount))
        self._used += amount

    def remaining(self, *, now: float) -> int:
        self._expire(now)
        return max(0, self.limit - self._used)

    def reset_in(self, *, now: float) -> float:
        """Seconds until the oldest admitted amount leaves the window and frees its share."""
        self._expire(now)
        return self._events[0][0] + self.span - now if self._events else 0.0

    def clear(self) -> None:
        self._events.clear()
        self._used = 0


class SimState:
    """Shared, mutable state of one simulator; route groups read and update it in place."""

    def __init__(self, *, config: SimulatorConfig) -> None:
        self.stats = SimStats()
        self.forced_faults: deque[str] = deque()  # queued through POST /_sim/faults
        self.marker_hits: dict[bytes, int] = {}  # body digest -> requests seen, for [[sim:FAULTxN]]
        self.prompt_cache = PromptCache()
        # Gemini's explicit caches by name (``_gemini_caches.SimCache``), cleared by its reset hook.
        self.gemini_caches: dict[str, Any] = {}
        # When the request being rendered will be answered (monotonic seconds): set by the real-time routes around
        # their synchronous ``render()``, so the prefixes it writes turn warm then; None (a batch line): at once.
        self.answer_due: float | None = None
        # The prefixes a Message Batch's open wave wrote (``SimulatorConfig.batch_cache_wave``): set by the batch
        # around each line's synchronous render, so they stay cold until the wave is answered; None otherwise.
        self.cache_wave: list[bytes] | None = None
        self.requests_window: QuotaWindow | None = None
        self.tokens_window: QuotaWindow | None = None
        self.started_at = time.time()
        self.boot_id = os.urandom(3).hex()  # keeps response ids unique across simulator runs
        self.response_serial = 0
        self.request_ids = itertools.count(1)
        self.config = config
        self.rng = random.Random(config.seed)
        # Route groups with state of their own (the batch store) clear it here on POST /_sim/reset.
        self.reset_hooks: list[Callable[[], None]] = []
        self.apply_config(config)

    def apply_config(self, config: SimulatorConfig) -> None:
        if config.seed != self.config.seed:
            self.rng.seed(config.seed)
        self.config = config
        self.allowed_models = frozenset(config.models) if config.models is not None else None
        self.seed_key = str(config.seed).encode()
        self.fault_thresholds: list[tuple[float, str]] = []
        total = 0.0
        for name, fault in RANDOM_FAULT_FIELDS:
            rate = getattr(config, name)
            if rate > 0:
                total += rate
                self.fault_thresholds.append((total, fault))
        self.requests_window = _resized(self.requests_window, config.rpm, span=config.quota_window)
        self.tokens_window = _resized(self.tokens_window, config.tpm, span=config.quota_window)

    def reset(self) -> None:
        """Back to a fresh start: counters, queues, quota windows, prompt cache, the RNG and what the hooks hold."""
        self.stats.reset()
        self.forced_faults.clear()
        self.marker_hits.clear()
        self.prompt_cache.clear()
        for window in (self.requests_window, self.tokens_window):
            if window is not None:
                window.clear()
        self.rng.seed(self.config.seed)
        for hook in self.reset_hooks:
            hook()

    def random_fault(self) -> str | None:
        if not self.fault_thresholds:
            return None
        draw = self.rng.random()
        for threshold, fault in self.fault_thresholds:
            if draw < threshold:
                return fault
        return None

    def cache_times(self) -> tuple[float, float]:
        """(now, when the request being rendered is answered) for the prompt cache, in monotonic seconds."""
        now = time.monotonic()
        return now, now if self.answer_due is None else max(now, self.answer_due)

    def next_response_id(self, *, prefix: str = "chatcmpl-") -> str:
        """A unique answer id: ``chatcmpl-sim...`` for chat, ``msg_sim...`` for a Message."""
        self.response_serial += 1
        return f"{prefix}sim{self.boot_id}{self.response_serial:010x}"

    def next_request_id(self) -> str:
        """What ``x-request-id`` says of a chat request and ``request_id`` of a batch line."""
        return f"req_sim{self.boot_id}{next(self.request_ids):x}"


def _resized(window: QuotaWindow | None, per_minute: int | None, *, span: float) -> QuotaWindow | None:
    if per_minute is None:
        return None
    if window is None:
        return QuotaWindow(per_minute, span=span)
    window.resize(per_minute, span=span)  # keep what was admitted: lowering a quota mid-run bites at once
    return window
