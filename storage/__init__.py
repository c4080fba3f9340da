"""Storage: the schema (under Alembic migrations), the engine, and every query llm-dispatch runs,
real-time and Batch API alike.

Everything takes an ``async_sessionmaker`` from ``session_factory(engine)``; nothing here
holds a global engine or session.
"""

from __future__ import annotations

from . import _status
from ._batches import (
    BATCH_FIELDS,
    batch_members,
    batch_submissions,
    create_batch_record,
    find_batch_by_provider_id,
    get_batch,
    job_batches,
    mark_batch_ingested,
    open_batches,
    release_members,
    require_batch,
    store_batch_answers,
    update_batch,
)
from ._engine import DATABASE_URL_ENV, check_database_url, create_engine, open_database, session_factory
from ._migrate import migrate, require_current_schema
from ._models import Base, Batch, BatchMember, Job, Prompt, Result
from ._open import (
    open_prompt_count,
    open_prompt_ids,
    open_prompts,
    open_repeated_keys,
    open_work_in_order,
    open_work_pages,
)
from ._queries import (
    add_prompts,
    create_job,
    find_job,
    find_reusable,
    get_job,
    job_counts,
    job_models,
    load_work,
    mark_in_flight,
    reroute_late_prompts,
    result_stats,
    set_job_status,
    set_planned_route,
)
from ._records import BatchRecord, JobInfo, NewPrompt, OpenPrompt, ResultStats, WorkRow
from ._reports import (
    ExportRow,
    JobSummary,
    ReplyLengths,
    UsageRow,
    export_rows,
    list_jobs,
    reply_lengths,
    route_counts,
    usage_by_route,
)
from ._status import *  # noqa: F403  # every status and route name: see _status.__all__
from ._writer import ResultWriter

__all__ = [
    "BATCH_FIELDS",
    "DATABASE_URL_ENV",
    "Base",
    "Batch",
    "BatchMember",
    "BatchRecord",
    "ExportRow",
    "JobSummary",
    "UsageRow",
    "Job",
    "JobInfo",
    "NewPrompt",
    "OpenPrompt",
    "Prompt",
    "Result",
    "ResultStats",
    "ReplyLengths",
    "ResultWriter",
    "WorkRow",
    "add_prompts",
    "batch_members",
    "batch_submissions",
    "check_database_url",
    "create_batch_record",
    "create_engine",
    "create_job",
    "export_rows",
    "list_jobs",
    "reply_lengths",
    "route_counts",
    "usage_by_route",
    "find_batch_by_provider_id",
    "find_job",
    "find_reusable",
    "get_batch",
    "get_job",
    "job_batches",
    "job_counts",
    "job_models",
    "load_work",
    "mark_batch_ingested",
    "mark_in_flight",
    "migrate",
    "open_batches",
    "open_database",
    "open_prompt_count",
    "open_prompt_ids",
    "open_prompts",
    "open_repeated_keys",
    "open_work_in_order",
    "open_work_pages",
    "release_members",
    "require_batch",
    "require_current_schema",
    "reroute_late_prompts",
    "result_stats",
    "session_factory",
    "set_job_status",
    "set_planned_route",
    "store_batch_answers",
    "update_batch",
]
__all__ += _status.__all__
