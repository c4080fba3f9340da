"""Plain values going into and coming out of storage, so callers never hold ORM objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from llm_dispatch.core import JobStatus, Route

__all__ = ["BatchRecord", "JobInfo", "NewPrompt", "UnfinishedPrompt", "ResultStats", "WorkRow"]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Request:
    """A prompt's request: its id in the input, what is sent, the key identical requests share, and by
    when it must be answered."""

    custom_id: str
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    dedupe_key: str
    deadline: datetime | None = None
    # The provider endpoint (core.ENDPOINTS).
    endpoint: str = "chat"
    # The lane the router sent it by (core.ROUTES; None, from before there were lanes, is real-time).
    planned_route: Route | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NewPrompt(_Request):
    """One prompt of a job as read from the input, before it is stored."""

    position: int
    metadata: dict[str, Any] | None = None
    # Why the router sent it by its ``planned_route``.
    route_reason: str | None = None
    # The provider that serves it (core.ProviderTable's name); None leaves it to the built-in rule.
    provider: str | None = None


class UnfinishedPrompt(NamedTuple):
    """A prompt still to send: enough to plan with, without loading its messages."""

    id: int
    position: int
    dedupe_key: str


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkRow(_Request):
    """What a sender needs to make one request for a stored prompt."""

    id: int
    # A background response already created for it: polled, not created again.
    background_id: str | None = None
    # Background creates sent for it (each counted before it was sent), the one of ``background_id`` included.
    background_creates: int = 0


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: str
    name: str
    created_at: datetime
    updated_at: datetime
    status: JobStatus
    model: str
    input_path: str | None
    fingerprint: str
    settings: dict[str, Any]
    counts: dict[str, int]  # prompts by status; statuses no prompt has are left out


@dataclass(frozen=True, slots=True)
class ResultStats:
    """A job's outcome for the summary.

    ``succeeded``/``refused``/``failed`` count prompts as they stand now: a prompt that failed once and
    succeeded on a later run is only a success. ``failed_by_class`` groups the failed ones by
    their last error. ``truncated`` and ``tool_calls`` count the answers stored (a row each, reused ones
    included) that were cut short (``core.TRUNCATED_FINISH_REASONS``) or call tools. Latency percentiles are over real-time successes. Token
    sums cover the calls paid for (refusals included), so results with route ``reused`` are left out of them.
    """

    succeeded: int = 0
    failed: int = 0
    reused: int = 0
    failed_by_class: dict[str, int] = field(default_factory=dict)
    p50_latency_ms: float | None = None
    p95_latency_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    refused: int = 0
    truncated: int = 0
    tool_calls: int = 0
    reasoning_tokens: int = 0
    # Per class of ``failed_by_class``: its newest stored error message, which says what to do.
    failure_messages: dict[str, str] = field(default_factory=dict)
    # Attempts the provider may have billed with no answer kept for them (lost generations, 2xx non-answers).
    billed_unanswered: int = 0


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """One stored batch, column for column; its lifecycle is the core's ``BatchStatus``."""

    id: int
    job_id: str
    model: str
    status: str
    provider_batch_id: str | None
    input_file_id: str | None
    output_file_id: str | None
    error_file_id: str | None
    file_path: str | None
    request_total: int
    request_completed: int
    request_failed: int
    submitted_at: datetime | None
    expires_at: datetime | None
    finished_at: datetime | None
    last_polled_at: datetime | None
    errors: list[dict[str, Any]] | None
    resubmission_of: int | None
    created_at: datetime
    updated_at: datetime
    cancel_requested: bool = False
    provider: str = "openai"
    # The endpoint of all its lines (core.ENDPOINTS): how its output is read.
    endpoint: str = "chat"
    # The batch's own trouble (see ``storage.record_batch_error``): last error, when, how many in a row, and
    # the time before which a sweep leaves it alone.
    last_error: str | None = None
    last_error_at: datetime | None = None
    error_count: int = 0
    retry_after: datetime | None = None
