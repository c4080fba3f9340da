"""Which prompts of a job are still to send: by input order in keyset pages, counted, or by request."""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any, TypedDict, TypeVarTuple, Unpack

from sqlalchemy import ColumnElement, Row, Select, and_, func, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_dispatch.core import (
    REQUEST_ROUTES,
    RETRY_FAILED,
    SENDABLE_PROMPT_STATUSES,
    RepeatedKeys,
    RetryFailed,
    Route,
    key_hash,
)

from ._bulk import IN_CHUNK, chunks
from ._models import Prompt, aware
from ._records import UnfinishedPrompt, WorkRow
from ._engine import Sessions

__all__ = ["UnfinishedWhere", "job_repeated_keys", "unfinished_prompt_count", "unfinished_prompt_ids", "unfinished_prompts",
           "unfinished_repeated_keys", "unfinished_work_in_order", "unfinished_work_pages"]


class UnfinishedWhere(TypedDict, total=False):
    """Which open prompts ``unfinished_prompts`` and its kin return (see ``unfinished_prompts``)."""

    retry_failed: RetryFailed
    planned_route: Route | None
    in_flight: bool
    shard: tuple[int, int] | None
    positions: tuple[int, int] | None


async def unfinished_prompt_ids(sessions: Sessions, *, job_id: str, **where: Unpack[UnfinishedWhere]) -> list[int]:
    """Ids of the prompts still to send, in input order; see ``unfinished_prompts`` for which are open."""
    return [prompt.id for prompt in await unfinished_prompts(sessions, job_id=job_id, **where)]


def _open_filter(
    *,
    job_id: str,
    retry_failed: RetryFailed = "retryable",
    planned_route: Route | None = None,
    in_flight: bool = True,
    shard: tuple[int, int] | None = None,
    positions: tuple[int, int] | None = None,
    by_position: bool = False,
) -> list[Any]:
    """The WHERE clauses of the open prompts; see ``unfinished_prompts``. ``by_position``: for a query bounded by a
    range of input positions (``_page_in_order``), the status is tested as an expression no index holds, so the
    planner takes the ``(job_id, position)`` index rather than SQLite's status index (all of the job's open prompts
    for each window; PostgreSQL has none, ``Prompt``)."""
    status: Any = Prompt.status.concat("") if by_position else Prompt.status
    unfinished_when: list[ColumnElement[bool]] = [status.in_(SENDABLE_PROMPT_STATUSES if in_flight else ("pending",))]
    if retry_failed == "all":
        unfinished_when.append(status == "failed")
    elif retry_failed == "retryable":
        unfinished_when.append(and_(status == "failed", Prompt.failed_retryable.is_(True)))
    elif retry_failed != "none":
        raise ValueError(f"retry_failed must be one of {RETRY_FAILED}, got {retry_failed!r}")
    where = [Prompt.job_id == job_id, or_(*unfinished_when)]
    if planned_route == "realtime":
        # The real-time half: every lane it sends, one request a prompt.
        where.append(or_(Prompt.planned_route.is_(None), Prompt.planned_route.in_(REQUEST_ROUTES)))
    elif planned_route is not None:
        where.append(Prompt.planned_route == planned_route)
    if shard is not None:
        index, count = shard
        if not 0 <= index < count:
            raise ValueError(f"shard index must be in 0..{count - 1}, got {index}")
        where.append(Prompt.id % count == index)
    if positions is not None:
        start, stop = positions
        where.extend((Prompt.position >= start, Prompt.position < stop))
    return where


async def unfinished_prompts(
    sessions: Sessions,
    *,
    job_id: str,
    dedupe_keys: Collection[str] | None = None,
    after: tuple[int, int] | None = None,
    limit: int | None = None,
    **where: Unpack[UnfinishedWhere],
) -> list[UnfinishedPrompt]:
    """The prompts still to send, in input order: id, input position and request (dedupe key).

    Pending and in-flight prompts (a process died holding them) are always open; batched
    ones (waiting in an open batch) never are, nor succeeded ones; failed
    ones if ``retry_failed`` is ``"all"``, or ``"retryable"`` and their error was one that
    may pass on another try. ``planned_route`` keeps only prompts routed there (``"realtime"``: the real-time
    half, every lane of ``REQUEST_ROUTES``; a prompt with no route recorded counts as real-time). ``in_flight=False`` leaves out in-flight
    prompts, for a caller that must not take over those another live process is sending.
    ``shard=(index, count)`` keeps the prompts whose id is ``index`` modulo ``count``: shards of
    one job never share a prompt. ``positions=(start, stop)`` keeps those at input positions
    ``start <= position < stop``; ``dedupe_keys`` those making one of these requests.
    ``after=(position, id)`` and ``limit``: one keyset page, the prompts after that one (each
    page an index range scan on ``(job_id, position)``, however large the job: ``_page_in_order``).
    """
    stmt = select(Prompt.id, Prompt.position, Prompt.dedupe_key).where(
        *_open_filter(job_id=job_id, by_position=dedupe_keys is None and limit is not None, **where))
    # Core on the session's connection, not the ORM: its statement handling would double the cost.
    async with sessions() as session:
        conn = await session.connection()
        if dedupe_keys is None:
            if limit is not None:
                rows = await _page_in_order(conn, stmt, job_id=job_id, after=after, limit=limit, where=where)
                return [UnfinishedPrompt(*row) for row in rows]
            if after is not None:
                stmt = stmt.where(tuple_(Prompt.position, Prompt.id) > tuple_(*after))
            return [UnfinishedPrompt(*row) for row in await conn.execute(stmt.order_by(Prompt.position, Prompt.id))]
        if after is not None:
            stmt = stmt.where(tuple_(Prompt.position, Prompt.id) > tuple_(*after))
        # In IN lists of bounded size, so the chunks' rows are merged back into input order.
        found = [
            UnfinishedPrompt(*row)
            for chunk in chunks(set(dedupe_keys), IN_CHUNK)
            for row in await conn.execute(stmt.where(Prompt.dedupe_key.in_(chunk)))
        ]
        return sorted(found, key=lambda prompt: (prompt.position, prompt.id))


