"""Every read and write of Batch API batches and their members, once recorded (a new batch's record:
``_batch_create``).

A prompt in an open batch has status ``batched``: the real-time path does not pick it
(``unfinished_prompt_ids``), and no second batch may take it, until its result is written or it
is released back to ``pending``. Results go through ``storage._results``: failures by the
``ResultWriter`` with ``route="batch"``, answers in bulk by ``store_batch_answers``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from llm_dispatch.core import (
    BATCH_STATUSES,
    CLOSED_BATCH_STATUSES,
    ChatResult,
    PriceTable,
    UnknownBatchError,
)

from ._budgets import release_batch, settle_batch
from ._bulk import IN_CHUNK, changed_rows, chunks
from ._models import Batch, BatchMember, Prompt, aware, utcnow
from ._records import BatchRecord
from ._bulk_answers import write_batch_rows
from ._results import RowLedger, answer_rows
from ._engine import Sessions

__all__ = [
    "BATCH_FIELDS",
    "batch_number",
    "batch_members",
    "batch_submissions",
    "clear_batch_error",
    "find_batch_by_provider_id",
    "get_batch",
    "job_batches",
    "mark_batch_ingested",
    "mark_batch_lost",
    "unfinished_batches",
    "record_batch_error",
    "release_members",
    "require_batch",
    "store_batch_answers",
    "update_batch",
]

# What update_batch may change; the rest (id, job, model, members, timestamps of the row
# itself) is fixed when the batch is made.
BATCH_FIELDS: Final[frozenset[str]] = frozenset(
    {
        "status",
        "provider_batch_id",
        "input_file_id",
        "output_file_id",
        "error_file_id",
        "file_path",
        "request_total",
        "request_completed",
        "request_failed",
        "submitted_at",
        "expires_at",
        "finished_at",
        "last_polled_at",
        "errors",
        "cancel_requested",
    }
)


async def update_batch(sessions: Sessions, *, batch_id: int, **fields: Any) -> None:
    """Change some of a batch's ``BATCH_FIELDS`` (status, provider ids, counts, timestamps, errors).

    An unknown field raises ``TypeError``. ``status="ingested"`` and ``"lost"`` are refused: use
    ``mark_batch_ingested`` or ``mark_batch_lost``, which also free the prompts the batch did not answer.
    """
    unknown = set(fields) - BATCH_FIELDS
    if unknown:
        raise TypeError(f"update_batch() got unknown fields {sorted(unknown)}; allowed: {sorted(BATCH_FIELDS)}")
    if "status" in fields:
        status = fields["status"]
        if status not in BATCH_STATUSES:
            raise ValueError(f"unknown batch status {status!r}; expected one of {BATCH_STATUSES}")
        if status in CLOSED_BATCH_STATUSES:
            raise ValueError(f"use mark_batch_{status}() to mark a batch {status}")
    async with sessions.begin() as session:
        stmt = update(Batch).where(Batch.id == batch_id).values(**fields, updated_at=utcnow())
        done = await session.execute(stmt.execution_options(synchronize_session=False))
        if changed_rows(done) == 0:
            raise UnknownBatchError(f"no batch with id {batch_id!r}")


async def get_batch(sessions: Sessions, *, batch_id: int) -> BatchRecord | None:
    async with sessions() as session:
        batch = await session.get(Batch, batch_id)
    return None if batch is None else _record(batch)


async def batch_number(sessions: Sessions, *, record: BatchRecord) -> int:
    """Which of its job's batches ``record`` is, counted from 1 in the order they were made (a batch's id counts
    across the database)."""
    async with sessions() as session:
        found = await session.scalar(select(func.count()).select_from(Batch)
                                     .where(Batch.job_id == record.job_id, Batch.id <= record.id))
    return int(found or 1)


async def require_batch(sessions: Sessions, *, batch_id: int) -> BatchRecord:
    """The stored batch; ``UnknownBatchError`` when there is none (a wrong id, or a row removed by hand)."""
    record = await get_batch(sessions, batch_id=batch_id)
    if record is None:
        raise UnknownBatchError(f"no batch {batch_id} in the database; `llm-dispatch status JOB` lists a job's batches")
    return record


async def find_batch_by_provider_id(sessions: Sessions, *, provider_batch_id: str) -> BatchRecord | None:
    async with sessions() as session:
        batch = (
            await session.execute(select(Batch).where(Batch.provider_batch_id == provider_batch_id))
        ).scalar_one_or_none()
    return None if batch is None else _record(batch)


async def unfinished_batches(sessions: Sessions, *, job_id: str | None = None) -> list[BatchRecord]:
    """Every batch not closed (``ingested`` or ``lost``), oldest first, of one job or of all.

    That is the ones still being made or uploaded, the ones the provider is working on, and
    the finished ones (completed, failed, expired, cancelled) whose output is not stored yet:
    what a resumed run has to carry on with.
    """
    stmt = select(Batch).where(Batch.status.not_in(CLOSED_BATCH_STATUSES)).order_by(Batch.id)
    if job_id is not None:
        stmt = stmt.where(Batch.job_id == job_id)
    async with sessions() as session:
        return [_record(batch) for batch in (await session.execute(stmt)).scalars()]


async def job_batches(sessions: Sessions, *, job_id: str) -> list[BatchRecord]:
    """Every batch of a job, ingested ones too, oldest first (for reports)."""
    stmt = select(Batch).where(Batch.job_id == job_id).order_by(Batch.id)
    async with sessions() as session:
        return [_record(batch) for batch in (await session.execute(stmt)).scalars()]


async def batch_members(sessions: Sessions, *, batch_id: int, waiting_only: bool = False) -> dict[str, list[int]]:
    """custom_id -> prompt ids (in id order) for every line of the batch's file.

    ``waiting_only`` keeps the prompts still ``batched`` (no result written yet), so an ingest
    that was cut short and runs again writes each answer once.
    """
    stmt = select(BatchMember.custom_id, BatchMember.prompt_id).where(BatchMember.batch_id == batch_id)
    if waiting_only:
        stmt = stmt.join(Prompt, Prompt.id == BatchMember.prompt_id).where(Prompt.status == "batched")
    members: dict[str, list[int]] = {}
    async with sessions() as session:
        # Core rows, not the ORM's: a batch has tens of thousands of members, and nothing here is an entity.
        connection = await session.connection()
        for custom_id, prompt_id in await connection.execute(stmt.order_by(BatchMember.prompt_id)):
            members.setdefault(custom_id, []).append(prompt_id)
    return members


async def batch_submissions(
    sessions: Sessions, *, prompt_ids: Collection[int] | None = None, batch_id: int | None = None
) -> dict[int, int]:
    """How many batches each prompt has been sent in: these prompts, or every member of batch
    ``batch_id`` (one query), counted up to that batch: a batch made later (another worker re-sending a member
    this batch's ingest has just released) is not counted against it. Prompts never batched are left out."""
    if (prompt_ids is None) == (batch_id is None):
        raise TypeError("give prompt_ids or batch_id")
    counts: dict[int, int] = {}
    async with sessions() as session:
        if batch_id is not None:
            members = select(BatchMember.prompt_id).where(BatchMember.batch_id == batch_id)
            stmt = (
                select(BatchMember.prompt_id, func.count())
                .where(BatchMember.prompt_id.in_(members), BatchMember.batch_id <= batch_id)
                .group_by(BatchMember.prompt_id)
            )
            return {pid: n for pid, n in await session.execute(stmt)}
        assert prompt_ids is not None
        for chunk in chunks(list(prompt_ids), IN_CHUNK):
            stmt = (
                select(BatchMember.prompt_id, func.count())
                .where(BatchMember.prompt_id.in_(chunk))
                .group_by(BatchMember.prompt_id)
            )
            counts.update((pid, n) for pid, n in await session.execute(stmt))
    return counts


async def store_batch_answers(
    sessions: Sessions,
    *,
    job_id: str,
    answers: Sequence[tuple[Sequence[int], ChatResult]],
    model: str,
    prices: PriceTable | None,
    latency_s: float | None = None,
    batch_id: int | None = None,
    reasks: Mapping[int, int] | None = None,
) -> int:
    """Store answered batch lines in one transaction; returns the result rows written. Their stored costs are
    spent out of batch ``batch_id``'s budget reservation, if it holds one, in the same transaction.

    The bulk path of ingest, for tens of thousands of answers at once, where the ``ResultWriter``
    would cut them into small transactions. Rows are made and written as the writer's are (route
    ``batch`` for a line's first prompt, ``reused`` for the others sharing it), each paid line priced by
    ``prices`` as a Batch API request to the batch's ``model`` (None: costs unknown). Only prompts still
    ``batched`` change, so storing the same output twice leaves the first answers in place (callers
    pass only members still waiting: see ``batch_members(waiting_only=True)``). ``reasks``: which asking of its
    prompts each answer is (by its first prompt id; 0 where not given).
    """
    if not answers:
        return 0
    now = utcnow()
    ledger = RowLedger(prices)
    if not reasks:
        rows = answer_rows(answers, route="batch", now=now, latency_s=latency_s, ledger=ledger, model=model)
    else:  # a follow-up batch's answers: each row numbered by the asking it answers (``reasks``, by first prompt id)
        rows = [row for ids, result in answers
                for row in answer_rows([(ids, result)], route="batch", now=now, latency_s=latency_s, ledger=ledger,
                                       model=model, reask=reasks.get(ids[0], 0))]
    async with sessions.begin() as session:
        conn = await session.connection()
        await write_batch_rows(conn, rows, job_id=job_id, now=now, prices=prices)
        if batch_id is not None:
            await settle_batch(conn, batch_id=batch_id, cost=sum(row.cost_pico_usd or 0 for row in rows))
    return len(rows)


async def release_members(sessions: Sessions, *, batch_id: int, prompt_ids: Collection[int]) -> int:
    """Put members of this batch that got no result back to ``pending``; returns how many.

    Only prompts still ``batched`` change: one with a result written keeps it. Released
    prompts may go into another batch or be sent real-time.
    """
    async with sessions.begin() as session:
        return await _release(session, batch_id=batch_id, prompt_ids=list(prompt_ids))


async def mark_batch_ingested(sessions: Sessions, *, batch_id: int) -> int:
    """Mark a batch's output as stored, and release its members still ``batched``; returns
    how many were released.

    Flush the ``ResultWriter`` first. Releasing here means a member the output missed (and
    nobody released) is sent again rather than left waiting for a batch that is over.
    """
    now = utcnow()
    async with sessions.begin() as session:
        done = await session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(status="ingested", updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if changed_rows(done) == 0:
            raise UnknownBatchError(f"no batch with id {batch_id!r}")
        # The batch is over: what its budget reservation did not spend is given back.
        await release_batch(await session.connection(), batch_id=batch_id)
        return await _release(session, batch_id=batch_id, prompt_ids=None)


async def mark_batch_lost(sessions: Sessions, *, batch_id: int, reason: str) -> int:
    """Close a batch the provider no longer knows (or one given up by hand): status ``lost``, ``reason`` as its
    last error, and its members still ``batched`` back to ``pending``; returns how many were released.

    Its ``provider_batch_id`` stays on the row, so no look-up ever adopts that provider batch for another of ours,
    and its output is never ingested: each of its prompts is answered by whatever sends it next, once.
    """
    now = utcnow()
    async with sessions.begin() as session:
        done = await session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(status="lost", last_error=reason, last_error_at=now, retry_after=None, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        if changed_rows(done) == 0:
            raise UnknownBatchError(f"no batch with id {batch_id!r}")
        # The batch is over: what its budget reservation did not spend is given back.
        await release_batch(await session.connection(), batch_id=batch_id)
        return await _release(session, batch_id=batch_id, prompt_ids=None)


async def record_batch_error(sessions: Sessions, *, batch_id: int, error: str, retry_after: datetime) -> int:
    """Keep on the batch's row the error a step met on it, now, one more in a row, and the time before which a
    sweep leaves it alone; returns how many errors in a row it has now."""
    now = utcnow()
    async with sessions.begin() as session:
        done = await session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(last_error=error, last_error_at=now, error_count=Batch.error_count + 1, retry_after=retry_after,
                    updated_at=now)
            .returning(Batch.error_count)
        )
        count = done.scalar_one_or_none()
        if count is None:
            raise UnknownBatchError(f"no batch with id {batch_id!r}")
        return int(count)


async def clear_batch_error(sessions: Sessions, *, batch_id: int) -> None:
    """A step worked on the batch again: no errors in a row, nothing to wait for (the last error stays, as history)."""
    async with sessions.begin() as session:
        await session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.error_count > 0)
            .values(error_count=0, retry_after=None, updated_at=utcnow())
            .execution_options(synchronize_session=False)
        )


