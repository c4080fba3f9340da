"""Tasks over the Batch API steps of ``jobs``: submit, finish a submission, ingest, cancel, and a batch's
errors kept on it (or the batch given up). Polls are plain calls (``jobs.advance_batch``): one task run per poll
would load the Prefect API with every open batch."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from prefect import State, task
from prefect.cache_policies import NO_CACHE

from llm_dispatch import storage
from llm_dispatch.core import RetryFailed, counted
from llm_dispatch import jobs
from llm_dispatch.jobs import AbandonOutcome, BatchProblem, IngestOutcome, JobRun, SubmitOutcome

from ._states import result_of, run_state

# Output lines arrive in tens of thousands: bigger transactions than the real-time default.
INGEST_FLUSH_ROWS = 2000


@task(name="submit-batches", task_run_name="submit {size} prompts as batches", cache_policy=NO_CACHE)
async def submit_batches(
    *, run: JobRun, job_id: str, retry_failed: RetryFailed, size: int
) -> SubmitOutcome:
    """Write, record, upload and create the batches for the job's open batch-routed prompts (``size`` of
    them when counted; failed ones as ``retry_failed`` says), reading them a page at a time."""
    settings = run.settings
    held = await jobs.run_budget(settings, sessions=run.sessions, job_id=job_id)
    async with storage.ResultWriter(run.sessions, job_id=job_id, prices=run.prices) as writer:
        return await jobs.submit_prompts(
            sessions=run.sessions, clients=run.clients, writer=writer, job_id=job_id, retry_failed=retry_failed,
            directory=Path(settings.batch_dir), dedupe=settings.dedupe,
            max_requests=settings.batch_max_requests, max_bytes=settings.batch_max_bytes,
            max_retries=settings.max_retries, budget=held, cache_plan=settings.cache_plan,
        )


@task(name="finish-submission", task_run_name="finish submitting batch {batch_id}", cache_policy=NO_CACHE)
async def finish_submission(*, run: JobRun, batch_id: int) -> storage.BatchRecord:
    """Take a batch a crash left in ``preparing`` or ``uploaded`` on to created (adopting a create that got through)."""
    return await jobs.advance_submission(sessions=run.sessions, clients=run.clients,
                                         record=await storage.require_batch(run.sessions, batch_id=batch_id),
                                         max_retries=run.settings.max_retries)


async def ingest_batch(*, run: JobRun, batch_id: int) -> IngestOutcome:
    """Store a finished batch's answers and settle its members (resend, re-route or fail), as an ``ingest-batch``
    task run named for the batch's place in its job (``ingest batch 2 of job 0eea949d (id 17)``) that ends
    ``Failed`` when lines of it failed for good; its outcome is returned either way."""
    record = await storage.require_batch(run.sessions, batch_id=batch_id)
    number = await storage.batch_number(run.sessions, record=record)
    # Prefect types an async task called with return_state=True as its State, not the coroutine it is.
    state = await _ingest_batch(run=run, record=record, label=f"batch {number} of job {record.job_id[:8]} "  # type: ignore[misc]
                                                                f"(id {record.id})", return_state=True)
    outcome: IngestOutcome = await result_of(state)
    return outcome


# retries=0: a Failed ingest (lines failed for good) is its outcome, not a fault for Prefect's default retries to run
# again (a second ingest finds nothing left to store and would report that instead).
@task(name="ingest-batch", task_run_name="ingest {label}", cache_policy=NO_CACHE, retries=0)
async def _ingest_batch(*, run: JobRun, record: storage.BatchRecord, label: str) -> State:
    """Its invalid answers' re-asks are held by the job's budget (``run_budget``), as every batch is."""
    settings = run.settings
    held = await jobs.run_budget(settings, sessions=run.sessions, job_id=record.job_id)
    async with storage.ResultWriter(run.sessions, job_id=record.job_id, flush_rows=INGEST_FLUSH_ROWS,
                                    prices=run.prices) as writer:
        outcome = await jobs.ingest_batch(
            sessions=run.sessions, clients=run.clients, writer=writer, record=record,
            directory=Path(settings.batch_dir), max_submissions=settings.batch_max_submissions,
            deadline_margin=timedelta(seconds=settings.deadline_margin), max_reasks=settings.max_reasks,
            budget=held,
        )
    told = f"{outcome.succeeded} answered, {outcome.failed} failed, {outcome.resend} to send again"
    failure = None
    if outcome.failed:
        codes = ", ".join(f"{code} x{n}" for code, n in sorted(outcome.failed_by_code.items()))
        failure = f"{label}: {counted(outcome.failed, 'line')} failed for good ({codes or 'see the job'}); {told}"
    return run_state(outcome, failure=failure, message=f"{label}: {told}")


@task(name="cancel-batch", task_run_name="cancel batch {batch_id}", cache_policy=NO_CACHE)
async def cancel_batch(*, run: JobRun, batch_id: int) -> storage.BatchRecord:
    """Ask the provider to stop one open batch; returns it as it now stands."""
    return await jobs.cancel_batch(sessions=run.sessions, clients=run.clients,
                                   record=await storage.require_batch(run.sessions, batch_id=batch_id))


@task(name="record-batch-error", task_run_name="record the error of batch {batch_id}", cache_policy=NO_CACHE)
async def record_batch_error(*, run: JobRun, batch_id: int, step: str, error: BaseException) -> BatchProblem:
    """Keep a step's error on its batch, with the wait before a sweep tries it again; a batch the provider
    no longer knows is looked up again, then closed ``lost`` with its prompts pending again."""
    record = await storage.require_batch(run.sessions, batch_id=batch_id)
    return await jobs.batch_trouble(run=run, record=record, step=step, error=error)


@task(name="abandon-batch", task_run_name="abandon batch {batch_id}", cache_policy=NO_CACHE)
async def abandon_batch(*, run: JobRun, batch_id: int, force: bool) -> AbandonOutcome:
    """Give a batch up by hand (``llm-dispatch abandon``): closed ``lost``, its prompts pending again."""
    return await jobs.abandon_batch(run=run, batch_id=batch_id, force=force)
