"""Flows of the Batch API path: ``collect-batches`` (a sweep over every open batch, for a schedule),
``cancel-batches`` and ``abandon-batch``. The batch half of ``dispatch`` lives in ``_batch_half`` and its polling
sub-flow ``wait-for-batches`` in ``_batch_wait``, so that a run of ``dispatch`` builds none of these flows."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from prefect import flow, get_run_logger
from prefect import State
from pydantic import SecretStr

from llm_dispatch import jobs, storage
from llm_dispatch.jobs import (
    AbandonOutcome,
    BatchProblem,
    CancelSummary,
    JobRun,
    SweepSummary,
    error_text,
    open_run,
)
from llm_dispatch.core import ACTIVE_BATCH_STATUSES, Settings, counted, unfinished
from llm_dispatch.tasks import (
    abandon_batch,
    cancel_batch,
    finish_submission,
    ingest_batch,
    record_batch_error,
    run_state,
    submit_batches,
)

from ._artifacts import publish_sweep
from ._batch_half import send_rerouted
from ._setup import collect_run_name, prepare, rename_run

@flow(name="collect-batches", flow_run_name=collect_run_name, log_prints=False)
async def collect_batches(
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    gemini_base_url: str | None = None,
    job_id: str | None = None,
    stale_after: float = 600.0,
    retry_now: bool = False,
) -> State:
    """One sweep over every open batch (of one job, or all): poll each once, ingest what finished,
    resubmit or send real-time what the ingests released. Meant for a schedule (every 15 minutes),
    so no process has to wait out a 24-hour window.

    Each batch is swept on its own: an error is kept on that batch (``llm-dispatch status`` shows it) and it is
    left alone for a wait that doubles with each error in a row (``retry_now`` tries it at once), while the others
    go on.
    The run ends ``Failed`` when a batch had a problem, its message and artifact naming each.

    A batch stuck in ``preparing``/``uploaded`` is finished only once it has not changed for
    ``stale_after`` seconds: younger ones may belong to a run that is submitting them right now.
    """
    logger = get_run_logger()
    settings = await prepare(Settings.with_overrides(base_url=base_url, anthropic_base_url=anthropic_base_url,
                                                    gemini_base_url=gemini_base_url,
                                                    database_url=database_url), logger=logger)
    async with open_run(settings) as run:
        if job_id is not None:
            job_id = await storage.resolve_job(run.sessions, reference=job_id)
        summary = await sweep(run=run, job_id=job_id, stale_after=stale_after, retry_now=retry_now)
    scope = f"job {job_id[:8]}" if job_id else "all jobs"
    problems = f", {counted(len(summary.problems), 'problem')}" if summary.problems else ""
    open_batches = counted(summary.open, "open batch", many="open batches")
    await rename_run(f"collect ({scope}): {open_batches}, {len(summary.ingested)} ingested{problems}", logger=logger)
    said = (f"Swept {open_batches}: {summary.polled} polled, {len(summary.ingested)} ingested, "
            f"{counted(summary.resubmitted, 'prompt')} resubmitted, {summary.realtime} sent real-time, "
            f"{summary.skipped_recent} half-submitted ones left to their own run, {len(summary.waiting)} waiting to "
            "retry after errors.")
    logger.info(said)
    for problem in summary.problems:
        logger.error(problem.line)
    await publish_sweep(summary, scope=scope, logger=logger)
    failure = (f"{counted(len(summary.problems), 'problem')} ({counted(len(summary.lost), 'batch', many='batches')} "
               "lost): "
               + "; ".join(problem.line for problem in summary.problems)) if summary.problems else None
    return run_state(summary, failure=failure, message=said)


async def sweep(*, run: JobRun, job_id: str | None, stale_after: float, retry_now: bool = False) -> SweepSummary:
    """The recipe behind ``collect-batches``: each batch on its own (``sweep_batch``), then each job it touched."""
    summary = SweepSummary()
    touched: set[str] = set()
    records = await storage.unfinished_batches(run.sessions, job_id=job_id)
    summary.open = len(records)
    now = datetime.now(UTC)
    cutoff = now - timedelta(seconds=stale_after)
    for record in records:
        if not retry_now and record.retry_after is not None and record.retry_after > now:
            summary.waiting.append(record.id)
        elif await sweep_batch(run=run, record=record, cutoff=cutoff, summary=summary):
            touched.add(record.job_id)
    for job in sorted(touched):
        try:
            size = await storage.unfinished_prompt_count(run.sessions, job_id=job, retry_failed="none",
                                                   planned_route="batch")
            if size:
                submitted = await submit_batches(run=run, job_id=job, retry_failed="none", size=size)
                summary.resubmitted += submitted.prompts
            rerouted = await send_rerouted(run, job_id=job)
            summary.realtime += 0 if rerouted is None else rerouted.prompts
            await _close_if_done(run, job_id=job)
        except Exception as exc:  # noqa: BLE001 - one job's trouble never stops the others'
            summary.problems.append(BatchProblem(batch_id=None, job_id=job, step="send what its batches released",
                                                 error=error_text(exc)))
    return summary


async def sweep_batch(*, run: JobRun, record: storage.BatchRecord, cutoff: datetime, summary: SweepSummary) -> bool:
    """One batch of a sweep, one step forward (``jobs.advance_batch``): its submission finished once unchanged since
    ``cutoff``, polled, ingested once finished; an error is kept on the batch and in ``summary``. Returns whether
    its job may have prompts to send again."""
    step = await jobs.advance_batch(run=run, record=record, ingest=ingest_batch, finish=finish_submission,
                                    stale_before=cutoff)
    summary.polled += step.polled
    if step.ingested is not None:
        summary.ingested.append(step.ingested)
    if step.problem is not None:
        summary.problems.append(step.problem)
    elif step.happened == "left":
        summary.skipped_recent += 1
    return step.released


async def _close_if_done(run: JobRun, *, job_id: str) -> None:
    if not unfinished(await storage.job_counts(run.sessions, job_id=job_id)):
        await storage.set_job_status(run.sessions, job_id=job_id, status="finished")


@flow(name="cancel-batches", flow_run_name="cancel batches of job {job_id}", log_prints=False)
async def cancel_job_batches(
    job_id: str,
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    gemini_base_url: str | None = None,
    wait_seconds: float = 120.0,
) -> State:
    """Cancel every open batch of a job, each on its own (one the provider cannot be asked about keeps the error
    and stays open; ``llm-dispatch abandon`` gives it up), then (for up to ``wait_seconds``) wait for the provider
    to stop them and ingest what they completed; whatever is left, ``collect-batches`` finishes."""
    logger = get_run_logger()
    settings = await prepare(Settings.with_overrides(base_url=base_url, anthropic_base_url=anthropic_base_url,
                                                    gemini_base_url=gemini_base_url,
                                                    database_url=database_url), logger=logger)
    async with open_run(settings) as run:
        job_id = await storage.resolve_job(run.sessions, reference=job_id)
        records, problems = [], []
        for record in await storage.unfinished_batches(run.sessions, job_id=job_id):
            try:
                records.append(await cancel_batch(run=run, batch_id=record.id))
            except Exception as exc:  # noqa: BLE001 - kept on the batch; the others are cancelled
                problems.append(await record_batch_error(run=run, batch_id=record.id, step="cancel", error=exc))
        deadline = time.monotonic() + wait_seconds
        ingested = []
        for record in records:
            # Until the provider has stopped it (ingested), a problem (kept on it), or the wait is over: whatever is
            # left, collect-batches finishes.
            while record.status not in ACTIVE_BATCH_STATUSES or time.monotonic() < deadline:
                if record.status in ACTIVE_BATCH_STATUSES:
                    await asyncio.sleep(min(1.0, settings.batch_poll_interval))
                step = await jobs.advance_batch(run=run, record=record, ingest=ingest_batch, leave_after_errors=1)
                if step.ingested is not None:
                    ingested.append(step.ingested)
                if step.problem is not None:
                    problems.append(step.problem)
                if not step.following:
                    break
                record = step.record
        await _close_if_done(run, job_id=job_id)
    for problem in problems:
        logger.error(problem.line)
    summary = CancelSummary(job_id=job_id, cancelled=[r.id for r in records], ingested=ingested, problems=problems)
    failure = "; ".join(problem.line for problem in problems) or None
    return run_state(summary, failure=failure,
                     message=f"cancelled {counted(len(records), 'batch', many='batches')}, {len(ingested)} ingested")


@flow(name="abandon-batch", flow_run_name="abandon batch {batch_id}", log_prints=False)
async def abandon_batch_flow(
    batch_id: int,
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    gemini_base_url: str | None = None,
    force: bool = False,
) -> AbandonOutcome:
    """Give one batch up by hand: closed ``lost``, its unanswered prompts pending again for the next run (see
    ``jobs.abandon_batch``: a batch the provider still holds is refused unless ``force``)."""
    settings = await prepare(Settings.with_overrides(base_url=base_url, anthropic_base_url=anthropic_base_url,
                                                    gemini_base_url=gemini_base_url,
                                                    database_url=database_url), logger=get_run_logger())
    async with open_run(settings) as run:
        outcome = await abandon_batch(run=run, batch_id=batch_id, force=force)
    return outcome
