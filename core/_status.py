"""Every status and route word of llm-dispatch, named once: routing decides a ``Route``, storage keeps each in its
rows, the steps and reports test for them. Nothing else defines one.

No CHECK constraints enforce these in the database: the Batch API will add states, and on SQLite changing a
CHECK means copying the whole prompts table in a migration.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from collections.abc import Mapping
from typing import Final, Literal, get_args

__all__ = [
    "ACTIVE_BATCH_STATUSES",
    "BACKGROUND_WINDOWS",
    "BATCH_STATUSES",
    "CLOSED_BATCH_STATUSES",
    "HALF_SUBMITTED_BATCH_STATUSES",
    "JOB_STATUSES",
    "PAID_RESULT_STATUSES",
    "PROMPT_STATUSES",
    "PROVIDER_BATCH_STATUSES",
    "REQUEST_ROUTES",
    "RESULT_ROUTES",
    "RESULT_STATUSES",
    "RETRY_FAILED",
    "ROUTES",
    "SENDABLE_PROMPT_STATUSES",
    "TERMINAL_BATCH_STATUSES",
    "UNFINISHED_PROMPT_STATUSES",
    "BatchStatus",
    "JobStatus",
    "PromptStatus",
    "ResultRoute",
    "ResultStatus",
    "RetryFailed",
    "RoutePolicy",
    "Route",
    "unfinished",
]

# How a prompt is sent, each call paid for: its lane, decided once when it is recorded (``decide_route``), changed
# only by a re-route (a deadline, or a batch that answered too often without an answer). ``realtime`` is a plain
# request; ``flex`` one at OpenAI's flex service tier; ``background-2h``/``-8h`` a background Responses request
# with that completion window; ``batch`` a line of a Batch API file. Each lane's discount and window: the catalog.
Route = Literal["realtime", "flex", "background-2h", "background-8h", "batch"]
ROUTES: Final[tuple[Route, ...]] = get_args(Route)
# The lanes the real-time half sends, one request a prompt (every one but the Batch API's).
REQUEST_ROUTES: Final[tuple[Route, ...]] = ("realtime", "flex", "background-2h", "background-8h")
# The background lanes and the ``background_options.completion_window`` each sends.
BACKGROUND_WINDOWS: Final[Mapping[str, str]] = MappingProxyType({"background-2h": "2h", "background-8h": "8h"})
# How a stored result was got: sent on a ``Route``, or ``reused``: the outcome of one call (or of an earlier
# stored success) shared by an identical request, whose tokens were not paid for again.
ResultRoute = Literal["realtime", "flex", "background-2h", "background-8h", "batch", "reused"]
RESULT_ROUTES: Final[tuple[ResultRoute, ...]] = get_args(ResultRoute)

# How the prompts with neither urgency nor deadline are routed: by their length, or all one way.
RoutePolicy = Literal["length", "all-realtime", "all-batch"]

# "recording": the job exists and its prompts are being stored, a slice at a time while the first ones
# are already sent. A run cut off then leaves some out: the same input again stores the rest.
JobStatus = Literal["recording", "created", "running", "finished", "failed"]
JOB_STATUSES: Final[tuple[JobStatus, ...]] = get_args(JobStatus)
# "batched": a member of an open batch; the real-time path leaves it alone.
# "refused": the model declined (OpenAI's message.refusal, Anthropic's stop_reason "refusal"): an answer, final,
# sent again only on request (``--retry-refused``), and never reused for an identical prompt.
# "invalid": answered, but not as its schema asks (not JSON, a violation, a refusal or a cut-off answer, with a
# schema): asked again up to --max-reasks times; final once those are spent, never reused.
PromptStatus = Literal["pending", "in_flight", "batched", "succeeded", "refused", "invalid", "failed"]
PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = get_args(PromptStatus)
# Prompts a sender may take: pending, or in flight when the process sending them died.
SENDABLE_PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = ("pending", "in_flight")
# Prompts without a final outcome yet: a job with any of these is not finished.
UNFINISHED_PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = (*SENDABLE_PROMPT_STATUSES, "batched")
ResultStatus = Literal["succeeded", "refused", "invalid", "failed"]
RESULT_STATUSES: Final[tuple[ResultStatus, ...]] = get_args(ResultStatus)
# Results that carry an answer the provider billed (a refusal, or an answer that broke its schema, as any answer).
PAID_RESULT_STATUSES: Final[tuple[ResultStatus, ...]] = ("succeeded", "refused", "invalid")
# Which failed prompts a new run sends again: those that failed with a retryable error, all, or none.
RetryFailed = Literal["retryable", "all", "none"]
RETRY_FAILED: Final[tuple[RetryFailed, ...]] = get_args(RetryFailed)


class BatchStatus(enum.StrEnum):
    """Where one of our batches is in its life. ``PREPARING`` (row made, file being written or uploaded) ->
    ``UPLOADED`` (input file id known, batch maybe not yet created) -> the provider's states, mapped from each
    provider's own words -> ``INGESTED`` (its output is in results). ``LOST``: the provider no longer knows it (or
    it was given up by hand, ``llm-dispatch abandon``); its unanswered members went back to pending. Those two
    are closed; every other state is open."""

    PREPARING = "preparing"
    UPLOADED = "uploaded"
    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    INGESTED = "ingested"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        """True once the provider will change nothing more: stop polling and read the files."""
        return self in TERMINAL_BATCH_STATUSES


BATCH_STATUSES: Final[tuple[BatchStatus, ...]] = tuple(BatchStatus)
# Made, not yet created at the provider: a run (or a sweep, once it is stale) finishes the submission.
HALF_SUBMITTED_BATCH_STATUSES: Final[frozenset[BatchStatus]] = frozenset({BatchStatus.PREPARING, BatchStatus.UPLOADED})
# The provider may still change these; poll them.
ACTIVE_BATCH_STATUSES: Final[frozenset[BatchStatus]] = frozenset(
    {BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, BatchStatus.CANCELLING})
# The provider is done with these: fetch whatever output and error files there are, then ingest.
TERMINAL_BATCH_STATUSES: Final[frozenset[BatchStatus]] = frozenset(
    {BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED})
# Nothing more happens to these: a batch's life ends in one of them.
CLOSED_BATCH_STATUSES: Final[frozenset[BatchStatus]] = frozenset({BatchStatus.INGESTED, BatchStatus.LOST})
# What a provider may report (each provider's own words map onto these); the others are our own.
PROVIDER_BATCH_STATUSES: Final[frozenset[BatchStatus]] = ACTIVE_BATCH_STATUSES | TERMINAL_BATCH_STATUSES


def unfinished(counts: Mapping[str, int]) -> int:
    """How many prompts of ``counts`` (prompts per status) have no final outcome yet."""
    return sum(counts.get(status, 0) for status in UNFINISHED_PROMPT_STATUSES)
