"""Plain values going into and coming out of storage, so callers never hold ORM objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["JobInfo", "NewPrompt", "ResultStats", "WorkRow"]


@dataclass(frozen=True, slots=True)
class NewPrompt:
    """One prompt of a job as read from the input, before it is stored."""

    custom_id: str
    position: int
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    dedupe_key: str
    metadata: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class WorkRow:
    """What a sender needs to make one request for a stored prompt."""

    id: int
    custom_id: str
    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any]
    dedupe_key: str


@dataclass(frozen=True, slots=True)
class JobInfo:
    id: str
    name: str
    created_at: datetime
    updated_at: datetime
    status: str
    model: str
    input_path: str | None
    fingerprint: str
    settings: dict[str, Any]
    counts: dict[str, int]  # prompts by status, every status present


@dataclass(frozen=True, slots=True)
class ResultStats:
    """A job's outcome for the summary.

    ``succeeded``/``failed`` count prompts as they stand now: a prompt that failed once and
    succeeded on a later run is only a success. Token sums cover the calls paid for, so
    results with route ``reused`` are left out of them.
    """

    succeeded: int
    failed: int
    reused: int
    failed_by_error_class: dict[str, int] = field(default_factory=dict)
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
