"""The provider's own account of its rate limits, read from each answer's headers, and what a 429 says of the account.

A provider describes its limits by kind (requests, tokens) as a limit per minute, what remains of it and when it
resets. ``RateLimitHeaders`` names where one provider puts those three; ``OPENAI_RATE_LIMIT_HEADERS`` is OpenAI's
and Azure's ``x-ratelimit-*`` (Anthropic's ``anthropic-ratelimit-{kind}-limit`` / ``-remaining`` / ``-reset`` fit
the same templates). ``quota_evidence`` tells a 429 of an exhausted account from one of a busy host.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import httpx

__all__ = [
    "KINDS",
    "OPENAI_RATE_LIMIT_HEADERS",
    "Kind",
    "KindLimit",
    "RateLimitHeaders",
    "parse_reset",
    "quota_evidence",
]

Kind = Literal["requests", "tokens"]
KINDS: tuple[Kind, ...] = ("requests", "tokens")

# Go's time.Duration format, as OpenAI writes resets: "6m0s", "20ms", "1.5s", "1m30.5s", "1h2m".
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns))")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# What a 429's message says when an account's quota, not the provider's capacity, ran out.
_QUOTA_WORDS = re.compile(r"\b(?:RPM|TPM|RPD|TPD|IPM|quota)\b|per (?:min|minute|day)\b", re.IGNORECASE)
_QUOTA_CODES = frozenset({"insufficient_quota"})


def parse_reset(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds until a limit resets: a Go duration (``6m0s``, ``20ms``, ``1.5s``), plain seconds, or an RFC 3339 time.

    ``now`` is the Unix time an RFC 3339 time is measured from. ``None`` for anything else; never negative.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    seconds: float | None
    try:
        seconds = float(text)
    except ValueError:
        seconds = _duration(text)
        if seconds is None:
            seconds = _timestamp(text, now=now)
    if seconds is None or not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def _duration(text: str) -> float | None:
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) and pos > 0 else None


def _timestamp(text: str, *, now: float | None) -> float | None:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None  # RFC 3339 always carries an offset; a bare local time is a guess we do not make
    return moment.timestamp() - (time.time() if now is None else now)


@dataclass(frozen=True, slots=True)
class KindLimit:
    """One kind's limit as one answer told it: per minute, what remains, seconds until it resets (``None``: not said)."""

    limit: float | None
    remaining: float | None
    reset: float | None


@dataclass(frozen=True, slots=True)
class RateLimitHeaders:
    """Where one provider puts its rate-limit headers: templates with ``{kind}`` for ``requests`` or ``tokens``."""

    limit: str
    remaining: str
    reset: str

    def parse(
        self, headers: httpx.Headers | Mapping[str, str] | Iterable[tuple[bytes, bytes]], *, now: float | None = None
    ) -> dict[Kind, KindLimit]:
        """The kinds these headers describe (none if the provider sent none); ``headers`` may be raw byte pairs."""
        # One pass over the raw headers: this runs on every answer, and most carry none of these.
        wanted = _header_names(self)
        if isinstance(headers, httpx.Headers):
            raw: Iterable[tuple[bytes, bytes]] = headers.raw
        elif isinstance(headers, Mapping):
            raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
        else:
            raw = headers
        said: dict[tuple[Kind, str], str] = {}
        for name, value in raw:
            hit = wanted.get(name.lower())
            if hit is not None:
                said[hit] = value.decode("latin-1")
        if not said:
            return {}
        kinds: dict[Kind, KindLimit] = {}
        for kind in KINDS:
            limit = _number(said.get((kind, "limit")))
            remaining = _number(said.get((kind, "remaining")))
            reset = parse_reset(said.get((kind, "reset")), now=now)
            if limit is not None or remaining is not None:
                kinds[kind] = KindLimit(limit=limit, remaining=remaining, reset=reset)
        return kinds


@functools.cache
def _header_names(headers: RateLimitHeaders) -> dict[bytes, tuple[Kind, str]]:
    """Each header name ``headers`` reads, lower-cased as bytes, and the kind and field it gives."""
    return {
        getattr(headers, field).format(kind=kind).lower().encode("latin-1"): (kind, field)
        for kind in KINDS for field in ("limit", "remaining", "reset")
    }


OPENAI_RATE_LIMIT_HEADERS = RateLimitHeaders(
    limit="x-ratelimit-limit-{kind}", remaining="x-ratelimit-remaining-{kind}", reset="x-ratelimit-reset-{kind}"
)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def quota_evidence(
    *, limits: Mapping[Kind, KindLimit], charge: Mapping[Kind, float], code: str | None, message: str
) -> set[Kind] | None:
    """The kinds a 429 says are exhausted on the account, or ``None`` for a capacity 429 (no such evidence).

    Evidence is a kind with nothing left for this request (``charge``: what it costs of each kind), or a quota
    error: ``insufficient_quota``, or a message naming a per-minute (or per-day) quota. An empty set means the
    account is exhausted without saying which kind.
    """
    exhausted = {
        kind for kind, seen in limits.items()
        if seen.remaining is not None and seen.remaining < max(charge.get(kind, 1.0), 1.0)
    }
    if exhausted:
        return exhausted
    if code in _QUOTA_CODES or _QUOTA_WORDS.search(message):
        words = message.upper()
        said: set[Kind] = set()
        if "RPM" in words or "REQUESTS PER" in words:
            said.add("requests")
        if "TPM" in words or "TOKENS PER" in words:
            said.add("tokens")
        return said
    return None
