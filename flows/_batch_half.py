"""The batch half of ``dispatch`` (``dispatch_batches``: submit, follow every batch of a round in one
``wait-for-batches`` sub-flow run, fall back to real-time) and ``send_rerouted``, which ``collect-batches`` also
uses; no flow is defined here, so importing it builds none."""

from __future__ import annotations

import asyncio
import time

from prefect import get_run_logger

from llm_dispatch import jobs, storage
from llm_dispatch.jobs import (
    BatchHalfSummary,
    JobRun,
    RealtimeSummary,
    RecordedJob,
    Selection,
    run_budget,
)
from llm_dispatch.core import BACKENDS, HALF_SUBMITTED_BATCH_STATUSES, RetryFailed, counted
from llm_dispatch.tasks import finish_submission, submit_batches

from ._realtime_half import send_realtime

# The providers whose endpoint may be known to have no Batch API (``jobs.known_without_batch_api``).
BATCH_PROVIDERS = frozenset(BACKENDS)
# Prompts an ingest re-routed to real-time, not already taken by a live run.
REROUTED = Selection(retry_failed="none", planned_route="realtime", in_flight=False)


async def _route_around(run: JobRun, *, job_id: str, error: BaseException | None, because: str,
                        providers: frozenset[str] | None = None) -> bool:
    """An endpoint has no Batch API: the pending prompts of its provider go real-time, with one warning; returns
    whether any did (sent by ``_send_rerouted`` once the real-time half beside this one is done)."""
    rerouted = await jobs.learn_no_batch_api(run, job_id=job_id, error=error, because=because, providers=providers)
    if rerouted:
        get_run_logger().warning("%s: %s routed to the Batch API go real-time instead.", because,
                                 counted(rerouted, "prompt"))
    return rerouted > 0


async def _send_rerouted(run: JobRun, *, job_id: str, realtime_done: asyncio.Event | None,
                         summary: BatchHalfSummary) -> None:
    """Send real-time what was re-routed there, once the real-time half beside this one is done with its own
    prompts (so no prompt is picked up by both)."""
    if realtime_done is not None:
        await realtime_done.wait()
    sent = await send_rerouted(run, job_id=job_id)
    if sent is not None:
        summary.realtime_fallback += sent.prompts
        summary.budget_reached |= sent.budget is not None and sent.budget.stopped


def endpoint_words(error: BaseException) -> str:
    """The endpoint a 404 came from, as its message names it (``HTTP 404 from POST /files``...)."""
    return " ".join(str(jobs.first_error(error)).split(" after ", 1)[0].split()[2:]) or "this endpoint"


async def dispatch_batches(
    *,
    run: JobRun,
    job_id: str,
    wait: bool,
    retry_failed: RetryFailed = "retryable",
    realtime_done: asyncio.Event | None = None,
) -> BatchHalfSummary:
    """The batch half of ``dispatch``: finish submissions a crash left behind, submit the job's open
    batch-routed prompts, and with ``wait`` follow every batch to the end (each round's batches in one
    ``wait-for-batches`` sub-flow run), resubmitting and falling back to real-time as the ingests decide, until
    nothing is open.

    Fallbacks to real-time wait for ``realtime_done`` (the real-time half running beside this one), so
    no prompt is picked up by both.
    """
    logger = get_run_logger()
    settings, sessions = run.settings, run.sessions
    started = time.monotonic()
    summary = BatchHalfSummary()
    # Prompts of a provider whose endpoint has no Batch API go real-time; the other providers' still go in batches.
    around = False
    for provider, why in (await jobs.known_without_batch_api(run, providers=BATCH_PROVIDERS)).items():
        around |= await _route_around(run, job_id=job_id, error=None, because=f"{why}; sent real-time",
                                      providers=frozenset({provider}))
    # Half-submitted batches: a crash's, or other providers' cut short by one endpoint's 404.
    finish_left = True
    for round_ in range(settings.batch_max_submissions + 1):
        retry = retry_failed if round_ == 0 else "none"
        try:
            if finish_left:
                finish_left = False
                for record in await storage.unfinished_batches(sessions, job_id=job_id):
                    if record.status in HALF_SUBMITTED_BATCH_STATUSES:
                        await finish_submission(run=run, batch_id=record.id)
            size = await storage.unfinished_prompt_count(sessions, job_id=job_id, planned_route="batch",
                                                         retry_failed=retry)
            submitted = await submit_batches(run=run, job_id=job_id, retry_failed=retry, size=size) if size else None
        except Exception as exc:
            if not jobs.is_missing_batch_api(exc):
                raise
            because = f"no Batch API at this endpoint ({endpoint_words(exc)} answered 404); sent real-time"
            around |= await _route_around(run, job_id=job_id, error=exc, because=because)
            finish_left = True
            continue  # the next round submits what other providers' endpoints take
        if submitted is not None:
            summary.submitted.add(submitted)
            logger.info("Job %s: %s sent to the Batch API in %s (%s); %d answered from storage.", job_id,
                        counted(submitted.prompts, "prompt"), counted(len(submitted.batch_ids), "batch", many="batches"),
                        counted(submitted.lines, "request"), submitted.reused)
            # Cut to what the budget holds: the rest waits for money the batches out give back, or a higher budget.
            summary.budget_reached = submitted.over_budget > 0
            if submitted.over_budget:
                logger.warning("Job %s: %s routed to batches wait: their worst case does not fit the budget.", job_id,
                               counted(submitted.over_budget, "prompt"))
        if not wait:
            break
        waiting = [batch.id for batch in await storage.unfinished_batches(sessions, job_id=job_id)]
        if not waiting:
            break
        summary.rounds += 1
        # Imported here: a run that does not wait builds no flow but its own.
        from ._batch_wait import wait_for_batches

        summary.ingested.extend(await wait_for_batches(run=run, job_id=job_id, batch_ids=waiting))
        if await _rerouted(run, job_id=job_id):
            # Re-routed by the ingests (deadline, or too many batches): real-time now.
            await _send_rerouted(run, job_id=job_id, realtime_done=realtime_done, summary=summary)
    if around:
        await _send_rerouted(run, job_id=job_id, realtime_done=realtime_done, summary=summary)
    summary.wall_s = time.monotonic() - started
    return summary


async def send_rerouted(run: JobRun, *, job_id: str) -> RealtimeSummary | None:
    """Send real-time the job's pending prompts routed (or re-routed by an ingest) real-time (its ``prompts``: how
    many); None when there were none.

    In-flight ones are left alone: another live run is sending them. The job's budget (``run_budget``) holds as it
    does for the run that left them.
    """
    late = await _rerouted(run, job_id=job_id)
    if late:
        job = RecordedJob(job_id=job_id, total=late, resumed=True)
        held = await run_budget(run.settings, sessions=run.sessions, job_id=job_id)
        return await send_realtime(run=run, job=job, selection=REROUTED, budget=held)
    return None


async def _rerouted(run: JobRun, *, job_id: str) -> int:
    return await storage.unfinished_prompt_count(run.sessions, job_id=job_id, retry_failed=REROUTED.retry_failed,
                                           planned_route=REROUTED.planned_route, in_flight=REROUTED.in_flight)
