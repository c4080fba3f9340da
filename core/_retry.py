"""The one retry policy: when a provider call is worth another attempt and how long to wait first (openai-python's
rules, as pure functions).

Everything retried follows it: the client's one loop (``LLMClient._request``: chat, files, batch creates, whose
``find_lost`` looks a lost create up in the wait), the retryable flag of every ``APIStatusError``, and the
retryable flag of a batch output line (``_batch_files``). Retry-After is read in ``parse_retry_after`` and judged
in ``server_retry_after``, nowhere else. Nothing here sleeps or reads a clock it was not given, so every rule can
be checked from a table; the client sleeps on its own injectable clock.
"""

from __future__ import annotations

import email.utils
import math
import random as _random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_MAX_RETRY_AFTER",
    "INITIAL_RETRY_DELAY",
    "MAX_RETRY_DELAY",
    "RETRY_AFTER_STEP",
    "RETRYABLE_STATUSES",
    "backoff_delay",
    "parse_retry_after",
    "retry_delay",
    "server_retry_after",
    "should_retry_status",
]

INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 8.0
MAX_JITTER = 0.25
# With a Retry-After, each retry adds this share of it times 2**n - 1 (plus up to half a share of jitter): the
# server's wait stays the minimum, and each retry's band lies clear above the last one's, so no wait repeats.
RETRY_AFTER_STEP = 0.05
# openai-python honours up to 60 s; batch-heavy accounts see longer Retry-After values that are still worth obeying.
DEFAULT_MAX_RETRY_AFTER = 120.0
RETRYABLE_STATUSES = frozenset({408, 409, 429})

HeadersLike: TypeAlias = "Mapping[str, str] | httpx.Headers | None"


def _headers(headers: HeadersLike) -> httpx.Headers:
    import httpx  # here, not at import: the error tree (``_exceptions``) needs this module, a report no HTTP

    # httpx.Headers looks names up case-insensitively, as HTTP requires; plain dicts in tests do not.
    return headers if isinstance(headers, httpx.Headers) else httpx.Headers(dict(headers or {}))


def should_retry_status(status_code: int, headers: HeadersLike = None) -> bool:
    """Whether an HTTP status is worth another attempt; the provider's ``x-should-retry`` has the last word."""
    override = _headers(headers).get("x-should-retry", "").strip().lower()
    if override == "true":
        return True
    if override == "false":
        return False
    return status_code in RETRYABLE_STATUSES or status_code >= 500


def parse_retry_after(headers: HeadersLike, *, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date).

    Returns the first value that parses, whatever its size (``None`` if none does); judging whether it is
    sensible is :func:`server_retry_after`'s job. ``now`` is the Unix time an HTTP date is measured from.
    """
    found = _headers(headers)
    try:
        return float(found["retry-after-ms"]) / 1000
    except (KeyError, TypeError, ValueError):
        pass
    value = found.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed)) - (time.time() if now is None else now)


def server_retry_after(
    headers: HeadersLike, *, max_retry_after: float = DEFAULT_MAX_RETRY_AFTER, now: float | None = None
) -> float | None:
    """The server's requested wait if it is one we honour (0 < value <= ``max_retry_after``), else ``None``."""
    value = parse_retry_after(headers, now=now)
    # NaN fails both comparisons and so falls back to backoff, like any other garbage.
    if value is not None and 0 < value <= max_retry_after:
        return value
    return None


def backoff_delay(retries_taken: int, *, random: Callable[[], float] = _random.random) -> float:
    """Exponential backoff ``min(0.5 * 2**n, 8)`` seconds, shortened by up to 25% jitter.

    ``retries_taken`` is how many retries came before this one (0 before the first retry).
    """
    # The cap on the exponent only keeps 2.0**n finite; the delay is capped long before that.
    base = min(INITIAL_RETRY_DELAY * math.pow(2.0, min(max(retries_taken, 0), 1000)), MAX_RETRY_DELAY)
    return max(base * (1 - MAX_JITTER * random()), 0.0)


def retry_delay(
    *,
    retries_taken: int,
    headers: HeadersLike = None,
    previous: float | None = None,
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
    random: Callable[[], float] = _random.random,
    now: float | None = None,
) -> float:
    """Seconds to wait before the next attempt; longer than ``previous``, this request's last wait.

    With a Retry-After we honour, that wait grows from it: ``R * (1 + 0.05 * (2**n - 1 + jitter / 2))``. Without
    one, :func:`backoff_delay`. A wait that would not be longer than the last (backoff at its cap, or a backoff
    after a longer server wait) is the last one plus 5-10%. Waits stop growing at ``max_retry_after``.
    """
    n = min(max(retries_taken, 0), 1000)
    honoured = server_retry_after(headers, max_retry_after=max_retry_after, now=now)
    if honoured is not None:
        delay = min(honoured * (1 + RETRY_AFTER_STEP * (math.pow(2.0, n) - 1 + random() / 2)), max_retry_after)
    else:
        delay = backoff_delay(n, random=random)
    if previous is not None and delay <= previous:
        delay = max(delay, min(previous * (1 + RETRY_AFTER_STEP * (1 + random())), max_retry_after))
    return delay
