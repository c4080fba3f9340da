"""Every read and write of Batch API batches and their members.

A prompt in an open batch has status ``batched``: the real-time path does not pick it
(``unfinished_prompt_ids``), and no second batch may take it, until its result is written or it
is released back to ``pending``. Results go through ``storage._results``: failures by the
``ResultWriter`` with ``route="batch"``, answers in bulk by ``store_batch_answers``.
"""

from __future__ import annotations

import json

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from llm_dispatch.core import (
    BATCH_STATUSES,
    CLOSED_BATCH_STATUSES,
    BatchConflictError,
    ChatResult,
    PriceTable,
    UnknownBatchError,
    UnknownPromptError,
    split_member_id,
)

from ._budgets import release_batch, settle_batch
from ._bulk import IDS_CHUNK, IN_CHUNK, INSERT_BATCH, bind_value, changed_rows, chunks, id_in, placeholders
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
    "create_batch_record",
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


async def create_batch_record(
    sessions: Sessions,
    *,
    job_id: str,
    model: str,
    members: Sequence[tuple[int, str]],
    file_path: str | None,
    resubmission_of: int | None = None,
    provider: str = "openai",
    endpoint: str = "chat",
) -> int:
    """Store a batch (status ``preparing``) with its members, one ``(prompt_id, custom_id)``
    per prompt, and mark those prompts ``batched``; returns our batch id. Identical prompts
    may share one line: give them the same ``custom_id``, and one answer serves them all. The texts of a packed
    embeddings line are named after it (``core.member_id``): counted as one line.

    One transaction: the batch exists before anything is uploaded, so a process that dies
    mid-upload leaves a record to find. Succeeded prompts stay succeeded. A prompt that is
    already ``batched`` raises ``BatchConflictError`` and nothing is stored.
    """
    if not members:
        raise ValueError("a batch needs at least one member")
    prompt_ids = [prompt_id for prompt_id, _ in members]
    if len(set(prompt_ids)) != len(prompt_ids):
        raise ValueError("a prompt can be only once in a batch; give identical prompts one custom_id instead")
    lines = len({split_member_id(custom_id)[0] for _, custom_id in members})
    now = utcnow()
    try:
        # The usual case in one pass: every prompt is the job's, stored, and neither batched nor succeeded, so the
        # marking statement changes each one (and locks it: a second process batching them waits, then finds them
        # batched). Otherwise nothing is kept and the members are checked one by one below.
        async with sessions.begin() as session:
            conn = await session.connection()
            mark = _MARK_OPEN.get(conn.dialect.name)
            if mark is None:
                raise _NotAllOpen
            marked = await conn.exec_driver_sql(mark, _mark_open_args(conn.dialect, prompt_ids=prompt_ids,
                                                                      job_id=job_id, now=now))
            if marked.rowcount != len(prompt_ids):
                raise _NotAllOpen
            return await _insert_batch(session, job_id=job_id, model=model, members=members, file_path=file_path,
                                       resubmission_of=resubmission_of, provider=provider, endpoint=endpoint,
                                       lines=lines, now=now)
    except _NotAllOpen:
        pass
    async with sessions.begin() as session:
        await _check_members(session, job_id=job_id, prompt_ids=prompt_ids)
        batch_id = await _insert_batch(session, job_id=job_id, model=model, members=members, file_path=file_path,
                                       resubmission_of=resubmission_of, provider=provider, endpoint=endpoint,
                                       lines=lines, now=now)
        conn = await session.connection()
        for ids in chunks(prompt_ids, IDS_CHUNK):
            await conn.execute(
                update(Prompt.__table__)
                .where(id_in(Prompt.__table__.c.id, ids, conn.dialect), Prompt.__table__.c.status != "succeeded")
                .values(status="batched", updated_at=now)
            )
    return batch_id


# Mark a new batch's prompts batched when each is an open prompt of its job (the statement's row count says). By
# primary key: SQLite would otherwise take the job's status index and read every prompt of the job (NOT INDEXED
# leaves it the rowid alone).
_MARK_OPEN: Final = {
    "sqlite": "UPDATE prompts NOT INDEXED SET status = 'batched', updated_at = ? WHERE id IN (SELECT value FROM "
              "json_each(?)) AND job_id = ? AND status NOT IN ('succeeded', 'batched')",
    "postgresql": "UPDATE prompts SET status = 'batched', updated_at = $1 WHERE id = ANY($2::bigint[]) "
                  "AND job_id = $3 AND status NOT IN ('succeeded', 'batched')",
}


