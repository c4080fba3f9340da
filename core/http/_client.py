"""The async client for OpenAI-compatible APIs and Anthropic's: it sends a request and reads its answer, one retry
loop under the shared limits for every call.

``LLMClient._request`` owns the loop (retry rules from ``_retry``, gates from ``_gates``) and the one send path: it
builds an ``httpx.Request`` and hands it to the transport (``default_transport``, or respx /
``httpx.MockTransport`` in tests), then reads the ``httpx.Response`` with ``_responses``. What differs by provider
(path, auth, body, answer, rate-limit headers, hints) is the client's ``Wire``. A provider's other surfaces take the
client and call its send path: its Batch API (``_batch_api``: ``_openai_batches``, ``_message_batches``) and
OpenAI's background responses (``_background``).
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, NamedTuple, TypeVar, get_args

import httpx
from pydantic import SecretStr

from ._background import DEFAULT_BACKGROUND_POLL, BackgroundResponses, Creating, Started
from .._constants import DEFAULT_CONCURRENCY, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FILE_TIMEOUT, DEFAULT_MAX_RETRIES, \
    DEFAULT_TIMEOUT
from ._deadlines import Deadlines, attempt_deadline
from ..wire._openai_responses import runs_in_background
from ..wire._packing import PackLimits
from ._failures import Failure, Tally, final_error, scrub
from .._exceptions import APIError, APIResponseValidationError
from ._gates import Admission, Gates
from ._limits import AdaptiveLimiter, SharedPause
from ..wire._ratelimit_headers import RateLimitHeaders
from ..wire._requests import RequestBuilder
from ..wire._responses import Chat, parse_json, save_body
from .._retry import DEFAULT_MAX_RETRY_AFTER, retry_delay
from .._settings import DEFAULT_ANTHROPIC_VERSION, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS, AuthHeader, Settings
from ..pricing._tokens import estimate_request_tokens
from ._transport import BodyCut, default_transport
from .._types import ChatRequest, ChatResult
from .._providers import Provider
from ..wire._wire import display_url, provider_settings, reply_cap, wire_for

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_CONNECT_TIMEOUT", "DEFAULT_FILE_TIMEOUT", "DEFAULT_MAX_RETRIES",
           "DEFAULT_MAX_RETRY_AFTER", "DEFAULT_TIMEOUT", "LLMClient"]

logger = logging.getLogger(__name__)

# The shortest deadline of a flex attempt: OpenAI's flex-processing guide raises the SDKs' 10 minutes to 15.
FLEX_TIMEOUT = 900.0

_T = TypeVar("_T")
# What a create that may have worked without saying so is looked up with (a batch create's ``find_lost``).
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


class LLMClient:
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
        wire: str | None = None,
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

        # The provider's name (a built-in one's is its wire's) and the wire it speaks.
        self._name = provider
        self._wire = wire_for(wire or provider, version=anthropic_version, default_max_tokens=default_max_tokens)
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        if self._api_key is not None and not self._api_key.get_secret_value():
            self._api_key = None
        if wire is None or wire == provider:  # a declared provider's key is checked by its own entry (key_env)
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
        self._random = random
        self._clock = clock

        self._gates = Gates(
            concurrency=concurrency, rpm=rpm, tpm=tpm, max_retry_after=self._max_retry_after,
            rate_limit_headers=rate_limit_headers or self._wire.rate_limit_headers, clock=clock, sleep=sleep,
        )
        self._limiter = self._gates.limiter
        self._deadlines = Deadlines()
        self._chat_route = self._wire.route("chat")
        self._background = BackgroundResponses(send=self._request, wire=self._wire, gates=self._gates, sleep=sleep,
                                               clock=clock, poll=float(background_poll))

        url = httpx.URL(base_url.rstrip("/"))
        self._display_url = display_url(base_url)
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
        cls, settings: Settings, *, provider: str = "openai", transport: httpx.AsyncBaseTransport | None = None,
        declared: Provider | None = None,
    ) -> LLMClient:
        """The client a flow run uses for one provider: one per run and provider, so ``settings.concurrency``
        is each one's ceiling; a built-in provider's endpoint and key are its settings' (``provider_settings``), a
        ``declared`` one's its own (base URL, the key its ``key_env`` names, its auth header), with what else its
        wire takes from the settings (Anthropic's version, its default max_tokens)."""
        values = {name: getattr(settings, name) for name in _FROM_SETTINGS}
        if declared is None or declared.builtin:
            return cls(**values | provider_settings(provider, settings), provider=provider, transport=transport)
        # Never an OpenAI organization or project: those are OpenAI's account's, not this host's.
        extras = {name: value for name, value in provider_settings(declared.wire, settings).items()
                  if name not in ("organization", "project")}
        own = {"base_url": declared.base_url, "api_key": declared.key(), "auth_header": declared.auth_header}
        return cls(**values | extras | own, provider=declared.name, wire=declared.wire, transport=transport)

    @property
    def provider(self) -> str:
        """The provider's name: ``openai`` (any OpenAI-compatible endpoint), ``anthropic``, ``gemini``, or one a
        providers file declares."""
        return self._name

    @property
    def wire(self) -> str:
        """The wire it speaks: ``openai``, ``anthropic`` or ``gemini`` (a built-in provider's is its name)."""
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

    def pack_limits(self, request: ChatRequest) -> PackLimits:
        """How many embeddings texts one request to this provider may carry (``send_all`` packs within them)."""
        return self._wire.pack_limits

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
            return await self._background.answer(request, started=started, creating=creating)
        estimate = estimate_request_tokens(request) if self._gates.counts_tokens else 0
        route = self._chat_route if request.endpoint == "chat" else self._wire.route(request.endpoint)
        body = route.body(request)
        path = route.path_for(request)
        floor = self._request_timeout
        if request.lane == "flex":
            body = {**body, "service_tier": "flex"}
            floor = max(floor, FLEX_TIMEOUT)
        # The cap as sent (Anthropic's body always has one): a long generation gets the time it may need.
        cap = reply_cap(body)
        deadline = attempt_deadline(max_output=cap, floor=floor)
        sent = await self._request(
            "POST", path, json=body, parse=route.parse, tokens=estimate, paced=True, timeout=deadline
        )
        chat: Chat = sent.value
        self._gates.used_tokens(chat.total_tokens - estimate)
        result = chat.finished(latency_s=self._clock() - sent.admitted_at, attempts=sent.attempts)
        # The lost generations before it, and the answer's own attempt unless its parse says it is not billed.
        result.maybe_billed = sent.maybe_billed - 1 + result.maybe_billed
        return result

    def _transfer_timeout(self, timeout: float | None) -> float:
        """One attempt's deadline for a file's transfer: ``timeout``, or the larger of the file and request timeouts."""
        if timeout is not None:
            if timeout <= 0:
                raise ValueError(f"timeout must be positive, got {timeout}")
            return timeout
        return max(self._request_timeout, self._file_timeout)

    async def _request(
        self, method: str, path: str, *, stream_to: Path | None = None,
        parse: Callable[[httpx.Response], Any] | None = None, tokens: int = 0, timeout: float | None = None,
        max_retries: int | None = None, paced: bool = False, find_lost: FindLost[Any] | None = None, **content: Any,
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
        tally = Tally()
        delay: float | None = None
        while True:
            outcome = await self._attempt(method, path, tally=tally, tokens=tokens, paced=paced, deadline=deadline,
                                          stream_to=stream_to, parse=parse, content=content)
            if not isinstance(outcome, Failure):
                return outcome
            last = tally.failed(outcome, paced=paced, retries=retries)
            if not outcome.retryable or (last and find_lost is None):
                raise self._gave_up(outcome, method=method, path=path, tally=tally) from outcome.cause
            delay = retry_delay(retries_taken=tally.attempts - 1, headers=outcome.headers, previous=delay,
                                max_retry_after=self._max_retry_after, random=self._random)
            logger.info(
                "%s %s: %s on attempt %d of %d; %s in %.2fs",
                method, path, scrub(outcome.describe(), self._secrets), tally.attempts, retries + 1,
                "looking for what it did" if last else "retrying", delay,
            )
            await self._sleep(delay)
            if find_lost is not None:
                found = await self._look_up_lost(find_lost, outcome, last=last, method=method, path=path, tally=tally)
                if found is not None:
                    return found

    async def _attempt(
        self, method: str, path: str, *, tally: Tally, tokens: int, paced: bool, deadline: float,
        stream_to: Path | None, parse: Callable[[httpx.Response], Any], content: dict[str, Any],
    ) -> _Sent[Any] | Failure:
        """One attempt through the gates: admitted, sent, its answer judged; its slot released before any wait."""
        tally.attempts += 1
        admission = await self._gates.admit(tokens, paced=paced)
        if tally.attempts == 1:
            tally.admitted_at = self._clock()
        try:
            # Built afresh each attempt: a multipart body is a stream that one attempt consumes.
            # An answer other than a download's arrives whole or not at all (a completion, a batch created): only
            # the deadline bounds the wait for it. A download's reads each have the read timeout.
            request = self._requests.build(method, path, deadline=deadline, silent=stream_to is None, **content)
            outcome = await self._send_once(request, stream_to=stream_to, timeout=deadline)
            if isinstance(outcome, Failure):
                return outcome
            return self._judge(outcome, admission, parse=parse, paced=paced, tally=tally)
        finally:
            # Released before any retry sleep, so a waiting request never holds a slot.
            self._gates.release()

    def _judge(
        self, response: httpx.Response, admission: Admission, *, parse: Callable[[httpx.Response], Any], paced: bool,
        tally: Tally,
    ) -> _Sent[Any] | Failure:
        """An answer as the gates see it (a paced call's headers set the pace, a 429 slows it) and as the caller
        gets it: ``parse``'s value, or the failure it is."""
        limited = response.status_code == 429
        limits = self._gates.observe(response, admission, counted=not limited) if paced else {}
        if response.is_success:
            try:
                value = parse(response)
            except APIResponseValidationError as exc:
                return Failure("invalid", exc.message, response=response, cause=exc)
            self._gates.succeeded(admission)
            return _Sent(value, tally.attempts, tally.admitted_at, tally.billed + 1)
        failure = Failure.status(response, max_retry_after=self._max_retry_after)
        # An account out of credit is no reason to slow anyone: its run stops (core._stops).
        if limited and failure.lasting is None:
            self._gates.rate_limited(failure, admission, limits=limits)
        return failure

    async def _look_up_lost(
        self, find_lost: FindLost[Any], failure: Failure, *, last: bool, method: str, path: str, tally: Tally
    ) -> _Sent[Any] | None:
        """After a create that may have worked without saying so, and its wait: what ``find_lost`` finds is the
        answer; after the last attempt, finding nothing gives up."""
        found = await find_lost()
        if found is not None:
            return _Sent(found, tally.attempts, tally.admitted_at)
        if last:
            raise self._gave_up(failure, method=method, path=path, tally=tally) from failure.cause
        return None

    def _gave_up(self, failure: Failure, *, method: str, path: str, tally: Tally) -> APIError:
        """The error a call that gives up raises: what happened, and what to change; with its attempts, those the
        provider may have billed, and those whose generation was lost."""
        error = final_error(
            failure, method=method, path=path, attempts=tally.attempts, base_url=self._display_url,
            secret=self._secrets, hints=self._wire.hints, unusable_hint=self._wire.unusable_hint,
            url_setting=(self._wire.url_setting if self._name == self._wire.provider
                         else f"[providers.{self._name}].base_url in the providers file"),
            maybe_billed=tally.billed, lost=tally.lost,
        )
        error.provider = self._name
        return error

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
                # What httpx.AsyncClient would set: a reader may look at what its answer answers (Gemini's
                # embeddings, with no usage, are counted from the texts sent).
                response.request = request
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

