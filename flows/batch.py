"""Flows for the Batch API: ``wait-for-batch`` (one batch to the end) and ``collect-batches`` (one sweep
over every open batch, for a schedule), and ``dispatch_batches``, the batch half of ``dispatch``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from pydantic import SecretStr

import storage
from llm_dispatch import ConfigError, LLMClient, Settings
from tasks import finish_submission, ingest, submit_batches
from tasks.batch_collect import cancel_batches, poll_batch

from ._setup import tune_gc, with_api_key
from .realtime import build_settings, dispatch_realtime

# Settings a flow hands its sub-flows as plain parameters: everything public (no key, no database URL).
_PRIVATE = frozenset({"api_key", "database_url"})
POLL_GROWTH = 1.5


def public_overrides(settings: Settings) -> dict[str, Any]:
    """The settings as JSON-ready flow parameters; the key stays in the environment, the URL goes as a SecretStr."""
    return settings.model_dump(mode="json", exclude=set(_PRIVATE))


def settings_from(overrides: Mapping[str, Any] | None, database_url: SecretStr | None) -> Settings:
    values = {key: value for key, value in (overrides or {}).items() if key not in _PRIVATE}
    return build_settings(**values, database_url=database_url.get_secret_value() if database_url else None)


@flow(name="wait-for-batch", flow_run_name="wait for batch {batch_id}", log_prints=False)
async def wait_for_batch(
    batch_id: int,
    database_url: SecretStr | None = None,
    settings_overrides: dict[str, Any] | None = None,
    ingest_when_done: bool = True,
) -> dict[str, Any]:
    """Poll one batch until the provider is done with it (interval growing from ``batch_poll_interval``
    to ``batch_poll_max_interval``), keeping a progress artifact current; then ingest its output.

    Gives up, leaving the batch to ``collect-batches``, once ``batch_grace`` seconds pass its expiry.
    """
    settings = settings_from(settings_overrides, database_url)
    return await follow_batch(batch_id=batch_id, settings=settings, ingest_when_done=ingest_when_done)


async def follow_batch(*, batch_id: int, settings: Settings, ingest_when_done: bool = True) -> dict[str, Any]:
    logger = get_run_logger()
    settings = await with_api_key(settings)
    tune_gc()
    engine = storage.create_engine(settings.database_url)
    try:
        sessions = storage.session_factory(engine)
        async with LLMClient.from_settings(settings) as client:
            record = await storage.get_batch(sessions, batch_id=batch_id)
            if record is None:
                raise LookupError(f"no batch {batch_id} in the database; see `llm-dispatch status`")
            if record.status in ("preparing", "uploaded"):
                record = await finish_submission(batch_id=batch_id, sessions=sessions, client=client)
            artifact = None
            interval = settings.batch_poll_interval
            grace = timedelta(seconds=settings.batch_grace)
            while record.status in storage.OPEN_PROVIDER_BATCH_STATUSES:
                record = await poll_batch(sessions=sessions, client=client, record=record)
                artifact = await _show_progress(record, artifact)
                if record.status not in storage.OPEN_PROVIDER_BATCH_STATUSES:
                    break
                if record.expires_at is not None and datetime.now(UTC) > record.expires_at + grace:
                    logger.warning("batch %d is still %s %s after its expiry; leaving it to collect-batches",
                                   batch_id, record.status, grace)
                    return {"batch_id": batch_id, "status": record.status, "gave_up": True}
                await asyncio.sleep(interval)
                interval = min(interval * POLL_GROWTH, settings.batch_poll_max_interval)
            if record.status in storage.TERMINAL_PROVIDER_BATCH_STATUSES and ingest_when_done:
                outcome = await ingest(batch_id=batch_id, sessions=sessions, client=client, settings=settings)
                return outcome.as_dict()
            return {"batch_id": batch_id, "status": record.status}
    finally:
        await engine.dispose()


async def _show_progress(record: storage.BatchRecord, artifact: Any) -> Any:
    done = record.request_completed + record.request_failed
    progress = 100.0 * done / record.request_total if record.request_total else 0.0
    description = (
        f"batch {record.id} ({record.provider_batch_id}, {record.model}): {record.status}; "
        f"completed {record.request_completed} / failed {record.request_failed} / total {record.request_total}"
    )
    if artifact is None:
        return await acreate_progress_artifact(progress=progress, description=description)
    await aupdate_progress_artifact(artifact_id=artifact, progress=progress, description=description)
    return artifact


async def dispatch_batches(
    *,
    job_id: str,
    settings: Settings,
    wait: bool,
    retry_failed: Literal["retryable", "all", "none"] = "retryable",
    realtime_done: asyncio.Event | None = None,
) -> dict[str, Any]:
    """The batch half of ``dispatch``: finish submissions a crash left behind, submit the job's open
    batch-routed prompts, and with ``wait`` follow every batch to the end (``wait-for-batch`` sub-flows,
    concurrently), resubmitting and falling back to real-time as the ingests decide, until nothing is open.

    Fallbacks to real-time wait for ``realtime_done`` (the real-time half running beside this one), so
    no prompt is picked up by both.
    """
    logger = get_run_logger()
    started = time.monotonic()
    engine = storage.create_engine(settings.database_url)
    summary: dict[str, Any] = {"submitted_batches": 0, "submitted_prompts": 0, "reused": 0, "rounds": 0,
                               "ingested": [], "realtime_fallback": 0}
    try:
        sessions = storage.session_factory(engine)
        async with LLMClient.from_settings(settings) as client:
            for record in await storage.open_batches(sessions, job_id=job_id):
                if record.status in ("preparing", "uploaded"):
                    await finish_submission(batch_id=record.id, sessions=sessions, client=client)
            for round_ in range(settings.batch_max_submissions + 1):
                ids = await storage.open_prompt_ids(
                    sessions, job_id=job_id, retry_failed=retry_failed if round_ == 0 else "none",
                    planned_route="batch")
                if ids:
                    async with storage.ResultWriter(sessions, job_id=job_id) as writer:
                        submitted = await submit_batches(
                            size=len(ids), job_id=job_id, prompt_ids=ids, sessions=sessions, client=client,
                            writer=writer, settings=settings)
                    summary["submitted_batches"] += len(submitted.batch_ids)
                    summary["submitted_prompts"] += submitted.prompts
                    summary["reused"] += submitted.reused
                    logger.info("job %s: %d prompts in %d new batches (%d lines), %d answered from storage",
                                job_id, submitted.prompts, len(submitted.batch_ids), submitted.lines, submitted.reused)
                if not wait:
                    break
                waiting = [b.id for b in await storage.open_batches(sessions, job_id=job_id)]
                if not waiting:
                    break
                summary["rounds"] += 1
                public, url = public_overrides(settings), SecretStr(settings.database_url)
                outcomes = await asyncio.gather(*(
                    wait_for_batch(batch_id=batch_id, database_url=url, settings_overrides=public)
                    for batch_id in waiting))
                summary["ingested"].extend(outcomes)
                rerouted = await storage.open_prompt_ids(sessions, job_id=job_id, retry_failed="none",
                                                         planned_route="realtime", in_flight=False)
                if rerouted:
                    # Re-routed by the ingests (deadline, or too many batches): real-time now, once the
                    # real-time half beside this one is done with its own prompts.
                    if realtime_done is not None:
                        await realtime_done.wait()
                    summary["realtime_fallback"] += await _send_rerouted(sessions, job_id=job_id, settings=settings)
    finally:
        await engine.dispose()
    summary["wall_s"] = round(time.monotonic() - started, 3)
    return summary


@flow(name="collect-batches", log_prints=False)
async def collect_batches(
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    job_id: str | None = None,
    stale_after: float = 600.0,
) -> dict[str, Any]:
    """One sweep over every open batch (of one job, or all): poll each once, ingest what finished,
    resubmit or send real-time what the ingests released. Meant for a schedule (every 15 minutes),
    so no process has to wait out a 24-hour window.

    A batch stuck in ``preparing``/``uploaded`` is finished only once it has not changed for
    ``stale_after`` seconds: younger ones may belong to a run that is submitting them right now.
    """
    settings = build_settings(base_url=base_url,
                              database_url=database_url.get_secret_value() if database_url else None)
    return await sweep(settings=settings, job_id=job_id, stale_after=stale_after)


async def sweep(*, settings: Settings, job_id: str | None, stale_after: float) -> dict[str, Any]:
    logger = get_run_logger()
    settings = await with_api_key(settings)
    tune_gc()
    engine = storage.create_engine(settings.database_url)
    summary: dict[str, Any] = {"open": 0, "polled": 0, "ingested": [], "resubmitted": 0, "realtime": 0,
                               "skipped_recent": 0}
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        touched: set[str] = set()
        async with LLMClient.from_settings(settings) as client:
            records = await storage.open_batches(sessions, job_id=job_id)
            summary["open"] = len(records)
            cutoff = datetime.now(UTC) - timedelta(seconds=stale_after)
            for record in records:
                if record.status in ("preparing", "uploaded"):
                    if record.updated_at > cutoff:
                        summary["skipped_recent"] += 1
                        continue
                    record = await finish_submission(batch_id=record.id, sessions=sessions, client=client)
                    touched.add(record.job_id)
                    continue
                if record.status in storage.OPEN_PROVIDER_BATCH_STATUSES:
                    record = await poll_batch(sessions=sessions, client=client, record=record)
                    summary["polled"] += 1
                if record.status in storage.TERMINAL_PROVIDER_BATCH_STATUSES:
                    outcome = await ingest(batch_id=record.id, sessions=sessions, client=client, settings=settings)
                    summary["ingested"].append(outcome.as_dict())
                    touched.add(record.job_id)
            for job in sorted(touched):
                ids = await storage.open_prompt_ids(sessions, job_id=job, retry_failed="none", planned_route="batch")
                if ids:
                    async with storage.ResultWriter(sessions, job_id=job) as writer:
                        submitted = await submit_batches(size=len(ids), job_id=job, prompt_ids=ids, sessions=sessions,
                                                         client=client, writer=writer, settings=settings)
                    summary["resubmitted"] += submitted.prompts
                summary["realtime"] += await _send_rerouted(sessions, job_id=job, settings=settings)
                await _close_if_done(sessions, job)
        logger.info("collect-batches: %s", {k: v for k, v in summary.items() if k != "ingested"})
        return summary
    finally:
        await engine.dispose()


async def _send_rerouted(sessions: Any, *, job_id: str, settings: Settings) -> int:
    """Send real-time the job's pending prompts routed (or re-routed by an ingest) real-time; returns how many.

    In-flight ones are left alone: another live run is sending them.
    """
    late = await storage.open_prompt_ids(sessions, job_id=job_id, retry_failed="none", planned_route="realtime",
                                         in_flight=False)
    if late:
        await dispatch_realtime(source=None, job_id=job_id, settings=settings, retry_failed="none",
                                planned_route="realtime", in_flight=False)
    return len(late)


async def _close_if_done(sessions: Any, job_id: str) -> None:
    counts = await storage.job_counts(sessions, job_id=job_id)
    if not any(counts.get(status, 0) for status in ("pending", "in_flight", "batched")):
        await storage.set_job_status(sessions, job_id=job_id, status="finished")


@flow(name="cancel-batches", flow_run_name="cancel batches of job {job_id}", log_prints=False)
async def cancel_job_batches(
    job_id: str,
    database_url: SecretStr | None = None,
    base_url: str | None = None,
    wait_seconds: float = 120.0,
) -> dict[str, Any]:
    """Cancel every open batch of a job, then (for up to ``wait_seconds``) wait for the provider to stop
    them and ingest what they completed; whatever is left, ``collect-batches`` finishes."""
    settings = await with_api_key(build_settings(
        base_url=base_url, database_url=database_url.get_secret_value() if database_url else None))
    engine = storage.create_engine(settings.database_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        if await storage.get_job(sessions, job_id=job_id) is None:
            raise ConfigError(f"no job {job_id!r} in {settings.public_dict()['database_url']}; "
                              "`llm-dispatch status` lists jobs")
        async with LLMClient.from_settings(settings) as client:
            records = await cancel_batches(sessions=sessions, client=client, job_id=job_id)
            deadline = time.monotonic() + wait_seconds
            outcomes = []
            for record in records:
                while record.status in storage.OPEN_PROVIDER_BATCH_STATUSES and time.monotonic() < deadline:
                    await asyncio.sleep(min(1.0, settings.batch_poll_interval))
                    record = await poll_batch(sessions=sessions, client=client, record=record)
                if record.status in storage.TERMINAL_PROVIDER_BATCH_STATUSES:
                    outcome = await ingest(batch_id=record.id, sessions=sessions, client=client, settings=settings)
                    outcomes.append(outcome.as_dict())
            await _close_if_done(sessions, job_id)
        return {"job_id": job_id, "cancelled": [r.id for r in records], "ingested": outcomes}
    finally:
        await engine.dispose()
