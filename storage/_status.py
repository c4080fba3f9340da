"""Every status and route value stored in the database, in one place."""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = [
    "JOB_STATUSES",
    "PROMPT_STATUSES",
    "RESULT_STATUSES",
    "ROUTES",
    "JobStatus",
    "PromptStatus",
    "ResultStatus",
    "RetryFailed",
    "Route",
]

JobStatus = Literal["created", "running", "finished", "failed"]
PromptStatus = Literal["pending", "in_flight", "succeeded", "failed"]
ResultStatus = Literal["succeeded", "failed"]
# "reused": the row shares the outcome of one HTTP call (or an earlier stored success)
# recorded elsewhere, so its tokens were not paid for again.
Route = Literal["realtime", "batch", "reused"]
# Which failed prompts a new run sends again.
RetryFailed = Literal["retryable", "all", "none"]

# No CHECK constraints enforce these in the database: the Batch API will add states, and
# on SQLite changing a CHECK means copying the whole prompts table in a migration.
JOB_STATUSES: Final[tuple[JobStatus, ...]] = get_args(JobStatus)
PROMPT_STATUSES: Final[tuple[PromptStatus, ...]] = get_args(PromptStatus)
RESULT_STATUSES: Final[tuple[ResultStatus, ...]] = get_args(ResultStatus)
ROUTES: Final[tuple[Route, ...]] = get_args(Route)
