"""The simulator's ``/v1`` chat routes: chat completions with faults and quotas, and the model list.

A chat request goes through, in order: a fault queued with ``POST /_sim/faults``; auth; body
validation; the model list; a ``[[sim:FAULT]]`` / ``[[sim:FAULTxN]]`` marker in a message; the
RPM/TPM quotas; a random fault at the configured rates; then the answer. Injected 4xx and 429s
answer at once; 5xx, drop, malformed and successes wait the sampled latency first. With a quota set,
every answer from the quotas on carries the ``x-ratelimit-*`` headers, as OpenAI's do.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ._checks import (
    check_auth,
    invalid_request,
    model_not_found,
    unknown_marker,
    validate_chat_body,
)
from ._completions import SYSTEM_FINGERPRINT, body_digest, plan_completion, render_completion
from ._http import (
    client_error_response,
    completion_body,
    error_response,
    format_reset,
    insufficient_quota_response,
    json_response,
    message_fields,
    rate_limited_response,
    server_error_response,
)
from ._serving import ANSWERED_AT_ONCE, RealTimeRoutes, admit, connection_fault, limit_views
from ._state import SimState

__all__ = ["CHAT_COMPLETIONS_PATH", "DEFAULT_MODELS", "register"]

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"

# What GET /v1/models lists when the simulator accepts any model.
DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "o4-mini")

def register(app: web.Application, state: SimState) -> None:
    """Add the chat-completions and models routes, bound to ``state``."""
    routes = _ChatRoutes(state)
    app.router.add_post(CHAT_COMPLETIONS_PATH, routes.handle)
    app.router.add_get("/v1/models", routes.list_models)
    app.router.add_get("/v1/models/{model}", routes.get_model)


class _ChatRoutes(RealTimeRoutes):
    request_id_header = "x-request-id"

    def _refuse_headers(self, request: web.Request) -> web.Response | None:
        return check_auth(request, self._state)

    def _unparsable(self) -> web.Response:
        return invalid_request(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using "
            "your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not "
            "valid JSON.)", param=None, code=None)

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        return validate_chat_body(body)

    def _unknown_model(self, model: str) -> web.Response:
        return model_not_found(model)

    def _unknown_marker(self, message: str) -> web.Response:
        return unknown_marker(message)

    def _digest(self, raw: bytes, body: dict[str, Any]) -> bytes:
        return body_digest(raw, state=self._state)

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        state = self._state
        plan = plan_completion(body, digest=digest, kind=kind, invalid_json_rate=state.config.invalid_json_rate)
        # Admission is charged like OpenAI does: the prompt plus max_tokens when it is given.
        charge = plan.prompt_tokens + (plan.cap * plan.n if plan.cap is not None else plan.completion_tokens)

        def render() -> bytes:
            body_bytes, cached = render_completion(plan, state=state)
            stats = state.stats
            stats.completions += 1
            stats.prompt_tokens += plan.prompt_tokens
            stats.completion_tokens += plan.completion_tokens
            stats.cached_tokens += cached
            return body_bytes

        return await self._answer_admitted(request, model=model, charge=charge,
                                           output_tokens=plan.completion_tokens, render=render, kind=kind)

    def _admit(self, *, model: str, charge: int) -> tuple[web.Response | None, dict[str, str]]:
        now = time.monotonic()
        refusal = admit(self._state, charge=charge, now=now)
        headers = self._limit_headers(now)
        if refusal is None:
            return None, headers
        quota = "tokens per min (TPM)" if refusal.kind == "tokens" else "requests per min (RPM)"
        where = f"for {model} in organization org-simulator on {quota}: Limit {refusal.per_minute}"
        if refusal.too_large:
            message = (f"Request too large {where}, Requested {refusal.charge}. The input or output tokens must be "
                       "reduced in order to run successfully.")
        else:
            message = (f"Rate limit reached {where}, Used {refusal.used}, Requested {refusal.charge}. "
                       f"Please try again in {format_reset(refusal.wait)}.")
        refused = rate_limited_response(
            message=message, limit_type=refusal.kind, retry_after=refusal.wait, headers=headers
        )
        return refused, {}

    def _limit_headers(self, now: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        for view in limit_views(self._state, now=now):
            headers[f"x-ratelimit-limit-{view.kind}"] = str(view.per_minute)
            headers[f"x-ratelimit-remaining-{view.kind}"] = str(view.remaining)
            headers[f"x-ratelimit-reset-{view.kind}"] = format_reset(view.reset_in)
        return headers

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
        if fault == "insufficient_quota":
            return self._counted(insufficient_quota_response())
        if fault in ANSWERED_AT_ONCE:
            return self._counted(client_error_response(int(fault)))

        def garbled() -> bytes:
            return completion_body(
                response_id=state.next_response_id(), created=int(time.time()), model=model or "unknown",
                choices=[(message_fields("This answer never arrives whole."), "stop")], prompt_tokens=0,
                completion_tokens=0,
                cached_tokens=0, system_fingerprint=SYSTEM_FINGERPRINT,
            )

        broken = await connection_fault(request, fault, state=state, garbled=garbled)
        if broken is not None:
            return broken
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

