"""Reading the provider's answers: chat completions, files, batches and error bodies, from ``httpx.Response``.

A parser raises ``APIResponseValidationError`` for a 2xx body it cannot use, which the client never sends again (the
answer may have been billed); it carries the usage the body reported, when it reported any.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from .._batch_types import BatchInfo, FileInfo
from .._exceptions import APIResponseValidationError
from .._json import read_json
from .._types import ChatResult

__all__ = [
    "BatchPage",
    "Chat",
    "chat_result_from_body",
    "count",
    "error_code",
    "error_detail",
    "error_reason",
    "parse_batch_info",
    "parse_answer",
    "parse_batch_page",
    "parse_chat",
    "parse_file_info",
    "parse_json",
    "reported_usage",
    "result_from_body",
    "save_body",
]

# How much of an unexpected body goes into an error message.
_SNIPPET_CHARS = 300


class Chat(NamedTuple):
    """A parsed answer: its ``ChatResult`` (how the call went, latency and attempts, not yet known) and its
    total usage as the provider counts it."""

    result: ChatResult
    total_tokens: int

    def finished(self, *, latency_s: float, attempts: int) -> ChatResult:
        """The result, once how the call went is known (set on it: nobody else holds it yet)."""
        result = self.result
        result.latency_s, result.attempts = latency_s, attempts
        return result


class BatchPage(NamedTuple):
    batches: list[BatchInfo]
    has_more: bool


def parse_json(response: httpx.Response) -> Any:
    try:
        # What response.json() returns (json.loads of the body), read by orjson where the two agree.
        return read_json(response.content)
    except ValueError as exc:  # also covers UnicodeDecodeError
        raise APIResponseValidationError(f"the body is not JSON: {_snippet(response)}") from exc


def parse_chat(response: httpx.Response) -> Chat:
    return parse_answer(response, _chat_from_body, what="no choices[0].message")


def parse_answer(response: httpx.Response, read: Callable[[Any], Chat | None], *, what: str) -> Chat:
    """What ``read`` makes of the JSON body; ``None`` from it is an unusable answer (``what``: what it lacks)."""
    body = parse_json(response)
    chat = read(body)
    if chat is None:
        detail = error_detail(response) if isinstance(body, dict) and body.get("error") else _snippet(response)
        error = APIResponseValidationError(f"the body has {what}: {detail}")
        error.usage = reported_usage(body, read=read)
        raise error
    return chat


def reported_usage(body: Any, *, read: Callable[[Any], Chat | None]) -> ChatResult | None:
    """What a body with no usable answer says it used (its ``usage`` read as ``read`` reads an answer's), or None
    when it says nothing: ``{"choices": []}`` with usage, an error object with usage, a Message without content."""
    if not isinstance(body, dict) or not isinstance(body.get("usage"), dict):
        return None
    # The answer's own reader on an empty answer of the same shape: one rule for what each usage field means.
    chat = read({**body, "choices": [{"message": {}}], "content": []})
    if chat is None:
        return None
    usage = chat.result
    usage.text, usage.finish_reason, usage.tool_calls, usage.refusal = None, None, None, None
    return usage if usage.prompt_tokens or usage.completion_tokens else None


def chat_result_from_body(body: Any, *, latency_s: float = 0.0, attempts: int = 1) -> ChatResult:
    """A ``ChatResult`` from a chat.completion body read elsewhere (a batch output line), parsed as ``chat`` does."""
    return result_from_body(body, _chat_from_body, problem="has no choices[0].message", latency_s=latency_s,
                            attempts=attempts)


def result_from_body(
    body: Any, read: Callable[[Any], Chat | None], *, problem: str, latency_s: float, attempts: int
) -> ChatResult:
    """What ``read`` makes of a body read elsewhere (a batch result line), finished; ``None`` from it is an unusable
    answer, raised with what the body says it used (``problem``: what is wrong with it)."""
    chat = read(body)
    if chat is None:
        error = APIResponseValidationError(f"the body {problem}: {str(body)[:_SNIPPET_CHARS]!r}")
        error.usage = reported_usage(body, read=read)
        raise error
    return chat.finished(latency_s=latency_s, attempts=attempts)


def parse_file_info(response: httpx.Response) -> FileInfo:
    return FileInfo.from_api(parse_json(response))


def parse_batch_info(response: httpx.Response) -> BatchInfo:
    return BatchInfo.from_api(parse_json(response))


def parse_batch_page(response: httpx.Response) -> BatchPage:
    body = parse_json(response)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise APIResponseValidationError(f"the body is not a list of batches: {_snippet(response)}")
    return BatchPage([BatchInfo.from_api(item) for item in data], bool(body.get("has_more")))


def error_code(response: httpx.Response) -> str | None:
    """The provider's machine-readable error code (``rate_limit_exceeded``, ``insufficient_quota``), if it gave one."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def error_reason(response: httpx.Response) -> str | None:
    """The most precise machine-readable reason an error body gives: Anthropic's ``error.details.error_code``
    (``enforced_spend_limit_reached``), else the error's ``code`` (OpenAI's ``insufficient_quota``,
    ``invalid_api_key``), else its ``type`` (Anthropic's ``billing_error``, ``authentication_error``), else Google's
    ``ErrorInfo`` reason (``API_KEY_INVALID``), else its ``status`` (Google's ``RESOURCE_EXHAUSTED``)."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None
    details = error.get("details")
    # Google's errors give their reason in a ``google.rpc.ErrorInfo`` detail (``API_KEY_INVALID``), else as
    # ``status`` (``RESOURCE_EXHAUSTED``, ``INVALID_ARGUMENT``); their ``code`` is the HTTP status, a number.
    for value in (details.get("error_code") if isinstance(details, dict) else None, error.get("code"), error.get("type"),
                  _error_info_reason(details), error.get("status")):
        if isinstance(value, str) and value:
            return value
    return None


def _error_info_reason(details: Any) -> str | None:
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            reason = detail.get("reason")
            return reason if isinstance(reason, str) else None
    return None


def error_detail(response: httpx.Response) -> str:
    """The provider's own explanation of an error status, as short as it can be."""
    try:
        body = response.json()
    except ValueError:
        return _snippet(response) if response.text.strip() else response.reason_phrase or "no body"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            # Google's status word names the error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE).
            status = error.get("status")
            if isinstance(status, str) and status.isupper() and status not in str(error["message"]):
                return f"{status}: {error['message']}"
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        if body.get("message"):
            return str(body["message"])
    return _snippet(response)


async def save_body(response: httpx.Response, path: Path) -> None:
    """Stream the body to ``path``, written beside it and renamed at the end: a failed attempt never leaves half a file."""
    partial = path.with_name(path.name + ".part")
    try:
        with partial.open("wb") as out:
            async for chunk in response.aiter_bytes():
                out.write(chunk)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _snippet(response: httpx.Response) -> str:
    text = response.text.strip()
    return repr(text[:_SNIPPET_CHARS] + ("..." if len(text) > _SNIPPET_CHARS else ""))


def _chat_from_body(body: Any) -> Chat | None:
    """The parts of a chat.completion body we keep, or None when it has no ``choices[0].message``."""
    choices = body.get("choices") if isinstance(body, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return None
    assert isinstance(body, dict) and isinstance(first, dict)
    reported = body.get("usage")
    usage = reported if isinstance(reported, dict) else {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    output = usage.get("completion_tokens_details")
    prompt_tokens = count(usage.get("prompt_tokens"))
    completion_tokens = count(usage.get("completion_tokens"))
    tier = body.get("service_tier")
    refusal = message.get("refusal")
    result = ChatResult(
        text=_message_text(message.get("content")),
        finish_reason=first.get("finish_reason"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=count(details.get("cached_tokens")),
        model=body.get("model"),
        response_id=body.get("id"),
        latency_s=0.0,
        # Billed at 1.25x input from gpt-5.6 on; the 30-minute write is the only duration the API reports.
        cache_creation_tokens=count(details.get("cache_write_tokens")),
        reasoning_tokens=count(output.get("reasoning_tokens")) if isinstance(output, dict) else 0,
        service_tier=tier if isinstance(tier, str) else None,
        tool_calls=_tool_calls(message.get("tool_calls")),
        # An empty refusal is no refusal; any other value is the model's words (a string, as the API sends it).
        refusal=None if refusal is None or refusal == "" else str(refusal),
    )
    return Chat(result, count(usage.get("total_tokens")) or prompt_tokens + completion_tokens)


def _tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    """The message's tool calls (function and custom) as the API wrote them; None when it makes none."""
    if not isinstance(calls, list):
        return None
    return [call for call in calls if isinstance(call, dict)] or None


def count(value: Any) -> int:
    """A token count as an answer gives it: 0 where it gives none or no number."""
    if type(value) is int:
        return value
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _message_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    # Some OpenAI-compatible servers answer with a list of content parts.
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return _json.dumps(content, ensure_ascii=False)
