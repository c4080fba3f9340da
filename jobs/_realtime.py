"""The real-time half of a run: its chunks, planned as their prompts are stored (``ChunkFeed``), and
the turn-taking that keeps the run's requests at its limit and within it (``ChunkSender``)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Container, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from llm_dispatch import storage
from llm_dispatch.core import (
    REQUEST_ROUTES,
    CachePlan,
    ChatRequest,
    ChatSender,
    DispatchOutcome,
    ResultSink,
    RoutingRules,
    RunStop,
    SpendGate,
)

from ._plan import RealtimePlan, Selection, chunk_size_for, plan_realtime
from ._record import RecordedJob, StoredSlice, store_rest

# Chunks begun beyond the lanes: each loads its rows and waits, ready the moment a lane frees.
CHUNKS_AHEAD = 1


@dataclass(frozen=True, slots=True)
class Chunk:
    """Groups of prompt ids, one request each (identical prompts share one); and, when the run holds
    the job's prompts in memory, each group's request by its first id."""

    groups: list[tuple[int, ...]]
    requests: dict[int, ChatRequest] | None = None

    @property
    def prompts(self) -> int:
        return sum(len(group) for group in self.groups)


class ChunkFeed:
    """The chunks of a real-time run, in the order to send them, planned as they are asked for.

    A job recorded whole is planned a keyset page of its open prompts at a time. A job still being
    recorded (``RecordedJob.rest``) is planned a slice at a time: the prompts stored so far, then
    each slice as it is stored (after ``before_storing``; ``on_stored`` is called once the last one is, as
    ``rules`` routed them). Either way the identical requests whose
    prompts are in different pages or slices come last, grouped once all of them are stored so that
    they are paid once. The job leaves ``recording`` with its last slice. What the feed holds is a
    page or a slice, however large the job: a consumer that takes a chunk only when it can start it
    keeps the run's memory flat.
    """

    def __init__(
        self,
        *,
        job: RecordedJob,
        sessions: storage.Sessions,
        sink: ResultSink,
        chunk_size: int,
        dedupe: bool,
        selection: Selection = Selection(),
        rules: RoutingRules | None = None,
        before_storing: Callable[[], Awaitable[object]] | None = None,
        on_stored: Callable[[], object] | None = None,
    ) -> None:
        self._job, self._sessions, self._sink = job, sessions, sink
        self._on_stored = on_stored
        self._first_size = chunk_size
        # Every slice's chunks alike: at most MAX_CHUNKS_PER_RUN of them, unless that would make a chunk
        # larger than MAX_GROWN_CHUNK prompts (a 10M job: 2,000 chunks of 5,000).
        self._size = chunk_size_for(job.total, chunk_size=chunk_size)
        self._selection = selection
        self._dedupe, self._rules, self._before_storing = dedupe, rules, before_storing
        self.chunks = self.requests = self.prompts = self.reused = 0
        # Open prompts not planned yet (counted when the feed starts); a request each until they are. Of a job being
        # recorded, those routed to the Batch API are another half's.
        self.unplanned = (job.total - (job.batched if selection.planned_route == "realtime" else 0)) if job.rest else 0

    @property
    def expected_chunks(self) -> int:
        return self.chunks + math.ceil(self.unplanned / self._size)

    @property
    def expected_requests(self) -> int:
        return self.requests + self.unplanned

    @property
    def expected_prompts(self) -> int:
        """Prompts to send (not answered from storage), as far as known."""
        return self.prompts + self.unplanned

    async def __aiter__(self) -> AsyncIterator[Chunk]:
        # Requests held back from pages or slices, planned last.
        held: set[str] = set()
        plans = self._recording() if self._job.rest else self._pages()
        async for plan, stored in plans:
            held |= plan.held_keys
            for chunk in self._take(plan, stored):
                yield chunk
        if held:
            last = await self._plan(only_keys=held)
            self.unplanned = 0
            for chunk in self._take(last):
                yield chunk

    async def _pages(self) -> AsyncIterator[tuple[RealtimePlan, StoredSlice | None]]:
        """A job recorded whole: its open prompts a keyset page at a time."""
        job, selection = self._job, self._selection
        self.unplanned = await storage.unfinished_prompt_count(
            self._sessions, job_id=job.job_id, retry_failed=selection.retry_failed,
            planned_route=selection.planned_route, in_flight=selection.in_flight, shard=selection.shard)
        if not self.unplanned:
            return
        self._size = chunk_size_for(self.unplanned, chunk_size=self._first_size)
        hold: Container[str] = frozenset()
        if self._dedupe:
            hold = await storage.unfinished_repeated_keys(
                self._sessions, job_id=job.job_id, retry_failed=selection.retry_failed,
                planned_route=selection.planned_route, in_flight=selection.in_flight, shard=selection.shard)
        after: tuple[int, int] | None = None
        while True:
            plan = await self._plan(page=(after, self._size), hold_keys=hold)
            yield plan, None
            if plan.last is None:
                return
            after = plan.last

    async def _recording(self) -> AsyncIterator[tuple[RealtimePlan, StoredSlice | None]]:
        """A job being recorded: what is stored, then each slice as it is stored."""
        job = self._job
        assert job.input is not None and job.recorded_at is not None
        hold = job.repeated_keys if self._dedupe else frozenset()
        first = await self._plan(size=self._first_size, positions=(0, job.stored), hold_keys=hold)
        yield first, None
        if first.chunks and self._before_storing is not None:
            await self._before_storing()
        async for stored in store_rest(job_id=job.job_id, given=job.input, start=job.stored, sessions=self._sessions,
                                       first_slice=job.stored, recorded_at=job.recorded_at, then_status="running",
                                       rules=self._rules, checked=job.checked):
            yield await self._plan(positions=(stored.start, stored.stop), hold_keys=hold, track_positions=True), stored
        if self._on_stored is not None:
            self._on_stored()

    async def _plan(self, *, size: int | None = None, **slice_: Any) -> RealtimePlan:
        return await plan_realtime(
            job_id=self._job.job_id, sessions=self._sessions, sink=self._sink, chunk_size=size or self._size,
            dedupe=self._dedupe, selection=self._selection, **slice_,
        )

    def _take(self, plan: RealtimePlan, stored: StoredSlice | None = None) -> list[Chunk]:
        self.reused += plan.reused
        self.prompts += plan.unfinished_prompts - plan.reused
        self.requests += plan.requests
        self.unplanned = max(0, self.unplanned - plan.unfinished_prompts)
        self.chunks += len(plan.chunks)
        return [Chunk(groups=groups, requests=_requests_of(plan, groups, stored)) for groups in plan.chunks]


def _requests_of(
    plan: RealtimePlan, groups: Sequence[tuple[int, ...]], stored: StoredSlice | None
) -> dict[int, ChatRequest] | None:
    """Each group's request, from the slice just stored when there is one (else the chunk loads its rows)."""
    if stored is None:
        return None
    requests = {}
    for ids in groups:
        at = plan.positions[ids[0]] - stored.start
        spec = stored.specs[at]
        assert spec.position == plan.positions[ids[0]], "a slice holds the job's prompts in input order"
        # Sent by its lane, as a chunk that loads its rows sends it (a flex or background lane; None: plain).
        route = stored.routes[at] if stored.routes else None
        requests[ids[0]] = ChatRequest(model=spec.model, messages=spec.messages, params=spec.params,
                                       endpoint=spec.endpoint, lane=route if route in REQUEST_ROUTES else None)
    return requests


