"""Spreading a batch's answers over its processing time, so a poller sees its counts advance, and stopping at a
cancel or an expiry. Shared by OpenAI's batches (``_batch_run``) and Anthropic's (``_message_batch_run``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Literal, TypeVar

__all__ = ["CHUNK_LINES", "PaceOutcome", "answer_paced", "hold"]

# Lines handled between yields to the event loop, and the fewest progress steps a batch shows.
CHUNK_LINES = 256
_MIN_PROGRESS_STEPS = 20

PaceOutcome = Literal["done", "expired", "cancelled"]
_Record = TypeVar("_Record")


async def hold(until: float, *, cancel: asyncio.Event) -> None:
    """Wait until ``until`` (monotonic) or ``cancel``, whichever is first; always yields once."""
    delay = until - time.monotonic()
    if delay <= 0:
        await asyncio.sleep(0)
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay):
            await cancel.wait()


async def answer_paced(
    records: Iterator[_Record],
    *,
    total: int,
    duration: float,
    stop_after: int | None,
    cancel: asyncio.Event,
    answer: Callable[[_Record], None],
) -> tuple[PaceOutcome, _Record | None]:
    """``answer`` each record in turn, the k-th no sooner than ``duration * k / total`` seconds in.

    With ``stop_after`` (an expiring batch) it stops after that many and returns ``("expired", first unanswered)``;
    the rest stay in ``records``. A cancel stops it at the next chunk with ``("cancelled", None)``, the unanswered
    records also left in ``records``.
    """
    chunk = max(1, min(CHUNK_LINES, total // _MIN_PROGRESS_STEPS))
    limit = total if stop_after is None else stop_after
    started = time.monotonic()
    answered = 0
    for record in records:
        if answered >= limit:
            return "expired", record
        answer(record)
        answered += 1
        if answered % chunk == 0:
            await hold(started + duration * answered / total, cancel=cancel)
            if cancel.is_set():
                return "cancelled", None
    if stop_after is not None:  # expire:1 answers every record and still expires
        return "expired", None
    await hold(started + duration, cancel=cancel)
    return ("cancelled" if cancel.is_set() else "done"), None