async def unfinished_prompt_count(sessions: Sessions, *, job_id: str, **where: Unpack[UnfinishedWhere]) -> int:
    """How many prompts ``unfinished_prompts`` would return."""
    async with sessions() as session:
        stmt = select(func.count()).select_from(Prompt).where(*_open_filter(job_id=job_id, **where))
        return int((await session.execute(stmt)).scalar_one())


async def unfinished_repeated_keys(
    sessions: Sessions, *, job_id: str, **where: Unpack[UnfinishedWhere]
) -> RepeatedKeys:
    """The requests (dedupe keys) more than one open prompt of the job makes; counted by the database, read as
    a stream and held as 8-byte hashes, however many there are."""
    return await _repeated_keys(sessions, where=_open_filter(job_id=job_id, **where))


async def job_repeated_keys(sessions: Sessions, *, job_id: str) -> RepeatedKeys:
    """The requests (dedupe keys) more than one prompt of the job makes, whatever their status: those of
    ``unfinished_repeated_keys`` and maybe more (a request also made by a prompt answered since). Read from the
    ``(job_id, dedupe_key)`` index alone, in its order, so it costs a pass over the job's index entries: no row is
    read and no key sorted. A caller finds a key's open prompts by request, where one that turns out to have a
    single open prompt costs a look-up and nothing else."""
    return await _repeated_keys(sessions, where=[Prompt.job_id == job_id])


async def _repeated_keys(sessions: Sessions, *, where: list[Any]) -> RepeatedKeys:
    """The dedupe keys more than one prompt matching ``where`` has, read as a stream and held as 8-byte hashes."""
    stmt = (
        select(Prompt.dedupe_key)
        .where(*where)
        .group_by(Prompt.dedupe_key)
        .having(func.count() > 1)
        .execution_options(yield_per=IN_CHUNK * 10)
    )
    hashes = array("q")
    async with sessions() as session:
        async for keys in (await session.stream_scalars(stmt)).partitions():
            hashes.extend(key_hash(key) for key in keys)
    return RepeatedKeys(hashes)


async def unfinished_work_pages(
    sessions: Sessions, *, job_id: str, page: int, **where: Unpack[UnfinishedWhere]
) -> AsyncIterator[list[WorkRow]]:
    """The open prompts' requests, a keyset page at a time, ordered by request (dedupe key) then id, so
    that identical requests come one after another however many pages apart they were stored."""
    async for rows in _work_pages(sessions, job_id=job_id, page=page, order=(Prompt.dedupe_key, Prompt.id),
                                  where=where):
        yield rows


async def unfinished_work_in_order(
    sessions: Sessions, *, job_id: str, page: int, **where: Unpack[UnfinishedWhere]
) -> AsyncIterator[list[WorkRow]]:
    """The open prompts with their requests, in input order, ``page`` at a time.

    Each page is an index range scan on ``(job_id, position)`` after the last one's ``(position, id)``,
    and reads the table in the order it was written: a batch made of consecutive pages then updates
    neighbouring rows (on SQLite, a few pages of the file rather than most of them).
    """
    async for rows in _work_pages(sessions, job_id=job_id, page=page, order=(Prompt.position, Prompt.id),
                                  where=where):
        yield rows


# What a sender needs of a prompt (``WorkRow``), and its input position.
WORK_COLUMNS = (Prompt.id, Prompt.position, Prompt.custom_id, Prompt.model, Prompt.messages, Prompt.params,
                Prompt.dedupe_key, Prompt.deadline, Prompt.endpoint, Prompt.background_id, Prompt.planned_route,
                Prompt.background_creates)