class SendChunk(Protocol):
    """One chunk sent (``tasks.send_chunk`` as a flow calls it)."""

    async def __call__(
        self,
        *,
        number: int,
        of: int,
        chunk: Chunk,
        client: ChatSender,
        sink: storage.ResultWriter,
        sessions: storage.Sessions,
        concurrency: int,
        before_send: Callable[[], Awaitable[None]],
        on_dispatched: Callable[[], None],
        stop: RunStop | None,
        max_reasks: int,
        budget: SpendGate | None,
        cache_plan: CachePlan | None,
    ) -> DispatchOutcome: ...


class ChunkSender:
    """Sends a run's chunks, taking turns so that its requests fill its limit and stay within it.

    Lanes: chunks handing out requests, enough to fill the run's ``concurrency`` at ``per_chunk``
    each. A chunk leaves its lane when its last rounds are on the way, so the next one starts
    sending while it drains. Begun: chunks started and not yet done handing out, one more than the
    lanes, so that the next chunk is ready (its rows loaded) before a lane frees. Chunks go in the
    order started (asyncio's semaphores serve first come, first served). "On the way" is counted in
    answers (``send_all``'s ``on_dispatched``), never in requests still queued for the client's limit:
    so the chunks alive at once, and the rows they hold, do not grow with the job.

    Used as ``async with``: on the way out it waits for every chunk started. When the body fails
    (say, storing a slice of the job), chunks already started still finish, since their requests
    are paid for; then the body's error is raised.
    """

    def __init__(
        self,
        *,
        send: SendChunk,
        client: ChatSender,
        writer: storage.ResultWriter,
        sessions: storage.Sessions,
        concurrency: int,
        per_chunk: int,
        on_chunk_done: Callable[[DispatchOutcome], Awaitable[object]] | None = None,
        stop: RunStop | None = None,
        max_reasks: int = 0,
        budget: SpendGate | None = None,
        cache_plan: CachePlan | None = None,
    ) -> None:
        self._send, self._client, self._writer, self._sessions = send, client, writer, sessions
        self.stop, self.budget = stop, budget
        self.cache_plan = cache_plan
        self._max_reasks = max_reasks
        self._per_chunk = per_chunk
        self._lane_count = math.ceil(concurrency / per_chunk)
        self._lanes = asyncio.Semaphore(self._lane_count)
        self._begun = asyncio.Semaphore(self._lane_count + CHUNKS_AHEAD)
        self._on_chunk_done = on_chunk_done
        self._group = asyncio.TaskGroup()
        self._started = 0
        self.outcome = DispatchOutcome()
        # Set once the first chunk is handing out requests.
        self.sending = asyncio.Event()

    async def __aenter__(self) -> ChunkSender:
        await self._group.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if isinstance(exc, Exception):
            await self._group.__aexit__(None, None, None)
            return None  # the body's error goes on
        await self._group.__aexit__(exc_type, exc, tb)
        return None

    async def start(self, chunk: Chunk, *, of: int) -> None:
        """Start sending ``chunk`` (the run's chunk number so-many ``of`` about ``of``); waits until it may
        begin, so that a caller taking chunks from a feed holds only those begun, not the whole plan."""
        await self._begun.acquire()
        self._started += 1
        self._group.create_task(self._run(number=self._started, of=of, chunk=chunk))

    async def _run(self, *, number: int, of: int, chunk: Chunk) -> None:
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
            outcome = await self._send(
                number=number, of=max(of, number), chunk=chunk, client=self._client, sink=self._writer,
                sessions=self._sessions, concurrency=self._per_chunk, before_send=enter_lane,
                on_dispatched=leave_lane, stop=self.stop, max_reasks=self._max_reasks, budget=self.budget,
                cache_plan=self.cache_plan,
            )
        finally:
            leave_lane()
        self.outcome.add(outcome)
        if self._on_chunk_done is not None:
            await self._on_chunk_done(self.outcome)

