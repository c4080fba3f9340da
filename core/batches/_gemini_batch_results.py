"""Gemini Batch Mode's objects read into the neutral ones: a batch (a long-running operation whose ``metadata`` is the
``GenerateContentBatch``) as ``BatchInfo``, and each response of a finished batch (a line of its responses file, or
one of its inlined responses) as a ``BatchLine``.

The shapes are the REST reference's (ai.google.dev/api/batch-mode) as google-genai reads them (``batches.py``:
``_BatchJob_from_mldev``, ``_BatchJobDestination_from_mldev``, ``_InlinedResponse_from_mldev``): the batch's fields
under the operation's ``metadata`` (``displayName``, ``state``, ``createTime``, ``batchStats``, ``output``), its
results in ``output.responsesFile`` (a file's name) or ``output.inlinedResponses.inlinedResponses``. A responses
file's line is ``{"key", "response"}`` or ``{"key", "error"}``; an inlined response carries our key in its
``metadata`` (the create sends each request's), written here as a line of the same shape.

An embeddings batch (``asyncBatchEmbedContent``) is an EmbedContentBatch: its inlined results are in
``output.inlinedEmbedContentResponses.inlinedResponses`` (google-genai's ``_BatchJobDestination_from_mldev``), each
response a SingleEmbedContentResponse (``{"embedding": {"values"}, "tokenCount"}``, google-genai ``types.py``), read
into a float32 vector as the real-time answers are; a response without ``tokenCount`` is counted as 0 tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

from .._batch_types import BatchInfo, RequestCounts, batch_status_from_api, int_field, rfc3339_field
from .._exceptions import APIResponseValidationError
from .._json import compact_json
from .._status import BatchStatus
from .._types import ChatResult
from ..wire._vectors import vector_bytes
from ..wire._gemini_answers import gemini_result_from_body
from ..wire._line_errors import gemini_line_error
from ._batch_files import BatchLine, garbled_line, read_result_lines, unusable_line

__all__ = ["GEMINI_BATCH_STATES", "GEMINI_BATCH_WINDOW", "INLINED_RESPONSES", "gemini_batch_info",
           "inlined_lines", "read_gemini_batch_results"]

# BatchState as the REST API writes it (BATCH_STATE_*), and the JobState words google-genai turns them into
# (``_transformers.t_job_state``): a server may answer either. Pending is queued, not yet run: ``validating``.
GEMINI_BATCH_STATES: Mapping[str, BatchStatus] = MappingProxyType({
    **{f"{prefix}_PENDING": BatchStatus.VALIDATING for prefix in ("BATCH_STATE", "JOB_STATE")},
    **{f"{prefix}_RUNNING": BatchStatus.IN_PROGRESS for prefix in ("BATCH_STATE", "JOB_STATE")},
    **{f"{prefix}_SUCCEEDED": BatchStatus.COMPLETED for prefix in ("BATCH_STATE", "JOB_STATE")},
    **{f"{prefix}_FAILED": BatchStatus.FAILED for prefix in ("BATCH_STATE", "JOB_STATE")},
    **{f"{prefix}_CANCELLED": BatchStatus.CANCELLED for prefix in ("BATCH_STATE", "JOB_STATE")},
    **{f"{prefix}_EXPIRED": BatchStatus.EXPIRED for prefix in ("BATCH_STATE", "JOB_STATE")},
})
# A batch still pending or running 48 hours after its creation expires (the figure issue 37 gives from Google's Batch
# Mode guide; the guide's section that states it was not in the index this was written from).
GEMINI_BATCH_WINDOW: Final = timedelta(hours=48)
# The output_file_id of a batch whose responses are inlined in the batch itself (no file to download).
INLINED_RESPONSES: Final = "inlinedResponses"
# Where each kind of batch inlines its results: a GenerateContentBatch's, then an EmbedContentBatch's.
_INLINED_FIELDS: Final = ("inlinedResponses", "inlinedEmbedContentResponses")


def gemini_batch_info(body: Any) -> BatchInfo:
    """The ``BatchInfo`` of an operation whose metadata is a GenerateContentBatch (or of the batch itself);
    ``APIResponseValidationError`` for another body."""
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not body["name"]:
        raise APIResponseValidationError(f"expected a batch operation, got {str(body)[:200]!r}")
    batch = body.get("metadata") if isinstance(body.get("metadata"), dict) else body
    assert isinstance(batch, dict)
    stats = batch.get("batchStats") or {}
    if not isinstance(stats, dict):
        raise APIResponseValidationError(f"the batch's batchStats is not an object: {stats!r}")
    created = rfc3339_field(batch, "createTime", "batch")
    ended = rfc3339_field(batch, "endTime", "batch")
    status = batch_status_from_api(batch.get("state"), statuses=GEMINI_BATCH_STATES)
    output = batch.get("output")
    if not isinstance(output, dict):
        response = body.get("response")
        output = response if isinstance(response, dict) else {}
    output_file = output.get("responsesFile")
    if not isinstance(output_file, str) or not output_file:
        output_file = INLINED_RESPONSES if any(isinstance(output.get(field), dict) for field in _INLINED_FIELDS) \
            else None
    display = batch.get("displayName")
    return BatchInfo(
        id=body["name"],
        status=status,
        endpoint="chat",
        completion_window="48h",
        input_file_id=_input_file(batch.get("inputConfig")),
        output_file_id=output_file,
        error_file_id=None,
        created_at=created,
        in_progress_at=None,
        expires_at=created + GEMINI_BATCH_WINDOW if created is not None else None,
        finalizing_at=None,
        completed_at=ended if status is BatchStatus.COMPLETED else None,
        failed_at=ended if status is BatchStatus.FAILED else None,
        expired_at=ended if status is BatchStatus.EXPIRED else None,
        cancelling_at=None,
        cancelled_at=ended if status is BatchStatus.CANCELLED else None,
        request_counts=RequestCounts(
            # int64 fields: JSON strings on the wire.
            total=_count(stats, "requestCount"),
            completed=_count(stats, "successfulRequestCount"),
            failed=_count(stats, "failedRequestCount"),
        ),
        metadata={"displayName": display} if isinstance(display, str) else {},
    )


def _input_file(config: Any) -> str | None:
    name = config.get("fileName") if isinstance(config, dict) else None
    return name if isinstance(name, str) and name else None


def _count(stats: Mapping[str, Any], key: str) -> int:
    value = stats.get(key)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            raise APIResponseValidationError(f"the batch's batchStats.{key} is not a count: {value!r}") from None
    return int_field(stats, key, "batchStats")


def inlined_lines(body: Any) -> Iterator[bytes]:
    """A finished batch's inlined responses as responses-file lines (``{"key", "response" | "error"}``), the key
    from each one's ``metadata``; one without a key is written without it (read as a garbled line)."""
    info = gemini_batch_info(body)  # a body that is no batch is refused here
    batch = body.get("metadata") if isinstance(body.get("metadata"), dict) else body
    output = batch.get("output") if isinstance(batch.get("output"), dict) else body.get("response") or {}
    inlined = next((output[field].get("inlinedResponses") for field in _INLINED_FIELDS
                    if isinstance(output, dict) and isinstance(output.get(field), dict)), None)
    if not isinstance(inlined, list):
        raise APIResponseValidationError(f"batch {info.id} has no inlined responses to read")
    for item in inlined:
        item = item if isinstance(item, dict) else {}
        metadata = item.get("metadata")
        line: dict[str, Any] = {}
        if isinstance(metadata, dict) and isinstance(metadata.get("key"), str):
            line["key"] = metadata["key"]
        for field in ("response", "error"):
            if field in item:
                line[field] = item[field]
        yield compact_json(line).encode() + b"\n"


