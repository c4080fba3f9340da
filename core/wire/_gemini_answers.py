"""Reading Gemini's answers: a GenerateContentResponse, and the wait a ``google.rpc.RetryInfo`` error detail asks.

Usage maps onto ``ChatResult`` as OpenAI counts it: ``prompt_tokens`` is ``promptTokenCount`` (which includes the
cached content) plus ``toolUsePromptTokenCount``; ``cached_tokens`` is ``cachedContentTokenCount``, billed at the
cached price; ``completion_tokens`` is ``candidatesTokenCount`` plus ``thoughtsTokenCount``, thinking being billed
as output ("Output price (including thinking tokens)", Gemini's pricing page), and ``reasoning_tokens`` the
thoughts alone. A candidate stopped for ``MAX_TOKENS`` is truncated (``TRUNCATED_FINISH_REASONS``); one stopped
by a safety filter (``SAFETY`` and the other blocking reasons below), or a prompt blocked before any candidate
(``promptFeedback.blockReason``), is a refusal. Thought parts (``thought: true``) are not the answer's text.
"""

from __future__ import annotations

import re
from typing import Any

import httpx

from .._json import compact_json
from ._responses import Chat, count, parse_answer, result_from_body
from .._types import ChatResult

__all__ = ["GEMINI_REFUSED_FINISH_REASONS", "gemini_result_from_body", "parse_generate_content", "retry_info_delay"]

# A candidate these stop is blocked content, not an answer cut short (google-genai ``types.FinishReason``).
GEMINI_REFUSED_FINISH_REASONS = frozenset({
    "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT",
})
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
# A protobuf Duration in JSON: seconds with up to nine decimals and an "s" ("24s", "0.5s", "1.000340012s").
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)s\s*")


def parse_generate_content(response: httpx.Response) -> Chat:
    return parse_answer(response, _chat, what="no candidates and no promptFeedback")


def gemini_result_from_body(body: Any, *, latency_s: float = 0.0, attempts: int = 1) -> ChatResult:
    """A ``ChatResult`` from a GenerateContentResponse read elsewhere (a Batch Mode response), parsed as ``chat``
    does."""
    return result_from_body(body, _chat, problem="has no candidates and no promptFeedback", latency_s=latency_s,
                            attempts=attempts)


def _chat(body: Any) -> Chat | None:
    if not isinstance(body, dict):
        return None
    candidates = body.get("candidates")
    feedback = body.get("promptFeedback")
    blocked = feedback.get("blockReason") if isinstance(feedback, dict) else None
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    if not isinstance(first, dict) and blocked is None:
        return None
    reported = body.get("usageMetadata")
    usage = reported if isinstance(reported, dict) else {}
    thoughts = count(usage.get("thoughtsTokenCount"))
    prompt_tokens = count(usage.get("promptTokenCount")) + count(usage.get("toolUsePromptTokenCount"))
    completion_tokens = count(usage.get("candidatesTokenCount")) + thoughts
    candidate = first if isinstance(first, dict) else {}
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    parts = [part for part in parts if isinstance(part, dict)] if isinstance(parts, list) else []
    texts = [part["text"] for part in parts if isinstance(part.get("text"), str) and not part.get("thought")]
    finish = candidate.get("finishReason")
    refusal: str | None = None
    if blocked is not None:
        finish = finish or "PROMPT_BLOCKED"
        refusal = f"the prompt was blocked (promptFeedback.blockReason {blocked})"
        message = feedback.get("blockReasonMessage") if isinstance(feedback, dict) else None
        if message:
            refusal += f": {message}"
    elif finish in GEMINI_REFUSED_FINISH_REASONS:
        refusal = f"the answer was blocked (finishReason {finish})"
        message = candidate.get("finishMessage")
        if message:
            refusal += f": {message}"
    result = ChatResult(
        text="".join(texts) if texts else None,
        finish_reason=finish if isinstance(finish, str) else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=count(usage.get("cachedContentTokenCount")),
        model=body.get("modelVersion"),
        response_id=body.get("responseId"),
        latency_s=0.0,
        reasoning_tokens=thoughts,
        tool_calls=_tool_calls(parts),
        refusal=refusal,
    )
    total = count(usage.get("totalTokenCount")) or prompt_tokens + completion_tokens
    return Chat(result, total)


def _tool_calls(parts: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The answer's functionCall parts in OpenAI's tool-call shape, their args as the JSON text of ``arguments``;
    an id Gemini gives is kept, else one is made from the call's place (what a tool message answers); a part's
    ``thoughtSignature`` kept as ``extra_content.google.thought_signature``."""
    calls: list[dict[str, Any]] = []
    for part in parts:
        call = part.get("functionCall")
        if not isinstance(call, dict):
            continue
        call_id = call.get("id") or f"call_{len(calls)}"
        tool_call: dict[str, Any] = {"id": call_id, "type": "function", "function": {
            "name": call.get("name"), "arguments": compact_json(call.get("args") or {})}}
        signature = part.get("thoughtSignature")
        if isinstance(signature, str) and signature:
            # Where Gemini's OpenAI compatibility puts it: sent back with the call in a later turn (``_gemini``).
            tool_call["extra_content"] = {"google": {"thought_signature": signature}}
        calls.append(tool_call)
    return calls or None


def retry_info_delay(body: Any) -> float | None:
    """Seconds a Google error body asks to wait (its ``google.rpc.RetryInfo`` detail's ``retryDelay``), or None.

    Gemini sends no Retry-After and no rate-limit headers: a 429 ``RESOURCE_EXHAUSTED`` says when to come back here,
    ``{"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "24s"}]}}``.
    """
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and detail.get("@type") == _RETRY_INFO:
            found = _DURATION.fullmatch(str(detail.get("retryDelay", "")))
            if found is not None:
                return float(found.group(1))
    return None

