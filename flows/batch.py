"""Flows of the Batch API path: ``wait-for-batch`` (one batch to its end), ``collect-batches`` (a sweep over
every open batch, for a schedule), ``cancel-batches`` and ``abandon-batch``. The batch half of ``dispatch`` lives in
``_batch_half``, so that a run of ``dispatch`` builds none of these flows."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow, get_run_logger
from prefect.states import State
from pydantic import SecretStr

from llm_dispatch import storage
from llm_dispatch.jobs import (
    AbandonOutcome,
    BatchLeft,
    BatchProblem,
    CancelSummary,
    IngestOutcome,
    JobRun,
    SweepSummary,
    error_text,
    open_run,
)
from llm_dispatch.core import (
    ACTIVE_BATCH_STATUSES,
    HALF_SUBMITTED_BATCH_STATUSES,
    TERMINAL_BATCH_STATUSES,
    Settings,
    unfinished,
)
from llm_dispatch.tasks import (
    abandon_batch,
    cancel_batch,
    finish_submission,
    ingest_batch,
    poll_batch,
    record_batch_error,
    submit_batches,
)

from ._artifacts import publish_sweep, show_batch_progress
from ._batch_half import POLL_GROWTH, send_rerouted
from ._setup import collect_run_name, prepare, rename_run
from ._states import run_state

# Settings never taken from ``settings_overrides`` (plain flow parameters): the keys stay in the environment, the
# database URL comes as its own SecretStr parameter.
_PRIVATE = frozenset({"api_key", "anthropic_api_key", "database_url"})


@flow(name="wait-for-batch", flow_run_name="wait for batch {batch_id}", log_prints=False)
async def wait_for_batch(
    batch_id: int,
    database_url: SecretStr | None = None,
    settings_overrides: dict[str, Any] | None = None,
    ingest_when_done: bool = True,
) -> IngestOutcome | BatchLeft:
    """Poll one batch until the provider is done with it (interval growing from ``batch_poll_interval``
    to ``batch_poll_max_interval``), keeping a progress artifact current; then ingest its output.

    Gives up, leaving the batch to ``collect-batches``, once ``batch_grace`` seconds pass its expiry.
    """
    overrides = {key: value for key, value in (settings_overrides or {}).items() if key not in _PRIVATE}
    settings = await prepare(Settings.with_overrides(**overrides, database_url=database_url), logger=get_run_logger())
    async with open_run(settings, migrate=False) as run:
        outcome = await follow_batch(run=run, batch_id=batch_id, ingest_when_done=ingest_when_done)
    return outcome


async def follow_batch(*, run: JobRun, batch_id: int, ingest_when_done: bool = True) -> IngestOutcome | BatchLeft:
    """The recipe behind ``wait-for-batch``: the ingest's outcome, or how the batch stands when left."""
    logger = get_run_logger()
    settings = run.settings
    record = await storage.require_batch(run.sessions, batch_id=batch_id)
    if record.status in HALF_SUBMITTED_BATCH_STATUSES:
        record = await finish_submission(run=run, batch_id=batch_id)
    artifact = None
    interval = settings.batch_poll_interval
    grace = timedelta(seconds=settings.batch_grace)
    while record.status in ACTIVE_BATCH_STATUSES:
        record = await poll_batch(run=run, batch_id=batch_id)
        artifact = await show_batch_progress(record, artifact, logger=logger)
        if record.status not in ACTIVE_BATCH_STATUSES:
            break
        if record.expires_at is not None and datetime.now(UTC) > record.expires_at + grace:
            logger.warning("Batch %d is still %s %s after its expiry; leaving it to collect-batches.",
                           batch_id, record.status, grace)
            return BatchLeft(batch_id=batch_id, status=record.status, gave_up=True)
        await asyncio.sleep(interval)
        interval = min(interval * POLL_GROWTH, settings.batch_poll_max_interval)
    if record.status in TERMINAL_BATCH_STATUSES and ingest_when_done:
        return await ingest_batch(run=run, batch_id=batch_id)
    return BatchLeft(batch_id=batch_id, status=record.status)


