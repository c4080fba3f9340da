"""Storage: the schema (under Alembic migrations), the engine, and every query llm-dispatch runs."""

from __future__ import annotations

from ._engine import create_engine, session_factory
from ._migrate import migrate
from ._models import Base, Job, Prompt, Result
from ._queries import (
    JobInfo,
    NewPrompt,
    ResultStats,
    WorkRow,
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
from ._status import JobStatus, PromptStatus, ResultStatus, RetryFailed, Route
from ._writer import ResultWriter

__all__ = [
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
