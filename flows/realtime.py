"""Flow ``realtime-dispatch``: a file or list of prompts out as concurrent chat completions, into SQL."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.utilities.annotations import quote
from pydantic import SecretStr

import storage
from llm_dispatch import ConfigError, LLMClient, Settings
from llm_dispatch._dispatch import DispatchOutcome, current_progress
from tasks import plan_realtime, record_prompts, send_chunk

from ._setup import ensure_tag_limit, tune_gc, with_api_key


# Chunk task runs started beyond the lanes, ready to send the moment a lane frees.
CHUNKS_AHEAD = 1


def build_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with the flow's explicit parameters on top (``None`` = not given)."""
    return Settings(**{key: value for key, value in overrides.items() if value is not None})


@flow(name="realtime-dispatch", log_prints=False)
async def realtime_dispatch(
    prompts: str | list[dict[str, Any]] | None = None,
    job_id: str | None = None,
    model: str | None = None,
    concurrency: int | None = None,
    chunk_size: int | None = None,
    chunk_concurrency: int | None = None,
    concurrency_tag: str | None = None,
    dedupe: bool | None = None,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    base_url: str | None = None,
    database_url: SecretStr | None = None,
    planned_route: Literal["realtime", "batch"] | None = None,
    shard: int | None = None,
    shards: int | None = None,
) -> dict[str, Any]:
    """Send every unfinished prompt of the input (or of job ``job_id``) as real-time calls.

    Re-running the same input, or passing ``job_id``, resumes: a prompt that succeeded is never
    sent again, and an identical request already answered is reused unless ``dedupe`` is False.
    ``planned_route`` sends only prompts routed there; ``shard``/``shards`` only one share of them
    (the ``dispatch`` flow's scale-out across workers runs one shard per deployment run).
    """
    settings = build_settings(
        model=model, concurrency=concurrency, chunk_size=chunk_size, chunk_concurrency=chunk_concurrency,
        concurrency_tag=concurrency_tag, dedupe=dedupe, base_url=base_url,
        # A SecretStr parameter reaches the Prefect API as '**********', so a password in the URL stays here.
        database_url=database_url.get_secret_value() if database_url is not None else None,
    )
    if (shard is None) != (shards is None):
        raise ConfigError("give both shard and shards, or neither")
    return await dispatch_realtime(source=prompts, job_id=job_id, settings=settings, retry_failed=retry_failed,
                                   planned_route=planned_route,
                                   shard=(shard, shards) if shard is not None and shards is not None else None)


