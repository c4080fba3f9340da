"""The simulator's ``POST /v1beta/models/{model}:generateContent``: the Gemini Developer API with faults and quotas.

A request goes through the same steps as chat and Messages (``_serving.RealTimeRoutes``): a queued fault;
``x-goog-api-key`` (when the config sets ``api_key``: none is Google's 403 PERMISSION_DENIED, a wrong one its 400
API_KEY_INVALID); the body (Google's 400 INVALID_ARGUMENT for an unknown field, no contents, or what the model
refuses: ``core.gemini_refusal``; on Gemini 3 and later, a function call of the current turn without its
``thoughtSignature``, which the answers' calls carry); the model list (404 NOT_FOUND); a ``[[sim:FAULT]]`` marker; the RPM/TPM quotas
(the same account as the other APIs'); a random fault; then the answer, counted and worded as the chat side would
answer the same turns. Errors are Google's envelope, ``{"error": {"code", "message", "status", "details"}}``;
a 429 is ``RESOURCE_EXHAUSTED`` with a ``google.rpc.QuotaFailure`` and a ``google.rpc.RetryInfo`` whose
``retryDelay`` says when to come back, and no answer carries rate-limit headers or Retry-After: Gemini sends none.
Faults Gemini has no status for answer as it would: 402 as 400 FAILED_PRECONDITION (billing), 413 as 400
INVALID_ARGUMENT, 529 as 503 UNAVAILABLE, ``insufficient_quota`` as a 429 with no RetryInfo.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from llm_dispatch.core import gemini_refusal

from ._completions import (
    REASONING_PER_TOKEN,
    PlannedCompletion,
    body_digest,
    cache_use,
    canonical_json,
    plan_completion,
    tool_input,
)
from ._http import json_dumps, json_response
from ._serving import ANSWERED_AT_ONCE, RealTimeRoutes, admit, connection_fault
from ._state import SimState
from ._tokens import completion_text

__all__ = ["GEMINI_PATH", "as_chat", "body_problem", "gemini_error", "plan_content", "render_content",
           "CacheRefused", "resolve_cache", "routes", "target"]

GEMINI_PATH = "/v1beta/models/{target}"
_METHOD = "generateContent"
# Google's status word for each HTTP status (google.rpc.Code, as the Gemini API's troubleshooting page lists them).
_STATUS_WORDS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_FAULT_MESSAGES = {
    400: "Request contains an invalid argument (simulator fault 400).",
    401: "Request had invalid authentication credentials (simulator fault 401).",
    403: "Method doesn't allow unregistered callers (simulator fault 403).",
    500: "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
    504: "Deadline expired before operation could complete.",
}
# A fault with no status of Gemini's own: the answer Gemini gives for that case instead.
_AS_GEMINI = {402: (400, "FAILED_PRECONDITION", "User location is not supported for the API use without a billing "
                                                 "account linked (simulator fault 402)."),
              413: (400, "INVALID_ARGUMENT", "Request payload size exceeds the limit: 20971520 bytes (simulator "
                                              "fault 413)."),
              529: (503, "UNAVAILABLE", "The model is overloaded. Please try again later.")}
_TOP_LEVEL = frozenset({"contents", "systemInstruction", "generationConfig", "tools", "toolConfig", "safetySettings",
                        "cachedContent", "serviceTier", "labels"})
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_use": "STOP", "tool_calls": "STOP"}


def target(request: web.Request) -> tuple[str, str]:
    """(model, method) of ``models/{model}:{method}``."""
    return _target(request)


def routes(state: SimState) -> list[_GeminiRoutes]:
    """generateContent's route, bound to ``state`` (``_gemini_embeddings.register`` serves it beside its own)."""
    return [_GeminiRoutes(state)]


def gemini_error(status: int, message: str | None = None, *, word: str | None = None,
                 details: list[dict[str, Any]] | None = None) -> web.Response:
    """Google's error envelope for ``status`` (its status word, or ``word``), with ``details`` when given."""
    error: dict[str, Any] = {"code": status, "message": message or _FAULT_MESSAGES.get(status, "Simulated error."),
                             "status": word or _STATUS_WORDS.get(status, "UNKNOWN")}
    if details:
        error["details"] = details
    return json_response({"error": error}, status=status)


