"""A job's open prompts with their requests, in input order a keyset page at a time: what a batch
submission reads, so that each batch holds prompts stored side by side."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Unpack

from sqlalchemy import select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._models import Prompt, aware
from ._open import OpenWhere, _open_filter
from ._records import WorkRow

__all__ = ["open_work_in_order"]

Sessions = async_sessionmaker[AsyncSession]


async def open_work_in_order(
    sessions: Sessions, *, job_id: str, page: int, **where: Unpack[OpenWhere]
) -> AsyncIterator[list[WorkRow]]:
    """The open prompts (see ``open_prompts``) with their requests, in input order, ``page`` at a time.

    Each page is an index range scan on ``(job_id, position)`` after the last one's ``(position, id)``,
    and reads the table in the order it was written: a batch made of consecutive pages then updates
    neighbouring rows (on SQLite, a few pages of the file rather than most of them).
    """
    columns = (Prompt.id, Prompt.position, Prompt.custom_id, Prompt.model, Prompt.messages, Prompt.params,
               Prompt.dedupe_key, Prompt.deadline)
    base = select(*columns).where(*_open_filter(job_id=job_id, **where)).order_by(Prompt.position, Prompt.id)
    after: tuple[int, int] | None = None
    while True:
        stmt = base if after is None else base.where(tuple_(Prompt.position, Prompt.id) > tuple_(*after))
        # Core on the session's connection: the ORM's statement handling would double the cost.
        async with sessions() as session:
            conn = await session.connection()
            found = (await conn.execute(stmt.limit(page))).all()
        if not found:
            return
        yield [
            WorkRow(id=row.id, custom_id=row.custom_id, model=row.model, messages=row.messages, params=row.params,
                    dedupe_key=row.dedupe_key, deadline=None if row.deadline is None else aware(row.deadline))
            for row in found
        ]
        if len(found) < page:
            return
        after = (found[-1].position, found[-1].id)
