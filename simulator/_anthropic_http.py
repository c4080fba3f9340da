"""Anthropic-shaped HTTP answers of the simulator: the error envelope, RFC 3339 times and rate-limit headers.

Every Anthropic error is ``{"type": "error", "error": {"type", "message"}}``, its type fixed by the status;
a 429 and a 529 carry ``retry-after`` (and ``retry-after-ms``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from ._http import json_response, retry_after_headers
from ._serving import LimitView

__all__ = [
    "ERROR_TYPES",
    "anthropic_error",
    "error_payload",
    "ratelimit_headers",
    "rfc3339",
    "spend_limit_error",
]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# What a forced status says when its caller has nothing more precise.
_FAULT_MESSAGES = {
    400: "Simulated bad request (simulator fault 400).",
    401: "invalid x-api-key (simulator fault 401).",
    402: "Your credit balance is too low to access the Anthropic API (simulator fault 402).",
    403: "Your API key does not have permission to use the specified resource (simulator fault 403).",
    404: "The requested resource could not be found (simulator fault 404).",
    413: "Request exceeds the maximum allowed number of bytes (simulator fault 413).",
    429: "Number of requests has exceeded your rate limit (simulator fault 429).",
    500: "Internal server error",
    502: "Bad gateway.",
    503: "Service unavailable.",
    504: "The request timed out while processing. Consider using streaming for long-running requests.",
    529: "Overloaded",
}
_RETRY_AFTER_STATUSES = frozenset({429, 529})


def error_payload(status: int, message: str | None = None) -> dict[str, Any]:
    """The error envelope for ``status``; also what an errored batch result carries as its ``error``."""
    return {"type": "error", "error": {"type": ERROR_TYPES[status], "message": message or _FAULT_MESSAGES[status]}}


def anthropic_error(
    status: int,
    message: str | None = None,
    *,
    retry_after: float | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An Anthropic error answer; a 429 or 529 says when to come back (``retry_after`` seconds, default 1)."""
    all_headers: dict[str, str] = {}
    if status in _RETRY_AFTER_STATUSES:
        all_headers.update(retry_after_headers(1.0 if retry_after is None else retry_after))
    if headers:
        all_headers.update(headers)
    return json_response(error_payload(status, message), status=status, headers=all_headers)


def spend_limit_error() -> web.Response:
    """Anthropic's 429 for an organization past its monthly spend limit: no retry-after (waiting does not help),
    ``error.details.error_code`` saying why."""
    payload = error_payload(429, "You have reached your specified API usage limits. You will regain access on "
                                 "the first of next month (simulator fault insufficient_quota).")
    payload["error"]["details"] = {"error_code": "enforced_spend_limit_reached"}
    return json_response(payload, status=429)


def rfc3339(unix_time: float) -> str:
    """``2025-01-02T03:04:05.678901Z``, as Anthropic writes every time."""
    return datetime.fromtimestamp(unix_time, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def ratelimit_headers(views: Iterable[LimitView], *, wall_now: float) -> dict[str, str]:
    """``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``; reset is the RFC 3339 time it refills."""
    headers: dict[str, str] = {}
    for view in views:
        prefix = f"anthropic-ratelimit-{view.kind}"
        headers[f"{prefix}-limit"] = str(view.per_minute)
        headers[f"{prefix}-remaining"] = str(view.remaining)
        headers[f"{prefix}-reset"] = rfc3339(wall_now + view.reset_in)
    return headers
