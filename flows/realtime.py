"""Flow ``realtime-dispatch``: a file or list of prompts out as concurrent chat completions, into SQL."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import acreate_progress_artifact, aupdate_progress_artifact
from prefect.utilities.annotations import quote
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import storage
from llm_dispatch import ConfigError, LLMClient, Settings
from llm_dispatch._dispatch import DispatchOutcome, Progress, current_progress
from llm_dispatch._inputs import PromptSpec
from llm_dispatch._types import ChatRequest
from tasks import RealtimePlan, chunk_size_for, plan_realtime, record_prompts, record_rest, send_chunk

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
    per_chunk = settings.per_chunk_concurrency
    # Lanes: chunks handing out requests, enough to fill the run's limit (see _Chunks).
    lane_count = math.ceil(settings.concurrency / per_chunk)
    # A new job's first prompts go out while the others are stored: a chunk for each lane. (A shard
    # run sends a job recorded already.)
    head = settings.chunk_size * lane_count if shard is None else None
    engine = storage.create_engine(settings.database_url)
    try:
        await storage.migrate(engine)
        sessions = storage.session_factory(engine)
        job = await record_prompts(source=quote(source), job_id=job_id, settings=settings, sessions=sessions, head=head)
        recorded_s = time.monotonic() - started
        rest = job.rest
        if not rest:
            await storage.set_job_status(sessions, job_id=job.job_id, status="running")
        outcome = DispatchOutcome()
        async with storage.ResultWriter(sessions, job_id=job.job_id) as writer, LLMClient.from_settings(settings) as client:
            # The slices of a job recorded as it is sent are chunked alike (the first, a chunk per lane,
            # at the size asked for), and to at most MAX_CHUNKS_PER_RUN together.
            chunk_size = chunk_size_for(job.total, chunk_size=settings.chunk_size)
            # While the job is recorded, identical requests are grouped once all their prompts are stored.
            held = job.repeated_keys if settings.dedupe else frozenset()

            async def plan(
                *, size: int = chunk_size, positions: tuple[int, int] | None = None, only_keys: frozenset[str] | None = None
            ) -> RealtimePlan:
                return await plan_realtime(
                    job_id=job.job_id, sessions=sessions, sink=writer, chunk_size=size,
                    dedupe=settings.dedupe, retry_failed=retry_failed, planned_route=planned_route,
                    in_flight=in_flight, shard=shard, positions=positions, hold_keys=held if positions else frozenset(),
                    only_keys=only_keys, track_positions=bool(job.specs),
                )

            first = await plan(size=settings.chunk_size, positions=(0, job.stored) if rest else None)
            planned_s = time.monotonic() - started
            logger.info(
                "job %s: %d unfinished prompts, %d answered from storage, %d requests in %d chunks%s",
                job.job_id, first.open_prompts, first.reused, first.requests, len(first.chunks),
                f" (the first {job.stored} of {job.total} prompts; the others follow as they are stored)" if rest else "",
            )
            progress = current_progress.get()
            # Until every slice is planned, the totals count each unplanned prompt as one request.
            unplanned = len(rest) + first.held
            if progress is not None:
                progress.started_at = time.monotonic()
            send_started_at = time.monotonic()
            board = _ProgressBoard(job_id=job.job_id, logger=logger)
            chunks = _Chunks(
                send=send_chunk.with_options(tags=[settings.concurrency_tag]), client=client, writer=writer,
                sessions=sessions, per_chunk=per_chunk, lane_count=lane_count, chunk_size=chunk_size, outcome=outcome,
                board=board, progress=progress, specs=job.specs,
            )
            reused = first.reused
            failed: Exception | None = None
            async with asyncio.TaskGroup() as group:
                chunks.start(group, first, unplanned=unplanned)
                board.open(group)
                if rest:

                    async def stored(positions: tuple[int, int]) -> None:
                        nonlocal unplanned, reused
                        more = await plan(positions=positions)
                        unplanned += more.held - (positions[1] - positions[0])
                        reused += more.reused
                        chunks.start(group, more, unplanned=unplanned)

                    try:
                        if first.chunks:
                            # Storing the rest takes the event loop by turns: let the first requests go out before.
                            await chunks.sending.wait()
                        assert head is not None and job.recorded_at is not None
                        await record_rest(job_id=job.job_id, specs=quote(rest), sessions=sessions, first_slice=head,
                                          recorded_at=job.recorded_at, on_stored=stored, then_status="running")
                        if held:
                            last = await plan(only_keys=held)
                            reused += last.reused
                            chunks.start(group, last, unplanned=0)
                    except Exception as exc:  # noqa: BLE001 - raised below, once what was started has landed
                        # Raised here it would cancel requests in flight, paid for, their answers lost.
                        # The prompts not stored yet leave the job 'recording': the next run stores them.
                        failed = exc
            if failed is not None:
                raise failed
            send_s = time.monotonic() - send_started_at
        counts, stats, _ = await asyncio.gather(storage.job_counts(sessions, job_id=job.job_id),
                                                storage.result_stats(sessions, job_id=job.job_id), board.close(outcome))
        # Prompts waiting in a provider batch are unfinished too.
        finished = not any(counts.get(status, 0) for status in ("pending", "in_flight", "batched"))
        await storage.set_job_status(sessions, job_id=job.job_id, status="finished" if finished else "running")
        summary = {
            "job_id": job.job_id,
            "resumed": job.resumed,
            "prompts": job.total,
            "sent_prompts": outcome.succeeded + outcome.failed,
            "reused": reused,
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


class _Chunks:
    """A flow run's chunk task runs, taking turns so that its requests fill its limit and stay within it.

    Lanes: chunks handing out requests, enough to fill the run's limit. A chunk leaves its lane when
    its last round is on the way, so the next one starts sending while it drains. Begun: chunk task
    runs started and not yet done handing out; one more than the lanes, so the next chunk's task run
    (its start costs tens of ms, now and then seconds when the Prefect API is slow) is up and its rows
    loaded before a lane frees: it waits inside, holding its tag slot. Chunks start in the order
    given (asyncio's semaphores serve first come, first served).
    """

    def __init__(
        self,
        *,
        send: Callable[..., Awaitable[DispatchOutcome]],
        client: LLMClient,
        writer: storage.ResultWriter,
        sessions: async_sessionmaker[AsyncSession],
        per_chunk: int,
        lane_count: int,
        chunk_size: int,
        outcome: DispatchOutcome,
        board: _ProgressBoard,
        progress: Progress | None,
        specs: Sequence[PromptSpec] = (),
    ) -> None:
        self._send, self._client, self._writer, self._sessions = send, client, writer, sessions
        # A job this run has just recorded: its prompts by input position, so chunks need not load them again.
        self._specs = specs
        self._per_chunk, self._chunk_size, self._outcome = per_chunk, chunk_size, outcome
        self._board, self._progress = board, progress
        self._lane_count = lane_count
        self._lanes = asyncio.Semaphore(lane_count)
        self._begun = asyncio.Semaphore(lane_count + CHUNKS_AHEAD)
        # The context chunk tasks start from: the flow run's, whoever calls start() (a slice lands
        # inside the record-prompts-rest task run, which must not become their parent in the UI).
        self._context = contextvars.copy_context()
        self._started = self._requests = self._prompts = 0
        # Set once the first chunk is handing out requests.
        self.sending = asyncio.Event()
        # Chunks of the run as far as known: those started, and one per chunk_size prompts not yet planned.
        self._expected = 0

    def start(self, group: asyncio.TaskGroup, plan: RealtimePlan, *, unplanned: int = 0) -> None:
        """Start a task for each chunk of ``plan`` in ``group``; ``unplanned``: prompts still to plan."""
        self._requests += plan.requests
        self._prompts += plan.open_prompts - plan.reused
        self._expected = self._started + len(plan.chunks) + math.ceil(unplanned / self._chunk_size)
        if self._progress is not None:
            self._progress.total = self._requests + unplanned
        self._board.retotal(prompts=self._prompts + unplanned, chunks=self._expected)
        for groups in plan.chunks:
            self._started += 1
            run = self._run(number=self._started, groups=groups, requests=self._requests_of(plan, groups))
            group.create_task(run, context=self._context.copy())

    def _requests_of(self, plan: RealtimePlan, groups: list[tuple[int, ...]]) -> dict[int, ChatRequest] | None:
        if not self._specs:
            return None
        requests = {}
        for ids in groups:
            spec = self._specs[plan.positions[ids[0]]]
            assert spec.position == plan.positions[ids[0]], "specs must be the job's prompts in input order"
            requests[ids[0]] = ChatRequest(model=spec.model, messages=spec.messages, params=spec.params)
        return requests

    async def _run(self, *, number: int, groups: list[tuple[int, ...]], requests: dict[int, ChatRequest] | None) -> None:
        await self._begun.acquire()
        if number > self._lane_count:
            # A chunk begun ahead loads its rows once the first requests are out, not in their way.
            await self.sending.wait()
        entered = released = False

        async def enter_lane() -> None:
            nonlocal entered
            await self._lanes.acquire()
            entered = True
            self.sending.set()

        def leave_lane() -> None:
            nonlocal released
            if not released:
                released = True
                self._begun.release()
                if entered:
                    self._lanes.release()

        try:
            chunk_outcome = await self._send(
                # quote(): Prefect would otherwise walk every id of the chunk looking for futures, twice
                # per task run (~50 ms of CPU for 1,000 prompts, measured), while requests wait.
                number=number, of=self._expected, size=sum(len(g) for g in groups), groups=quote(groups),
                client=self._client, sink=self._writer, sessions=self._sessions, concurrency=self._per_chunk,
                before_send=enter_lane, on_dispatched=leave_lane, requests=quote(requests),
            )
        finally:
            leave_lane()
        self._outcome.add(chunk_outcome)
        await self._board.update(self._outcome)


class _ProgressBoard:
    """The real-time half's progress artifact in the Prefect UI, updated as chunks end.

    Best effort: an artifact the Prefect API refuses is logged and given up, never allowed to stop
    the requests in flight (their answers are paid for).
    """

    # Each update is a write to the Prefect API; on a SQLite-backed server writes contend (503s, 2 s back-offs).
    MIN_INTERVAL = 2.0

    def __init__(self, *, job_id: str, logger: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._job_id, self._logger = job_id, logger
        self._prompts = self._chunks = self._finished = 0
        self._artifact: asyncio.Task[Any] | None = None
        self._last = time.monotonic()

    def open(self, group: asyncio.TaskGroup) -> None:
        """Create the artifact in ``group``, alongside the first requests rather than before them."""
        if self._prompts:
            self._artifact = group.create_task(self._create())

    async def _create(self) -> Any:
        try:
            return await acreate_progress_artifact(
                progress=0.0, description=f"job {self._job_id}: real-time, {self._prompts} prompts")
        except Exception as exc:  # noqa: BLE001 - a progress display must not stop the run
            self._logger.warning("no progress artifact for job %s: %s", self._job_id, exc)
            return None

    def retotal(self, *, prompts: int, chunks: int) -> None:
        """The run's totals as far as known (they settle once every slice of a new job is planned)."""
        self._prompts, self._chunks = prompts, chunks

    async def update(self, outcome: DispatchOutcome) -> None:
        """A chunk ended: show it, at most every ``MIN_INTERVAL`` seconds."""
        self._finished += 1
        if time.monotonic() - self._last >= self.MIN_INTERVAL:
            await self._show(outcome)

    async def close(self, outcome: DispatchOutcome) -> None:
        """Every chunk ended: show the final counts."""
        await self._show(outcome)

    async def _show(self, outcome: DispatchOutcome) -> None:
        artifact = await self._artifact if self._artifact is not None else None
        if artifact is None:
            return
        self._last = time.monotonic()
        done = outcome.succeeded + outcome.failed
        try:
            await aupdate_progress_artifact(
                artifact_id=artifact, progress=min(100.0, 100.0 * done / max(1, self._prompts)),
                description=(f"real-time: {outcome.succeeded} succeeded / {outcome.failed} failed / {self._prompts} "
                             f"prompts; {self._finished} of {self._chunks} chunks done"),
            )
        except Exception as exc:  # noqa: BLE001 - a progress display must not stop the run
            self._logger.warning("progress artifact of job %s not updated: %s", self._job_id, exc)
