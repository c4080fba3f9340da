"""Storage: the schema (under Alembic migrations), the engine, and every query llm-dispatch runs,
real-time and Batch API alike.

Everything takes an ``async_sessionmaker`` from ``session_factory(engine)``; nothing here
holds a global engine or session.
"""

from __future__ import annotations

from ._batches import (
    BATCH_FIELDS,
    BatchConflictError,
    batch_members,
    batch_submissions,
    create_batch_record,
    find_batch_by_provider_id,
    get_batch,
    mark_batch_ingested,
    open_batches,
    release_members,
    update_batch,
)
from ._engine import DATABASE_URL_ENV, create_engine, session_factory
from ._migrate import migrate
from ._models import Base, Batch, BatchMember, Job, Prompt, Result
from ._queries import (
    add_prompts,
    create_job,
    find_job,
    find_reusable,
    get_job,
    job_counts,
    load_work,
    mark_in_flight,
    open_prompt_ids,
    result_stats,
    set_job_status,
    set_planned_route,
)
from ._records import BatchRecord, JobInfo, NewPrompt, ResultStats, WorkRow
from ._status import (
    BATCH_STATUSES,
    JOB_STATUSES,
    OPEN_PROVIDER_BATCH_STATUSES,
    PROMPT_STATUSES,
    RESULT_STATUSES,
    ROUTES,
    TERMINAL_PROVIDER_BATCH_STATUSES,
    BatchStatus,
    JobStatus,
    PromptStatus,
    ResultStatus,
    RetryFailed,
    Route,
)
from ._writer import ResultWriter

__all__ = [
    "BATCH_FIELDS",
    "BATCH_STATUSES",
    "DATABASE_URL_ENV",
    "JOB_STATUSES",
    "OPEN_PROVIDER_BATCH_STATUSES",
    "PROMPT_STATUSES",
    "RESULT_STATUSES",
    "ROUTES",
    "TERMINAL_PROVIDER_BATCH_STATUSES",
    "Base",
    "Batch",
    "BatchConflictError",
    "BatchMember",
    "BatchRecord",
    "BatchStatus",
    "Job",
    "JobInfo",
    "JobStatus",
    "NewPrompt",
    "Prompt",
    "PromptStatus",
    "Result",
    "ResultStats",
    "ResultStatus",
    "ResultWriter",
    "RetryFailed",
    "Route",
    "WorkRow",
    "add_prompts",
    "batch_members",
    "batch_submissions",
    "create_batch_record",
    "create_engine",
    "create_job",
    "find_batch_by_provider_id",
    "find_job",
    "find_reusable",
    "get_batch",
    "get_job",
    "job_counts",
    "load_work",
    "mark_batch_ingested",
    "mark_in_flight",
    "migrate",
    "open_batches",
    "open_prompt_ids",
    "release_members",
    "result_stats",
    "session_factory",
    "set_job_status",
    "set_planned_route",
    "update_batch",
]
