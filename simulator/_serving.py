"""What every real-time model route does around its answer, whichever API's shapes it speaks: the in-flight
gauge, the sampled latency, the faults that break the connection rather than answer, and quota admission.

OpenAI's chat (``_chat``), Anthropic's Messages (``_messages_route``) and Gemini's generateContent (``_gemini``) call
these; each renders its own
bodies and headers from what they return. Both draw on one account: the same RPM/TPM windows.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from aiohttp import web

from ._config import ANSWER_KINDS, MARKERS
from ._http import cut_response, dropped_response
from ._markers import MARKER_BYTES, marker_fault, marker_pattern
from ._state import QuotaWindow, SimState

__all__ = [
    "CONNECTION_FAULTS",
    "ANSWERED_AT_ONCE",
    "LimitView",
    "QuotaRefusal",
    "RealTimeRoutes",
    "admit",
    "connection_fault",
    "has_quota",
    "limit_views",
    "sample_latency",
    "tracked",
]

# Faults that never answer in the API's shape: a hang, a closed connection, a cut 200.
CONNECTION_FAULTS = frozenset({"hang", "drop", "malformed"})
# Status faults that answer before any latency, as a provider refuses before it works; 5xx wait first.
ANSWERED_AT_ONCE = frozenset({"400", "401", "402", "403", "404", "413", "429", "insufficient_quota"})

QuotaKind = Literal["requests", "tokens"]


async def tracked(
    state: SimState, answer: Awaitable[web.StreamResponse], *, request_id_header: str
) -> web.StreamResponse:
    """``answer``, counted in ``requests_total`` and the ``in_flight`` gauge, with a request id header."""
    stats = state.stats
    stats.requests_total += 1
    stats.in_flight += 1
    if stats.in_flight > stats.peak_in_flight:
        stats.peak_in_flight = stats.in_flight
    try:
        response = await answer
    finally:
        # Before the response is written, so a client that sees the answer sees the gauge down.
        stats.in_flight -= 1
    response.headers[request_id_header] = state.next_request_id()
    return response


_MARKER_BODY = marker_pattern(MARKERS)


class RealTimeRoutes:
    """The skeleton of a real-time model route: ``handle`` is the handler; a queued ``/_sim/faults`` fault comes
    first, then the subclass's ``_answer``. Subclasses answer in their API's shapes."""

    request_id_header: ClassVar[str]

    def __init__(self, state: SimState) -> None:
        self._state = state

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await tracked(self._state, self._serve(request), request_id_header=self.request_id_header)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self._state.forced_faults:
            return await self._fault(request, self._state.forced_faults.popleft(), model=None)
        return await self._answer(request, raw)

    async def _answer(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """The checks in the order the API makes them (headers, JSON, body, model), then the config's
        ``always_fault`` or a marker's fault, then ``_answer_valid`` (with the answer kind a marker asks for);
        each refusal in the subclass's API's shape."""
        state = self._state
        refused = self._refuse_headers(request)
        if refused is not None:
            return self._counted(refused)
        try:
            body = json.loads(raw)
        except ValueError:
            return self._counted(self._unparsable())
        invalid = self._invalid_body(body, request)
        if invalid is not None:
            return self._counted(invalid)
        model = self._model_of(request, body)
        if state.allowed_models is not None and model not in state.allowed_models:
            return self._counted(self._unknown_model(model))
        digest = self._digest(raw, body)
        forced: str | None = None
        if MARKER_BYTES in raw:
            found = marker_fault(self._turns(body), digest=digest, hits=state.marker_hits, pattern=_MARKER_BODY,
                                 allowed=MARKERS, where="", refuse=self._unknown_marker, seen=state.stats.markers)
            if isinstance(found, web.Response):
                return self._counted(found)
            forced = found
        if state.config.always_fault is not None:
            return await self._fault(request, state.config.always_fault, model=model)
        if forced is not None and forced not in ANSWER_KINDS:
            return await self._fault(request, forced, model=model)
        return await self._answer_valid(request, body=body, model=model, digest=digest, kind=forced)

    def _refuse_headers(self, request: web.Request) -> web.Response | None:
        raise NotImplementedError

    def _model_of(self, request: web.Request, body: dict[str, Any]) -> str:
        """The model a valid body asks for: its ``model`` (Gemini's is in the path)."""
        model: str = body["model"]
        return model

    def _turns(self, body: dict[str, Any]) -> Any:
        """A valid body's turns, as the markers are looked for in them (``{"role", "content"}`` each)."""
        return body["messages"]

    def _unparsable(self) -> web.Response:
        raise NotImplementedError

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        raise NotImplementedError

    def _unknown_model(self, model: str) -> web.Response:
        raise NotImplementedError

    def _unknown_marker(self, message: str) -> web.Response:
        raise NotImplementedError

    def _digest(self, raw: bytes, body: dict[str, Any]) -> bytes:
        raise NotImplementedError

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        """The answer to a valid request; ``kind`` is an ``ANSWER_KINDS`` marker's, or None for a plain answer."""
        raise NotImplementedError

    async def _fault_response(self, request: web.Request, fault: str, *, model: str | None) -> web.StreamResponse:
        raise NotImplementedError

    def _admit(self, *, model: str, charge: int) -> tuple[web.Response | None, dict[str, str]]:
        """(the 429 for a request the quotas refuse, or None; the rate-limit headers of every answer)."""
        raise NotImplementedError

    async def _answer_admitted(
        self,
        request: web.Request,
        *,
        model: str,
        charge: int,
        output_tokens: int,
        render: Callable[[], bytes],
        kind: str | None = None,
    ) -> web.StreamResponse:
        """The end of every valid request: the quotas (``charge`` tokens), a random fault, then ``render()``'s
        200 body after the sampled latency; ``render`` also counts the answer in the stats. A ``slow`` answer
        takes its ``output_tokens`` at ``slow_tokens_per_second`` instead; a ``cut`` one stops half way."""
        state = self._state
        limit_headers: dict[str, str] | None = None
        if has_quota(state):
            refused, limit_headers = self._admit(model=model, charge=charge)
            if refused is not None:
                return self._counted(refused)
        fault = state.random_fault()
        if fault is not None:
            return await self._fault(request, fault, model=model, headers=limit_headers)
        if kind == "slow":
            delay = output_tokens / state.config.slow_tokens_per_second
        else:
            delay = sample_latency(state, completion_tokens=output_tokens)
        # The prefixes this request writes turn warm when it is answered (``SimState.answer_due``); render() is
        # synchronous, so no other request renders in between.
        state.answer_due = time.monotonic() + delay
        try:
            body = render()
        finally:
            state.answer_due = None
        if delay > 0:
            await asyncio.sleep(delay)
        if kind == "cut":
            state.stats.count("cut")
            return await cut_response(request, body, headers=limit_headers)
        return self._counted(web.Response(body=body, headers=limit_headers, content_type="application/json"))

    def _counted(self, response: web.Response) -> web.Response:
        self._state.stats.count(str(response.status))
        return response

    async def _fault(
        self, request: web.Request, fault: str, *, model: str | None, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        response = await self._fault_response(request, fault, model=model)
        if headers:
            response.headers.update(headers)
        return response


def sample_latency(state: SimState, *, completion_tokens: int) -> float:
    """Seconds an answer waits: ``latency`` drawn from ``latency_dist``, plus ``latency_per_token`` per token."""
    config = state.config
    delay = config.latency
    if config.latency_spread > 0 and delay > 0:
        if config.latency_dist == "uniform":
            delay = state.rng.uniform(max(0.0, delay - config.latency_spread), delay + config.latency_spread)
        elif config.latency_dist == "lognormal":
            delay *= math.exp(state.rng.gauss(0.0, config.latency_spread))
    return delay + config.latency_per_token * completion_tokens


async def connection_fault(
    request: web.Request, fault: str, *, state: SimState, garbled: Callable[[], bytes]
) -> web.StreamResponse | None:
    """Play a fault not in ``ANSWERED_AT_ONCE``: the hang, drop or malformed answer (``garbled()`` cut in half),
    or None after the latency a 5xx waits, for the caller to answer in its API's shape."""
    if fault == "hang":
        state.stats.count("hang")
        # Other requests keep flowing: this only parks this handler. aiohttp cancels it when the
        # client gives up, which is what ends its share of in_flight.
        await asyncio.sleep(state.config.hang_seconds)
        return dropped_response(request)
    delay = sample_latency(state, completion_tokens=0)
    if delay > 0:
        await asyncio.sleep(delay)
    if fault == "drop":
        state.stats.count("drop")
        return dropped_response(request)
    if fault == "malformed":
        state.stats.count("malformed")
        body = garbled()
        return web.Response(body=body[: len(body) // 2], content_type="application/json")
    return None


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """Why a request was not admitted: the quota that ran out, what it held, and how long until it fits."""

    kind: QuotaKind
    per_minute: int
    window_limit: int  # what the window holds: per_minute scaled to quota_window
    used: int
    charge: int
    wait: float

    @property
    def too_large(self) -> bool:
        """A token charge that no wait can admit: the request alone exceeds the window."""
        return self.kind == "tokens" and self.charge > self.window_limit


@dataclass(frozen=True, slots=True)
class LimitView:
    """One quota as rate-limit headers state it: the limit per minute, what the window has left, and when."""

    kind: QuotaKind
    per_minute: int
    remaining: int
    reset_in: float


def has_quota(state: SimState) -> bool:
    return state.requests_window is not None or state.tokens_window is not None


def admit(state: SimState, *, charge: int, now: float | None = None) -> QuotaRefusal | None:
    """Charge one request and ``charge`` tokens to the account, or say why not (counted in quota_rejections)."""
    now = time.monotonic() if now is None else now
    requests, tokens = state.requests_window, state.tokens_window
    wait_requests = requests.wait_for(1, now=now) if requests is not None else 0.0
    wait_tokens = tokens.wait_for(charge, now=now) if tokens is not None else 0.0
    if wait_requests == 0.0 and wait_tokens == 0.0:
        if requests is not None:
            requests.add(1, now=now)
        if tokens is not None:
            tokens.add(charge, now=now)
        return None
    state.stats.quota_rejections += 1
    wait = max(wait_requests, wait_tokens)
    if wait_tokens >= wait_requests and tokens is not None:
        return _refusal("tokens", tokens, charge=charge, wait=wait, now=now)
    assert requests is not None
    return _refusal("requests", requests, charge=1, wait=wait, now=now)


def _refusal(kind: QuotaKind, window: QuotaWindow, *, charge: int, wait: float, now: float) -> QuotaRefusal:
    used = window.limit - window.remaining(now=now)
    return QuotaRefusal(kind=kind, per_minute=window.per_minute, window_limit=window.limit, used=used, charge=charge,
                        wait=wait)


def limit_views(state: SimState, *, now: float | None = None) -> list[LimitView]:
    """The quotas set, requests first. The limit is per minute, as providers state it; remaining and reset are
    the window's, which is what a quota enforced over a shorter window really has left."""
    now = time.monotonic() if now is None else now
    views = []
    quotas: tuple[tuple[QuotaKind, QuotaWindow | None], ...] = (
        ("requests", state.requests_window), ("tokens", state.tokens_window))
    for kind, window in quotas:
        if window is not None:
            views.append(LimitView(kind=kind, per_minute=window.per_minute, remaining=window.remaining(now=now),
                                   reset_in=window.reset_in(now=now)))
    return views
