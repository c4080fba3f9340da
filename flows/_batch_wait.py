"""Flow ``wait-for-batches``, the polling sub-flow of a run that waits: every batch of a round followed in one
sub-flow run under the run's, with one progress artifact. Imported when a run first waits, so a run that does not
builds no flow of it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from prefect import flow, get_run_logger

from llm_dispatch import jobs, storage
from llm_dispatch.jobs import IngestOutcome, JobRun
from llm_dispatch.tasks import ingest_batch

from ._artifacts import BatchBoard
from ._setup import wait_run_name


# validate_parameters=False: ``run`` is the parent's, handed over in-process as it is (the UI shows it as
# ``<JobRun>``); pydantic would rebuild it field by field.
@flow(name="wait-for-batches", flow_run_name=wait_run_name, log_prints=False, validate_parameters=False)
async def wait_for_batches(run: JobRun, job_id: str, batch_ids: list[int]) -> list[IngestOutcome]:
    """Follow the batches ``batch_ids`` of job ``job_id`` to their end in one loop, returning each ingest's outcome.

    Each round moves every open batch one step (``jobs.advance_batch``: plain polls, no task run each, so hundreds
    of batches make no load on the Prefect API; an ``ingest-batch`` task for each that finished), then waits
    ``jobs.poll_wait`` (growing from ``batch_poll_interval`` to ``batch_poll_max_interval``). A batch's error is
    kept on it and it is polled again next round, the others going on; after ``FOLLOW_ERRORS`` in a row, or
    ``batch_grace`` past its expiry, it is left to ``collect-batches``. A lost batch's prompts are pending again
    for the caller's next round.
    """
    logger = get_run_logger()
    grace = timedelta(seconds=run.settings.batch_grace)
    following = {batch_id: await storage.require_batch(run.sessions, batch_id=batch_id) for batch_id in batch_ids}
    outcomes: list[IngestOutcome] = []
    board = BatchBoard(total=len(following), logger=logger)

    polls = 0
    while following:
        for batch_id, record in list(following.items()):
            step = await jobs.advance_batch(run=run, record=record, ingest=ingest_batch, grace=grace,
                                            leave_after_errors=jobs.FOLLOW_ERRORS)
            if step.problem is not None:
                logger.error(step.problem.line)
            if step.ingested is not None:
                outcomes.append(step.ingested)
            if step.happened == "left":
                logger.warning("Batch %d of job %s left to collect-batches: %s.", batch_id, job_id[:8], step.why)
            if step.following:
                following[batch_id] = step.record
            else:
                del following[batch_id]
        await board.show(following=following.values(), done=len(outcomes))
        if following:
            await asyncio.sleep(jobs.poll_wait(polls, settings=run.settings))
            polls += 1
    return outcomes
