"""The async client for OpenAI-compatible APIs: one retry loop, under the shared limits, for every call.

``LLMClient._request`` owns the loop (retry rules from ``_retry``, limits from ``_limits``); ``chat``
is a thin method on top, and file upload/download and batches can be added the same way.
"""

from __future__ import annotations

import asyncio
import json as _json
import logging
import random as _random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Literal, NamedTuple, TypeVar
from urllib.parse import quote

import aiohttp
import httpx
import yarl
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions
from pydantic import SecretStr

from ._batch_types import BATCH_CHAT_ENDPOINT, DEFAULT_COMPLETION_WINDOW, BatchInfo, FileInfo
from ._exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    NotFoundError,
    status_error_class,
)
from ._limits import AdaptiveLimiter, Permit, RateLimiter, SharedPause
from ._retry import DEFAULT_MAX_RETRY_AFTER, retry_delay, server_retry_after, should_retry_status
from ._settings import DEFAULT_BASE_URL, Settings
from ._tokens import estimate_request_tokens
from ._types import ChatRequest, ChatResult

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FILE_TIMEOUT",
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "LLMClient",
    "chat_result_from_body",
    "default_transport",
]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_RETRIES = 5
DEFAULT_CONCURRENCY = 64
# aiohttp's own default; an idle connection the server has already closed costs one retried attempt.
DEFAULT_KEEPALIVE_EXPIRY = 15.0
# Bodies up to this size (with a Content-Length) are read in one call; larger ones stream.
_BUFFER_LIMIT = 8 * 1024 * 1024
CHAT_COMPLETIONS_PATH = "/chat/completions"
FILES_PATH = "/files"
BATCHES_PATH = "/batches"
# Per attempt, for uploads and downloads: a 200 MB batch file over a slow link needs minutes, not seconds.
DEFAULT_FILE_TIMEOUT = 900.0
DEFAULT_LIST_LIMIT = 100  # OpenAI's largest page of batches
USER_AGENT = "llm-dispatch"
# How much of an unexpected body goes into an error message.
_SNIPPET_CHARS = 300

AuthHeader = Literal["authorization", "api-key"]
_T = TypeVar("_T")

_STATUS_HINTS: dict[int, str] = {
    400: "Fix the request: check the model name and the parameters sent.",
    401: "Check the API key (LLM_DISPATCH_API_KEY or OPENAI_API_KEY), and LLM_DISPATCH_AUTH_HEADER=api-key for Azure.",
    403: "The key may not use this model or endpoint; check the account's access.",
    404: "Check the model name and LLM_DISPATCH_BASE_URL (usually ending in /v1).",
    408: "The provider timed the request out; try again later.",
    409: "The provider reported a conflict; try again later.",
    422: "Fix the request parameters.",
    429: "Rate limited: lower LLM_DISPATCH_CONCURRENCY, set LLM_DISPATCH_RPM / LLM_DISPATCH_TPM, or check the quota.",
}


def default_transport(*, concurrency: int = DEFAULT_CONCURRENCY, tls: bool = True) -> httpx.AsyncBaseTransport:
    """aiohttp under httpx's API, with as many connections as requests may be in flight.

    httpx's own pool stalls well below 100 connections (encode/httpx#3215); this one does not. Its
    default cap of 100 connections would silently bound a higher concurrency, hence the explicit limit.
    ``tls=False`` is for a plain-http server (a local one, the simulator): it skips loading the CA
    bundle (~25 ms a client, measured). Its TLS context still verifies, with no CA to trust, so an
    https URL sent through it fails instead of going unchecked.
    """
    return _BufferedAiohttpTransport(
        verify=True if tls else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT),
        limits=httpx.Limits(
            max_connections=concurrency,
            max_keepalive_connections=concurrency,
            keepalive_expiry=DEFAULT_KEEPALIVE_EXPIRY,
        )
    )


