"""Persists results as they arrive (hundreds a second) in small batched transactions."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


from llm_dispatch import ChatResult
from ._bulk import bind_processor, bind_value, placeholders
from ._models import Prompt, Result, utcnow
from ._queries import mark_in_flight
from ._status import ROUTES, Route

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_FLUSH_ROWS", "MAX_ERROR_MESSAGE", "RETRY_DELAY", "ResultWriter"]

logger = logging.getLogger(__name__)

DEFAULT_FLUSH_ROWS = 200
# The most a killed process can lose: answers from the last interval, sent again on resume.
DEFAULT_FLUSH_INTERVAL = 0.05
MAX_ERROR_MESSAGE = 2_000
# Buffered rows beyond flush_rows x this make callers wait for the database.
BACKPRESSURE_FACTOR = 10
# Pause before the one retry of a batch that failed with OperationalError.
RETRY_DELAY = 0.5
_IN_CHUNK = 500

_prompts = Prompt.__table__
_results = Result.__table__


@dataclass(slots=True)
class _Row:
    arrived: float  # event-loop time, for the flush deadline
    prompt_id: int
    result: dict[str, Any]  # a results row, job_id filled in at flush when not known
    status: str  # the prompt's new status: succeeded, failed, or pending (non-final failure)
    attempts: int
    error_class: str | None
    retryable: bool | None


class ResultWriter:
    """Buffers results and writes them in one transaction per batch, from a background task.

    A batch is written when ``flush_rows`` results are waiting or the oldest has waited
    ``flush_interval`` seconds, so a result is on disk within about ``flush_interval`` of
    arriving, however slowly they come. Each batch inserts its result rows and updates
    their prompts together. A batch that fails twice is raised (to the next caller and on
    exit) and its rows stay buffered; nothing is dropped silently.

    ``job_id``, when every result belongs to one job, saves looking it up per batch.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        job_id: str | None = None,
    ) -> None:
        if flush_rows < 1 or flush_interval <= 0:
            raise ValueError("flush_rows must be >= 1 and flush_interval > 0")
        self._sessions = sessions
        self._flush_rows = flush_rows
        self._flush_interval = flush_interval
        self._max_buffered = BACKPRESSURE_FACTOR * flush_rows
        self._job_id = job_id
        self._buffer: deque[_Row] = deque()
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

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, route: str = "realtime") -> None:
        """Record one answer for these prompts (one request answered identical prompts).

        ``route`` is one of ``ROUTES`` (a plain str, as the core's ``ResultSink`` has it; checked here).

        The first id gets ``route``; the others get ``reused`` and no attempts, since the
        call was made (and paid) once. With ``route="reused"`` (a stored answer) no id
        counts an attempt.
        """
        if route not in ROUTES:
            raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
        now = utcnow()
        rows = []
        for index, prompt_id in enumerate(prompt_ids):
            this_route = route if index == 0 else "reused"
            attempts = result.attempts if this_route != "reused" else 0
            row = _result_row(prompt_id=prompt_id, now=now, route=this_route, status="succeeded", attempts=attempts)
            row.update(
                text=result.text,
                finish_reason=result.finish_reason,
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                cached_tokens=result.cached_tokens,
                latency_ms=result.latency_s * 1000,
                response_model=result.model,
                response_id=result.response_id,
                http_status=200 if this_route != "reused" else None,
            )
            rows.append((prompt_id, row, "succeeded", attempts, None, None))
        await self._add(rows)

    async def failure(
        self,
        *,
        prompt_ids: Sequence[int],
        error: BaseException,
        final: bool = True,
        route: Route = "realtime",
    ) -> None:
        """Record a failed call for these prompts: error class, HTTP status, message, attempts.

        ``final`` marks the prompts failed (``failed_retryable`` from ``error.retryable``);
        otherwise the failure is kept as history and the prompts go back to pending.
        """
        now = utcnow()
        error_class = type(error).__name__
        message = str(error)[:MAX_ERROR_MESSAGE] or None
        status_code = getattr(error, "status_code", None)
        error_attempts = int(getattr(error, "attempts", 1) or 1)
        retryable = bool(getattr(error, "retryable", False)) if final else None
        status = "failed" if final else "pending"
        rows = []
        for index, prompt_id in enumerate(prompt_ids):
            this_route = route if index == 0 else "reused"
            attempts = error_attempts if this_route != "reused" else 0
            row = _result_row(prompt_id=prompt_id, now=now, route=this_route, status="failed", attempts=attempts)
            row.update(
                http_status=status_code if isinstance(status_code, int) else None,
                error_class=error_class,
                error_message=message,
            )
            rows.append((prompt_id, row, status, attempts, error_class, retryable))
        await self._add(rows)

    async def mark_in_flight(self, *, prompt_ids: Sequence[int]) -> int:
        """Mark prompts as being sent, taking turns with result writes.

        Two connections of one process contending for SQLite's write lock do not queue: the
        loser sleeps in the busy handler (in steps of up to 100 ms), stalling the chunk that waits.
        """
        async with self._lock:
            return await mark_in_flight(self._sessions, prompt_ids=prompt_ids)

    async def flush(self) -> None:
        """Return once everything received so far is committed."""
        target = self._appended
        # Rows are written in arrival order, so this waits out a batch another task is
        # writing too; a failed batch goes back in the buffer and is tried here again.
        while self._written < target:
            await self._write_batch()

    # --- internals ------------------------------------------------------------------

    async def _add(self, rows: Sequence[tuple[int, dict[str, Any], str, int, str | None, bool | None]]) -> None:
        self._raise_if_broken()
        if self._task is None or self._closing:
            raise RuntimeError("use the ResultWriter as `async with ResultWriter(...) as writer:`")
        arrived = asyncio.get_running_loop().time()
        was_empty = not self._buffer
        for prompt_id, row, status, attempts, error_class, retryable in rows:
            self._buffer.append(_Row(arrived, prompt_id, row, status, attempts, error_class, retryable))
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
            batch = [self._buffer.popleft() for _ in range(min(self._flush_rows, len(self._buffer)))]
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

    async def _write(self, batch: list[_Row]) -> None:
        now = utcnow()
        async with self._sessions.begin() as session:
            job_ids = await self._job_ids(session, batch)
            conn = await session.connection()
            dialect = conn.dialect
            # Plain tuples through the driver's executemany (see storage._bulk): at hundreds of results
            # a second, SQLAlchemy's per-row parameter handling costs more than the database.
            to_time = bind_processor(_results.c.created_at, dialect) or _same
            results = []
            for row in batch:
                values = row.result
                results.append((
                    *(values[name] for name in _RESULT_COLUMNS[:-2]),
                    to_time(values["created_at"]),
                    job_ids[row.prompt_id],
                ))
            await conn.exec_driver_sql(_insert_sql(dialect), results)  # type: ignore[arg-type]
            stamp = bind_value(_prompts.c.updated_at, now, dialect)
            updates = [
                (u["b_status"], u["b_attempts"], u["b_error_class"], u["b_retryable"], stamp, u["b_id"])
                for u in _prompt_updates(batch, now=now)
            ]
            await conn.exec_driver_sql(_update_sql(dialect), updates)  # type: ignore[arg-type]

    async def _job_ids(self, session: AsyncSession, batch: list[_Row]) -> dict[int, str]:
        ids = list(dict.fromkeys(row.prompt_id for row in batch))
        if self._job_id is not None:
            # Unknown prompt ids still fail, on the results foreign key.
            return dict.fromkeys(ids, self._job_id)
        found: dict[int, str] = {}
        for start in range(0, len(ids), _IN_CHUNK):
            chunk = ids[start : start + _IN_CHUNK]
            rows = await session.execute(select(Prompt.id, Prompt.job_id).where(Prompt.id.in_(chunk)))
            found.update((prompt_id, job_id) for prompt_id, job_id in rows)
        missing = [pid for pid in ids if pid not in found]
        if missing:
            raise LookupError(f"results for prompt ids that are not in the database: {missing[:10]}")
        return found


