"""A job's steps over the core and storage, with no Prefect: record the prompts, plan and send the
real-time half, submit and collect batches, price the job. Flows call these through ``tasks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from ._batch_api import BatchApi
    from ._budget import BudgetStanding, budget_standing, check_budget_bounds, run_budget, to_pico
    from ._clients import Clients, batch_api
    from ._batch_trouble import (
        BATCH_RETRY_FIRST,
        BATCH_RETRY_MAX,
        AbandonOutcome,
        BatchProblem,
        abandon_batch,
        batch_trouble,
        error_text,
        lose_batch,
        retry_delay,
    )
    from ._collect import IngestOutcome, cancel_batch, cancel_batches, ingest_batch, poll_batch, reroute_for_deadlines
    from ._export import (
        BINARY_FORMATS,
        DEFAULT_FIELDS,
        EXPORT_FIELDS,
        EXPORT_FORMATS,
        ExportColumn,
        ExportPlan,
        export_columns,
        plan_export,
    )
    from ._costs import JobCost, PriceBasis, RepricedRow, Repricing, actual_cost, estimate_cost, money, reprice
    from ._realtime import Chunk, ChunkFeed, ChunkSender, SendChunk
    from ._run import JobRun, load_prices, open_run
    from ._plan import MAX_CHUNKS_PER_RUN, RealtimePlan, Selection, chunk_groups, chunk_size_for, plan_realtime
    from ._record import (
        PromptInput,
        RecordedJob,
        StoredSlice,
        fingerprint_of,
        new_prompts,
        prompt_input,
        record_job,
        routing_rules,
        store_rest,
    )
    from ._summary import (
        BatchHalfSummary,
        BatchLeft,
        CancelSummary,
        DirectorySummary,
        DispatchSummary,
        JobReport,
        RealtimeSummary,
        ShardRuns,
        SweepSummary,
        job_report,
    )
    from ._submit import (
        BATCH_ID_KEY,
        JOB_ID_KEY,
        SubmitOutcome,
        advance_submission,
        find_provider_batch,
        submit_prompts,
    )


__all__ = [
    "BATCH_ID_KEY",
    "BATCH_RETRY_FIRST",
    "BATCH_RETRY_MAX",
    "AbandonOutcome",
    "BatchProblem",
    "abandon_batch",
    "batch_trouble",
    "cancel_batch",
    "error_text",
    "lose_batch",
    "retry_delay",
    "DEFAULT_FIELDS",
    "EXPORT_FIELDS",
    "EXPORT_FORMATS",
    "JOB_ID_KEY",
    "MAX_CHUNKS_PER_RUN",
    "BatchApi",
    "BatchHalfSummary",
    "BatchLeft",
    "BudgetStanding",
    "CancelSummary",
    "Chunk",
    "Clients",
    "ChunkFeed",
    "ChunkSender",
    "IngestOutcome",
    "JobCost",
    "JobReport",
    "JobRun",
    "PriceBasis",
    "PromptInput",
    "RealtimePlan",
    "RealtimeSummary",
    "RecordedJob",
    "RepricedRow",
    "Repricing",
    "ShardRuns",
    "Selection",
    "SendChunk",
    "StoredSlice",
    "SubmitOutcome",
    "SweepSummary",
    "DirectorySummary",
    "DispatchSummary",
    "ExportColumn",
    "ExportPlan",
    "actual_cost",
    "advance_submission",
    "batch_api",
    "budget_standing",
    "check_budget_bounds",
    "cancel_batches",
    "chunk_groups",
    "chunk_size_for",
    "estimate_cost",
    "export_columns",
    "find_provider_batch",
    "fingerprint_of",
    "ingest_batch",
    "job_report",
    "load_prices",
    "money",
    "new_prompts",
    "plan_export",
    "BINARY_FORMATS",
    "prompt_input",
    "open_run",
    "plan_realtime",
    "poll_batch",
    "record_job",
    "reprice",
    "reroute_for_deadlines",
    "routing_rules",
    "run_budget",
    "to_pico",
    "store_rest",
    "submit_prompts",
]

__getattr__, __dir__ = lazy_names(__name__)
