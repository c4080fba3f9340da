"""A job's steps over the core and storage, with no Prefect: record the prompts, plan and send the
real-time half, submit and collect batches, price the job. Flows call these through ``tasks``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_dispatch.core import lazy_names

if TYPE_CHECKING:
    from ._budget import (
        BudgetStanding,
        budget_standing,
        check_budget_bounds,
        job_budget_standings,
        run_budget,
        to_pico,
    )
    from ._cache_report import CacheGroupReport, cache_report
    from ._cache_plan import (
        CacheEstimate,
        CachePlanning,
        describe_cache_estimate,
        describe_outcome,
        describe_plan,
        explicit_caches,
        make_batch_caches,
        plan_run_caches,
    )
    from ._clients import Clients
    from ._batch_life import BatchStep, FinishSubmission, Ingest, advance_batch
    from ._batch_trouble import (
        FOLLOW_ERRORS,
        AbandonOutcome,
        BatchProblem,
        abandon_batch,
        batch_trouble,
        error_text,
        lose_batch,
        poll_wait,
    )
    from ._capabilities import first_error, is_missing_batch_api, known_without_batch_api, learn_no_batch_api, \
        learning_batches, without_batches
    from ._collect import IngestOutcome, cancel_batch, ingest_batch, poll_batch
    from ._export import BINARY_FORMATS, ExportPlan, plan_export
    from ._costs import JobCost, PriceBasis, RepricedRow, Repricing, actual_cost, estimate_cost, money, reprice
    from ._realtime import Chunk, ChunkFeed, ChunkSender, SendChunk
    from ._run import JobRun, open_run
    from ._plan import Selection, plan_realtime
    from ._record import (
        PromptInput,
        RecordedJob,
        fingerprint_of,
        prompt_input,
        record_job,
        replan_pending,
        routing_rules,
    )
    from ._summary import (
        CACHE_REPORT_MAX_PROMPTS,
        BatchHalfSummary,
        CancelSummary,
        DirectorySummary,
        DispatchSummary,
        JobReport,
        RealtimeSummary,
        ShardRuns,
        SweepSummary,
        job_report,
    )
    from ._submit import SubmitOutcome, advance_submission, submit_prompts


__all__ = [
    "CACHE_REPORT_MAX_PROMPTS",
    "CacheEstimate",
    "CacheGroupReport",
    "CachePlanning",
    "describe_cache_estimate",
    "cache_report",
    "describe_outcome",
    "describe_plan",
    "explicit_caches",
    "make_batch_caches",
    "plan_run_caches",
    "first_error",
    "is_missing_batch_api",
    "known_without_batch_api",
    "learn_no_batch_api",
    "learning_batches",
    "without_batches",
    "AbandonOutcome",
    "BatchProblem",
    "BatchStep",
    "FOLLOW_ERRORS",
    "FinishSubmission",
    "Ingest",
    "abandon_batch",
    "advance_batch",
    "batch_trouble",
    "poll_wait",
    "cancel_batch",
    "error_text",
    "lose_batch",
    "BatchHalfSummary",
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
    "RealtimeSummary",
    "RecordedJob",
    "RepricedRow",
    "Repricing",
    "ShardRuns",
    "Selection",
    "SendChunk",
    "SubmitOutcome",
    "SweepSummary",
    "DirectorySummary",
    "DispatchSummary",
    "ExportPlan",
    "actual_cost",
    "advance_submission",
    "budget_standing",
    "job_budget_standings",
    "check_budget_bounds",
    "estimate_cost",
    "fingerprint_of",
    "ingest_batch",
    "job_report",
    "money",
    "plan_export",
    "BINARY_FORMATS",
    "prompt_input",
    "open_run",
    "plan_realtime",
    "poll_batch",
    "record_job",
    "reprice",
    "replan_pending",
    "routing_rules",
    "run_budget",
    "to_pico",
    "submit_prompts",
]

__getattr__, __dir__ = lazy_names(__name__)
