"""Writes results as they arrive, batched: hundreds a second, each on disk within ``flush_interval``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from sqlalchemy import bindparam, insert, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from llm_dispatch._types import ChatResult

from ._models import Prompt, Result, utcnow
from ._status import Route

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_FLUSH_ROWS", "ResultWriter"]

logger = logging.getLogger(__name__)

DEFAULT_FLUSH_ROWS = 200
# What a killed process can lose: answers received in the last interval are sent again on resume.
DEFAULT_FLUSH_INTERVAL = 0.05
MAX_ERROR_MESSAGE = 2_000

_UPDATE_PROMPT = (
    update(Prompt.__table__)
    .where(Prompt.__table__.c.id == bindparam("pid"))
    .values(
        status=bindparam("new_status"),
        attempts=Prompt.__table__.c.attempts + bindparam("add_attempts"),
        last_error_class=bindparam("error_class"),
        failed_retryable=bindparam("retryable"),
        updated_at=bindparam("now"),
    )
)


class ResultWriter:
    """Buffers result rows for one job and writes them in one transaction per flush.

    Use as an async context manager; leaving it writes whatever is still buffered. A write that
    fails twice is raised to the next caller and at exit: results are never dropped silently.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        job_id: str,
        flush_rows: int = DEFAULT_FLUSH_ROWS,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
    ) -> None:
        self._sessions = sessions
        self._job_id = job_id
        self._flush_rows = flush_rows
        self._flush_interval = flush_interval
        self._results: list[dict[str, Any]] = []
        self._prompts: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._closing = False
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self.rows_written = 0
        self.flushes = 0

    async def __aenter__(self) -> ResultWriter:
        self._task = asyncio.create_task(self._run(), name="result-writer")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.shield(self._task)
        # Runs on every exit, error or cancellation included: what was received is kept.
        await self.flush()

    async def success(self, *, prompt_ids: Sequence[int], result: ChatResult, route: Route = "realtime") -> None:
        """One answer for these prompts; the 2nd and later ids of one call are recorded as ``reused``."""
        self._raise_if_broken()
        now = utcnow()
        for index, prompt_id in enumerate(prompt_ids):
            self._results.append({
                "prompt_id": prompt_id, "job_id": self._job_id, "created_at": now,
                "route": route if index == 0 else "reused", "status": "succeeded", "text": result.text,
                "finish_reason": result.finish_reason, "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens, "cached_tokens": result.cached_tokens,
                "latency_ms": result.latency_s * 1000, "attempts": result.attempts if index == 0 else 0,
                "response_model": result.model, "response_id": result.response_id, "http_status": 200,
                "error_class": None, "error_message": None,
            })
            self._prompts.append({"pid": prompt_id, "new_status": "succeeded", "add_attempts": result.attempts if index == 0 else 0,
                                  "error_class": None, "retryable": None, "now": now})
        await self._after_add()

    async def failure(self, *, prompt_ids: Sequence[int], error: BaseException, final: bool = True) -> None:
        """A failed call for these prompts (class, HTTP status and message kept)."""
        self._raise_if_broken()
        now = utcnow()
        attempts = int(getattr(error, "attempts", 1) or 1)
        retryable = bool(getattr(error, "retryable", False))
        message = str(error)[:MAX_ERROR_MESSAGE]
        error_class = type(error).__name__
        for index, prompt_id in enumerate(prompt_ids):
            self._results.append({
                "prompt_id": prompt_id, "job_id": self._job_id, "created_at": now, "route": "realtime",
                "status": "failed", "text": None, "finish_reason": None, "prompt_tokens": None,
                "completion_tokens": None, "cached_tokens": None, "latency_ms": None,
                "attempts": attempts if index == 0 else 0, "response_model": None, "response_id": None,
                "http_status": getattr(error, "status_code", None), "error_class": error_class, "error_message": message,
            })
            self._prompts.append({"pid": prompt_id, "new_status": "failed" if final else "pending",
                                  "add_attempts": attempts if index == 0 else 0, "error_class": error_class,
                                  "retryable": retryable, "now": now})
        await self._after_add()

    async def flush(self) -> None:
        """Write everything buffered now, in one transaction."""
        async with self._lock:
            if not self._results:
                return
            results, prompts = self._results, self._prompts
            self._results, self._prompts = [], []
            try:
                await self._write(results, prompts)
            except OperationalError as exc:
                logger.warning("writing %d results failed (%s); trying once more", len(results), exc.orig)
                await asyncio.sleep(0.5)
                try:
                    await self._write(results, prompts)
                except BaseException:
                    # Put them back so an exit flush can try again; never drop what was paid for.
                    self._results[:0], self._prompts[:0] = results, prompts
                    raise
            self.rows_written += len(results)
            self.flushes += 1

    async def _write(self, results: list[dict[str, Any]], prompts: list[dict[str, Any]]) -> None:
        async with self._sessions.begin() as session:
            await session.execute(insert(Result), results)
            await session.execute(_UPDATE_PROMPT, prompts)

    async def _after_add(self) -> None:
        if len(self._results) >= self._flush_rows:
            self._wake.set()
        if len(self._results) >= 10 * self._flush_rows:
            await self.flush()  # back-pressure: the database is slower than the answers

    def _raise_if_broken(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"results can no longer be written to the database: {self._error}") from self._error

    async def _run(self) -> None:
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._flush_interval)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # noqa: BLE001 - surfaced to callers through _raise_if_broken
                logger.error("writing results failed: %s", exc)
                self._error = exc
                return