def _quota_error(message: str, *, retry_after: float | None, quota_id: str) -> web.Response:
    """A 429 RESOURCE_EXHAUSTED: the quota that ran out, and with ``retry_after`` when to come back (RetryInfo)."""
    details: list[dict[str, Any]] = [{"@type": _QUOTA_FAILURE, "violations": [
        {"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests", "quotaId": quota_id}]}]
    if retry_after is not None:
        details.append({"@type": _RETRY_INFO, "retryDelay": f"{max(retry_after, 0.001):.3f}s"})
    return gemini_error(429, message, details=details)


def _target(request: web.Request) -> tuple[str, str]:
    """(model, method) of ``models/{model}:{method}``."""
    model, _, method = request.match_info["target"].rpartition(":")
    return model, method


def as_chat(body: dict[str, Any], *, model: str) -> dict[str, Any]:
    """A generateContent body as the chat body the simulator's planner reads: turns with text, the cap, tools."""
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if isinstance(system, dict):
        messages.append({"role": "system", "content": _text(system.get("parts"))})
    for content in body["contents"]:
        role = "assistant" if content.get("role") == "model" else "user"
        messages.append({"role": role, "content": _text(content.get("parts"))})
    config = body.get("generationConfig") or {}
    chat: dict[str, Any] = {"model": model, "messages": messages}
    if config.get("maxOutputTokens") is not None:
        chat["max_tokens"] = config["maxOutputTokens"]
    declarations = [declaration for tool in body.get("tools") or () if isinstance(tool, dict)
                    for declaration in tool.get("functionDeclarations") or () if isinstance(declaration, dict)]
    mode = ((body.get("toolConfig") or {}).get("functionCallingConfig") or {}).get("mode")
    if declarations and mode != "NONE":
        chat["tools"] = [{"type": "function", "function": {
            "name": declaration.get("name"),
            "parameters": declaration.get("parametersJsonSchema") or declaration.get("parameters") or {}}}
            for declaration in declarations]
    return chat


def _text(parts: Any) -> str:
    """A Content's parts as one text: text parts as they are, any other part (a function call or response, inline
    data) as its JSON."""
    texts = []
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict):
            texts.append(part["text"] if isinstance(part.get("text"), str) else canonical_json(part))
    return "".join(texts)


def body_problem(body: Any, *, model: str) -> str | None:
    """Google's 400 message for a body generateContent refuses, or None."""
    if not isinstance(body, dict):
        return "Invalid JSON payload received. Expected an object."
    for name in body:
        if name not in _TOP_LEVEL:
            return f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified"
    for index, content in enumerate(contents):
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list) or not content["parts"]:
            return f"* GenerateContentRequest.contents[{index}].parts: contents.parts must not be empty."
        if content.get("role", "user") not in ("user", "model"):
            return (f"Please use a valid role: user, model. Got {content.get('role')!r} at "
                    f"GenerateContentRequest.contents[{index}].role")
    config = body.get("generationConfig")
    if config is not None and not isinstance(config, dict):
        return "Invalid value at 'generation_config': expected an object."
    cap = (config or {}).get("maxOutputTokens")
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        return "* GenerateContentRequest.generation_config.max_output_tokens: max_output_tokens must be positive."
    refusal = gemini_refusal(model, body)
    if refusal is not None:
        return refusal.api_message
    return _unsigned_call(contents, model=model)


def _unsigned_call(contents: list[dict[str, Any]], *, model: str) -> str | None:
    """Gemini 3 and later's 400 for a function call of the current turn (the model turns since the last user turn
    with text) whose first call carries no ``thoughtSignature``; 2.5 models need none."""
    if model.startswith("gemini-2."):
        return None
    for index in range(len(contents) - 1, -1, -1):
        content = contents[index]
        parts = [part for part in content["parts"] if isinstance(part, dict)]
        if content.get("role", "user") == "user":
            if any("text" in part for part in parts):
                return None
            continue
        calls = [part for part in parts if "functionCall" in part]
        if calls and not calls[0].get("thoughtSignature"):
            name = calls[0]["functionCall"].get("name") if isinstance(calls[0]["functionCall"], dict) else None
            return (f"Function call is missing a thought_signature in functionCall parts. This is required for tools "
                    f"to work correctly. Additional data, function call `{name}`, position {index + 1}.")
    return None