def _mark_open_args(dialect: Any, *, prompt_ids: list[int], job_id: str, now: datetime) -> tuple[Any, ...]:
    ids = json.dumps(prompt_ids) if dialect.name == "sqlite" else prompt_ids
    return (bind_value(Prompt.__table__.c.updated_at, now, dialect), ids, job_id)


class _NotAllOpen(Exception):
    """Some members of a new batch are not open prompts of its job: rolled back, to be checked one by one."""


async def _insert_batch(
    session: AsyncSession, *, job_id: str, model: str, members: Sequence[tuple[int, str]], file_path: str | None,
    resubmission_of: int | None, provider: str, endpoint: str, lines: int, now: datetime,
) -> int:
    """Insert the batch row (``preparing``) and its members; returns the batch's id."""
    batch = Batch(
        job_id=job_id,
        model=model,
        provider=provider,
        status="preparing",
        file_path=file_path,
        request_total=lines,
        request_completed=0,
        request_failed=0,
        resubmission_of=resubmission_of,
        created_at=now,
        updated_at=now,
    )
    if endpoint != "chat":  # else the column's default: a chat batch is written as before the column existed
        batch.endpoint = endpoint
    session.add(batch)
    await session.flush()
    batch_id = batch.id
    conn = await session.connection()
    if conn.dialect.name == "postgresql":
        # One statement over two arrays: the server reads the members in one pass rather than a row per message.
        await conn.exec_driver_sql(
            "INSERT INTO batch_members (batch_id, prompt_id, custom_id) "
            "SELECT $1, prompt_id, custom_id FROM unnest($2::bigint[], $3::varchar[]) AS m (prompt_id, custom_id)",
            (batch_id, [pid for pid, _ in members], [cid for _, cid in members]),
        )
        return batch_id
    # Plain tuples through the driver's executemany (see _bulk): a batch has tens of thousands of members.
    marks = ", ".join(placeholders(conn.dialect, 3))
    for chunk in chunks(members, INSERT_BATCH * 10):
        await conn.exec_driver_sql(f"INSERT INTO batch_members (batch_id, prompt_id, custom_id) VALUES ({marks})",
                                   [(batch_id, pid, cid) for pid, cid in chunk])
    return batch_id


async def _check_members(session: AsyncSession, *, job_id: str, prompt_ids: Sequence[int]) -> None:
    # FOR UPDATE (PostgreSQL; SQLite locks the whole file on write): a second process
    # batching the same prompts waits here, then sees them batched and stops.
    found: dict[int, tuple[str, str]] = {}
    conn = await session.connection()
    for chunk in chunks(prompt_ids, IDS_CHUNK):
        stmt = (select(Prompt.id, Prompt.job_id, Prompt.status).where(id_in(Prompt.id, chunk, conn.dialect))
                .with_for_update())
        found.update((pid, (job, status)) for pid, job, status in await conn.execute(stmt))
    missing = [pid for pid in prompt_ids if pid not in found]
    if missing:
        raise UnknownPromptError(f"batch members that are not in the database: prompt ids {missing[:10]}; was their "
                                 "job removed, or is this run given another --database-url than the one that recorded them?")
    foreign = [pid for pid, (job, _) in found.items() if job != job_id]
    if foreign:
        raise ValueError(f"prompt ids {sorted(foreign)[:10]} belong to another job than {job_id!r}")
    held = sorted(pid for pid, (_, status) in found.items() if status == "batched")
    if not held:
        return
    holders: set[int] = set()
    for chunk in chunks(held, IN_CHUNK):
        holding = (
            select(BatchMember.batch_id)
            .join(Batch, Batch.id == BatchMember.batch_id)
            .where(BatchMember.prompt_id.in_(chunk), Batch.status.not_in(CLOSED_BATCH_STATUSES))
        )
        holders.update((await session.execute(holding)).scalars())
    raise BatchConflictError(
        f"{len(held)} of these prompts already wait in open batch(es) {sorted(holders)} "
        f"(prompt ids {held[:10]}); leave them out, or ingest those batches or release_members() first",
        prompt_ids=held,
        batch_ids=sorted(holders),
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
        await write_batch_rows(conn, rows, job_id=job_id, now=now)
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