class _BufferedAiohttpStream(httpx.AsyncByteStream):
    """The whole body in one aiohttp read, instead of 16 KB chunks through two stream wrappers."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with map_aiohttp_exceptions():
            body = await self._response.read()
        if body:
            yield body

    async def aclose(self) -> None:
        self._response.release()


class _BufferedAiohttpTransport(AiohttpTransport):
    """httpx-aiohttp's transport, answering with a body read in one go; and a direct JSON exchange.

    Chat completions are small; reading each through ``iter_chunked`` costs more CPU than the
    exchange at hundreds of requests a second. Larger or unsized bodies (downloads) still stream.
    ``exchange`` is the chat path: aiohttp straight, with no httpx request or response built
    around it (measured: half the client's CPU per call beyond aiohttp's own, at 2,000 calls/s).
    """

    async def exchange(
        self, *, method: str, url: yarl.URL, headers: Mapping[str, str], content: bytes, timeout: aiohttp.ClientTimeout
    ) -> _Answer:
        """Send ``content`` and read the whole answer (decompressed by aiohttp). Raises aiohttp's errors."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        async with self.client.request(
            method, url, data=content, headers=headers, allow_redirects=False, timeout=timeout
        ) as response:
            body = await response.read()
            return _Answer(status_code=response.status, raw_headers=response.raw_headers, content=body,
                           reason_phrase=response.reason or "")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        stream = response.stream
        raw = getattr(stream, "_aiohttp_response", None)
        length = raw.content_length if raw is not None else None
        if raw is not None and length is not None and length <= _BUFFER_LIMIT:
            response.stream = _BufferedAiohttpStream(raw)
        return response


class _Sent(NamedTuple, Generic[_T]):
    value: _T
    attempts: int
    # When the first attempt passed the client's gates: latency excludes the wait for a slot.
    admitted_at: float


@dataclass(frozen=True, slots=True)
class _Failure:
    """Why one attempt did not succeed, kept until we know whether it is the last."""

    kind: Literal["status", "timeout", "connection", "invalid"]
    detail: str
    response: _Body | None = None
    cause: BaseException | None = None

    @property
    def headers(self) -> httpx.Headers | None:
        return self.response.headers if self.response is not None else None

    @property
    def retryable(self) -> bool:
        if self.kind == "status":
            assert self.response is not None
            return should_retry_status(self.response.status_code, self.response.headers)
        return True

    def describe(self) -> str:
        """Short, safe for logs: no bodies, no headers."""
        if self.kind == "status":
            assert self.response is not None
            return f"HTTP {self.response.status_code}"
        if self.kind == "invalid":
            return "an invalid response body"
        return self.detail


@dataclass(frozen=True, slots=True)
class _Completion:
    text: str | None
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_tokens: int
    model: str | None
    response_id: str | None

    def result(self, *, latency_s: float, attempts: int) -> ChatResult:
        return ChatResult(
            text=self.text,
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            model=self.model,
            response_id=self.response_id,
            latency_s=latency_s,
            attempts=attempts,
        )


@dataclass(frozen=True, slots=True)
class _Answer:
    """A whole HTTP answer from the direct exchange; the parsers read it as they read an httpx.Response."""

    status_code: int
    raw_headers: tuple[tuple[bytes, bytes], ...]
    content: bytes
    reason_phrase: str

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def headers(self) -> httpx.Headers:
        return httpx.Headers(list(self.raw_headers))

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return _json.loads(self.content)

    def as_response(self, *, method: str, url: str) -> httpx.Response:
        """An httpx.Response for the error path (headers for Retry-After, the body for the message).

        aiohttp has already decompressed the body, so the encoding headers no longer describe it.
        """
        headers = [(name, value) for name, value in self.raw_headers
                   if name.lower() not in (b"content-encoding", b"content-length", b"transfer-encoding")]
        extensions = {"reason_phrase": self.reason_phrase.encode()} if self.reason_phrase else None
        return httpx.Response(self.status_code, headers=headers, content=self.content,
                              request=httpx.Request(method, url), extensions=extensions)