@dataclass(frozen=True, slots=True)
class _Planned:
    completion: PlannedCompletion
    thoughts: int
    explicit: int | None = None  # the tokens of the explicit cache the request reads

    @property
    def output_tokens(self) -> int:
        if self.completion.kind == "refuse":
            return 0
        return self.completion.completion_tokens + self.thoughts


def plan_content(body: dict[str, Any], *, model: str, digest: bytes, kind: str | None,
                 invalid_json_rate: float, state: SimState | None = None) -> _Planned:
    """The answer to a valid body: the chat side's for the same turns, JSON of its ``responseJsonSchema`` (or
    ``responseSchema``) when it gives one; with ``thinkingConfig`` (a level, or a budget that is not 0), thoughts
    of ``REASONING_PER_TOKEN`` per answer token within the budget and the cap. A body naming a ``cachedContent`` of
    ``state``'s is answered with the cache's turns first (``resolve_cache``, which may raise ``CacheRefused``)."""
    explicit = None
    if state is not None:
        body, explicit = resolve_cache(state, body, model=model)
    config = body.get("generationConfig") or {}
    schema = config.get("responseJsonSchema") or config.get("responseSchema")
    chat = as_chat(body, model=model)
    completion = plan_completion(chat, digest=digest, kind=kind, invalid_json_rate=invalid_json_rate,
                                 schema=schema if isinstance(schema, dict) else None)
    thinking = config.get("thinkingConfig")
    thoughts = 0
    if isinstance(thinking, dict) and thinking.get("thinkingBudget") != 0 and kind not in ("refuse", "slow"):
        thoughts = completion.completion_tokens * REASONING_PER_TOKEN
        budget = thinking.get("thinkingBudget")
        if isinstance(budget, int) and budget > 0:
            thoughts = min(thoughts, budget)
        cap = chat.get("max_tokens")
        if isinstance(cap, int):
            thoughts = max(0, min(thoughts, cap - completion.completion_tokens))
    return _Planned(completion, thoughts, explicit)


class CacheRefused(Exception):
    """What Google answers a body whose ``cachedContent`` cannot be read: ``status``, its ``word``, ``message``."""

    def __init__(self, status: int, word: str, message: str) -> None:
        super().__init__(message)
        self.status, self.word, self.message = status, word, message

    def response(self) -> web.Response:
        return gemini_error(self.status, self.message, word=self.word)

    def line_error(self) -> dict[str, Any]:
        """The batch line's error: a google.rpc.Status (NOT_FOUND is code 5, INVALID_ARGUMENT 3)."""
        return {"error": {"code": 5 if self.status == 404 else 3, "message": self.message, "status": self.word}}


def resolve_cache(state: SimState, body: dict[str, Any], *, model: str) -> tuple[dict[str, Any], int | None]:
    """(``body``, None) for a body naming no ``cachedContent``; else (the body with its explicit cache's turns before
    its own, the cache's tokens). Raises ``CacheRefused`` as Google answers: 404 for a cache unknown or expired, 400
    for a body repeating what the cache holds or of another model (``_gemini_caches`` keeps them)."""
    name = body.get("cachedContent")
    if name is None:
        return body, None
    cache = state.gemini_caches.get(name) if isinstance(name, str) else None
    if cache is None or cache.expires <= time.time():
        raise CacheRefused(404, "NOT_FOUND", f"CachedContent not found (or permission denied): {str(name)[:100]}")
    if any(field in body for field in ("systemInstruction", "tools", "toolConfig")):
        raise CacheRefused(400, "INVALID_ARGUMENT", "CachedContent can not be used with GenerateContent request "
                           "setting system_instruction, tools or tool_config.\n\nProposed fix: move those values to "
                           "CachedContent from GenerateContent request.")
    if cache.model != model:
        raise CacheRefused(400, "INVALID_ARGUMENT", f"Model used by GenerateContent request (models/{model}) and "
                           f"CachedContent (models/{cache.model}) has to be the same.")
    merged = {key: value for key, value in body.items() if key != "cachedContent"}
    merged.update({key: value for key, value in cache.parts.items() if key != "contents"})
    merged["contents"] = [*(cache.parts.get("contents") or []), *body.get("contents", [])]
    return merged, cache.tokens