# Result columns in the order of the insert's tuples; created_at and job_id go last.
_RESULT_COLUMNS = (
    "prompt_id", "route", "status", "attempts", "text", "finish_reason", "prompt_tokens", "completion_tokens",
    "cached_tokens", "latency_ms", "response_model", "response_id", "http_status", "error_class", "error_message",
    "created_at", "job_id",
)


def _insert_sql(dialect: Dialect) -> str:
    marks = placeholders(dialect, len(_RESULT_COLUMNS))
    return f"INSERT INTO results ({', '.join(_RESULT_COLUMNS)}) VALUES ({', '.join(marks)})"


def _update_sql(dialect: Dialect) -> str:
    """The prompt's new state after its results: (status, attempts to add, error class, retryable, now, id).

    A success is final: a late failure of the same prompt (another run, a duplicate send) must not make
    it look unpaid and send it a third time. Every SET expression sees the row as it was.
    """
    status, attempts, error_class, retryable, now, pid = placeholders(dialect, 6)
    return (
        f"UPDATE prompts SET status = CASE WHEN status = 'succeeded' THEN status ELSE {status} END, "
        f"attempts = attempts + {attempts}, last_error_class = COALESCE({error_class}, last_error_class), "
        f"failed_retryable = CASE WHEN status = 'succeeded' THEN failed_retryable ELSE {retryable} END, "
        f"updated_at = {now} WHERE id = {pid}"
    )


def _same(value: Any) -> Any:
    return value


def _result_row(*, prompt_id: int, now: datetime, route: str, status: str, attempts: int) -> dict[str, Any]:
    # Every row carries every column: an executemany needs the same keys in each.
    return {
        "prompt_id": prompt_id,
        "created_at": now,
        "route": route,
        "status": status,
        "attempts": attempts,
        "text": None,
        "finish_reason": None,
        "prompt_tokens": None,
        "completion_tokens": None,
        "cached_tokens": None,
        "latency_ms": None,
        "response_model": None,
        "response_id": None,
        "http_status": None,
        "error_class": None,
        "error_message": None,
    }


def _prompt_updates(batch: list[_Row], *, now: datetime) -> list[dict[str, Any]]:
    # One UPDATE row per prompt, so the executemany has no order to get wrong when a
    # prompt appears twice in a batch (say, a non-final failure and then its success).
    merged: dict[int, dict[str, Any]] = {}
    for row in batch:
        update_ = merged.get(row.prompt_id)
        if update_ is None:
            update_ = merged[row.prompt_id] = {
                "b_id": row.prompt_id,
                "b_status": row.status,
                "b_attempts": 0,
                "b_error_class": None,
                "b_retryable": row.retryable,
                "b_now": now,
            }
        update_["b_attempts"] += row.attempts
        if row.error_class is not None:
            update_["b_error_class"] = row.error_class
        if update_["b_status"] != "succeeded":
            update_["b_status"], update_["b_retryable"] = row.status, row.retryable
    return list(merged.values())