# What the parsers read: httpx's answer, or the direct exchange's.
_Body = httpx.Response | _Answer


class LLMClient:
    """An async client for one OpenAI-compatible endpoint, shared by every concurrent caller.

    Every attempt passes the same gates: the shared pause after a 429, the optional RPM/TPM
    buckets, and the adaptive concurrency limit (whose ceiling is ``concurrency``). ``sleep``,
    ``random`` and ``clock`` exist for tests; pass ``clock`` together with a ``sleep`` that moves it.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: SecretStr | str | None = None,
        auth_header: AuthHeader = "authorization",
        request_timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
        concurrency: int = DEFAULT_CONCURRENCY,
        rpm: int | None = None,
        tpm: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if auth_header not in ("authorization", "api-key"):
            raise ValueError(f"auth_header must be 'authorization' or 'api-key', got {auth_header!r}")
        if request_timeout <= 0 or connect_timeout <= 0:
            raise ValueError("request_timeout and connect_timeout must be positive")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {max_retries}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")

        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        if self._api_key is not None and not self._api_key.get_secret_value():
            self._api_key = None
        self._auth_header = auth_header
        self._request_timeout = float(request_timeout)
        self._max_retries = max_retries
        self._max_retry_after = float(max_retry_after)
        self._sleep = sleep
        self._random = random
        self._clock = clock

        self._limiter = AdaptiveLimiter(ceiling=concurrency)
        self._pause = SharedPause(clock=clock, sleep=sleep)
        self._rpm = RateLimiter(per_minute=rpm, clock=clock, sleep=sleep) if rpm else None
        self._tpm = RateLimiter(per_minute=tpm, clock=clock, sleep=sleep) if tpm else None

        url = httpx.URL(base_url.rstrip("/"))
        # Kept apart so a base URL with a query (Azure's ?api-version=...) keeps it on every path.
        self._display_url = str(url.copy_with(userinfo=b"", query=None))
        self._transport = (
            transport if transport is not None else default_transport(concurrency=concurrency, tls=url.scheme != "http")
        )
        timeouts = httpx.Timeout(self._request_timeout, connect=connect_timeout)
        self._http = httpx.AsyncClient(
            base_url=url.copy_with(query=None),
            params=url.params,
            headers=self._auth_headers(),
            timeout=timeouts,
            transport=self._transport,
            follow_redirects=False,
        )
        # The JSON fast path (every chat call) builds its request from these, parsed once: at
        # hundreds of requests a second, httpx's per-request URL merge, header merge and cookie
        # handling cost more CPU than the HTTP exchange itself.
        self._json_headers = httpx.Headers({**self._http.headers, "Content-Type": "application/json"})
        self._timeout_extension = timeouts.as_dict()
        self._json_urls: dict[str, httpx.URL] = {}
        self._json_raw_headers: list[tuple[bytes, bytes]] | None = None
        # Our own aiohttp transport takes JSON calls directly (see _BufferedAiohttpTransport.exchange);
        # any other (respx, MockTransport, a user's) gets the same calls through httpx's API.
        self._direct = self._transport if isinstance(self._transport, _BufferedAiohttpTransport) else None
        self._direct_urls: dict[str, yarl.URL] = {}
        # gzip and deflate only: aiohttp decodes the body here, and it decodes those two whatever is installed.
        self._direct_headers = {**self._json_headers, "Accept-Encoding": "gzip, deflate"}
        self._direct_timeout = aiohttp.ClientTimeout(
            sock_connect=timeouts.connect, sock_read=timeouts.read, connect=timeouts.pool
        )

    @classmethod
    def from_settings(cls, settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None) -> LLMClient:
        """The client a flow run uses: one per run, so ``settings.concurrency`` is its ceiling."""
        return cls(
            base_url=settings.base_url,
            api_key=settings.api_key,
            auth_header=settings.auth_header,
            request_timeout=settings.request_timeout,
            connect_timeout=settings.connect_timeout,
            max_retries=settings.max_retries,
            max_retry_after=settings.max_retry_after,
            concurrency=settings.concurrency,
            rpm=settings.rpm,
            tpm=settings.tpm,
            transport=transport,
        )

    def _auth_headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT}
        if self._api_key is not None:
            key = self._api_key.get_secret_value()
            if self._auth_header == "api-key":
                headers["api-key"] = key
            else:
                headers["Authorization"] = f"Bearer {key}"
        return headers

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else "none"
        return (
            f"LLMClient(base_url={self._display_url!r}, api_key={key}, auth_header={self._auth_header!r}, "
            f"concurrency={self._limiter.limit}/{self._limiter.ceiling}, in_flight={self._limiter.in_flight})"
        )

    @property
    def limiter(self) -> AdaptiveLimiter:
        """The adaptive concurrency limit: ``.limit`` now, ``.ceiling``, ``.in_flight`` (for progress display)."""
        return self._limiter

    @property
    def pause(self) -> SharedPause:
        return self._pause

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (and the transport, including one that was passed in)."""
        await self._http.aclose()

    async def chat(self, request: ChatRequest) -> ChatResult:
        """One chat completion, retried by the house rules; raises an ``APIError`` subclass when it gives up."""
        estimate = estimate_request_tokens(request) if self._tpm is not None else 0
        sent = await self._request(
            "POST", CHAT_COMPLETIONS_PATH, json=request.body(), parse=_parse_chat, tokens=estimate
        )
        completion: _Completion = sent.value
        if self._tpm is not None:
            self._tpm.adjust(completion.total_tokens - estimate)
        return completion.result(latency_s=self._clock() - sent.admitted_at, attempts=sent.attempts)

    # --- files and batches (the Batch API) -------------------------------------------------------
    # Same loop, same rules as chat: a 5xx or timeout on create_batch is retried, so a create that did
    # reach the provider may be sent twice; callers that care tag batches through ``metadata``.

    async def upload_file(self, path: Path, *, purpose: str = "batch", timeout: float | None = None) -> FileInfo:
        """Upload ``path`` as multipart form data, streamed from disk; a retry sends the whole file again.

        ``timeout`` bounds one attempt (default: the larger of ``DEFAULT_FILE_TIMEOUT`` and the request timeout).
        """
        path = Path(path)
        with path.open("rb") as handle:
            sent = await self._request(
                "POST",
                FILES_PATH,
                files={"file": (path.name, handle, "application/jsonl")},
                data={"purpose": purpose},
                parse=_parse_file_info,
                timeout=self._transfer_timeout(timeout),
            )
        return sent.value

    async def retrieve_file(self, file_id: str) -> FileInfo:
        sent = await self._request("GET", f"{FILES_PATH}/{_segment(file_id)}", parse=_parse_file_info)
        return sent.value

    async def download_file(self, file_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream a file's content to ``to`` (written beside it and renamed, so never half a file); returns ``to``."""
        to = Path(to)
        # Made up front: a missing directory would otherwise look like a network error and be retried.
        to.parent.mkdir(parents=True, exist_ok=True)
        sent = await self._request(
            "GET", f"{FILES_PATH}/{_segment(file_id)}/content", stream_to=to, timeout=self._transfer_timeout(timeout)
        )
        return sent.value

    async def delete_file(self, file_id: str, *, missing_ok: bool = False) -> None:
        """Delete a file; with ``missing_ok`` a file that is already gone (say, a retried delete) is no error."""
        try:
            await self._request("DELETE", f"{FILES_PATH}/{_segment(file_id)}")
        except NotFoundError:
            if not missing_ok:
                raise

    async def create_batch(
        self,
        *,
        input_file_id: str,
        endpoint: str = BATCH_CHAT_ENDPOINT,
        completion_window: str = DEFAULT_COMPLETION_WINDOW,
        metadata: Mapping[str, str] | None = None,
        max_retries: int | None = None,
    ) -> BatchInfo:
        """Create a batch. ``max_retries`` overrides the client's for this call: a caller that looks a lost
        create up before trying again (``jobs``) passes 0 and runs its own loop."""
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if metadata is not None:
            body["metadata"] = dict(metadata)
        sent = await self._request("POST", BATCHES_PATH, json=body, parse=_parse_batch_info, max_retries=max_retries)
        return sent.value

    async def retrieve_batch(self, batch_id: str) -> BatchInfo:
        sent = await self._request("GET", f"{BATCHES_PATH}/{_segment(batch_id)}", parse=_parse_batch_info)
        return sent.value

    async def cancel_batch(self, batch_id: str) -> BatchInfo:
        """Ask the provider to stop a batch; it answers ``cancelling`` and reaches ``cancelled`` later."""
        sent = await self._request("POST", f"{BATCHES_PATH}/{_segment(batch_id)}/cancel", parse=_parse_batch_info)
        return sent.value

    async def list_batches(self, *, limit: int = DEFAULT_LIST_LIMIT, after: str | None = None) -> list[BatchInfo]:
        """One page of batches, newest first; ``after`` is the id of the last batch of the previous page."""
        page = await self._batch_page(limit=limit, after=after)
        return page.batches

    async def iter_batches(self, *, page_size: int = DEFAULT_LIST_LIMIT) -> AsyncIterator[BatchInfo]:
        """Every batch, newest first, fetched a page at a time."""
        after: str | None = None
        while True:
            page = await self._batch_page(limit=page_size, after=after)
            for batch in page.batches:
                yield batch
            if not page.has_more or not page.batches:
                return
            after = page.batches[-1].id

    async def _batch_page(self, *, limit: int, after: str | None) -> _BatchPage:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        params = {"limit": str(limit)}
        if after is not None:
            params["after"] = after
        sent = await self._request("GET", BATCHES_PATH, params=params, parse=_parse_batch_page)
        return sent.value

    def _transfer_timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            if timeout <= 0:
                raise ValueError(f"timeout must be positive, got {timeout}")
            return timeout
        return max(self._request_timeout, DEFAULT_FILE_TIMEOUT)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        files: Any = None,
        data: Mapping[str, Any] | None = None,
        stream_to: Path | None = None,
        parse: Callable[[_Body], Any] | None = None,
        tokens: int = 0,
        timeout: float | None = None,
        params: Mapping[str, str] | None = None,
        max_retries: int | None = None,
    ) -> _Sent[Any]:
        """Send one API call, retrying by the house rules, and return what ``parse`` makes of the answer.

        ``parse`` raises ``APIResponseValidationError`` for a 2xx body it cannot use (that is retried);
        by default it returns the JSON body, or ``stream_to`` once the body has been saved there.
        ``tokens`` is the call's estimated cost against the TPM limit; ``timeout`` overrides the
        per-attempt deadline (a large download may need longer than a completion). ``params`` is the
        query, merged with the base URL's own (a query written into ``path`` would be lost to it).
        ``max_retries`` overrides the client's for this call.
        """
        retries = self._max_retries if max_retries is None else max_retries
        if retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {retries}")
        deadline = self._request_timeout if timeout is None else timeout
        if parse is None:
            parse = _parse_json if stream_to is None else (lambda _response: stream_to)
        attempt = 0
        while True:
            attempt += 1
            permit = await self._admit(tokens)
            if attempt == 1:
                admitted_at = self._clock()
            try:
                outcome = await self._send_once(
                    method, path, json=json, files=files, data=data, stream_to=stream_to, timeout=deadline,
                    params=params,
                )
                if isinstance(outcome, _Failure):
                    failure = outcome
                elif outcome.is_success:
                    try:
                        value = parse(outcome)
                    except APIResponseValidationError as exc:
                        failure = _Failure("invalid", exc.message, response=outcome, cause=exc)
                    else:
                        self._limiter.record_success(permit)
                        return _Sent(value, attempt, admitted_at)
                else:
                    failure = _Failure("status", _error_detail(outcome), response=outcome)
                    if outcome.status_code == 429:
                        self._on_rate_limited(permit, outcome.headers)
            finally:
                # Released before any retry sleep, so a waiting request never holds a slot.
                self._limiter.release()

            if not failure.retryable or attempt > retries:
                raise self._final_error(failure, method=method, path=path, attempts=attempt) from failure.cause
            delay = retry_delay(
                retries_taken=attempt - 1,
                headers=failure.headers,
                max_retry_after=self._max_retry_after,
                random=self._random,
            )
            logger.info(
                "%s %s: %s on attempt %d of %d; retrying in %.2fs",
                method, path, self._scrub(failure.describe()), attempt, retries + 1, delay,
            )
            await self._sleep(delay)

    async def _admit(self, tokens: int) -> Permit:
        """Wait at every gate in turn; a pause is waited out without holding a concurrency slot."""
        await self._pause.wait()
        if self._rpm is not None:
            await self._rpm.acquire(1)
        if self._tpm is not None and tokens > 0:
            await self._tpm.acquire(tokens)
        while True:
            await self._pause.wait()
            seen = self._pause.deadline
            permit = await self._limiter.acquire()
            # A 429 elsewhere may have paused everyone while we queued for the slot. (Comparing deadlines
            # rather than reading the clock keeps a test's motionless fake clock from looping here.)
            if self._pause.deadline == seen or self._pause.remaining <= 0:
                return permit
            self._limiter.release()

    def _on_rate_limited(self, permit: Permit, headers: httpx.Headers) -> None:
        if self._limiter.record_rate_limit(permit):
            logger.warning(
                "HTTP 429: concurrency limit lowered to %d of %d", self._limiter.limit, self._limiter.ceiling
            )
        wait = server_retry_after(headers, max_retry_after=self._max_retry_after)
        if wait is not None:
            self._pause.pause_for(wait)

    async def _send_once(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        files: Any,
        data: Mapping[str, Any] | None,
        stream_to: Path | None,
        timeout: float,
        params: Mapping[str, str] | None = None,
    ) -> _Body | _Failure:
        """One HTTP attempt with a hard deadline over connect, send and the whole body."""
        fast = json is not None and files is None and data is None and params is None and stream_to is None
        if fast and self._direct is not None:
            return await self._exchange_directly(method, path, json, timeout=timeout)
        if fast:
            request = self._json_request(method, path, json)
        else:
            # Built afresh each attempt: a multipart body is a stream that one attempt consumes.
            request = self._http.build_request(method, path, json=json, files=files, data=data, params=params)
        try:
            # The transport only bounds each socket read; a server that trickles bytes, or a pool that
            # never frees a connection, must not stretch an attempt past its deadline.
            async with asyncio.timeout(timeout):
                if fast:
                    response = await self._transport.handle_async_request(request)
                else:
                    response = await self._http.send(request, stream=True)
                try:
                    if stream_to is not None and response.is_success:
                        await _save_body(response, stream_to)
                    else:
                        await response.aread()
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            return _Failure("timeout", f"the {timeout:g}s deadline for one attempt passed", cause=exc)
        except httpx.DecodingError as exc:
            return _Failure("invalid", f"the body could not be decoded: {exc}", cause=exc)
        except (httpx.TransportError, aiohttp.ClientError, OSError) as exc:
            reason = _transport_reason(exc)
            if reason is None:
                timed_out = isinstance(exc, httpx.TimeoutException)
                reason = exc
            else:
                timed_out = isinstance(reason, TimeoutError)
            return _Failure("timeout" if timed_out else "connection", _describe(reason), cause=exc)
        return response

    async def _exchange_directly(self, method: str, path: str, body: Any, *, timeout: float) -> _Answer | httpx.Response | _Failure:
        """The JSON fast path over our aiohttp transport: a 2xx answer as read, an error as an httpx.Response."""
        assert self._direct is not None
        url = self._direct_urls.get(path)
        if url is None:
            url = self._direct_urls[path] = yarl.URL(str(self._json_url(method, path)), encoded=True)
        content = _encode_json(body)
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                answer = await self._direct.exchange(method=method, url=url, headers=self._direct_headers,
                                                     content=content, timeout=self._direct_timeout)
        except TimeoutError as exc:
            if deadline.expired():
                return _Failure("timeout", f"the {timeout:g}s deadline for one attempt passed", cause=exc)
            # aiohttp's own socket timeouts (connect, read) are TimeoutErrors too.
            return _Failure("timeout", _describe(exc), cause=exc)
        except (aiohttp.ClientError, OSError) as exc:
            return _Failure("connection", _describe(exc), cause=exc)
        if answer.is_success:
            return answer
        return answer.as_response(method=method, url=str(url))

    def _json_url(self, method: str, path: str) -> httpx.URL:
        url = self._json_urls.get(path)
        if url is None:
            url = self._json_urls[path] = self._http.build_request(method, path).url
        return url

    def _json_request(self, method: str, path: str, body: Any) -> httpx.Request:
        url = self._json_url(method, path)
        if self._json_raw_headers is None:
            self._json_raw_headers = [(b"Host", url.netloc), *self._json_headers.raw]
        content = _encode_json(body)
        # Headers complete up front and a ready stream: httpx then skips its per-request _prepare().
        headers = httpx.Headers([*self._json_raw_headers, (b"Content-Length", str(len(content)).encode())])
        request = httpx.Request(method, url, headers=headers, stream=httpx.ByteStream(content),
                                extensions={"timeout": self._timeout_extension})
        request.read()
        return request

    def _final_error(self, failure: _Failure, *, method: str, path: str, attempts: int) -> APIError:
        where = f"{method} {path}"
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        if failure.kind == "status":
            response = failure.response
            assert response is not None
            status = response.status_code
            request_id = response.headers.get("x-request-id") or response.headers.get("apim-request-id")
            hint = _STATUS_HINTS.get(status, "The provider failed; try again later." if status >= 500 else "")
            message = f"HTTP {status} from {where} after {tries}: {failure.detail.rstrip('.')}."
            if request_id:
                message += f" Request id {request_id}."
            if hint:
                message += f" {hint}"
            return status_error_class(status)(
                self._scrub(message), status_code=status, request_id=request_id, attempts=attempts
            )
        if failure.kind == "timeout":
            return APITimeoutError(
                self._scrub(
                    f"No response to {where} after {tries} ({failure.detail}). Raise LLM_DISPATCH_REQUEST_TIMEOUT "
                    "(or LLM_DISPATCH_CONNECT_TIMEOUT) for slow answers, or lower LLM_DISPATCH_CONCURRENCY."
                ),
                attempts=attempts,
            )
        if failure.kind == "connection":
            return APIConnectionError(
                self._scrub(
                    f"Could not get an answer from {self._display_url} for {where} after {tries} "
                    f"({failure.detail}). Check LLM_DISPATCH_BASE_URL and the network."
                ),
                attempts=attempts,
            )
        return APIResponseValidationError(
            self._scrub(
                f"Unusable answer to {where} after {tries}: {failure.detail}. Check that LLM_DISPATCH_BASE_URL "
                "points at an OpenAI-compatible API (usually ending in /v1)."
            ),
            attempts=attempts,
        )

    def _scrub(self, text: str) -> str:
        # Some providers echo the key they rejected; it must not reach a log or the database.
        if self._api_key is not None:
            key = self._api_key.get_secret_value()
            if key:
                text = text.replace(key, "***")
        return text


