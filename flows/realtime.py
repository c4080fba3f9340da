"""Flow ``realtime-dispatch``: a file or list of prompts out as concurrent chat completions, into SQL."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from prefect import flow, get_run_logger
from pydantic import SecretStr

import storage
from llm_dispatch import ConfigError, LLMClient, Settings
from llm_dispatch._dispatch import DispatchOutcome, current_progress
from tasks import plan_realtime, record_prompts, send_chunk

from ._setup import ensure_tag_limit, with_api_key


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
    engine = storage.create_engine(settings.database_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job = await record_prompts(source=source, job_id=job_id, settings=settings, sessions=sessions)
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
            # Chunks still handing out requests, enough to fill the run's limit. A chunk leaves this
            # gate when its last round is on the way, so the next one starts up (task run, rows)
            # while it drains, and the limit never idles between chunks.
            gate = asyncio.Semaphore(math.ceil(settings.concurrency / per_chunk))
            tagged = send_chunk.with_options(tags=[settings.concurrency_tag])

            async def run_chunk(number: int, groups: list[tuple[int, ...]]) -> None:
                await gate.acquire()
                released = False

                def release() -> None:
                    nonlocal released
                    if not released:
                        released = True
                        gate.release()

                try:
                    chunk_outcome = await tagged(
                        number=number, of=len(plan.chunks), size=sum(len(g) for g in groups), groups=groups,
                        client=client, sink=writer, sessions=sessions, concurrency=per_chunk, on_dispatched=release,
                    )
                finally:
                    release()
                outcome.add(chunk_outcome)

            progress = current_progress.get()
            if progress is not None:
                progress.total, progress.started_at = plan.requests, time.monotonic()
            send_started = time.monotonic()
            async with asyncio.TaskGroup() as group:
                for number, groups in enumerate(plan.chunks, start=1):
                    group.create_task(run_chunk(number, groups))
            send_s = time.monotonic() - send_started
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
            "stats": stats.as_dict() if hasattr(stats, "as_dict") else stats,
        }
        logger.info("job %s done: %s", job.job_id, counts)
        return summary
    finally:
        await engine.dispose()