def read_gemini_batch_results(path: Path, *, endpoint: str = "chat") -> Iterator[BatchLine]:
    """Every line of a Gemini batch's responses (a downloaded responses file, or the inlined ones written out), in
    order: a ``response`` read as ``generateContent`` answers are (an embeddings batch's as EmbedContentResponses),
    an ``error`` settled by its code (``gemini_line_error``). A line that cannot be read is garbled: one bad line
    never costs the others."""
    read = _embedding_line if endpoint == "embeddings" else _result_line
    return read_result_lines(path, read, key="key")


def _embedding_line(record: dict[str, Any], key: str, number: int) -> BatchLine:
    response = record.get("response")
    if isinstance(record.get("error"), dict) or not isinstance(response, dict):
        return _result_line(record, key, number)
    embedding = response.get("embedding")
    vector = vector_bytes(embedding.get("values")) if isinstance(embedding, dict) else None
    if vector is None:
        return unusable_line(key, number, 200, "no readable embedding.values", body=response)
    tokens = response.get("tokenCount")
    try:
        prompt_tokens = max(0, int(tokens)) if tokens is not None and not isinstance(tokens, bool) else 0
    except (TypeError, ValueError):  # int64: a JSON string on the wire
        prompt_tokens = 0
    result = ChatResult(text=None, finish_reason=None, prompt_tokens=prompt_tokens, completion_tokens=0,
                        cached_tokens=0, model=None, response_id=None, latency_s=0.0, embedding=vector)
    return BatchLine(custom_id=key, result=result, error_code=None, error_message=None, status_code=200,
                     retryable=False, line=number)


def _result_line(record: dict[str, Any], key: str, number: int) -> BatchLine:
    error = record.get("error")
    if isinstance(error, dict):
        code, status = error.get("code"), error.get("status")
        name, rule = gemini_line_error(code if isinstance(code, int) and not isinstance(code, bool) else None,
                                       status=status if isinstance(status, str) and status else None)
        message = error.get("message")
        return BatchLine(custom_id=key, result=None, error_code=name,
                         error_message=message if isinstance(message, str) else "", status_code=None,
                         retryable=rule.retry, line=number, billed=rule.billed)
    response = record.get("response")
    if not isinstance(response, dict):
        return garbled_line(key, number, "neither a response nor an error")
    try:
        result = gemini_result_from_body(response)
    except APIResponseValidationError as exc:
        return unusable_line(key, number, 200, exc.message, usage=exc.usage, body=response)
    return BatchLine(custom_id=key, result=result, error_code=None, error_message=None, status_code=200,
                     retryable=False, line=number)
