"""Every status and route value stored in the database, in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, get_args

__all__ = [
    "BATCH_STATUSES",
    "COST_BASES",
    "JOB_STATUSES",
    "OPEN_PROVIDER_BATCH_STATUSES",
    "PROMPT_STATUSES",
    "RESULT_STATUSES",
    "ROUTES",
    "SENDABLE_PROMPT_STATUSES",
    "SEND_ROUTES",
    "TERMINAL_PROVIDER_BATCH_STATUSES",
    "UNFINISHED_PROMPT_STATUSES",
    "BatchStatus",
    "CostBasis",
    "JobStatus",
    "PromptStatus",
    "ResultStatus",
    "RetryFailed",
    "Route",
    "unfinished",
]

# "recording": the job exists and its prompts are being stored, a slice at a time while the first ones
# are already sent. A run cut off then leaves some out: the same input again stores the rest.
JobStatus = Literal["recording", "created", "running", "finished", "failed"]
# "batched": a member of an open batch (see storage._batches); the real-time path leaves it alone.
PromptStatus = Literal["pending", "in_flight", "batched", "succeeded", "failed"]
ResultStatus = Literal["succeeded", "failed"]
# "reused": the row shares the outcome of one HTTP call (or an earlier stored success)
# recorded elsewhere, so its tokens were not paid for again.
Route = Literal["realtime", "batch", "reused"]
# When a result's stored cost was worked out: as the answer was stored, or back-filled from its tokens
# by migration 0004 (with the bundled prices of its ``prices_as_of``, not those it was paid at).
CostBasis = Literal["answer", "backfill"]
# Which failed prompts a new run sends again.
RetryFailed = Literal["retryable", "all", "none"]

# A batch's life: ``preparing`` (row made, file being written or uploaded) -> ``uploaded``
# (input file id known, batch not yet created) -> the provider-neutral states, mapped from
# each provider's own -> ``ingested`` (its output is in results; the only state that is not open).
BatchStatus = Literal[
    "preparing",
    "uploaded",
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "expired",
    "cancelling",
    "cancelled",
    "ingested",
]

# No CHECK constraints enforce these in the database: the Batch API will add states, and
# on SQLite changing a CHECK means copying the whole prompts table in a migration.
JOB_STATUSES: Final[tuple[JobStatus, ...]] = get_args(JobStatus)
PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = get_args(PromptStatus)
RESULT_STATUSES: Final[tuple[ResultStatus, ...]] = get_args(ResultStatus)
ROUTES: Final[tuple[Route, ...]] = get_args(Route)
# The routes a prompt is planned for and sent on, each call paid for; a ``reused`` row copies an answer
# got on one of them.
SEND_ROUTES: Final[tuple[Route, ...]] = ("realtime", "batch")
BATCH_STATUSES: Final[tuple[BatchStatus, ...]] = get_args(BatchStatus)
COST_BASES: Final[tuple[CostBasis, ...]] = get_args(CostBasis)
# The provider may still change these; poll them.
OPEN_PROVIDER_BATCH_STATUSES: Final[tuple[BatchStatus, ...]] = ("validating", "in_progress", "finalizing", "cancelling")
# The provider is done with these: fetch whatever output and error files there are, then ingest.
TERMINAL_PROVIDER_BATCH_STATUSES: Final[tuple[BatchStatus, ...]] = ("completed", "failed", "expired", "cancelled")
# Prompts a sender may take: pending, or in flight when the process sending them died.
SENDABLE_PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = ("pending", "in_flight")
# Prompts without a final outcome yet: a job with any of these is not finished.
UNFINISHED_PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = (*SENDABLE_PROMPT_STATUSES, "batched")


def unfinished(counts: Mapping[str, int]) -> int:
    """How many prompts of ``counts`` (prompts per status) have no final outcome yet."""
    return sum(counts.get(status, 0) for status in UNFINISHED_PROMPT_STATUSES)