async def _release(session: AsyncSession, *, batch_id: int, prompt_ids: list[int] | None) -> int:
    members = select(BatchMember.prompt_id).where(BatchMember.batch_id == batch_id)
    now = utcnow()
    # None: every member of the batch, as one statement with the member list as a subquery.
    id_lists: list[list[int] | None] = [None] if prompt_ids is None else list(chunks(prompt_ids, IN_CHUNK))
    released = 0
    for chunk in id_lists:
        stmt = update(Prompt).where(Prompt.status == "batched", Prompt.id.in_(members))
        if chunk is not None:
            stmt = stmt.where(Prompt.id.in_(chunk))
        stmt = stmt.values(status="pending", updated_at=now).execution_options(synchronize_session=False)
        released += changed_rows(await session.execute(stmt))
    return released


# BatchRecord's fields read from the batches row as they are; the timestamps are made timezone-aware.
_PLAIN_FIELDS: Final = ("id", "job_id", "model", "provider", "endpoint", "status", "provider_batch_id", "input_file_id", "output_file_id",
                        "error_file_id", "file_path", "request_total", "request_completed", "request_failed",
                        "errors", "resubmission_of", "last_error", "error_count")
_OPTIONAL_TIMES: Final = ("submitted_at", "expires_at", "finished_at", "last_polled_at", "last_error_at", "retry_after")


def _record(batch: Batch) -> BatchRecord:
    times: dict[str, Any] = {name: _maybe_aware(getattr(batch, name)) for name in _OPTIONAL_TIMES}
    return BatchRecord(
        **{name: getattr(batch, name) for name in _PLAIN_FIELDS},
        **times,
        created_at=aware(batch.created_at),
        updated_at=aware(batch.updated_at),
        cancel_requested=bool(batch.cancel_requested),
    )


def _maybe_aware(value: datetime | None) -> datetime | None:
    return None if value is None else aware(value)
