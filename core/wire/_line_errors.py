"""What a Batch API line that carries no answer means, per provider: whether it is sent again, and whether the
provider billed it. One table per provider, read when a results file is (``_batch_files``, ``_anthropic_answers``).

OpenAI (https://platform.openai.com/docs/guides/batch): ``batch_expired`` is the one per-line code its pages
document ("unfinished requests within that batch are cancelled ... You will be charged for tokens consumed from
any completed requests": an expired line was not completed, so not charged). ``batch_cancelled`` and
``request_timeout`` lines are found in practice, not on OpenAI's pages: a cancelled line never ran (not billed,
as an expired one); a timed-out one ran and was stopped, and whether its tokens were billed is not said, so it
counts as possibly billed. A line whose request reached the endpoint and failed carries an HTTP status: retried as
the real-time client retries that status (408, 409, 429, 5xx), and not billed (an error answer).

Anthropic (https://platform.claude.com/docs/en/build-with-claude/batch-processing): ``errored`` results are
never billed ("You will not be billed for these requests"), nor ``canceled`` or ``expired`` ones (not sent to the
model). Errored types that are the provider's trouble are sent again (its sample code: anything but
``invalid_request`` "can be retried directly"); the request's own faults, and the account's, fail.

Gemini (https://ai.google.dev/api/batch-mode): a request of a batch that has no answer carries a ``google.rpc.Status``
(``error``: ``code``, ``message``) in its inlined response or its line of the responses file. Its ``code`` is the
google.rpc code (3 INVALID_ARGUMENT, 8 RESOURCE_EXHAUSTED, 14 UNAVAILABLE ...); an HTTP status (400, 429, 503) is
read too, as some servers write it. The service's trouble (a quota, an overload, a deadline, an internal error, a
request cancelled with its batch) is sent again, as the real-time client retries it; the request's own faults and
the key's fail. Google says nothing of billing for a request without an answer: counted as not billed (an error
answer, as OpenAI's).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from .._retry import should_retry_status

__all__ = ["ANTHROPIC_LINE_ERRORS", "GEMINI_RPC_CODES", "OPENAI_LINE_ERRORS", "LineError", "anthropic_line_error",
           "gemini_line_error", "openai_line_error"]


class LineError(NamedTuple):
    """How a line without an answer is settled: ``retry`` (sent again: in another batch, or real-time), and
    ``billed`` (True, False, or None when the provider does not say: counted as possibly billed)."""

    retry: bool
    billed: bool | None


OPENAI_LINE_ERRORS: Mapping[str, LineError] = MappingProxyType({
    "batch_expired": LineError(retry=True, billed=False),
    "batch_cancelled": LineError(retry=True, billed=False),
    "request_timeout": LineError(retry=True, billed=None),
})
# Error types of an errored result (result.error.error.type), and the two results that were never sent: none of
# them billed; the provider's trouble sent again, the request's or the account's own not.
_ANTHROPIC_RETRIED = ("api_error", "overloaded_error", "rate_limit_error", "timeout_error", "canceled", "expired")
_ANTHROPIC_FAILED = ("invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                     "billing_error", "request_too_large")
ANTHROPIC_LINE_ERRORS: Mapping[str, LineError] = MappingProxyType({
    **{code: LineError(retry=True, billed=False) for code in _ANTHROPIC_RETRIED},
    **{code: LineError(retry=False, billed=False) for code in _ANTHROPIC_FAILED},
})
# An error code neither provider documents: not sent again (it may be the request's fault), not billed.
_UNKNOWN = LineError(retry=False, billed=False)


def openai_line_error(code: str | None, *, status: int | None = None) -> LineError:
    """An OpenAI output or error line's ``error.code``, or the HTTP ``status`` of its response."""
    if status is not None:
        # The one retry policy's rule for a status; a batch line carries no headers to say otherwise.
        return LineError(retry=should_retry_status(status), billed=False)
    return OPENAI_LINE_ERRORS.get(code or "", _UNKNOWN)


def anthropic_line_error(code: str | None) -> LineError:
    """An Anthropic result line's errored type, or ``canceled`` / ``expired``."""
    return ANTHROPIC_LINE_ERRORS.get(code or "", _UNKNOWN)


# google.rpc.Code: each number's name (googleapis google/rpc/code.proto).
GEMINI_RPC_CODES: Mapping[int, str] = MappingProxyType({
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
})
_GEMINI_RETRIED = frozenset({"CANCELLED", "UNKNOWN", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL",
                             "UNAVAILABLE"})


def gemini_line_error(code: int | None, *, status: str | None = None) -> tuple[str, LineError]:
    """A Gemini batch request's error ``code`` (google.rpc, or an HTTP status from 100 up) as (its name, how it is
    settled); with no code, its ``status`` word (``UNAVAILABLE``...) is read instead."""
    if code is not None and code >= 100:
        return status or f"http_{code}", LineError(retry=should_retry_status(code), billed=False)
    name = GEMINI_RPC_CODES.get(code, "UNKNOWN") if code is not None else status or "UNKNOWN"
    return name, LineError(retry=name in _GEMINI_RETRIED, billed=False)