def render_content(plan: _Planned, *, state: SimState, model: str) -> bytes:
    """A GenerateContentResponse for ``plan`` (an ``error200`` one is an error body with status 200); a request that
    read an explicit cache reports its tokens cached (implicit caching then plays no part)."""
    completion = plan.completion
    text_digest, tokens, finish_reason = completion.choices[0]
    cached = plan.explicit if plan.explicit is not None else cache_use(completion, state=state, provider="gemini")[0]
    state.stats.cached_tokens += cached
    usage: dict[str, Any] = {"promptTokenCount": completion.prompt_tokens,
                             "candidatesTokenCount": 0 if completion.kind == "refuse" else tokens,
                             "totalTokenCount": completion.prompt_tokens + plan.output_tokens}
    if cached:
        usage["cachedContentTokenCount"] = cached  # a cache's hits, part of promptTokenCount
    if plan.thoughts:
        usage["thoughtsTokenCount"] = plan.thoughts
    if completion.kind == "error200":
        return json_dumps({"error": {"code": 500, "message": "Internal error (simulator marker error200).",
                                     "status": "INTERNAL"}, "usageMetadata": usage}).encode()
    candidate: dict[str, Any] = {"index": 0}
    if completion.kind == "refuse":
        candidate["finishReason"] = "SAFETY"
        candidate["safetyRatings"] = [{"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH",
                                       "blocked": True}]
    else:
        candidate["content"] = {"role": "model", "parts": _parts(plan, text_digest, tokens, finish_reason)}
        candidate["finishReason"] = _FINISH.get(finish_reason, "STOP")
    answer: dict[str, Any] = {"candidates": [] if completion.kind == "empty_choices" else [candidate],
                              "usageMetadata": usage, "modelVersion": model,
                              "responseId": state.next_response_id(prefix="")}
    return json_dumps(answer).encode()


def _parts(plan: _Planned, digest: int, tokens: int, finish_reason: str) -> list[dict[str, Any]]:
    completion = plan.completion
    if completion.tool is not None:
        name, schema = completion.tool
        call: dict[str, Any] = {"functionCall": {"name": name, "args": tool_input(schema)}}
        if not completion.model.startswith("gemini-2."):
            call["thoughtSignature"] = f"sim{digest & 0xFFFFFFFFFFFF:012x}"  # Gemini 3 and later sign each call
        return [call]
    if completion.text is not None:
        return [{"text": completion.text}]
    return [{"text": completion_text(digest=digest, tokens=tokens, stop=finish_reason == "stop")}]


