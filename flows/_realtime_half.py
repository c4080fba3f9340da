"""The real-time half of a run (``send_realtime``), shared by the ``realtime-dispatch`` flow, ``dispatch`` and the
batch half's fallbacks; no flow is defined here, so importing it builds none."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger

from llm_dispatch import storage
from llm_dispatch.jobs import (
    ChunkFeed,
    ChunkSender,
    JobRun,
    RealtimeSummary,
    RecordedJob,
    Selection,
    budget_standing,
    describe_outcome,
    describe_plan,
    explicit_caches,
    plan_run_caches,
)
from llm_dispatch.core import RoutingRules, RunStop, Settings, counted, current_progress, unfinished
from llm_dispatch.tasks import chunk_sender

from ._artifacts import ProgressBoard, job_label


async def send_realtime(
    *,
    run: JobRun,
    job: RecordedJob,
    selection: Selection = Selection(),
    started: float | None = None,
    budget: storage.BudgetInfo | None = None,
    job_stats: bool = True,
    rules: RoutingRules | None = None,
    on_stored: Callable[[], object] | None = None,
) -> RealtimeSummary:
    """The real-time half of a run: the unfinished prompts of ``job`` that ``selection`` takes, sent
    chunk by chunk, each answer stored. A job still being recorded (``job.rest``) has the rest stored
    as its first chunks go out. ``started``: when the run began, for its phases. ``budget``: held before each
    request (a ``storage.BudgetLease``); once the next does not fit, the requests out finish and the rest stay
    pending. ``job_stats``: False leaves the job's result statistics (a pass over all its results) to a caller
    that reads the job's report anyway once its other half is done (``dispatch``, which puts the report's in).
    ``rules`` route the rest of a job still being recorded as its first prompts were (None: all real-time);
    ``on_stored`` is called once the whole job is stored (the batch half waits for it).
    """
    logger = get_run_logger()
    settings = run.settings
    begun = time.monotonic()
    started = begun if started is None else started
    progress = current_progress.get()
    stop = RunStop(provider_of=run.clients.provider_of)
    # Outside the writer: what the writer stores on its way out is settled before the lease gives back the rest.
    lease = None if budget is None else storage.BudgetLease(run.sessions, budget=budget, prices=run.prices,
                                                            job_id=job.job_id, block=settings.concurrency)
    async with (lease if lease is not None else contextlib.nullcontext()), storage.ResultWriter(
            run.sessions, job_id=job.job_id, prices=run.prices, budget=lease) as writer:
        board = ProgressBoard(job=job_label(name=job.name, job_id=job.job_id), logger=logger)
        cache_plan = None
        if settings.cache_plan:
            cache_plan = await plan_run_caches(sessions=run.sessions, job_id=job.job_id, selection=selection,
                                               prices=run.prices, provider_of=run.clients.providers.cache_rules_of,
                                               concurrency=settings.concurrency)
            explicit_caches(cache_plan, sessions=run.sessions, job_id=job.job_id, prices=run.prices,
                            client_of=run.clients.for_model, lease=lease, shard=selection.shard)
            for line in describe_plan(cache_plan):
                logger.info("Job %s: %s", job.job_id, line)
                if progress is not None:
                    progress.notes.append(line)
        sender = ChunkSender(
            send=chunk_sender(tag=settings.concurrency_tag), client=run.clients, writer=writer, sessions=run.sessions,
            concurrency=settings.concurrency, per_chunk=settings.per_chunk_concurrency, on_chunk_done=board.update,
            max_reasks=settings.max_reasks,
            stop=stop, budget=lease, cache_plan=cache_plan,
        )
        feed = ChunkFeed(
            job=job, sessions=run.sessions, sink=writer, chunk_size=settings.chunk_size, dedupe=settings.dedupe,
            selection=selection, before_storing=sender.sending.wait, rules=rules, on_stored=on_stored,
        )
        first_at: float | None = None
        # The explicit caches are deleted once the chunks are done, however the sending ends (else at their TTL).
        explicit = cache_plan.explicit if cache_plan is not None else None
        async with (explicit if explicit is not None else contextlib.nullcontext()), sender:
            async for chunk in feed:
                if (lease is not None and lease.exhausted) or (
                        job.providers and all(stop.provider_stopped(provider) for provider in job.providers)):
                    if job.rest:
                        continue  # the feed still stores the rest of the job, to be sent by the next run
                    break
                if first_at is None:
                    first_at = time.monotonic()
                    _log_plan(logger, job=job, feed=feed)
                    if progress is not None:
                        progress.started_at = first_at
                await sender.start(chunk, of=feed.expected_chunks)
                board.retotal(prompts=feed.expected_prompts, chunks=feed.expected_chunks)
                board.open()
                if progress is not None:
                    progress.total = feed.expected_requests
        sent_at = time.monotonic()
        for line in describe_outcome(cache_plan) if cache_plan is not None else ():
            logger.info("Job %s: %s", job.job_id, line)
    counts, _, stats = await asyncio.gather(
        storage.job_counts(run.sessions, job_id=job.job_id), board.close(sender.outcome),
        storage.result_stats(run.sessions, job_id=job.job_id) if job_stats else _no_stats())
    await storage.set_job_status(run.sessions, job_id=job.job_id,
                                 status="running" if unfinished(counts) else "finished")
    outcome = sender.outcome
    first_at = sent_at if first_at is None else first_at
    sent = outcome.succeeded + outcome.refused + outcome.failed
    logger.info("Job %s: %s sent, %d succeeded, %d refused, %d failed; %d answered from storage; %d left "
                "unfinished.", job.job_id, counted(sent, "prompt"), outcome.succeeded, outcome.refused, outcome.failed,
                feed.reused, unfinished(counts))
    stopped = [{"scope": found.scope, "error_class": type(found.error).__name__, "answers": found.answers,
                "message": found.describe()} for found in stop.stopped.values()]
    # This run's prompts that were neither answered nor failed: left pending by the stop.
    left = max(0, feed.expected_prompts - sent) if stopped else 0
    for found in stopped:
        logger.warning("Job %s: %s", job.job_id, found["message"])
    if stopped:
        logger.warning("Job %s: %s left pending; fix that, then run the same input again to send them.",
                       job.job_id, counted(left, "prompt"))
    standing = None
    if budget is not None:
        unfunded = max(outcome.over_budget, feed.expected_prompts - sent - left) if lease and lease.exhausted else 0
        standing = await budget_standing(run.sessions, budget=budget, over_budget=unfunded)
        if standing is not None and standing.stopped:
            logger.warning("Job %s: %s; %s left pending: run it again with a higher budget to send them.",
                           job.job_id, standing.describe(), counted(unfunded, "prompt"))
    return RealtimeSummary(
        job_id=job.job_id, resumed=job.resumed, prompts=job.total, sent_prompts=sent,
        reused=feed.reused, counts=counts, failed_by_class=dict(outcome.failed_by_class), stats=stats,
        stopped=stopped, left=left, budget=standing,
        wall_s=time.monotonic() - started, send_s=sent_at - first_at,
        phases_s={"record": begun - started, "plan": first_at - begun, "send": sent_at - first_at},
    )


def _log_plan(logger: Any, *, job: RecordedJob, feed: ChunkFeed) -> None:
    later = f"; the other {feed.unplanned} are planned as they are stored" if feed.unplanned else ""
    logger.info("Job %s: sending %s as %s in %s, %d answered from storage%s.", job.job_id,
                counted(feed.prompts, "prompt"), counted(feed.requests, "request"), counted(feed.chunks, "chunk"),
                feed.reused, later)


async def _no_stats() -> storage.ResultStats:
    """A run whose caller reads the job's statistics itself, once both halves are done."""
    return storage.ResultStats()


def lane_count(settings: Settings) -> int:
    """Chunks sending at once in a run: enough to fill its concurrency at ``per_chunk_concurrency`` each."""
    return math.ceil(settings.concurrency / settings.per_chunk_concurrency)
