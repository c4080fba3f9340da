"""Prefect tasks over the Batch API steps in ``batch_submit`` and ``batch_collect``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import BatchLimits, LLMClient, Settings

from .batch_collect import IngestOutcome, ingest_batch
from .batch_submit import SubmitOutcome, advance_submission, submit_prompts

Sessions = async_sessionmaker[AsyncSession]


def batch_limits(settings: Settings) -> BatchLimits:
    return BatchLimits(max_requests=settings.batch_max_requests, max_bytes=settings.batch_max_bytes)


@task(name="submit-batches", task_run_name="submit {size} prompts as batches", cache_policy=NO_CACHE)
async def submit_batches(
    *,
    size: int,
    job_id: str,
    prompt_ids: Sequence[int],
    sessions: Sessions,
    client: LLMClient,
    writer: storage.ResultWriter,
    settings: Settings,
    resubmission_of: int | None = None,
) -> SubmitOutcome:
    """Write, record, upload and create the batches for these prompts (``size`` of them)."""
    return await submit_prompts(
        sessions=sessions, client=client, writer=writer, job_id=job_id, prompt_ids=prompt_ids,
        directory=Path(settings.batch_dir), limits=batch_limits(settings), dedupe=settings.dedupe,
        resubmission_of=resubmission_of,
    )


@task(name="finish-submission", task_run_name="finish submitting batch {batch_id}", cache_policy=NO_CACHE)
async def finish_submission(*, batch_id: int, sessions: Sessions, client: LLMClient) -> storage.BatchRecord:
    """Take a batch a crash left in ``preparing`` or ``uploaded`` on to created (adopting a create that got through)."""
    record = await storage.get_batch(sessions, batch_id=batch_id)
    if record is None:
        raise LookupError(f"no batch {batch_id} in the database")
    return await advance_submission(sessions=sessions, client=client, record=record)


@task(name="ingest-batch", task_run_name="ingest batch {batch_id}", cache_policy=NO_CACHE)
async def ingest(
    *, batch_id: int, sessions: Sessions, client: LLMClient, settings: Settings
) -> IngestOutcome:
    """Store a finished batch's answers and settle its members (resend, re-route or fail)."""
    record = await storage.get_batch(sessions, batch_id=batch_id)
    if record is None:
        raise LookupError(f"no batch {batch_id} in the database")
    # Output lines arrive in tens of thousands: bigger transactions than the real-time default.
    async with storage.ResultWriter(sessions, job_id=record.job_id, flush_rows=2000) as writer:
        return await ingest_batch(
            sessions=sessions, client=client, writer=writer, record=record, directory=Path(settings.batch_dir),
            max_submissions=settings.batch_max_submissions, deadline_margin=timedelta(seconds=settings.deadline_margin),
        )