class _GeminiRoutes(RealTimeRoutes):
    request_id_header = "x-request-id"
    method = _METHOD

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        model, method = _target(request)
        if method != self.method or not model:
            return self._counted(gemini_error(404, f"Method not found: models/{request.match_info['target']}"))
        return await super()._serve(request)

    def _refuse_headers(self, request: web.Request) -> web.Response | None:
        expected = self._state.config.api_key
        if expected is None:
            return None
        given = request.headers.get("x-goog-api-key")
        if given is None:
            return gemini_error(403, "Method doesn't allow unregistered callers (callers without established "
                                     "identity). Please use API Key or other form of API consumer identity to call "
                                     "this API.")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return gemini_error(400, "API key not valid. Please pass a valid API key.", details=[
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                 "domain": "googleapis.com"}])
        return None

    def _unparsable(self) -> web.Response:
        return gemini_error(400, "Invalid JSON payload received. Unexpected token.")

    def _invalid_body(self, body: Any, request: web.Request) -> web.Response | None:
        problem = body_problem(body, model=_target(request)[0])
        if problem is not None:
            return gemini_error(400, problem)
        try:
            resolve_cache(self._state, body, model=_target(request)[0])
        except CacheRefused as refused:
            return refused.response()
        return None

    def _model_of(self, request: web.Request, body: dict[str, Any]) -> str:
        return _target(request)[0]

    def _turns(self, body: dict[str, Any]) -> Any:
        return as_chat(body, model="")["messages"]

    def _unknown_model(self, model: str) -> web.Response:
        return gemini_error(404, f"models/{model} is not found for API version v1beta, or is not supported for "
                                 "generateContent. Call ListModels to see the list of available models and their "
                                 "supported methods.")

    def _unknown_marker(self, message: str) -> web.Response:
        return gemini_error(400, message)

    def _digest(self, raw: bytes, body: dict[str, Any]) -> bytes:
        return body_digest(canonical_json(body).encode(), state=self._state)

    async def _answer_valid(
        self, request: web.Request, *, body: dict[str, Any], model: str, digest: bytes, kind: str | None = None
    ) -> web.StreamResponse:
        state = self._state
        try:
            plan = plan_content(body, model=model, digest=digest, kind=kind,
                                invalid_json_rate=state.config.invalid_json_rate, state=state)
        except CacheRefused as refused:  # expired since the body was checked
            return self._counted(refused.response())

        def render() -> bytes:
            rendered = render_content(plan, state=state, model=model)
            stats = state.stats
            stats.generate_contents += 1
            stats.prompt_tokens += plan.completion.prompt_tokens
            stats.completion_tokens += plan.output_tokens
            return rendered

        cap = plan.completion.cap or 0
        return await self._answer_admitted(request, model=model, charge=plan.completion.prompt_tokens + cap,
                                           output_tokens=plan.output_tokens, render=render, kind=kind)

    def _admit(self, *, model: str, charge: int) -> tuple[web.Response | None, dict[str, str]]:
        refusal = admit(self._state, charge=charge, now=time.monotonic())
        if refusal is None:
            return None, {}  # Gemini sends no rate-limit headers
        what = "input_token_count" if refusal.kind == "tokens" else "requests"
        message = (f"You exceeded your current quota, please check your plan and billing details. Quota exceeded "
                   f"for metric: generativelanguage.googleapis.com/generate_content_paid_tier_{what}, limit: "
                   f"{refusal.per_minute} per minute, model: {model}. Please retry in {refusal.wait:.3f}s.")
        quota = "GenerateContentPaidTierInputTokensPerModelPerMinute" if refusal.kind == "tokens" else \
            "GenerateRequestsPerMinutePerProjectPerModel"
        return _quota_error(message, retry_after=refusal.wait, quota_id=quota), {}

    async def _fault_response(self, request: web.Request, fault: str, *, model: str | None) -> web.StreamResponse:
        state = self._state
        if fault == "404":
            return self._counted(self._unknown_model(f"{model or 'unknown'} (simulator fault 404)"))
        if fault == "429":
            return self._counted(_quota_error(
                "You exceeded your current quota, please check your plan and billing details (simulator fault 429). "
                f"Please retry in {state.config.retry_after:g}s.", retry_after=state.config.retry_after,
                quota_id="GenerateRequestsPerMinutePerProjectPerModel"))
        if fault == "insufficient_quota":
            return self._counted(_quota_error(
                "You exceeded your current quota, please check your plan and billing details (simulator fault "
                "insufficient_quota).", retry_after=None, quota_id="GenerateRequestsPerDayPerProjectPerModel"))
        status = int(fault) if fault.isdigit() else 0
        if fault in ANSWERED_AT_ONCE:
            return self._counted(self._status_error(status))

        def garbled() -> bytes:
            return json_dumps({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "This answer never arrives whole."}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 0}}).encode()

        broken = await connection_fault(request, fault, state=state, garbled=garbled)
        if broken is not None:
            return broken
        return self._counted(self._status_error(status))

    @staticmethod
    def _status_error(status: int) -> web.Response:
        if status in _AS_GEMINI:
            code, word, message = _AS_GEMINI[status]
            return gemini_error(code, message, word=word)
        return gemini_error(status)
