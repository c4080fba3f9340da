"""Why an attempt failed, and what the user is told (naming the setting to change) when the client gives up."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import aiohttp
import httpx

from .._constants import RAW_BODY_CHARS
from .._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    status_error_class,
)
from ..wire._gemini_answers import retry_info_delay
from ..wire._responses import error_detail, error_reason
from ..wire._wire import STATUS_HINTS, UNUSABLE_HINT
from .._retry import DEFAULT_MAX_RETRY_AFTER, parse_retry_after, should_retry_status
from ._stops import lasting_failure

__all__ = ["LOST_GENERATION_RETRIES", "Failure", "Tally", "final_error",
           "scrub"]

# By the provider's reason (``error_reason``), before the status's hint: an account out of credit is a 429 too,
# and waiting or lowering the concurrency does nothing for it.
REASON_HINTS: dict[str, str] = {
    "insufficient_quota": "The account is out of credit or over its budget (insufficient_quota): add credit or "
                          "raise the project's limit in OpenAI's dashboard (Settings > Billing, Limits); waiting "
                          "does not help.",
    "model_not_found": "Check the model name, and that the key's project may use it (OpenAI's dashboard: "
                       "Settings > Project > Limits).",
}


# Attempts whose generation was lost (timed out after the request was sent, or cut off after its status line) that
# are tried again: each may have been billed, so one more, as the issue asks ("never paid twice" but once).
LOST_GENERATION_RETRIES = 1


@dataclass(frozen=True, slots=True)
class Failure:
    """Why one attempt did not succeed, kept until we know whether it is the last.

    ``status``: an error status; ``timeout``: no answer within the deadline; ``connection``: no answer (refused,
    reset, closed before a status line); ``cut``: a status line came, then the connection closed before the body
    was whole; ``invalid``: a 2xx whose body is no answer. ``sent``: the request reached the server (not a failure
    to connect). ``max_retry_after``: the longest Retry-After the client honours; a status asking for longer is
    not retried (openai-python's rule). ``asked``: the answer's headers with the wait its body asks as
    ``retry-after-ms``, for a provider that says it there (Gemini's ``RetryInfo.retryDelay``) and not in a header:
    every rule that reads a Retry-After (the retry's wait, a wait too long to wait, the shared pause) reads it.
    """

    kind: Literal["status", "timeout", "connection", "cut", "invalid"]
    detail: str
    response: httpx.Response | None = None
    cause: BaseException | None = None
    sent: bool = True
    status_code: int | None = None
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    asked: httpx.Headers | None = None

    @classmethod
    def status(cls, response: httpx.Response, *, max_retry_after: float = DEFAULT_MAX_RETRY_AFTER) -> Failure:
        return cls("status", error_detail(response), response=response, status_code=response.status_code,
                   max_retry_after=max_retry_after, asked=_asked_in_body(response))

    @classmethod
    def deadline(cls, timeout: float, cause: BaseException) -> Failure:
        return cls("timeout", f"the {timeout:g}s deadline for one attempt passed", cause=cause)

    @classmethod
    def cut(cls, status_code: int, exc: BaseException) -> Failure:
        """The answer's status line came, then its body stopped short (the connection closed or failed)."""
        return cls("cut", f"HTTP {status_code} cut off after its status line ({_describe(exc)})", cause=exc,
                   status_code=status_code)

    @classmethod
    def transport(cls, exc: BaseException) -> Failure:
        """A transport error, classified by the socket-level error behind it when the chain holds one."""
        reason = _transport_reason(exc)
        if reason is None:
            timed_out = isinstance(exc, httpx.TimeoutException)
            reason = exc
        else:
            timed_out = isinstance(reason, TimeoutError)
        return cls("timeout" if timed_out else "connection", _describe(reason), cause=exc, sent=not _connecting(exc))

    @property
    def headers(self) -> httpx.Headers | None:
        if self.asked is not None:
            return self.asked
        return self.response.headers if self.response is not None else None

    @property
    def retryable(self) -> bool:
        """Whether to try again now. Never a 2xx that was read (``invalid``: it may have been billed), nor an
        answer that would only repeat (``lasting``: a refused key, an account out of credit, a server asking to
        wait longer than the client waits). A lost generation is retried, ``LOST_GENERATION_RETRIES`` times at
        most (the client counts)."""
        if self.kind == "status":
            assert self.response is not None
            if self.lasting is not None:
                return False
            return should_retry_status(self.response.status_code, self.response.headers)
        return self.kind != "invalid"

    @property
    def lasting(self) -> str | None:
        """The ``core._stops.LastingKind`` of an error status that stays the same on every try, else None."""
        if self.kind != "status" or self.response is None:
            return None
        if self.wait_asked is not None:
            return "wait"
        return lasting_failure(self.response.status_code, error_reason(self.response))

    @property
    def wait_asked(self) -> float | None:
        """The Retry-After of a status that asks for longer than the client waits (not retried), else None."""
        asked = parse_retry_after(self.headers) if self.kind == "status" else None
        return asked if asked is not None and asked > self.max_retry_after else None

    @property
    def lost_generation(self) -> bool:
        """The request reached the model and its answer was lost: timed out once sent, or cut off after its status."""
        return self.kind == "cut" or (self.kind == "timeout" and self.sent)

    @property
    def maybe_billed(self) -> bool:
        """Whether the provider may have billed this attempt: it answered 2xx (read or cut off), or timed out
        while generating. An error status, or a connection refused or closed before any answer, is not billed."""
        if self.kind == "invalid":
            return True
        if self.kind == "cut":
            return self.status_code is not None and 200 <= self.status_code < 300
        return self.kind == "timeout" and self.sent

    def describe(self) -> str:
        """Short, safe for logs: no bodies, no headers."""
        if self.kind == "status":
            assert self.response is not None
            return f"HTTP {self.response.status_code}"
        if self.kind == "invalid":
            return "an invalid response body"
        return self.detail


class Tally:
    """One call's attempts so far: how many, when the first passed the client's gates, those the provider may have
    billed, and those whose generation was lost (each tried again once)."""

    __slots__ = ("admitted_at", "attempts", "billed", "lost")

    def __init__(self) -> None:
        self.attempts = self.billed = self.lost = 0
        self.admitted_at = 0.0

    def failed(self, failure: Failure, *, paced: bool, retries: int) -> bool:
        """Count a failed attempt; whether it was the last one allowed."""
        self.billed += failure.maybe_billed
        # A generation (a chat) is what costs: a lost one is tried again once. A file's transfer cut short is
        # retried as any connection error.
        self.lost += paced and failure.lost_generation
        return self.attempts > retries or self.lost > LOST_GENERATION_RETRIES


def final_error(
    failure: Failure,
    *,
    method: str,
    path: str,
    attempts: int,
    base_url: str,
    secret: str | Sequence[str] | None,
    hints: Mapping[int | str, str] = STATUS_HINTS,
    unusable_hint: str = UNUSABLE_HINT,
    url_setting: str = "LLM_DISPATCH_BASE_URL",
    maybe_billed: int = 0,
    lost: int = 0,
) -> APIError:
    """The exception for a call that gives up: what happened, and what to change (``hints``: the provider's
    advice per status, or per reason (``error_reason``) where one status has several); ``secret`` never shows
    in it. ``maybe_billed``: the call's attempts the provider may have billed (stored with the failure);
    ``lost``: how many lost their generation (timed out once sent, or cut off), which a later run does not repeat
    once the client has given up on them."""
    error = _error(failure, _GiveUp(f"{method} {path}", attempts, base_url, secret, hints, unusable_hint,
                                    url_setting, lost))
    error.maybe_billed = maybe_billed
    return error


class _GiveUp(NamedTuple):
    """What ``final_error`` was told of the call it words the exception for."""

    where: str
    attempts: int
    base_url: str
    secret: str | Sequence[str] | None
    hints: Mapping[int | str, str]
    unusable_hint: str
    url_setting: str
    lost: int


def _error(failure: Failure, call: _GiveUp) -> APIError:
    """``final_error``'s exception, before the attempts it may have billed are set on it."""
    where, attempts, base_url, secret, hints, unusable_hint, url_setting, lost = call
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    if failure.kind == "status":
        response = failure.response
        assert response is not None
        status = response.status_code
        request_id = (response.headers.get("x-request-id") or response.headers.get("request-id")
                      or response.headers.get("apim-request-id"))
        reason = error_reason(response)
        hint = REASON_HINTS.get(reason or "") or hints.get(reason or "") or hints.get(
            status, "The provider failed; try again later." if status >= 500 else "")
        asked = failure.wait_asked
        if asked is not None:
            # As openai-python: a wait longer than the client's is not waited in the run; the prompt is kept.
            hint = (f"The provider asked to wait {asked:.0f} s (Retry-After), longer than the "
                    f"{failure.max_retry_after:.0f} s llm-dispatch waits (LLM_DISPATCH_MAX_RETRY_AFTER): run the "
                    "same command again after that.")
        message = f"HTTP {status} from {where} after {tries}: {failure.detail.rstrip('.')}."
        if request_id:
            message += f" Request id {request_id}."
        if hint:
            message += f" {hint}"
        lasting = failure.lasting
        error = status_error_class(status)(
            scrub(message, secret), status_code=status, request_id=request_id, attempts=attempts,
            # Not retried now, but sent again by a later run: a lasting failure passes once its cause is fixed.
            retryable=failure.retryable or lasting is not None,
        )
        error.code, error.lasting = reason, lasting
        return error
    if failure.lost_generation and lost > LOST_GENERATION_RETRIES:
        # Each lost generation may have been billed: not sent a third time, nor by a later run on its own.
        what = "cut off after its status line" if failure.kind == "cut" else "not back within its deadline"
        message = (
            f"The answer to {where} was {what} on {lost} attempts ({failure.detail}); each may have been billed, "
            "so it is not sent again (--retry-failed all sends it). For a long answer, raise "
            "LLM_DISPATCH_REQUEST_TIMEOUT or give the prompt a max_completion_tokens / max_tokens (its deadline "
            "grows with it)."
        )
        lost_error: APIError = (APITimeoutError if failure.kind == "timeout" else APIConnectionError)(
            scrub(message, secret), attempts=attempts)
        lost_error.retryable = False
        return lost_error
    if failure.kind == "timeout":
        message = (
            f"No response to {where} after {tries} ({failure.detail}). Raise LLM_DISPATCH_REQUEST_TIMEOUT "
            "(or LLM_DISPATCH_CONNECT_TIMEOUT) for slow answers, or lower LLM_DISPATCH_CONCURRENCY."
        )
        return APITimeoutError(scrub(message, secret), attempts=attempts)
    if failure.kind in ("connection", "cut"):
        message = (
            f"Could not get an answer from {base_url} for {where} after {tries} "
            f"({failure.detail}). Check {url_setting} and the network."
        )
        return APIConnectionError(scrub(message, secret), attempts=attempts)
    received = f"HTTP {failure.response.status_code}" if failure.response is not None else "the answer"
    message = (f"Unusable answer to {where} after {tries}: {failure.detail}. {received} was received and may have "
               f"been billed, so it is not sent again (--retry-failed all sends it). {unusable_hint}")
    unusable = APIResponseValidationError(scrub(message, secret), attempts=attempts)
    # What the body said it used, when it said so: its cost is stored with the failure; and the body itself,
    # for inspection (its start: a proxy's error page, an answer in an unknown shape).
    unusable.usage = getattr(failure.cause, "usage", None)
    if failure.response is not None:
        unusable.raw_body = scrub(failure.response.content[:RAW_BODY_CHARS * 4].decode("utf-8", "replace")[
            :RAW_BODY_CHARS], secret)
    return unusable


def _asked_in_body(response: httpx.Response) -> httpx.Headers | None:
    """The answer's headers plus ``retry-after-ms`` from a ``google.rpc.RetryInfo`` in its error body, when it asks
    a wait there and in no header; else None (the headers say all there is)."""
    headers = response.headers
    if "retry-after" in headers or "retry-after-ms" in headers or b"RetryInfo" not in response.content:
        return None
    try:
        delay = retry_info_delay(response.json())
    except ValueError:
        return None
    if delay is None:
        return None
    asked = headers.copy()
    asked["retry-after-ms"] = f"{delay * 1000:g}"
    return asked


def scrub(text: str, secret: str | Sequence[str] | None) -> str:
    """``text`` without ``secret`` (or any of several): some providers echo the key they rejected, or the project
    id a key may not use, and neither must reach a log or the database."""
    for value in (secret,) if isinstance(secret, str) else secret or ():
        if value:
            text = text.replace(value, "***")
    return text


def _describe(exc: BaseException) -> str:
    """``ClassName: message``, or the class name alone when the message is empty."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _connecting(exc: BaseException) -> bool:
    """Whether a transport error happened before the request reached the server (connecting, or the proxy)."""
    seen: set[int] = set()
    chain: list[BaseException] = [exc]
    while chain:
        current = chain.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (httpx.ConnectError, httpx.ConnectTimeout, httpx.ProxyError,
                                aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
            return True
        chain.extend(link for link in (current.__cause__, current.__context__) if link is not None)
    return False


def _transport_reason(exc: BaseException) -> BaseException | None:
    """The socket-level error behind a transport exception, if the chain holds one.

    An httpx error class says less than its cause: a transport may map a dropped connection to a
    timeout class (httpx-aiohttp maps every ``ClientConnectionError`` to ``httpx.ConnectTimeout``), and
    the aiohttp or OS error it was raised from says what really happened. Without one (respx,
    httpx's own transport) the httpx class is all there is to go on.
    """
    seen: set[int] = set()
    queue: list[BaseException] = [exc]
    while queue:
        current = queue.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, (TimeoutError, aiohttp.ClientError, OSError)):
            return current
        queue.extend(link for link in (current.__cause__, current.__context__) if link is not None)
    return None
