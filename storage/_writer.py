"""Persists results as they arrive (hundreds a second) in small batched transactions."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from types import TracebackType
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession

from llm_dispatch.core import ChatResult, PriceTable, ResultRoute, UnknownPromptError

from ._budgets import BudgetLease, settle_batch
from ._bulk import IN_CHUNK, chunks
from ._models import Prompt, utcnow
from ._prompts import count_background_create, mark_in_flight, release_in_flight, set_background_id
from ._ledger import compact_ledger
from ._results import ResultRow, RowLedger, answer_rows, failure_rows, write_results
from ._engine import Sessions

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_FLUSH_ROWS", "RETRY_DELAY", "ResultWriter"]

logger = logging.getLogger(__name__)

DEFAULT_FLUSH_ROWS = 200
DEFAULT_FLUSH_INTERVAL = 0.05
# Buffered rows beyond flush_rows x this make callers wait for the database; it is also the most rows one
# transaction writes. What a killed process loses (sent again on resume): the answers not yet committed.
BACKPRESSURE_FACTOR = 10
# Pause before the one retry of a batch that failed with OperationalError.
RETRY_DELAY = 0.5


class _Buffered(NamedTuple):
    arrived: float  # event-loop time, for the flush deadline
    row: ResultRow
    # A batch line's row: its stored cost is spent out of this batch's reservation, not the run's lease.
    batch_id: int | None = None


class ResultWriter:
    """Buffers results and writes them in one transaction per batch, from a background task.

    A batch is written when ``flush_rows`` results are waiting or the oldest has waited
    ``flush_interval`` seconds, so a result is on disk within about ``flush_interval`` of
    arriving, however slowly they come. A batch takes every result waiting (up to
    ``BACKPRESSURE_FACTOR`` x ``flush_rows``): a writer that fell behind a busy event loop
    catches up in one transaction. Each batch inserts its result rows and updates
    their prompts together. A batch that fails twice is raised (to the next caller and on
    exit) and its rows stay buffered; nothing is dropped silently.

    ``job_id``, when every result belongs to one job, saves looking it up per batch. ``prices`` (the
    run's price table) prices each answer as it is stored; without it their costs are unknown (NULL). ``budget``
    (the run's lease on a budget) has each write's stored costs settled as spent in the same transaction.
    """

    def __init__(
        self,
        sessions: Sessions,
        *,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        job_id: str | None = None,
        prices: PriceTable | None = None,
        budget: BudgetLease | None = None,
    ) -> None:
        if flush_rows < 1 or flush_interval <= 0:
            raise ValueError("flush_rows must be >= 1 and flush_interval > 0")
        self._sessions = sessions
        self._flush_rows = flush_rows
        self._flush_interval = flush_interval
        self._max_buffered = BACKPRESSURE_FACTOR * flush_rows
        self._job_id = job_id
        self._ledger = RowLedger(prices)
        self._budget = budget
        self._buffer: deque[_Buffered] = deque()
        self._lock = asyncio.Lock()  # one batch written at a time, in arrival order
        self._wake = asyncio.Event()
        self._space = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._error: BaseException | None = None
        self._appended = 0  # rows ever buffered; with _written, lets flush() wait for "now"
        self._written = 0
        self.retry_delay = RETRY_DELAY  # tests shorten it
        self.rows_written = 0
        self.flushes = 0

    @property
    def prices(self) -> PriceTable | None:
        """The price table the rows are priced with, for a bulk path writing beside this writer."""
        return self._ledger.prices

    @property
    def pending_rows(self) -> int:
        """Result rows received but not yet committed (a batch being written included)."""
        return self._appended - self._written

    async def __aenter__(self) -> ResultWriter:
        if self._task is not None:
            raise RuntimeError("a ResultWriter can be entered once")
        self._task = asyncio.create_task(self._run(), name="result-writer")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        self._wake.set()
        assert self._task is not None
        await self._task  # the flusher keeps its own errors in self._error
        try:
            # Even after a failed batch, and on error or cancellation of the body: these
            # answers were paid for, so one more try is worth it.
            while self._buffer:
                await self._write_batch()
        except Exception:
            if exc is None:
                raise
            logger.exception("%d results could not be written while handling %r", len(self._buffer), exc)
            return
        if self._error is not None and exc is None:
            raise self._error
        if self._job_id is not None and self.flushes and exc is None:
            # The run's writes appended a ledger delta each: folded into one per key, so the job's reports read a
            # few rows whatever its runs wrote.
            await compact_ledger(self._sessions, job_id=self._job_id)

    async def success(
        self, *, prompt_ids: Sequence[int], result: ChatResult, route: ResultRoute = "realtime",
        model: str | None = None, reask: int = 0,
    ) -> None:
        """Record one answer for these prompts (one request answered identical prompts).

        ``route`` is one of ``RESULT_ROUTES`` (checked here too: a caller may not be type-checked).
        Which prompt counts the call is ``storage.shares``' rule: the first id paid, the others reused.
        ``model`` is the model asked for, as the price table names it (default: the answer's own). ``reask``: which
        asking of the prompts it answers (0: their own request).
        """
        rows = answer_rows([(prompt_ids, result)], route=route, now=utcnow(), ledger=self._ledger, model=model,
                           reask=reask)
        await self._add(rows)

    async def failure(
        self,
        *,
        prompt_ids: Sequence[int],
        error: BaseException,
        final: bool = True,
        route: ResultRoute = "realtime",
        model: str | None = None,
        batch_id: int | None = None,
        reask: int = 0,
    ) -> None:
        """Record a failed call for these prompts: error class, HTTP status, message, attempts, and the cost of
        what a 2xx with no usable answer said it used (priced as a request to ``model``).

        ``final`` marks the prompts failed (``failed_retryable`` from ``error.retryable``);
        otherwise the failure is kept as history and the prompts go back to pending. ``reask`` n > 0: the call was
        their n-th re-ask, and they keep their invalid answer (``invalid``). ``batch_id``: a line of that
        batch failed, and what it was billed is spent out of the batch's budget reservation (``settle_batch``), in
        the transaction that stores it, as the batch's answers are.
        """
        await self._add(failure_rows(prompt_ids, error, route=route, now=utcnow(), final=final, ledger=self._ledger,
                                     model=model, reask=reask), batch_id=batch_id)

    async def release(self, *, prompt_ids: Sequence[int]) -> int:
        """Put prompts marked in flight back to pending, unsent (a run that stopped before sending them)."""
        async with self._lock:
            return await release_in_flight(self._sessions, prompt_ids=prompt_ids)

    async def mark_in_flight(self, *, prompt_ids: Sequence[int]) -> int:
        """Mark prompts as being sent, taking turns with result writes.

        Two connections of one process contending for SQLite's write lock do not queue: the
        loser sleeps in the busy handler (in steps of up to 100 ms), stalling the chunk that waits.
        """
        async with self._lock:
            return await mark_in_flight(self._sessions, prompt_ids=prompt_ids)

    async def background_creating(self, *, prompt_ids: Sequence[int]) -> None:
        """Count a background create for these prompts before it is sent, taking turns with result writes: a run
        killed before its id is stored leaves the count, and the next run counts that create as possibly billed."""
        async with self._lock:
            await count_background_create(self._sessions, prompt_ids=prompt_ids)

    async def background_started(self, *, prompt_ids: Sequence[int], background_id: str) -> None:
        """Store the background response created for these prompts at once, taking turns with result writes: a
        run killed while it is polled finds it again and polls it, never creating it twice."""
        async with self._lock:
            await set_background_id(self._sessions, prompt_ids=prompt_ids, background_id=background_id)

    async def flush(self) -> None:
        """Return once everything received so far is committed."""
        target = self._appended
        # Rows are written in arrival order, so this waits out a batch another task is
        # writing too; a failed batch goes back in the buffer and is tried here again.
        while self._written < target:
            await self._write_batch()

    # --- internals ------------------------------------------------------------------

    async def _add(self, rows: Sequence[ResultRow], *, batch_id: int | None = None) -> None:
        self._raise_if_broken()
        if self._task is None or self._closing:
            raise RuntimeError("use the ResultWriter as `async with ResultWriter(...) as writer:`")
        arrived = asyncio.get_running_loop().time()
        if self._budget is not None and batch_id is None:
            self._budget.buffered(_cost(rows))
        was_empty = not self._buffer
        self._buffer.extend(_Buffered(arrived, row, batch_id) for row in rows)
        self._appended += len(rows)
        if was_empty or len(self._buffer) >= self._flush_rows:
            self._wake.set()
        # Back-pressure: the database is slower than the answers; hold this caller back.
        while self.pending_rows > self._max_buffered:
            self._space.clear()
            await self._space.wait()
            self._raise_if_broken()

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise RuntimeError(
                f"results can no longer be written to the database ({self._error}); "
                f"{len(self._buffer)} are held in memory until the writer closes"
            ) from self._error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if self._buffer:
                    due = self._buffer[0].arrived + self._flush_interval
                    if self._closing or len(self._buffer) >= self._flush_rows or loop.time() >= due:
                        await self._write_batch()
                        continue
                    timeout: float | None = due - loop.time()
                elif self._closing:
                    return
                else:
                    timeout = None
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout)
                except TimeoutError:
                    pass
        except Exception as exc:
            # Kept for callers and __aexit__, which raise it; the rows stay buffered.
            self._error = exc
        finally:
            self._space.set()

    async def _write_batch(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            batch = [self._buffer.popleft() for _ in range(min(self._max_buffered, len(self._buffer)))]
            try:
                try:
                    await self._write(batch)
                except OperationalError as exc:
                    # Usually "database is locked" after busy_timeout, or a dropped connection;
                    # the transaction rolled back, so writing the same rows again is safe.
                    logger.warning("writing %d results failed (%s); retrying once", len(batch), exc.orig)
                    await asyncio.sleep(self.retry_delay)
                    await self._write(batch)
            except BaseException as exc:
                self._buffer.extendleft(reversed(batch))
                if isinstance(exc, Exception):
                    # .orig: the driver's message, without the rows (answers) SQLAlchemy appends.
                    logger.error(
                        "could not write %d results (%d held in memory): %s",
                        len(batch), len(self._buffer), getattr(exc, "orig", None) or exc,
                    )
                raise
            self._written += len(batch)
            self.rows_written += len(batch)
            self.flushes += 1
            self._space.set()

    async def _write(self, batch: list[_Buffered]) -> None:
        rows = [item.row for item in batch]
        budget, cost, moved = self._budget, 0, None
        # Billed batch lines: spent out of their batches' reservations; every other row out of the run's lease.
        by_batch: dict[int, int] = {}
        for item in batch:
            if item.batch_id is not None:
                by_batch[item.batch_id] = by_batch.get(item.batch_id, 0) + (item.row.cost_pico_usd or 0)
        async with self._sessions.begin() as session:
            job_ids = self._job_id if self._job_id is not None else await _job_ids(session, rows)
            # Unknown prompt ids with a known job_id fail on the results foreign key.
            conn = await session.connection()
            await write_results(conn, rows, job_ids=job_ids, now=utcnow(), prices=self._ledger.prices)
            # Last, so that the budgets' rows are locked only for the commit.
            for batch_id, spent in by_batch.items():
                if spent:
                    await settle_batch(conn, batch_id=batch_id, cost=spent)
            if budget is not None:
                cost = _cost([item.row for item in batch if item.batch_id is None]) if by_batch else _cost(rows)
                moved = await budget.settle(conn, cost=cost)
        if budget is not None:
            budget.settled(cost=cost, moved=moved)


def _cost(rows: Sequence[ResultRow]) -> int:
    """What these rows' answers cost, as stored (a cost unknown for want of a price counts nothing)."""
    return sum(row.cost_pico_usd or 0 for row in rows)


async def _job_ids(session: AsyncSession, rows: list[ResultRow]) -> dict[int, str]:
    """Each row's job, looked up once per write for a writer not given its job."""
    ids = list(dict.fromkeys(row.prompt_id for row in rows))
    found: dict[int, str] = {}
    for chunk in chunks(ids, IN_CHUNK):
        rows_found = await session.execute(select(Prompt.id, Prompt.job_id).where(Prompt.id.in_(chunk)))
        found.update((prompt_id, job_id) for prompt_id, job_id in rows_found)
    missing = [pid for pid in ids if pid not in found]
    if missing:
        raise UnknownPromptError(f"answers for prompt ids that are not in the database: {missing[:10]}; was their job "
                                 "removed, or is this run given another --database-url than the one that recorded them?")
    return found
