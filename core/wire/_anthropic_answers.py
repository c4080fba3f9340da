"""Reading Anthropic's answers: a Message, a MessageBatch and a page of them (a batch's results file:
``batches/_message_batch_results.py``).

Usage maps onto ``ChatResult`` as OpenAI counts it: ``prompt_tokens`` is all input (uncached, cache reads
and cache writes), ``cached_tokens`` the cache reads, ``cache_creation_tokens`` the cache writes, of which
``cache_creation_extended_tokens`` the 1-hour ones; the tier is ``fast`` for fast mode, else ``usage.service_tier``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import httpx

from .._batch_types import BatchInfo, RequestCounts, batch_status_from_api, int_field, rfc3339_field
from .._status import BatchStatus
from .._exceptions import APIResponseValidationError
from .._json import compact_json
from ._responses import BatchPage, Chat, parse_answer, parse_json, result_from_body
from .._types import ChatResult

__all__ = [
    "MESSAGE_BATCH_STATUSES",
    "message_batch_info",
    "message_result_from_body",
    "parse_message",
    "parse_message_batch",
    "parse_message_batch_page",
]

# ended is COMPLETED even after a cancel: cancelling_at says a cancel was asked, the counts say what it stopped.
MESSAGE_BATCH_STATUSES: Mapping[str, BatchStatus] = MappingProxyType({
    "in_progress": BatchStatus.IN_PROGRESS,
    "canceling": BatchStatus.CANCELLING,
    "ended": BatchStatus.COMPLETED,
})


def parse_message(response: httpx.Response) -> Chat:
    return parse_answer(response, _chat, what="no Message content list")


def message_result_from_body(body: Any, *, latency_s: float = 0.0, attempts: int = 1) -> ChatResult:
    """A ``ChatResult`` from a Message read elsewhere (a batch result line), parsed as ``chat`` does."""
    return result_from_body(body, _chat, problem="is not a Message with content", latency_s=latency_s,
                            attempts=attempts)


def _chat(body: Any) -> Chat | None:
    content = body.get("content") if isinstance(body, dict) else None
    if not isinstance(content, list):
        return None
    assert isinstance(body, dict)
    reported = body.get("usage")
    usage = reported if isinstance(reported, dict) else {}
    cache_read = _count(usage.get("cache_read_input_tokens"))
    cache_write = _count(usage.get("cache_creation_input_tokens"))
    # 5-minute writes cost 1.25x input, 1-hour writes 2x: the breakdown says how many were which.
    durations = usage.get("cache_creation")
    hour = _count(durations.get("ephemeral_1h_input_tokens")) if isinstance(durations, dict) else 0
    thinking = usage.get("output_tokens_details")
    tier = "fast" if usage.get("speed") == "fast" else usage.get("service_tier")
    prompt_tokens = _count(usage.get("input_tokens")) + cache_read + cache_write
    completion_tokens = _count(usage.get("output_tokens"))
    texts = [block.get("text") for block in content if isinstance(block, dict) and block.get("type") == "text"]
    stop_reason = body.get("stop_reason")
    result = ChatResult(
        text="".join(text for text in texts if isinstance(text, str)) if texts else None,
        finish_reason=stop_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cache_read,
        model=body.get("model"),
        response_id=body.get("id"),
        latency_s=0.0,
        cache_creation_tokens=cache_write,
        cache_creation_extended_tokens=min(hour, cache_write),
        reasoning_tokens=_count(thinking.get("thinking_tokens")) if isinstance(thinking, dict) else 0,
        service_tier=tier if isinstance(tier, str) else None,
        tool_calls=_tool_calls(content),
        refusal=_refusal(body.get("stop_details")) if stop_reason == "refusal" else None,
        # "For requests refused before any output is generated, you are not billed" (Anthropic, Fable 5's page).
        maybe_billed=0 if stop_reason == "refusal" and completion_tokens == 0 else 1,
    )
    return Chat(result, prompt_tokens + completion_tokens)


def _tool_calls(content: list[Any]) -> list[dict[str, Any]] | None:
    """The answer's tool_use blocks in OpenAI's tool-call shape, their input as the JSON text of ``arguments``
    (what the request side turns back into a tool_use block); None when it has none."""
    calls = [
        {"id": block.get("id"), "type": "function",
         "function": {"name": block.get("name"), "arguments": compact_json(block.get("input", {}))}}
        for block in content if isinstance(block, dict) and block.get("type") == "tool_use"
    ]
    return calls or None


def _refusal(details: Any) -> str:
    """What a refusal stop says: its explanation and category (``stop_details``), or that it gave none."""
    if not isinstance(details, dict):
        return "refused (stop_reason refusal, no stop_details)"
    explanation = details.get("explanation")
    category = details.get("category")
    text = str(explanation) if explanation else "refused (stop_reason refusal)"
    return f"{text} (category: {category})" if category else text


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def message_batch_info(body: Any) -> BatchInfo:
    """The neutral ``BatchInfo`` for a MessageBatch object; raises ``APIResponseValidationError`` for another body."""
    if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not body["id"]:
        raise APIResponseValidationError(f"expected a message batch object, got {str(body)[:200]!r}")
    counts = body.get("request_counts") or {}
    if not isinstance(counts, dict):
        raise APIResponseValidationError(f"the batch's request_counts is not an object: {counts!r}")
    succeeded = int_field(counts, "succeeded", "request_counts")
    failed = sum(int_field(counts, key, "request_counts") for key in ("errored", "canceled", "expired"))
    results_url = body.get("results_url")
    return BatchInfo(
        id=body["id"],
        status=batch_status_from_api(body.get("processing_status"), statuses=MESSAGE_BATCH_STATUSES),
        endpoint="/v1/messages",
        completion_window="24h",
        input_file_id=None,
        output_file_id=results_url if isinstance(results_url, str) else None,
        error_file_id=None,
        created_at=rfc3339_field(body, "created_at", "message batch"),
        in_progress_at=None,
        expires_at=rfc3339_field(body, "expires_at", "message batch"),
        finalizing_at=None,
        completed_at=rfc3339_field(body, "ended_at", "message batch"),
        failed_at=None,
        expired_at=None,
        cancelling_at=rfc3339_field(body, "cancel_initiated_at", "message batch"),
        cancelled_at=None,
        request_counts=RequestCounts(
            total=int_field(counts, "processing", "request_counts") + succeeded + failed,
            completed=succeeded,
            failed=failed,
        ),
        metadata={},
    )


def parse_message_batch(response: httpx.Response) -> BatchInfo:
    return message_batch_info(parse_json(response))


def parse_message_batch_page(response: httpx.Response) -> BatchPage:
    body = parse_json(response)
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise APIResponseValidationError(f"the body is not a list of message batches: {response.text[:300]!r}")
    return BatchPage([message_batch_info(item) for item in data], bool(body.get("has_more")))