class _BatchPage(NamedTuple):
    batches: list[BatchInfo]
    has_more: bool


def _segment(resource_id: str) -> str:
    # An id goes into the path as one segment; a stray "/" or "?" must not reach another endpoint.
    if not resource_id:
        raise ValueError("an empty id cannot name a file or a batch")
    return quote(resource_id, safe="")


def _parse_file_info(response: _Body) -> FileInfo:
    return FileInfo.from_api(_parse_json(response))


def _parse_batch_info(response: _Body) -> BatchInfo:
    return BatchInfo.from_api(_parse_json(response))


def _parse_batch_page(response: _Body) -> _BatchPage:
    body = _parse_json(response)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise APIResponseValidationError(f"the body is not a list of batches: {_snippet(response)}")
    return _BatchPage([BatchInfo.from_api(item) for item in data], bool(body.get("has_more")))


def _encode_json(body: Any) -> bytes:
    return _json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _describe(exc: BaseException) -> str:
    """``ClassName: message``, or the class name alone when the message is empty."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _transport_reason(exc: BaseException) -> BaseException | None:
    """The socket-level error behind a transport exception, if the chain holds one.

    httpx-aiohttp maps every ``ClientConnectionError`` (so a dropped connection too) to
    ``httpx.ConnectTimeout``; the aiohttp or OS error it was raised from says what really happened.
    Without one (respx, httpx's own transport) the httpx class is all there is to go on.
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


async def _save_body(response: httpx.Response, path: Path) -> None:
    # Written beside the target and renamed at the end, so a failed attempt never leaves half a file.
    partial = path.with_name(path.name + ".part")
    try:
        with partial.open("wb") as out:
            async for chunk in response.aiter_bytes():
                out.write(chunk)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _snippet(response: _Body) -> str:
    text = response.text.strip()
    return repr(text[:_SNIPPET_CHARS] + ("..." if len(text) > _SNIPPET_CHARS else ""))


def _error_detail(response: _Body) -> str:
    """The provider's own explanation of an error status, as short as it can be."""
    try:
        body = response.json()
    except ValueError:
        return _snippet(response) if response.text.strip() else response.reason_phrase or "no body"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        if body.get("message"):
            return str(body["message"])
    return _snippet(response)


def _parse_json(response: _Body) -> Any:
    try:
        return response.json()
    except ValueError as exc:  # also covers UnicodeDecodeError
        raise APIResponseValidationError(f"the body is not JSON: {_snippet(response)}") from exc


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _parse_chat(response: _Body) -> _Completion:
    body = _parse_json(response)
    completion = _completion_from_body(body)
    if completion is None:
        detail = _error_detail(response) if isinstance(body, dict) and body.get("error") else _snippet(response)
        raise APIResponseValidationError(f"the body has no choices[0].message: {detail}")
    return completion


def chat_result_from_body(body: Any, *, latency_s: float = 0.0, attempts: int = 1) -> ChatResult:
    """A ``ChatResult`` from a chat.completion body read elsewhere (a batch output line), parsed as ``chat`` does."""
    completion = _completion_from_body(body)
    if completion is None:
        raise APIResponseValidationError(f"the body has no choices[0].message: {str(body)[:_SNIPPET_CHARS]!r}")
    return completion.result(latency_s=latency_s, attempts=attempts)


def _completion_from_body(body: Any) -> _Completion | None:
    """The parts of a chat.completion body we keep, or None when it has no ``choices[0].message``."""
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return None
    assert isinstance(body, dict) and isinstance(first, dict)
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    details = usage.get("prompt_tokens_details")
    prompt_tokens = _count(usage.get("prompt_tokens"))
    completion_tokens = _count(usage.get("completion_tokens"))
    return _Completion(
        text=_message_text(message.get("content")),
        finish_reason=first.get("finish_reason"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=_count(details.get("cached_tokens")) if isinstance(details, dict) else 0,
        total_tokens=_count(usage.get("total_tokens")) or prompt_tokens + completion_tokens,
        model=body.get("model"),
        response_id=body.get("id"),
    )


def _message_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    # Some OpenAI-compatible servers answer with a list of content parts.
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return _json.dumps(content, ensure_ascii=False)