@flow(name="collect-batches", flow_run_name=collect_run_name, log_prints=False)
async def collect_batches(
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
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
                                                    database_url=database_url), logger=logger)
    async with open_run(settings) as run:
        if job_id is not None:
            job_id = await storage.resolve_job(run.sessions, reference=job_id)
        summary = await sweep(run=run, job_id=job_id, stale_after=stale_after, retry_now=retry_now)
    scope = f"job {job_id[:8]}" if job_id else "all jobs"
    problems = f", {len(summary.problems)} problems" if summary.problems else ""
    await rename_run(f"collect ({scope}): {summary.open} open batches, {len(summary.ingested)} ingested{problems}",
                     logger=logger)
    said = (f"Swept {summary.open} open batches: {summary.polled} polled, {len(summary.ingested)} ingested, "
            f"{summary.resubmitted} prompts resubmitted, {summary.realtime} sent real-time, "
            f"{summary.skipped_recent} half-submitted ones left to their own run, {len(summary.waiting)} waiting to "
            "retry after errors.")
    logger.info(said)
    for problem in summary.problems:
        logger.error(problem.line)
    await publish_sweep(summary, scope=scope, logger=logger)
    failure = (f"{len(summary.problems)} problems ({len(summary.lost)} batches lost): "
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
    """One batch of a sweep: finish its submission once stale, poll it, ingest it once finished; an error is kept
    on the batch (``record_batch_error``) and in ``summary``. Returns whether its job has prompts to send again."""
    step = "finish its submission"
    try:
        if record.status in HALF_SUBMITTED_BATCH_STATUSES:
            if record.updated_at > cutoff:
                summary.skipped_recent += 1
                return False
            record = await finish_submission(run=run, batch_id=record.id)
        elif record.status in ACTIVE_BATCH_STATUSES:
            step = "poll"
            record = await poll_batch(run=run, batch_id=record.id)
            summary.polled += 1
        if record.status in TERMINAL_BATCH_STATUSES:
            step = "ingest"
            summary.ingested.append(await ingest_batch(run=run, batch_id=record.id))
    except Exception as exc:  # noqa: BLE001 - kept on the batch; the sweep goes on with the others
        problem = await record_batch_error(run=run, batch_id=record.id, step=step, error=exc)
        summary.problems.append(problem)
        return problem.lost
    if record.error_count:
        await storage.clear_batch_error(run.sessions, batch_id=record.id)
    return step != "poll"  # a submission finished, or an ingest: the job may have prompts to send again


async def _close_if_done(run: JobRun, *, job_id: str) -> None:
    if not unfinished(await storage.job_counts(run.sessions, job_id=job_id)):
        await storage.set_job_status(run.sessions, job_id=job_id, status="finished")


@flow(name="cancel-batches", flow_run_name="cancel batches of job {job_id}", log_prints=False)
async def cancel_job_batches(
    job_id: str,
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    wait_seconds: float = 120.0,
) -> State:
    """Cancel every open batch of a job, each on its own (one the provider cannot be asked about keeps the error
    and stays open; ``llm-dispatch abandon`` gives it up), then (for up to ``wait_seconds``) wait for the provider
    to stop them and ingest what they completed; whatever is left, ``collect-batches`` finishes."""
    logger = get_run_logger()
    settings = await prepare(Settings.with_overrides(base_url=base_url, anthropic_base_url=anthropic_base_url,
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
            try:
                while record.status in ACTIVE_BATCH_STATUSES and time.monotonic() < deadline:
                    await asyncio.sleep(min(1.0, settings.batch_poll_interval))
                    record = await poll_batch(run=run, batch_id=record.id)
                if record.status in TERMINAL_BATCH_STATUSES:
                    ingested.append(await ingest_batch(run=run, batch_id=record.id))
            except Exception as exc:  # noqa: BLE001 - as above; collect-batches finishes it later
                problems.append(await record_batch_error(run=run, batch_id=record.id, step="poll after cancel",
                                                         error=exc))
        await _close_if_done(run, job_id=job_id)
    for problem in problems:
        logger.error(problem.line)
    summary = CancelSummary(job_id=job_id, cancelled=[r.id for r in records], ingested=ingested, problems=problems)
    failure = "; ".join(problem.line for problem in problems) or None
    return run_state(summary, failure=failure,
                     message=f"cancelled {len(records)} batches, {len(ingested)} ingested")


@flow(name="abandon-batch", flow_run_name="abandon batch {batch_id}", log_prints=False)
async def abandon_batch_flow(
    batch_id: int,
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    anthropic_base_url: str | None = None,
    force: bool = False,
) -> AbandonOutcome:
    """Give one batch up by hand: closed ``lost``, its unanswered prompts pending again for the next run (see
    ``jobs.abandon_batch``: a batch the provider still holds is refused unless ``force``)."""
    settings = await prepare(Settings.with_overrides(base_url=base_url, anthropic_base_url=anthropic_base_url,
                                                    database_url=database_url), logger=get_run_logger())
    async with open_run(settings) as run:
        outcome = await abandon_batch(run=run, batch_id=batch_id, force=force)
    return outcome
