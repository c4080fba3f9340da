"""The simulator's ``POST /v1/messages``: Anthropic's Messages API with faults and quotas.

A request goes through, in order: a fault queued with ``POST /_sim/faults``; ``x-api-key`` (when the config
sets ``api_key``) and ``anthropic-version``; body validation; the model list; a ``[[sim:FAULT]]`` /
``[[sim:FAULTxN]]`` marker in a message; the RPM/TPM quotas (the same account as chat's); a random fault at the
configured rates; then the answer (see ``_messages``). Injected 4xx and 429s answer at once; 5xx, 529, drop,
malformed and successes wait the sampled latency first. Every error has Anthropic's shape (``_anthropic_http``);
429 and 529 carry ``retry-after``. With a quota set, every answer from the quotas on carries the
``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` headers, reset as an RFC 3339 time.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ._anthropic_checks import api_version, check_headers, messages_body_problem, model_refusal
from ._anthropic_http import anthropic_error, ratelimit_headers, spend_limit_error
from ._http import json_dumps
from ._messages import message_digest, plan_message, render_message
from ._serving import ANSWERED_AT_ONCE, RealTimeRoutes, admit, connection_fault, limit_views
from ._state import SimState

__all__ = ["MESSAGES_PATH", "register", "unknown_marker"]

MESSAGES_PATH = "/v1/messages"


def register(app: web.Application, state: SimState) -> None:
    """Add ``POST /v1/messages``, bound to ``state``."""
    app.router.add_post(MESSAGES_PATH, _MessageRoutes(state).handle)


def unknown_marker(message: str) -> web.Response:
    return anthropic_error(400, message)


class _MessageRoutes(RealTimeRoutes):
    request_id_header = "request-id"

    def _refuse_headers(self, request: web.Request) -> web.Response | None:
        return check_headers(request, self._state)

    def _unparsable(self) -> web.Response:
        return anthropic_error(400, "There was an error parsing the body of your request as JSON.")

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        problem = messages_body_problem(body) or model_refusal(body, version=api_version(request))
        return None if problem is None else anthropic_error(400, problem)

    def _unknown_model(self, model: str) -> web.Response:
        return anthropic_error(404, f"model: {model}")

    def _unknown_marker(self, message: str) -> web.Response:
        return unknown_marker(message)

    def _digest(self, raw: bytes, body: dict[str, Any]) -> bytes:
        return message_digest(body, state=self._state)

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        state = self._state
        plan = plan_message(body, digest=digest, kind=kind, invalid_json_rate=self._state.config.invalid_json_rate)

        def render() -> bytes:
            body_bytes, usage = render_message(plan, state=state)
            stats = state.stats
            stats.messages += 1
            stats.prompt_tokens += plan.prompt_tokens
            stats.completion_tokens += plan.output_tokens
            stats.cached_tokens += usage.cache_read_input_tokens
            stats.cache_creation_tokens += usage.cache_creation_input_tokens
            return body_bytes

        # Charged as on the chat side: the prompt plus max_tokens, from the same account.
        return await self._answer_admitted(request, model=model, charge=plan.prompt_tokens + body["max_tokens"],
                                           output_tokens=plan.output_tokens, render=render, kind=kind)

    def _admit(self, *, model: str, charge: int) -> tuple[web.Response | None, dict[str, str]]:
        now = time.monotonic()
        refusal = admit(self._state, charge=charge, now=now)
        headers = ratelimit_headers(limit_views(self._state, now=now), wall_now=time.time())
        if refusal is None:
            return None, headers
        quota = "input tokens" if refusal.kind == "tokens" else "requests"
        if refusal.too_large:
            message = (f"This request would exceed the rate limit for your organization of {refusal.per_minute:,} "
                       f"{quota} per minute on its own ({refusal.charge:,} requested). Reduce the prompt length "
                       "or the maximum tokens requested.")
        else:
            message = (f"This request would exceed the rate limit for your organization of {refusal.per_minute:,} "
                       f"{quota} per minute ({refusal.used:,} used, {refusal.charge:,} requested). Please try "
                       "again later.")
        return anthropic_error(429, message, retry_after=refusal.wait, headers=headers), {}

    async def _fault_response(self, request: web.Request, fault: str, *, model: str | None) -> web.StreamResponse:
        state = self._state
        retry_after = state.config.retry_after
        if fault == "404":
            return self._counted(anthropic_error(404, f"model: {model or 'unknown'} (simulator fault 404)"))
        if fault == "429":
            # A capacity 429: it names no quota, whatever the load.
            return self._counted(anthropic_error(
                429, f"{model or 'The model'} is receiving more requests than it can serve right now "
                     "(simulator fault 429).", retry_after=retry_after))
        if fault == "insufficient_quota":
            return self._counted(spend_limit_error())
        if fault in ANSWERED_AT_ONCE:
            return self._counted(anthropic_error(int(fault)))

        def garbled() -> bytes:
            return json_dumps(_garbled_message(state.next_response_id(prefix="msg_"), model or "unknown")).encode()

        broken = await connection_fault(request, fault, state=state, garbled=garbled)
        if broken is not None:
            return broken
        return self._counted(anthropic_error(int(fault), retry_after=retry_after))


def _garbled_message(message_id: str, model: str) -> dict[str, Any]:
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": "This answer never arrives whole."}],
        "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
