"""Storage: the schema (under Alembic migrations), the engine, and every query llm-dispatch runs.

Everything takes an ``async_sessionmaker`` from ``session_factory(engine)``; nothing here
holds a global engine or session.
"""

from __future__ import annotations

from ._engine import DATABASE_URL_ENV, create_engine, session_factory
from ._migrate import migrate
from ._models import Base, Job, Prompt, Result
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
)
from ._records import JobInfo, NewPrompt, ResultStats, WorkRow
from ._status import (
    JOB_STATUSES,
    PROMPT_STATUSES,
    RESULT_STATUSES,
    ROUTES,
    JobStatus,
    PromptStatus,
    ResultStatus,
    RetryFailed,
    Route,
)
from ._writer import ResultWriter

__all__ = [
    "DATABASE_URL_ENV",
    "JOB_STATUSES",
    "PROMPT_STATUSES",
    "RESULT_STATUSES",
    "ROUTES",
    "Base",
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
    "create_engine",
    "create_job",
    "find_job",
    "find_reusable",
    "get_job",
    "job_counts",
    "load_work",
    "mark_in_flight",
    "migrate",
    "open_prompt_ids",
    "result_stats",
    "session_factory",
    "set_job_status",
]
