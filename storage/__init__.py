"""Storage: the schema (under Alembic migrations), the engine, and every query llm-dispatch runs,
real-time and Batch API alike.

Everything takes an ``async_sessionmaker`` from ``session_factory(engine)``; nothing here
holds a global engine or session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from ._batch_create import create_batch_record
    from ._batches import (
        batch_members,
        batch_submissions,
        clear_batch_error,
        find_batch_by_provider_id,
        batch_number,
        get_batch,
        job_batches,
        mark_batch_ingested,
        mark_batch_lost,
        unfinished_batches,
        record_batch_error,
        require_batch,
        store_batch_answers,
        update_batch,
    )
    from ._budgets import (
        LEASE_TTL,
        BudgetInfo,
        BudgetLease,
        BudgetUsage,
        budget_usage,
        get_budget,
        hold_for,
        reclaim_expired,
        release_batch,
        release_holds,
        set_budget,
        set_job_budget,
        settle_batch,
        settle_holds,
    )
    from ._cache_groups import CacheGroupRow, StoredCacheGroups, job_cache_groups, store_cache_groups
    from ._cache_usage import CacheAnswer, cache_answer_pages
    from ._cached_contents import CachedContentLedger, cache_storage_costs
    from ._capabilities import no_batch_api, remember_no_batch_api
    from ._job_budgets import budgets_of_job, note_job_budget
    from ._engine import Sessions, check_database_url, create_engine, open_database, session_factory, write_lanes
    from ._ledger import compact_ledger
    from ._usage import UsageRow, usage_by_route
    from ._migrate import migrate, require_current_schema
    from ._models import Base, Batch, Budget, BudgetSpend, Job, Prompt, Reservation, Result
    from ._unfinished import (
        unfinished_prompt_count,
        unfinished_prompt_ids,
        unfinished_prompts,
        unfinished_repeated_keys,
        job_repeated_keys,
        unfinished_work_in_order,
        unfinished_work_pages,
    )
    from ._jobs import (
        create_job,
        find_job,
        get_job,
        job_counts,
        job_model_endpoints,
        job_models,
        job_providers,
        resolve_job,
        result_stats,
        set_job_status,
    )
    from ._prompts import (
        add_prompts,
        find_reusable,
        load_work,
        mark_in_flight,
        reopen_refused,
        answer_schemas,
        reask_levels,
        reroute_late_prompts,
        reroute_pending,
        set_planned_route,
    )
    from ._records import BatchRecord, JobInfo, NewPrompt, UnfinishedPrompt, ResultStats, WorkRow
    from ._reports import (
        EXPORT_ROW_FIELDS,
        ExportRow,
        ExportShape,
        JobSummary,
        ReplyLengths,
        export_pages,
        export_rows,
        export_shape,
        list_jobs,
        reply_lengths,
        route_counts,
        StructuredStats,
        structured_stats,
    )
    from ._writer import ResultWriter


__all__ = [
    "CacheGroupRow",
    "StoredCacheGroups",
    "job_cache_groups",
    "store_cache_groups",
    "CacheAnswer",
    "CachedContentLedger",
    "cache_storage_costs",
    "cache_answer_pages",
    "no_batch_api",
    "reroute_pending",
    "remember_no_batch_api",
    "LEASE_TTL",
    "Budget",
    "BudgetInfo",
    "BudgetLease",
    "BudgetSpend",
    "BudgetUsage",
    "Reservation",
    "budget_usage",
    "get_budget",
    "hold_for",
    "reclaim_expired",
    "release_batch",
    "release_holds",
    "set_budget",
    "set_job_budget",
    "budgets_of_job",
    "note_job_budget",
    "settle_batch",
    "settle_holds",
    "Base",
    "Batch",
    "BatchRecord",
    "EXPORT_ROW_FIELDS",
    "ExportRow",
    "ExportShape",
    "JobSummary",
    "UsageRow",
    "Job",
    "JobInfo",
    "NewPrompt",
    "UnfinishedPrompt",
    "Prompt",
    "Result",
    "ResultStats",
    "ReplyLengths",
    "ResultWriter",
    "Sessions",
    "WorkRow",
    "add_prompts",
    "batch_members",
    "batch_submissions",
    "check_database_url",
    "compact_ledger",
    "create_batch_record",
    "create_engine",
    "create_job",
    "export_pages",
    "export_rows",
    "export_shape",
    "list_jobs",
    "reply_lengths",
    "route_counts",
    "StructuredStats",
    "structured_stats",
    "usage_by_route",
    "find_batch_by_provider_id",
    "find_job",
    "find_reusable",
    "batch_number",
    "get_batch",
    "get_job",
    "job_batches",
    "clear_batch_error",
    "mark_batch_lost",
    "record_batch_error",
    "job_counts",
    "job_model_endpoints",
    "job_models",
    "job_providers",
    "load_work",
    "mark_batch_ingested",
    "mark_in_flight",
    "migrate",
    "unfinished_batches",
    "open_database",
    "unfinished_prompt_count",
    "unfinished_prompt_ids",
    "unfinished_prompts",
    "unfinished_repeated_keys",
    "job_repeated_keys",
    "unfinished_work_in_order",
    "unfinished_work_pages",
    "reopen_refused",
    "answer_schemas",
    "reask_levels",
    "require_batch",
    "require_current_schema",
    "reroute_late_prompts",
    "resolve_job",
    "result_stats",
    "session_factory",
    "write_lanes",
    "set_job_status",
    "set_planned_route",
    "store_batch_answers",
    "update_batch",
]

__getattr__, __dir__ = lazy_names(__name__)
