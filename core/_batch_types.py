"""Provider-neutral values of the Batch API: its file and batch objects, and the limits of one batch.

Each provider's own status words map onto ``BatchStatus`` (``_status``); ``FileInfo`` and ``BatchInfo`` are built
from the provider's JSON by ``from_api``, which raises ``APIResponseValidationError`` for a body it
cannot use (so the client retries it like any garbled answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from ._exceptions import APIResponseValidationError
from ._status import PROVIDER_BATCH_STATUSES, BatchStatus

__all__ = [
    "BATCH_CHAT_ENDPOINT",
    "DEFAULT_BATCH_LIMITS",
    "DEFAULT_COMPLETION_WINDOW",
    "GEMINI_BATCH_LIMITS",
    "MESSAGE_BATCH_LIMITS",
    "OPENAI_BATCH_LIMITS",
    "OPENAI_BATCH_STATUSES",
    "BatchError",
    "BatchInfo",
    "BatchLimits",
    "FileInfo",
    "RequestCounts",
    "batch_status_from_api",
    "int_field",
    "rfc3339_field",
]

BATCH_CHAT_ENDPOINT = "/v1/chat/completions"
DEFAULT_COMPLETION_WINDOW = "24h"


# OpenAI's words (Azure OpenAI uses the same ones); another provider passes its own table.
OPENAI_BATCH_STATUSES: Mapping[str, BatchStatus] = MappingProxyType(
    {status.value: status for status in BatchStatus if status in PROVIDER_BATCH_STATUSES})


def batch_status_from_api(value: Any, *, statuses: Mapping[str, BatchStatus] = OPENAI_BATCH_STATUSES) -> BatchStatus:
    """The neutral status for a provider's status string; an unknown one raises ``APIResponseValidationError``."""
    status = statuses.get(value) if isinstance(value, str) else None
    if status is None:
        raise APIResponseValidationError(
            f"the batch status {value!r} is not one this client knows ({', '.join(sorted(statuses))}); "
            "the provider may have added one: upgrade llm-dispatch or map it in the provider's status table"
        )
    return status


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchLimits:
    """A provider's hard limits on one batch input file (OpenAI's by default)."""

    max_requests: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    # Texts summed over an embeddings batch's lines (each line may hold many). OpenAI's batch create reference:
    # "/v1/embeddings batches are also restricted to a maximum of 50,000 embedding inputs across all requests in the
    # batch" (read in OpenAI's SDK generated from its API spec, openai-python types/batch_create_params.py at e43b422;
    # OpenAI's own pages were not in our search index; community.openai.com/t/882493 quotes the Batch guide alike).
    max_embedding_inputs: int = 50_000
    # Texts one embeddings line may hold (None: as many as the packer puts in a request). Gemini's Batch Mode takes
    # EmbedContentRequests, one text each: 1.
    max_line_inputs: int | None = None

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_bytes < 1 or self.max_embedding_inputs < 1:
            raise ValueError(
                f"batch limits must be positive, got max_requests={self.max_requests}, max_bytes={self.max_bytes}, "
                f"max_embedding_inputs={self.max_embedding_inputs}"
            )


OPENAI_BATCH_LIMITS = BatchLimits()
# Anthropic's Message Batches: 100,000 requests or 256 MB per batch, whichever comes first.
MESSAGE_BATCH_LIMITS = BatchLimits(max_requests=100_000, max_bytes=256 * 1024 * 1024)
# Gemini's Batch Mode: an input file of up to 2 GB (the figure issue 37 gives from Google's Batch Mode guide; the
# guide's section that states it was not in the index this was written from) and no documented count of requests.
# Lines are measured as written on disk (OpenAI's line format), and a Gemini line may be larger than its OpenAI one
# (a part object per message): a 10% margin.
GEMINI_BATCH_LIMITS = BatchLimits(max_requests=10_000_000, max_bytes=1_800_000_000, max_line_inputs=1)
DEFAULT_BATCH_LIMITS = OPENAI_BATCH_LIMITS