def work_row(row: Any) -> WorkRow:
    """The ``WorkRow`` of a row selected with ``WORK_COLUMNS`` (read by place, in their order: a row's attributes
    are looked up by name one at a time)."""
    (id_, _, custom_id, model, messages, params, dedupe_key, deadline, endpoint, background_id, planned_route,
     background_creates) = row
    return WorkRow(id=id_, custom_id=custom_id, model=model, messages=messages, params=params, dedupe_key=dedupe_key,
                   deadline=None if deadline is None else aware(deadline), endpoint=endpoint,
                   background_id=background_id, planned_route=planned_route, background_creates=background_creates)


async def _work_pages(
    sessions: Sessions, *, job_id: str, page: int, order: tuple[Any, Any], where: UnfinishedWhere
) -> AsyncIterator[list[WorkRow]]:
    """Keyset pages of the open prompts' requests in ``order`` (two columns, the last one unique)."""
    in_input_order = order == (Prompt.position, Prompt.id)
    base = select(*WORK_COLUMNS).where(*_open_filter(job_id=job_id, by_position=in_input_order, **where))
    after: tuple[Any, ...] | None = None
    while True:
        # Core on the session's connection: the ORM's statement handling would double the cost.
        async with sessions() as session:
            conn = await session.connection()
            if in_input_order:
                found = await _page_in_order(conn, base, job_id=job_id, after=after, limit=page, where=where)
            else:
                stmt = base if after is None else base.where(tuple_(*order) > tuple_(*after))
                found = (await conn.execute(stmt.order_by(*order).limit(page))).all()
        if not found:
            return
        yield [work_row(row) for row in found]
        if len(found) < page:
            return
        after = tuple(getattr(found[-1], column.key) for column in order)


_Columns = TypeVarTuple("_Columns")

# A shard's page reads input positions in windows of this many times its size per shard at most: a window that
# finds none of the shard's open prompts (a resumed job's answered stretch) doubles the next, up to this.
MAX_WINDOW_GROWTH = 64


async def _page_in_order(
    conn: AsyncConnection, stmt: Select[Unpack[_Columns]], *, job_id: str, after: tuple[int, int] | None, limit: int,
    where: UnfinishedWhere,
) -> Sequence[Row[Unpack[_Columns]]]:
    """Up to ``limit`` rows of ``stmt`` (the job's open prompts, selecting ``position`` and ``id``) after ``after``
    in input order; fewer only when no prompt of the job is stored past them.

    The rows are read a window of input positions at a time (``limit`` positions; a shard's, ``id % count = index``,
    ``limit * count``, the page's share of them): the window's bounds make each query an index range scan on
    ``(job_id, position)`` whatever the planner estimates. Unbounded, a PostgreSQL table with no statistics yet (just
    recorded) is read by the status index and every open prompt of the job sorted for each page; the modulus it
    cannot estimate at all (it takes 0.5% of rows and, late in a run, scans the whole job for each page). Which shard a prompt is in is still its id's alone, so shards never
    share a prompt, a prompt stored while they run is in one of them, and a shard run again takes the same ones.
    """
    shard = where.get("shard")
    if where.get("positions") is not None:  # a range of positions bounds the scan already
        page = stmt if after is None else stmt.where(tuple_(Prompt.position, Prompt.id) > tuple_(*after))
        return (await conn.execute(page.order_by(Prompt.position, Prompt.id).limit(limit))).all()
    base_window = window = limit * (shard[1] if shard is not None else 1)
    start = after[0] if after is not None else await _next_position(conn, job_id=job_id, at_least=None)
    rows: list[Row[Unpack[_Columns]]] = []
    while start is not None and len(rows) < limit:
        resumed = after if after is not None and start == after[0] else None
        # A window that resumes after a row's position reaches one position further, so that a job whose positions
        # are all open fills its page in one query.
        stop = start + window + (resumed is not None)
        page = stmt.where(Prompt.position >= start, Prompt.position < stop)
        if resumed is not None:
            page = page.where(tuple_(Prompt.position, Prompt.id) > tuple_(*resumed))
        wanted = limit - len(rows)
        found = (await conn.execute(page.order_by(Prompt.position, Prompt.id).limit(wanted))).all()
        rows.extend(found)
        if len(found) * 2 < wanted:  # a sparse stretch (answered, or another lane's or shard's): read further at once
            window = min(window * 2, base_window * MAX_WINDOW_GROWTH)
        # Past the window: the next position stored (positions may have gaps), read anew each time so that a
        # prompt stored since the run began is found.
        start = None if len(rows) == limit else await _next_position(conn, job_id=job_id, at_least=stop)
    return rows


async def _next_position(conn: AsyncConnection, *, job_id: str, at_least: int | None) -> int | None:
    """The first input position of the job's prompts from ``at_least`` on (one probe of its position index)."""
    stmt = select(func.min(Prompt.position)).where(Prompt.job_id == job_id)
    if at_least is not None:
        stmt = stmt.where(Prompt.position >= at_least)
    found = (await conn.execute(stmt)).scalar()
    return None if found is None else int(found)
