"""The async client for OpenAI-compatible APIs and Anthropic's: one retry loop, under the shared limits, for every call.

``LLMClient._request`` owns the loop (retry rules from ``_retry``, limits from ``_limits``) and the one
send path: it builds an ``httpx.Request`` and hands it to the transport (``default_transport``, or
respx / ``httpx.MockTransport`` in tests), then reads the ``httpx.Response`` with ``_responses``. What
differs by provider (path, auth, body, answer, rate-limit headers, hints) is the client's ``Wire``.
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, NamedTuple, TypeVar, get_args

import httpx
from pydantic import SecretStr

from .._batch_types import BATCH_CHAT_ENDPOINT, DEFAULT_COMPLETION_WINDOW, BatchInfo, FileInfo
from .._constants import (
    DEFAULT_CONCURRENCY,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FILE_TIMEOUT,
    DEFAULT_LIST_LIMIT,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
)
from ._deadlines import Deadlines, attempt_deadline
from .._endpoints import check_batch_url
from ..wire._openai_responses import TERMINAL_RESPONSE_STATUSES, parse_response_status, response_from_body, \
    runs_in_background
from ._failures import LOST_GENERATION_RETRIES, Failure, final_error, scrub
from .._exceptions import APIError, APIResponseValidationError, NotFoundError
from ._gates import Gates
from ._limits import AdaptiveLimiter, SharedPause
from ..wire._message_batches import MessageBatchMethods
from ..wire._ratelimit_headers import RateLimitHeaders
from ..wire._requests import RequestBuilder, path_segment
from ..wire._responses import (
    BatchPage,
    Chat,
    parse_batch_info,
    parse_batch_page,
    parse_file_info,
    parse_json,
    save_body,
)
from .._retry import DEFAULT_MAX_RETRY_AFTER, retry_delay
from .._status import BACKGROUND_WINDOWS
from .._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, AuthHeader, Settings
from ..pricing._tokens import estimate_request_tokens
from ._transport import BodyCut, default_transport
from .._types import ChatRequest, ChatResult
from ..wire._wire import wire_for

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_FILE_TIMEOUT",
    "DEFAULT_LIST_LIMIT",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEFAULT_TIMEOUT",
    "LLMClient",
]

logger = logging.getLogger(__name__)

FILES_PATH = "/files"
BATCHES_PATH = "/batches"
RESPONSES_PATH = "/responses"
# Seconds between polls of a background response.
DEFAULT_BACKGROUND_POLL = 2.0
# The shortest deadline of a flex attempt: OpenAI's flex-processing guide raises the SDKs' 10 minutes to 15.
FLEX_TIMEOUT = 900.0

_T = TypeVar("_T")
# Told a background response's id as soon as it is created (to store it: a re-run polls it, never creates again).
Started = Callable[[str], Awaitable[None]]
# Awaited before a background create is sent (to count it: a re-run that finds more creates than stored ids knows
# one may be running, and billed, without its id).
Creating = Callable[[], Awaitable[None]]
# What a create that may have worked without saying so is looked up with (``create_batch``'s ``find_lost``).
FindLost = Callable[[], Awaitable[_T | None]]


class _Sent(NamedTuple, Generic[_T]):
    value: _T
    attempts: int
    # When the first attempt passed the client's gates: latency excludes the wait for a slot.
    admitted_at: float
    # Attempts the provider may have billed: the answer's, and any generation lost before it.
    maybe_billed: int = 1


# The constructor's arguments that a Settings field of the same name gives.
_FROM_SETTINGS = ("base_url", "api_key", "auth_header", "request_timeout", "connect_timeout", "file_timeout",
                  "max_retries", "max_retry_after", "concurrency", "rpm", "tpm")

def _plain(value: SecretStr | str | None) -> str | None:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


class LLMClient(MessageBatchMethods):
    """An async client for one provider's endpoint (``provider``: OpenAI-compatible or Anthropic), shared by
    every concurrent caller. What differs between providers is the ``Wire`` (``_wire``); the send path is one.

    Every attempt passes the same gates: the shared pause after a quota 429, the optional RPM/TPM
    caps, the pace the provider's rate-limit headers set (``rate_limit_headers`` says where it puts
    them), and the adaptive concurrency limit (whose ceiling is ``concurrency``). ``sleep``,
    ``random`` and ``clock`` exist for tests; pass ``clock`` together with a ``sleep`` that moves it.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: SecretStr | str | None = None,
        auth_header: AuthHeader = "authorization",
        organization: SecretStr | str | None = None,
        project: SecretStr | str | None = None,
        request_timeout: float = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        file_timeout: float = DEFAULT_FILE_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
        concurrency: int = DEFAULT_CONCURRENCY,
        rpm: int | None = None,
        tpm: int | None = None,
        rate_limit_headers: RateLimitHeaders | None = None,
        provider: str = "openai",
        anthropic_version: str = DEFAULT_ANTHROPIC_VERSION,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        background_poll: float = DEFAULT_BACKGROUND_POLL,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        random: Callable[[], float] = _random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if auth_header not in get_args(AuthHeader):
            raise ValueError(f"auth_header must be 'authorization' or 'api-key', got {auth_header!r}")
        if request_timeout <= 0 or connect_timeout <= 0 or file_timeout <= 0:
            raise ValueError("request_timeout, connect_timeout and file_timeout must be positive")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {max_retries}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")

        self._wire = wire_for(provider, version=anthropic_version, default_max_tokens=default_max_tokens)
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        if self._api_key is not None and not self._api_key.get_secret_value():
            self._api_key = None
        self._wire.check_key(key_set=self._api_key is not None, base_url=base_url)
        # Anthropic has no such headers: an OpenAI organization or project never goes there.
        organization_id, project_id = (
            (_plain(organization), _plain(project)) if self._wire.provider == "openai" else (None, None))
        self._account = tuple(value for value in (organization_id, project_id) if value)
        self._auth_header = auth_header
        self._request_timeout = float(request_timeout)
        self._file_timeout = float(file_timeout)
        self._max_retries = max_retries
        self._max_retry_after = float(max_retry_after)
        self._sleep = sleep
        self._background_poll = float(background_poll)
        self._random = random
        self._clock = clock

        self._gates = Gates(
            concurrency=concurrency, rpm=rpm, tpm=tpm, max_retry_after=self._max_retry_after,
            rate_limit_headers=rate_limit_headers or self._wire.rate_limit_headers, clock=clock, sleep=sleep,
        )
        self._limiter = self._gates.limiter
        self._deadlines = Deadlines()
        self._chat_route = self._wire.route("chat")

        url = httpx.URL(base_url.rstrip("/"))
        self._display_url = str(url.copy_with(userinfo=b"", query=None))
        self._transport = (
            transport if transport is not None else default_transport(concurrency=concurrency, tls=url.scheme != "http")
        )
        self._requests = RequestBuilder(
            base_url=url,
            headers=self._wire.headers(self._secret, auth_header=auth_header, organization=organization_id,
                                       project=project_id),
            timeout=httpx.Timeout(self._request_timeout, connect=connect_timeout),
        )

    @classmethod
    def from_settings(
        cls, settings: Settings, *, provider: str = "openai", transport: httpx.AsyncBaseTransport | None = None
    ) -> LLMClient:
        """The client a flow run uses for one provider: one per run and provider, so ``settings.concurrency``
        is each one's ceiling. Anthropic's takes ``anthropic_base_url`` and ``anthropic_api_key``."""
        values = {name: getattr(settings, name) for name in _FROM_SETTINGS}
        if provider == "anthropic":
            values.update(base_url=settings.anthropic_base_url, api_key=settings.anthropic_api_key,
                          anthropic_version=settings.anthropic_version,
                          default_max_tokens=settings.default_max_tokens)
        else:
            values.update(organization=settings.openai_org_id, project=settings.openai_project_id)
        return cls(**values, provider=provider, transport=transport)

    @property
    def provider(self) -> str:
        """``openai`` (any OpenAI-compatible endpoint) or ``anthropic``."""
        return self._wire.provider

    def __repr__(self) -> str:
        key = "set" if self._api_key is not None else "none"
        return (
            f"LLMClient(provider={self.provider!r}, base_url={self._display_url!r}, api_key={key}, "
            f"auth_header={self._auth_header!r}, "
            f"concurrency={self._limiter.limit}/{self._limiter.ceiling}, in_flight={self._limiter.in_flight})"
        )

    @property
    def _secret(self) -> str | None:
        return self._api_key.get_secret_value() if self._api_key is not None else None

    @property
    def _secrets(self) -> tuple[str, ...]:
        """What no message, log line or stored error may show: the key, and the organization and project ids."""
        key = self._secret
        return (key, *self._account) if key else self._account

    @property
    def limiter(self) -> AdaptiveLimiter:
        """The adaptive concurrency limit: ``.limit`` now, ``.ceiling``, ``.in_flight`` (for progress display)."""
        return self._limiter

    @property
    def pause(self) -> SharedPause:
        return self._gates.pause

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections (and the transport, including one that was passed in)."""
        await self._transport.aclose()

    def request_body(self, request: ChatRequest) -> dict[str, Any]:
        """The JSON body ``chat`` sends for ``request`` (a Messages body for Anthropic): also one Message Batch request's ``params``."""
        return self._wire.chat_body(request)

    async def chat(
        self, request: ChatRequest, *, started: Started | None = None, creating: Creating | None = None
    ) -> ChatResult:
        """One chat completion (an Anthropic Message, for that provider), or the request to its ``endpoint`` (an
        embedding's vector in ``ChatResult.embedding``), retried by the house rules; raises an
        ``APIError`` subclass when it gives up, or ``ValueError`` for a request the provider's API cannot express."""
        if runs_in_background(request):
            return await self._background(request, started=started, creating=creating)
        estimate = estimate_request_tokens(request) if self._gates.counts_tokens else 0
        route = self._chat_route if request.endpoint == "chat" else self._wire.route(request.endpoint)
        body = route.body(request)
        floor = self._request_timeout
        if request.lane == "flex":
            body = {**body, "service_tier": "flex"}
            floor = max(floor, FLEX_TIMEOUT)
        # The cap as sent (Anthropic's body always has one): a long generation gets the time it may need.
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or body.get("max_output_tokens")
        deadline = attempt_deadline(max_output=cap if isinstance(cap, int) else None, floor=floor)
        sent = await self._request(
            "POST", route.path, json=body, parse=route.parse, tokens=estimate, paced=True, timeout=deadline
        )
        chat: Chat = sent.value
        self._gates.used_tokens(chat.total_tokens - estimate)
        result = chat.finished(latency_s=self._clock() - sent.admitted_at, attempts=sent.attempts)
        # The lost generations before it, and the answer's own attempt unless its parse says it is not billed.
        result.maybe_billed = sent.maybe_billed - 1 + result.maybe_billed
        return result

    async def _background(self, request: ChatRequest, *, started: Started | None, creating: Creating | None) -> ChatResult:
        """A Responses request in background mode: created with ``background: true`` (unless ``background_id``
        says it was), ``creating`` awaited before the create is sent, its id handed to ``started`` before anything
        else, then polled until it leaves queued and in_progress. Only the create is billed: a poll that fails is
        retried by the house rules. A create whose answer was lost may have made a response: it is counted as
        possibly billed, and so is each of ``request.lost_creates``. A response that failed or was cancelled
        raises ``APIResponseValidationError`` (it may have been billed)."""
        admitted = self._clock()
        response_id = request.background_id
        attempts = estimate = 0
        # Creates that may be running, and billed, beside the one whose answer this is.
        unanswered = request.lost_creates
        if unanswered:
            logger.warning("%d background create(s) of this request were sent before and their ids never stored (a run "
                           "was killed between a create's answer and storing its id): counted as possibly billed",
                           unanswered)
        if response_id is None:
            if creating is not None:
                await creating()
            route = self._wire.route("responses")
            body = {**route.body(request), "background": True}
            window = BACKGROUND_WINDOWS.get(request.lane or "")
            if window is not None:
                body["background_options"] = {**(body.get("background_options") or {}), "completion_window": window}
            estimate = estimate_request_tokens(request) if self._gates.counts_tokens else 0
            sent = await self._request("POST", route.path, json=body, parse=parse_response_status, paced=True,
                                       tokens=estimate)
            attempts, admitted = sent.attempts, sent.admitted_at
            unanswered += sent.maybe_billed - 1
            status, answer = sent.value
            response_id = answer["id"]
            if started is not None:
                await started(response_id)
        else:
            status, answer = "queued", None
        path = f"{RESPONSES_PATH}/{path_segment(response_id)}"
        while status not in TERMINAL_RESPONSE_STATUSES:
            await self._sleep(self._background_poll)
            status, answer = (await self._request("GET", path, parse=parse_response_status)).value
        chat = response_from_body(answer)
        if chat is None:
            error = answer.get("error") if isinstance(answer, dict) else None
            detail = error.get("message") if isinstance(error, dict) else None
            raise APIResponseValidationError(
                f"background response {response_id} ended {status}" + (f": {detail}" if detail else "")
                + "; it may have been billed, so it is not sent again: --retry-failed all would")
        self._gates.used_tokens(chat.total_tokens - estimate)
        result = chat.finished(latency_s=self._clock() - admitted, attempts=max(attempts, 1))
        result.maybe_billed += unanswered
        return result

    # --- files and batches (the Batch API) -------------------------------------------------------
    # Same loop, same rules as chat: a 5xx or timeout on create_batch is retried, so a create that did
    # reach the provider may be sent twice, unless the caller gives ``find_lost`` to look it up first.

    async def upload_file(self, path: Path, *, purpose: str = "batch", timeout: float | None = None) -> FileInfo:
        """Upload ``path`` as multipart form data, streamed from disk; a retry sends the whole file again.

        ``timeout`` bounds one attempt (default: the larger of the client's file timeout and its request timeout).
        """
        path = Path(path)
        with path.open("rb") as handle:
            sent = await self._request(
                "POST",
                FILES_PATH,
                files={"file": (path.name, handle, "application/jsonl")},
                data={"purpose": purpose},
                parse=parse_file_info,
                timeout=self._transfer_timeout(timeout),
            )
        return sent.value

    async def retrieve_file(self, file_id: str) -> FileInfo:
        sent = await self._request("GET", f"{FILES_PATH}/{path_segment(file_id)}", parse=parse_file_info)
        return sent.value

    async def download_file(self, file_id: str, *, to: Path, timeout: float | None = None) -> Path:
        """Stream a file's content to ``to`` (written beside it and renamed, so never half a file); returns ``to``."""
        to = Path(to)
        # Made up front: a missing directory would otherwise look like a network error and be retried.
        to.parent.mkdir(parents=True, exist_ok=True)
        sent = await self._request(
            "GET", f"{FILES_PATH}/{path_segment(file_id)}/content", stream_to=to, timeout=self._transfer_timeout(timeout)
        )
        return sent.value

    async def delete_file(self, file_id: str, *, missing_ok: bool = False) -> None:
        """Delete a file; with ``missing_ok`` a file that is already gone (say, a retried delete) is no error."""
        try:
            await self._request("DELETE", f"{FILES_PATH}/{path_segment(file_id)}")
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
        find_lost: FindLost[BatchInfo] | None = None,
    ) -> BatchInfo:
        """Create a batch. ``max_retries`` overrides the client's for this call. ``find_lost`` is awaited after each
        attempt that may have made the batch without saying so (a timeout, a dropped connection, a 5xx), once the
        wait before the next has passed; a batch it finds is the answer, and no attempt follows. An ``endpoint``
        whose output lines this package cannot read is refused (``ConfigError``) before anything is sent."""
        check_batch_url(endpoint)
        body: dict[str, Any] = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if metadata is not None:
            body["metadata"] = dict(metadata)
        sent = await self._request("POST", BATCHES_PATH, json=body, parse=parse_batch_info, max_retries=max_retries,
                                   find_lost=find_lost)
        return sent.value

    async def retrieve_batch(self, batch_id: str) -> BatchInfo:
        sent = await self._request("GET", f"{BATCHES_PATH}/{path_segment(batch_id)}", parse=parse_batch_info)
        return sent.value

    async def cancel_batch(self, batch_id: str) -> BatchInfo:
        """Ask the provider to stop a batch; it answers ``cancelling`` and reaches ``cancelled`` later."""
        sent = await self._request("POST", f"{BATCHES_PATH}/{path_segment(batch_id)}/cancel", parse=parse_batch_info)
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

    async def _batch_page(self, *, limit: int, after: str | None) -> BatchPage:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        params = {"limit": str(limit)}
        if after is not None:
            params["after"] = after
        sent = await self._request("GET", BATCHES_PATH, params=params, parse=parse_batch_page)
        return sent.value

    def _transfer_timeout(self, timeout: float | None) -> float:
        if timeout is not None:
            if timeout <= 0:
                raise ValueError(f"timeout must be positive, got {timeout}")
            return timeout
        return max(self._request_timeout, self._file_timeout)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        stream_to: Path | None = None,
        parse: Callable[[httpx.Response], Any] | None = None,
        tokens: int = 0,
        timeout: float | None = None,
        max_retries: int | None = None,
        paced: bool = False,
        find_lost: FindLost[Any] | None = None,
        **content: Any,
    ) -> _Sent[Any]:
        """Send one API call, retrying by the house rules, and return what ``parse`` makes of the answer.

        ``content`` is the body and query as ``RequestBuilder.build`` takes them (``json``, ``files``,
        ``data``, ``params``). ``parse`` raises ``APIResponseValidationError`` for a 2xx body it cannot
        use (never sent again: it was answered, and may have been billed); by default it returns the JSON body, or ``stream_to`` once the body has
        been saved there. ``tokens`` is the call's estimated cost against the TPM limit; ``timeout``
        overrides the per-attempt deadline (a large download may need longer than a completion);
        ``max_retries`` overrides the client's for this call. A ``paced`` call (chat) goes at the pace the
        provider's rate-limit headers set, and its answers' headers keep that pace. ``find_lost`` (a create) is
        awaited after each retryable failure and its wait, the last one's too: what it finds is the answer.
        """
        retries = self._max_retries if max_retries is None else max_retries
        if retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {retries}")
        deadline = self._request_timeout if timeout is None else timeout
        if parse is None:
            parse = parse_json if stream_to is None else (lambda _response: stream_to)
        attempt = 0
        delay: float | None = None
        # Attempts the provider may have billed, and those whose generation was lost (each tried again once).
        billed = lost = 0
        while True:
            attempt += 1
            admission = await self._gates.admit(tokens, paced=paced)
            if attempt == 1:
                admitted_at = self._clock()
            try:
                # Built afresh each attempt: a multipart body is a stream that one attempt consumes.
                # An answer other than a download's arrives whole or not at all (a completion, a batch created): only
                # the deadline bounds the wait for it. A download's reads each have the read timeout.
                request = self._requests.build(method, path, deadline=deadline, silent=stream_to is None, **content)
                outcome = await self._send_once(request, stream_to=stream_to, timeout=deadline)
                if isinstance(outcome, Failure):
                    failure = outcome
                else:
                    limited = outcome.status_code == 429
                    limits = self._gates.observe(outcome, admission, counted=not limited) if paced else {}
                    if outcome.is_success:
                        try:
                            value = parse(outcome)
                        except APIResponseValidationError as exc:
                            failure = Failure("invalid", exc.message, response=outcome, cause=exc)
                        else:
                            self._gates.succeeded(admission)
                            return _Sent(value, attempt, admitted_at, billed + 1)
                    else:
                        failure = Failure.status(outcome, max_retry_after=self._max_retry_after)
                        # An account out of credit is no reason to slow anyone: its run stops (core._stops).
                        if limited and failure.lasting is None:
                            self._gates.rate_limited(failure, admission, limits=limits)
            finally:
                # Released before any retry sleep, so a waiting request never holds a slot.
                self._gates.release()

            billed += failure.maybe_billed
            # A generation (a chat) is what costs: a lost one is tried again once. A file's transfer cut short is
            # retried as any connection error.
            lost += paced and failure.lost_generation
            last = attempt > retries or lost > LOST_GENERATION_RETRIES
            if not failure.retryable or (last and find_lost is None):
                raise self._gave_up(failure, method=method, path=path, attempts=attempt, billed=billed,
                                    lost=lost) from failure.cause
            delay = retry_delay(
                retries_taken=attempt - 1,
                headers=failure.headers,
                previous=delay,
                max_retry_after=self._max_retry_after,
                random=self._random,
            )
            logger.info(
                "%s %s: %s on attempt %d of %d; %s in %.2fs",
                method, path, scrub(failure.describe(), self._secrets), attempt, retries + 1,
                "looking for what it did" if last else "retrying", delay,
            )
            await self._sleep(delay)
            if find_lost is not None:
                found = await find_lost()
                if found is not None:
                    return _Sent(found, attempt, admitted_at)
                if last:
                    raise self._gave_up(failure, method=method, path=path, attempts=attempt, billed=billed,
                                        lost=lost) from failure.cause

    def _gave_up(
        self, failure: Failure, *, method: str, path: str, attempts: int, billed: int = 0, lost: int = 0
    ) -> APIError:
        """The error a call that gives up raises: what happened, and what to change; ``billed`` and ``lost``: its
        attempts the provider may have billed, and those whose generation was lost."""
        return final_error(
            failure, method=method, path=path, attempts=attempts, base_url=self._display_url, secret=self._secrets,
            hints=self._wire.hints, unusable_hint=self._wire.unusable_hint, url_setting=self._wire.url_setting,
            maybe_billed=billed, lost=lost,
        )

    async def _send_once(
        self, request: httpx.Request, *, stream_to: Path | None, timeout: float
    ) -> httpx.Response | Failure:
        """One HTTP attempt with a hard deadline over connect, send and the whole body."""
        # The transport only bounds each socket read; a server that trickles bytes, or a pool that
        # never frees a connection, must not stretch an attempt past its deadline.
        deadline = self._deadlines.within(timeout)
        response: httpx.Response | None = None
        try:
            async with deadline:
                try:
                    response = await self._transport.handle_async_request(request)
                except BodyCut as cut:
                    return Failure.cut(cut.status_code, cut)
                try:
                    if stream_to is not None and response.is_success:
                        await save_body(response, stream_to)
                    else:
                        await response.aread()
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            return Failure.deadline(timeout, exc) if deadline.expired() else Failure.transport(exc)
        except httpx.DecodingError as exc:
            return Failure("invalid", f"the body could not be decoded: {exc}", cause=exc)
        except (httpx.TransportError, OSError) as exc:
            # With the status line in hand, the answer was cut off; before it, there was none.
            return Failure.transport(exc) if response is None else Failure.cut(response.status_code, exc)
        return response

