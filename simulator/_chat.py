"""The simulator's ``/v1`` chat routes: chat completions with faults and quotas, and the model list.

A chat request goes through, in order: a fault queued with ``POST /_sim/faults``; auth; body
validation; the model list; a ``[[sim:FAULT]]`` / ``[[sim:FAULTxN]]`` marker in a message; the
RPM/TPM quotas; a random fault at the configured rates; then the answer. Injected 4xx and 429s
answer at once; 5xx, drop, malformed and successes wait the sampled latency first. With a quota set,
every answer from the quotas on carries the ``x-ratelimit-*`` headers, as OpenAI's do.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from aiohttp import web

from ._checks import (
    check_auth,
    invalid_request,
    model_not_found,
    validate_chat_body,
)
from ._completions import SYSTEM_FINGERPRINT, body_digest, plan_completion, render_completion
from ._config import FAULTS
from ._http import (
    completion_body,
    dropped_response,
    error_response,
    format_reset,
    json_response,
    rate_limited_response,
    server_error_response,
)
from ._markers import MARKER_BYTES, marker_fault, marker_pattern
from ._state import SimState

__all__ = ["CHAT_COMPLETIONS_PATH", "DEFAULT_MODELS", "register"]

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

# What GET /v1/models lists when the simulator accepts any model.
DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o4-mini")

_MARKER_BODY = marker_pattern(FAULTS)


def register(app: web.Application, state: SimState) -> None:
    """Add the chat-completions and models routes, bound to ``state``."""
    routes = _ChatRoutes(state)
    app.router.add_post(CHAT_COMPLETIONS_PATH, routes.chat_completions)
    app.router.add_get("/v1/models", routes.list_models)
    app.router.add_get("/v1/models/{model}", routes.get_model)


class _ChatRoutes:
    def __init__(self, state: SimState) -> None:
        self._state = state

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        state = self._state
        stats = state.stats
        stats.requests_total += 1
        stats.in_flight += 1
        if stats.in_flight > stats.peak_in_flight:
            stats.peak_in_flight = stats.in_flight
        try:
            response = await self._answer(request)
        finally:
            # Before the response is written, so a client that sees the answer sees the gauge down.
            stats.in_flight -= 1
        response.headers["x-request-id"] = state.next_request_id()
        return response

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        state = self._state
        raw = await request.read()
        if state.forced_faults:
            return await self._fault(request, state.forced_faults.popleft(), model=None)
        denied = check_auth(request, state)
        if denied is not None:
            return self._counted(denied)
        try:
            body = json.loads(raw)
        except ValueError:
            return self._counted(invalid_request(
                "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
                "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
                "valid JSON.)", param=None, code=None))
        invalid = validate_chat_body(body)
        if invalid is not None:
            return self._counted(invalid)
        model: str = body["model"]
        if state.allowed_models is not None and model not in state.allowed_models:
            return self._counted(model_not_found(model))

        digest = body_digest(raw, state=state)
        if MARKER_BYTES in raw:
            forced = self._marker_fault(body["messages"], digest)
            if isinstance(forced, web.Response):
                return self._counted(forced)
            if forced is not None:
                return await self._fault(request, forced, model=model)

        plan = plan_completion(body, digest=digest)
        limit_headers: dict[str, str] | None = None
        if state.requests_window is not None or state.tokens_window is not None:
            # Admission is charged like OpenAI does: the prompt plus max_tokens when it is given.
            charge = plan.prompt_tokens + (plan.cap * plan.n if plan.cap is not None else plan.completion_tokens)
            refused, limit_headers = self._admit(model=model, charge=charge)
            if refused is not None:
                return self._counted(refused)

        fault = state.random_fault()
        if fault is not None:
            return await self._fault(request, fault, model=model, headers=limit_headers)

        body_bytes, cached = render_completion(plan, state=state)
        delay = self._latency(plan.completion_tokens)
        if delay > 0:
            await asyncio.sleep(delay)
        stats = state.stats
        stats.completions += 1
        stats.prompt_tokens += plan.prompt_tokens
        stats.completion_tokens += plan.completion_tokens
        stats.cached_tokens += cached
        return self._counted(
            web.Response(body=body_bytes, headers=limit_headers, content_type="application/json")
        )

    def _counted(self, response: web.Response) -> web.Response:
        self._state.stats.count(str(response.status))
        return response

    def _marker_fault(self, messages: list[dict[str, Any]], digest: bytes) -> str | web.Response | None:
        return marker_fault(messages, digest=digest, hits=self._state.marker_hits, pattern=_MARKER_BODY,
                            allowed=FAULTS, where="")

    def _admit(self, *, model: str, charge: int) -> tuple[web.Response | None, dict[str, str]]:
        state = self._state
        now = time.monotonic()
        requests, tokens = state.requests_window, state.tokens_window
        wait_requests = requests.wait_for(1, now=now) if requests is not None else 0.0
        wait_tokens = tokens.wait_for(charge, now=now) if tokens is not None else 0.0
        if wait_requests == 0.0 and wait_tokens == 0.0:
            if requests is not None:
                requests.add(1, now=now)
            if tokens is not None:
                tokens.add(charge, now=now)
            return None, self._limit_headers(now)
        state.stats.quota_rejections += 1
        wait = max(wait_requests, wait_tokens)
        if wait_tokens >= wait_requests and tokens is not None:
            if charge > tokens.limit:
                message = (f"Request too large for {model} in organization org-simulator on tokens per min (TPM): "
                           f"Limit {tokens.per_minute}, Requested {charge}. The input or output tokens must be "
                           "reduced in order to run successfully.")
            else:
                used = tokens.limit - tokens.remaining(now=now)
                message = (f"Rate limit reached for {model} in organization org-simulator on tokens per min (TPM): "
                           f"Limit {tokens.per_minute}, Used {used}, Requested {charge}. "
                           f"Please try again in {format_reset(wait)}.")
            limit_type = "tokens"
        else:
            assert requests is not None
            message = (f"Rate limit reached for {model} in organization org-simulator on requests per min (RPM): "
                       f"Limit {requests.per_minute}, Used {requests.limit - requests.remaining(now=now)}, Requested 1. "
                       f"Please try again in {format_reset(wait)}.")
            limit_type = "requests"
        refused = rate_limited_response(
            message=message, limit_type=limit_type, retry_after=wait, headers=self._limit_headers(now)
        )
        return refused, {}

    def _limit_headers(self, now: float) -> dict[str, str]:
        # The limit per minute, as OpenAI states it; remaining and reset are the window's, which is what a
        # quota enforced over a shorter window really has left.
        headers: dict[str, str] = {}
        for suffix, window in (("requests", self._state.requests_window), ("tokens", self._state.tokens_window)):
            if window is not None:
                headers[f"x-ratelimit-limit-{suffix}"] = str(window.per_minute)
                headers[f"x-ratelimit-remaining-{suffix}"] = str(window.remaining(now=now))
                headers[f"x-ratelimit-reset-{suffix}"] = format_reset(window.reset_in(now=now))
        return headers

    def _latency(self, completion_tokens: int) -> float:
        config = self._state.config
        delay = config.latency
        if config.latency_spread > 0 and delay > 0:
            if config.latency_dist == "uniform":
                delay = self._state.rng.uniform(max(0.0, delay - config.latency_spread), delay + config.latency_spread)
            elif config.latency_dist == "lognormal":
                delay *= math.exp(self._state.rng.gauss(0.0, config.latency_spread))
        return delay + config.latency_per_token * completion_tokens

    async def _fault(
        self, request: web.Request, fault: str, *, model: str | None, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        response = await self._fault_response(request, fault, model=model)
        if headers:
            response.headers.update(headers)
        return response

    async def _fault_response(self, request: web.Request, fault: str, *, model: str | None) -> web.StreamResponse:
        state = self._state
        config = state.config
        if fault == "400":
            return self._counted(invalid_request("Simulated bad request (simulator fault 400).", param=None, code=None))
        if fault == "401":
            return self._counted(error_response(
                status=401, message="Incorrect API key provided: sim...ault (simulator fault 401).",
                code="invalid_api_key"))
        if fault == "404":
            return self._counted(model_not_found(model or "unknown"))
        if fault == "429":
            # A capacity 429 (a busy host, Azure's capacity 429s): it names no quota, whatever the load.
            message = (f"{model or 'The model'} is receiving more requests than it can serve right now "
                       f"(simulator fault 429). Please try again in {format_reset(config.retry_after)}.")
            return self._counted(rate_limited_response(
                message=message, limit_type="requests", retry_after=config.retry_after))
        if fault == "hang":
            state.stats.count("hang")
            # Other requests keep flowing: this only parks this handler. aiohttp cancels it when the
            # client gives up, which is what ends its share of in_flight.
            await asyncio.sleep(config.hang_seconds)
            return dropped_response(request)
        delay = self._latency(0)
        if delay > 0:
            await asyncio.sleep(delay)
        if fault == "drop":
            state.stats.count("drop")
            return dropped_response(request)
        if fault == "malformed":
            state.stats.count("malformed")
            body = completion_body(
                response_id=state.next_response_id(), created=int(time.time()), model=model or "unknown",
                choices=[("This answer never arrives whole.", "stop")], prompt_tokens=0, completion_tokens=0,
                cached_tokens=0, system_fingerprint=SYSTEM_FINGERPRINT,
            )
            return web.Response(body=body[: len(body) // 2], content_type="application/json")
        return self._counted(server_error_response(int(fault)))

    async def list_models(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        models = self._state.config.models or list(DEFAULT_MODELS)
        return json_response({"object": "list", "data": [_model_card(m) for m in models]})

    async def get_model(self, request: web.Request) -> web.Response:
        denied = check_auth(request, self._state)
        if denied is not None:
            return denied
        model = request.match_info["model"]
        allowed = self._state.allowed_models
        if allowed is not None and model not in allowed:
            return model_not_found(model)
        return json_response(_model_card(model))


def _model_card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 1_700_000_000, "owned_by": "llm-dispatch-simulator"}

