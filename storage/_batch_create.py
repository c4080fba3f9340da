"""A new batch's record: its row (``preparing``), its members, and its prompts marked ``batched``, in one
transaction, before anything is uploaded (so a process that dies mid-upload leaves a record to find).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from llm_dispatch.core import CLOSED_BATCH_STATUSES, BatchConflictError, UnknownPromptError, split_member_id

from ._bulk import IDS_CHUNK, IN_CHUNK, INSERT_BATCH, bind_value, chunks, id_in, placeholders
from ._engine import Sessions
from ._models import Batch, BatchMember, Prompt, utcnow

__all__ = ["create_batch_record"]


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