@dataclass(frozen=True, slots=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchError:
    """Why a batch failed validation: one entry of the batch's ``errors.data``."""

    code: str | None
    message: str
    line: int | None = None  # 1-based line of the input file, when the error is about one line
    param: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FileInfo:
    """An uploaded (or provider-written) file."""

    id: str
    bytes: int
    filename: str
    purpose: str
    created_at: datetime | None

    @classmethod
    def from_api(cls, body: Any) -> FileInfo:
        data = _object(body, "file")
        return cls(
            id=_required_str(data, "id", "file"),
            bytes=int_field(data, "bytes", "file"),
            filename=_optional_str(data, "filename", "file") or "",
            purpose=_optional_str(data, "purpose", "file") or "",
            created_at=_timestamp(data, "created_at", "file"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchInfo:
    """A batch as the provider last reported it. Timestamps are aware UTC datetimes, or None when not reached."""

    id: str
    status: BatchStatus
    endpoint: str | None
    completion_window: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    created_at: datetime | None
    in_progress_at: datetime | None
    expires_at: datetime | None
    finalizing_at: datetime | None
    completed_at: datetime | None
    failed_at: datetime | None
    expired_at: datetime | None
    cancelling_at: datetime | None
    cancelled_at: datetime | None
    request_counts: RequestCounts
    errors: tuple[BatchError, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_api(cls, body: Any, *, statuses: Mapping[str, BatchStatus] = OPENAI_BATCH_STATUSES) -> BatchInfo:
        data = _object(body, "batch")
        counts = data.get("request_counts")
        if counts is not None and not isinstance(counts, dict):
            raise APIResponseValidationError(f"the batch's request_counts is not an object: {counts!r}")
        counts = counts or {}
        metadata = data.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise APIResponseValidationError(f"the batch's metadata is not an object: {metadata!r}")
        return cls(
            id=_required_str(data, "id", "batch"),
            status=batch_status_from_api(data.get("status"), statuses=statuses),
            endpoint=_optional_str(data, "endpoint", "batch"),
            completion_window=_optional_str(data, "completion_window", "batch"),
            input_file_id=_optional_str(data, "input_file_id", "batch"),
            output_file_id=_optional_str(data, "output_file_id", "batch"),
            error_file_id=_optional_str(data, "error_file_id", "batch"),
            created_at=_timestamp(data, "created_at", "batch"),
            in_progress_at=_timestamp(data, "in_progress_at", "batch"),
            expires_at=_timestamp(data, "expires_at", "batch"),
            finalizing_at=_timestamp(data, "finalizing_at", "batch"),
            completed_at=_timestamp(data, "completed_at", "batch"),
            failed_at=_timestamp(data, "failed_at", "batch"),
            expired_at=_timestamp(data, "expired_at", "batch"),
            cancelling_at=_timestamp(data, "cancelling_at", "batch"),
            cancelled_at=_timestamp(data, "cancelled_at", "batch"),
            request_counts=RequestCounts(
                total=int_field(counts, "total", "request_counts"),
                completed=int_field(counts, "completed", "request_counts"),
                failed=int_field(counts, "failed", "request_counts"),
            ),
            errors=_errors(data.get("errors")),
            metadata={str(k): str(v) for k, v in (metadata or {}).items()},
        )


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise APIResponseValidationError(f"expected a {what} object, got {str(body)[:200]!r}")
    return body


def _required_str(data: Mapping[str, Any], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise APIResponseValidationError(f"the {what} object has no string {key!r}: {value!r}")
    return value


def _optional_str(data: Mapping[str, Any], key: str, what: str) -> str | None:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise APIResponseValidationError(f"the {what} object's {key!r} is not a string: {value!r}")


def int_field(data: Mapping[str, Any], key: str, what: str) -> int:
    value = data.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise APIResponseValidationError(f"the {what} object's {key!r} is not a number: {value!r}")
    return int(value)


def rfc3339_field(data: Mapping[str, Any], key: str, what: str) -> datetime | None:
    """``data[key]`` as an aware time from its RFC 3339 text (None when absent); ``what`` names the object in the
    error a malformed time raises."""
    value = data.get(key)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise APIResponseValidationError(f"the {what}'s {key!r} is not an RFC 3339 time: {value!r}")
    return moment


def _timestamp(data: Mapping[str, Any], key: str, what: str) -> datetime | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise APIResponseValidationError(f"the {what} object's {key!r} is not a Unix timestamp: {value!r}")
    return datetime.fromtimestamp(value, tz=UTC)


def _errors(value: Any) -> tuple[BatchError, ...]:
    # OpenAI sends {"object": "list", "data": [...]} or null; tolerate a bare list too.
    if value is None:
        return ()
    items = value.get("data") if isinstance(value, dict) else value
    if items is None:
        return ()
    if not isinstance(items, list):
        raise APIResponseValidationError(f"the batch's errors are not a list: {str(value)[:200]!r}")
    errors = []
    for item in items:
        if not isinstance(item, dict):
            raise APIResponseValidationError(f"a batch error is not an object: {item!r}")
        line = item.get("line")
        errors.append(
            BatchError(
                code=str(item["code"]) if item.get("code") is not None else None,
                message=str(item.get("message") or ""),
                line=int(line) if isinstance(line, int) and not isinstance(line, bool) else None,
                param=str(item["param"]) if item.get("param") is not None else None,
            )
        )
    return tuple(errors)