async def dispatch_realtime(
    *,
    source: str | Sequence[Mapping[str, Any]] | None,
    job_id: str | None,
    settings: Settings,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    planned_route: str | None = None,
    in_flight: bool = True,
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The recipe behind ``realtime-dispatch``; callable from other flows with ready settings.

    ``planned_route="realtime"`` sends only the prompts routed real-time (the ``dispatch`` flow's
    share); None sends every unfinished prompt that is not waiting in a batch. ``in_flight=False``
    leaves alone prompts marked in flight (a sweep must not take over another live run's work).
    """
    logger = get_run_logger()
    started = time.monotonic()
    settings = await with_api_key(settings)
    await ensure_tag_limit(settings, logger=logger)
    tune_gc()
    engine = storage.create_engine(settings.database_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job = await record_prompts(source=quote(source), job_id=job_id, settings=settings, sessions=sessions)
        recorded_s = time.monotonic() - started
        await storage.set_job_status(sessions, job_id=job.job_id, status="running")
        outcome = DispatchOutcome()
        async with storage.ResultWriter(sessions, job_id=job.job_id) as writer, LLMClient.from_settings(settings) as client:
            plan = await plan_realtime(
                job_id=job.job_id, sessions=sessions, sink=writer, chunk_size=settings.chunk_size,
                dedupe=settings.dedupe, retry_failed=retry_failed, planned_route=planned_route,
                in_flight=in_flight, shard=shard,
            )
            planned_s = time.monotonic() - started
            logger.info(
                "job %s: %d unfinished prompts, %d answered from storage, %d requests in %d chunks",
                job.job_id, plan.open_prompts, plan.reused, plan.requests, len(plan.chunks),
            )
            per_chunk = settings.per_chunk_concurrency
            # Lanes: chunks handing out requests, enough to fill the run's limit. A chunk leaves its lane
            # when its last round is on the way, so the next one starts sending while it drains.
            # Begun: chunk task runs started and not yet done handing out. One more than the lanes, so the
            # next chunk's task run (its start costs tens of ms, now and then seconds when the Prefect API
            # is slow) is up and its rows loaded before a lane frees: it waits inside, holding its tag slot.
            lane_count = math.ceil(settings.concurrency / per_chunk)
            lanes = asyncio.Semaphore(lane_count)
            begun = asyncio.Semaphore(lane_count + CHUNKS_AHEAD)
            tagged = send_chunk.with_options(tags=[settings.concurrency_tag])

            async def run_chunk(number: int, groups: list[tuple[int, ...]]) -> None:
                await begun.acquire()
                entered = released = False

                async def enter_lane() -> None:
                    nonlocal entered
                    await lanes.acquire()
                    entered = True

                def leave_lane() -> None:
                    nonlocal released
                    if not released:
                        released = True
                        begun.release()
                        if entered:
                            lanes.release()

                try:
                    chunk_outcome = await tagged(
                        # quote(): Prefect would otherwise walk every id of the chunk looking for futures, twice
                        # per task run (~50 ms of CPU for 1,000 prompts, measured), while requests wait.
                        number=number, of=len(plan.chunks), size=sum(len(g) for g in groups), groups=quote(groups),
                        client=client, sink=writer, sessions=sessions, concurrency=per_chunk,
                        before_send=enter_lane, on_dispatched=leave_lane,
                    )
                finally:
                    leave_lane()
                outcome.add(chunk_outcome)
                await board.update(outcome)

            progress = current_progress.get()
            if progress is not None:
                progress.total, progress.started_at = plan.requests, time.monotonic()
            send_started_at = time.monotonic()
            board = await _ProgressBoard.start(job_id=job.job_id, prompts=plan.open_prompts - plan.reused,
                                               chunks=len(plan.chunks))
            async with asyncio.TaskGroup() as group:
                for number, groups in enumerate(plan.chunks, start=1):
                    group.create_task(run_chunk(number, groups))
            send_s = time.monotonic() - send_started_at
        counts = await storage.job_counts(sessions, job_id=job.job_id)
        # Prompts waiting in a provider batch are unfinished too.
        finished = not any(counts.get(status, 0) for status in ("pending", "in_flight", "batched"))
        await storage.set_job_status(sessions, job_id=job.job_id, status="finished" if finished else "running")
        stats = await storage.result_stats(sessions, job_id=job.job_id)
        summary = {
            "job_id": job.job_id,
            "resumed": job.resumed,
            "prompts": job.total,
            "sent_prompts": outcome.succeeded + outcome.failed,
            "reused": plan.reused,
            "counts": counts,
            "failed_by_class": dict(outcome.failed_by_class),
            "wall_s": round(time.monotonic() - started, 3),
            "send_s": round(send_s, 3),
            "phases_s": {"record": round(recorded_s, 3), "plan": round(planned_s - recorded_s, 3), "send": round(send_s, 3)},
            "stats": stats.as_dict(),
        }
        logger.info("job %s done: %s", job.job_id, counts)
        return summary
    finally:
        await engine.dispose()


class _ProgressBoard:
    """The real-time half's progress artifact in the Prefect UI, updated as each chunk ends."""

    # Each update is a write to the Prefect API; on a SQLite-backed server writes contend (503s, 2 s back-offs).
    MIN_INTERVAL = 2.0

    def __init__(self, artifact: Any, *, prompts: int, chunks: int) -> None:
        self._artifact, self._prompts, self._chunks, self._finished = artifact, prompts, chunks, 0
        self._last = time.monotonic()

    @classmethod
    async def start(cls, *, job_id: str, prompts: int, chunks: int) -> _ProgressBoard:
        artifact = None
        if prompts:
            artifact = await acreate_progress_artifact(
                progress=0.0, description=f"job {job_id}: real-time, {prompts} prompts in {chunks} chunks")
        return cls(artifact, prompts=prompts, chunks=chunks)

    async def update(self, outcome: DispatchOutcome) -> None:
        self._finished += 1
        if self._artifact is None:
            return
        if self._finished < self._chunks and time.monotonic() - self._last < self.MIN_INTERVAL:
            return
        self._last = time.monotonic()
        done = outcome.succeeded + outcome.failed
        await aupdate_progress_artifact(
            artifact_id=self._artifact, progress=min(100.0, 100.0 * done / self._prompts),
            description=(f"real-time: {outcome.succeeded} succeeded / {outcome.failed} failed / {self._prompts} "
                         f"prompts; {self._finished} of {self._chunks} chunks done"),
        )
